//! What the command prints: the event stream for a person or as JSON lines (standard output),
//! and the instructions that answer a waiting run (standard error, so `--json` output stays
//! events only).

use std::fmt::Write as _;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use awaken::event::{AgentEvent, EventSink, ResumeDecision, SuspendTicket, ThreadId};

use crate::args::Args;

/// Prints events for a person: the run's start, text as it arrives, tool calls and results,
/// suspensions and decisions.
#[derive(Default)]
pub(crate) struct Terminal {
    /// Whether the cursor is after streamed text on an unfinished line.
    mid_line: AtomicBool,
}

impl EventSink for Terminal {
    fn emit(&self, event: &AgentEvent) {
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
            AgentEvent::RunStart { .. }
                | AgentEvent::ToolCallReady { .. }
                | AgentEvent::ToolCallDone { .. }
                | AgentEvent::ToolCallSuspended { .. }
                | AgentEvent::ToolCallResumed { .. }
                | AgentEvent::Warning { .. }
                | AgentEvent::Error { .. }
                | AgentEvent::StepEnd { .. }
        );
        if shows_line && self.mid_line.swap(false, Ordering::Relaxed) {
            let _ = writeln!(out);
        }
        let _ = match event {
            AgentEvent::RunStart {
                thread_id,
                run_id,
                agent_id,
                resumed,
                ..
            } => writeln!(
                out,
                "▶ {} run {run_id} of agent {agent_id} on thread {thread_id}",
                if *resumed { "resuming" } else { "started" }
            ),
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
            AgentEvent::ToolCallResumed { call_id, decision } => match decision {
                ResumeDecision::Approve => writeln!(out, "✓ {call_id} approved"),
                ResumeDecision::Deny => writeln!(out, "✗ {call_id} denied"),
            },
            AgentEvent::Warning { detail, .. } => writeln!(out, "warning: {detail}"),
            AgentEvent::Error { message } => writeln!(out, "error: {message}"),
            _ => Ok(()),
        };
        let _ = out.flush();
    }
}

/// Prints events as JSON lines.
pub(crate) struct JsonLines;

impl EventSink for JsonLines {
    fn emit(&self, event: &AgentEvent) {
        if let Ok(line) = serde_json::to_string(event) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
}

/// `word` as one shell word (quoted only when it needs to be).
pub(crate) fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:@%+=,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The start of the command that resumes `thread` with the agent file and store of `args`.
pub(crate) fn resume_command(args: &Args, thread: &ThreadId) -> String {
    let mut command = format!("awaken resume {}", shell_word(thread.as_str()));
    match &args.agent {
        Some(agent) => {
            let _ = write!(
                command,
                " --agent {}",
                shell_word(&agent.display().to_string())
            );
        }
        None => command.push_str(" --agent AGENT_FILE"),
    }
    if let Some(store) = &args.store {
        let _ = write!(command, " --store {}", shell_word(store));
    }
    command
}

/// The calls `thread` waits on, each with its question, and the commands that answer them.
pub(crate) fn waiting_instructions(
    args: &Args,
    thread: &ThreadId,
    tickets: &[SuspendTicket],
) -> String {
    let mut text = format!("waiting for a decision on {} call(s):\n", tickets.len());
    for t in tickets {
        let _ = writeln!(
            text,
            "  {}  {} {}\n      {}",
            t.call.call_id, t.call.tool_name, t.call.arguments, t.message
        );
    }
    let resume = resume_command(args, thread);
    text.push_str("answer with:\n");
    for t in tickets {
        let call = shell_word(t.call.call_id.as_str());
        let _ = writeln!(text, "  {resume} --approve {call}");
        let _ = writeln!(
            text,
            "  {resume} --deny {call} --answer '\"the reason, for the model\"'"
        );
    }
    if tickets.len() > 1 {
        let all: Vec<String> = tickets
            .iter()
            .map(|t| format!("--approve {}", shell_word(t.call.call_id.as_str())))
            .collect();
        let _ = writeln!(
            text,
            "  {resume} {}    (several decisions in one command)",
            all.join(" ")
        );
    }
    text
}
