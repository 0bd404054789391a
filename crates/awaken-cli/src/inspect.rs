//! The commands that read without running: `threads`, `show`, `validate` and `plugins`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::anyhow;
use awaken::event::{ContentBlock, Message, Role, ThreadId, ToolCallState};
use awaken::plugin::{DeclarativePlugin, Plugin, PluginRegistry};
use awaken_store::{MemoryStore, RunRecord, RunStatus, ThreadStore, ThreadSummary};
use serde_json::{Value, json};

use crate::args::{Args, USAGE, command_usage};
use crate::output::{clip, resume_command, shell_word};
use crate::setup::{Open, Purpose, mcp_servers, open_failed, open_store, runtime, stored_thread};
use crate::term::{errln, out, outln};
use crate::{Exit, bad_input, load_file};

/// One row of `awaken threads`: the thread and its latest run.
#[derive(Debug, Clone)]
pub(crate) struct ThreadRow {
    pub(crate) summary: ThreadSummary,
    pub(crate) latest: Option<RunRecord>,
}

/// The threads of `store` with their latest runs, most recently active first.
async fn thread_rows(store: &Arc<dyn ThreadStore>) -> Result<Vec<ThreadRow>, Exit> {
    let mut rows = Vec::new();
    for summary in store.list_threads().await.map_err(|e| anyhow!("{e}"))? {
        let runs = store
            .list_runs(&summary.thread_id)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let latest = match &summary.latest_run_id {
            Some(id) => runs.into_iter().find(|r| &r.run_id == id),
            None => runs.into_iter().max_by_key(|r| r.updated_at),
        };
        rows.push(ThreadRow { summary, latest });
    }
    rows.sort_by(|a, b| {
        b.summary
            .updated_at
            .cmp(&a.summary.updated_at)
            .then_with(|| {
                a.summary
                    .thread_id
                    .as_str()
                    .cmp(b.summary.thread_id.as_str())
            })
    });
    Ok(rows)
}

/// `awaken threads`: a table for a person, or one JSON object per line.
pub(crate) async fn threads(args: Args) -> Result<u8, Exit> {
    let store = open_store(args.store.as_deref(), Open::Existing)
        .await
        .map_err(open_failed)?;
    let rows = thread_rows(&store).await?;
    if args.json {
        for row in &rows {
            outln!("{}", thread_json(row));
        }
    } else {
        out!("{}", render_threads(&rows, now_millis()));
    }
    Ok(0)
}

/// One thread as a JSON object.
fn thread_json(row: &ThreadRow) -> Value {
    json!({
        "thread_id": row.summary.thread_id.as_str(),
        "agent": row.latest.as_ref().map(|r| &*r.agent_id),
        "status": row.latest.as_ref().map(|r| r.status.as_str()),
        "latest_run_id": row.summary.latest_run_id.as_ref().map(|r| r.as_str()),
        "messages": row.summary.message_count,
        "created_at": utc(row.summary.created_at.as_unix_millis()),
        "updated_at": utc(row.summary.updated_at.as_unix_millis()),
    })
}

