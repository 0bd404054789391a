//! [`RunQueue`]: the fleet's durable queue of runs, in the store's database.
//!
//! A job is one activation to drive (a new run, or decisions for a waiting one) on one thread;
//! the table holds at most one job per thread, so a thread never has two jobs claimed at once
//! across the fleet. Workers claim jobs with `FOR UPDATE SKIP LOCKED` under a lease they renew
//! with a heartbeat; a finished job's row is deleted and a dead one moved to `run_queue_dead`,
//! so the claimed table stays small. Every change a worker or a front end waits for is also
//! announced on one `LISTEN`/`NOTIFY` channel ([`FleetListener`](super::FleetListener)); polling covers a lost one.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use awaken_event::{RunId, ThreadId};
use tokio_postgres::Row;

use super::pool::{End, Pool};
use super::{commit, load};
use crate::commit::Timestamp;
use crate::error::{Database, InDatabase, StoreError};
use crate::lease;

/// The notification channel of every fleet on a database (payloads name the schema).
/// The channel of what workers wait for: jobs to claim, cancels.
pub(super) const JOBS_CHANNEL: &str = "awaken_fleet_jobs";

/// The channel of what front ends following runs wait for: new events, ends. Apart from the
/// jobs' so that workers, which never follow a run, are not woken by every step's events.
pub(super) const RUNS_CHANNEL: &str = "awaken_fleet_runs";

/// Queues a job unless its thread has one, and wakes the workers (at the commit).
const ENQUEUE: &str = "WITH j AS (INSERT INTO run_queue (thread_id, run_id, agent_id, payload, \
         priority, not_before, enqueued_at, max_attempts, after_event) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $11) \
         ON CONFLICT (thread_id) DO NOTHING RETURNING job_id) \
     SELECT job_id, pg_notify($9, $10) FROM j";

/// A job just queued starts after the thread's last stored event as seen now, if later.
const AFTER_EVENT: &str = "UPDATE run_queue SET after_event = GREATEST(after_event, COALESCE(\
         (SELECT event_count FROM threads WHERE thread_id = $2), 0)) \
     WHERE job_id = $1 RETURNING after_event";

/// A job's number in the queue, given at enqueue and never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(pub i64);

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "job {}", self.0)
    }
}

/// A job to enqueue.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    /// The thread it runs on (one job per thread at a time).
    pub thread_id: ThreadId,
    /// The run it starts or continues (chosen by the enqueuer, so a worker that takes the job
    /// over finds the run the job already started).
    pub run_id: RunId,
    /// The agent (workers may serve only some agents).
    pub agent_id: String,
    /// What to run, as the enqueuer and the workers agree (the queue does not read it).
    pub payload: serde_json::Value,
    /// Higher first; equal priorities in enqueue order.
    pub priority: i32,
    /// Not claimed before this time.
    pub not_before: Timestamp,
    /// Attempts after which a job that keeps failing is dead-lettered (at least 1).
    pub max_attempts: u32,
    /// The thread's last stored event when the job was queued: the job's events come after it
    /// (a job continuing a waiting run shares its run id with that run's earlier events).
    pub after_event: u64,
}

impl NewJob {
    /// A job for `run_id` of `agent_id` on `thread_id`, due now, priority 0, 3 attempts.
    pub fn new(
        thread_id: ThreadId,
        run_id: RunId,
        agent_id: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        Self {
            thread_id,
            run_id,
            agent_id: agent_id.into(),
            payload,
            priority: 0,
            not_before: Timestamp::EPOCH,
            max_attempts: 3,
            after_event: 0,
        }
    }
}

/// A thread's queued or claimed job, as [`RunQueue::job_of_thread`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadJob {
    /// The job.
    pub job_id: JobId,
    /// The run it starts or continues.
    pub run_id: RunId,
    /// The thread's last stored event when it was queued ([`NewJob::after_event`]).
    pub after_event: u64,
}

/// What [`RunQueue::enqueue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// The job is queued, its events after `after_event`: the job's own, or the thread's last
    /// stored event when the insert was made if that is later (the thread's previous job may
    /// have stored its last events after the caller looked).
    Queued {
        /// The queued job.
        job_id: JobId,
        /// Where its events start.
        after_event: u64,
    },
    /// The thread already has this job queued or claimed; nothing was queued.
    ThreadBusy(JobId),
}

