//! Tool-gate decisions as data and the priority that resolves them (Block > Suspend >
//! SetResult; ties go to the first in plugin order and are reported as conflicts), the typed
//! policy's decision, and the deterministic suspension id. The hooks that make the decisions
//! take a phase context and live in `awaken-plugin`.

use awaken_event::{ResumeMode, SuspendTicket, ToolCall, ToolCallId, ToolCallState, ToolResult};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::digest::{DIGEST_PREFIX, argument_digest};

/// A gate's decision on one tool call. No decision (`None`) lets the call run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolInterceptPayload {
    /// The call fails with this reason, which the model sees; the run goes on. Priority 3.
    Block {
        /// Why, for the model.
        reason: String,
    },
    /// The call waits for an external decision. Priority 2.
    Suspend(SuspendTicket),
    /// The call is closed with this result; the tool does not run. Priority 1.
    SetResult(ToolResult),
}

/// The three kinds of gate decision, for reports and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InterceptKind {
    /// [`ToolInterceptPayload::SetResult`].
    SetResult,
    /// [`ToolInterceptPayload::Suspend`].
    Suspend,
    /// [`ToolInterceptPayload::Block`].
    Block,
}

impl InterceptKind {
    /// The priority: Block 3, Suspend 2, SetResult 1 (higher wins).
    pub fn priority(self) -> u8 {
        match self {
            InterceptKind::Block => 3,
            InterceptKind::Suspend => 2,
            InterceptKind::SetResult => 1,
        }
    }
}

impl ToolInterceptPayload {
    /// A `Block` decision.
    pub fn block(reason: impl Into<String>) -> Self {
        ToolInterceptPayload::Block {
            reason: reason.into(),
        }
    }

    /// Which kind of decision this is.
    pub fn kind(&self) -> InterceptKind {
        match self {
            ToolInterceptPayload::Block { .. } => InterceptKind::Block,
            ToolInterceptPayload::Suspend(_) => InterceptKind::Suspend,
            ToolInterceptPayload::SetResult(_) => InterceptKind::SetResult,
        }
    }

    /// The priority of this decision (see [`InterceptKind::priority`]).
    pub fn priority(&self) -> u8 {
        self.kind().priority()
    }

    /// The batch state the call moves to when this decision wins: `Blocked`, `Suspended` or
    /// `ShortCircuited`.
    pub fn target_state(&self) -> ToolCallState {
        match self {
            ToolInterceptPayload::Block { .. } => ToolCallState::Blocked,
            ToolInterceptPayload::Suspend(_) => ToolCallState::Suspended,
            ToolInterceptPayload::SetResult(_) => ToolCallState::ShortCircuited,
        }
    }
}

/// What a typed tool policy decides about one call (a policy hook's answer; `awaken-plugin`'s
/// `PolicyGate` turns it into a gate decision). Exhaustive, so that gate maps every decision
/// and a new one does not compile until it does.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyDecision {
    /// Let the call run (no gate decision).
    Allow,
    /// Block the call with a reason the model sees.
    Block {
        /// Why.
        reason: String,
    },
    /// Ask a human; the call is suspended with a ticket built from the call, unless the
    /// context already carries an approval of these exact arguments.
    Ask {
        /// The question for the human.
        message: String,
        /// JSON Schema of the expected answer payload, if any.
        response_schema: Option<Value>,
        /// What an approval does.
        resume_mode: ResumeMode,
    },
    /// Close the call with this result without running the tool.
    Respond(ToolResult),
}

impl PolicyDecision {
    /// An `Ask` with no response schema, replaying the call on approval.
    pub fn ask(message: impl Into<String>) -> Self {
        PolicyDecision::Ask {
            message: message.into(),
            response_schema: None,
            resume_mode: ResumeMode::Replay,
        }
    }
}

/// A deterministic suspension id (gates are pure, so they cannot draw a random one):
/// `<call id>:<attempt>:<first 16 hex digits of the argument digest>`.
pub fn suspension_id(call_id: &ToolCallId, argument_digest: &str, attempt: u32) -> String {
    let hex = argument_digest
        .strip_prefix(DIGEST_PREFIX)
        .unwrap_or(argument_digest);
    let short = hex.get(..16).unwrap_or(hex);
    format!("{call_id}:{attempt}:{short}")
}

/// One gate's decision, with the plugin it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct GateDecision {
    /// The plugin (or other source) whose gate decided.
    pub source: String,
    /// The decision.
    pub payload: ToolInterceptPayload,
}

impl GateDecision {
    /// A decision from `source`.
    pub fn new(source: impl Into<String>, payload: ToolInterceptPayload) -> Self {
        Self {
            source: source.into(),
            payload,
        }
    }
}

/// Two gates gave decisions of the same, winning, priority: the first (in plugin order) won.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateConflict {
    /// The kind both decided.
    pub kind: InterceptKind,
    /// The source whose decision won.
    pub winner: String,
    /// A later source whose decision of the same kind was dropped.
    pub loser: String,
}

/// The outcome of resolving a call's gate decisions.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GateResolution {
    /// The winning decision; `None` lets the call run.
    pub decision: Option<GateDecision>,
    /// Every decision that tied with the winner's priority and lost to an earlier one.
    pub conflicts: Vec<GateConflict>,
}

impl GateResolution {
    /// Whether no gate decided (the call may run).
    pub fn is_allowed(&self) -> bool {
        self.decision.is_none()
    }

    /// The winning payload.
    pub fn payload(&self) -> Option<&ToolInterceptPayload> {
        self.decision.as_ref().map(|d| &d.payload)
    }
}

/// Resolves the decisions of several gates on one call, given in plugin order: the highest
/// priority wins (Block > Suspend > SetResult); among decisions of that priority the first
/// wins and each later one is reported as a [`GateConflict`] and logged at error level.
/// Decisions of lower priority than the winner are not conflicts (they are simply outranked).
pub fn resolve_gate_decisions(decisions: impl IntoIterator<Item = GateDecision>) -> GateResolution {
    let decisions: Vec<GateDecision> = decisions.into_iter().collect();
    let Some(top) = decisions.iter().map(|d| d.payload.priority()).max() else {
        return GateResolution::default();
    };
    let mut winner: Option<GateDecision> = None;
    let mut conflicts = Vec::new();
    for d in decisions {
        if d.payload.priority() != top {
            continue;
        }
        match &winner {
            None => winner = Some(d),
            Some(w) => {
                let conflict = GateConflict {
                    kind: d.payload.kind(),
                    winner: w.source.clone(),
                    loser: d.source,
                };
                tracing::error!(
                    kind = ?conflict.kind,
                    winner = %conflict.winner,
                    loser = %conflict.loser,
                    "conflicting tool-gate decisions of equal priority; the first in plugin order wins"
                );
                conflicts.push(conflict);
            }
        }
    }
    GateResolution {
        decision: winner,
        conflicts,
    }
}

/// The digest a resume decision must carry to apply to `call` (re-exported for gates that
/// compare it themselves).
pub fn call_digest(call: &ToolCall) -> String {
    argument_digest(&call.arguments)
}
