//! The in-process part: runs one after another on one store (memory or SQLite), each with the
//! fault its plan drew, each checked as it ends. Threads are reused for one to three runs,
//! 64 of them alive at a time, and deleted after their last run.

use std::sync::Arc;

use awaken_event::{CancellationToken, TerminationReason, ThreadId};
use awaken_runtime::{AgentRuntime, RecoverConfig, RunActivation, RunError, RunOutcome};
use awaken_store::{CommitError, StoreError, ThreadStore};

use crate::agents::{Recorder, runtime};
use crate::check;
use crate::model::{ProviderFault, ProviderFaults};
use crate::plan::{self, Extent, Fault, MAX_RETRIES, ROTATION, Shape};
use crate::rng::Rng;
use crate::stats::{Stats, StoreKind, point_name};
use crate::store::{Armable, FaultyStore, Holding};
use crate::tools::Ledger;

/// Threads alive at a time.
const LIVE_THREADS: usize = 64;

struct Live {
    id: ThreadId,
    runs_left: u32,
}

/// One store's in-process soak.
pub(crate) struct InProcess<S> {
    kind: StoreKind,
    store: Arc<FaultyStore<S>>,
    rt: AgentRuntime,
    faults: Arc<ProviderFaults>,
    ledger: Arc<Ledger>,
    recorder: Recorder,
    live: Vec<Live>,
    threads_made: u64,
    /// The fault-free extent of each shape, once a run measured it.
    extents: [Option<Extent>; 2],
    rotated: usize,
    runs: u64,
}

/// How a driven run ended.
enum Ended {
    /// It returned.
    Returned(Result<RunOutcome, RunError>),
    /// The soak dropped it during a stall.
    Dropped,
}

impl<S: Armable> InProcess<S> {
    /// A soak of `store`, naming its threads and runs after `kind`.
    pub(crate) fn new(kind: StoreKind, store: S) -> anyhow::Result<Self> {
        let store = Arc::new(FaultyStore::new(store));
        let faults = Arc::new(ProviderFaults::default());
        let ledger = Arc::new(Ledger::memory());
        let rt = runtime(
            Arc::clone(&store) as Arc<dyn ThreadStore>,
            &faults,
            Arc::clone(&ledger),
            &format!("{}-run-", kind.name()),
        )?;
        Ok(Self {
            kind,
            store,
            rt,
            faults,
            ledger,
            recorder: Recorder::default(),
            live: Vec::with_capacity(LIVE_THREADS),
            threads_made: 0,
            extents: [None; 2],
            rotated: 0,
            runs: 0,
        })
    }

    /// A live thread, or a new one while fewer than [`LIVE_THREADS`] are alive.
    fn pick_thread(&mut self, rng: &mut Rng) -> usize {
        if self.live.len() < LIVE_THREADS {
            self.threads_made += 1;
            let id = ThreadId::new(format!("{}-{}", self.kind.name(), self.threads_made))
                .unwrap_or_else(|e| unreachable!("the soak's thread ids are short and plain: {e}"));
            self.live.push(Live {
                id,
                runs_left: rng.between(1, 3),
            });
            return self.live.len() - 1;
        }
        rng.below(self.live.len() as u64) as usize
    }