/// The lease a worker holds on a claimed job: the job and the claim's number (each claim of the
/// job takes the next number, also after a release, so an earlier holder's lease is lost).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobLease {
    /// The job.
    pub job_id: JobId,
    /// The holder.
    pub worker_id: String,
    /// The claim's number (1 for the first claim; unlike the job's attempts, a released claim
    /// counts).
    pub attempt: u32,
}

/// A job handed to a worker by [`RunQueue::claim`].
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedJob {
    /// The thread.
    pub thread_id: ThreadId,
    /// The run the job starts or continues.
    pub run_id: RunId,
    /// The agent.
    pub agent_id: String,
    /// What to run.
    pub payload: serde_json::Value,
    /// Its priority.
    pub priority: i32,
    /// Attempts so far, this one included (a released claim is not one).
    pub attempts: u32,
    /// Attempts after which it is dead-lettered.
    pub max_attempts: u32,
    /// Whether a cancel was requested (before or since it was claimed).
    pub cancel_requested: bool,
    /// Why the previous attempt failed, if one did.
    pub last_error: Option<String>,
    /// When it was enqueued.
    pub enqueued_at: Timestamp,
    /// Whether it has steering messages waiting, some maybe given to an earlier claim that did
    /// not answer them ([`RunQueue::deliver_steering`]).
    pub steering: bool,
    /// The lease to carry in heartbeats and in the job's end.
    pub lease: JobLease,
    /// When the lease expires unless renewed.
    pub expires_at: Timestamp,
}

/// A renewed lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobBeat {
    /// The new expiry.
    pub expires_at: Timestamp,
    /// Whether a cancel was requested.
    pub cancel_requested: bool,
    /// Whether steering messages wait that this claim has not been given
    /// ([`RunQueue::deliver_steering`]).
    pub steering_waiting: bool,
}

/// Where a job stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobState {
    /// Queued or claimed.
    Pending {
        /// Claims so far.
        attempts: u32,
        /// The worker holding it, when claimed and the lease has not been given up.
        claimed_by: Option<String>,
        /// Why the previous attempt failed, if one did.
        last_error: Option<String>,
    },
    /// Dead-lettered after its attempts or a failure no retry mends.
    Dead {
        /// Claims it had.
        attempts: u32,
        /// Its last error.
        error: String,
    },
    /// Finished (its row is gone), or never queued.
    Gone,
}

/// A dead-lettered job.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadJob {
    /// The job.
    pub job_id: JobId,
    /// Its thread.
    pub thread_id: ThreadId,
    /// Its run.
    pub run_id: RunId,
    /// Its agent.
    pub agent_id: String,
    /// Claims it had.
    pub attempts: u32,
    /// When it was enqueued.
    pub enqueued_at: Timestamp,
    /// When it was dead-lettered.
    pub died_at: Timestamp,
    /// Its last error.
    pub error: String,
}

/// How many jobs the queue holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueDepth {
    /// Waiting for a worker (including those not yet due).
    pub queued: u64,
    /// Held by a worker under a live lease.
    pub claimed: u64,
    /// Dead-lettered.
    pub dead: u64,
}

/// What happened to a job given back after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retried {
    /// Queued again, due at this time.
    Requeued(Timestamp),
    /// It had used its attempts: dead-lettered.
    Dead,
}

/// Why an operation on a claimed job did not happen.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The lease is not the job's lease any more (it expired and another worker claimed the
    /// job, or the job ended): its holder must stop driving it.
    #[error("the lease on {job_id} was lost")]
    Lost {
        /// The job.
        job_id: JobId,
    },
    /// The store failed; the lease may still be held.
    #[error(transparent)]
    Backend(#[from] StoreError),
}

impl From<tokio_postgres::Error> for QueueError {
    fn from(source: tokio_postgres::Error) -> Self {
        QueueError::Backend(source.into())
    }
}

impl InDatabase for QueueError {
    fn in_database(self, db: &Database) -> Self {
        match self {
            QueueError::Backend(e) => QueueError::Backend(e.in_database(db)),
            lost => lost,
        }
    }
}

