//! A front end of the fleet: the server queues its activations in the run queue instead of
//! driving them, and follows each one's stored events into a live run of its own, so the
//! streams, `Last-Event-ID` reconnection, the protocol edges and cancel work as they do for a
//! run in this process, whichever worker drives it.

use std::sync::Arc;

use awaken_event::{AgentEvent, CancellationToken, Message, RunId, ThreadId};
use awaken_store::{Enqueued, JobId, JobState, NewJob, RunStatus, SteerAnswer, Timestamp};
use serde_json::json;
use tokio::sync::OwnedSemaphorePermit;

use super::job::JobPayload;
use super::queued::Front;
use crate::app::AgentServer;
use crate::error::ApiError;
use crate::error::store_failed;
use crate::job::Job;
use crate::live::LiveRun;

/// Queues `job` for `live`'s thread and follows it into `live`: 409 when the thread already
/// has a queued or claimed job (unless a run supersedes it: the job is cancelled and waited
/// for first; or its run has ended and only the job's end is left: that is waited for, up to
/// 5 s), or waits for decisions and the run does not supersede them.
pub(crate) async fn enqueue(
    server: &AgentServer,
    front: &Arc<Front>,
    live: &Arc<LiveRun>,
    permit: OwnedSemaphorePermit,
    cancel: CancellationToken,
    job: Job,
) -> Result<(), ApiError> {
    let thread = &live.thread_id;
    let supersede = matches!(&job, Job::Run(activation) if activation.supersede);
    // One wait in all, however many jobs the thread turns out to hold meanwhile.
    let deadline = tokio::time::Instant::now() + server.shared.config.cancel_wait;
    // A start right after the thread's run ended waits for its job to leave the queue, once.
    let mut waited = false;
    let (enqueued, run_id) = loop {
        let (enqueued, run_id) = queue_once(server, front, thread, &job).await?;
        match enqueued {
            Enqueued::ThreadBusy(held) if supersede => {
                superseded(server, front, thread, held, deadline).await?;
            }
            Enqueued::ThreadBusy(held)
                if !waited && ending(server, front, thread, held).await? =>
            {
                waited = true;
                let finishing = tokio::time::Instant::now() + crate::live::FINISHING_WAIT;
                job_gone(server, front, held, finishing, || busy(thread, held)).await?;
            }
            enqueued => break (enqueued, run_id),
        }
    };
    match enqueued {
        Enqueued::Queued {
            job_id,
            after_event: after,
        } => {
            tracing::debug!(%thread, %job_id, %run_id, "run queued");
            let follower = Follower {
                server: server.clone(),
                front: Arc::clone(front),
                live: Arc::clone(live),
                job_id,
                run_id,
                start: after,
                after,
                cancel,
            };
            live.set_task(tokio::spawn(follower.follow(Some(permit))));
            Ok(())
        }
        Enqueued::ThreadBusy(job_id) => Err(busy(thread, job_id)),
    }
}

/// 409: the thread has a queued or claimed job.
fn busy(thread: &ThreadId, job_id: JobId) -> ApiError {
    ApiError::conflict(
        "thread_busy",
        format!("thread `{thread}` has a queued or running run ({job_id})"),
    )
}

/// Queues `job` as the thread stands now: what the queue did (with, for a queued job, where its
/// events start) and the job's run.
async fn queue_once(
    server: &AgentServer,
    front: &Front,
    thread: &ThreadId,
    job: &Job,
) -> Result<(Enqueued, RunId), ApiError> {
    let runtime = &server.shared.runtime;
    let checkpoint = runtime
        .store()
        .load_checkpoint(thread)
        .await
        .map_err(store_failed)?;
    let after = checkpoint.as_ref().map_or(0, |c| c.last_event_seq);
    let latest = checkpoint.as_ref().and_then(|c| c.run.as_ref());
    let (run_id, agent, payload) = match job {
        Job::Run(activation) => {
            if latest.is_some_and(|r| r.status == RunStatus::Waiting) && !activation.supersede {
                return Err(ApiError::conflict(
                    "thread_waiting",
                    format!(
                        "thread `{thread}` waits for decisions on its calls: decide them, or start a run with `supersede`"
                    ),
                ));
            }
            (
                runtime.next_run_id(),
                activation.agent_id.clone(),
                JobPayload::of_run(activation),
            )
        }
        Job::Resume(resume) => {
            let Some(run) = latest else {
                return Err(ApiError::conflict(
                    "not_waiting",
                    format!("thread `{thread}` has no run waiting for a decision"),
                ));
            };
            (
                run.run_id.clone(),
                run.agent_id.to_string(),
                JobPayload::of_resume(resume),
            )
        }
    };
    let payload = serde_json::to_value(&payload)
        .map_err(|e| ApiError::internal("unqueueable", format!("the run cannot be queued: {e}")))?;
    let mut new = NewJob::new(thread.clone(), run_id.clone(), agent, payload);
    new.max_attempts = front.config.max_attempts;
    new.after_event = after;
    let enqueued = front
        .queue
        .enqueue(&new, Timestamp::now())
        .await
        .map_err(store_failed)?;
    Ok((enqueued, run_id))
}

