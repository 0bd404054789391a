//! How a built run begins and ends: its opening (its lease, its first commit, `RunStart`) and
//! its one exit path (`RunEnd` unless suspended, leftover actions dead-lettered,
//! `on_deactivate`, the last commit, `RunFinish`), then the lifecycle hook of how it ended and
//! its lease given up.

use awaken_event::{AgentEvent, CancellationToken, RunId, TerminationReason, WarningKind};
use awaken_phase::Phase;
use awaken_plugin::{LifecycleEvent, RunLifecycle, isolate};
use awaken_store::CommitError;

use crate::durable::{BatchChange, CheckpointError};
use crate::error::RunError;
use crate::inner::{Heartbeat, RuntimeInner};
use crate::outcome::RunOutcome;
use crate::run::{Failure, Run};

/// What a built run's opening needs besides the run.
pub(crate) struct Opening {
    /// Events about the activation's preparation (repairs, a superseded wait, dead letters),
    /// emitted once the run exists.
    pub(crate) notes: Vec<AgentEvent>,
    /// Whether the run continues an earlier activation (a resume or a recovery).
    pub(crate) resumed: bool,
    /// The parent run of a delegate's child run.
    pub(crate) parent_run_id: Option<RunId>,
}

impl Run<'_> {
    /// Runs the built run to its end: opens it, drives its steps, ends it through the one exit
    /// path, dispatches the lifecycle hook of how it ended and gives its lease up.
    pub(crate) async fn run_to_end(
        mut self: Box<Self>,
        rt: &RuntimeInner,
        opening: Opening,
    ) -> Result<RunOutcome, RunError> {
        let (heartbeat, lifecycle_run) = self.open(rt, opening).await?;
        let termination = match self.drive().await {
            Ok(t) => t,
            Err(Failure::Cancelled) => TerminationReason::Cancelled,
            Err(Failure::Error(message)) => TerminationReason::Error { message },
        };
        let (termination, end_written) = self.finish(termination).await;
        // Steering messages a failed commit left pending were stored by the last commit if it
        // was written (else they were not: dropping the replies refuses them).
        for (step, reply) in std::mem::take(&mut self.steering_unanswered) {
            if end_written.is_ok() {
                crate::steering::taken([reply], step);
            }
        }
        let event = match &termination {
            TerminationReason::Cancelled => LifecycleEvent::RunCancel(&lifecycle_run),
            TerminationReason::Error { message } => {
                LifecycleEvent::RunError(&lifecycle_run, message)
            }
            other => LifecycleEvent::RunComplete(&lifecycle_run, other),
        };
        self.lifecycle
            .dispatch(self.resolved.env.plugins(), event)
            .await;
        self.release_lease(rt, heartbeat).await;
        let usage = self.read_stats(|s| s.usage);
        let outcome = RunOutcome {
            run_id: self.identity.run_id.clone(),
            termination,
            response: self.response.take(),
            steps: self.step - self.first_step,
            usage,
        };
        match end_written.map_err(|e| *e) {
            Ok(()) => Ok(outcome),
            // Another worker took the run over: it continues it, not a recovery of this one.
            Err(CheckpointError::Commit(CommitError::LeaseLost { .. })) => {
                Err(RunError::TakenOver {
                    thread_id: self.identity.thread_id.clone(),
                    run_id: outcome.run_id,
                })
            }
            Err(source) => Err(RunError::EndNotWritten {
                thread_id: self.identity.thread_id.clone(),
                outcome: Box::new(outcome),
                source,
            }),
        }
    }

    /// Opens the run: takes its lease, makes its first commit (the activation exists once it
    /// is in: its record and the new messages), emits the preparation's notes and dispatches
    /// `RunStart`. Returns the lease's heartbeat and the run as lifecycle hooks see it.
    async fn open(
        &mut self,
        rt: &RuntimeInner,
        opening: Opening,
    ) -> Result<(Option<Heartbeat>, RunLifecycle), RunError> {
        // A runtime with a worker identity holds the lease of every run it drives (a
        // recovery's lease comes with its claim): taken before a resume writes anything (so
        // two processes never continue one waiting run), and by a new run's first commit, which
        // creates the run leased (so no recovery claims it before its worker).
        let claimed_already = self.durable.lease().is_some();
        let mut heartbeat = None;
        if opening.resumed && !claimed_already {
            heartbeat = self.hold_lease(rt).await?;
        }
        // The token of the lease a new run is created with, and the lease's duration.
        let mut created = None;
        let set_at = tokio::time::Instant::now();
        if !opening.resumed
            && !claimed_already
            && let Some((lease, duration)) = self.new_lease(rt)
        {
            let token = lease.token(&self.identity.run_id);
            // A run dropped during its first commit, or whose first commit failed but may have
            // been written (its answer lost), gives the lease up.
            heartbeat = Some(rt.lease_guard(token.clone()));
            self.durable.set_new_lease(Some(lease));
            created = Some((token, duration));
        }
        let written = self.commit(BatchChange::Keep).await;
        if let Some((token, _)) = &created {
            // From now on the run's commits carry the lease's token.
            self.durable.set_new_lease(None);
            self.durable.set_lease(Some(token.clone()));
        }
        if let Err(e) = written {
            // A refused first commit wrote nothing: the lease it would have created is not
            // this run's to give up (the same worker id may hold it for another activation).
            let refused = matches!(&e, CheckpointError::Commit(c) if c.is_refusal());
            match heartbeat {
                Some(h) if created.is_some() && refused => h.stop(),
                heartbeat => self.release_lease(rt, heartbeat).await,
            }
            return Err(e.into_run_error(&self.identity.thread_id));
        }
        if let (Some(h), Some((_, duration))) = (&mut heartbeat, created) {
            // Renewed once a third of it is gone, counted from when it was set: a slow first
            // commit does not let it expire unrenewed.
            let first = (duration / 3).saturating_sub(set_at.elapsed());
            h.beat(rt, duration, self.cancel.clone(), first);
        }
        // `RunStart` is out: the visible state follows it.
        self.show_state();
        for note in opening.notes {
            self.note(note);
        }
        let lifecycle_run = RunLifecycle {
            run: self.identity.clone(),
            resumed: opening.resumed,
            parent_run_id: opening.parent_run_id,
        };
        self.lifecycle
            .dispatch(
                self.resolved.env.plugins(),
                LifecycleEvent::RunStart(&lifecycle_run),
            )
            .await;
        for w in self.resolved.warnings.clone() {
            self.note(AgentEvent::Warning {
                kind: WarningKind::Resolution,
                detail: w.to_string(),
            });
        }
        Ok((heartbeat, lifecycle_run))
    }

    /// The one exit path: `RunEnd` (unless suspended), leftover actions dead-lettered,
    /// `on_deactivate`, and the last commit, after which `RunFinish` is emitted (also when the
    /// commit failed, which the second result says).
    async fn finish(
        &mut self,
        termination: TerminationReason,
    ) -> (TerminationReason, Result<(), Box<CheckpointError>>) {
        let mut termination = termination;
        if termination != TerminationReason::Suspended && !self.engine.is_idle(Phase::RunEnd) {
            // RunEnd runs even for a cancelled run: give it a fresh token.
            let ctx = self
                .ctx(Phase::RunEnd)
                .with_cancel(CancellationToken::new());
            match self.engine.run_phase(&ctx).await {
                Ok(report) => {
                    if let Err(failure) = self.report(&report) {
                        self.note(AgentEvent::Error {
                            message: failure.message(),
                        });
                    }
                }
                Err(e) => {
                    self.note(AgentEvent::Error {
                        message: e.to_string(),
                    });
                    if !matches!(termination, TerminationReason::Error { .. }) {
                        termination = TerminationReason::error(e.to_string());
                    }
                }
            }
            match self
                .engine
                .dead_letter_remaining("the run ended before its phase ran again")
            {
                Ok(letters) => {
                    for letter in letters {
                        self.note(AgentEvent::ActionDeadLettered {
                            action: letter.action.key,
                            phase: letter.action.phase,
                            reason: letter.reason,
                        });
                    }
                }
                Err(e) => self.note(AgentEvent::Error {
                    message: e.to_string(),
                }),
            }
        }
        if let TerminationReason::Error { message } = &termination {
            self.note(AgentEvent::Error {
                message: message.clone(),
            });
        }
        // By place (the list is not copied: its plugins are counted by every run). An error or
        // a panic is reported and the run still ends.
        for at in 0..self.resolved.env.plugins().len() {
            let plugin = &self.resolved.env.plugins()[at];
            let deactivated = isolate(&plugin.manifest().id, "on_deactivate", || {
                plugin.on_deactivate()
            })
            .and_then(|deactivated| deactivated);
            match deactivated {
                Ok(Some(cmd)) => match self.engine.submit_command(cmd).await {
                    Ok(report) if !report.effects.failures.is_empty() => {
                        if let Err(failure) = self.effects_failed(&report.effects.failures) {
                            self.note(AgentEvent::Error {
                                message: failure.message(),
                            });
                        }
                    }
                    Ok(_) => {}
                    Err(e) => self.note(AgentEvent::Error {
                        message: e.to_string(),
                    }),
                },
                Ok(None) => {}
                Err(e) => self.note(AgentEvent::Error {
                    message: e.to_string(),
                }),
            }
        }
        // The last commit: the run's end (or wait), `RunFinish` emitted after it.
        self.durable.finish(&termination);
        let usage = self.read_stats(|s| s.usage);
        self.fact(AgentEvent::RunFinish {
            thread_id: self.identity.thread_id.clone(),
            run_id: self.identity.run_id.clone(),
            termination: Box::new(termination.clone()),
            response: self.response.clone(),
            usage: Box::new(usage),
        });
        // Calls the run will never finish are closed: a finished run holds none open.
        self.close_batch(&termination);
        let written = self.commit(BatchChange::Write).await;
        if let Err(e) = &written {
            tracing::error!(error = %e, "the run's last commit failed");
            if self.visible.is_some() {
                self.show_changes();
            }
            self.durable.flush_uncommitted(self.sink);
        }
        self.stop_showing_state();
        // (Boxed: the run's future holds it across the lifecycle hook and the release.)
        (termination, written.map_err(Box::new))
    }
}