    /// Runs one activation with a drawn fault and checks it.
    pub(crate) async fn run_one(&mut self, rng: &mut Rng, stats: &mut Stats) {
        let slot = self.pick_thread(rng);
        let thread_id = self.live[slot].id.clone();
        let shape = Shape::draw(rng);
        let at = shape_index(shape);
        let fault = match self.extents[at] {
            // The first run of a shape measures where its faults can land.
            None => Fault::None,
            Some(extent) => {
                let forced = (self.rotated < ROTATION).then_some(self.rotated);
                self.rotated += usize::from(forced.is_some());
                plan::draw(rng, forced, shape, extent)
            }
        };
        self.runs += 1;
        *stats.runs.entry((self.kind, shape)).or_default() += 1;
        *stats.faults.entry(fault.kind()).or_default() += 1;
        let context = format!(
            "{} run #{} on {thread_id} ({}), fault {fault:?}",
            self.kind.name(),
            self.runs,
            shape.agent()
        );
        let repeated_before = self.ledger.repeated();

        let cancel = CancellationToken::new();
        self.arm(fault, &cancel);
        let mut activation =
            RunActivation::new(thread_id.clone(), shape.agent()).with_user_message("go");
        activation.cancel = cancel.clone();
        let ended = self.drive(activation, fault, &cancel).await;
        let provider_fired = self.faults.disarm();
        let commits = self.store.commits();
        let injected = self.store.take_injected();

        let mut problems = Vec::new();
        let outcome = self.judge_ending(ended, fault, shape, &mut problems);
        if matches!(
            fault,
            Fault::Retryable { .. }
                | Fault::Permanent { .. }
                | Fault::MidStream { .. }
                | Fault::StallCancel { .. }
                | Fault::StallTimeout { .. }
                | Fault::StallDrop { .. }
        ) && !provider_fired
        {
            problems.push("the planned provider fault never happened".to_owned());
        }
        if let (None, Some(Ok(o))) = (self.extents[at], &outcome)
            && o.termination == TerminationReason::NaturalEnd
        {
            self.extents[at] = Some(Extent {
                commits,
                events: self.recorder.with_events(|e| e.len() as u32),
            });
        }

        // The store: finished, after a recovery where the run could not finish itself.
        let lost_last = self.loses_last_commit(fault, shape);
        let may_recover = matches!(fault, Fault::StallDrop { .. }) || lost_last;
        // (The events are read back only to compare them with those before a store fault.)
        let events = matches!(fault, Fault::Store { .. });
        let mut holding = check::finished_thread(&*self.store, &thread_id, events).await;
        if holding.is_err() && may_recover {
            self.recover(&thread_id, &outcome, &mut problems).await;
            stats.recovered_in_process += 1;
            holding = check::finished_thread(&*self.store, &thread_id, events).await;
        } else if matches!(fault, Fault::StallDrop { .. }) {
            problems.push("the dropped run was left finished: nothing to recover".to_owned());
        }
        let holding = match holding {
            Ok(h) => Some(h),
            Err(e) => {
                problems.push(e);
                None
            }
        };

        if let Fault::Store { point, .. } = fault {
            match injected {
                None => problems.push("the planned store fault's commit never came".to_owned()),
                Some(inj) => {
                    if inj.fired {
                        *stats
                            .store_faults
                            .entry((self.kind, point_name(point)))
                            .or_default() += 1;
                    } else {
                        problems.push(format!("the armed failpoint {point:?} did not fire"));
                    }
                    let run_id = match &outcome {
                        Some(Ok(o)) => Some(&o.run_id),
                        Some(Err(RunError::EndNotWritten { outcome, .. })) => Some(&outcome.run_id),
                        _ => None,
                    };
                    if let Err(e) = kept(inj.before, inj.after, holding.as_ref(), run_id) {
                        stats.lost_commits += 1;
                        problems.push(e);
                    }
                }
            }
        }

        // Every activation, a dropped one too, leaves the runtime's count of active runs.
        if self.rt.active_runs() != 0 {
            problems.push(format!(
                "{} activation(s) still counted active",
                self.rt.active_runs()
            ));
        }
        let repeated = self.ledger.repeated() - repeated_before;
        if repeated > 0 {
            stats.duplicated_effects += repeated;
            problems.push(format!("{repeated} side effect(s) ran twice"));
        }
        for p in problems {
            stats.violation(&context, p);
        }

        let live = &mut self.live[slot];
        live.runs_left -= 1;
        if live.runs_left == 0 {
            let gone = self.live.swap_remove(slot);
            match self.store.delete_thread(&gone.id).await {
                Ok(_) => stats.pruned += 1,
                Err(e) => stats.violation(&context, format!("deleting the thread: {e}")),
            }
            self.ledger.forget(gone.id.as_str());
        }
    }

