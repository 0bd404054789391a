//! The commands that read without running: `threads`, `show`, `validate` and `plugins`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::anyhow;
use awaken::event::ToolCallState;
use awaken::plugin::{DeclarativePlugin, Plugin, PluginRegistry};
use awaken::tool::ToolBatch;
use awaken_store::{MemoryStore, RunStatus};

use crate::args::{Args, USAGE};
use crate::output::{resume_command, shell_word};
use crate::setup::{open_store, runtime, stored_thread};
use crate::{Exit, bad_input, load_file};

/// `awaken threads`: one JSON line per thread.
pub(crate) async fn threads(args: Args) -> Result<u8, Exit> {
    let store = open_store(args.store.as_deref()).await.map_err(bad_input)?;
    for t in store.list_threads().await.map_err(|e| anyhow!("{e}"))? {
        println!(
            "{}",
            serde_json::to_string(&serde_json::json!({
                "thread_id": t.thread_id.to_string(),
                "messages": t.message_count,
            }))
            .map_err(|e| anyhow!("{e}"))?
        );
    }
    Ok(0)
}

/// `awaken show THREAD`: messages, runs, the tool batch (with the calls waiting for a decision
/// and how to answer them), thread state and stored events.
pub(crate) async fn show(args: Args) -> Result<u8, Exit> {
    let (thread, store, checkpoint) = stored_thread(&args).await?;
    println!("thread {thread}: {} message(s)", checkpoint.messages.len());
    for m in &checkpoint.messages {
        println!(
            "  {:?}: {}",
            m.role,
            serde_json::to_string(m).map_err(|e| anyhow!("{e}"))?
        );
    }
    for run in store.list_runs(&thread).await.map_err(|e| anyhow!("{e}"))? {
        println!(
            "run {} agent={} status={} steps={} termination={}",
            run.run_id,
            run.agent_id,
            run.status,
            run.steps,
            run.termination
                .map_or_else(|| "-".to_owned(), |t| t.to_string())
        );
    }
    if let Some(batch) = &checkpoint.batch {
        println!("tool batch: {batch}");
        let waiting = checkpoint
            .run
            .as_ref()
            .is_some_and(|r| r.status == RunStatus::Waiting);
        if waiting && let Ok(batch) = serde_json::from_value::<ToolBatch>(batch.clone()) {
            let resume = resume_command(&args, &thread);
            for call in batch
                .calls()
                .iter()
                .filter(|c| c.state() == ToolCallState::Suspended)
            {
                let question = call.ticket().map_or("", |t| t.message.as_str());
                println!(
                    "waiting: {} {} {}: {question}\n  answer: {resume} --approve {id} | --deny {id}",
                    call.id(),
                    call.call().name,
                    call.call().arguments,
                    id = shell_word(call.id().as_str()),
                );
            }
        }
    }
    println!(
        "thread state: {}",
        serde_json::to_string(&checkpoint.thread_state.values).map_err(|e| anyhow!("{e}"))?
    );
    for e in store
        .load_events(&thread, 0)
        .await
        .map_err(|e| anyhow!("{e}"))?
    {
        println!(
            "event {}: {}",
            e.seq,
            serde_json::to_string(&e.event).map_err(|e| anyhow!("{e}"))?
        );
    }
    Ok(0)
}

/// `awaken validate --agent FILE`: resolves the agent without running it.
pub(crate) fn validate(args: Args) -> Result<u8, Exit> {
    let file = load_file(&args)?;
    let runtime = runtime(&file, &args, Arc::new(MemoryStore::new())).map_err(bad_input)?;
    let resolved = runtime
        .resolver()
        .resolve(&file.agent.id)
        .map_err(|e| bad_input(anyhow!("{e}")))?;
    for w in &resolved.warnings {
        println!("warning: {w}");
    }
    println!(
        "agent `{}` resolves: {} tool(s), plugins {}",
        file.agent.id,
        resolved.tools.len(),
        resolved.env.plugin_ids().join(",")
    );
    Ok(0)
}

/// `awaken plugins --dir DIR...`: lists every declarative plugin manifest (`*.toml`) of the
/// directories and validates it; then loads the directories together into one registry, which
/// checks what spans files (repeated ids, dependencies, agent definitions). Every broken file is
/// reported with its line; exit 2 when anything is wrong.
pub(crate) fn plugins(args: Args) -> Result<u8, Exit> {
    if args.dirs.is_empty() {
        return Err(bad_input(anyhow!("--dir DIR is required\n\n{USAGE}")));
    }
    let mut problems = 0usize;
    for dir in &args.dirs {
        let files = manifests(dir).map_err(bad_input)?;
        if files.is_empty() {
            println!("{}: no plugin manifests (*.toml)", dir.display());
        }
        for path in files {
            match std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|text| {
                    DeclarativePlugin::from_toml_str(&text).map_err(|e| {
                        e.line()
                            .map_or_else(|| e.to_string(), |l| format!("{l}: {e}"))
                    })
                }) {
                Ok(plugin) => println!("{}", describe(&plugin, &path)),
                Err(e) => {
                    problems += 1;
                    eprintln!("error: {}:{e}", path.display());
                }
            }
        }
    }
    if problems == 0 {
        let registry = PluginRegistry::new();
        for dir in &args.dirs {
            if let Err(e) = registry.load_dir(dir) {
                problems += 1;
                eprintln!("error: {e}");
            }
        }
        if problems == 0 {
            println!(
                "ok: {} plugin(s) load together; execution order {}",
                registry.list_plugins().len(),
                registry
                    .list_plugins()
                    .iter()
                    .map(|p| p.manifest().id.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if problems > 0 {
        return Err(bad_input(anyhow!("{problems} plugin problem(s)")));
    }
    Ok(0)
}

/// The `*.toml` files of `dir`, sorted by name.
fn manifests(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in
        std::fs::read_dir(dir).map_err(|e| anyhow!("cannot read {}: {e}", dir.display()))?
    {
        let path = entry
            .map_err(|e| anyhow!("cannot read {}: {e}", dir.display()))?
            .path();
        if path.extension().is_some_and(|e| e == "toml") && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// One line about a valid plugin.
fn describe(plugin: &DeclarativePlugin, path: &Path) -> String {
    let m = plugin.manifest();
    let reminders: Vec<String> = plugin
        .reminders()
        .iter()
        .map(|r| r.tool.to_string())
        .collect();
    let agents: Vec<String> = m
        .bound
        .agent_definitions
        .iter()
        .flatten()
        .cloned()
        .collect();
    format!(
        "{} {} · {} · priority {} · depends on {} · {} prompt fragment(s) · reminders after {} · agents {} · {}",
        m.id,
        m.version,
        if m.enabled { "enabled" } else { "disabled" },
        m.priority,
        list(&m.depends_on),
        plugin.prompt_fragments().len(),
        list(&reminders),
        list(&agents),
        path.display()
    )
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "-".to_owned()
    } else {
        items.join(", ")
    }
}