/// How a cancel reached the thread's job.
pub(crate) enum JobCancel {
    /// No worker had claimed it: this server ended its run (this one) `Cancelled` and the job
    /// is gone.
    Ended(RunId),
    /// The queue asks its worker (or the worker that claims it) to cancel it.
    Asked,
}

/// Cancels the thread's job: one no worker has claimed yet is claimed here and its run ended
/// `Cancelled` at once, as a worker would (when this server's runtime has a worker identity),
/// so the cancel does not wait for a free worker; any other is asked to stop through the queue.
/// `None` when the thread has no job.
pub(crate) async fn cancel_job(
    server: &AgentServer,
    front: &Front,
    thread: &ThreadId,
) -> Result<Option<JobCancel>, awaken_store::StoreError> {
    // The claim and the run on a task of their own: a request going away leaves no job
    // claimed and not driven.
    let ending = tokio::spawn(super::worker::end_unclaimed(
        server.shared.runtime.clone(),
        front.queue.clone(),
        thread.clone(),
    ));
    // Bounded: a thread's earlier run held elsewhere keeps the job waiting for its lease.
    match tokio::time::timeout(server.shared.config.cancel_wait, ending).await {
        Ok(Ok(Ok(Some(run_id)))) => return Ok(Some(JobCancel::Ended(run_id))),
        Ok(Ok(Ok(None))) => {}
        Ok(Ok(Err(e))) => return Err(e),
        Ok(Err(join)) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        // The runtime is shutting down, or the wait ran out: the job, claimed and marked
        // cancelled (or not claimed here), is ended by whoever holds or claims it next.
        Ok(Err(_)) | Err(_) => {}
    }
    Ok(front
        .queue
        .request_cancel(thread)
        .await?
        .map(|_| JobCancel::Asked))
}

/// Cancels the thread's job (`held`, unless it ended meanwhile: then the one that took its
/// place), which a start supersedes, and waits until `held` has ended (its run ended cancelled
/// at its checkpoint): busy if it has not by `deadline`, 503 if the server shuts down
/// meanwhile. The cancel stands either way.
async fn superseded(
    server: &AgentServer,
    front: &Front,
    thread: &ThreadId,
    held: JobId,
    deadline: tokio::time::Instant,
) -> Result<(), ApiError> {
    cancel_job(server, front, thread)
        .await
        .map_err(store_failed)?;
    job_gone(server, front, held, deadline, || {
        ApiError::conflict(
            "thread_busy",
            format!("thread `{thread}`'s run did not end within the cancel's wait"),
        )
    })
    .await
}

/// Whether `held`, the thread's job, is ending: its run has stored its end (finished, or
/// waiting for decisions), and only its worker's word to the queue is left; or it is gone.
async fn ending(
    server: &AgentServer,
    front: &Front,
    thread: &ThreadId,
    held: JobId,
) -> Result<bool, ApiError> {
    let job = front
        .queue
        .job_of_thread(thread)
        .await
        .map_err(store_failed)?;
    let job = match job {
        Some(job) if job.job_id == held => job,
        // Another job took its place (busy), or it is gone (the next look queues).
        other => return Ok(other.is_none()),
    };
    let latest = server
        .shared
        .runtime
        .store()
        .latest_run(thread)
        .await
        .map_err(store_failed)?;
    Ok(latest.is_some_and(|r| r.run_id == job.run_id && r.status != RunStatus::Running))
}

/// Waits until `held` has left the queue (ended, or dead-lettered): `late()` if it has not by
/// `deadline`, 503 if the server shuts down meanwhile.
async fn job_gone(
    server: &AgentServer,
    front: &Front,
    held: JobId,
    deadline: tokio::time::Instant,
    late: impl Fn() -> ApiError,
) -> Result<(), ApiError> {
    let shared = &server.shared;
    loop {
        match front.queue.job_state(held).await.map_err(store_failed)? {
            JobState::Gone | JobState::Dead { .. } => return Ok(()),
            _ => {}
        }
        tokio::select! {
            () = tokio::time::sleep(SUPERSEDE_POLL) => {}
            () = tokio::time::sleep_until(deadline) => return Err(late()),
            () = shared.closing.cancelled() => {
                return Err(ApiError::unavailable(
                    "shutting_down",
                    "the server is shutting down",
                    shared.config.retry_after,
                ));
            }
        }
    }
}