    /// Arms the run's fault: the recorder's cancellation, the store's commit, the models'.
    fn arm(&self, fault: Fault, cancel: &CancellationToken) {
        let cancel_at = match fault {
            Fault::Cancel { at_event: 0 } => {
                cancel.cancel();
                None
            }
            Fault::Cancel { at_event } => Some((at_event as usize, cancel.clone())),
            _ => None,
        };
        self.recorder.reset(cancel_at);
        self.store.plan(match fault {
            Fault::Store { at_commit, point } => Some((at_commit, point)),
            _ => None,
        });
        let provider = match fault {
            Fault::Retryable { step, times } => Some((step, ProviderFault::Retryable { times })),
            Fault::Permanent { step } => Some((step, ProviderFault::Permanent)),
            Fault::MidStream { step } => Some((step, ProviderFault::MidStream)),
            Fault::StallCancel { step, .. } | Fault::StallDrop { step, .. } => {
                Some((step, ProviderFault::Stall))
            }
            Fault::StallTimeout { step, turns } => {
                Some((step, ProviderFault::StallThenTimeout { turns }))
            }
            Fault::None | Fault::Cancel { .. } | Fault::Store { .. } => None,
        };
        if let Some((step, f)) = provider {
            self.faults.arm(step, f);
        }
    }

    /// Drives the run; when its provider stalls, waits the fault's turns, then cancels the run
    /// or drops it.
    async fn drive(
        &self,
        activation: RunActivation,
        fault: Fault,
        cancel: &CancellationToken,
    ) -> Ended {
        let run = self.rt.run(activation, &self.recorder);
        tokio::pin!(run);
        let stalled = self.faults.stalled.notified();
        tokio::pin!(stalled);
        let first = tokio::select! {
            biased;
            out = &mut run => Some(out),
            () = &mut stalled => None,
        };
        if let Some(out) = first {
            return Ended::Returned(out);
        }
        let (Fault::StallCancel { turns, .. } | Fault::StallDrop { turns, .. }) = fault else {
            // A stall nobody planned: end it as a cancellation would.
            cancel.cancel();
            return Ended::Returned(run.await);
        };
        for _ in 0..turns {
            tokio::task::yield_now().await;
        }
        if matches!(fault, Fault::StallDrop { .. }) {
            return Ended::Dropped;
        }
        cancel.cancel();
        Ended::Returned(run.await)
    }

    /// Checks how the activation ended against its fault: its events, its termination, or why
    /// it could not start. Returns the outcome (`None`: dropped).
    fn judge_ending(
        &self,
        ended: Ended,
        fault: Fault,
        shape: Shape,
        problems: &mut Vec<String>,
    ) -> Option<Result<RunOutcome, RunError>> {
        let out = match ended {
            Ended::Dropped => return None,
            Ended::Returned(out) => out,
        };
        // The last commit lost: the run had ended as it would have, and says its end was not
        // written; any other run that ended is judged by its fault.
        let lost_last = self.loses_last_commit(fault, shape);
        let ended = match &out {
            Ok(outcome) => Some((outcome, fault)),
            Err(RunError::EndNotWritten { outcome, .. }) if lost_last => {
                Some((&**outcome, Fault::None))
            }
            Err(_) => None,
        };
        if let Some((outcome, fault)) = ended {
            match self.recorder.with_events(check::activation) {
                Ok(t) if t != outcome.termination => problems.push(format!(
                    "run_finish says {t}, the outcome {}",
                    outcome.termination
                )),
                Ok(_) => {}
                Err(e) => problems.push(e),
            }
            if let Err(e) = expected(fault, shape, outcome, self.extent(shape)) {
                problems.push(e);
            }
        } else if let Err(e) = &out {
            let first_commit_failed = matches!(fault, Fault::Store { at_commit: 1, .. })
                && matches!(
                    e,
                    RunError::Commit {
                        source: CommitError::Backend(StoreError::Injected { .. }),
                        ..
                    }
                );
            if !first_commit_failed {
                problems.push(format!("the run could not start: {e}"));
            }
            let emitted = self.recorder.with_events(<[_]>::len);
            if emitted > 0 {
                problems.push(format!("a run that did not start emitted {emitted} events"));
            }
        }
        Some(out)
    }

    fn extent(&self, shape: Shape) -> Option<Extent> {
        self.extents[shape_index(shape)]
    }

