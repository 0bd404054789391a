#![allow(clippy::print_stdout, clippy::print_stderr)] // printing is this binary's job
//! The `awaken` command: runs agents defined in TOML files, streaming their events to the
//! terminal, and keeps threads in an embedded SQLite file (`./.awaken/awaken.db`).
//!
//! Exit codes: 0 completed, 2 bad input, 3 suspended waiting for a decision, 4 cancelled,
//! 1 other errors.

mod agent_file;
mod tools;

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use awaken::event::{AgentEvent, EventSink, TerminationReason, ThreadId};
use awaken::llm::openai::{OpenAiConfig, OpenAiExecutor};
use awaken::llm::{LlmExecutor, Script, ScriptedExecutor};
use awaken::runtime::{AgentRuntime, RunActivation, RunError};
use awaken::spec::ModelSpec;
use awaken_store::{MemoryStore, SqliteConfig, SqliteStore, ThreadStore};

use crate::agent_file::{AgentFile, ProviderKind};

const USAGE: &str = "\
usage:
  awaken run --agent FILE [PROMPT] [--thread ID] [--json] [--store SPEC] [--script FILE] [--model NAME]
  awaken threads [--store SPEC]
  awaken show THREAD [--store SPEC]
  awaken validate --agent FILE

  PROMPT defaults to standard input. SPEC is sqlite:PATH (default sqlite:./.awaken/awaken.db) or memory.
  With OPENAI_API_KEY or AWAKEN_BASE_URL set (or [provider] kind = \"openai\"), the agent talks to an
  OpenAI-compatible endpoint; otherwise it replays the agent file's [script].";

/// A failure with its exit code.
struct Exit {
    code: u8,
    error: anyhow::Error,
}

fn bad_input(error: anyhow::Error) -> Exit {
    Exit { code: 2, error }
}

impl From<anyhow::Error> for Exit {
    fn from(error: anyhow::Error) -> Self {
        Exit { code: 1, error }
    }
}

#[derive(Default)]
struct Args {
    command: String,
    positional: Vec<String>,
    agent: Option<PathBuf>,
    thread: Option<String>,
    json: bool,
    store: Option<String>,
    script: Option<PathBuf>,
    model: Option<String>,
}

fn parse_args(raw: Vec<String>) -> Result<Args> {
    let mut it = raw.into_iter();
    let mut args = Args {
        command: it.next().ok_or_else(|| anyhow!("{USAGE}"))?,
        ..Args::default()
    };
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| anyhow!("{name} needs a value\n\n{USAGE}"))
        };
        match a.as_str() {
            "--agent" => args.agent = Some(value("--agent")?.into()),
            "--thread" => args.thread = Some(value("--thread")?),
            "--store" => args.store = Some(value("--store")?),
            "--script" => args.script = Some(value("--script")?.into()),
            "--model" => args.model = Some(value("--model")?),
            "--json" => args.json = true,
            "-h" | "--help" => bail!("{USAGE}"),
            flag if flag.starts_with("--") => bail!("unknown option {flag}\n\n{USAGE}"),
            _ => args.positional.push(a),
        }
    }
    Ok(args)
}

async fn open_store(spec: Option<&str>) -> Result<Arc<dyn ThreadStore>> {
    let spec = spec.unwrap_or("sqlite:./.awaken/awaken.db");
    if spec == "memory" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    let Some(path) = spec.strip_prefix("sqlite:") else {
        bail!("unsupported store `{spec}`: use sqlite:PATH or memory");
    };
    let path = Path::new(path);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let store = SqliteStore::open(SqliteConfig::file(path))
        .await
        .with_context(|| format!("cannot open the SQLite store {}", path.display()))?;
    Ok(Arc::new(store))
}

