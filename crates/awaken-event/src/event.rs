//! The neutral event stream a run emits, and the sink it is handed to.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{RunId, ThreadId, ToolCallId};
use crate::inference::{StopReason, TokenUsage};
use crate::message::Message;
use crate::termination::TerminationReason;
use crate::tool::{ResumeDecision, SuspendTicket, ToolCallState, ToolResult};

/// What kind of warning a [`AgentEvent::Warning`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WarningKind {
    /// A stored history had an unpaired tool call or result and was repaired before use.
    HistoryRepaired,
    /// The agent's resolved spec changed while the run was waiting.
    SpecChanged,
    /// Compaction failed and the context transform fell back to truncation.
    CompactionFellBack,
    /// Resolution reported a warning (unmatched pattern, unclaimed section, ...).
    Resolution,
    /// Several tool-gate decisions of equal priority disagreed.
    GateConflict,
    /// A lifecycle hook or effect handler failed (observational; the run went on).
    HandlerFailed,
    /// Anything else.
    Other,
}

/// The neutral event vocabulary. Protocol adapters (SSE, AG-UI, ...) translate it at the edge;
/// the runtime knows no wire format.
///
/// One activation (a start or a resume) is `RunStart` … `RunFinish`; steps are
/// `StepStart` … `StepEnd`, never nested; every `ToolCallStart` is closed by `ToolCallDone`
/// or `ToolCallSuspended` within its step. [`crate::GrammarChecker`] checks this.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum AgentEvent {
    /// An activation began.
    RunStart {
        /// The thread.
        thread_id: ThreadId,
        /// The run.
        run_id: RunId,
        /// The agent being run.
        agent_id: Arc<str>,
        /// The parent run, for a delegated child run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_run_id: Option<RunId>,
        /// Whether this activation resumes a waiting (or recovered) run.
        resumed: bool,
    },
    /// An activation ended.
    RunFinish {
        /// The thread.
        thread_id: ThreadId,
        /// The run.
        run_id: RunId,
        /// Why it ended (boxed: every stored event would otherwise be sized for it).
        termination: Box<TerminationReason>,
        /// The final assistant text, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        response: Option<String>,
        /// Token usage of the whole run so far (boxed, as `termination`).
        usage: Box<TokenUsage>,
    },
    /// A step began.
    StepStart {
        /// The step's number within the run, from 1.
        step: u32,
    },
    /// A step ended.
    StepEnd {
        /// The step's number.
        step: u32,
    },
    /// Streamed assistant text.
    TextDelta {
        /// The new text.
        delta: String,
    },
    /// Streamed reasoning text.
    ReasoningDelta {
        /// The new text.
        delta: String,
    },
    /// The model began a tool call.
    ToolCallStart {
        /// The call.
        call_id: ToolCallId,
        /// The tool's name.
        name: Arc<str>,
    },
    /// A fragment of a tool call's argument text.
    ToolCallArgsDelta {
        /// The call.
        call_id: ToolCallId,
        /// The fragment.
        delta: String,
    },
    /// A tool call is complete and about to go through the gate.
    ToolCallReady {
        /// The call.
        call_id: ToolCallId,
        /// The tool's name.
        name: Arc<str>,
        /// The parsed arguments (`null` if they were not JSON); shared, as events are copied
        /// into commits.
        #[serde(deserialize_with = "crate::shared::arc_value")]
        arguments: Arc<Value>,
    },
    /// A tool call was closed with its result.
    ToolCallDone {
        /// The call.
        call_id: ToolCallId,
        /// The result the model will see (shared with the run's tool batch and its tool
        /// message).
        result: Arc<ToolResult>,
        /// The call's final state in the batch.
        state: ToolCallState,
    },
    /// A tool call waits for an external decision.
    ToolCallSuspended {
        /// The call.
        call_id: ToolCallId,
        /// What is asked, and how to answer (boxed: the largest payload, which would otherwise
        /// size every event).
        ticket: Box<SuspendTicket>,
    },
    /// A decision for a suspended call was applied.
    ToolCallResumed {
        /// The call.
        call_id: ToolCallId,
        /// The decision.
        decision: ResumeDecision,
    },
    /// A running tool reported progress.
    ToolCallProgress {
        /// The call.
        call_id: ToolCallId,
        /// Tool-defined progress data.
        progress: Value,
    },
    /// An inference finished.
    InferenceComplete {
        /// The upstream model that answered.
        model: Arc<str>,
        /// Its token usage.
        usage: TokenUsage,
        /// How long it took, in milliseconds.
        duration_ms: u64,
        /// Why the model stopped: an answer cut at the token limit (`max_tokens`) or by a
        /// content filter did not finish. (Absent from events stored before it was recorded:
        /// `end_turn`.)
        #[serde(default)]
        stop_reason: StopReason,
    },
    /// The full (persisted) state after a commit.
    StateSnapshot {
        /// The state revision.
        revision: u64,
        /// Key name → value.
        state: Value,
    },
    /// The keys a commit changed.
    StateDelta {
        /// The state revision after the commit.
        revision: u64,
        /// Key name → new value.
        changes: Value,
    },
    /// A scheduled action could not be processed and was dead-lettered.
    ActionDeadLettered {
        /// The action's key.
        action: String,
        /// The phase it targeted.
        phase: String,
        /// Why.
        reason: String,
    },
    /// Something worth knowing that did not stop the run.
    Warning {
        /// What kind of warning.
        kind: WarningKind,
        /// Details.
        detail: String,
    },
    /// An error inside the run (the run's end is reported by `RunFinish`).
    Error {
        /// What went wrong.
        message: String,
    },
    /// A message sent to the run while it was in flight (steering) was added to the thread,
    /// between two steps: step `step`, about to start, is the first to see it.
    MessageAdded {
        /// The step that takes the message.
        step: u32,
        /// The message as stored.
        message: Message,
    },
}

