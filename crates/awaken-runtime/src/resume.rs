//! HITL: continuing a run that waits for decisions on suspended tool calls, in any process on
//! the same store. Every decision is validated before any is applied; the run stays waiting
//! until every suspended call has one.

use std::collections::HashSet;

use awaken_event::{
    CancellationToken, ResumeDecision, SuspendTicket, ThreadId, ToolCallId, ToolCallResume,
    ToolCallState,
};
use awaken_state::{StateError, StateKey};
use awaken_tool::{ArgumentValidator, ToolBatch};
use serde::{Deserialize, Serialize};

use crate::handle::RunHandle;
use crate::steering::Steering;

/// A request to continue a waiting thread with decisions on its suspended calls.
#[derive(Debug, Clone)]
pub struct Resume {
    /// The waiting thread.
    pub thread_id: ThreadId,
    /// Decisions, at most one per suspended call; calls left undecided keep waiting.
    pub decisions: Vec<ToolCallResume>,
    /// Cancels the continued run when cancelled.
    pub cancel: CancellationToken,
    /// Messages for the continued run while it is in flight, taken at its next step.
    pub steering: Steering,
}

impl Resume {
    /// A resume of `thread_id` with no decisions yet.
    pub fn new(thread_id: ThreadId) -> Self {
        Self {
            thread_id,
            decisions: Vec::new(),
            cancel: CancellationToken::new(),
            steering: Steering::new(),
        }
    }

    /// Adds a decision.
    pub fn with_decision(mut self, decision: ToolCallResume) -> Self {
        self.decisions.push(decision);
        self
    }

    /// A handle that cancels the continued run.
    pub fn handle(&self) -> RunHandle {
        RunHandle::new(self.cancel.clone())
    }

    /// The continued run's steering inbox (see [`Steering`]).
    pub fn steering(&self) -> Steering {
        self.steering.clone()
    }

    /// Gives the continued run `steering` as its inbox.
    pub fn with_steering(mut self, steering: Steering) -> Self {
        self.steering = steering;
        self
    }
}

/// Why a decision was refused (none of the request's decisions was applied).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DecisionError {
    /// The call is not one of the run's suspended calls.
    #[error("call {call_id} is not waiting for a decision (waiting: {waiting:?})")]
    UnknownCall {
        /// The call named.
        call_id: ToolCallId,
        /// The calls that are waiting.
        waiting: Vec<ToolCallId>,
    },
    /// The decision was made on other arguments than the suspended call's.
    #[error(
        "the decision for call {call_id} was made on other arguments (digest {given}, the call's is {expected})"
    )]
    ArgumentsDiffer {
        /// The call.
        call_id: ToolCallId,
        /// The suspended call's digest.
        expected: String,
        /// The decision's digest.
        given: String,
    },
    /// Two decisions for one call (in this request, or one already recorded).
    #[error("call {call_id} already has a decision")]
    Duplicate {
        /// The call.
        call_id: ToolCallId,
    },
    /// The answer does not match the ticket's response schema.
    #[error("the answer for call {call_id} does not match its schema: {violations}")]
    InvalidAnswer {
        /// The call.
        call_id: ToolCallId,
        /// What is wrong.
        violations: String,
    },
}

/// Decisions recorded for the waiting run's suspended calls (run-scoped: they carry over to
/// whichever process resumes the run; cleared once the calls are processed).
pub struct ResumeDecisionsKey;

/// A change to the recorded decisions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DecisionsUpdate {
    /// Record decisions.
    Add {
        /// The decisions.
        decisions: Vec<ToolCallResume>,
    },
    /// Forget every decision (the calls were processed).
    Clear,
}

impl StateKey for ResumeDecisionsKey {
    const KEY: &'static str = "awaken.loop.resume_decisions";
    type Value = Vec<ToolCallResume>;
    type Update = DecisionsUpdate;

    fn apply(value: &mut Vec<ToolCallResume>, update: DecisionsUpdate) -> Result<(), StateError> {
        match update {
            DecisionsUpdate::Add { decisions } => value.extend(decisions),
            DecisionsUpdate::Clear => value.clear(),
        }
        Ok(())
    }
}

/// The decisions earlier resumes recorded in a waiting run's run-scoped state.
pub(crate) fn recorded_decisions(
    run_state: &awaken_state::PersistedState,
) -> Result<Vec<ToolCallResume>, serde_json::Error> {
    run_state
        .values
        .get(ResumeDecisionsKey::KEY)
        .map(|v| serde_json::from_value(v.clone()))
        .transpose()
        .map(Option::unwrap_or_default)
}

/// The suspended calls of `batch` with their tickets, in call order.
pub(crate) fn suspended_calls(batch: &ToolBatch) -> Vec<(ToolCallId, SuspendTicket)> {
    batch
        .calls()
        .iter()
        .filter(|c| c.state() == ToolCallState::Suspended)
        .filter_map(|c| c.ticket().map(|t| (c.id().clone(), t.clone())))
        .collect()
}

/// Checks `new` against the suspended calls and the decisions already recorded.
pub(crate) fn validate_decisions(
    batch: &ToolBatch,
    recorded: &[ToolCallResume],
    new: &[ToolCallResume],
) -> Result<(), DecisionError> {
    let waiting = suspended_calls(batch);
    let mut seen: HashSet<&ToolCallId> = recorded.iter().map(|d| &d.call_id).collect();
    for decision in new {
        let Some((_, ticket)) = waiting.iter().find(|(id, _)| *id == decision.call_id) else {
            return Err(DecisionError::UnknownCall {
                call_id: decision.call_id.clone(),
                waiting: waiting.iter().map(|(id, _)| id.clone()).collect(),
            });
        };
        if ticket.call.argument_digest != decision.argument_digest {
            return Err(DecisionError::ArgumentsDiffer {
                call_id: decision.call_id.clone(),
                expected: ticket.call.argument_digest.clone(),
                given: decision.argument_digest.clone(),
            });
        }
        if !seen.insert(&decision.call_id) {
            return Err(DecisionError::Duplicate {
                call_id: decision.call_id.clone(),
            });
        }
        if let (ResumeDecision::Approve, Some(schema)) =
            (decision.decision, &ticket.response_schema)
        {
            let answer = decision.payload.clone().unwrap_or(serde_json::Value::Null);
            let validator = ArgumentValidator::compile(ticket.call.tool_name.as_str(), schema)
                .map_err(|e| DecisionError::InvalidAnswer {
                    call_id: decision.call_id.clone(),
                    violations: format!("the ticket's schema does not compile: {e}"),
                })?;
            let violations = validator.violations(&answer);
            if !violations.is_empty() {
                return Err(DecisionError::InvalidAnswer {
                    call_id: decision.call_id.clone(),
                    violations: violations
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                });
            }
        }
    }
    Ok(())
}
