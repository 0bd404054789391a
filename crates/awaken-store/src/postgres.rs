//! [`PostgresStore`]: several workers on one database (feature `postgres`), with a small
//! connection pool of its own.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use awaken_event::{ProfileId, RunId, ThreadId};
use awaken_state::PersistedState;
use tokio_postgres::{Client, IsolationLevel, Row, Transaction};

use crate::codec::{self, RUN_COLUMNS, RawRun};
use crate::commit::{
    BatchData, BatchWrite, LeaseToken, RunRecord, RunStatus, ThreadCommit, Timestamp,
};
use crate::error::StoreError;
use crate::failpoint::{FailPoint, Failpoints};
use crate::memory::check_worker;
use crate::store::{
    Checkpoint, ClaimedRun, CommitReceipt, ProfileEntry, ProfileState, StoredEvent, ThreadStore,
    ThreadSummary,
};

mod pool;
mod schema;

use pool::Pool;
use schema::MIGRATIONS;

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
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: Arc<Pool>,
    failpoints: Arc<Failpoints>,
}

/// Advisory lock key of schema migrations (any constant shared by every build).
const MIGRATION_LOCK: i64 = 0x6177_616b_656e;

impl PostgresStore {
    /// Connects, creates the schema if needed and migrates it. Errors: `Config` for a bad
    /// schema name, `Postgres` when the server is unreachable, `SchemaTooNew`.
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
        let pg_config: tokio_postgres::Config = config.url.parse()?;
        let pool = Pool::new(
            pg_config,
            config.schema.clone(),
            config.max_connections.max(1),
        );
        let store = Self {
            pool: Arc::new(pool),
            failpoints: Arc::new(Failpoints::default()),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// The newest schema version this build knows.
    pub fn schema_version() -> i64 {
        MIGRATIONS.len() as i64
    }

    /// Makes the next commit that reaches `point` fail there, inside its transaction.
    #[cfg(feature = "failpoints")]
    pub fn arm_failpoint(&self, point: FailPoint) {
        self.failpoints.arm(point);
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        if let Some(schema) = &self.pool.schema {
            tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
                .await?;
        }
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS awaken_schema_version (version BIGINT PRIMARY KEY)",
        )
        .await?;
        let found: i64 = tx
            .query_one(
                "SELECT COALESCE(MAX(version), 0)::BIGINT FROM awaken_schema_version",
                &[],
            )
            .await?
            .try_get(0)?;
        let supported = MIGRATIONS.len() as i64;
        if found > supported {
            return Err(StoreError::SchemaTooNew { found, supported });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
            tx.batch_execute(sql).await?;
            let version = i as i64 + 1;
            tx.execute(
                "INSERT INTO awaken_schema_version (version) VALUES ($1)",
                &[&version],
            )
            .await?;
            tracing::info!(version, "postgres store: schema migrated");
        }
        tx.commit().await?;
        Ok(())
    }
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
        raw_run(row, 2)?,
        worker_id,
        expires_at,
    )
}

fn raw_run(row: &Row, at: usize) -> Result<RawRun, tokio_postgres::Error> {
    Ok(RawRun {
        run_id: row.try_get(at)?,
        parent_run_id: row.try_get(at + 1)?,
        agent_id: row.try_get(at + 2)?,
        profile_id: row.try_get(at + 3)?,
        status: row.try_get(at + 4)?,
        termination: row.try_get(at + 5)?,
        steps: row.try_get(at + 6)?,
        usage: row.try_get(at + 7)?,
        spec_digest: row.try_get(at + 8)?,
        created_at: row.try_get(at + 9)?,
        updated_at: row.try_get(at + 10)?,
    })
}

