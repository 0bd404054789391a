//! The tool batch of one step (the calls the model asked for, each with its state) and the
//! table of the transitions a call may make.

use std::sync::Arc;

use awaken_event::{EffectClass, SuspendTicket, ToolCall, ToolCallId, ToolCallState, ToolResult};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ToolError;
use crate::gate::ToolInterceptPayload;
use crate::recovery::{RecoveryAction, ToolRecoveryPolicy, recovery_action};

/// The result the model sees for a call closed as outcome unknown.
pub const OUTCOME_UNKNOWN_MESSAGE: &str = "outcome unknown: the call was interrupted while it \
was executing, so its effect may or may not have happened; check before calling it again";

/// Whether the transition table allows a call to move from `from` to `to`:
///
/// | from | to |
/// |---|---|
/// | `Requested` | `Executing`, `Blocked`, `Suspended`, `ShortCircuited`, `Cancelled` |
/// | `Executing` | `Succeeded`, `Failed`, `Cancelled`, `Executing` (re-run), `OutcomeUnknown`, `Suspended` |
/// | `Suspended` | `Executing`, `ShortCircuited`, `Blocked`, `Suspended`, `Cancelled` |
/// | terminal | nothing |
pub fn is_allowed_transition(from: ToolCallState, to: ToolCallState) -> bool {
    use ToolCallState as S;
    match from {
        S::Requested => matches!(
            to,
            S::Executing | S::Blocked | S::Suspended | S::ShortCircuited | S::Cancelled
        ),
        S::Executing => matches!(
            to,
            S::Succeeded
                | S::Failed
                | S::Cancelled
                | S::Executing
                | S::OutcomeUnknown
                | S::Suspended
        ),
        S::Suspended => matches!(
            to,
            S::Executing | S::ShortCircuited | S::Blocked | S::Suspended | S::Cancelled
        ),
        S::Succeeded
        | S::Failed
        | S::Blocked
        | S::ShortCircuited
        | S::Cancelled
        | S::OutcomeUnknown => false,
    }
}

/// Why a batch operation was refused. A refused operation changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// No call with this id is in the batch.
    #[error("tool call `{call_id}` is not in the batch")]
    UnknownCall {
        /// The id.
        call_id: ToolCallId,
    },
    /// Two calls of the batch have the same id.
    #[error("tool call `{call_id}` appears twice in the batch")]
    DuplicateCall {
        /// The id.
        call_id: ToolCallId,
    },
    /// The transition table does not allow this move.
    #[error("tool call `{call_id}` cannot move from {from} to {to}")]
    InvalidTransition {
        /// The call.
        call_id: ToolCallId,
        /// Its current state.
        from: ToolCallState,
        /// The refused target.
        to: ToolCallState,
    },
    /// A move to a terminal state needs the call's closing result.
    #[error("tool call `{call_id}` needs a closing result to move to {to}")]
    MissingResult {
        /// The call.
        call_id: ToolCallId,
        /// The terminal target.
        to: ToolCallState,
    },
    /// A result was given for a move to a state that is not terminal.
    #[error(
        "tool call `{call_id}` cannot take a result when moving to {to}, which is not terminal"
    )]
    UnexpectedResult {
        /// The call.
        call_id: ToolCallId,
        /// The non-terminal target.
        to: ToolCallState,
    },
    /// A move to `Suspended` needs a ticket (use [`ToolBatch::suspend`]).
    #[error("tool call `{call_id}` needs a suspension ticket to be suspended")]
    MissingTicket {
        /// The call.
        call_id: ToolCallId,
    },
    /// The call's arguments can no longer change: it has started running or is closed.
    #[error("the arguments of tool call `{call_id}` cannot change once it is {state}")]
    ArgumentsFixed {
        /// The call.
        call_id: ToolCallId,
        /// Its state.
        state: ToolCallState,
    },
    /// A stored batch breaks an invariant (read back from serde).
    #[error("tool call `{call_id}` in state {state} is inconsistent: {problem}")]
    Inconsistent {
        /// The call.
        call_id: ToolCallId,
        /// Its stored state.
        state: ToolCallState,
        /// What is wrong.
        problem: &'static str,
    },
}

