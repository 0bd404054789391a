//! [`Worker`]: claims queued jobs and drives them through its runtime, up to a concurrency
//! limit, under a lease it keeps with a heartbeat.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use awaken_event::{AgentEvent, CancellationToken, EventSink, RunId, ThreadId};
use awaken_runtime::{
    AgentRuntime, CheckpointError, RecoverConfig, RunError, ShutdownMode, Steering, Takeover,
};
use awaken_store::{
    ClaimedJob, CommitError, FleetWake, Hear, JobLease, QueueError, Retried, RunQueue, RunStatus,
    Timestamp,
};
use dashmap::DashMap;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::announce::Notifier;
use super::job::{Activation, JobPayload};
use super::steer::{Delivery, settle_unanswered};

/// How a [`Worker`] claims and drives jobs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Jobs driven at once (default 16).
    pub concurrency: usize,
    /// How often the queue is read when no notification came (default 1 s); a job due or a
    /// lease expiring sooner is looked for at its time.
    pub poll_interval: Duration,
    /// The wait before a failed job's next attempt, doubled per attempt (default 1 s, at most
    /// 60 s).
    pub retry_backoff: Duration,
    /// On shutdown, how long the jobs held get to end by themselves before they are stopped at
    /// their last checkpoint and given back (default 10 s); a stop, and the release of the
    /// runs' leases after it, get as long again before they are abandoned (the leases expire).
    pub drain_grace: Duration,
    /// Only jobs of these agents (none: every agent).
    pub agents: Option<Vec<String>>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            concurrency: 16,
            poll_interval: Duration::from_secs(1),
            retry_backoff: Duration::from_secs(1),
            drain_grace: Duration::from_secs(10),
            agents: None,
        }
    }
}

/// Why a [`Worker`] cannot be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The runtime has no worker identity, so its runs would hold no lease and a dead
    /// worker's runs could not be taken over.
    #[error(
        "the runtime has no worker identity (AgentRuntimeBuilder::with_worker): a fleet worker's runs must hold leases"
    )]
    NoLease,
}

/// What a worker did, counted since it started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Jobs whose activation ended (finished, suspended or cancelled).
    pub completed: u64,
    /// Jobs given back after a failed attempt, to be tried again.
    pub retried: u64,
    /// Jobs dead-lettered.
    pub dead: u64,
    /// Jobs given back unfinished on shutdown.
    pub released: u64,
    /// Jobs whose lease was lost (another worker took them over), or abandoned on shutdown
    /// when they did not stop in time (their lease expires, and another worker takes them).
    pub lost: u64,
}

/// Claims jobs from a [`RunQueue`] and drives them: a new run, decisions for a waiting run, or
/// the continuation of a run whose worker stopped (through the runtime's recovery: a
/// `Requested` call is gated again, an `Executing` side-effecting call is closed as outcome
/// unknown). Its runtime's worker identity names the job leases and the run leases.
pub struct Worker {
    runtime: AgentRuntime,
    queue: RunQueue,
    config: WorkerConfig,
    worker_id: String,
    lease: Duration,
    /// Milliseconds from each claim to its run's first stored event, most recent last.
    start_latencies: Arc<Mutex<VecDeque<u32>>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("worker_id", &self.worker_id)
            .finish_non_exhaustive()
    }
}

/// How often a job looks again at a run whose lease another worker holds.
const HELD_RETRY: Duration = Duration::from_millis(100);

/// The most claim-to-start latencies a worker keeps.
const LATENCIES_KEPT: usize = 100_000;

impl Worker {
    /// A worker driving `queue`'s jobs through `runtime`, which must have a worker identity.
    pub fn new(
        runtime: AgentRuntime,
        queue: RunQueue,
        config: WorkerConfig,
    ) -> Result<Self, WorkerError> {
        let (worker_id, lease) = runtime
            .worker()
            .map(|(id, lease)| (id.to_owned(), lease))
            .ok_or(WorkerError::NoLease)?;
        Ok(Self {
            runtime,
            queue,
            config,
            worker_id,
            lease,
            start_latencies: Arc::default(),
        })
    }

    /// The milliseconds from claiming each job to its run's first stored event, as measured
    /// so far (at most the latest 100,000).
    pub fn claim_to_start_ms(&self) -> Vec<u32> {
        self.start_latencies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect()
    }