async fn commit_tx(
    tx: &Transaction<'_>,
    c: &ThreadCommit,
    fp: &Failpoints,
) -> Result<CommitReceipt, StoreError> {
    let tid = c.thread_id.as_str();
    let rid = c.run.run_id.as_str();
    let now = c.run.updated_at.as_unix_millis();

    // Lock the thread row (creating a placeholder that the rollback removes on failure).
    tx.execute(
        "INSERT INTO threads (thread_id, message_count, event_count, latest_run_id, \
             state_revision, created_at, updated_at) VALUES ($1, 0, 0, NULL, 0, $2, $2) \
         ON CONFLICT (thread_id) DO NOTHING",
        &[&tid, &now],
    )
    .await?;
    let row = tx
        .query_one(
            "SELECT message_count, event_count, state_revision FROM threads \
             WHERE thread_id = $1 FOR UPDATE",
            &[&tid],
        )
        .await?;
    let message_count: i64 = row.try_get(0)?;
    let event_count: i64 = row.try_get(1)?;
    let thread_revision: i64 = row.try_get(2)?;
    let actual = codec::count("message count", message_count)?;
    if actual != c.expected_message_count {
        return Err(StoreError::VersionConflict {
            expected: c.expected_message_count,
            actual,
        });
    }
    let run = tx
        .query_opt(
            "SELECT thread_id, lease_owner, lease_epoch, batch FROM runs \
             WHERE run_id = $1 FOR UPDATE",
            &[&rid],
        )
        .await?;
    if let Some(run) = &run {
        let stored_tid: String = run.try_get(0)?;
        if stored_tid != tid {
            return Err(StoreError::RunOnOtherThread {
                run_id: c.run.run_id.clone(),
                thread_id: c.thread_id.clone(),
                stored_thread_id: codec::thread_id(&stored_tid)?,
            });
        }
    }
    if let Some(lease) = &c.lease {
        let held = match &run {
            Some(run) => {
                let owner: Option<String> = run.try_get(1)?;
                let epoch: i64 = run.try_get(2)?;
                owner.as_deref() == Some(lease.worker_id.as_str())
                    && epoch == codec::int(lease.epoch)
            }
            None => false,
        };
        if !held {
            return Err(StoreError::LeaseLost {
                run_id: c.run.run_id.clone(),
            });
        }
    }
    if c.run.status == RunStatus::Done
        && matches!(c.batch, BatchWrite::Keep)
        && let Some(run) = &run
        && let Some(batch) = run.try_get::<_, Option<String>>(3)?
    {
        let batch = codec::value("tool batch", &batch)?;
        crate::commit::check_batch(&BatchData::json(batch), RunStatus::Done)
            .map_err(|v| StoreError::invalid(&c.thread_id, v))?;
    }
    let profile_id = c.run.profile_id.as_ref().map(ProfileId::as_str);
    if let Some(pid) = profile_id
        && !c.profile_versions.is_empty()
    {
        let stmt = tx
            .prepare(
                "SELECT version FROM profile_state WHERE profile_id = $1 AND key = $2 FOR UPDATE",
            )
            .await?;
        for (key, read) in &c.profile_versions {
            let current: i64 = match tx.query_opt(&stmt, &[&pid, key]).await? {
                Some(row) => row.try_get(0)?,
                None => 0,
            };
            if current != codec::int(*read) {
                return Err(StoreError::ProfileConflict { key: key.clone() });
            }
        }
    }

    // Writes.
    if !c.messages.is_empty() {
        let stmt = tx
            .prepare("INSERT INTO messages (thread_id, idx, body) VALUES ($1, $2, $3)")
            .await?;
        for (i, m) in c.messages.iter().enumerate() {
            let body = codec::to_json("message", m)?;
            let idx = message_count + i as i64;
            tx.execute(&stmt, &[&tid, &idx, &body]).await?;
        }
    }
    fp.check(FailPoint::AfterMessages)?;

    let enc = codec::encode_run(&c.run)?;
    let (batch_mode, batch): (i64, Option<String>) = match &c.batch {
        BatchWrite::Keep => (0, None),
        BatchWrite::Set(b) => (1, Some(codec::batch_text(b)?)),
        BatchWrite::Clear => (2, None),
    };
    let run_revision = (!c.run_state.values.is_empty()).then(|| codec::int(c.run_state.revision));
    let parent = c.run.parent_run_id.as_ref().map(RunId::as_str);
    let steps = i64::from(c.run.steps);
    let created = c.run.created_at.as_unix_millis();
    let written = tx.execute(
        "INSERT INTO runs (run_id, thread_id, parent_run_id, agent_id, profile_id, status, \
             termination, steps, usage, spec_digest, created_at, updated_at, state_revision, batch) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, COALESCE($13::BIGINT, 0), $14) \
         ON CONFLICT (run_id) DO UPDATE SET \
             parent_run_id = excluded.parent_run_id, agent_id = excluded.agent_id, \
             profile_id = excluded.profile_id, status = excluded.status, \
             termination = excluded.termination, steps = excluded.steps, usage = excluded.usage, \
             spec_digest = excluded.spec_digest, updated_at = excluded.updated_at, \
             state_revision = COALESCE($13::BIGINT, runs.state_revision), \
             batch = CASE $15::BIGINT WHEN 0 THEN runs.batch WHEN 1 THEN excluded.batch \
                 ELSE NULL END, \
             lease_owner = CASE WHEN excluded.status = 'done' THEN NULL \
                 ELSE runs.lease_owner END, \
             lease_expires_at = CASE WHEN excluded.status = 'done' THEN NULL \
                 ELSE runs.lease_expires_at END \
         WHERE runs.thread_id = excluded.thread_id",
        &[
            &rid,
            &tid,
            &parent,
            &&*c.run.agent_id,
            &profile_id,
            &c.run.status.as_str(),
            &enc.termination,
            &steps,
            &enc.usage,
            &&*c.run.spec_digest,
            &created,
            &now,
            &run_revision,
            &batch,
            &batch_mode,
        ],
    )
    .await?;
    if written == 0 {
        // The run was not there when checked, and another transaction has since put it on
        // another thread (the check's row lock cannot lock a row that does not exist yet).
        let stored: String = tx
            .query_one("SELECT thread_id FROM runs WHERE run_id = $1", &[&rid])
            .await?
            .try_get(0)?;
        return Err(StoreError::RunOnOtherThread {
            run_id: c.run.run_id.clone(),
            thread_id: c.thread_id.clone(),
            stored_thread_id: codec::thread_id(&stored)?,
        });
    }
    fp.check(FailPoint::AfterRun)?;

    if !c.run_state.values.is_empty() {
        let stmt = tx
            .prepare(
                "INSERT INTO run_state (run_id, key, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value",
            )
            .await?;
        for (k, v) in &c.run_state.values {
            let v = codec::state_text("run state", v)?;
            tx.execute(&stmt, &[&rid, k, &v]).await?;
        }
    }
    if !c.thread_state.values.is_empty() {
        let stmt = tx
            .prepare(
                "INSERT INTO thread_state (thread_id, key, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (thread_id, key) DO UPDATE SET value = excluded.value",
            )
            .await?;
        for (k, v) in &c.thread_state.values {
            let v = codec::state_text("thread state", v)?;
            tx.execute(&stmt, &[&tid, k, &v]).await?;
        }
    }
    let mut profile_versions = BTreeMap::new();
    if let Some(pid) = profile_id
        && !c.profile_state.values.is_empty()
    {
        // The version condition also catches a concurrent first insert of the same key, which
        // the `FOR UPDATE` above cannot lock.
        let stmt = tx
            .prepare(
                "INSERT INTO profile_state (profile_id, key, value, version) \
                 VALUES ($1, $2, $3, 1) \
                 ON CONFLICT (profile_id, key) DO UPDATE SET value = excluded.value, \
                     version = profile_state.version + 1 \
                 WHERE profile_state.version = $4",
            )
            .await?;
        // In key order, like the `FOR UPDATE` above: two commits writing the same new keys of
        // one profile take their row locks in one order (a conflict, retried, not a deadlock).
        let mut written: Vec<_> = c.profile_state.values.iter().collect();
        written.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (k, v) in written {
            let v = codec::state_text("profile state", v)?;
            let read = c.profile_versions.get(k.as_ref()).copied().unwrap_or(0);
            let n = tx.execute(&stmt, &[&pid, k, &v, &codec::int(read)]).await?;
            if n != 1 {
                return Err(StoreError::ProfileConflict { key: k.to_string() });
            }
            profile_versions.insert(k.to_string(), read + 1);
        }
    }
    fp.check(FailPoint::AfterState)?;

    let mut seq = event_count;
    if !c.events.is_empty() {
        let stmt = tx
            .prepare("INSERT INTO events (thread_id, seq, run_id, body) VALUES ($1, $2, $3, $4)")
            .await?;
        for e in c.events.iter() {
            seq += 1;
            let body = codec::to_json("event", e)?;
            tx.execute(&stmt, &[&tid, &seq, &rid, &body]).await?;
        }
    }
    fp.check(FailPoint::AfterEvents)?;

    let thread_revision = if c.thread_state.values.is_empty() {
        thread_revision
    } else {
        codec::int(c.thread_state.revision)
    };
    let new_count = codec::int(c.message_count_after());
    tx.execute(
        "UPDATE threads SET message_count = $2, event_count = $3, latest_run_id = $4, \
             state_revision = $5, updated_at = $6 WHERE thread_id = $1",
        &[&tid, &new_count, &seq, &rid, &thread_revision, &now],
    )
    .await?;
    Ok(CommitReceipt {
        message_count: c.message_count_after(),
        last_event_seq: codec::count("event count", seq)?,
        profile_versions,
    })
}

