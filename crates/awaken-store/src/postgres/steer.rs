//! Steering messages for queued runs: a front end stores one for the thread's job and waits
//! for its answer; the job's worker hands it to the run, and records whether a step took it.
//!
//! A message given to a claim that stopped before answering is handed to the next claim again,
//! its id as its receipt: the run's stored steering receipts tell whether the run took it
//! already (it is then answered, not taken twice). A message still waiting when its job is
//! gone was not taken.

use awaken_event::{Message, ThreadId};

use super::queue::{
    FleetWake, JOBS_CHANNEL, JobId, JobLease, QueueError, RUNS_CHANNEL, RunQueue, attempt,
};
use crate::commit::Timestamp;
use crate::error::StoreError;

/// A steering message's number, given when it is stored and never reused; as a string, its
/// receipt in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SteerId(pub i64);

impl std::fmt::Display for SteerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A steering message handed to a claim of its job.
#[derive(Debug, Clone, PartialEq)]
pub struct SteerMessage {
    /// Its number.
    pub id: SteerId,
    /// The message.
    pub message: Message,
}

/// What became of a steering message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SteerAnswer {
    /// Not answered yet.
    Waiting,
    /// A step of the run took it (committed to the thread).
    Taken {
        /// The step.
        step: u32,
    },
    /// The run ended, or its job did, before a step took it.
    NotTaken,
    /// No such message: its answer was read already, or deleted unread an hour after it was
    /// recorded (or it was never stored).
    Unknown,
}

/// How long an answer is kept for a sender that has not read it (one that stopped waiting),
/// and a message whose job ended without answering it: then it is deleted with the next message
/// stored.
const KEPT_MS: i64 = 60 * 60 * 1000;

/// The answer a settled row's state and step make.
fn answer_of(state: &str, step: Option<i32>) -> SteerAnswer {
    match (state, step) {
        ("taken", Some(step)) => SteerAnswer::Taken {
            step: u32::try_from(step).unwrap_or(0),
        },
        ("waiting", _) => SteerAnswer::Waiting,
        _ => SteerAnswer::NotTaken,
    }
}

impl RunQueue {
    /// Stores `message` for the thread's queued or claimed job and tells the workers; `None`
    /// when the thread has no job.
    pub async fn steer(
        &self,
        thread_id: &ThreadId,
        message: &Message,
        now: Timestamp,
    ) -> Result<Option<SteerId>, StoreError> {
        let text = serde_json::to_string(message).map_err(|e| StoreError::Serialize {
            what: "steering message",
            source: e,
        })?;
        self.named(async {
            let mut conn = self.pool.get().await?;
            let wake = self.payload(&FleetWake::Steer(thread_id.clone()), thread_id.as_str());
            let cutoff = now.as_unix_millis().saturating_sub(KEPT_MS);
            let row = conn
                .prepared()
                .query_opt(
                    "WITH old AS (DELETE FROM run_steering r WHERE r.answered_at < $5 \
                         OR (r.state = 'waiting' AND r.sent_at < $5 AND NOT EXISTS \
                             (SELECT 1 FROM run_queue q WHERE q.job_id = r.job_id))), \
                     s AS (INSERT INTO run_steering (job_id, thread_id, message, sent_at) \
                         SELECT job_id, thread_id, $2, $3 FROM run_queue WHERE thread_id = $1 \
                         RETURNING steer_id) \
                     SELECT steer_id, pg_notify($4, $6) FROM s",
                    &[
                        &thread_id.as_str(),
                        &text,
                        &now.as_unix_millis(),
                        &JOBS_CHANNEL,
                        &cutoff,
                        &wake,
                    ],
                )
                .await?;
            row.map(|r| r.try_get(0).map(SteerId))
                .transpose()
                .map_err(StoreError::from)
        })
        .await
    }