/// The `awaken threads` table; `now` (Unix milliseconds) for the ages.
pub(crate) fn render_threads(rows: &[ThreadRow], now: i64) -> String {
    if rows.is_empty() {
        return "no threads in this store\n".to_owned();
    }
    let mut table = vec![[
        "THREAD".to_owned(),
        "AGENT".to_owned(),
        "STATUS".to_owned(),
        "LAST ACTIVITY".to_owned(),
        "MESSAGES".to_owned(),
    ]];
    for row in rows {
        let updated = row.summary.updated_at.as_unix_millis();
        table.push([
            row.summary.thread_id.to_string(),
            row.latest
                .as_ref()
                .map_or_else(|| "-".to_owned(), |r| r.agent_id.to_string()),
            row.latest.as_ref().map_or_else(|| "-".to_owned(), status),
            format!("{} ({} ago)", utc(updated), age(now - updated)),
            row.summary.message_count.to_string(),
        ]);
    }
    let mut widths = [0usize; 5];
    for line in &table {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for line in &table {
        let mut out = String::new();
        for (i, cell) in line.iter().enumerate() {
            if i + 1 == line.len() {
                out.push_str(cell);
            } else {
                let _ = write!(out, "{cell:<width$}  ", width = widths[i]);
            }
        }
        text.push_str(out.trim_end());
        text.push('\n');
    }
    text
}

/// A run's status for a person: `waiting`, `running`, or how it ended.
fn status(run: &RunRecord) -> String {
    match (&run.status, &run.termination) {
        (RunStatus::Done, Some(t)) => t.to_string(),
        (status, _) => status.to_string(),
    }
}

/// `awaken show THREAD`: the transcript, or the stored records as one JSON object.
pub(crate) async fn show(args: Args) -> Result<u8, Exit> {
    let (thread, store, checkpoint) = stored_thread(&args).await?;
    let runs = store.list_runs(&thread).await.map_err(|e| anyhow!("{e}"))?;
    if args.json {
        let events: Vec<Value> = store
            .load_events(&thread, 0)
            .await
            .map_err(|e| anyhow!("{e}"))?
            .into_iter()
            .map(|e| json!({"seq": e.seq, "run_id": e.run_id.as_str(), "event": e.event}))
            .collect();
        let record = json!({
            "thread_id": thread.as_str(),
            "messages": checkpoint.messages,
            "runs": runs,
            "batch": checkpoint.batch,
            "thread_state": checkpoint.thread_state.values,
            "events": events,
        });
        outln!("{record}");
        return Ok(0);
    }
    out!(
        "{}",
        render_transcript(&thread, &checkpoint.messages, &runs)
    );
    let waiting = checkpoint
        .run
        .as_ref()
        .is_some_and(|r| r.status == RunStatus::Waiting);
    if waiting && let Some(batch) = &checkpoint.batch {
        let resume = resume_command(&args, &thread);
        outln!();
        for call in batch
            .calls()
            .iter()
            .filter(|c| c.state() == ToolCallState::Suspended)
        {
            let question = call.ticket().map_or("", |t| t.message.as_str());
            outln!(
                "waiting: {} {} {}: {question}\n  answer: {resume} --approve {id}\n      or: {resume} --deny {id}",
                call.id(),
                call.call().name,
                call.call().arguments,
                id = shell_word(call.id().as_str()),
            );
        }
    }
    Ok(0)
}

/// The transcript of a thread: its runs with their times, then each message with its role,
/// the tool calls with their arguments and the results.
pub(crate) fn render_transcript(
    thread: &ThreadId,
    messages: &[Message],
    runs: &[RunRecord],
) -> String {
    let mut text = format!(
        "thread {thread} · {} message(s) · {} run(s)\n",
        messages.len(),
        runs.len()
    );
    if !runs.is_empty() {
        text.push_str("\nruns\n");
    }
    for run in runs {
        let took = run.updated_at.as_unix_millis() - run.created_at.as_unix_millis();
        let _ = writeln!(
            text,
            "  {}  {} · {} · {} step(s) · {} tokens · started {} · last {} ({})",
            run.run_id,
            run.agent_id,
            status(run),
            run.steps,
            run.usage.total(),
            utc(run.created_at.as_unix_millis()),
            utc(run.updated_at.as_unix_millis()),
            age(took),
        );
    }
    if !messages.is_empty() {
        text.push_str("\ntranscript\n");
    }
    const INDENT: &str = "             ";
    for m in messages {
        let role = match m.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        let body = content_text(&m.content);
        let mut lines = body.lines();
        let first = match (m.role, &m.tool_call_id) {
            (Role::Tool, Some(call)) => format!("{call} ← {}", clip(&body, 300)),
            _ => lines.next().unwrap_or("").to_owned(),
        };
        let _ = writeln!(text, "  {role:<10} {first}");
        if m.role != Role::Tool {
            for line in lines {
                let _ = writeln!(text, "{INDENT}{line}");
            }
        }
        for call in m.tool_calls.iter() {
            let args = call
                .invalid_arguments
                .clone()
                .unwrap_or_else(|| call.arguments.to_string());
            let _ = writeln!(
                text,
                "{INDENT}→ {} {}  ({})",
                call.name,
                clip(&args, 300),
                call.id
            );
        }
    }
    // No line ends in spaces (an empty first line leaves the role's padding).
    text.lines()
        .map(|l| l.trim_end().to_owned() + "\n")
        .collect()
}

/// The text of content blocks: text as it is, JSON compact, reasoning and images marked, and
/// an answer cut short by a cancellation marked `(interrupted)`.
fn content_text(blocks: &[ContentBlock]) -> String {
    let mut text = String::new();
    for block in blocks {
        let part = match block {
            ContentBlock::Text { text } => text.clone(),
            ContentBlock::Reasoning { text } => format!("(reasoning) {}", clip(text, 200)),
            ContentBlock::Image { url, .. } => format!("(image {})", clip(url, 80)),
            ContentBlock::Json { value } => value.to_string(),
            ContentBlock::Incomplete => {
                text.push_str(" (interrupted)");
                continue;
            }
            _ => "(content)".to_owned(),
        };
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&part);
    }
    text
}

