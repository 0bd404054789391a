//! [`PostgresStore`]: several workers on one database (feature `postgres`), with a small
//! connection pool of its own.
//!
//! This module holds the configuration, the store and the [`ThreadStore`] implementation; the
//! connection pool is in `pool`, the schema in `schema`, a commit's transaction in `commit`, and
//! the reads in `load`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use awaken_event::{ProfileId, RunId, ThreadId};
use tokio_postgres::Row;

use crate::codec::{self, RUN_COLUMNS};
use crate::commit::{LeaseToken, RunRecord, ThreadCommit, Timestamp};
use crate::error::{CommitError, Database, InDatabase, LeaseError, StoreError};
#[cfg(feature = "failpoints")]
use crate::failpoint::FailPoint;
use crate::failpoint::Failpoints;
use crate::lease;
use crate::store::{
    Checkpoint, ClaimedRun, CommitReceipt, ProfileState, StoredEvent, ThreadStore, ThreadSummary,
};

mod commit;
mod listen;
mod load;
mod pool;
mod queue;
mod schema;
mod steer;
#[cfg(test)]
mod tests;

pub use listen::{FleetListener, Hear};
pub use queue::{
    ClaimedJob, DeadJob, Enqueued, FleetWake, JobBeat, JobId, JobLease, JobState, NewJob,
    QueueDepth, QueueError, Retried, RunQueue, ThreadJob,
};
pub use steer::{SteerAnswer, SteerId, SteerMessage};

use pool::Pool;

/// How to connect a [`PostgresStore`].
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// A libpq-style connection string or `postgresql://` URL. TLS is not supported: use a
    /// loopback or otherwise trusted network.
    pub url: String,
    /// The schema holding the tables (created if missing; `[a-z0-9_]`, at most 63 bytes).
    /// `None`: the connection's default search path (usually `public`).
    pub schema: Option<String>,
    /// The most connections the pool opens.
    pub max_connections: usize,
}

impl PostgresConfig {
    /// A configuration for `url`, default schema, at most 4 connections.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: None,
            max_connections: 4,
        }
    }

    /// Keeps the tables in `schema` (tests give each test its own).
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Sets the pool size (at least 1).
    pub fn with_max_connections(mut self, max_connections: usize) -> Self {
        self.max_connections = max_connections.max(1);
        self
    }
}

/// A [`ThreadStore`] in PostgreSQL. Each commit is one transaction that locks the thread row
/// (`SELECT … FOR UPDATE`) and the run row, so concurrent writers of a thread serialize and the
/// guards hold until `COMMIT`; leases are claimed with `FOR UPDATE SKIP LOCKED`, so concurrent
/// claimers never block on or share a run. The schema is migrated on connect under an advisory
/// lock, with the applied versions in `awaken_schema_version`.
///
/// Its errors name the server and database (`host:port/dbname`, with the schema; never the
/// password: [`StoreError::database`]).
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: Arc<Pool>,
    failpoints: Arc<Failpoints>,
    /// The server, database and schema, as errors name them.
    database: Database,
}

impl PostgresStore {
    /// Connects, creates the schema if needed and migrates it. Errors: `Config` for a bad
    /// schema name or a URL that does not parse, `Postgres` when the server is unreachable or
    /// refuses (naming the server and database; [`StoreError::kind`] tells refused credentials
    /// or an unknown database from a server that failed), `SchemaTooNew`.
    pub async fn connect(config: PostgresConfig) -> Result<Self, StoreError> {
        if let Some(schema) = &config.schema {
            let ok = !schema.is_empty()
                && schema.len() <= 63
                && schema
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !ok {
                return Err(StoreError::Config {
                    detail: format!("schema name {schema:?} must be 1-63 of [a-z0-9_]"),
                });
            }
        }
        // (The driver's message does not repeat the URL, which may hold a password.)
        let pg_config: tokio_postgres::Config =
            config.url.parse().map_err(|e| StoreError::Config {
                detail: format!("the PostgreSQL URL does not parse: {e}"),
            })?;
        let database = database(&pg_config, config.schema.as_deref());
        let pool = Pool::new(
            pg_config,
            config.schema.clone(),
            config.max_connections.max(1),
        );
        let store = Self {
            pool: Arc::new(pool),
            failpoints: Arc::new(Failpoints::default()),
            database,
        };
        store.named(schema::migrate(&store.pool)).await?;
        Ok(store)
    }

    /// The run queue in this store's database and schema.
    pub fn queue(&self) -> RunQueue {
        RunQueue::new(Arc::clone(&self.pool), self.database.clone())
    }