    /// Whether `fault` fails the last commit of a run of `shape`.
    fn loses_last_commit(&self, fault: Fault, shape: Shape) -> bool {
        matches!(fault, Fault::Store { at_commit, .. }
            if self.extent(shape).is_some_and(|e| at_commit == e.commits))
    }

    /// Continues the run the activation left unfinished and checks the continuation.
    async fn recover(
        &self,
        thread_id: &ThreadId,
        outcome: &Option<Result<RunOutcome, RunError>>,
        problems: &mut Vec<String>,
    ) {
        self.recorder.reset(None);
        let recovered = match self
            .rt
            .recover(&RecoverConfig::new("soak").with_limit(8), &self.recorder)
            .await
        {
            Ok(r) => r,
            Err(e) => return problems.push(format!("recover failed: {e}")),
        };
        let [one] = recovered.as_slice() else {
            return problems.push(format!(
                "recover continued {} runs, not this thread's one",
                recovered.len()
            ));
        };
        if one.thread_id != *thread_id {
            return problems.push(format!("recover continued a run of {}", one.thread_id));
        }
        let continued = match &one.outcome {
            Ok(o) => o,
            Err(e) => return problems.push(format!("the recovered run failed to start: {e}")),
        };
        match self.recorder.with_events(check::activation) {
            Ok(t) if t != continued.termination => problems.push(format!(
                "the recovery's run_finish says {t}, its outcome {}",
                continued.termination
            )),
            Ok(_) => {}
            Err(e) => problems.push(format!("the recovery's events: {e}")),
        }
        // A run whose only lost commit was its last ends as it had ended; a dropped one
        // finishes its steps.
        let wanted = match outcome {
            Some(Ok(o)) => o.termination.clone(),
            Some(Err(RunError::EndNotWritten { outcome, .. })) => outcome.termination.clone(),
            _ => TerminationReason::NaturalEnd,
        };
        if continued.termination != wanted {
            problems.push(format!(
                "the recovered run ended {}, not {wanted}",
                continued.termination
            ));
        }
    }
}

fn shape_index(shape: Shape) -> usize {
    match shape {
        Shape::Loop5 => 0,
        Shape::Loop50 => 1,
    }
}

/// How a run with `fault` must end.
fn expected(
    fault: Fault,
    shape: Shape,
    outcome: &RunOutcome,
    extent: Option<Extent>,
) -> Result<(), String> {
    let t = &outcome.termination;
    let natural = *t == TerminationReason::NaturalEnd
        && outcome.steps == shape.steps()
        && outcome.response.as_deref() == Some("done");
    let error = matches!(t, TerminationReason::Error { .. });
    let ok = match fault {
        Fault::None | Fault::StallTimeout { .. } => natural,
        Fault::Retryable { times, .. } if times <= MAX_RETRIES => natural,
        Fault::Retryable { .. } | Fault::Permanent { .. } | Fault::MidStream { .. } => error,
        Fault::Cancel { .. } => natural || *t == TerminationReason::Cancelled,
        Fault::StallCancel { .. } => *t == TerminationReason::Cancelled,
        // The last commit lost: the run says so (`RunError::EndNotWritten`).
        Fault::Store { at_commit, .. } if extent.is_some_and(|e| at_commit == e.commits) => false,
        Fault::Store { .. } => error,
        Fault::StallDrop { .. } => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "ended {t} after {} steps (response {:?})",
            outcome.steps, outcome.response
        ))
    }
}

/// The store fault's losses: the failed commit wrote nothing, and what was committed before
/// it is still there after the run (`after_run`: the thread as the run left it).
fn kept(
    before: Result<Holding, StoreError>,
    after_fault: Result<Holding, StoreError>,
    after_run: Option<&Holding>,
    run_id: Option<&awaken_event::RunId>,
) -> Result<(), String> {
    let before = before.map_err(|e| format!("reading the thread before the fault: {e}"))?;
    let after_fault =
        after_fault.map_err(|e| format!("reading the thread after the fault: {e}"))?;
    if before != after_fault {
        return Err("the failed commit wrote something".to_owned());
    }
    match after_run {
        Some(after_run) => check::kept(&before, after_run, run_id),
        None => Ok(()),
    }
}