/// What a [`FleetListener`](super::FleetListener) was told.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FleetWake {
    /// A job became claimable (enqueued, or given back).
    Job,
    /// A cancel was requested for the thread's job.
    Cancel(ThreadId),
    /// A steering message waits for the thread's job.
    Steer(ThreadId),
    /// The thread has new stored events.
    Events(ThreadId),
    /// The thread's job ended without a last event to show it (dead-lettered).
    Done(ThreadId),
    /// A steering message for the thread's job was answered (taken or refused).
    Steered(ThreadId),
    /// The listening connection was lost and is back: notifications may have been missed, so
    /// look again at whatever is waited for.
    Lost,
}

impl FleetWake {
    /// The channel it is announced on.
    pub(super) fn channel(&self) -> &'static str {
        match self {
            FleetWake::Job | FleetWake::Cancel(_) | FleetWake::Steer(_) | FleetWake::Lost => {
                JOBS_CHANNEL
            }
            FleetWake::Events(_) | FleetWake::Done(_) | FleetWake::Steered(_) => RUNS_CHANNEL,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            FleetWake::Job => "job",
            FleetWake::Cancel(_) => "cancel",
            FleetWake::Steer(_) => "steer",
            FleetWake::Events(_) => "events",
            FleetWake::Done(_) => "done",
            FleetWake::Steered(_) => "steered",
            FleetWake::Lost => "lost",
        }
    }

    pub(super) fn parse(kind: &str, thread: &str) -> Option<Self> {
        let thread = || ThreadId::new(thread).ok();
        Some(match kind {
            "job" => FleetWake::Job,
            "cancel" => FleetWake::Cancel(thread()?),
            "steer" => FleetWake::Steer(thread()?),
            "events" => FleetWake::Events(thread()?),
            "done" => FleetWake::Done(thread()?),
            "steered" => FleetWake::Steered(thread()?),
            _ => return None,
        })
    }
}

/// The run queue of a PostgreSQL store's database and schema (`PostgresStore::queue`; see the
/// module's doc). Cheap to clone; it shares the store's connections.
#[derive(Debug, Clone)]
pub struct RunQueue {
    pub(super) pool: Arc<Pool>,
    database: Database,
}

impl RunQueue {
    /// The queue in the database and schema of `pool`, its errors naming `database`.
    pub(super) fn new(pool: Arc<Pool>, database: Database) -> Self {
        Self { pool, database }
    }
}

/// The columns of a claimed job, in [`claimed_job`]'s order.
const JOB_COLUMNS: &str = "job_id, thread_id, run_id, agent_id, payload, priority, attempts, \
     max_attempts, cancel_requested, last_error, enqueued_at, claims, \
     EXISTS (SELECT 1 FROM run_steering s WHERE s.job_id = run_queue.job_id \
         AND s.state = 'waiting')";

/// Claims due jobs: the ids go to the update as an array, found by key (`IN` over the subquery
/// would be planned as a join that reads the whole queue).
pub(super) static CLAIM: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE run_queue SET lease_owner = $1, lease_expires_at = $2, \
             attempts = attempts + 1, claims = claims + 1 \
         WHERE job_id = ANY(ARRAY(SELECT job_id FROM run_queue \
             WHERE not_before <= $3 \
             AND (lease_owner IS NULL OR lease_expires_at <= $3) \
             AND ($5::TEXT[] IS NULL OR agent_id = ANY($5)) \
             ORDER BY priority DESC, job_id LIMIT $4 FOR UPDATE SKIP LOCKED)) \
         RETURNING {JOB_COLUMNS}"
    )
});
/// Claims the thread's job for a cancel if no worker ever has (and it is for one of the
/// agents `$4`), marked cancelled; the claim is numbered but counts no attempt.
pub(super) static CLAIM_UNCLAIMED: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE run_queue SET lease_owner = $1, lease_expires_at = $2, \
             claims = claims + 1, cancel_requested = TRUE \
         WHERE thread_id = $3 AND claims = 0 AND lease_owner IS NULL \
             AND agent_id = ANY($4) \
         RETURNING {JOB_COLUMNS}"
    )
});
pub(super) const NEXT_DUE: &str = "SELECT MIN(CASE WHEN lease_owner IS NULL \
         OR lease_expires_at <= $1 THEN not_before \
         ELSE GREATEST(not_before, lease_expires_at) END) \
     FROM run_queue WHERE ($2::TEXT[] IS NULL OR agent_id = ANY($2))";