/// One call of a batch: the call, its state, its closing result once terminal, its last
/// suspension ticket, and how many times it entered `Executing`. The call and its result are
/// shared, so a copy of a batch (the one a commit carries) copies neither.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchCall {
    call: SharedCall,
    state: ToolCallState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<Arc<ToolResult>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ticket: Option<SuspendTicket>,
    #[serde(default)]
    attempts: u32,
    #[serde(default, skip_serializing_if = "is_false")]
    asked_while_running: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One call of a shared list of calls (an assistant message's): read as that call, written
/// and read back by serde as that call alone.
#[derive(Clone)]
struct SharedCall {
    calls: Arc<[ToolCall]>,
    index: usize,
}

impl SharedCall {
    /// A call of its own (a list of one).
    fn own(call: ToolCall) -> Self {
        Self {
            calls: Arc::from([call]),
            index: 0,
        }
    }
}

impl std::ops::Deref for SharedCall {
    type Target = ToolCall;

    fn deref(&self) -> &ToolCall {
        &self.calls[self.index]
    }
}

impl std::fmt::Debug for SharedCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ToolCall::fmt(self, f)
    }
}

impl PartialEq for SharedCall {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Serialize for SharedCall {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ToolCall::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for SharedCall {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ToolCall::deserialize(deserializer).map(Self::own)
    }
}

impl BatchCall {
    /// The call.
    pub fn call(&self) -> &ToolCall {
        &self.call
    }

    /// Its id.
    pub fn id(&self) -> &ToolCallId {
        &self.call.id
    }

    /// Its state.
    pub fn state(&self) -> ToolCallState {
        self.state
    }

    /// Its closing result: `Some` exactly when the state is terminal.
    pub fn result(&self) -> Option<&ToolResult> {
        self.result.as_deref()
    }

    /// The ticket of its last suspension (kept after it leaves `Suspended`).
    pub fn ticket(&self) -> Option<&SuspendTicket> {
        self.ticket.as_ref()
    }

    /// How many times it entered `Executing` (a re-run after a crash counts).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether its last suspension came while it was `Executing` (its tool asked, such as a
    /// delegate relaying its child's question, or recovery asked whether to run it again):
    /// the gates had let it run before it waited.
    pub fn asked_while_running(&self) -> bool {
        self.asked_while_running
    }
}

/// Every call of one step with its state, serde data a store persists with the thread.
///
/// Every change goes through the transition table ([`is_allowed_transition`]); anything else is
/// a [`BatchError`] and changes nothing. A call holds a closing result exactly when its state
/// is terminal, so a closed batch ([`ToolBatch::is_closed`]) gives each call exactly one
/// closing result. Reading a batch back with serde checks the same invariants.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "RawBatch")]
pub struct ToolBatch {
    calls: Vec<BatchCall>,
}

#[derive(Deserialize)]
struct RawBatch {
    calls: Vec<BatchCall>,
}

impl TryFrom<RawBatch> for ToolBatch {
    type Error = BatchError;

    fn try_from(raw: RawBatch) -> Result<Self, BatchError> {
        let batch = ToolBatch { calls: raw.calls };
        batch.check()?;
        Ok(batch)
    }
}

impl ToolBatch {
    /// A batch of `calls`, all `Requested`, in the given order.
    ///
    /// # Errors
    /// [`BatchError::DuplicateCall`] when two calls share an id.
    pub fn new(calls: impl IntoIterator<Item = ToolCall>) -> Result<Self, BatchError> {
        Self::requested(calls.into_iter().map(SharedCall::own))
    }

    /// A batch of the calls of an assistant message (its shared list), all `Requested`, in
    /// their order: the batch shares them with the message (no call is copied).
    ///
    /// # Errors
    /// [`BatchError::DuplicateCall`] when two calls share an id.
    pub fn of_shared(calls: &Arc<[ToolCall]>) -> Result<Self, BatchError> {
        Self::requested((0..calls.len()).map(|index| SharedCall {
            calls: calls.clone(),
            index,
        }))
    }

