//! Tool-gate hooks, typed tool-policy hooks, and the priority that resolves their decisions
//! (Block > Suspend > SetResult; ties go to the first in plugin order and are reported as
//! conflicts).

use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{
    ResumeDecision, ResumeMode, SuspendTicket, ToolCall, ToolCallId, ToolCallState, ToolResult,
};
use awaken_phase::{HookError, PhaseContext};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::digest::{DIGEST_PREFIX, argument_digest, pending_call};

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

/// A plugin's gate on tool calls, run in the `ToolGate` phase for each call.
///
/// Called with the phase context whose `tool` holds the call and, when the call was suspended
/// and resumed, the human's decision (so a gate can let an approved call through instead of
/// asking again). Gates are pure: no IO, no state changes (they return a decision, not a
/// command); they may be evaluated several times for one call, in the same step after earlier
/// calls commit, and again after a resume or a recovery. An `Err` fails the gate evaluation
/// (see [`evaluate_gates`]).
#[async_trait]
pub trait ToolGateHook: Send + Sync + 'static {
    /// This gate's decision on `ctx.tool`'s call, or `None` to let it run.
    async fn decide(&self, ctx: &PhaseContext) -> Result<Option<ToolInterceptPayload>, HookError>;
}

/// A gate hook made from a synchronous closure.
pub struct FnGate<F>(pub F);

#[async_trait]
impl<F> ToolGateHook for FnGate<F>
where
    F: Fn(&PhaseContext) -> Result<Option<ToolInterceptPayload>, HookError> + Send + Sync + 'static,
{
    async fn decide(&self, ctx: &PhaseContext) -> Result<Option<ToolInterceptPayload>, HookError> {
        (self.0)(ctx)
    }
}

/// What a typed tool policy decides about one call.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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

/// A typed policy on the calls of some tools, adapted into a gate hook by [`PolicyGate`]
/// (registered with a plugin registrar's `register_tool_policy_hook`, run inside `ToolGate`).
/// The arguments arrive already deserialized into [`ToolPolicyHook::Args`].
///
/// Pure, like every gate: it may run several times for one call.
pub trait ToolPolicyHook: Send + Sync + 'static {
    /// The arguments of the tools this policy covers.
    type Args: DeserializeOwned;

    /// Whether the policy looks at calls of the tool the model calls `tool_name`.
    fn applies_to(&self, tool_name: &str) -> bool;

    /// The decision on `call` (whose arguments are `args`).
    ///
    /// # Errors
    /// A failure of the policy itself; it fails the gate evaluation.
    fn decide(
        &self,
        call: &ToolCall,
        args: Self::Args,
        ctx: &PhaseContext,
    ) -> Result<PolicyDecision, HookError>;
}

/// The gate hook made from a [`ToolPolicyHook`].
///
/// - calls of tools the policy does not cover, and `Allow`: no decision;
/// - arguments that do not deserialize into `Args`: `Block` naming the error (a policy never
///   fails open);
/// - `Ask` when the context carries an `Approve` whose digest matches the call's arguments: no
///   decision (the human already said yes to exactly this); a `Deny`: `Block`; otherwise (no
///   decision yet, or one for other arguments): `Suspend` with a ticket from
///   [`suspension_id`] (attempt 0 without a prior decision, 1 with one).
#[derive(Debug, Clone, Default)]
pub struct PolicyGate<P>(pub P);

#[async_trait]
impl<P: ToolPolicyHook> ToolGateHook for PolicyGate<P> {
    async fn decide(&self, ctx: &PhaseContext) -> Result<Option<ToolInterceptPayload>, HookError> {
        let Some(info) = ctx.tool.as_deref() else {
            return Ok(None);
        };
        let call = &info.call;
        if !self.0.applies_to(&call.name) {
            return Ok(None);
        }
        let args = match <P::Args as serde::Deserialize>::deserialize(&*call.arguments) {
            Ok(args) => args,
            Err(e) => {
                return Ok(Some(ToolInterceptPayload::block(format!(
                    "the arguments of `{}` do not match what its policy expects: {e}",
                    call.name
                ))));
            }
        };
        Ok(match self.0.decide(call, args, ctx)? {
            PolicyDecision::Allow => None,
            PolicyDecision::Block { reason } => Some(ToolInterceptPayload::Block { reason }),
            PolicyDecision::Respond(result) => Some(ToolInterceptPayload::SetResult(result)),
            PolicyDecision::Ask {
                message,
                response_schema,
                resume_mode,
            } => {
                let pending = pending_call(call);
                let resume = info.resume.as_ref().filter(|r| r.call_id == call.id);
                match resume {
                    Some(r) if r.argument_digest == pending.argument_digest => match r.decision {
                        ResumeDecision::Approve => None,
                        ResumeDecision::Deny => Some(ToolInterceptPayload::block(format!(
                            "`{}` was denied",
                            call.name
                        ))),
                    },
                    _ => {
                        let attempt = u32::from(resume.is_some());
                        Some(ToolInterceptPayload::Suspend(SuspendTicket {
                            suspension_id: suspension_id(
                                &call.id,
                                &pending.argument_digest,
                                attempt,
                            ),
                            call: pending,
                            message,
                            response_schema,
                            resume_mode,
                        }))
                    }
                }
            }
        })
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

/// Why the gates of a call could not be evaluated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GateError {
    /// The context carries no tool call (`PhaseContext::tool` is `None`).
    #[error("tool-gate evaluation needs a tool call in the phase context")]
    NoToolCall,
    /// A gate hook failed.
    #[error("tool gate of `{source_id}` failed on call `{call_id}`: {error}")]
    Hook {
        /// The plugin (or other source) whose gate failed.
        source_id: String,
        /// The call.
        call_id: ToolCallId,
        /// The hook's error.
        #[source]
        error: HookError,
    },
}

/// Runs every gate in `hooks` (in the order given: plugin order) on `ctx`'s call, one after
/// another, and resolves their decisions with [`resolve_gate_decisions`]. Every gate runs, even
/// after a `Block`, so conflicts are seen.
///
/// # Errors
/// [`GateError::NoToolCall`], or the first [`GateError::Hook`] (the call's gates are then
/// undecided; the runtime fails the call or the run, as it chooses).
pub async fn evaluate_gates(
    hooks: &[(String, Arc<dyn ToolGateHook>)],
    ctx: &PhaseContext,
) -> Result<GateResolution, GateError> {
    let call_id = match ctx.tool.as_deref() {
        Some(info) => info.call.id.clone(),
        None => return Err(GateError::NoToolCall),
    };
    let mut decisions = Vec::new();
    for (source, hook) in hooks {
        match hook.decide(ctx).await {
            Ok(Some(payload)) => decisions.push(GateDecision::new(source.clone(), payload)),
            Ok(None) => {}
            Err(error) => {
                return Err(GateError::Hook {
                    source_id: source.clone(),
                    call_id,
                    error,
                });
            }
        }
    }
    let span = tracing::error_span!("tool_gate", call_id = %call_id);
    let _entered = span.enter();
    Ok(resolve_gate_decisions(decisions))
}

/// The digest a resume decision must carry to apply to `call` (re-exported for gates that
/// compare it themselves).
pub fn call_digest(call: &ToolCall) -> String {
    argument_digest(&call.arguments)
}