/// The executor and model the agent file (and the environment) ask for.
fn provider(file: &AgentFile, args: &Args) -> Result<(Arc<dyn LlmExecutor>, ModelSpec)> {
    let env_key = std::env::var("OPENAI_API_KEY")
        .ok()
        .filter(|k| !k.is_empty());
    let env_url = std::env::var("AWAKEN_BASE_URL")
        .ok()
        .filter(|u| !u.is_empty());
    let openai =
        file.provider.kind == ProviderKind::Openai || env_key.is_some() || env_url.is_some();
    let model_id = file.agent.model.clone();
    if openai {
        let base = file
            .provider
            .base_url
            .clone()
            .or(env_url)
            .unwrap_or_else(|| "https://api.openai.com/v1".into());
        let upstream = args
            .model
            .clone()
            .or_else(|| file.provider.model.clone())
            .unwrap_or_else(|| "gpt-4o-mini".into());
        let mut config = OpenAiConfig::new(base);
        if let Some(key) = env_key {
            config = config.with_api_key(key);
        }
        let executor = OpenAiExecutor::new(config)
            .map_err(|e| anyhow!("the OpenAI-compatible provider: {e}"))?;
        let model = file
            .model
            .clone()
            .unwrap_or_else(|| ModelSpec::new(model_id, "openai", upstream.clone()));
        return Ok((
            Arc::new(executor),
            ModelSpec {
                provider: "openai".into(),
                upstream_model: upstream,
                ..model
            },
        ));
    }
    let script = match &args.script {
        Some(path) => Script::load(path).map_err(|e| anyhow!("{e}"))?,
        None => file.script.clone().ok_or_else(|| {
            anyhow!(
                "the scripted provider needs a [script] section in the agent file or --script FILE"
            )
        })?,
    };
    let executor = ScriptedExecutor::new(script).map_err(|e| anyhow!("{e}"))?;
    let model = file
        .model
        .clone()
        .unwrap_or_else(|| ModelSpec::new(model_id, "scripted", "scripted"));
    Ok((
        Arc::new(executor),
        ModelSpec {
            provider: "scripted".into(),
            ..model
        },
    ))
}

fn runtime(file: &AgentFile, args: &Args, store: Arc<dyn ThreadStore>) -> Result<AgentRuntime> {
    let (executor, model) = provider(file, args)?;
    let mut builder = AgentRuntime::builder()
        .with_store(store)
        .with_model(model.clone())
        .with_provider(model.provider.clone(), executor)
        .with_agent_spec(file.agent.clone());
    if let Some(rf) = &file.tools.read_file {
        builder = builder.with_tool(Arc::new(tools::ReadFile {
            root: rf.root.clone(),
        }));
    }
    builder.build().map_err(|e| anyhow!("{e}"))
}

/// Prints events for a person: text as it arrives, tool calls and results, suspensions.
#[derive(Default)]
struct Terminal {
    /// Whether the cursor is after streamed text on an unfinished line.
    mid_line: std::sync::atomic::AtomicBool,
}

impl EventSink for Terminal {
    fn emit(&self, event: &AgentEvent) {
        use std::sync::atomic::Ordering;
        let mut out = std::io::stdout().lock();
        if let AgentEvent::TextDelta { delta } = event {
            let _ = write!(out, "{delta}");
            self.mid_line
                .store(!delta.ends_with('\n'), Ordering::Relaxed);
            let _ = out.flush();
            return;
        }
        let shows_line = matches!(
            event,
            AgentEvent::ToolCallReady { .. }
                | AgentEvent::ToolCallDone { .. }
                | AgentEvent::ToolCallSuspended { .. }
                | AgentEvent::Warning { .. }
                | AgentEvent::Error { .. }
                | AgentEvent::StepEnd { .. }
        );
        if shows_line && self.mid_line.swap(false, Ordering::Relaxed) {
            let _ = writeln!(out);
        }
        let _ = match event {
            AgentEvent::StepEnd { .. } => Ok(()),
            AgentEvent::ToolCallReady {
                name, arguments, ..
            } => writeln!(out, "→ {name} {arguments}"),
            AgentEvent::ToolCallDone { result, state, .. } => {
                let content = result.content.to_string();
                let shown: String = content.chars().take(200).collect();
                writeln!(
                    out,
                    "← {state}: {shown}{}",
                    if content.len() > shown.len() {
                        "…"
                    } else {
                        ""
                    }
                )
            }
            AgentEvent::ToolCallSuspended { call_id, ticket } => writeln!(
                out,
                "⏸ {} ({call_id}) waits for a decision: {}",
                ticket.call.tool_name, ticket.message
            ),
            AgentEvent::Warning { detail, .. } => writeln!(out, "warning: {detail}"),
            AgentEvent::Error { message } => writeln!(out, "error: {message}"),
            _ => Ok(()),
        };
        let _ = out.flush();
    }
}