    fn requested(calls: impl Iterator<Item = SharedCall>) -> Result<Self, BatchError> {
        let batch = ToolBatch {
            calls: calls
                .map(|call| BatchCall {
                    call,
                    state: ToolCallState::Requested,
                    result: None,
                    ticket: None,
                    attempts: 0,
                    asked_while_running: false,
                })
                .collect(),
        };
        batch.check()?;
        Ok(batch)
    }

    /// The calls, in the model's order.
    pub fn calls(&self) -> &[BatchCall] {
        &self.calls
    }

    /// The number of calls.
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    /// Whether the batch has no call.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The call with this id.
    pub fn get(&self, id: &ToolCallId) -> Option<&BatchCall> {
        self.calls.iter().find(|c| &c.call.id == id)
    }

    /// The state of the call with this id.
    pub fn state(&self, id: &ToolCallId) -> Option<ToolCallState> {
        self.get(id).map(|c| c.state)
    }

    /// Whether every call is terminal (has its closing result).
    pub fn is_closed(&self) -> bool {
        self.calls.iter().all(|c| c.state.is_terminal())
    }

    /// The calls not yet terminal, in order.
    pub fn open_calls(&self) -> impl Iterator<Item = &BatchCall> {
        self.calls.iter().filter(|c| !c.state.is_terminal())
    }

    /// Each terminal call's closing result, in call order.
    pub fn closing_results(&self) -> impl Iterator<Item = (&ToolCallId, &ToolResult)> {
        self.calls
            .iter()
            .filter_map(|c| c.result.as_deref().map(|r| (&c.call.id, r)))
    }

    /// Moves call `id` to `to`. A terminal `to` needs the closing `result`; a non-terminal one
    /// takes none; `Suspended` needs [`ToolBatch::suspend`].
    ///
    /// # Errors
    /// [`BatchError`]: unknown call, a move the table refuses, a missing or unexpected result,
    /// a missing ticket. Nothing changes on error.
    pub fn transition(
        &mut self,
        id: &ToolCallId,
        to: ToolCallState,
        result: Option<ToolResult>,
    ) -> Result<(), BatchError> {
        self.transition_shared(id, to, result.map(Arc::new))
    }

    /// [`ToolBatch::transition`] with a result shared with its other holders (the run's
    /// `ToolCallDone` event), so the batch does not copy it.
    ///
    /// # Errors
    /// As [`ToolBatch::transition`].
    pub fn transition_shared(
        &mut self,
        id: &ToolCallId,
        to: ToolCallState,
        result: Option<Arc<ToolResult>>,
    ) -> Result<(), BatchError> {
        self.apply(id, to, result, None)
    }

    /// Replaces the arguments of a call that has not run yet (`Requested`, or `Suspended` and
    /// resumed) with their canonical form (`Tool::normalize_arguments`): from then on the batch
    /// (and what a store keeps of it) holds the arguments the gates saw and the tool runs with.
    /// The call no longer shares the assistant message's arguments.
    ///
    /// # Errors
    /// [`BatchError::UnknownCall`], or [`BatchError::ArgumentsFixed`] when the call is in
    /// another state. Nothing changes on error.
    pub fn set_arguments(
        &mut self,
        id: &ToolCallId,
        arguments: Arc<Value>,
    ) -> Result<(), BatchError> {
        let entry = self.entry_mut(id)?;
        if !matches!(
            entry.state,
            ToolCallState::Requested | ToolCallState::Suspended
        ) {
            return Err(BatchError::ArgumentsFixed {
                call_id: id.clone(),
                state: entry.state,
            });
        }
        entry.call = SharedCall::own(ToolCall {
            arguments,
            ..ToolCall::clone(&entry.call)
        });
        Ok(())
    }

    /// `Requested`/`Suspended` → `Executing` after the final allow, or `Executing` →
    /// `Executing` for a re-run after a crash (same idempotency key).
    ///
    /// # Errors
    /// As [`ToolBatch::transition`].
    pub fn start(&mut self, id: &ToolCallId) -> Result<(), BatchError> {
        self.apply(id, ToolCallState::Executing, None, None)
    }

