//! Tool-gate hooks: the contract of a plugin's gate on tool calls ([`ToolGateHook`]), the typed
//! policy hook adapted into one ([`ToolPolicyHook`], [`PolicyGate`]), and the runner that asks
//! a call's gates in plugin order and resolves their decisions ([`evaluate_gates`]). The
//! decisions and their priority are `awaken-tool`'s data.

use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{ResumeDecision, SuspendTicket, ToolCall, ToolCallId};
use awaken_phase::{HookError, PhaseContext};
use awaken_tool::{
    GateDecision, GateResolution, PolicyDecision, ToolInterceptPayload, pending_call,
    resolve_gate_decisions, suspension_id,
};
use serde::de::DeserializeOwned;

use crate::isolate::catch_panic_async;

/// A plugin's gate on tool calls, run in the `ToolGate` phase for each call (registered with
/// [`PluginRegistrar::register_tool_gate_hook`](crate::PluginRegistrar::register_tool_gate_hook)).
///
/// Called with the phase context whose `tool` holds the call and, when the call was suspended
/// and resumed, the human's decision (so a gate can let an approved call through instead of
/// asking again). Gates are pure: no IO, no state changes (they return a decision, not a
/// command); they may be evaluated several times for one call, in the same step after earlier
/// calls commit, and again after a resume or a recovery. An `Err` or a panic fails the gate
/// evaluation (see [`evaluate_gates`]).
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

/// A typed policy on the calls of some tools, adapted into a gate hook by [`PolicyGate`]
/// (registered with
/// [`PluginRegistrar::register_tool_policy_hook`](crate::PluginRegistrar::register_tool_policy_hook),
/// run inside `ToolGate`). The arguments arrive already deserialized into
/// [`ToolPolicyHook::Args`].
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
                    // The answer to a question asked while the call ran (its tool's): the
                    // policy let the call run before it waited.
                    Some(_) if info.asked_while_running => None,
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
    /// A gate hook panicked; the panic was caught and counts as the gate's failure.
    #[error("tool gate of `{source_id}` panicked on call `{call_id}`: {message}")]
    Panicked {
        /// The plugin (or other source) whose gate panicked.
        source_id: String,
        /// The call.
        call_id: ToolCallId,
        /// The panic message.
        message: String,
    },
}

/// Runs every gate in `hooks` (in the order given: plugin order) on `ctx`'s call, one after
/// another, and resolves their decisions with [`resolve_gate_decisions`]. Every gate runs, even
/// after a `Block`, so conflicts are seen.
///
/// # Errors
/// [`GateError::NoToolCall`], or the first [`GateError::Hook`] or [`GateError::Panicked`] (a
/// panic, in making the gate's future or in any of its polls, is caught; the call's gates are
/// then undecided, and the runtime fails the call or the run, as it chooses).
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
        match catch_panic_async(async { hook.decide(ctx).await }).await {
            Ok(Ok(Some(payload))) => decisions.push(GateDecision::new(source.clone(), payload)),
            Ok(Ok(None)) => {}
            Ok(Err(error)) => {
                return Err(GateError::Hook {
                    source_id: source.clone(),
                    call_id,
                    error,
                });
            }
            Err(message) => {
                return Err(GateError::Panicked {
                    source_id: source.clone(),
                    call_id,
                    message,
                });
            }
        }
    }
    let span = tracing::info_span!("tool_gate", call_id = %call_id);
    let _entered = span.enter();
    Ok(resolve_gate_decisions(decisions))
}
