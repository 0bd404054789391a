//! A claimed job's steering: the queue's messages for the job handed to its run's inbox, each
//! with its id as its receipt, and their answers recorded for their senders.
//!
//! A message is taken once however often it is handed over: a claim that stops before
//! answering leaves it to the next claim, whose run answers it from its stored receipts if
//! the earlier one took it. As the job ends for good, the messages still unanswered are
//! answered from those receipts before the job leaves the queue.

use std::sync::Arc;

use awaken_runtime::SteeringReceipt;
use awaken_runtime::{AgentRuntime, RunStats, Steering, Taken};
use awaken_store::{ClaimedJob, JobLease, RunQueue, SteerId, Timestamp};
use tokio::sync::Notify;
use tokio::task::JoinSet;

/// Hands a job's steering messages to its run's inbox and records their answers.
pub(super) struct Delivery {
    queue: RunQueue,
    lease: JobLease,
    inbox: Steering,
    /// Woken when the queue says messages wait (a notification, a heartbeat).
    poke: Arc<Notify>,
    /// Each handed message's answer, recorded as soon as it is taken.
    answers: JoinSet<()>,
    /// Whether messages were (or may have been) handed to this claim.
    handed: bool,
}

impl Delivery {
    pub(super) fn new(
        queue: RunQueue,
        lease: JobLease,
        inbox: Steering,
        poke: Arc<Notify>,
    ) -> Self {
        Self {
            queue,
            lease,
            inbox,
            poke,
            answers: JoinSet::new(),
            handed: false,
        }
    }

    /// Hands messages over whenever poked; never returns.
    pub(super) async fn run(&mut self) -> std::convert::Infallible {
        loop {
            self.poke.notified().await;
            self.deliver().await;
        }
    }

    /// Hands the messages this claim has not been given to the inbox. One the store failed to
    /// hand over stays waiting, for the next poke or heartbeat.
    pub(super) async fn deliver(&mut self) {
        // Set first: a delivery cut short may have been recorded.
        self.handed = true;
        let messages = match self.queue.deliver_steering(&self.lease).await {
            Ok(messages) => messages,
            Err(e) => {
                tracing::warn!(job = %self.lease.job_id, error = %e, "cannot read the job's steering messages");
                return;
            }
        };
        for m in messages {
            let answer = self.inbox.send_with_receipt(m.message, m.id.to_string());
            let queue = self.queue.clone();
            self.answers.spawn(async move {
                // One not taken is answered at the job's end, or handed to its next claim.
                if let Ok(Taken { step }) = answer.await
                    && let Err(e) = queue.settle_steering(&[(m.id, Some(step))], Timestamp::now()).await
                {
                    tracing::warn!(steer = %m.id, error = %e, "cannot record a steering message as taken");
                }
            });
        }
    }

    /// Once the attempt is over: closes the inbox (every answer comes) and waits for the
    /// answers to be recorded; whether messages were handed to this claim.
    pub(super) async fn finish(mut self) -> bool {
        self.inbox.close();
        while self.answers.join_next().await.is_some() {}
        self.handed
    }
}

/// Answers, as the job ends for good, each of its messages still unanswered: taken at its
/// step if the run's stored receipts have it (this claim's run took it and its answer was not
/// recorded, or an earlier claim's run took it before its worker stopped), not taken otherwise.
/// An error leaves them unanswered: the job must not end then, or they would read as not
/// taken.
pub(super) async fn settle_unanswered(
    runtime: &AgentRuntime,
    queue: &RunQueue,
    job: &ClaimedJob,
) -> Result<(), String> {
    let ids = queue
        .unanswered_steering(job.lease.job_id)
        .await
        .map_err(|e| e.to_string())?;
    if ids.is_empty() {
        return Ok(());
    }
    let receipts = match runtime
        .store()
        .load_checkpoint(&job.thread_id)
        .await
        .map_err(|e| e.to_string())?
    {
        Some(cp) if cp.run.as_ref().is_some_and(|r| r.run_id == job.run_id) => {
            RunStats::of_stored(&cp.run_state).steering_receipts
        }
        _ => Vec::new(),
    };
    let settled: Vec<(SteerId, Option<u32>)> = ids
        .iter()
        .map(|id| (*id, SteeringReceipt::step_in(&receipts, &id.to_string())))
        .collect();
    queue
        .settle_steering(&settled, Timestamp::now())
        .await
        .map_err(|e| e.to_string())
}