    /// Moves the call to `Suspended` with `ticket`.
    ///
    /// # Errors
    /// As [`ToolBatch::transition`].
    pub fn suspend(&mut self, id: &ToolCallId, ticket: SuspendTicket) -> Result<(), BatchError> {
        self.apply(id, ToolCallState::Suspended, None, Some(ticket))
    }

    /// `Executing` → `Succeeded` with the tool's result.
    ///
    /// # Errors
    /// As [`ToolBatch::transition`].
    pub fn succeed(&mut self, id: &ToolCallId, result: ToolResult) -> Result<(), BatchError> {
        self.apply(id, ToolCallState::Succeeded, Some(Arc::new(result)), None)
    }

    /// `Executing` → `Failed` with an error result.
    ///
    /// # Errors
    /// As [`ToolBatch::transition`].
    pub fn fail(&mut self, id: &ToolCallId, result: ToolResult) -> Result<(), BatchError> {
        self.apply(id, ToolCallState::Failed, Some(Arc::new(result)), None)
    }

    /// Closes an executing call with a [`ToolError`]'s state (`Cancelled` or `Failed`) and
    /// result.
    ///
    /// # Errors
    /// As [`ToolBatch::transition`].
    pub fn fail_with(&mut self, id: &ToolCallId, error: &ToolError) -> Result<(), BatchError> {
        self.apply(
            id,
            error.closing_state(),
            Some(Arc::new(error.to_result())),
            None,
        )
    }

    /// Records the winning gate decision: `Block` → `Blocked` (error result with the reason),
    /// `Suspend` → `Suspended` (with the ticket), `SetResult` → `ShortCircuited`.
    ///
    /// # Errors
    /// As [`ToolBatch::transition`].
    pub fn apply_gate(
        &mut self,
        id: &ToolCallId,
        decision: &ToolInterceptPayload,
    ) -> Result<(), BatchError> {
        match decision {
            ToolInterceptPayload::Block { reason } => self.apply(
                id,
                ToolCallState::Blocked,
                Some(Arc::new(ToolResult::error(reason.clone()))),
                None,
            ),
            ToolInterceptPayload::Suspend(ticket) => {
                self.apply(id, ToolCallState::Suspended, None, Some(ticket.clone()))
            }
            ToolInterceptPayload::SetResult(result) => self.apply(
                id,
                ToolCallState::ShortCircuited,
                Some(Arc::new(result.clone())),
                None,
            ),
        }
    }

    /// Moves the call to `Cancelled` with an error result naming `reason`.
    ///
    /// # Errors
    /// As [`ToolBatch::transition`].
    pub fn cancel(&mut self, id: &ToolCallId, reason: &str) -> Result<(), BatchError> {
        self.apply(
            id,
            ToolCallState::Cancelled,
            Some(Arc::new(ToolResult::error(format!("cancelled: {reason}")))),
            None,
        )
    }

    /// `Executing` → `OutcomeUnknown` with [`OUTCOME_UNKNOWN_MESSAGE`] (recovery's "close").
    ///
    /// # Errors
    /// As [`ToolBatch::transition`].
    pub fn close_outcome_unknown(&mut self, id: &ToolCallId) -> Result<(), BatchError> {
        self.apply(
            id,
            ToolCallState::OutcomeUnknown,
            Some(Arc::new(ToolResult::error(OUTCOME_UNKNOWN_MESSAGE))),
            None,
        )
    }

    /// Closes the batch: every call not yet terminal gets its one closing result, through
    /// allowed transitions only:
    ///
    /// - `Requested` and `Suspended` → `Cancelled`, result `"not executed: <reason>"` (the tool
    ///   never ran, or did not run again);
    /// - `Executing` → `OutcomeUnknown`, result [`OUTCOME_UNKNOWN_MESSAGE`] (the tool may have had
    ///   its effect; closing never guesses).
    ///
    /// Terminal calls keep their result. Returns the ids it closed, in call order. Closing a
    /// closed batch does nothing.
    pub fn close(&mut self, reason: &str) -> Vec<ToolCallId> {
        let mut closed = Vec::new();
        for c in &mut self.calls {
            let (state, message) = match c.state {
                ToolCallState::Requested | ToolCallState::Suspended => {
                    (ToolCallState::Cancelled, format!("not executed: {reason}"))
                }
                ToolCallState::Executing => (
                    ToolCallState::OutcomeUnknown,
                    OUTCOME_UNKNOWN_MESSAGE.to_owned(),
                ),
                _ => continue,
            };
            debug_assert!(is_allowed_transition(c.state, state));
            c.state = state;
            c.result = Some(Arc::new(ToolResult::error(message)));
            closed.push(c.call.id.clone());
        }
        closed
    }