/// Stores `message` for the thread's queued or claimed job, whose worker hands it to the run,
/// and waits for its answer: the step that took it, or `None` when the run (or its job) ended
/// without taking it. 409 when the thread has no job; 503 if the server shuts down meanwhile.
pub(crate) async fn steer(
    server: &AgentServer,
    front: &Arc<Front>,
    thread: &ThreadId,
    message: Message,
) -> Result<Option<u32>, ApiError> {
    let shared = &server.shared;
    let waiter = SteeredWaiter {
        front,
        thread,
        notify: front.steered_waiter(thread, &shared.closing),
    };
    let stored = front.queue.steer(thread, &message, Timestamp::now()).await;
    let Some(id) = stored.map_err(store_failed)? else {
        return Err(ApiError::conflict(
            "not_running",
            format!("thread `{thread}` has no queued or running run: start a run with the message"),
        ));
    };
    loop {
        // Registered before the look: an answer recorded after it wakes this wait.
        let notified = waiter.notify.notified();
        let mut notified = std::pin::pin!(notified);
        notified.as_mut().enable();
        match front.queue.steer_answer(id).await.map_err(store_failed)? {
            SteerAnswer::Waiting => {}
            SteerAnswer::Taken { step } => return Ok(Some(step)),
            SteerAnswer::NotTaken => return Ok(None),
            _ => {
                return Err(ApiError::internal(
                    "steering_lost",
                    "the message's answer is no longer stored: the thread's messages show whether a step took it",
                ));
            }
        }
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep(front.config.poll_interval) => {}
            () = shared.closing.cancelled() => return Err(ApiError::unavailable(
                "shutting_down",
                "the server is shutting down: the run may still take the message at its next step (the thread's messages show whether it did)",
                shared.config.retry_after,
            )),
        }
    }
}

/// A steering request's wake-up, given back as the request ends however it ends (its client
/// gone included): the thread's entry goes when no other request holds it.
struct SteeredWaiter<'a> {
    front: &'a Front,
    thread: &'a ThreadId,
    notify: Arc<tokio::sync::Notify>,
}

impl Drop for SteeredWaiter<'_> {
    fn drop(&mut self) {
        // Held by the map and by this request only.
        self.front
            .steered
            .remove_if(self.thread, |_, w| Arc::strong_count(w) <= 2);
    }
}

/// How often a start superseding a queued job looks whether it has ended.
const SUPERSEDE_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// The live run of `thread` in this front end: the one it follows, or a new follower of the
/// thread's queued or claimed job (from stored event `after` on); `None` when it has neither.
pub(crate) async fn live_or_follow(
    server: &AgentServer,
    thread: &ThreadId,
    after: u64,
) -> Result<Option<Arc<LiveRun>>, ApiError> {
    let shared = &server.shared;
    let local = shared.live.get(thread);
    let Some(front) = &shared.front else {
        return Ok(local);
    };
    if local.as_ref().is_some_and(|r| !r.is_ended()) {
        return Ok(local);
    }
    let Some(job) = front
        .queue
        .job_of_thread(thread)
        .await
        .map_err(store_failed)?
    else {
        return Ok(local);
    };
    let cancel = CancellationToken::new();
    let live = match shared.live.begin(thread, Some(cancel.clone()), None) {
        Ok(live) => live,
        // Another request began following it meanwhile.
        Err(running) => return Ok(Some(running)),
    };
    // Its clients come with a position and attach now, whenever its next event is stored.
    live.starts_after(job.after_event);
    live.mark_started();
    let follower = Follower {
        server: server.clone(),
        front: Arc::clone(front),
        live: Arc::clone(&live),
        job_id: job.job_id,
        run_id: job.run_id,
        start: job.after_event,
        after,
        cancel,
    };
    live.set_task(tokio::spawn(follower.follow(None)));
    Ok(Some(live))
}

