//! A step's tool calls, one after another: each checked, gated and passed through
//! `BeforeToolExecute`, committed `Executing`, run, passed through `AfterToolExecute`, and
//! closed (its result committed) or suspended. Every call the model made gets exactly one
//! closing result.

use std::sync::Arc;

use awaken_event::{
    AgentEvent, Message, SuspendTicket, ToolCall, ToolCallId, ToolCallResume, ToolCallState,
    ToolResult, WarningKind,
};
use awaken_phase::{Phase, ToolPhaseInfo};
use awaken_plugin::{LifecycleEvent, evaluate_gates};
use awaken_resolver::ResolvedTool;
use awaken_tool::{
    BatchCall, GateResolution, OUTCOME_UNKNOWN_MESSAGE, ToolError, ToolInterceptPayload,
};

use crate::builtins::StatsUpdate;
use crate::builtins::read_key;
use crate::delegate::child::delegate_call;
use crate::durable::BatchChange;
use crate::failpoint;
use crate::run::invoke::Ran;
use crate::run::{Failure, Run};

/// How one tool call came out.
pub(super) enum CallOutcome {
    Closed(ToolResult, ToolCallState),
    Suspended(Box<SuspendTicket>),
}

/// What preparing a call decided.
pub(super) enum Prepared {
    /// Closed or suspended without running the tool.
    Done(CallOutcome),
    /// Allowed: the tool to run, by its place in the resolved tools (borrowed there, not
    /// copied: the resolver's tools are shared by every run, and copying one changes counts the
    /// other worker threads change too), and the call with its arguments in the tool's
    /// canonical form when they were not (boxed: most tools have one form).
    Run(usize, Option<Box<ToolCall>>),
}