    /// Claims and drives jobs until `shutdown` completes, then drains: claims no more, gives
    /// the jobs held `drain_grace` to end, stops the others at their last checkpoint and gives
    /// their leases back (the next worker continues them at once). A stop or a release that
    /// takes longer than `drain_grace` again is abandoned (the leases expire), so the drain
    /// always ends.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> WorkerReport {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut listener = self.queue.listen(Hear::Jobs);
        // Listening before the first claim: a job queued after it is announced, not missed.
        tokio::select! {
            () = listener.ready() => {}
            () = &mut shutdown => return WorkerReport::default(),
        }
        // Its connections opened and the jobs' statements prepared and planned on each before
        // the first claim, so the first jobs wait for neither; without them, both are done at
        // first use.
        tokio::select! {
            biased;
            warmed = self.queue.warm_up(self.config.concurrency) => {
                if let Err(e) = warmed {
                    tracing::warn!(error = %e, "run queue: cannot open the connections ahead");
                }
            }
            () = &mut shutdown => return WorkerReport::default(),
        }
        let notifier = Notifier::start(self.queue.clone());
        let held: Arc<Held> = Arc::default();
        let stop = CancellationToken::new();
        let mut jobs: JoinSet<JobEnd> = JoinSet::new();
        let mut report = WorkerReport::default();
        let mut failures = 0u32;
        'claiming: loop {
            let free = self.config.concurrency.saturating_sub(jobs.len());
            let mut wait = self.config.poll_interval;
            if free > 0 {
                let now = Timestamp::now();
                // A queue that does not answer must not keep the worker from draining. A claim
                // cut short may still be made: its jobs are taken over after their lease.
                let claimed = tokio::select! {
                    biased;
                    claimed = self.claim(now, free) => claimed,
                    () = &mut shutdown => break 'claiming,
                };
                match claimed {
                    Ok(claimed) => {
                        failures = 0;
                        let all = claimed.len() == free;
                        for job in claimed {
                            let (poke, beat) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
                            held.insert(
                                job.thread_id.clone(),
                                HeldJob {
                                    lease: job.lease.clone(),
                                    beat: Arc::clone(&beat),
                                    steer: Arc::clone(&poke),
                                },
                            );
                            let drive = Drive {
                                worker: self.clone_parts(),
                                notifier: notifier.clone(),
                                held: Arc::clone(&held),
                                cancel: CancellationToken::new(),
                                steer: poke,
                                beat,
                                stop: stop.clone(),
                                claimed_at: Instant::now(),
                            };
                            jobs.spawn(drive.job(job));
                        }
                        if all {
                            continue;
                        }
                        wait = tokio::select! {
                            biased;
                            wait = self.until_due(now) => wait,
                            () = &mut shutdown => break 'claiming,
                        };
                    }
                    Err(e) => {
                        failures = failures.saturating_add(1);
                        tracing::warn!(error = %e, "run queue: cannot claim jobs");
                        wait = backoff(Duration::from_millis(100), failures)
                            .min(Duration::from_secs(5));
                    }
                }
            }
            // The queue is read again for a job announced (or announcements maybe missed), a
            // job's end or the time one is due; not for the stream of other threads' events
            // every commit in the fleet announces, which would make each a claim per worker.
            let until = tokio::time::Instant::now() + wait;
            loop {
                tokio::select! {
                    () = &mut shutdown => break 'claiming,
                    wake = listener.recv() => match wake {
                        FleetWake::Cancel(thread) => {
                            // The notification names the thread: the job held may be a later
                            // one than the job cancelled, so the job's own flag, read by its
                            // heartbeat, decides.
                            if let Some(entry) = held.get(&thread) {
                                entry.beat.notify_one();
                            }
                        }
                        FleetWake::Steer(thread) => {
                            if let Some(entry) = held.get(&thread) {
                                entry.steer.notify_one();
                            }
                        }
                        FleetWake::Events(_) | FleetWake::Done(_) | FleetWake::Steered(_) => {}
                        FleetWake::Lost => {
                            // A steering message announced meanwhile may wait.
                            held.iter().for_each(|entry| entry.steer.notify_one());
                            break;
                        }
                        _ => break,
                    },
                    Some(end) = jobs.join_next(), if !jobs.is_empty() => {
                        report.count(end);
                        break;
                    }
                    () = tokio::time::sleep_until(until) => break,
                }
            }
        }
        tracing::info!(jobs = jobs.len(), "draining: claiming no more jobs");
        let grace = self.config.drain_grace;
        if !report.count_ends(&mut jobs, grace).await {
            tracing::warn!(
                jobs = jobs.len(),
                "grace period over: stopping the jobs held at their last checkpoint"
            );
            stop.cancel();
            if !report.count_ends(&mut jobs, grace).await {
                // A store that does not answer: their leases expire instead.
                tracing::warn!(
                    jobs = jobs.len(),
                    "the jobs did not stop in time: abandoning them"
                );
                jobs.abort_all();
                while let Some(end) = jobs.join_next().await {
                    report.count(end);
                }
            }
        }
        // The commits of the last moments are announced before the worker goes.
        if tokio::time::timeout(self.config.drain_grace, notifier.close())
            .await
            .is_err()
        {
            tracing::warn!("the last new events were not announced in time");
        }
        let shut = self
            .runtime
            .shutdown_within(ShutdownMode::Wait, self.config.drain_grace)
            .await;
        if !shut {
            tracing::warn!("the runs' leases were not all released in time: they expire instead");
        }
        report
    }

    async fn claim(
        &self,
        now: Timestamp,
        free: usize,
    ) -> Result<Vec<ClaimedJob>, awaken_store::StoreError> {
        self.queue
            .claim(
                &self.worker_id,
                self.lease,
                now,
                free,
                self.config.agents.as_deref(),
            )
            .await
    }

    /// How long to wait for the next job: until the soonest one not claimable now becomes so,
    /// at most the poll interval.
    async fn until_due(&self, now: Timestamp) -> Duration {
        let poll = self.config.poll_interval;
        match self
            .queue
            .next_due(now, self.config.agents.as_deref())
            .await
        {
            Ok(Some(due)) => {
                let ms = due.as_unix_millis().saturating_sub(now.as_unix_millis());
                // A job due now was taken by another worker between the two reads: look again
                // soon rather than at once.
                Duration::from_millis(u64::try_from(ms).unwrap_or(0).max(5)).min(poll)
            }
            Ok(None) => poll,
            Err(e) => {
                tracing::warn!(error = %e, "run queue: cannot read when the next job is due");
                poll
            }
        }
    }

    fn clone_parts(&self) -> Parts {
        Parts {
            runtime: self.runtime.clone(),
            queue: self.queue.clone(),
            worker_id: self.worker_id.clone(),
            lease: self.lease,
            retry_backoff: self.config.retry_backoff,
            start_latencies: Arc::clone(&self.start_latencies),
        }
    }
}