async fn state_map(
    tx: &Transaction<'_>,
    sql: &str,
    id: &str,
    what: &'static str,
) -> Result<BTreeMap<String, serde_json::Value>, StoreError> {
    let mut out = BTreeMap::new();
    for row in tx.query(sql, &[&id]).await? {
        let k: String = row.try_get(0)?;
        let v: String = row.try_get(1)?;
        out.insert(k, codec::value(what, &v)?);
    }
    Ok(out)
}

async fn load_profile_on(
    client: &Client,
    profile_id: &ProfileId,
) -> Result<ProfileState, StoreError> {
    let mut keys = BTreeMap::new();
    let rows = client
        .query(
            "SELECT key, value, version FROM profile_state WHERE profile_id = $1",
            &[&profile_id.as_str()],
        )
        .await?;
    for row in rows {
        let k: String = row.try_get(0)?;
        let v: String = row.try_get(1)?;
        let version: i64 = row.try_get(2)?;
        keys.insert(
            k,
            ProfileEntry {
                value: codec::value("profile state", &v)?,
                version: codec::count("profile key version", version)?,
            },
        );
    }
    Ok(ProfileState {
        profile_id: profile_id.clone(),
        keys,
    })
}

async fn load_checkpoint_tx(
    tx: &Transaction<'_>,
    thread_id: &ThreadId,
) -> Result<Option<Checkpoint>, StoreError> {
    let tid = thread_id.as_str();
    let Some(row) = tx
        .query_opt(
            "SELECT latest_run_id, state_revision, event_count FROM threads WHERE thread_id = $1",
            &[&tid],
        )
        .await?
    else {
        return Ok(None);
    };
    let latest_run: Option<String> = row.try_get(0)?;
    let thread_revision: i64 = row.try_get(1)?;
    let event_count: i64 = row.try_get(2)?;
    let mut messages = Vec::new();
    for row in tx
        .query(
            "SELECT body FROM messages WHERE thread_id = $1 ORDER BY idx",
            &[&tid],
        )
        .await?
    {
        messages.push(codec::message(row.try_get::<_, &str>(0)?)?);
    }
    let thread_state = PersistedState {
        revision: codec::count("state revision", thread_revision)?,
        values: state_map(
            tx,
            "SELECT key, value FROM thread_state WHERE thread_id = $1",
            tid,
            "thread state",
        )
        .await?,
    };
    let mut checkpoint = Checkpoint {
        thread_id: thread_id.clone(),
        messages,
        thread_state,
        run: None,
        run_state: PersistedState::default(),
        profile: None,
        batch: None,
        last_event_seq: codec::count("event count", event_count)?,
    };
    if let Some(rid) = latest_run
        && let Some(row) = tx
            .query_opt(
                &format!("SELECT {RUN_COLUMNS}, state_revision, batch FROM runs WHERE run_id = $1"),
                &[&rid],
            )
            .await?
    {
        let run = raw_run(&row, 0)?.decode()?;
        let run_revision: i64 = row.try_get(11)?;
        let batch: Option<String> = row.try_get(12)?;
        checkpoint.run_state = PersistedState {
            revision: codec::count("state revision", run_revision)?,
            values: state_map(
                tx,
                "SELECT key, value FROM run_state WHERE run_id = $1",
                &rid,
                "run state",
            )
            .await?,
        };
        checkpoint.batch = batch.map(|b| codec::value("tool batch", &b)).transpose()?;
        if let Some(pid) = &run.profile_id {
            checkpoint.profile = Some(load_profile_on(tx.client(), pid).await?);
        }
        checkpoint.run = Some(run);
    }
    Ok(Some(checkpoint))
}