    /// The newest schema version this build knows.
    pub fn schema_version() -> i64 {
        schema::MIGRATIONS.len() as i64
    }

    /// Makes the next commit that reaches `point` fail there, inside its transaction.
    #[cfg(feature = "failpoints")]
    pub fn arm_failpoint(&self, point: FailPoint) {
        self.failpoints.arm(point);
    }

    /// What `operation` gives, an error from the database naming it.
    async fn named<T, E: InDatabase>(
        &self,
        operation: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        operation.await.map_err(|e| e.in_database(&self.database))
    }
}

/// The database as the store's errors name it: `host:port/dbname` (every host, comma-separated;
/// the database defaults to the user's name, as the server's does), and the schema; never the
/// password.
fn database(config: &tokio_postgres::Config, schema: Option<&str>) -> Database {
    use tokio_postgres::config::Host;
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let host = match host {
                Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                Host::Unix(dir) => dir.display().to_string(),
            };
            // One port for every host, or one per host; 5432 when none is given.
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            format!("{host}:{port}")
        })
        .collect();
    let hosts = if hosts.is_empty() {
        "localhost:5432".to_owned()
    } else {
        hosts.join(",")
    };
    let dbname = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    let mut name = format!("{hosts}/{dbname}");
    if let Some(schema) = schema {
        name.push_str(&format!(" (schema {schema})"));
    }
    Database::named(name)
}

/// A claimed run from a `RETURNING thread_id, lease_epoch, <run columns>` row.
fn claimed_row(
    row: &Row,
    worker_id: &str,
    expires_at: Timestamp,
) -> Result<ClaimedRun, StoreError> {
    codec::claimed_run(
        row.try_get(0)?,
        row.try_get(1)?,
        load::raw_run(row, 2)?,
        worker_id,
        expires_at,
    )
}

#[async_trait]
impl ThreadStore for PostgresStore {
    /// Reads the commit in place for the whole transaction (its future borrows it).
    async fn commit(&self, commit: &ThreadCommit) -> Result<CommitReceipt, CommitError> {
        self.named(async {
            commit
                .validate()
                .map_err(|v| CommitError::invalid(&commit.thread_id, v))?;
            let mut conn = self.pool.get().await?;
            commit::write(&mut conn, commit, &self.failpoints).await
        })
        .await
    }

