//! A claimed job's steering: the queue's messages for the job handed to its run's inbox, each
//! with its id as its receipt, and their answers recorded for their senders.
//!
//! A message is taken once however often it is handed over: a claim that stops before
//! answering leaves it to the next claim, whose run answers it from its stored receipts if
//! the earlier one took it.

use std::sync::Arc;

use awaken_runtime::{AgentRuntime, RunStats, Steering, Taken};
use awaken_store::{ClaimedJob, JobLease, RunQueue, SteerId};
use tokio::sync::Notify;
use tokio::task::JoinSet;

/// Hands a job's steering messages to its run's inbox and records their answers.
pub(super) struct Delivery {
    queue: RunQueue,
    lease: JobLease,
    inbox: Steering,
    /// Woken when the queue says messages wait (a notification, a heartbeat).
    poke: Arc<Notify>,
    /// Each handed message's answer, recorded as soon as it is taken; the ids of those not
    /// taken, for the job's end.
    answers: JoinSet<Option<SteerId>>,
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
        }
    }

    /// Hands messages over at once when `waiting`, then whenever poked; never returns.
    pub(super) async fn run(&mut self, waiting: bool) -> std::convert::Infallible {
        if waiting {
            self.deliver().await;
        }
        loop {
            self.poke.notified().await;
            self.deliver().await;
        }
    }

    /// Hands the messages this claim has not been given to the inbox. One the store failed to
    /// hand over stays waiting, for the next poke or heartbeat.
    async fn deliver(&mut self) {
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
                match answer.await {
                    Ok(Taken { step }) => {
                        if let Err(e) = queue.settle_steering(&[(m.id, Some(step))]).await {
                            tracing::warn!(steer = %m.id, error = %e, "cannot record a steering message as taken");
                        }
                        None
                    }
                    Err(_) => Some(m.id),
                }
            });
        }
    }

    /// Once the attempt is over: the ids of the messages handed over and not taken (the
    /// inbox is closed first, so every answer comes).
    pub(super) async fn not_taken(mut self) -> Vec<SteerId> {
        self.inbox.close();
        let mut ids = Vec::new();
        while let Some(answer) = self.answers.join_next().await {
            if let Ok(Some(id)) = answer {
                ids.push(id);
            }
        }
        ids
    }
}

/// Records the messages `ids` of `job`, which its activation ended without taking: taken
/// after all if the run's stored receipts have them (an earlier claim's run took them before it
/// stopped), not taken otherwise. When the store cannot be read they stay unanswered, and
/// read as not taken once the job is gone.
pub(super) async fn settle_not_taken(
    runtime: &AgentRuntime,
    queue: &RunQueue,
    job: &ClaimedJob,
    ids: &[SteerId],
) {
    if ids.is_empty() {
        return;
    }
    let receipts = match runtime.store().load_checkpoint(&job.thread_id).await {
        Ok(Some(cp)) if cp.run.as_ref().is_some_and(|r| r.run_id == job.run_id) => {
            RunStats::of_stored(&cp.run_state).steering_receipts
        }
        Ok(_) => Vec::new(),
        Err(e) => {
            tracing::warn!(thread = %job.thread_id, error = %e, "cannot read which steering messages the run took");
            return;
        }
    };
    let settled: Vec<(SteerId, Option<u32>)> = ids
        .iter()
        .map(|id| {
            let receipt = id.to_string();
            let step = receipts
                .iter()
                .find(|r| *r.receipt == *receipt)
                .map(|r| r.step);
            (*id, step)
        })
        .collect();
    if let Err(e) = queue.settle_steering(&settled).await {
        tracing::warn!(thread = %job.thread_id, error = %e, "cannot record the steering messages not taken");
    }
}