/// Now, in Unix milliseconds.
fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A Unix time in milliseconds as `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn utc(millis: i64) -> String {
    let secs = millis.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// A duration in milliseconds for a person: `850 ms`, `12s`, `5m`, `3h`, `2d` (with `ago`
/// left to the caller's words).
pub(crate) fn age(millis: i64) -> String {
    let millis = millis.max(0);
    let secs = millis / 1000;
    match secs {
        0 => format!("{millis} ms"),
        1..=119 => format!("{secs}s"),
        120..=7_199 => format!("{}m", secs / 60),
        7_200..=172_799 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// `awaken threads rm THREAD...`: deletes each thread with its runs and events.
pub(crate) async fn threads_rm(args: Args) -> Result<u8, Exit> {
    let store = open_store(args.store.as_deref(), Open::Existing)
        .await
        .map_err(open_failed)?;
    let mut missing = Vec::new();
    for id in &args.positional {
        let thread = ThreadId::new(id).map_err(|e| bad_input(anyhow!("{e}")))?;
        refuse_running(&store, &thread).await?;
        if store
            .delete_thread(&thread)
            .await
            .map_err(|e| anyhow!("{e}"))?
        {
            if !args.quiet {
                errln!("deleted thread {thread}");
            }
        } else {
            missing.push(thread.to_string());
        }
    }
    if missing.is_empty() {
        Ok(0)
    } else {
        Err(bad_input(anyhow!(
            "no such thread(s): {}",
            missing.join(", ")
        )))
    }
}

/// Refuses to delete a thread whose latest run is running (another process may hold it).
async fn refuse_running(store: &Arc<dyn ThreadStore>, thread: &ThreadId) -> Result<(), Exit> {
    let running = store
        .load_checkpoint(thread)
        .await
        .map_err(|e| anyhow!("{e}"))?
        .and_then(|c| c.run)
        .filter(|r| r.status == RunStatus::Running);
    match running {
        Some(run) => Err(Exit {
            code: 3,
            error: anyhow!(
                "thread `{thread}` has run {} running (in this or another process); \
                 cancel it first, or `awaken recover` it if its process is gone",
                run.run_id
            ),
        }),
        None => Ok(()),
    }
}

/// `awaken threads prune --older-than AGE [--dry-run]`: deletes the threads whose last activity
/// is older than AGE (a thread with a running run is kept).
pub(crate) async fn threads_prune(args: Args) -> Result<u8, Exit> {
    let store = open_store(args.store.as_deref(), Open::Existing)
        .await
        .map_err(open_failed)?;
    let older_than = args.older_than.unwrap_or_default();
    let cutoff = now_millis() - i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
    let mut deleted = 0usize;
    for row in thread_rows(&store).await? {
        if row.summary.updated_at.as_unix_millis() >= cutoff {
            continue;
        }
        let thread = &row.summary.thread_id;
        if row
            .latest
            .as_ref()
            .is_some_and(|r| r.status == RunStatus::Running)
        {
            errln!("kept thread {thread}: a run is running on it");
            continue;
        }
        if args.dry_run {
            outln!("{thread}");
            deleted += 1;
        } else if store
            .delete_thread(thread)
            .await
            .map_err(|e| anyhow!("{e}"))?
        {
            deleted += 1;
        }
    }
    if !args.quiet {
        errln!(
            "{} {deleted} thread(s) last active more than {} ago",
            if args.dry_run {
                "would delete"
            } else {
                "deleted"
            },
            age(i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX))
        );
    }
    Ok(0)
}

/// `awaken validate --agent FILE`: resolves the agent without running it.
pub(crate) async fn validate(args: Args) -> Result<u8, Exit> {
    let file = load_file(&args)?;
    // The file's MCP servers are started: one that never comes up is reported here.
    let mcp = mcp_servers(std::slice::from_ref(&file))
        .await
        .map_err(bad_input)?;
    let runtime = runtime(
        &file,
        &args,
        Arc::new(MemoryStore::new()),
        Purpose::Validate,
        &mcp,
    )
    .map_err(bad_input)?;
    let resolved = runtime
        .resolver()
        .resolve(&file.agent.id)
        .map_err(|e| bad_input(anyhow!("{e}")))?;
    for w in &resolved.warnings {
        outln!("warning: {w}");
    }
    // About every agent the file reaches (its own and its plugins' agents) together.
    for w in runtime.resolver().validation_warnings() {
        outln!("warning: {w}");
    }
    outln!(
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
        return Err(bad_input(anyhow!(
            "--dir DIR is required\n\n{}",
            command_usage("plugins").unwrap_or(USAGE)
        )));
    }
    let mut problems = 0usize;
    for dir in &args.dirs {
        let files = manifests(dir).map_err(bad_input)?;
        if files.is_empty() {
            outln!("{}: no plugin manifests (*.toml)", dir.display());
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
                Ok(plugin) => outln!("{}", describe(&plugin, &path)),
                Err(e) => {
                    problems += 1;
                    errln!("error: {}:{e}", path.display());
                }
            }
        }
    }
    if problems == 0 {
        let registry = PluginRegistry::new();
        for dir in &args.dirs {
            if let Err(e) = registry.load_dir(dir) {
                problems += 1;
                errln!("error: {e}");
            }
        }
        if problems == 0 {
            outln!(
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
