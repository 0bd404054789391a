//! What happens to an unfinished call after a crash: recovery never guesses whether a call's
//! effect happened.

use awaken_event::{EffectClass, ToolCallState};
use serde::{Deserialize, Serialize};

/// What a tool declares should happen to a call of it that was `Executing` when the process
/// stopped (the effect may or may not have happened).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolRecoveryPolicy {
    /// Run the call again with the same idempotency key. Allowed only for `ReadOnly` and
    /// `Idempotent` tools (the default for them); rejected at registration for `SideEffecting`.
    Rerun,
    /// Close the call with an "outcome unknown" result the model sees. The default for
    /// `SideEffecting` tools.
    CloseOutcomeUnknown,
    /// Suspend the call and let a human decide.
    SuspendForHuman,
}

impl ToolRecoveryPolicy {
    /// The default policy of a tool of this effect class: `Rerun` for `ReadOnly` and
    /// `Idempotent`, `CloseOutcomeUnknown` for `SideEffecting`.
    pub fn default_for(effect: EffectClass) -> Self {
        match effect {
            EffectClass::ReadOnly | EffectClass::Idempotent => ToolRecoveryPolicy::Rerun,
            EffectClass::SideEffecting => ToolRecoveryPolicy::CloseOutcomeUnknown,
        }
    }

    /// Whether a tool of this effect class may declare this policy (only `Rerun` for
    /// `SideEffecting` is refused).
    pub fn is_allowed_for(self, effect: EffectClass) -> bool {
        !(self == ToolRecoveryPolicy::Rerun && effect == EffectClass::SideEffecting)
    }

    /// Every policy, in declaration order.
    pub const ALL: [ToolRecoveryPolicy; 3] = [
        ToolRecoveryPolicy::Rerun,
        ToolRecoveryPolicy::CloseOutcomeUnknown,
        ToolRecoveryPolicy::SuspendForHuman,
    ];
}

/// What the runtime does with one call of a recovered batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RecoveryAction {
    /// Run the gates again (`Requested` stays `Requested`): the call never started, and only a
    /// human decision is ever persisted as an approval.
    Regate,
    /// `Executing` → `Executing`: run the tool again with the same idempotency key.
    Rerun,
    /// `Executing` → `OutcomeUnknown`, with an "outcome unknown" result the model sees.
    CloseOutcomeUnknown,
    /// `Executing` → `Suspended`: a human decides whether to run it again.
    SuspendForHuman,
    /// `Suspended` stays `Suspended`: the persisted ticket still waits for its decision.
    AwaitDecision,
    /// Terminal: the call already has its closing result; nothing to do.
    AlreadyClosed,
}

impl RecoveryAction {
    /// The state the call moves to, when the action moves it (`Rerun` re-enters `Executing`).
    pub fn target_state(self) -> Option<ToolCallState> {
        match self {
            RecoveryAction::Rerun => Some(ToolCallState::Executing),
            RecoveryAction::CloseOutcomeUnknown => Some(ToolCallState::OutcomeUnknown),
            RecoveryAction::SuspendForHuman => Some(ToolCallState::Suspended),
            RecoveryAction::Regate
            | RecoveryAction::AwaitDecision
            | RecoveryAction::AlreadyClosed => None,
        }
    }
}

/// The recovery of one call, as a pure function of the tool's effect class, its declared
/// policy and the call's last durable state.
///
/// - `Requested` → [`RecoveryAction::Regate`], whatever the tool.
/// - `Executing` → the declared policy, except that a `SideEffecting` tool is never re-run: a
///   `Rerun` policy on it (which registration rejects, but a stored batch may name a tool whose
///   declaration changed) becomes [`RecoveryAction::CloseOutcomeUnknown`].
/// - `Suspended` → [`RecoveryAction::AwaitDecision`].
/// - terminal states → [`RecoveryAction::AlreadyClosed`].
pub fn recovery_action(
    effect: EffectClass,
    declared: ToolRecoveryPolicy,
    last: ToolCallState,
) -> RecoveryAction {
    match last {
        ToolCallState::Requested => RecoveryAction::Regate,
        ToolCallState::Executing => match declared {
            ToolRecoveryPolicy::Rerun if effect == EffectClass::SideEffecting => {
                RecoveryAction::CloseOutcomeUnknown
            }
            ToolRecoveryPolicy::Rerun => RecoveryAction::Rerun,
            ToolRecoveryPolicy::CloseOutcomeUnknown => RecoveryAction::CloseOutcomeUnknown,
            ToolRecoveryPolicy::SuspendForHuman => RecoveryAction::SuspendForHuman,
        },
        ToolCallState::Suspended => RecoveryAction::AwaitDecision,
        ToolCallState::Succeeded
        | ToolCallState::Failed
        | ToolCallState::Blocked
        | ToolCallState::ShortCircuited
        | ToolCallState::Cancelled
        | ToolCallState::OutcomeUnknown => RecoveryAction::AlreadyClosed,
    }
}