impl WorkerReport {
    /// Counts the jobs' ends as they come, for at most `within`; whether all ended.
    async fn count_ends(&mut self, jobs: &mut JoinSet<JobEnd>, within: Duration) -> bool {
        tokio::time::timeout(within, async {
            while let Some(end) = jobs.join_next().await {
                self.count(end);
            }
        })
        .await
        .is_ok()
    }

    fn count(&mut self, end: Result<JobEnd, tokio::task::JoinError>) {
        match end {
            Ok(JobEnd::Completed) => self.completed += 1,
            Ok(JobEnd::Retried) => self.retried += 1,
            Ok(JobEnd::Dead) => self.dead += 1,
            Ok(JobEnd::Released) => self.released += 1,
            Ok(JobEnd::Lost) => self.lost += 1,
            // Abandoned on shutdown: its lease expires and another worker takes it over.
            Err(e) if e.is_cancelled() => self.lost += 1,
            // A job task that panicked: its lease expires and another worker takes it over.
            Err(e) => {
                tracing::error!(error = %e, "a job's task failed");
                self.lost += 1;
            }
        }
    }
}

/// `base` doubled `n - 1` times.
fn backoff(base: Duration, n: u32) -> Duration {
    base.saturating_mul(1u32 << n.saturating_sub(1).min(16))
}