pub(super) const HEARTBEAT: &str = "UPDATE run_queue SET lease_expires_at = $1 \
     WHERE job_id = $2 AND lease_owner = $3 AND claims = $4 RETURNING cancel_requested, \
     EXISTS (SELECT 1 FROM run_steering s WHERE s.job_id = $2 AND s.state = 'waiting' \
         AND s.delivered_claim IS DISTINCT FROM $4)";
pub(super) const COMPLETE: &str =
    "DELETE FROM run_queue WHERE job_id = $1 AND lease_owner = $2 AND claims = $3";
pub(super) const NOTIFY: &str = "SELECT pg_notify($1, p) FROM unnest($2::TEXT[]) AS p";

/// The statements a worker's job uses, from its claim to its end: the claim, the thread's
/// latest run, the job's run by id and the checkpoint, the run's lease, its steps' commits and their
/// announcement, and the job's heartbeat and end. [`RunQueue::warm_up`] prepares them ahead.
pub(super) fn job_statements() -> &'static [&'static str] {
    static STATEMENTS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
        let mut statements = vec![
            CLAIM.as_str(),
            NEXT_DUE,
            HEARTBEAT,
            COMPLETE,
            NOTIFY,
            load::LATEST_RUN.as_str(),
            load::RUN.as_str(),
            load::THREAD_ROW,
            load::MESSAGES,
            load::THREAD_STATE,
            load::RUN_ROW.as_str(),
            load::RUN_STATE,
            commit::RENEW_RUN_LEASE,
            commit::RELEASE_RUN_LEASE,
            commit::ENSURE_THREAD,
            commit::LOCK_THREAD,
            commit::LOCK_RUN,
            crate::one_run::HOLDER_QUERY,
        ];
        statements.extend(commit::run_writes());
        statements
    });
    &STATEMENTS
}

