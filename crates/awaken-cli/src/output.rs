//! What the command prints: the event stream for a person or as JSON lines (standard output),
//! and the instructions that answer a waiting run (standard error, so `--json` output stays
//! events only).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use awaken::event::{AgentEvent, EventSink, ResumeDecision, SuspendTicket, ThreadId};

use crate::args::Args;
use crate::term::{clear_status, out, outln, show_status, stderr_is_terminal};

/// How long the model may be silent before the waiting indicator shows.
const SILENCE_SHOWN_AFTER: Duration = Duration::from_secs(1);

/// When the model was last asked and has not answered yet.
#[derive(Default)]
struct Waiting {
    since: Mutex<Option<Instant>>,
}

impl Waiting {
    fn set(&self, since: Option<Instant>) {
        if let Ok(mut slot) = self.since.lock() {
            *slot = since;
        }
    }

    fn since(&self) -> Option<Instant> {
        self.since.lock().ok().and_then(|s| *s)
    }
}

/// The waiting indicator's text after `silent` without an answer.
pub(crate) fn waiting_text(silent: Duration) -> String {
    format!("… waiting for the model ({}s)", silent.as_secs())
}

/// Prints events for a person: the run's start, text as it arrives, tool calls and results,
/// suspensions and decisions. Quiet, it prints only the answer's text. On a terminal it shows
/// a waiting indicator on standard error while the model has been silent for a second or more.
pub(crate) struct Terminal {
    /// Whether the cursor is after streamed text on an unfinished line.
    mid_line: AtomicBool,
    quiet: bool,
    waiting: Arc<Waiting>,
}

impl Terminal {
    /// A terminal printer; `quiet` prints the answer only. The indicator runs while the
    /// printer lives (it needs a tokio runtime, and standard error to be a terminal).
    pub(crate) fn new(quiet: bool) -> Self {
        let waiting = Arc::new(Waiting::default());
        if !quiet && stderr_is_terminal() {
            let weak = Arc::downgrade(&waiting);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(250));
                loop {
                    tick.tick().await;
                    let Some(waiting) = weak.upgrade() else {
                        break;
                    };
                    if let Some(since) = waiting.since() {
                        let silent = since.elapsed();
                        if silent >= SILENCE_SHOWN_AFTER {
                            show_status(&waiting_text(silent));
                        }
                    }
                }
            });
        }
        Self {
            mid_line: AtomicBool::new(false),
            quiet,
            waiting,
        }
    }

    /// Ends a line of streamed text, if one is open.
    fn end_line(&self) {
        if self.mid_line.swap(false, Ordering::Relaxed) {
            outln!();
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.waiting.set(None);
        clear_status();
    }
}