/// Claims the thread's job if no worker has yet, marked cancelled, under the worker identity
/// of `runtime` (for an agent it serves), and drives it to its end as a worker would: its run
/// ends `Cancelled` at its first step, its steering messages are refused, the queue is told
/// and its events are announced. The job's run once the job left the queue; `None` when
/// there was no such job or it is left to a worker (the store failed meanwhile).
pub(crate) async fn end_unclaimed(
    runtime: AgentRuntime,
    queue: RunQueue,
    thread: ThreadId,
) -> Result<Option<RunId>, awaken_store::StoreError> {
    let Some((worker_id, lease)) = runtime.worker().map(|(id, lease)| (id.to_owned(), lease))
    else {
        return Ok(None);
    };
    let agents = runtime.resolver().registries().agent_ids();
    let Some(job) = queue
        .claim_unclaimed(&thread, &worker_id, lease, Timestamp::now(), &agents)
        .await?
    else {
        return Ok(None);
    };
    tracing::debug!(%thread, job_id = %job.lease.job_id, "cancelling a job no worker has claimed");
    let run_id = job.run_id.clone();
    let notifier = Notifier::start(queue.clone());
    let cancel = CancellationToken::new();
    cancel.cancel();
    let drive = Drive {
        worker: Parts {
            runtime,
            queue,
            worker_id,
            lease,
            retry_backoff: WorkerConfig::default().retry_backoff,
            start_latencies: Arc::default(),
        },
        notifier: notifier.clone(),
        held: Arc::default(),
        cancel,
        steer: Arc::default(),
        beat: Arc::default(),
        stop: CancellationToken::new(),
        claimed_at: Instant::now(),
    };
    let end = drive.job(job).await;
    notifier.close().await;
    Ok(matches!(end, JobEnd::Completed).then_some(run_id))
}

/// What a job task needs of its worker.
#[derive(Clone)]
struct Parts {
    runtime: AgentRuntime,
    queue: RunQueue,
    worker_id: String,
    lease: Duration,
    retry_backoff: Duration,
    start_latencies: Arc<Mutex<VecDeque<u32>>>,
}

/// How a job's task ended.
enum JobEnd {
    Completed,
    Retried,
    Dead,
    Released,
    Lost,
}

/// One claimed job being driven.
struct Drive {
    worker: Parts,
    notifier: Notifier,
    held: Arc<Held>,
    /// Cancels the job's run (a cancel request).
    cancel: CancellationToken,
    /// Woken when steering messages wait for the job.
    steer: Arc<Notify>,
    /// Makes the job's heartbeat beat now (a cancel was notified for its thread).
    beat: Arc<Notify>,
    /// Stops the job at its last checkpoint (the worker's drain).
    stop: CancellationToken,
    claimed_at: Instant,
}

/// Each job this worker drives, by its thread.
type Held = DashMap<ThreadId, HeldJob>;

/// A job this worker drives: the claim, what makes its heartbeat beat now, what wakes its
/// steering.
struct HeldJob {
    lease: JobLease,
    beat: Arc<Notify>,
    steer: Arc<Notify>,
}

/// How an attempt ended, before the queue is told.
enum Attempt {
    /// The activation ended (or had already): the job is done.
    Done,
    /// It failed: try again later, or dead-letter it when `fatal`.
    Failed { error: String, fatal: bool },
}

impl Drive {
    /// Forgets the cancel of `thread`'s job if it is still this claim's: after a lease lost
    /// to this same worker's next claim of the job, the entry is that claim's.
    fn unhold(&self, thread: &ThreadId, lease: &JobLease) {
        self.held.remove_if(thread, |_, held| held.lease == *lease);
    }