/// Follows one queued job's stored events into its live run.
struct Follower {
    server: AgentServer,
    front: Arc<Front>,
    live: Arc<LiveRun>,
    job_id: JobId,
    /// The job's run: its first `RunFinish` after `start` ends the activation.
    run_id: RunId,
    /// The thread's last stored event when the job was queued (a job continuing a waiting run
    /// follows that run's earlier `RunFinish`).
    start: u64,
    /// The last stored event already followed.
    after: u64,
    /// Cancelled by the cancel route: asks the queue to cancel the job.
    cancel: CancellationToken,
}

impl Follower {
    /// Reads the job's new events whenever the thread's notification comes (or every poll
    /// interval) until its run's `RunFinish`, its dead-lettering, or the server's shutdown.
    async fn follow(mut self, permit: Option<OwnedSemaphorePermit>) {
        let server = self.server.clone();
        let shared = &server.shared;
        let thread = self.live.thread_id.clone();
        let waiter = self.front.waiter(&thread, &shared.closing);
        // The cancel route cancelled the run, and whether the queue has been told (a store
        // that failed to take it is asked again at the next wake-up).
        let (mut cancel_asked, mut cancel_told) = (false, false);
        // Once the job is gone, the events are read once more before giving up on its end.
        let mut gone = false;
        let result = loop {
            match self.read().await {
                Ok(Progress::Finished(outcome)) => break Ok(outcome),
                Ok(Progress::Moved) => gone = false,
                // Nothing new: the job may have ended without its run's end.
                Ok(Progress::Still) => match self.front.queue.job_state(self.job_id).await {
                    Ok(JobState::Dead { error, attempts }) => {
                        // What its worker stored before giving up on it comes first (a run it
                        // ended `Cancelled` then ends the activation).
                        if let Ok(Progress::Finished(outcome)) = self.read().await {
                            break Ok(outcome);
                        }
                        break Err(ApiError::internal(
                            "run_failed",
                            format!("the run failed after {attempts} attempt(s): {error}"),
                        ));
                    }
                    Ok(JobState::Gone) if gone => {
                        break Err(ApiError::internal(
                            "run_lost",
                            format!("{} ended without its run finishing", self.job_id),
                        ));
                    }
                    Ok(JobState::Gone) => {
                        gone = true;
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(%thread, error = %e, "cannot read a queued job"),
                },
                Err(e) => tracing::warn!(%thread, error = %e, "cannot read a queued run's events"),
            }
            // After the read: a run found finished is not cancelled (the cancel names the
            // thread, whose next job it would reach).
            if cancel_asked && !cancel_told {
                match cancel_job(&server, &self.front, &thread).await {
                    Ok(_) => cancel_told = true,
                    Err(e) => {
                        tracing::warn!(%thread, error = %e, "cannot ask the queue to cancel a run");
                    }
                }
            }
            tokio::select! {
                () = waiter.notified() => {}
                () = tokio::time::sleep(self.front.config.poll_interval) => {}
                () = self.cancel.cancelled(), if !cancel_asked => {
                    cancel_asked = true;
                    continue;
                }
                () = shared.closing.cancelled() => break Err(ApiError::unavailable(
                    "shutting_down",
                    "the server is shutting down; the run goes on in the fleet",
                    shared.config.retry_after,
                )),
            }
        };
        self.front
            .waiters
            .remove_if(&thread, |_, w| Arc::strong_count(w) <= 2);
        drop(waiter);
        drop(permit);
        self.live.end(result);
        shared.live.linger(&self.live);
    }

    /// Pushes the thread's stored events after the last one followed.
    async fn read(&mut self) -> Result<Progress, awaken_store::StoreError> {
        let thread = &self.live.thread_id;
        let events = self
            .server
            .shared
            .runtime
            .store()
            .load_events(thread, self.after)
            .await?;
        let moved = !events.is_empty();
        for stored in events {
            self.after = stored.seq;
            if stored.seq <= self.start {
                self.live.push_earlier(stored.seq, &stored.event);
                continue;
            }
            self.live.push_stored(stored.seq, &stored.event);
            if let AgentEvent::RunFinish {
                run_id,
                termination,
                response,
                usage,
                ..
            } = &stored.event
                && *run_id == self.run_id
            {
                return Ok(Progress::Finished(json!({
                    "run_id": run_id,
                    "termination": termination,
                    "response": response,
                    "usage": usage,
                })));
            }
        }
        Ok(if moved {
            Progress::Moved
        } else {
            Progress::Still
        })
    }
}

/// What one read of a followed run's events found.
enum Progress {
    /// Its run finished: the outcome, as `?stream=false` answers it.
    Finished(serde_json::Value),
    /// New events, not the end yet.
    Moved,
    /// Nothing new.
    Still,
}