impl Run<'_> {
    /// Closes a call, its result committed at once (see `close_call`).
    pub(super) async fn close(
        &mut self,
        call: &ToolCall,
        result: ToolResult,
        state: ToolCallState,
    ) -> Result<(), Failure> {
        self.close_call(call, result, state, false).await
    }

    /// Closes a call: its result in the batch, its message, its event and statistics,
    /// committed. With `fold` (the step's last call) the result is committed with the step's
    /// end instead (the one place a result's commit is folded into the next), unless it is a
    /// delegate's answer, whose return hooks frame a commit of its own.
    async fn close_call(
        &mut self,
        call: &ToolCall,
        result: ToolResult,
        state: ToolCallState,
        fold: bool,
    ) -> Result<(), Failure> {
        let failed = !matches!(
            state,
            ToolCallState::Succeeded | ToolCallState::ShortCircuited
        );
        // One result, shared by the batch and the event (which commits copy).
        let result = Arc::new(result);
        if let Some(batch) = self.batch.as_mut() {
            let open = matches!(
                batch.state(&call.id),
                Some(
                    ToolCallState::Requested | ToolCallState::Executing | ToolCallState::Suspended
                )
            );
            if open {
                batch
                    .transition_shared(&call.id, state, Some(result.clone()))
                    .map_err(|e| Failure::Error(e.to_string()))?;
            }
        }
        self.push_message(Message::tool(call.id.clone(), &result));
        self.closed(&call.id);
        self.fact(AgentEvent::ToolCallDone {
            call_id: call.id.clone(),
            result,
            state,
        });
        let resolved_tool = self.tool_named(&call.name);
        let tool = resolved_tool.map_or_else(
            || Arc::from(call.name.as_str()),
            |t| t.tool.shared_id().clone(),
        );
        // A delegate's answer returning into this run: the return hooks frame its commit.
        let returning = match (resolved_tool, failed) {
            (Some(t), false) => delegate_call(&self.identity, t, call),
            _ => None,
        };
        self.count(StatsUpdate::ToolClosed { tool, failed })?;
        if fold && returning.is_none() {
            self.folded_result = Some(call.id.clone());
            return Ok(());
        }
        if let Some(d) = &returning {
            self.lifecycle
                .dispatch(
                    self.resolved.env.plugins(),
                    LifecycleEvent::DelegateReturnStart(d),
                )
                .await;
        }
        // The result is durable before anything relies on it.
        let committed = self.checkpoint(BatchChange::Write).await;
        if let Some(d) = &returning {
            let event = match &committed {
                Ok(()) => LifecycleEvent::DelegateReturnComplete(d),
                Err(e) => LifecycleEvent::DelegateReturnError(d, e.message_ref()),
            };
            self.lifecycle
                .dispatch(self.resolved.env.plugins(), event)
                .await;
        }
        committed?;
        failpoint::hit("after_result", Some(call.id.as_str()));
        Ok(())
    }

    /// The calls of a step one after another: each gated after the earlier ones committed.
    /// Returns whether a call was suspended.
    pub(super) async fn run_calls_sequentially(
        &mut self,
        calls: &[ToolCall],
    ) -> Result<bool, Failure> {
        let mut suspended = false;
        for (i, call) in calls.iter().enumerate() {
            self.begin_call(calls, i).await?;
            let outcome = match self.execute_call(call, None).await {
                Ok(o) => o,
                Err(failure) => {
                    // Every call the model made still gets exactly one closing result.
                    self.close_all(&calls[i..], failure.call_reason()).await?;
                    return Err(failure);
                }
            };
            suspended |= self.settle(call, outcome, i + 1 == calls.len()).await?;
        }
        Ok(suspended)
    }

    /// Before call `i` is looked at: a cancelled run closes it and the rest; otherwise the
    /// call is announced ready.
    pub(super) async fn begin_call(&mut self, calls: &[ToolCall], i: usize) -> Result<(), Failure> {
        self.stop_if_cancelled(&calls[i..]).await?;
        self.announce_ready(&calls[i]);
        Ok(())
    }

    /// A cancelled run closes `rest` (the calls not looked at yet) and stops.
    pub(super) async fn stop_if_cancelled(&mut self, rest: &[ToolCall]) -> Result<(), Failure> {
        if self.cancel.is_cancelled() {
            self.close_all(rest, "not executed: the run was cancelled")
                .await?;
            return Err(Failure::Cancelled);
        }
        Ok(())
    }

    /// The resolved tool models call `name`, if any.
    pub(super) fn tool_named(&self, name: &str) -> Option<&ResolvedTool> {
        self.tool_at(name).map(|at| &self.resolved.tools[at])
    }

    /// Where the resolved tool models call `name` is, if there is one.
    fn tool_at(&self, name: &str) -> Option<usize> {
        self.resolved
            .tools
            .iter()
            .position(|t| t.tool.descriptor().name == name)
    }

    /// `name` as a shared string for an event: the resolved tool's (no allocation per call),
    /// else a new one.
    pub(super) fn shared_tool_name(&self, name: &str) -> Arc<str> {
        self.tool_named(name)
            .map_or_else(|| Arc::from(name), |t| t.tool.shared_name().clone())
    }

    /// Emits `ToolCallReady` for the call, before it is looked at.
    pub(super) fn announce_ready(&mut self, call: &ToolCall) {
        self.note(AgentEvent::ToolCallReady {
            call_id: call.id.clone(),
            name: self.shared_tool_name(&call.name),
            arguments: call.arguments.clone(),
        });
    }

    /// Closes every call in `calls` that is still open with `reason` (cancelled).
    pub(super) async fn close_all(
        &mut self,
        calls: &[ToolCall],
        reason: &str,
    ) -> Result<(), Failure> {
        for call in calls {
            let state = self.batch.as_ref().map(|b| b.state(&call.id));
            match state {
                // It may have run: closing never guesses.
                Some(Some(ToolCallState::Executing)) => {
                    self.close(
                        call,
                        ToolResult::error(OUTCOME_UNKNOWN_MESSAGE),
                        ToolCallState::OutcomeUnknown,
                    )
                    .await?;
                }
                None | Some(Some(ToolCallState::Requested | ToolCallState::Suspended)) => {
                    self.close(call, ToolResult::error(reason), ToolCallState::Cancelled)
                        .await?;
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Records how a call came out: closed (result committed) or suspended (parked,
    /// committed). Returns whether it was suspended.
    /// `last`: the step's last call, whose result commit may be folded into the step's end.
    pub(super) async fn settle(
        &mut self,
        call: &ToolCall,
        outcome: CallOutcome,
        last: bool,
    ) -> Result<bool, Failure> {
        match outcome {
            CallOutcome::Closed(result, state) => {
                self.close_call(call, result, state, last).await?;
                Ok(false)
            }
            CallOutcome::Suspended(ticket) => {
                if let Some(batch) = self.batch.as_mut() {
                    batch
                        .suspend(&call.id, (*ticket).clone())
                        .map_err(|e| Failure::Error(e.to_string()))?;
                }
                self.closed(&call.id);
                self.fact(AgentEvent::ToolCallSuspended {
                    call_id: call.id.clone(),
                    ticket,
                });
                self.checkpoint(BatchChange::Write).await?;
                Ok(true)
            }
        }
    }

    /// One call from its gates to its `AfterToolExecute`; `resume` is a human's decision on
    /// it (gates, hooks and the tool see it).
    /// (`resume` is boxed: the future of every call holds it, and most calls have none.)
    pub(super) async fn execute_call(
        &mut self,
        call: &ToolCall,
        resume: Option<Box<ToolCallResume>>,
    ) -> Result<CallOutcome, Failure> {
        let (at, normalized) = match self.prepare_call(call, resume.clone()).await? {
            Prepared::Done(outcome) => return Ok(outcome),
            Prepared::Run(at, normalized) => (at, normalized),
        };
        // The tool and `AfterToolExecute` see the arguments the gates saw.
        let call = normalized.as_deref().unwrap_or(call);
        self.mark_executing(&[call]).await?;
        // Boxed: a call's invocation (its context, timer, span and the tool's future) would
        // otherwise take the largest room in every run's future for the run's whole life,
        // while a run is in a tool call only for moments (an allocation per call instead).
        let ran = Box::pin(self.invocation().run(
            &self.resolved.tools[at],
            call,
            resume.as_deref(),
            &self.engine,
            true,
        ))
        .await;
        self.after_tool(call, ran, resume).await
    }

    /// Everything before a call may run: the runtime's own checks, the arguments put in the
    /// tool's canonical form (recorded in the batch), the gates, and `BeforeToolExecute` with
    /// any decision an action there took.
    pub(super) async fn prepare_call(
        &mut self,
        call: &ToolCall,
        resume: Option<Box<ToolCallResume>>,
    ) -> Result<Prepared, Failure> {
        let Some(at) = self.tool_at(&call.name) else {
            return Ok(Prepared::Done(CallOutcome::Closed(
                ToolResult::error(format!(
                    "unknown tool `{}`: it is not available to this agent",
                    call.name
                )),
                ToolCallState::Blocked,
            )));
        };
        if let Some(raw) = &call.invalid_arguments {
            return Ok(Prepared::Done(CallOutcome::Closed(
                ToolResult::error(format!(
                    "the arguments of `{}` are not valid JSON: {raw}",
                    call.name
                )),
                ToolCallState::Blocked,
            )));
        }
        // Arguments that break the schema never reach a gate or the tool.
        if let Err(e) = self.resolved.tools[at].tool.check_call(call) {
            return Ok(Prepared::Done(CallOutcome::Closed(
                e.to_result(),
                ToolCallState::Blocked,
            )));
        }
        // Normalised once, here: the gates, the ticket, the hooks and the tool see one form,
        // and the batch keeps it.
        let normalized = match normalized_arguments(&self.resolved.tools[at], call) {
            Ok(None) => None,
            Ok(Some(arguments)) => {
                if let Some(batch) = self.batch.as_mut() {
                    batch
                        .set_arguments(&call.id, arguments.clone())
                        .map_err(|e| Failure::Error(e.to_string()))?;
                }
                Some(Box::new(ToolCall {
                    arguments,
                    ..call.clone()
                }))
            }
            Err(e) => {
                return Ok(Prepared::Done(CallOutcome::Closed(
                    e.to_result(),
                    ToolCallState::Blocked,
                )));
            }
        };
        let call = normalized.as_deref().unwrap_or(call);
        // Gates are pure, so whether `BeforeToolExecute` has anything to run is known now.
        let hooks_idle = self.engine.is_idle(Phase::BeforeToolExecute);
        // One call description, shared by the gates' and the hooks' contexts (made only if
        // one of them runs).
        let info = (!self.gates.is_empty() || !hooks_idle).then(|| {
            Arc::new(ToolPhaseInfo {
                call: call.clone(),
                result: None,
                asked_while_running: self.asked_while_running(&call.id, resume.is_some()),
                resume: resume.map(|r| *r),
            })
        });
        let resolution = if self.gates.is_empty() {
            GateResolution::default()
        } else {
            let mut gate_ctx = self.ctx(Phase::ToolGate);
            gate_ctx.tool = info.clone();
            evaluate_gates(&self.gates, &gate_ctx)
                .await
                .map_err(|e| Failure::Error(e.to_string()))?
        };
        for conflict in &resolution.conflicts {
            self.note(AgentEvent::Warning {
                kind: WarningKind::GateConflict,
                detail: format!(
                    "gate `{}` overruled `{}` on call {}",
                    conflict.winner, conflict.loser, call.id
                ),
            });
        }
        if let Some(decision) = resolution.decision {
            return Ok(Prepared::Done(intercepted(decision.payload)));
        }
        if hooks_idle {
            self.check_cancelled()?;
        } else {
            let mut before = self.ctx(Phase::BeforeToolExecute);
            before.tool = info;
            self.phase_with(before).await?;
        }
        // An action of `BeforeToolExecute` may still decide on the call.
        let decided = self
            .engine
            .store()
            .read(|s| match read_key(s, self.intercept_at) {
                Ok(Some(d)) if d.call_id == call.id => Some(d.payload.clone()),
                _ => None,
            });
        if let Some(payload) = decided {
            return Ok(Prepared::Done(intercepted(payload)));
        }
        Ok(Prepared::Run(at, normalized))
    }

    /// Whether a resumed call's question was asked while it ran (see
    /// `ToolPhaseInfo::asked_while_running`).
    fn asked_while_running(&self, call_id: &ToolCallId, resumed: bool) -> bool {
        resumed
            && self
                .batch
                .as_ref()
                .and_then(|b| b.get(call_id))
                .is_some_and(BatchCall::asked_while_running)
    }

    /// Commits `calls` as `Executing`: durable before any of them can have an effect.
    pub(super) async fn mark_executing(&mut self, calls: &[&ToolCall]) -> Result<(), Failure> {
        if calls.is_empty() {
            return Ok(());
        }
        if let Some(batch) = self.batch.as_mut() {
            for call in calls {
                batch
                    .start(&call.id)
                    .map_err(|e| Failure::Error(e.to_string()))?;
            }
        }
        self.checkpoint(BatchChange::Write).await
    }

    /// `AfterToolExecute` for a call that ran (not for one the run's cancellation ended).
    pub(super) async fn after_tool(
        &mut self,
        call: &ToolCall,
        ran: Ran,
        resume: Option<Box<ToolCallResume>>,
    ) -> Result<CallOutcome, Failure> {
        let mut ran = ran;
        let (result, state) = loop {
            match ran {
                Ran::Finished(result, state) => break (result, state),
                // It waits for a decision; `AfterToolExecute` runs once it has finished.
                Ran::Suspended(ticket) => return Ok(CallOutcome::Suspended(Box::new(ticket))),
                Ran::Cancelled(result) => {
                    // The run is ending: the call closes as cancelled, without
                    // AfterToolExecute.
                    return Ok(CallOutcome::Closed(result, ToolCallState::Cancelled));
                }
                // Reported, then the call goes on as it ended.
                Ran::EffectsFailed(failed) => {
                    let (inner, failures) = *failed;
                    self.effects_failed(&failures)?;
                    ran = inner;
                }
            }
        };
        if !self.skip_idle(Phase::AfterToolExecute)? {
            let after = ToolPhaseInfo {
                call: call.clone(),
                result: Some(result.clone()),
                asked_while_running: self.asked_while_running(&call.id, resume.is_some()),
                resume: resume.map(|r| *r),
            };
            if let Err(failure) = self
                .phase_with(self.ctx(Phase::AfterToolExecute).with_tool(after))
                .await
            {
                // The tool ran and its result is known: the call closes with it, whatever
                // ends the run.
                // Boxed: a cold path, kept out of every run's future.
                Box::pin(self.close(call, result, state)).await?;
                return Err(failure);
            }
        }
        Ok(CallOutcome::Closed(result, state))
    }
}

/// The call's arguments in its tool's canonical form, checked against the schema again, or
/// `None` when they are in it already (no allocation then); a panic in the tool's
/// normalisation is the call's error.
fn normalized_arguments(
    tool: &ResolvedTool,
    call: &ToolCall,
) -> Result<Option<Arc<serde_json::Value>>, ToolError> {
    Ok(tool
        .tool
        .normalize_arguments(&call.arguments)?
        .map(Arc::new))
}

/// The outcome a gate's or an action's decision on a call gives it.
fn intercepted(payload: ToolInterceptPayload) -> CallOutcome {
    match payload {
        ToolInterceptPayload::Block { reason } => {
            CallOutcome::Closed(ToolResult::error(reason), ToolCallState::Blocked)
        }
        ToolInterceptPayload::SetResult(result) => {
            CallOutcome::Closed(result, ToolCallState::ShortCircuited)
        }
        ToolInterceptPayload::Suspend(ticket) => CallOutcome::Suspended(Box::new(ticket)),
    }
}