    /// Drives `job` with its lease kept alive; tells the queue how it ended.
    async fn job(self, job: ClaimedJob) -> JobEnd {
        let lease = job.lease.clone();
        let thread = job.thread_id.clone();
        let lost = CancellationToken::new();
        let beat = tokio::spawn(heartbeat(
            self.worker.queue.clone(),
            lease.clone(),
            self.worker.lease,
            (self.cancel.clone(), Arc::clone(&self.steer)),
            Arc::clone(&self.beat),
            lost.clone(),
        ));
        let _beat = AbortOnDrop(beat);
        let inbox = Steering::new();
        let mut delivery = Delivery::new(
            self.worker.queue.clone(),
            lease.clone(),
            inbox.clone(),
            Arc::clone(&self.steer),
        );
        if job.steering {
            // Before the first step, which takes what waits.
            delivery.deliver().await;
        }
        let end = tokio::select! {
            attempt = self.attempt(&job, &inbox) => Some(attempt),
            never = delivery.run() => match never {},
            () = lost.cancelled() => None,
            () = self.stop.cancelled() => {
                self.unhold(&thread, &lease);
                return match self.worker.queue.release(&lease).await {
                    Ok(_) => JobEnd::Released,
                    Err(e) => {
                        tracing::warn!(%thread, error = %e, "cannot give a job back; its lease expires instead");
                        JobEnd::Released
                    }
                };
            }
        };
        self.unhold(&thread, &lease);
        let Some(attempt) = end else {
            tracing::warn!(%thread, job = %lease.job_id, "job lease lost: another worker has it");
            return JobEnd::Lost;
        };
        let queue = &self.worker.queue;
        // Steering messages not answered yet are answered now if no claim of the job is to
        // come (another claim is handed them again).
        let handed = delivery.finish().await;
        let last = match &attempt {
            Attempt::Done | Attempt::Failed { fatal: true, .. } => true,
            Attempt::Failed { fatal: false, .. } => job.attempts >= job.max_attempts,
        };
        if last
            && (handed || job.steering)
            && let Err(e) = settle_unanswered(&self.worker.runtime, queue, &job).await
        {
            tracing::warn!(%thread, error = %e, "cannot answer the job's steering messages; it is taken over after its lease");
            return JobEnd::Lost;
        }
        let told = match attempt {
            Attempt::Done => {
                awaken_runtime::failpoint::hit("before_job_end", None);
                queue.complete(&lease).await.map(|()| JobEnd::Completed)
            }
            Attempt::Failed { error, fatal: true } => {
                tracing::warn!(%thread, job = %lease.job_id, %error, "job failed: dead-lettered");
                queue
                    .dead_letter(&lease, &error, Timestamp::now())
                    .await
                    .map(|()| JobEnd::Dead)
            }
            Attempt::Failed {
                error,
                fatal: false,
            } => {
                let due = Timestamp::now().saturating_add(
                    backoff(self.worker.retry_backoff, lease.attempt).min(Duration::from_secs(60)),
                );
                let retried = queue.retry(&lease, &error, due, Timestamp::now()).await;
                match &retried {
                    Ok(Retried::Requeued(_)) => {
                        tracing::warn!(%thread, job = %lease.job_id, %error, "job failed: retried later")
                    }
                    Ok(Retried::Dead) => {
                        tracing::warn!(%thread, job = %lease.job_id, %error, "job failed its last attempt: dead-lettered")
                    }
                    Err(_) => {}
                }
                retried.map(|r| match r {
                    Retried::Requeued(_) => JobEnd::Retried,
                    Retried::Dead => JobEnd::Dead,
                })
            }
        };
        match told {
            Ok(end) => end,
            Err(QueueError::Lost { .. }) => JobEnd::Lost,
            // The job stays claimed until its lease expires; then it is taken over, and its
            // run's checkpoint says what is left.
            Err(QueueError::Backend(e)) => {
                tracing::warn!(%thread, error = %e, "cannot record a job's end; it is taken over after its lease");
                JobEnd::Lost
            }
        }
    }

