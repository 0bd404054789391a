//! Awaken's neutral vocabulary: ids, messages, tool calls and results, the states of a call
//! in a tool batch, suspension tickets and resume decisions, typed termination, the
//! [`AgentEvent`] stream with its [`EventSink`], and the checker of the event grammar.
//!
//! Everything here is plain serde data (tagged JSON, snake_case) shared by every other crate.
//! This crate must never know tokio, storage, HTTP or any wire protocol, and reads no clock:
//! ids and times come in as values.

mod cancel;
mod event;
mod grammar;
mod history;
mod ids;
mod inference;
mod message;
mod shared;
mod termination;
mod tool;

pub use cancel::{CancellationToken, Cancelled, CancelledOwned};
pub use event::{AgentEvent, EventSink, NullSink, VecSink, WarningKind};
pub use grammar::{
    GrammarChecker, GrammarViolation, ViolationKind, check_activation, check_events,
};
pub use history::History;
pub use ids::{IdError, MAX_ID_LEN, ProfileId, RunId, ThreadId, ToolCallId};
pub use inference::{InferenceResponse, StopReason, TokenUsage};
pub use message::{ContentBlock, Message, Role, ToolCall, no_content, no_tool_calls};
pub use termination::TerminationReason;
pub use tool::{
    EffectClass, PendingCall, ResumeDecision, ResumeMode, SuspendTicket, ToolCallResume,
    ToolCallState, ToolDescriptor, ToolResult, ToolResultStatus,
};

#[cfg(test)]
mod tests;
