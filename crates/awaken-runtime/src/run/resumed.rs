//! The first step of a resumed or recovered run: the calls a resume decided on, each as its
//! decision says, and the calls a crash interrupted, each as its tool's recovery policy says.

use awaken_event::{
    AgentEvent, ResumeDecision, ResumeMode, Role, SuspendTicket, TerminationReason, ToolCall,
    ToolCallResume, ToolCallState, ToolResult,
};
use awaken_phase::Phase;
use awaken_state::StateCommand;
use awaken_tool::{OUTCOME_UNKNOWN_MESSAGE, RecoveryAction, pending_call};

use crate::resume::{DecisionsUpdate, ResumeDecisionsKey};
use crate::run::calls::CallOutcome;
use crate::run::step::StepEnd;
use crate::run::{Failure, Run};

impl Run<'_> {
    /// The step of a resume: the batch's open calls in call order, each as its decision says
    /// (deny: closed cancelled; approve: replayed through the gates, which see the decision,
    /// or the decision used as the result, or handed to the tool, as the ticket's resume mode
    /// says), then `StepEnd` and the stop conditions as after any step. A cancellation or
    /// failure closes the call being looked at; the run's end closes the rest, which this
    /// activation never announced.
    pub(super) async fn resume_step(
        &mut self,
        decisions: Vec<ToolCallResume>,
    ) -> Result<StepEnd, Failure> {
        self.phase(Phase::StepStart).await?;
        self.submit(StateCommand::new().with_update::<ResumeDecisionsKey>(DecisionsUpdate::Clear))
            .await?;
        let open: Vec<(ToolCall, ToolCallState, Option<SuspendTicket>)> = self
            .batch
            .as_ref()
            .map(|b| {
                b.calls()
                    .iter()
                    .filter(|c| {
                        matches!(
                            c.state(),
                            ToolCallState::Suspended
                                | ToolCallState::Requested
                                | ToolCallState::Executing
                        )
                    })
                    .map(|c| (c.call().clone(), c.state(), c.ticket().cloned()))
                    .collect()
            })
            .unwrap_or_default();
        let count = open.len();
        let mut suspended = false;
        for (i, (call, state, ticket)) in open.into_iter().enumerate() {
            // The calls not looked at yet were not announced by this activation: a cancelled
            // run leaves them to its end, which closes them in the batch and history only.
            self.check_cancelled()?;
            let decision = decisions.iter().find(|d| d.call_id == call.id).cloned();
            if decision.is_none() && state == ToolCallState::Suspended {
                // Not announced: it was not resumed, and stays suspended.
                suspended = true;
                continue;
            }
            self.opened(&call.id);
            match (&decision, state) {
                (Some(d), ToolCallState::Suspended) => self.note(AgentEvent::ToolCallResumed {
                    call_id: call.id.clone(),
                    decision: d.decision,
                }),
                _ => self.note(AgentEvent::ToolCallStart {
                    call_id: call.id.clone(),
                    name: self.shared_tool_name(&call.name),
                }),
            }
            self.announce_ready(&call);
            let mode = ticket.as_ref().map(|t| t.resume_mode).unwrap_or_default();
            let outcome = match decision {
                // Interrupted while executing: its recovery policy decides, never a silent
                // re-run.
                None if state == ToolCallState::Executing => self.recover_call(&call).await,
                Some(d)
                    if d.decision == ResumeDecision::Deny
                        && mode != ResumeMode::PassDecisionToTool =>
                {
                    let why = match &d.payload {
                        Some(serde_json::Value::String(reason)) => format!(": {reason}"),
                        _ => String::new(),
                    };
                    Ok(CallOutcome::Closed(
                        ToolResult::error(format!("denied by the user{why}")),
                        ToolCallState::Cancelled,
                    ))
                }
                Some(d) if mode == ResumeMode::UseDecisionAsResult => Ok(CallOutcome::Closed(
                    ToolResult::success(d.payload.unwrap_or(serde_json::Value::Null)),
                    ToolCallState::ShortCircuited,
                )),
                d => self.execute_call(&call, d.map(Box::new)).await,
            };
            let outcome = match outcome {
                Ok(o) => o,
                Err(failure) => {
                    // Only this call was announced; the run's end closes the rest.
                    self.close_all(std::slice::from_ref(&call), failure.call_reason())
                        .await?;
                    return Err(failure);
                }
            };
            let last = i + 1 == count;
            suspended |= self.settle(&call, outcome, last).await?;
        }
        self.end_step(suspended).await
    }

    /// Whether a recovered run (between steps) had already ended: the model's last answer
    /// called no tool, or a stop condition holds. Recovery then ends it without asking the
    /// model again.
    pub(super) fn ended_before_the_crash(&self) -> Option<TerminationReason> {
        let last = self.history.last()?;
        if last.role == Role::Assistant && last.tool_calls.is_empty() {
            return Some(TerminationReason::NaturalEnd);
        }
        // Between steps the step count has moved the last step's tools aside.
        self.stop_now(true)
    }

    /// A call found `Executing` after a crash: its tool's recovery policy re-runs it
    /// (`ReadOnly`/`Idempotent` only, with the same idempotency key), closes it as outcome
    /// unknown, or suspends it for a human. Never a silent re-run.
    async fn recover_call(&mut self, call: &ToolCall) -> Result<CallOutcome, Failure> {
        let tool = self.tool_named(&call.name).cloned();
        let action = tool
            .as_ref()
            .map_or(RecoveryAction::CloseOutcomeUnknown, |t| {
                t.tool.recovery_action(ToolCallState::Executing)
            });
        match (action, tool) {
            (RecoveryAction::Rerun, Some(tool)) => {
                self.mark_executing(&[call]).await?;
                let ran = self
                    .invocation()
                    .run(&tool, call, None, &self.engine, false)
                    .await;
                self.after_tool(call, ran, None).await
            }
            (RecoveryAction::SuspendForHuman, _) => {
                Ok(CallOutcome::Suspended(Box::new(SuspendTicket {
                    suspension_id: format!("recovery-{}", call.id),
                    call: pending_call(call),
                    message: format!(
                        "`{}` was interrupted while running and may or may not have taken effect. Run it again?",
                        call.name
                    ),
                    response_schema: None,
                    resume_mode: ResumeMode::Replay,
                })))
            }
            _ => Ok(CallOutcome::Closed(
                ToolResult::error(OUTCOME_UNKNOWN_MESSAGE),
                ToolCallState::OutcomeUnknown,
            )),
        }
    }
}