#[async_trait]
impl ThreadStore for PostgresStore {
    async fn commit(&self, commit: ThreadCommit) -> Result<CommitReceipt, StoreError> {
        commit
            .validate()
            .map_err(|v| StoreError::invalid(&commit.thread_id, v))?;
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        match commit_tx(&tx, &commit, &self.failpoints).await {
            Ok(receipt) => {
                tx.commit().await?;
                Ok(receipt)
            }
            Err(e) => {
                if let Err(error) = tx.rollback().await {
                    tracing::warn!(%error, "postgres store: rollback failed");
                }
                Err(e)
            }
        }
    }

    async fn load_checkpoint(
        &self,
        thread_id: &ThreadId,
    ) -> Result<Option<Checkpoint>, StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = conn
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let checkpoint = load_checkpoint_tx(&tx, thread_id).await?;
        tx.commit().await?;
        Ok(checkpoint)
    }

    async fn load_profile(&self, profile_id: &ProfileId) -> Result<ProfileState, StoreError> {
        let conn = self.pool.get().await?;
        load_profile_on(&conn, profile_id).await
    }

    async fn list_threads(&self) -> Result<Vec<ThreadSummary>, StoreError> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query(
                "SELECT thread_id, message_count, latest_run_id, created_at, updated_at \
                 FROM threads ORDER BY thread_id",
                &[],
            )
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let latest: Option<&str> = row.try_get(2)?;
            out.push(ThreadSummary {
                thread_id: codec::thread_id(row.try_get(0)?)?,
                message_count: codec::count("message count", row.try_get(1)?)?,
                latest_run_id: latest.map(codec::run_id).transpose()?,
                created_at: Timestamp::from_unix_millis(row.try_get(3)?),
                updated_at: Timestamp::from_unix_millis(row.try_get(4)?),
            });
        }
        Ok(out)
    }

    async fn list_runs(&self, thread_id: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query(
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs WHERE thread_id = $1 \
                     ORDER BY created_at, run_id"
                ),
                &[&thread_id.as_str()],
            )
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            out.push(raw_run(&row, 0)?.decode()?);
        }
        Ok(out)
    }

    async fn load_events(
        &self,
        thread_id: &ThreadId,
        since: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query(
                "SELECT seq, run_id, body FROM events WHERE thread_id = $1 AND seq > $2 \
                 ORDER BY seq",
                &[&thread_id.as_str(), &codec::int(since)],
            )
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            out.push(StoredEvent {
                seq: codec::count("event seq", row.try_get(0)?)?,
                run_id: codec::run_id(row.try_get(1)?)?,
                event: codec::event(row.try_get(2)?)?,
            });
        }
        Ok(out)
    }

    async fn delete_thread(&self, thread_id: &ThreadId) -> Result<bool, StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        let tid = thread_id.as_str();
        // Lock the thread row first, in the same order as a commit, so the two cannot deadlock.
        tx.execute(
            "SELECT 1 FROM threads WHERE thread_id = $1 FOR UPDATE",
            &[&tid],
        )
        .await?;
        tx.execute(
            "DELETE FROM run_state WHERE run_id IN (SELECT run_id FROM runs WHERE thread_id = $1)",
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
    }

    async fn claim_runnable(
        &self,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<ClaimedRun>, StoreError> {
        check_worker(worker_id)?;
        let expires_at = now.saturating_add(lease_duration);
        let conn = self.pool.get().await?;
        let rows = conn
            .query(
                &format!(
                    "UPDATE runs SET lease_owner = $1, lease_epoch = lease_epoch + 1, \
                         lease_expires_at = $2 \
                     WHERE run_id IN (SELECT run_id FROM runs WHERE status <> 'done' \
                         AND (lease_owner IS NULL OR lease_expires_at <= $3) \
                         ORDER BY updated_at, run_id LIMIT $4 FOR UPDATE SKIP LOCKED) \
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
        out.sort_by(|a, b| {
            (a.run.updated_at, &a.run.run_id).cmp(&(b.run.updated_at, &b.run.run_id))
        });
        Ok(out)
    }

    async fn claim_run(
        &self,
        run_id: &RunId,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Option<ClaimedRun>, StoreError> {
        check_worker(worker_id)?;
        let expires_at = now.saturating_add(lease_duration);
        let conn = self.pool.get().await?;
        let row = conn
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
    }

    async fn heartbeat(
        &self,
        lease: &LeaseToken,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Timestamp, StoreError> {
        let expires_at = now.saturating_add(lease_duration);
        let conn = self.pool.get().await?;
        let n = conn
            .execute(
                "UPDATE runs SET lease_expires_at = $1 WHERE run_id = $2 \
                 AND lease_owner = $3 AND lease_epoch = $4",
                &[
                    &expires_at.as_unix_millis(),
                    &lease.run_id.as_str(),
                    &lease.worker_id,
                    &codec::int(lease.epoch),
                ],
            )
            .await?;
        if n == 0 {
            return Err(StoreError::LeaseLost {
                run_id: lease.run_id.clone(),
            });
        }
        Ok(expires_at)
    }

    async fn release(&self, lease: &LeaseToken) -> Result<bool, StoreError> {
        let conn = self.pool.get().await?;
        let n = conn
            .execute(
                "UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL \
                 WHERE run_id = $1 AND lease_owner = $2 AND lease_epoch = $3",
                &[
                    &lease.run_id.as_str(),
                    &lease.worker_id,
                    &codec::int(lease.epoch),
                ],
            )
            .await?;
        Ok(n > 0)
    }
}