    /// How many steering messages for the thread's job wait for the run to take them.
    pub async fn steering_waiting(&self, thread_id: &ThreadId) -> Result<u64, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let row = conn
                .prepared()
                .query_one(
                    "SELECT COUNT(*) FROM run_steering r JOIN run_queue q \
                         ON q.job_id = r.job_id WHERE r.thread_id = $1 AND r.state = 'waiting'",
                    &[&thread_id.as_str()],
                )
                .await?;
            Ok(u64::try_from(row.try_get::<_, i64>(0)?).unwrap_or(0))
        })
        .await
    }

    /// What became of steering message `id`. Once answered (or its job is gone with it
    /// unanswered), the message is deleted: the answer is read once.
    pub async fn steer_answer(&self, id: SteerId) -> Result<SteerAnswer, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let row = conn
                .prepared()
                .query_opt(
                    "DELETE FROM run_steering r WHERE steer_id = $1 AND (state <> 'waiting' \
                         OR NOT EXISTS (SELECT 1 FROM run_queue q WHERE q.job_id = r.job_id)) \
                     RETURNING state, step",
                    &[&id.0],
                )
                .await?;
            if let Some(row) = row {
                let state: String = row.try_get(0)?;
                return Ok(match answer_of(&state, row.try_get(1)?) {
                    // Its job is gone: no worker will hand it to the run any more.
                    SteerAnswer::Waiting => SteerAnswer::NotTaken,
                    answer => answer,
                });
            }
            let waiting = conn
                .prepared()
                .query_opt("SELECT 1 FROM run_steering WHERE steer_id = $1", &[&id.0])
                .await?;
            Ok(if waiting.is_some() {
                SteerAnswer::Waiting
            } else {
                SteerAnswer::Unknown
            })
        })
        .await
    }

    /// Hands the job's waiting steering messages this claim has not been given (those an
    /// earlier claim was given and did not answer included) to `lease`'s claim, oldest first;
    /// none once the lease is lost.
    pub async fn deliver_steering(
        &self,
        lease: &JobLease,
    ) -> Result<Vec<SteerMessage>, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let rows = conn
                .prepared()
                .query(
                    "UPDATE run_steering SET delivered_claim = $2 \
                     WHERE job_id = $1 AND state = 'waiting' \
                         AND delivered_claim IS DISTINCT FROM $2 \
                         AND EXISTS (SELECT 1 FROM run_queue q WHERE q.job_id = $1 \
                             AND q.lease_owner = $3 AND q.claims = $2) \
                     RETURNING steer_id, message",
                    &[&lease.job_id.0, &attempt(lease.attempt), &lease.worker_id],
                )
                .await?;
            let mut messages = rows
                .iter()
                .map(|row| {
                    let text: String = row.try_get(1)?;
                    Ok(SteerMessage {
                        id: SteerId(row.try_get(0)?),
                        message: serde_json::from_str(&text)
                            .map_err(|e| StoreError::corrupt("steering message", e))?,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            messages.sort_by_key(|m| m.id);
            Ok(messages)
        })
        .await
    }

    /// The job's messages not answered yet (some maybe taken by a run whose worker stopped
    /// before it recorded so), oldest first.
    pub async fn unanswered_steering(&self, job_id: JobId) -> Result<Vec<SteerId>, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let rows = conn
                .prepared()
                .query(
                    "SELECT steer_id FROM run_steering WHERE job_id = $1 AND state = 'waiting' \
                     ORDER BY steer_id",
                    &[&job_id.0],
                )
                .await?;
            rows.iter()
                .map(|r| Ok(SteerId(r.try_get(0)?)))
                .collect::<Result<Vec<_>, tokio_postgres::Error>>()
                .map_err(StoreError::from)
        })
        .await
    }

    /// Records at `now` what became of steering messages: taken at the step given, or not
    /// taken (`None`); their senders are told. Only messages still unanswered change.
    pub async fn settle_steering(
        &self,
        settled: &[(SteerId, Option<u32>)],
        now: Timestamp,
    ) -> Result<(), QueueError> {
        if settled.is_empty() {
            return Ok(());
        }
        self.named(async {
            let ids: Vec<i64> = settled.iter().map(|(id, _)| id.0).collect();
            let steps: Vec<Option<i32>> =
                settled.iter().map(|(_, step)| step.map(attempt)).collect();
            let schema = self.pool.schema.as_deref().unwrap_or("");
            let mut conn = self.pool.get().await.map_err(QueueError::Backend)?;
            conn.prepared()
                .query(
                    "WITH s AS (UPDATE run_steering r SET step = a.step, answered_at = $5, \
                         state = CASE WHEN a.step IS NULL THEN 'refused' ELSE 'taken' END \
                         FROM unnest($1::BIGINT[], $2::INTEGER[]) AS a(id, step) \
                         WHERE r.steer_id = a.id AND r.state = 'waiting' \
                         RETURNING r.thread_id) \
                     SELECT pg_notify($3, $4 || E'\\tsteered\\t' || t) \
                     FROM (SELECT DISTINCT thread_id AS t FROM s) d",
                    &[&ids, &steps, &RUNS_CHANNEL, &schema, &now.as_unix_millis()],
                )
                .await?;
            Ok(())
        })
        .await
    }
}