impl AgentEvent {
    /// The event's `type` tag as it appears in JSON.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::RunStart { .. } => "run_start",
            Self::RunFinish { .. } => "run_finish",
            Self::StepStart { .. } => "step_start",
            Self::StepEnd { .. } => "step_end",
            Self::TextDelta { .. } => "text_delta",
            Self::ReasoningDelta { .. } => "reasoning_delta",
            Self::ToolCallStart { .. } => "tool_call_start",
            Self::ToolCallArgsDelta { .. } => "tool_call_args_delta",
            Self::ToolCallReady { .. } => "tool_call_ready",
            Self::ToolCallDone { .. } => "tool_call_done",
            Self::ToolCallSuspended { .. } => "tool_call_suspended",
            Self::ToolCallResumed { .. } => "tool_call_resumed",
            Self::ToolCallProgress { .. } => "tool_call_progress",
            Self::InferenceComplete { .. } => "inference_complete",
            Self::StateSnapshot { .. } => "state_snapshot",
            Self::StateDelta { .. } => "state_delta",
            Self::ActionDeadLettered { .. } => "action_dead_lettered",
            Self::Warning { .. } => "warning",
            Self::Error { .. } => "error",
            Self::MessageAdded { .. } => "message_added",
        }
    }

    /// Whether the event reports a committed, durable fact (and is stored with its commit),
    /// as opposed to a streamed delta that is only forwarded.
    pub fn is_lifecycle(&self) -> bool {
        !matches!(
            self,
            Self::TextDelta { .. }
                | Self::ReasoningDelta { .. }
                | Self::ToolCallArgsDelta { .. }
                | Self::ToolCallProgress { .. }
                | Self::StateSnapshot { .. }
                | Self::StateDelta { .. }
        )
    }
}

/// Receives a run's events as they happen.
///
/// `emit` is called on the run's own task, in event order, once per event; it must not block
/// for long (hand the event to a channel if the consumer is slow). It cannot fail the run: a
/// sink whose consumer went away simply drops events. It may be called from several runs at
/// once when one sink is shared.
pub trait EventSink: Send + Sync {
    /// Handles one event.
    fn emit(&self, event: &AgentEvent);

    /// Handles one lifecycle event together with its sequence number in the thread's stored
    /// event log (from 1, without gaps; the run's next commit stores it under that number).
    /// The runtime calls this instead of `emit` for every event it stores, in the order it
    /// stores them, and `emit` for the streamed deltas between them. The default ignores the
    /// number.
    fn emit_stored(&self, event: &AgentEvent, seq: u64) {
        let _ = seq;
        self.emit(event);
    }

    /// Says that every event numbered up to `last_seq` is now in the store: called after each
    /// commit that stored events, before the events about its facts are emitted. (An event
    /// emitted before its commit is numbered but not yet stored; if the run stops before the
    /// commit, its number is given to another event later.) The default does nothing.
    fn committed(&self, last_seq: u64) {
        let _ = last_seq;
    }
}

impl<F> EventSink for F
where
    F: Fn(&AgentEvent) + Send + Sync,
{
    fn emit(&self, event: &AgentEvent) {
        self(event)
    }
}

/// A sink that drops every event.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl EventSink for NullSink {
    fn emit(&self, _event: &AgentEvent) {}
}

/// A sink that keeps every event in memory (tests, short runs).
#[derive(Debug, Default)]
pub struct VecSink {
    events: Mutex<Vec<AgentEvent>>,
}

impl VecSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the events received so far.
    pub fn events(&self) -> Vec<AgentEvent> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Takes the events received so far, leaving the sink empty.
    pub fn take(&self) -> Vec<AgentEvent> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl EventSink for VecSink {
    fn emit(&self, event: &AgentEvent) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event.clone());
    }
}
