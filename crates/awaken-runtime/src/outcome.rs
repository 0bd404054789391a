//! How an activation ended: [`RunOutcome`].

use awaken_event::{RunId, TerminationReason, TokenUsage};

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