    /// One attempt at `job`: first continues the job's own run if its worker is gone (another
    /// run the thread was left with, by a job given up on or a stopped process, is ended
    /// `Cancelled` at its checkpoint instead), then starts the job's activation unless its run
    /// already had it.
    ///
    /// A job claimed again after its last attempt is given up (dead-lettered), after the run
    /// its last worker left `Running` is ended `Cancelled` at its checkpoint, so no later run
    /// of the thread goes on with it; if that attempt had in fact ended the activation (its
    /// worker stopped before telling the queue), the job is done.
    async fn attempt(&self, job: &ClaimedJob, inbox: &Steering) -> Attempt {
        let exhausted = job.attempts > job.max_attempts;
        let gave_up = || Attempt::Failed {
            error: format!(
                "gave up after {} attempts; last: {}",
                job.max_attempts,
                job.last_error.as_deref().unwrap_or("its worker stopped")
            ),
            fatal: true,
        };
        let payload: JobPayload = match serde_json::from_value(job.payload.clone()) {
            Ok(p) => p,
            Err(e) => {
                return Attempt::Failed {
                    error: format!("the job's payload does not decode: {e}"),
                    fatal: true,
                };
            }
        };
        if job.cancel_requested || exhausted {
            self.cancel.cancel();
        }
        let runtime = &self.worker.runtime;
        let sink = FleetSink {
            notifier: &self.notifier,
            thread: &job.thread_id,
            claimed_at: self.claimed_at,
            started: std::sync::atomic::AtomicBool::new(false),
            latencies: &self.worker.start_latencies,
        };
        let recover = RecoverConfig::new(self.worker.worker_id.clone())
            .with_lease_duration(self.worker.lease)
            .with_cancel(self.cancel.clone());
        let latest = loop {
            let steering = inbox.clone();
            match runtime
                .take_over_steered(&job.thread_id, &recover, &job.run_id, steering, &sink)
                .await
            {
                Ok(Takeover::Recovered(run)) => {
                    if run.run_id == job.run_id {
                        return match run.outcome {
                            // Ended cancelled at its checkpoint: the job can die now.
                            Ok(_) if exhausted => gave_up(),
                            outcome => attempt_of(outcome.map(|_| ())),
                        };
                    }
                    if let Err(e) = run.outcome {
                        return attempt_of(Err(e));
                    }
                }
                Ok(Takeover::Held { .. }) => {
                    // Its worker drives it, or died and its lease has not expired yet: claims
                    // are cheap, so look again shortly.
                    tokio::time::sleep(HELD_RETRY).await;
                }
                Ok(Takeover::Nothing { latest }) => break latest,
                Ok(_) => {
                    return Attempt::Failed {
                        error: "unexpected takeover outcome".to_owned(),
                        fatal: false,
                    };
                }
                Err(e) => return attempt_of(Err(e)),
            }
        };
        let ran = latest.as_ref().is_some_and(|r| r.run_id == job.run_id);
        match payload.activation(
            job.thread_id.clone(),
            job.run_id.clone(),
            &job.agent_id,
            self.cancel.clone(),
        ) {
            // The run exists: an earlier attempt started it, and it ended or waits.
            Activation::Run(_) if ran => Attempt::Done,
            _ if exhausted && !ran => gave_up(),
            Activation::Run(activation) => {
                let activation = activation.with_steering(inbox.clone());
                attempt_of(runtime.run(activation, &sink).await.map(|_| ()))
            }
            Activation::Resume(resume) => {
                let mut resume = resume.with_steering(inbox.clone());
                let waiting = latest
                    .as_ref()
                    .is_some_and(|r| r.run_id == job.run_id && r.status == RunStatus::Waiting);
                if !waiting {
                    // An earlier attempt applied the decisions (the run went on from there).
                    return Attempt::Done;
                }
                let still = match runtime.waiting_calls(&job.thread_id).await {
                    Ok(t) => t,
                    Err(e) => return attempt_of(Err(e)),
                };
                resume
                    .decisions
                    .retain(|d| still.iter().any(|t| t.call.call_id == d.call_id));
                if resume.decisions.is_empty() {
                    return Attempt::Done;
                }
                if exhausted {
                    return gave_up();
                }
                attempt_of(runtime.resume(resume, &sink).await.map(|_| ()))
            }
        }
    }
}

/// An attempt's end from the runtime's answer: a store that failed or a run held elsewhere is
/// tried again (a run whose end was not written too: the next attempt continues it from its
/// last checkpoint); anything else fails the same way every time.
fn attempt_of(result: Result<(), RunError>) -> Attempt {
    match result {
        Ok(()) => Attempt::Done,
        Err(e) => Attempt::Failed {
            fatal: !retried(&e),
            error: e.to_string(),
        },
    }
}