    /// What recovery does with each call of a batch read back after a crash, in call order.
    ///
    /// `lookup` gives the effect class and declared policy of a call's tool (from the resolved
    /// agent's registered tools). A call whose tool is no longer known is treated as
    /// `SideEffecting` with the default policy: an `Executing` call of it is closed as outcome
    /// unknown, never re-run (a `Requested` one is still re-gated; the runtime then answers it
    /// as a call of an unknown tool).
    pub fn recovery_plan(
        &self,
        lookup: impl Fn(&ToolCall) -> Option<(EffectClass, ToolRecoveryPolicy)>,
    ) -> Vec<(ToolCallId, RecoveryAction)> {
        self.calls
            .iter()
            .map(|c| {
                let (effect, policy) = lookup(&c.call).unwrap_or((
                    EffectClass::SideEffecting,
                    ToolRecoveryPolicy::CloseOutcomeUnknown,
                ));
                (c.call.id.clone(), recovery_action(effect, policy, c.state))
            })
            .collect()
    }

    /// The entry of call `id`.
    fn entry_mut(&mut self, id: &ToolCallId) -> Result<&mut BatchCall, BatchError> {
        self.calls
            .iter_mut()
            .find(|c| &c.call.id == id)
            .ok_or_else(|| BatchError::UnknownCall {
                call_id: id.clone(),
            })
    }

    fn apply(
        &mut self,
        id: &ToolCallId,
        to: ToolCallState,
        result: Option<Arc<ToolResult>>,
        ticket: Option<SuspendTicket>,
    ) -> Result<(), BatchError> {
        let entry = self.entry_mut(id)?;
        if !is_allowed_transition(entry.state, to) {
            return Err(BatchError::InvalidTransition {
                call_id: id.clone(),
                from: entry.state,
                to,
            });
        }
        if to.is_terminal() && result.is_none() {
            return Err(BatchError::MissingResult {
                call_id: id.clone(),
                to,
            });
        }
        if !to.is_terminal() && result.is_some() {
            return Err(BatchError::UnexpectedResult {
                call_id: id.clone(),
                to,
            });
        }
        if to == ToolCallState::Suspended && ticket.is_none() {
            return Err(BatchError::MissingTicket {
                call_id: id.clone(),
            });
        }
        if to == ToolCallState::Executing {
            entry.attempts = entry.attempts.saturating_add(1);
        }
        if ticket.is_some() {
            entry.ticket = ticket;
        }
        if to == ToolCallState::Suspended {
            entry.asked_while_running = entry.state == ToolCallState::Executing;
        }
        entry.state = to;
        entry.result = result;
        Ok(())
    }

    fn check(&self) -> Result<(), BatchError> {
        for (i, c) in self.calls.iter().enumerate() {
            if self.calls[..i].iter().any(|p| p.call.id == c.call.id) {
                return Err(BatchError::DuplicateCall {
                    call_id: c.call.id.clone(),
                });
            }
            let problem = match (c.state.is_terminal(), c.result.is_some()) {
                (true, false) => Some("a terminal call has no closing result"),
                (false, true) => Some("an open call has a closing result"),
                _ if c.state == ToolCallState::Suspended && c.ticket.is_none() => {
                    Some("a suspended call has no ticket")
                }
                _ => None,
            };
            if let Some(problem) = problem {
                return Err(BatchError::Inconsistent {
                    call_id: c.call.id.clone(),
                    state: c.state,
                    problem,
                });
            }
        }
        Ok(())
    }
}