fn count(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

pub(super) fn attempt(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn thread_of(raw: String) -> Result<ThreadId, StoreError> {
    ThreadId::new(&raw).map_err(|e| StoreError::corrupt("queued job", e))
}

fn run_of(raw: String) -> Result<RunId, StoreError> {
    RunId::new(&raw).map_err(|e| StoreError::corrupt("queued job", e))
}

fn claimed_job(
    row: &Row,
    worker_id: &str,
    expires_at: Timestamp,
) -> Result<ClaimedJob, StoreError> {
    let payload: String = row.try_get(4)?;
    let attempts = count(row.try_get(6)?);
    let job_id = JobId(row.try_get(0)?);
    Ok(ClaimedJob {
        thread_id: thread_of(row.try_get(1)?)?,
        run_id: run_of(row.try_get(2)?)?,
        agent_id: row.try_get(3)?,
        payload: serde_json::from_str(&payload)
            .map_err(|e| StoreError::corrupt("queued job's payload", e))?,
        priority: row.try_get(5)?,
        attempts,
        max_attempts: count(row.try_get(7)?),
        cancel_requested: row.try_get(8)?,
        last_error: row.try_get(9)?,
        enqueued_at: Timestamp::from_unix_millis(row.try_get(10)?),
        steering: row.try_get(12)?,
        lease: JobLease {
            job_id,
            worker_id: worker_id.to_owned(),
            attempt: count(row.try_get(11)?),
        },
        expires_at,
    })
}

impl RunQueue {
    /// What `operation` gives, an error from the database naming it.
    pub(super) async fn named<T, E: InDatabase>(
        &self,
        operation: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        operation.await.map_err(|e| e.in_database(&self.database))
    }

    /// A notification payload: the schema, the kind, the thread.
    pub(super) fn payload(&self, wake: &FleetWake, thread: &str) -> String {
        let schema = self.pool.schema.as_deref().unwrap_or("");
        format!("{schema}\t{}\t{thread}", wake.kind())
    }

    /// Opens up to `connections` of the store's connections (at most its pool's size) and
    /// prepares and plans on each the statements a worker's jobs use, as every connection the
    /// store opens from now on does (after a reconnect, say): a worker's first jobs then wait
    /// for no statement to be parsed and planned on a connection that has not used it.
    pub async fn warm_up(&self, connections: usize) -> Result<(), StoreError> {
        self.named(self.pool.warm(job_statements(), connections))
            .await
    }

    /// Queues `job` and wakes the workers; `ThreadBusy` when its thread has a job already.
    pub async fn enqueue(&self, job: &NewJob, now: Timestamp) -> Result<Enqueued, StoreError> {
        self.named(async {
            let payload =
                serde_json::to_string(&job.payload).map_err(|e| StoreError::Serialize {
                    what: "queued job's payload",
                    source: e,
                })?;
            let mut conn = self.pool.get().await?;
            let wake = self.payload(&FleetWake::Job, "");
            let after_event = crate::codec::int(job.after_event);
            let tid = job.thread_id.as_str();
            // Up to a few tries: a busy thread's job may end between the insert and the read.
            for _ in 0..3 {
                let queued = {
                    let (client, statements) = conn.begin();
                    let insert = statements.get(client, ENQUEUE).await?;
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 11] = [
                        &tid,
                        &job.run_id.as_str(),
                        &job.agent_id,
                        &payload,
                        &job.priority,
                        &job.not_before.as_unix_millis(),
                        &now.as_unix_millis(),
                        &attempt(job.max_attempts.max(1)),
                        &JOBS_CHANNEL,
                        &wake,
                        &after_event,
                    ];
                    let (_, row) = tokio::try_join!(
                        biased;
                        client.batch_execute("BEGIN"),
                        client.query_opt(&insert, &params),
                    )?;
                    match row {
                        // A statement of its own, so a snapshot taken after the insert: the
                        // last events of the thread's previous job, stored before its row
                        // left the queue, are counted even if they were stored after the
                        // insert's snapshot.
                        Some(row) => {
                            let job_id: i64 = row.try_get(0)?;
                            let reread = statements.get(client, AFTER_EVENT).await?;
                            let row = client.query_one(&reread, &[&job_id, &tid]).await?;
                            Some((job_id, row.try_get::<_, i64>(0)?))
                        }
                        None => None,
                    }
                };
                if let Some((job_id, after_event)) = queued {
                    conn.end(End::Commit).await?;
                    return Ok(Enqueued::Queued {
                        job_id: JobId(job_id),
                        after_event: crate::codec::count("queued job's first event", after_event)?,
                    });
                }
                conn.end(End::Rollback).await?;
                let held = conn
                    .prepared()
                    .query_opt("SELECT job_id FROM run_queue WHERE thread_id = $1", &[&tid])
                    .await?;
                if let Some(row) = held {
                    return Ok(Enqueued::ThreadBusy(JobId(row.try_get(0)?)));
                }
            }
            Err(StoreError::Config {
                detail: format!(
                    "thread `{}`'s job kept changing while a job was queued for it",
                    job.thread_id
                ),
            })
        })
        .await
    }

    /// Claims up to `limit` due jobs whose lease is free or expired at `now` (of `agents`
    /// only, when given), for `worker_id` until `now + lease_duration`: highest priority first,
    /// then oldest. Each claim counts an attempt. Concurrent claimers never get the same job.
    pub async fn claim(
        &self,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
        limit: usize,
        agents: Option<&[String]>,
    ) -> Result<Vec<ClaimedJob>, StoreError> {
        self.named(async {
            lease::check_worker(worker_id)?;
            let expires_at = now.saturating_add(lease_duration);
            let agents: Option<Vec<&str>> = agents.map(|a| a.iter().map(String::as_str).collect());
            let mut conn = self.pool.get().await?;
            let rows = conn
                .prepared()
                .query(
                    &CLAIM,
                    &[
                        &worker_id,
                        &expires_at.as_unix_millis(),
                        &now.as_unix_millis(),
                        &crate::codec::int(limit as u64),
                        &agents,
                    ],
                )
                .await?;
            let mut jobs = rows
                .iter()
                .map(|row| claimed_job(row, worker_id, expires_at))
                .collect::<Result<Vec<_>, _>>()?;
            jobs.sort_by(|a, b| {
                b.priority
                    .cmp(&a.priority)
                    .then(a.lease.job_id.cmp(&b.lease.job_id))
            });
            Ok(jobs)
        })
        .await
    }

    /// Claims the thread's job, marked cancelled, for `worker_id` until `now + lease_duration`
    /// when no worker has claimed it yet (none is driving it, and none has begun its run) and
    /// it is for one of `agents`: the claimer ends its run cancelled as a worker would, so a
    /// cancel need not wait for a free worker. The claim counts no attempt (a claimer that
    /// fails leaves the job all of its attempts). `None` when the thread has no such job.
    pub async fn claim_unclaimed(
        &self,
        thread_id: &ThreadId,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
        agents: &[String],
    ) -> Result<Option<ClaimedJob>, StoreError> {
        self.named(async {
            lease::check_worker(worker_id)?;
            let expires_at = now.saturating_add(lease_duration);
            let mut conn = self.pool.get().await?;
            let row = conn
                .prepared()
                .query_opt(
                    &CLAIM_UNCLAIMED,
                    &[
                        &worker_id,
                        &expires_at.as_unix_millis(),
                        &thread_id.as_str(),
                        &agents,
                    ],
                )
                .await?;
            row.map(|row| claimed_job(&row, worker_id, expires_at))
                .transpose()
        })
        .await
    }

    /// When a job not claimable at `now` next becomes so (the soonest `not_before` or lease
    /// expiry), of `agents` only when given; `None` when the queue holds none.
    pub async fn next_due(
        &self,
        now: Timestamp,
        agents: Option<&[String]>,
    ) -> Result<Option<Timestamp>, StoreError> {
        self.named(async {
            let agents: Option<Vec<&str>> = agents.map(|a| a.iter().map(String::as_str).collect());
            let mut conn = self.pool.get().await?;
            let row = conn
                .prepared()
                .query_one(NEXT_DUE, &[&now.as_unix_millis(), &agents])
                .await?;
            let due: Option<i64> = row.try_get(0)?;
            Ok(due.map(Timestamp::from_unix_millis))
        })
        .await
    }

    /// Extends `lease` to `now + lease_duration`; tells whether a cancel was requested.
    /// [`QueueError::Lost`] when it is not the job's lease any more.
    pub async fn heartbeat(
        &self,
        lease: &JobLease,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<JobBeat, QueueError> {
        self.named(async {
            let expires_at = now.saturating_add(lease_duration);
            let mut conn = self.pool.get().await.map_err(QueueError::Backend)?;
            let row = conn
                .prepared()
                .query_opt(
                    HEARTBEAT,
                    &[
                        &expires_at.as_unix_millis(),
                        &lease.job_id.0,
                        &lease.worker_id,
                        &attempt(lease.attempt),
                    ],
                )
                .await?;
            let row = row.ok_or(QueueError::Lost {
                job_id: lease.job_id,
            })?;
            Ok(JobBeat {
                expires_at,
                cancel_requested: row.try_get(0)?,
                steering_waiting: row.try_get(1)?,
            })
        })
        .await
    }

    /// Ends a job whose activation ended (finished, suspended or cancelled): its row is
    /// deleted. [`QueueError::Lost`] when `lease` is not its lease any more.
    pub async fn complete(&self, lease: &JobLease) -> Result<(), QueueError> {
        self.named(async {
            let mut conn = self.pool.get().await.map_err(QueueError::Backend)?;
            let n = conn
                .prepared()
                .execute(
                    COMPLETE,
                    &[&lease.job_id.0, &lease.worker_id, &attempt(lease.attempt)],
                )
                .await?;
            if n == 0 {
                return Err(QueueError::Lost {
                    job_id: lease.job_id,
                });
            }
            Ok(())
        })
        .await
    }

    /// Gives a job back after a failed attempt: queued again, due at `not_before`, with
    /// `error` as its last error; dead-lettered instead when it has used its attempts.
    pub async fn retry(
        &self,
        lease: &JobLease,
        error: &str,
        not_before: Timestamp,
        now: Timestamp,
    ) -> Result<Retried, QueueError> {
        self.named(async {
            let mut conn = self.pool.get().await.map_err(QueueError::Backend)?;
            let wake = self.payload(&FleetWake::Job, "");
            let row = conn
                .prepared()
                .query_opt(
                    "WITH r AS (UPDATE run_queue SET lease_owner = NULL, \
                         lease_expires_at = NULL, not_before = $4, last_error = $5 \
                         WHERE job_id = $1 AND lease_owner = $2 AND claims = $3 \
                         AND attempts < max_attempts RETURNING job_id) \
                     SELECT job_id, pg_notify($6, $7) FROM r",
                    &[
                        &lease.job_id.0,
                        &lease.worker_id,
                        &attempt(lease.attempt),
                        &not_before.as_unix_millis(),
                        &error,
                        &JOBS_CHANNEL,
                        &wake,
                    ],
                )
                .await?;
            drop(conn);
            if row.is_some() {
                return Ok(Retried::Requeued(not_before));
            }
            self.dead_letter(lease, error, now).await?;
            Ok(Retried::Dead)
        })
        .await
    }

    /// Moves a job to the dead letters with `error` (a failure no retry mends, or the last
    /// attempt's) and tells the thread's followers.
    pub async fn dead_letter(
        &self,
        lease: &JobLease,
        error: &str,
        now: Timestamp,
    ) -> Result<(), QueueError> {
        self.named(async {
            let mut conn = self.pool.get().await.map_err(QueueError::Backend)?;
            let schema = self.pool.schema.as_deref().unwrap_or("");
            let row = conn
                .prepared()
                .query_opt(
                    "WITH gone AS (DELETE FROM run_queue WHERE job_id = $1 AND lease_owner = $2 \
                         AND claims = $3 RETURNING *), \
                     dead AS (INSERT INTO run_queue_dead (job_id, thread_id, run_id, agent_id, \
                         payload, priority, attempts, enqueued_at, died_at, last_error) \
                         SELECT job_id, thread_id, run_id, agent_id, payload, priority, attempts, \
                         enqueued_at, $4, $5 FROM gone RETURNING thread_id) \
                     SELECT pg_notify($6, $7 || E'\\tdone\\t' || thread_id) FROM dead",
                    &[
                        &lease.job_id.0,
                        &lease.worker_id,
                        &attempt(lease.attempt),
                        &now.as_unix_millis(),
                        &error,
                        &RUNS_CHANNEL,
                        &schema,
                    ],
                )
                .await?;
            if row.is_none() {
                return Err(QueueError::Lost {
                    job_id: lease.job_id,
                });
            }
            Ok(())
        })
        .await
    }

    /// Gives `lease` up without counting the attempt (a worker draining): the job is claimable
    /// at once and the workers are woken. `false` when it was not held any more.
    pub async fn release(&self, lease: &JobLease) -> Result<bool, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let wake = self.payload(&FleetWake::Job, "");
            let row = conn
                .prepared()
                .query_opt(
                    "WITH r AS (UPDATE run_queue SET lease_owner = NULL, \
                         lease_expires_at = NULL, attempts = attempts - 1 \
                         WHERE job_id = $1 AND lease_owner = $2 AND claims = $3 \
                         RETURNING job_id) \
                     SELECT job_id, pg_notify($4, $5) FROM r",
                    &[
                        &lease.job_id.0,
                        &lease.worker_id,
                        &attempt(lease.attempt),
                        &JOBS_CHANNEL,
                        &wake,
                    ],
                )
                .await?;
            Ok(row.is_some())
        })
        .await
    }

    /// Asks the thread's job to stop: recorded on the job (its worker reads it at its next
    /// heartbeat, and a worker claiming it later finds it) and announced to the workers.
    /// The job, when the thread has one.
    pub async fn request_cancel(&self, thread_id: &ThreadId) -> Result<Option<JobId>, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let wake = self.payload(&FleetWake::Cancel(thread_id.clone()), thread_id.as_str());
            let row = conn
                .prepared()
                .query_opt(
                    "WITH c AS (UPDATE run_queue SET cancel_requested = TRUE \
                         WHERE thread_id = $1 RETURNING job_id) \
                     SELECT job_id, pg_notify($2, $3) FROM c",
                    &[&thread_id.as_str(), &JOBS_CHANNEL, &wake],
                )
                .await?;
            row.map(|r| r.try_get(0).map(JobId))
                .transpose()
                .map_err(StoreError::from)
        })
        .await
    }

    /// Where `job_id` stands.
    pub async fn job_state(&self, job_id: JobId) -> Result<JobState, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let row = conn
                .prepared()
                .query_opt(
                    "SELECT attempts, lease_owner, last_error, FALSE FROM run_queue \
                         WHERE job_id = $1 \
                     UNION ALL SELECT attempts, NULL, last_error, TRUE FROM run_queue_dead \
                         WHERE job_id = $1",
                    &[&job_id.0],
                )
                .await?;
            let Some(row) = row else {
                return Ok(JobState::Gone);
            };
            let attempts = count(row.try_get(0)?);
            let last_error: Option<String> = row.try_get(2)?;
            Ok(if row.try_get(3)? {
                JobState::Dead {
                    attempts,
                    error: last_error.unwrap_or_default(),
                }
            } else {
                JobState::Pending {
                    attempts,
                    claimed_by: row.try_get(1)?,
                    last_error,
                }
            })
        })
        .await
    }

    /// The thread's queued or claimed job, with the run it is for.
    pub async fn job_of_thread(
        &self,
        thread_id: &ThreadId,
    ) -> Result<Option<ThreadJob>, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let row = conn
                .prepared()
                .query_opt(
                    "SELECT job_id, run_id, after_event FROM run_queue WHERE thread_id = $1",
                    &[&thread_id.as_str()],
                )
                .await?;
            row.map(|r| {
                Ok(ThreadJob {
                    job_id: JobId(r.try_get(0)?),
                    run_id: run_of(r.try_get(1)?)?,
                    after_event: crate::codec::count("job's thread event count", r.try_get(2)?)?,
                })
            })
            .transpose()
        })
        .await
    }

    /// How many jobs are queued, claimed and dead at `now`.
    pub async fn depth(&self, now: Timestamp) -> Result<QueueDepth, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let row = conn
                .prepared()
                .query_one(
                    "SELECT \
                       (SELECT COUNT(*) FROM run_queue \
                          WHERE lease_owner IS NULL OR lease_expires_at <= $1), \
                       (SELECT COUNT(*) FROM run_queue \
                          WHERE lease_owner IS NOT NULL AND lease_expires_at > $1), \
                       (SELECT COUNT(*) FROM run_queue_dead)",
                    &[&now.as_unix_millis()],
                )
                .await?;
            let n = |i: usize| -> Result<u64, StoreError> {
                Ok(u64::try_from(row.try_get::<_, i64>(i)?).unwrap_or(0))
            };
            Ok(QueueDepth {
                queued: n(0)?,
                claimed: n(1)?,
                dead: n(2)?,
            })
        })
        .await
    }

    /// The dead-lettered jobs, newest first, at most `limit`.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadJob>, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let rows = conn
                .prepared()
                .query(
                    "SELECT job_id, thread_id, run_id, agent_id, attempts, enqueued_at, died_at, \
                         last_error FROM run_queue_dead ORDER BY died_at DESC, job_id DESC \
                     LIMIT $1",
                    &[&crate::codec::int(limit as u64)],
                )
                .await?;
            rows.iter()
                .map(|r| {
                    Ok(DeadJob {
                        job_id: JobId(r.try_get(0)?),
                        thread_id: thread_of(r.try_get(1)?)?,
                        run_id: run_of(r.try_get(2)?)?,
                        agent_id: r.try_get(3)?,
                        attempts: count(r.try_get(4)?),
                        enqueued_at: Timestamp::from_unix_millis(r.try_get(5)?),
                        died_at: Timestamp::from_unix_millis(r.try_get(6)?),
                        error: r.try_get(7)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// Announces `wake` for each of `threads` (one statement for all of them).
    pub async fn notify(&self, wake: &FleetWake, threads: &[ThreadId]) -> Result<(), StoreError> {
        if threads.is_empty() {
            return Ok(());
        }
        self.named(async {
            let payloads: Vec<String> = threads
                .iter()
                .map(|t| self.payload(wake, t.as_str()))
                .collect();
            let mut conn = self.pool.get().await?;
            conn.prepared()
                .execute(NOTIFY, &[&wake.channel(), &payloads])
                .await?;
            Ok(())
        })
        .await
    }
}
