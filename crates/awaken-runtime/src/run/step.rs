//! The step loop: the activation's first step (a new run's `RunStart` phase, or the step that
//! finishes what a resumed or recovered run left), then one step after another until one ends
//! the run. A step is `StepStart`, `BeforeInference`, the request, the inference,
//! `AfterInference`, the tool calls and `StepEnd`, committed at its end.

use std::sync::Arc;

use awaken_event::{
    AgentEvent, InferenceResponse, Message, Role, StopReason, TerminationReason, ToolCallResume,
    ToolCallState, ToolResult, WarningKind,
};
use awaken_phase::Phase;
use awaken_plugin::{TokenCounts, TransformContext, apply_transforms, isolate};
use awaken_state::StateCommand;
use awaken_tool::ToolBatch;

use crate::builtins::StatsUpdate;
use crate::durable::BatchChange;
use crate::failpoint;
use crate::resume::{DecisionsUpdate, ResumeDecisionsKey, suspended_calls};
use crate::run::{Continue, Failure, Run};

/// Whether the run goes on after a step.
pub(super) enum StepEnd {
    Continue,
    End(TerminationReason),
}

impl Run<'_> {
    /// Drives the run: each plugin's `on_activate`, the activation's first step (a new run's
    /// `RunStart` phase, the calls a resume decided on, a recovery's interrupted step), then
    /// one step after another until one ends the run.
    pub(super) async fn drive(&mut self) -> Result<TerminationReason, Failure> {
        // By place: submitting may report failed effects, which needs the run mutably. An
        // error or a panic fails the run.
        for at in 0..self.resolved.env.plugins().len() {
            let plugin = &self.resolved.env.plugins()[at];
            let cmd = isolate(&plugin.manifest().id, "on_activate", || {
                plugin.on_activate(&self.resolved.spec.sections)
            })
            .and_then(|activated| activated)
            .map_err(|e| Failure::Error(e.to_string()))?;
            if let Some(cmd) = cmd {
                self.submit(cmd).await?;
            }
        }
        match self.resume.take().map(|r| *r) {
            // A new run: its `RunStart` phase. A resumed one started long ago.
            None => self.phase(Phase::RunStart).await?,
            Some(Continue::Recover) => {
                if self.batch.is_some() {
                    // A step was interrupted: its batch is still there.
                    if let StepEnd::End(t) = self.step(Some(Vec::new())).await? {
                        return Ok(t);
                    }
                } else if let Some(t) = self.ended_before_the_crash() {
                    // Only the run's last commit was lost: end it as it ended.
                    self.response = self
                        .history
                        .iter()
                        .rev()
                        .find(|m| m.role == Role::Assistant)
                        .map(Message::text)
                        .filter(|t| !t.is_empty());
                    return Ok(t);
                }
            }
            Some(Continue::Decide(recorded, new)) => {
                if !new.is_empty() {
                    self.submit(StateCommand::new().with_update::<ResumeDecisionsKey>(
                        DecisionsUpdate::Add {
                            decisions: new.clone(),
                        },
                    ))
                    .await?;
                }
                let mut decisions = recorded;
                decisions.extend(new);
                let undecided = self.batch.as_ref().is_some_and(|b| {
                    suspended_calls(b)
                        .iter()
                        .any(|(id, _)| !decisions.iter().any(|d| d.call_id == *id))
                });
                if undecided {
                    // The decisions are recorded; the run waits for the rest.
                    return Ok(TerminationReason::Suspended);
                }
                if let StepEnd::End(t) = self.step(Some(decisions)).await? {
                    return Ok(t);
                }
            }
        }
        loop {
            // A normal step first takes the steering messages waiting (the first step of a
            // resumed or recovered run, above, finishes calls, whose results must follow them
            // at once). Boxed: a rare path, whose commit every run's future need not hold room
            // for.
            if self.steering.waiting() > 0 && !self.cancel.is_cancelled() {
                Box::pin(self.take_steering()).await?;
            }
            if let StepEnd::End(t) = self.step(None).await? {
                return Ok(t);
            }
        }
    }

    /// One step, committed at its end: a normal one, or (with decisions) the step that
    /// finishes the calls a resume decided on.
    pub(super) async fn step(
        &mut self,
        decisions: Option<Vec<ToolCallResume>>,
    ) -> Result<StepEnd, Failure> {
        self.step += 1;
        let step = self.step;
        self.note(AgentEvent::StepStart { step });
        let outcome = match decisions {
            None => self.run_step().await,
            // Boxed: only the first step of a resumed or recovered run is one, and the run's
            // future need not hold room for it at every step.
            Some(d) => Box::pin(self.resume_step(d)).await,
        };
        match &outcome {
            Err(failure) => self.close_open_calls(failure),
            // Every call of a finished step was closed (or the grammar check reports it).
            Ok(_) => self.open_calls.clear(),
        }
        // `StepEnd` follows the step's facts, so it is one of them.
        self.fact(AgentEvent::StepEnd { step });
        match outcome {
            // The step's facts (messages, batch, state, events) in one commit, with the last
            // call's result when it was folded into it.
            Ok(o) => {
                let batch = self.step_end_batch();
                self.checkpoint(batch).await?;
                if let Some(call) = self.folded_result.take() {
                    failpoint::hit("after_result", Some(call.as_str()));
                }
                Ok(o)
            }
            Err(e) => Err(e),
        }
    }

    /// A normal step: the request, the inference, the calls of its answer.
    async fn run_step(&mut self) -> Result<StepEnd, Failure> {
        self.phase(Phase::StepStart).await?;
        self.phase(Phase::BeforeInference).await?;
        // What the request needs of the state, in one look (no snapshot is taken: the commit
        // after the inference writes in place when none is held). A summary that failed in this
        // phase's compaction: the run goes on truncating.
        let (fell_back, directives, run_usage) = self.engine.store().read(|s| {
            let (fallbacks, error) = self.compaction_fallbacks_in(s);
            (
                (fallbacks > self.seen_fallbacks)
                    .then(|| (fallbacks, error.unwrap_or("no detail").to_owned())),
                self.directives_in(s),
                self.stats_in(s, |s| s.usage),
            )
        });
        if let Some((fallbacks, error)) = fell_back {
            self.seen_fallbacks = fallbacks;
            self.note(AgentEvent::Warning {
                kind: WarningKind::CompactionFellBack,
                detail: format!("compaction failed, the request is truncated instead: {error}"),
            });
        }
        let request = self.request(&directives);
        // The transforms' snapshot is let go before the inference: held on, it would keep this
        // version alive (and the commit after the inference would copy instead of writing in
        // place). Without transforms, none is taken.
        let request = if self.resolved.env.transforms().is_empty() {
            request
        } else {
            let snapshot = self.engine.store().snapshot();
            let tctx = TransformContext {
                snapshot: &snapshot,
                run: &self.identity,
                step: self.step,
                tokens: TokenCounts {
                    last_usage: None,
                    run_usage,
                },
            };
            apply_transforms(self.resolved.env.transforms(), request, &tctx)
                .map_err(|e| Failure::Error(e.to_string()))?
        };
        let request = self.alternating(request);
        let InferenceResponse {
            message,
            usage,
            stop_reason,
        } = self.infer(request).await?;
        self.count(StatsUpdate::Inference { usage })?;
        let text = message.text();
        if !text.is_empty() {
            self.response = Some(text);
        }
        let calls = message.tool_calls.clone();
        // Moved into the history; `AfterInference`'s hooks, when there are any, get the
        // response rebuilt around the history's copy.
        self.push_message(message);
        if !calls.is_empty() {
            failpoint::hit("before_requested", None);
            // Every call durable as `Requested`, with the assistant message, before any gate.
            self.batch =
                Some(ToolBatch::of_shared(&calls).map_err(|e| Failure::Error(e.to_string()))?);
            self.checkpoint(BatchChange::Write).await?;
            failpoint::hit("after_requested", None);
        }
        if !self.skip_idle(Phase::AfterInference)? {
            let message = self.history.last().cloned().ok_or_else(|| {
                Failure::Error("the assistant message is missing from the history".into())
            })?;
            let response = Arc::new(InferenceResponse {
                message,
                usage,
                stop_reason,
            });
            self.phase_with(self.ctx(Phase::AfterInference).with_response(response))
                .await?;
        }

        let max_rounds = self.resolved.spec.max_rounds;
        if calls.is_empty() {
            let after = self.end_step(false).await?;
            let end = final_answer_end(stop_reason);
            // A steering message waits: the run goes on to take it instead of ending, unless
            // a stop condition or the round limit ends it (then the message is refused).
            if end == TerminationReason::NaturalEnd
                && matches!(after, StepEnd::Continue)
                && self.read_stats(|s| s.inferences) < max_rounds
                && !self.cancel.is_cancelled()
                && !self.steering.close_unless_waiting()
            {
                return Ok(StepEnd::Continue);
            }
            return Ok(StepEnd::End(end));
        }
        if self.read_stats(|s| s.inferences) >= max_rounds {
            for call in calls.iter() {
                self.close(
                    call,
                    ToolResult::error("not executed: round limit"),
                    ToolCallState::Cancelled,
                )
                .await?;
            }
            self.end_step(false).await?;
            return Ok(StepEnd::End(TerminationReason::stopped(
                "max_rounds",
                format!("reached the limit of {max_rounds} inferences"),
            )));
        }
        let suspended = if self.resolved.spec.parallel_tools && calls.len() > 1 {
            // Boxed: its future is the larger, and most steps run their calls one by one (every
            // run's future would hold room for it).
            Box::pin(self.run_calls_concurrently(&calls)).await?
        } else {
            self.run_calls_sequentially(&calls).await?
        };
        self.end_step(suspended).await
    }

    /// Takes the steering messages waiting for the step about to start: appended to the
    /// history and committed in a commit of their own before it, so its inference sees them,
    /// each with its `MessageAdded` event; then each sender learns the step.
    async fn take_steering(&mut self) -> Result<(), Failure> {
        let waiting = self.steering.take();
        if waiting.is_empty() {
            return Ok(());
        }
        let step = self.step + 1;
        let receipts: Vec<_> = waiting.iter().filter_map(|w| w.receipt.clone()).collect();
        if !receipts.is_empty() {
            // In the commit that stores the messages (before them: a failed count takes none).
            self.count(StatsUpdate::Steered { receipts, step })?;
        }
        let mut replies = Vec::with_capacity(waiting.len());
        for w in waiting {
            // Emitted after the commit that stores the message, as one of its facts.
            self.fact(AgentEvent::MessageAdded {
                step,
                message: w.message.clone(),
            });
            self.push_message(w.message);
            replies.push(w.reply);
        }
        if let Err(failure) = self.checkpoint(BatchChange::Keep).await {
            // The messages wait in the pending commit, which the run's last one writes.
            self.steering_unanswered
                .extend(replies.into_iter().map(|r| (step, r)));
            return Err(failure);
        }
        crate::steering::taken(replies, step);
        Ok(())
    }

    /// Runs `StepEnd` and counts the step; returns how the run goes on: it waits when a call
    /// of the step was `suspended`, else it ends when a stop condition holds for the statistics
    /// as the step left them (read before the count clears the step's tools).
    pub(super) async fn end_step(&mut self, suspended: bool) -> Result<StepEnd, Failure> {
        self.phase(Phase::StepEnd).await?;
        let stop = self.stop_now(false);
        self.count(StatsUpdate::StepEnded)?;
        Ok(if suspended {
            StepEnd::End(TerminationReason::Suspended)
        } else {
            stop.map_or(StepEnd::Continue, StepEnd::End)
        })
    }

    /// After a step: a closed batch is cleared, a batch with suspended calls is kept.
    fn step_end_batch(&mut self) -> BatchChange {
        match &self.batch {
            None => BatchChange::Keep,
            Some(b) if b.is_closed() => {
                self.batch = None;
                BatchChange::Clear
            }
            Some(_) => BatchChange::Write,
        }
    }
}

/// How a run ends on an answer without tool calls: naturally, unless the model was cut off —
/// by its output token limit or the provider's content filter — so that a partial answer
/// never looks finished (the text is kept as the run's response all the same).
fn final_answer_end(stop_reason: StopReason) -> TerminationReason {
    match stop_reason {
        StopReason::MaxTokens => TerminationReason::stopped(
            "truncated",
            "the answer was cut at the model's output token limit (max_tokens)",
        ),
        StopReason::ContentFiltered => TerminationReason::stopped(
            "content_filtered",
            "the provider's content filter stopped the answer",
        ),
        _ => TerminationReason::NaturalEnd,
    }
}