impl EventSink for Terminal {
    fn emit(&self, event: &AgentEvent) {
        // The model is asked at the start of each step, and has answered at its first output.
        match event {
            AgentEvent::StepStart { .. } => self.waiting.set(Some(Instant::now())),
            AgentEvent::TextDelta { .. }
            | AgentEvent::ReasoningDelta { .. }
            | AgentEvent::ToolCallStart { .. }
            | AgentEvent::InferenceComplete { .. }
            | AgentEvent::StepEnd { .. }
            | AgentEvent::RunFinish { .. }
            | AgentEvent::Error { .. } => {
                self.waiting.set(None);
                clear_status();
            }
            _ => {}
        }
        if let AgentEvent::TextDelta { delta } = event {
            out!("{delta}");
            self.mid_line
                .store(!delta.ends_with('\n'), Ordering::Relaxed);
            return;
        }
        if self.quiet {
            // Each step's text ends its line (a step that calls tools says something first).
            if matches!(
                event,
                AgentEvent::StepEnd { .. } | AgentEvent::RunFinish { .. }
            ) {
                self.end_line();
            }
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
                | AgentEvent::MessageAdded { .. }
                | AgentEvent::StepEnd { .. }
                | AgentEvent::RunFinish { .. }
        );
        if shows_line {
            self.end_line();
        }
        match event {
            AgentEvent::RunStart {
                thread_id,
                run_id,
                agent_id,
                resumed,
                ..
            } => outln!(
                "▶ {} run {run_id} of agent {agent_id} on thread {thread_id}",
                if *resumed { "resuming" } else { "started" }
            ),
            AgentEvent::ToolCallReady {
                name, arguments, ..
            } => outln!("→ {name} {arguments}"),
            AgentEvent::ToolCallDone { result, state, .. } => {
                outln!("← {state}: {}", clip(&result.content.to_string(), 200));
            }
            AgentEvent::ToolCallSuspended { call_id, ticket } => outln!(
                "⏸ {} ({call_id}) waits for a decision: {}",
                ticket.call.tool_name,
                ticket.message
            ),
            AgentEvent::ToolCallResumed { call_id, decision } => match decision {
                ResumeDecision::Approve => outln!("✓ {call_id} approved"),
                ResumeDecision::Deny => outln!("✗ {call_id} denied"),
            },
            AgentEvent::Warning { detail, .. } => outln!("warning: {detail}"),
            AgentEvent::MessageAdded { step, message } => {
                outln!("» {} (taken at step {step})", clip(&message.text(), 200));
            }
            AgentEvent::Error { message } => outln!("error: {message}"),
            _ => {}
        }
    }
}

/// `text` cut to `max` characters, with `…` when cut.
pub(crate) fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Prints events as JSON lines.
pub(crate) struct JsonLines;

impl EventSink for JsonLines {
    fn emit(&self, event: &AgentEvent) {
        if let Ok(line) = serde_json::to_string(event) {
            outln!("{line}");
        }
    }
}

/// The printer `args` asks for: JSON lines or the terminal's.
pub(crate) enum Printer {
    /// `--json`.
    Json(JsonLines),
    /// For a person.
    Terminal(Terminal),
}

impl Printer {
    /// The printer for `args`.
    pub(crate) fn for_args(args: &Args) -> Self {
        if args.json {
            Printer::Json(JsonLines)
        } else {
            Printer::Terminal(Terminal::new(args.quiet))
        }
    }
}

impl EventSink for Printer {
    fn emit(&self, event: &AgentEvent) {
        match self {
            Printer::Json(p) => p.emit(event),
            Printer::Terminal(p) => p.emit(event),
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

/// The start of the command that resumes `thread` with the agent file, store and model of
/// `args`.
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
    push_model_flags(&mut command, args);
    command
}

/// The command that goes on chatting on `thread` with the agent file, store and model of `args`.
pub(crate) fn chat_command(args: &Args, thread: &ThreadId) -> String {
    thread_command("chat", args, thread)
}

/// `awaken VERB --agent FILE --thread THREAD [--store SPEC] [--model M] [--script FILE]`, with
/// the agent file, store and model of `args`.
pub(crate) fn thread_command(verb: &str, args: &Args, thread: &ThreadId) -> String {
    let agent = args.agent.as_ref().map_or_else(
        || "AGENT_FILE".to_owned(),
        |a| shell_word(&a.display().to_string()),
    );
    let mut command = format!(
        "awaken {verb} --agent {agent} --thread {}",
        shell_word(thread.as_str())
    );
    if let Some(store) = &args.store {
        let _ = write!(command, " --store {}", shell_word(store));
    }
    push_model_flags(&mut command, args);
    command
}

/// Appends the `--model` and `--script` of `args` to a suggested command, so that it goes on
/// with the model the run had.
pub(crate) fn push_model_flags(command: &mut String, args: &Args) {
    if let Some(model) = &args.model {
        let _ = write!(command, " --model {}", shell_word(model));
    }
    if let Some(script) = &args.script {
        let _ = write!(
            command,
            " --script {}",
            shell_word(&script.display().to_string())
        );
    }
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