    async fn load_checkpoint(
        &self,
        thread_id: &ThreadId,
    ) -> Result<Option<Checkpoint>, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let (client, statements) = conn.split();
            load::checkpoint(client, statements, thread_id).await
        })
        .await
        .map_err(|e| e.of_thread(thread_id))
    }

    async fn load_profile(&self, profile_id: &ProfileId) -> Result<ProfileState, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            load::profile(&mut conn.prepared(), profile_id).await
        })
        .await
    }

    async fn list_threads(&self) -> Result<Vec<ThreadSummary>, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            load::threads(&mut conn.prepared()).await
        })
        .await
    }

    async fn load_run(
        &self,
        thread_id: &ThreadId,
        run_id: &RunId,
    ) -> Result<Option<RunRecord>, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            load::run(&mut conn.prepared(), thread_id, run_id).await
        })
        .await
        .map_err(|e| e.of_thread(thread_id))
    }

    async fn list_runs(&self, thread_id: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            load::runs(&mut conn.prepared(), thread_id).await
        })
        .await
        .map_err(|e| e.of_thread(thread_id))
    }

    async fn latest_run(&self, thread_id: &ThreadId) -> Result<Option<RunRecord>, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            load::latest_run(&mut conn.prepared(), thread_id).await
        })
        .await
        .map_err(|e| e.of_thread(thread_id))
    }

    async fn run_thread(&self, run_id: &RunId) -> Result<Option<ThreadId>, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let row = conn
                .prepared()
                .query_opt(commit::RUN_THREAD, &[&run_id.as_str()])
                .await?;
            match row {
                Some(row) => Ok(Some(codec::thread_id(row.try_get(0)?)?)),
                None => Ok(None),
            }
        })
        .await
    }

    async fn load_events(
        &self,
        thread_id: &ThreadId,
        since: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            load::events(&mut conn.prepared(), thread_id, since).await
        })
        .await
        .map_err(|e| e.of_thread(thread_id))
    }

    async fn delete_thread(&self, thread_id: &ThreadId) -> Result<bool, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let tx = conn.transaction().await?;
            let tid = thread_id.as_str();
            // Lock the thread row first, in the same order as a commit, so the two cannot
            // deadlock.
            tx.execute(
                "SELECT 1 FROM threads WHERE thread_id = $1 FOR UPDATE",
                &[&tid],
            )
            .await?;
            tx.execute(
                "DELETE FROM run_state WHERE run_id IN \
                 (SELECT run_id FROM runs WHERE thread_id = $1)",
                &[&tid],
            )
            .await?;
            for table in ["runs", "messages", "events", "thread_state"] {
                tx.execute(
                    &format!("DELETE FROM {table} WHERE thread_id = $1"),
                    &[&tid],
                )
                .await?;
            }
            let existed = tx
                .execute("DELETE FROM threads WHERE thread_id = $1", &[&tid])
                .await?
                > 0;
            tx.commit().await?;
            Ok(existed)
        })
        .await
    }

    async fn claim_runnable(
        &self,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<ClaimedRun>, StoreError> {
        self.named(async {
            lease::check_worker(worker_id)?;
            let expires_at = now.saturating_add(lease_duration);
            let mut conn = self.pool.get().await?;
            // The claimed ids go to the update as an array, found by key: `IN` over the
            // subquery would be planned as a join that reads every run ever stored.
            let rows = conn
                .prepared()
                .query(
                    &format!(
                        "UPDATE runs SET lease_owner = $1, lease_epoch = lease_epoch + 1, \
                             lease_expires_at = $2 \
                         WHERE run_id = ANY(ARRAY(SELECT run_id FROM runs \
                             WHERE status = 'running' AND parent_run_id IS NULL \
                             AND (lease_owner IS NULL OR lease_expires_at <= $3) \
                             ORDER BY lease_epoch, updated_at, run_id LIMIT $4 FOR UPDATE SKIP LOCKED)) \
                         RETURNING thread_id, lease_epoch, {RUN_COLUMNS}"
                    ),
                    &[
                        &worker_id,
                        &expires_at.as_unix_millis(),
                        &now.as_unix_millis(),
                        &codec::int(limit as u64),
                    ],
                )
                .await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                out.push(claimed_row(&row, worker_id, expires_at)?);
            }
            lease::sort_claims(&mut out);
            Ok(out)
        })
        .await
    }

    async fn claim_run(
        &self,
        run_id: &RunId,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Option<ClaimedRun>, StoreError> {
        self.named(async {
            lease::check_worker(worker_id)?;
            let expires_at = now.saturating_add(lease_duration);
            let mut conn = self.pool.get().await?;
            let row = conn
                .prepared()
                .query_opt(
                    &format!(
                        "UPDATE runs SET lease_owner = $1, lease_epoch = lease_epoch + 1, \
                             lease_expires_at = $2 \
                         WHERE run_id = $3 AND status <> 'done' \
                             AND (lease_owner IS NULL OR lease_expires_at <= $4) \
                         RETURNING thread_id, lease_epoch, {RUN_COLUMNS}"
                    ),
                    &[
                        &worker_id,
                        &expires_at.as_unix_millis(),
                        &run_id.as_str(),
                        &now.as_unix_millis(),
                    ],
                )
                .await?;
            let Some(row) = row else {
                return Ok(None);
            };
            Ok(Some(claimed_row(&row, worker_id, expires_at)?))
        })
        .await
    }

    async fn heartbeat(
        &self,
        lease: &LeaseToken,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Timestamp, LeaseError> {
        self.named(async {
            let expires_at = now.saturating_add(lease_duration);
            let mut conn = self.pool.get().await?;
            let renewed = conn
                .prepared()
                .execute(
                    commit::RENEW_RUN_LEASE,
                    &[
                        &expires_at.as_unix_millis(),
                        &lease.run_id.as_str(),
                        &lease.worker_id,
                        &codec::int(lease.epoch),
                    ],
                )
                .await
                .map_err(StoreError::from)?;
            if renewed == 0 {
                return Err(LeaseError::Lost {
                    run_id: lease.run_id.clone(),
                });
            }
            Ok(expires_at)
        })
        .await
    }

    async fn release(&self, lease: &LeaseToken) -> Result<bool, StoreError> {
        self.named(async {
            let mut conn = self.pool.get().await?;
            let n = conn
                .prepared()
                .execute(
                    commit::RELEASE_RUN_LEASE,
                    &[
                        &lease.run_id.as_str(),
                        &lease.worker_id,
                        &codec::int(lease.epoch),
                    ],
                )
                .await?;
            Ok(n > 0)
        })
        .await
    }
}
