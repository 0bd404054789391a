//! How an activation ended: [`RunOutcome`], and [`RecoveredRun`] for each run `recover` took
//! over.

use awaken_event::{RunId, TerminationReason, ThreadId, TokenUsage};

use crate::error::RunError;

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    /// The run.
    pub run_id: RunId,
    /// Why it ended.
    pub termination: TerminationReason,
    /// The last assistant text, if any.
    pub response: Option<String>,
    /// Steps taken in this activation.
    pub steps: u32,
    /// Token usage of the run.
    pub usage: TokenUsage,
}

/// A run `AgentRuntime::recover` took over, and how its continuation ended.
#[derive(Debug)]
pub struct RecoveredRun {
    /// Its thread.
    pub thread_id: ThreadId,
    /// The run.
    pub run_id: RunId,
    /// The continued activation's outcome.
    pub outcome: Result<RunOutcome, RunError>,
}