/// Prints events as JSON lines.
struct JsonLines;

impl EventSink for JsonLines {
    fn emit(&self, event: &AgentEvent) {
        if let Ok(line) = serde_json::to_string(event) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
}

fn load_file(args: &Args) -> Result<AgentFile, Exit> {
    let path = args
        .agent
        .as_ref()
        .ok_or_else(|| bad_input(anyhow!("--agent FILE is required\n\n{USAGE}")))?;
    AgentFile::load(path).map_err(bad_input)
}

async fn run(args: Args) -> Result<u8, Exit> {
    let file = load_file(&args)?;
    let prompt = match args.positional.first() {
        Some(p) => p.clone(),
        None => {
            if std::io::stdin().is_terminal() {
                return Err(bad_input(anyhow!(
                    "give a prompt, or pipe one on standard input"
                )));
            }
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| bad_input(e.into()))?;
            text
        }
    };
    let store = open_store(args.store.as_deref()).await.map_err(bad_input)?;
    let runtime = runtime(&file, &args, store).map_err(bad_input)?;
    let thread = match &args.thread {
        Some(t) => ThreadId::new(t).map_err(|e| bad_input(anyhow!("--thread: {e}")))?,
        None => ThreadId::new(format!(
            "thread-{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis())
        ))
        .map_err(|e| anyhow!("{e}"))?,
    };
    let activation = RunActivation::new(thread.clone(), file.agent.id.clone())
        .with_user_message(prompt.trim_end());
    let handle = activation.handle();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            handle.cancel();
            // A second Ctrl-C exits at once.
            if tokio::signal::ctrl_c().await.is_ok() {
                std::process::exit(130);
            }
        }
    });
    let started = Instant::now();
    let terminal = Terminal::default();
    let sink: &dyn EventSink = if args.json { &JsonLines } else { &terminal };
    let outcome = match runtime.run(activation, sink).await {
        Ok(o) => o,
        Err(e @ RunError::ThreadWaiting { .. }) => {
            return Err(Exit {
                code: 3,
                error: anyhow!("{e}"),
            });
        }
        Err(e) => return Err(anyhow!("{e}").into()),
    };
    if !args.json {
        eprintln!(
            "— {} · thread {} · {} step(s) · {} tokens · {} ms",
            outcome.termination,
            thread,
            outcome.steps,
            outcome.usage.total(),
            started.elapsed().as_millis()
        );
    }
    Ok(match outcome.termination {
        TerminationReason::Suspended => 3,
        TerminationReason::Cancelled => 4,
        TerminationReason::Error { .. } => 1,
        _ => 0,
    })
}

async fn threads(args: Args) -> Result<u8, Exit> {
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

async fn show(args: Args) -> Result<u8, Exit> {
    let id = args
        .positional
        .first()
        .ok_or_else(|| bad_input(anyhow!("awaken show THREAD\n\n{USAGE}")))?;
    let thread = ThreadId::new(id).map_err(|e| bad_input(anyhow!("{e}")))?;
    let store = open_store(args.store.as_deref()).await.map_err(bad_input)?;
    let checkpoint = store
        .load_checkpoint(&thread)
        .await
        .map_err(|e| anyhow!("{e}"))?
        .ok_or_else(|| bad_input(anyhow!("no thread `{thread}` in the store")))?;
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

fn validate(args: Args) -> Result<u8, Exit> {
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

fn main() -> ExitCode {
    let result = (|| -> Result<u8, Exit> {
        let args = parse_args(std::env::args().skip(1).collect()).map_err(bad_input)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| anyhow!("{e}"))?;
        match args.command.as_str() {
            "run" => rt.block_on(run(args)),
            "threads" => rt.block_on(threads(args)),
            "show" => rt.block_on(show(args)),
            "validate" => validate(args),
            other => Err(bad_input(anyhow!("unknown command `{other}`\n\n{USAGE}"))),
        }
    })();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Exit { code, error }) => {
            eprintln!("awaken: {error:#}");
            ExitCode::from(code)
        }
    }
}