/// Whether an attempt that failed with `e` is tried again.
fn retried(e: &RunError) -> bool {
    match e {
        RunError::Store(_)
        | RunError::TakenOver { .. }
        | RunError::ThreadBusy { .. }
        | RunError::ShuttingDown => true,
        RunError::Commit { source, .. } => {
            !source.is_refusal() || matches!(source, CommitError::LeaseLost { .. })
        }
        // The run is left unfinished at its checkpoint: the next attempt continues it, unless
        // its end was refused for good (an invalid commit).
        RunError::EndNotWritten { source, .. } => match source {
            CheckpointError::Commit(c) => !c.is_refusal() || c.is_conflict(),
            CheckpointError::Store(_) => true,
            _ => false,
        },
        _ => false,
    }
}

/// Renews `lease` every third of its duration, and at once when `now` is woken: a requested
/// cancel cancels `cancel`; steering messages waiting wake `steer` (in case their notification
/// was lost); a lost lease cancels `lost` (the job is another worker's now).
async fn heartbeat(
    queue: RunQueue,
    lease: JobLease,
    duration: Duration,
    (cancel, steer): (CancellationToken, Arc<Notify>),
    now: Arc<Notify>,
    lost: CancellationToken,
) {
    let every = (duration / 3).max(Duration::from_millis(10));
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = now.notified() => {}
        }
        match queue.heartbeat(&lease, duration, Timestamp::now()).await {
            Ok(beat) => {
                if beat.cancel_requested && !cancel.is_cancelled() {
                    tracing::info!(job = %lease.job_id, "cancel requested: cancelling the run");
                    cancel.cancel();
                }
                if beat.steering_waiting {
                    steer.notify_one();
                }
            }
            Err(QueueError::Lost { .. }) => {
                lost.cancel();
                return;
            }
            Err(e) => tracing::warn!(job = %lease.job_id, error = %e, "job heartbeat failed"),
        }
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The sink of a job's run: announces the thread's commits to the front ends following it,
/// and measures the claim-to-start latency.
struct FleetSink<'a> {
    notifier: &'a Notifier,
    thread: &'a ThreadId,
    claimed_at: Instant,
    started: std::sync::atomic::AtomicBool,
    latencies: &'a Mutex<VecDeque<u32>>,
}

impl EventSink for FleetSink<'_> {
    fn emit(&self, _event: &AgentEvent) {}

    fn emit_stored(&self, _event: &AgentEvent, _seq: u64) {
        if !self
            .started
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            let ms = u32::try_from(self.claimed_at.elapsed().as_millis()).unwrap_or(u32::MAX);
            let mut kept = self.latencies.lock().unwrap_or_else(|e| e.into_inner());
            if kept.len() >= LATENCIES_KEPT {
                kept.pop_front();
            }
            kept.push_back(ms);
        }
    }

    fn committed(&self, _last_seq: u64) {
        self.notifier.touch(self.thread);
    }
}

#[cfg(test)]
mod tests {
    use awaken_event::{RunId, TerminationReason};
    use awaken_runtime::RunOutcome;
    use awaken_store::StoreError;

    use super::*;

    #[test]
    fn a_run_whose_end_was_not_written_is_tried_again_unless_its_end_is_invalid() {
        let thread = ThreadId::new("t").expect("id");
        let unwritten = |source: CheckpointError| RunError::EndNotWritten {
            thread_id: thread.clone(),
            outcome: Box::new(RunOutcome {
                run_id: RunId::new("r").expect("id"),
                termination: TerminationReason::NaturalEnd,
                response: None,
                steps: 1,
                usage: Default::default(),
            }),
            source,
        };
        let failed = || StoreError::Task {
            detail: "the database went away".into(),
        };
        let cases = [
            (unwritten(CheckpointError::Commit(failed().into())), true),
            (unwritten(CheckpointError::Store(failed())), true),
            (
                unwritten(CheckpointError::Commit(CommitError::VersionConflict {
                    expected: 1,
                    actual: 2,
                })),
                true,
            ),
            (
                unwritten(CheckpointError::Commit(CommitError::Invalid {
                    thread_id: thread.clone(),
                    violation: awaken_store::CommitViolation::ProfileStateWithoutProfile,
                })),
                false,
            ),
            (
                RunError::TakenOver {
                    thread_id: thread.clone(),
                    run_id: RunId::new("r").expect("id"),
                },
                true,
            ),
        ];
        for (e, again) in cases {
            assert_eq!(retried(&e), again, "{e}");
        }
    }
}
