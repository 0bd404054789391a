//! [`SqliteStore`]: the embedded default (feature `sqlite`), one file in WAL mode.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use async_trait::async_trait;
use awaken_event::{ProfileId, RunId, ThreadId};
use awaken_state::PersistedState;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

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

/// SQLite's `synchronous` setting (how often it waits for the disk).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// `OFF`: never waits; a power loss may lose recent commits (a crash of the process does not).
    Off,
    /// `NORMAL` (default): with WAL, a power loss may lose the last commits, never corrupts.
    #[default]
    Normal,
    /// `FULL`: every commit waits for the disk.
    Full,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Off => "OFF",
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// How to open a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteConfig {
    /// The database file (created if missing). `None`: a private in-memory database.
    pub path: Option<PathBuf>,
    /// The `synchronous` pragma.
    pub synchronous: Synchronous,
    /// How long a write waits for another process's lock before failing.
    pub busy_timeout: Duration,
    /// Whether a commit through `commit_now` may run on the caller's thread (default `true`):
    /// when the store's connection is free and no other process holds the database's write
    /// lock (the attempt never waits for either: a busy database hands the commit to the
    /// blocking pool, which waits up to `busy_timeout`). A WAL commit that does not wait for the
    /// disk (`synchronous` `NORMAL` or `OFF`) takes tens of microseconds, less than handing it
    /// to tokio's blocking pool and waking the caller again; WAL checkpoints (which do wait for
    /// the disk) then run on the blocking pool instead of inside a commit. With `false`, or with
    /// [`Synchronous::Full`], every commit runs on the blocking pool.
    pub inline_commits: bool,
}

impl SqliteConfig {
    /// A file database with the defaults (WAL, `synchronous=NORMAL`, 5 s busy timeout).
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self {
            path: Some(path.into()),
            synchronous: Synchronous::Normal,
            busy_timeout: Duration::from_secs(5),
            inline_commits: true,
        }
    }

    /// A private in-memory database (tests).
    pub fn in_memory() -> Self {
        Self {
            path: None,
            synchronous: Synchronous::Normal,
            busy_timeout: Duration::from_secs(5),
            inline_commits: true,
        }
    }

    /// Sets whether commits may run on the caller's thread ([`SqliteConfig::inline_commits`]).
    pub fn with_inline_commits(mut self, inline: bool) -> Self {
        self.inline_commits = inline;
        self
    }

    /// Whether commits run on the caller's thread: asked for, and not waiting for the disk.
    fn commits_inline(&self) -> bool {
        self.inline_commits && self.synchronous != Synchronous::Full
    }

    /// Whether the store runs the WAL checkpoints itself: a file database (an in-memory one has
    /// no WAL) whose commits run inline.
    fn own_checkpoints(&self) -> bool {
        self.commits_inline() && self.path.is_some()
    }

    /// Sets the `synchronous` pragma.
    pub fn with_synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }
}

/// A [`ThreadStore`] in one SQLite file (WAL journal, `synchronous=NORMAL` by default), with
/// schema migrations recorded in `awaken_schema_version`. One connection serves the store; its
/// blocking calls run on tokio's blocking pool, except a commit that finds the connection free
/// when [`SqliteConfig::inline_commits`] allows it (see there). Each commit is one `IMMEDIATE`
/// transaction.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    failpoints: Arc<Failpoints>,
    /// Whether commits may run on the caller's thread ([`SqliteConfig::inline_commits`], not
    /// with [`Synchronous::Full`]).
    inline: bool,
    /// How long a write on the blocking pool waits for another process's lock.
    busy_timeout: Duration,
    /// `Some` for a file database whose commits may run inline: SQLite's automatic checkpoints
    /// are off, and the store runs them on the blocking pool.
    checkpoints: Option<Arc<Checkpoints>>,
}

/// The store's own WAL checkpoints, for a connection whose commits run inline (SQLite's
/// automatic checkpoint would run inside a commit, waiting for the disk on the caller's thread).
#[derive(Debug, Default)]
struct Checkpoints {
    /// Writes since the last checkpoint was started.
    writes: AtomicU32,
    /// A checkpoint is scheduled or running.
    running: AtomicBool,
}

/// Writes (commits, lease changes, deletions) between two WAL checkpoints. A commit writes a
/// handful of pages to the WAL; SQLite's automatic checkpoint would run at 1,000 pages, which
/// this keeps the WAL near.
const WRITES_PER_CHECKPOINT: u32 = 128;

/// Clears [`Checkpoints::running`] when dropped: after the checkpoint, and also when its task
/// panics or is dropped unrun (a runtime shutting down), so checkpoints never stop for good.
struct CheckpointDone(Arc<Checkpoints>);

impl Drop for CheckpointDone {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
    }
}

impl Checkpoints {
    /// Counts a write; every [`WRITES_PER_CHECKPOINT`] writes, checkpoints the WAL on the
    /// blocking pool (or here, outside a tokio runtime).
    fn wrote(self: &Arc<Self>, conn: &Arc<Mutex<Connection>>) {
        let before = self.writes.fetch_add(1, Ordering::Relaxed);
        if before < WRITES_PER_CHECKPOINT - 1 || self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        self.writes.store(0, Ordering::Relaxed);
        let done = CheckpointDone(Arc::clone(self));
        let conn = Arc::clone(conn);
        let run = move || {
            let _done = done;
            let conn = conn.lock().unwrap_or_else(|e| e.into_inner());
            // PASSIVE: copies what it can without waiting for readers or writers of other
            // connections. A failure only leaves the WAL longer until the next one.
            if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                tracing::warn!(error = %e, "sqlite store: WAL checkpoint failed");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn_blocking(run)),
            Err(_) => run(),
        }
    }
}

/// The schema, one entry per version; never edit a released entry, append a new one.
const MIGRATIONS: &[&str] = &[r#"
CREATE TABLE threads (
    thread_id      TEXT PRIMARY KEY,
    message_count  INTEGER NOT NULL,
    event_count    INTEGER NOT NULL,
    latest_run_id  TEXT,
    state_revision INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL
);
CREATE TABLE messages (
    thread_id TEXT NOT NULL,
    idx       INTEGER NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (thread_id, idx)
) WITHOUT ROWID;
CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    thread_id        TEXT NOT NULL,
    parent_run_id    TEXT,
    agent_id         TEXT NOT NULL,
    profile_id       TEXT,
    status           TEXT NOT NULL,
    termination      TEXT,
    steps            INTEGER NOT NULL,
    usage            TEXT NOT NULL,
    spec_digest      TEXT NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    state_revision   INTEGER NOT NULL,
    batch            TEXT,
    lease_owner      TEXT,
    lease_epoch      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER
);
CREATE INDEX runs_by_thread ON runs (thread_id, created_at);
CREATE INDEX runs_unfinished ON runs (updated_at) WHERE status <> 'done';
CREATE TABLE run_state (
    run_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
) WITHOUT ROWID;
CREATE TABLE thread_state (
    thread_id TEXT NOT NULL,
    key       TEXT NOT NULL,
    value     TEXT NOT NULL,
    PRIMARY KEY (thread_id, key)
) WITHOUT ROWID;
CREATE TABLE profile_state (
    profile_id TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    version    INTEGER NOT NULL,
    PRIMARY KEY (profile_id, key)
) WITHOUT ROWID;
CREATE TABLE events (
    thread_id TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    run_id    TEXT NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (thread_id, seq)
) WITHOUT ROWID;
"#];

impl SqliteStore {
    /// Opens (creating if needed) the database, sets WAL and `synchronous`, and migrates the
    /// schema. `SchemaTooNew` if the file was written by a newer build.
    pub async fn open(config: SqliteConfig) -> Result<Self, StoreError> {
        let inline = config.commits_inline();
        let own_checkpoints = config.own_checkpoints();
        let busy_timeout = config.busy_timeout;
        let conn = blocking(move || open_connection(&config)).await??;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            failpoints: Arc::new(Failpoints::default()),
            inline,
            busy_timeout,
            checkpoints: own_checkpoints.then(Arc::default),
        })
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

    /// [`with_conn`](Self::with_conn) for a write: counted towards the next WAL checkpoint.
    async fn write_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection, &Failpoints) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let written = self.with_conn(f).await;
        self.count_write();
        written
    }

    /// Counts a write towards the next WAL checkpoint (when the store runs them).
    fn count_write(&self) {
        if let Some(checkpoints) = &self.checkpoints {
            checkpoints.wrote(&self.conn);
        }
    }

    async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection, &Failpoints) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = Arc::clone(&self.conn);
        let failpoints = Arc::clone(&self.failpoints);
        blocking(move || {
            // A panic inside a transaction rolls it back when the transaction drops, so a
            // poisoned connection is still consistent.
            let mut conn = conn.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut conn, &failpoints)
        })
        .await?
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Task {
            detail: e.to_string(),
        })
}

fn open_connection(config: &SqliteConfig) -> Result<Connection, StoreError> {
    let mut conn = match &config.path {
        Some(path) => Connection::open(path)?,
        None => Connection::open_in_memory()?,
    };
    conn.busy_timeout(config.busy_timeout)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", config.synchronous.pragma())?;
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    if config.own_checkpoints() {
        // The store checkpoints on the blocking pool ([`Checkpoints`]), not inside a commit.
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    }
    migrate(&mut conn)?;
    Ok(conn)
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS awaken_schema_version (version INTEGER NOT NULL PRIMARY KEY)",
    )?;
    let found: i64 = tx.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM awaken_schema_version",
        [],
        |r| r.get(0),
    )?;
    let supported = MIGRATIONS.len() as i64;
    if found > supported {
        return Err(StoreError::SchemaTooNew { found, supported });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO awaken_schema_version (version) VALUES (?1)",
            [i as i64 + 1],
        )?;
        tracing::info!(version = i + 1, "sqlite store: schema migrated");
    }
    tx.commit()?;
    Ok(())
}

fn raw_run(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<RawRun> {
    Ok(RawRun {
        run_id: r.get(at)?,
        parent_run_id: r.get(at + 1)?,
        agent_id: r.get(at + 2)?,
        profile_id: r.get(at + 3)?,
        status: r.get(at + 4)?,
        termination: r.get(at + 5)?,
        steps: r.get(at + 6)?,
        usage: r.get(at + 7)?,
        spec_digest: r.get(at + 8)?,
        created_at: r.get(at + 9)?,
        updated_at: r.get(at + 10)?,
    })
}

fn commit_tx(
    conn: &mut Connection,
    c: &ThreadCommit,
    fp: &Failpoints,
) -> Result<CommitReceipt, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let tid = c.thread_id.as_str();
    let rid = c.run.run_id.as_str();

    // Checks first (the transaction holds the write lock, so they stay true until COMMIT).
    let thread: Option<(i64, i64, i64)> = tx
        .prepare_cached(
            "SELECT message_count, event_count, state_revision FROM threads WHERE thread_id = ?1",
        )?
        .query_row([tid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let (message_count, event_count, thread_revision) = thread.unwrap_or((0, 0, 0));
    let actual = codec::count("message count", message_count)?;
    if actual != c.expected_message_count {
        return Err(StoreError::VersionConflict {
            expected: c.expected_message_count,
            actual,
        });
    }
    let run: Option<(String, Option<String>, i64, Option<String>)> = tx
        .prepare_cached(
            "SELECT thread_id, lease_owner, lease_epoch, batch FROM runs WHERE run_id = ?1",
        )?
        .query_row([rid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .optional()?;
    if let Some((stored_tid, _, _, _)) = &run
        && stored_tid != tid
    {
        return Err(StoreError::RunOnOtherThread {
            run_id: c.run.run_id.clone(),
            thread_id: c.thread_id.clone(),
            stored_thread_id: codec::thread_id(stored_tid)?,
        });
    }
    if let Some(lease) = &c.lease {
        let held = run.as_ref().is_some_and(|(_, owner, epoch, _)| {
            owner.as_deref() == Some(lease.worker_id.as_str()) && *epoch == codec::int(lease.epoch)
        });
        if !held {
            return Err(StoreError::LeaseLost {
                run_id: c.run.run_id.clone(),
            });
        }
    }
    if c.run.status == RunStatus::Done
        && matches!(c.batch, BatchWrite::Keep)
        && let Some((_, _, _, Some(batch))) = &run
    {
        let batch = codec::value("tool batch", batch)?;
        crate::commit::check_batch(&BatchData::json(batch), RunStatus::Done)
            .map_err(|v| StoreError::invalid(&c.thread_id, v))?;
    }
    let profile_id = c.run.profile_id.as_ref().map(ProfileId::as_str);
    if let Some(pid) = profile_id {
        let mut stmt = tx.prepare_cached(
            "SELECT version FROM profile_state WHERE profile_id = ?1 AND key = ?2",
        )?;
        for (key, read) in &c.profile_versions {
            let current: Option<i64> =
                stmt.query_row(params![pid, key], |r| r.get(0)).optional()?;
            if current.unwrap_or(0) != codec::int(*read) {
                return Err(StoreError::ProfileConflict { key: key.clone() });
            }
        }
    }

    // Writes.
    {
        let mut stmt =
            tx.prepare_cached("INSERT INTO messages (thread_id, idx, body) VALUES (?1, ?2, ?3)")?;
        for (i, m) in c.messages.iter().enumerate() {
            let body = codec::to_json("message", m)?;
            stmt.execute(params![tid, message_count + i as i64, body])?;
        }
    }
    fp.check(FailPoint::AfterMessages)?;

    let enc = codec::encode_run(&c.run)?;
    let (batch_mode, batch) = match &c.batch {
        BatchWrite::Keep => (0, None),
        BatchWrite::Set(b) => (1, Some(codec::batch_text(b)?)),
        BatchWrite::Clear => (2, None),
    };
    let run_revision = (!c.run_state.values.is_empty()).then(|| codec::int(c.run_state.revision));
    tx.prepare_cached(
        "INSERT INTO runs (run_id, thread_id, parent_run_id, agent_id, profile_id, status, \
             termination, steps, usage, spec_digest, created_at, updated_at, state_revision, batch) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, COALESCE(?13, 0), ?14) \
         ON CONFLICT (run_id) DO UPDATE SET \
             parent_run_id = excluded.parent_run_id, agent_id = excluded.agent_id, \
             profile_id = excluded.profile_id, status = excluded.status, \
             termination = excluded.termination, steps = excluded.steps, usage = excluded.usage, \
             spec_digest = excluded.spec_digest, updated_at = excluded.updated_at, \
             state_revision = COALESCE(?13, runs.state_revision), \
             batch = CASE ?15 WHEN 0 THEN runs.batch WHEN 1 THEN excluded.batch ELSE NULL END, \
             lease_owner = CASE WHEN excluded.status = 'done' THEN NULL ELSE runs.lease_owner END, \
             lease_expires_at = CASE WHEN excluded.status = 'done' THEN NULL \
                 ELSE runs.lease_expires_at END",
    )?
    .execute(params![
        rid,
        tid,
        c.run.parent_run_id.as_ref().map(RunId::as_str),
        c.run.agent_id,
        profile_id,
        c.run.status.as_str(),
        enc.termination,
        i64::from(c.run.steps),
        enc.usage,
        c.run.spec_digest,
        c.run.created_at.as_unix_millis(),
        c.run.updated_at.as_unix_millis(),
        run_revision,
        batch,
        batch_mode,
    ])?;
    fp.check(FailPoint::AfterRun)?;

    if !c.run_state.values.is_empty() {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO run_state (run_id, key, value) VALUES (?1, ?2, ?3) \
             ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value",
        )?;
        for (k, v) in &c.run_state.values {
            stmt.execute(params![rid, k, codec::state_text("run state", v)?])?;
        }
    }
    if !c.thread_state.values.is_empty() {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO thread_state (thread_id, key, value) VALUES (?1, ?2, ?3) \
             ON CONFLICT (thread_id, key) DO UPDATE SET value = excluded.value",
        )?;
        for (k, v) in &c.thread_state.values {
            stmt.execute(params![tid, k, codec::state_text("thread state", v)?])?;
        }
    }
    let mut profile_versions = std::collections::BTreeMap::new();
    if let Some(pid) = profile_id
        && !c.profile_state.values.is_empty()
    {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO profile_state (profile_id, key, value, version) VALUES (?1, ?2, ?3, 1) \
             ON CONFLICT (profile_id, key) DO UPDATE SET value = excluded.value, \
                 version = profile_state.version + 1",
        )?;
        for (k, v) in &c.profile_state.values {
            stmt.execute(params![pid, k, codec::state_text("profile state", v)?])?;
            let read = c.profile_versions.get(k.as_ref()).copied().unwrap_or(0);
            profile_versions.insert(k.to_string(), read + 1);
        }
    }
    fp.check(FailPoint::AfterState)?;

    let mut seq = event_count;
    if !c.events.is_empty() {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO events (thread_id, seq, run_id, body) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for e in c.events.iter() {
            seq += 1;
            stmt.execute(params![tid, seq, rid, codec::to_json("event", e)?])?;
        }
    }
    fp.check(FailPoint::AfterEvents)?;

    let thread_revision = if c.thread_state.values.is_empty() {
        thread_revision
    } else {
        codec::int(c.thread_state.revision)
    };
    let new_count = codec::int(c.message_count_after());
    tx.prepare_cached(
        "INSERT INTO threads (thread_id, message_count, event_count, latest_run_id, \
             state_revision, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) \
         ON CONFLICT (thread_id) DO UPDATE SET message_count = excluded.message_count, \
             event_count = excluded.event_count, latest_run_id = excluded.latest_run_id, \
             state_revision = excluded.state_revision, updated_at = excluded.updated_at",
    )?
    .execute(params![
        tid,
        new_count,
        seq,
        rid,
        thread_revision,
        c.run.updated_at.as_unix_millis()
    ])?;
    tx.commit()?;
    Ok(CommitReceipt {
        message_count: c.message_count_after(),
        last_event_seq: codec::count("event count", seq)?,
        profile_versions,
    })
}

fn state_map(
    stmt: &mut rusqlite::CachedStatement<'_>,
    id: &str,
    what: &'static str,
) -> Result<std::collections::BTreeMap<String, serde_json::Value>, StoreError> {
    let rows = stmt.query_map([id], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut out = std::collections::BTreeMap::new();
    for row in rows {
        let (k, v) = row?;
        out.insert(k, codec::value(what, &v)?);
    }
    Ok(out)
}

fn load_profile_tx(conn: &Connection, profile_id: &ProfileId) -> Result<ProfileState, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT key, value, version FROM profile_state WHERE profile_id = ?1")?;
    let rows = stmt.query_map([profile_id.as_str()], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut keys = std::collections::BTreeMap::new();
    for row in rows {
        let (k, v, version) = row?;
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

fn load_checkpoint_tx(
    conn: &mut Connection,
    thread_id: &ThreadId,
) -> Result<Option<Checkpoint>, StoreError> {
    let tx = conn.transaction()?;
    let tid = thread_id.as_str();
    let thread: Option<(Option<String>, i64, i64)> = tx
        .prepare_cached(
            "SELECT latest_run_id, state_revision, event_count FROM threads WHERE thread_id = ?1",
        )?
        .query_row([tid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let Some((latest_run, thread_revision, event_count)) = thread else {
        return Ok(None);
    };
    let mut messages = Vec::new();
    {
        let mut stmt =
            tx.prepare_cached("SELECT body FROM messages WHERE thread_id = ?1 ORDER BY idx")?;
        let rows = stmt.query_map([tid], |r| r.get::<_, String>(0))?;
        for body in rows {
            messages.push(codec::message(&body?)?);
        }
    }
    let thread_state = PersistedState {
        revision: codec::count("state revision", thread_revision)?,
        values: state_map(
            &mut tx.prepare_cached("SELECT key, value FROM thread_state WHERE thread_id = ?1")?,
            tid,
            "thread state",
        )?,
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
    if let Some(rid) = latest_run {
        let row: Option<(RawRun, i64, Option<String>)> = tx
            .prepare_cached(&format!(
                "SELECT {RUN_COLUMNS}, state_revision, batch FROM runs WHERE run_id = ?1"
            ))?
            .query_row([&rid], |r| Ok((raw_run(r, 0)?, r.get(11)?, r.get(12)?)))
            .optional()?;
        if let Some((raw, run_revision, batch)) = row {
            let run = raw.decode()?;
            checkpoint.run_state = PersistedState {
                revision: codec::count("state revision", run_revision)?,
                values: state_map(
                    &mut tx.prepare_cached("SELECT key, value FROM run_state WHERE run_id = ?1")?,
                    &rid,
                    "run state",
                )?,
            };
            checkpoint.batch = batch.map(|b| codec::value("tool batch", &b)).transpose()?;
            if let Some(pid) = &run.profile_id {
                checkpoint.profile = Some(load_profile_tx(&tx, pid)?);
            }
            checkpoint.run = Some(run);
        }
    }
    tx.commit()?;
    Ok(Some(checkpoint))
}

#[async_trait]
impl ThreadStore for SqliteStore {
    async fn commit(&self, commit: ThreadCommit) -> Result<CommitReceipt, StoreError> {
        commit
            .validate()
            .map_err(|v| StoreError::invalid(&commit.thread_id, v))?;
        self.write_conn(move |conn, fp| commit_tx(conn, &commit, fp))
            .await
    }

    /// Commits on the caller's thread when commits may run inline, the connection is free and
    /// no other process holds the write lock (nothing is waited for here); `None` (nothing
    /// written) for the blocking pool otherwise. The commit is only read.
    fn commit_now(&self, commit: &mut ThreadCommit) -> Option<Result<CommitReceipt, StoreError>> {
        if !self.inline {
            return None;
        }
        let mut conn = match self.conn.try_lock() {
            Ok(conn) => conn,
            // A panic inside a transaction rolls it back when the transaction drops, so a
            // poisoned connection is still consistent.
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        if let Err(v) = commit.validate() {
            return Some(Err(StoreError::invalid(&commit.thread_id, v)));
        }
        // Another process's write lock is not waited for here: with no busy timeout, `BEGIN
        // IMMEDIATE` fails at once, nothing is written, and the pool does the waiting.
        if conn.busy_timeout(Duration::ZERO).is_err() {
            return None;
        }
        // A panic is a typed error here as it is from the blocking pool (the transaction,
        // dropped while unwinding, rolls back).
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            commit_tx(&mut conn, commit, &self.failpoints)
        }))
        .unwrap_or_else(|panic| {
            Err(StoreError::Task {
                detail: format!(
                    "the commit panicked: {}",
                    awaken_state::panic_message(&*panic)
                ),
            })
        });
        if let Err(e) = conn.busy_timeout(self.busy_timeout) {
            tracing::warn!(error = %e, "sqlite store: the busy timeout was not restored");
        }
        drop(conn);
        if let Err(StoreError::Sqlite { source }) = &written
            && source.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy)
        {
            return None;
        }
        if written.is_ok() {
            self.count_write();
        }
        Some(written)
    }

    async fn load_checkpoint(
        &self,
        thread_id: &ThreadId,
    ) -> Result<Option<Checkpoint>, StoreError> {
        let thread_id = thread_id.clone();
        self.with_conn(move |conn, _| load_checkpoint_tx(conn, &thread_id))
            .await
    }

    async fn load_profile(&self, profile_id: &ProfileId) -> Result<ProfileState, StoreError> {
        let profile_id = profile_id.clone();
        self.with_conn(move |conn, _| load_profile_tx(conn, &profile_id))
            .await
    }

    async fn list_threads(&self) -> Result<Vec<ThreadSummary>, StoreError> {
        self.with_conn(|conn, _| {
            let mut stmt = conn.prepare_cached(
                "SELECT thread_id, message_count, latest_run_id, created_at, updated_at \
                 FROM threads ORDER BY thread_id",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, Option<String>>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (tid, count, latest, created, updated) = row?;
                out.push(ThreadSummary {
                    thread_id: codec::thread_id(&tid)?,
                    message_count: codec::count("message count", count)?,
                    latest_run_id: latest.as_deref().map(codec::run_id).transpose()?,
                    created_at: Timestamp::from_unix_millis(created),
                    updated_at: Timestamp::from_unix_millis(updated),
                });
            }
            Ok(out)
        })
        .await
    }

    async fn list_runs(&self, thread_id: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        let thread_id = thread_id.clone();
        self.with_conn(move |conn, _| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE thread_id = ?1 ORDER BY created_at, run_id"
            ))?;
            let rows = stmt.query_map([thread_id.as_str()], |r| raw_run(r, 0))?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row?.decode()?);
            }
            Ok(out)
        })
        .await
    }

    async fn load_events(
        &self,
        thread_id: &ThreadId,
        since: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let thread_id = thread_id.clone();
        self.with_conn(move |conn, _| {
            let mut stmt = conn.prepare_cached(
                "SELECT seq, run_id, body FROM events WHERE thread_id = ?1 AND seq > ?2 \
                 ORDER BY seq",
            )?;
            let rows = stmt.query_map(params![thread_id.as_str(), codec::int(since)], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (seq, rid, body) = row?;
                out.push(StoredEvent {
                    seq: codec::count("event seq", seq)?,
                    run_id: codec::run_id(&rid)?,
                    event: codec::event(&body)?,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn delete_thread(&self, thread_id: &ThreadId) -> Result<bool, StoreError> {
        let thread_id = thread_id.clone();
        self.write_conn(move |conn, _| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let tid = thread_id.as_str();
            tx.execute(
                "DELETE FROM run_state WHERE run_id IN (SELECT run_id FROM runs WHERE thread_id = ?1)",
                [tid],
            )?;
            for table in ["runs", "messages", "events", "thread_state"] {
                tx.execute(&format!("DELETE FROM {table} WHERE thread_id = ?1"), [tid])?;
            }
            let existed = tx.execute("DELETE FROM threads WHERE thread_id = ?1", [tid])? > 0;
            tx.commit()?;
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
        check_worker(worker_id)?;
        let worker = worker_id.to_owned();
        let expires_at = now.saturating_add(lease_duration);
        self.write_conn(move |conn, _| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut out = Vec::new();
            {
                let mut stmt = tx.prepare_cached(&format!(
                    "UPDATE runs SET lease_owner = ?1, lease_epoch = lease_epoch + 1, \
                         lease_expires_at = ?2 \
                     WHERE run_id IN (SELECT run_id FROM runs WHERE status <> 'done' \
                         AND (lease_owner IS NULL OR lease_expires_at <= ?3) \
                         ORDER BY updated_at, run_id LIMIT ?4) \
                     RETURNING thread_id, lease_epoch, {RUN_COLUMNS}"
                ))?;
                let rows = stmt.query_map(
                    params![
                        worker,
                        expires_at.as_unix_millis(),
                        now.as_unix_millis(),
                        codec::int(limit as u64)
                    ],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, raw_run(r, 2)?)),
                )?;
                for row in rows {
                    let (tid, epoch, raw) = row?;
                    out.push(codec::claimed_run(&tid, epoch, raw, &worker, expires_at)?);
                }
            }
            tx.commit()?;
            out.sort_by(|a, b| {
                (a.run.updated_at, &a.run.run_id).cmp(&(b.run.updated_at, &b.run.run_id))
            });
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
        check_worker(worker_id)?;
        let worker = worker_id.to_owned();
        let id = run_id.to_string();
        let expires_at = now.saturating_add(lease_duration);
        self.write_conn(move |conn, _| {
            let mut stmt = conn.prepare_cached(&format!(
                "UPDATE runs SET lease_owner = ?1, lease_epoch = lease_epoch + 1, \
                     lease_expires_at = ?2 \
                 WHERE run_id = ?3 AND status <> 'done' \
                     AND (lease_owner IS NULL OR lease_expires_at <= ?4) \
                 RETURNING thread_id, lease_epoch, {RUN_COLUMNS}"
            ))?;
            let mut rows = stmt.query_map(
                params![
                    worker,
                    expires_at.as_unix_millis(),
                    id,
                    now.as_unix_millis()
                ],
                |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, raw_run(r, 2)?)),
            )?;
            let Some(row) = rows.next() else {
                return Ok(None);
            };
            let (tid, epoch, raw) = row?;
            Ok(Some(codec::claimed_run(
                &tid, epoch, raw, &worker, expires_at,
            )?))
        })
        .await
    }

    async fn heartbeat(
        &self,
        lease: &LeaseToken,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Timestamp, StoreError> {
        let lease = lease.clone();
        let expires_at = now.saturating_add(lease_duration);
        self.write_conn(move |conn, _| {
            let n = conn
                .prepare_cached(
                    "UPDATE runs SET lease_expires_at = ?1 WHERE run_id = ?2 \
                     AND lease_owner = ?3 AND lease_epoch = ?4",
                )?
                .execute(params![
                    expires_at.as_unix_millis(),
                    lease.run_id.as_str(),
                    lease.worker_id,
                    codec::int(lease.epoch)
                ])?;
            if n == 0 {
                return Err(StoreError::LeaseLost {
                    run_id: lease.run_id,
                });
            }
            Ok(expires_at)
        })
        .await
    }

    async fn release(&self, lease: &LeaseToken) -> Result<bool, StoreError> {
        let lease = lease.clone();
        self.write_conn(move |conn, _| {
            let n = conn
                .prepare_cached(
                    "UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL \
                     WHERE run_id = ?1 AND lease_owner = ?2 AND lease_epoch = ?3",
                )?
                .execute(params![
                    lease.run_id.as_str(),
                    lease.worker_id,
                    codec::int(lease.epoch)
                ])?;
            Ok(n > 0)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use awaken_event::{Message, RunId, ThreadId, ToolCallId, ToolCallState};

    use super::*;
    use crate::commit::{BatchSource, CommitViolation};

    fn step(n: u64) -> ThreadCommit {
        let run = RunRecord::new(
            RunId::new("r1").expect("id"),
            "agent",
            Timestamp::from_unix_millis(1),
        );
        ThreadCommit::new(ThreadId::new("t1").expect("id"), run, n)
            .with_messages([Message::user(format!("message {n}"))])
    }

    async fn open(dir: &tempfile::TempDir, config: fn(PathBuf) -> SqliteConfig) -> SqliteStore {
        SqliteStore::open(config(dir.path().join("awaken.db")))
            .await
            .expect("open")
    }

    #[tokio::test]
    async fn a_commit_runs_inline_only_when_allowed_and_the_connection_is_free() {
        let dir = tempfile::tempdir().expect("dir");
        let store = open(&dir, SqliteConfig::file).await;
        let receipt = store
            .commit_now(&mut step(0))
            .expect("inline")
            .expect("written");
        assert_eq!(receipt.message_count, 1);
        // Busy (another commit or read holds the connection): left unchanged, not waited for
        // on the caller's thread.
        let held = store.conn.lock().expect("lock");
        let mut back = step(1);
        assert!(store.commit_now(&mut back).is_none(), "not written at once");
        assert_eq!(back, step(1));
        drop(held);
        store.commit(back).await.expect("written on the pool");
        // Not allowed: asked not to, or every commit waits for the disk.
        for config in [
            |p: PathBuf| SqliteConfig::file(p).with_inline_commits(false),
            |p: PathBuf| SqliteConfig::file(p).with_synchronous(Synchronous::Full),
        ] {
            let dir = tempfile::tempdir().expect("dir");
            let store = open(&dir, config).await;
            let mut back = step(0);
            assert!(store.commit_now(&mut back).is_none(), "not written at once");
            assert_eq!(back, step(0));
        }
    }

    #[tokio::test]
    async fn an_inline_commit_never_waits_for_another_processs_write_lock() {
        let dir = tempfile::tempdir().expect("dir");
        let store = open(&dir, SqliteConfig::file).await;
        store
            .commit_now(&mut step(0))
            .expect("inline")
            .expect("written");
        // Another connection (as another process would) holds the write lock, and lets it go
        // a moment later: a commit that waited for it (the store's busy timeout is 5 s) would
        // then be written inline; one that does not wait writes nothing at once.
        let other = Connection::open(dir.path().join("awaken.db")).expect("open");
        other.execute_batch("BEGIN IMMEDIATE").expect("write lock");
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            other.execute_batch("COMMIT").expect("released");
        });
        let mut back = step(1);
        assert!(
            store.commit_now(&mut back).is_none(),
            "not written, not waited for"
        );
        assert_eq!(back, step(1));
        releaser.join().expect("releaser");
        // The pool path writes it (waiting for the lock, were it still held).
        let receipt = store.commit(back).await.expect("written on the pool");
        assert_eq!(receipt.message_count, 2);
    }

    #[tokio::test]
    async fn every_write_counts_towards_the_next_checkpoint() {
        let dir = tempfile::tempdir().expect("dir");
        let store = open(&dir, SqliteConfig::file).await;
        let checkpoints = store.checkpoints.clone().expect("own checkpoints");
        for n in 0..u64::from(WRITES_PER_CHECKPOINT - 1) {
            store
                .commit_now(&mut step(n))
                .expect("inline")
                .expect("written");
        }
        assert_eq!(
            checkpoints.writes.load(Ordering::Relaxed),
            WRITES_PER_CHECKPOINT - 1
        );
        // A write that is not a commit (here, deleting a thread) starts the checkpoint.
        let other = ThreadId::new("other").expect("id");
        store.delete_thread(&other).await.expect("deleted");
        assert_eq!(checkpoints.writes.load(Ordering::Relaxed), 0);
        // Reads do not count.
        store.list_threads().await.expect("listed");
        assert_eq!(checkpoints.writes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_checkpoint_dropped_unrun_does_not_stop_the_next_ones() {
        let checkpoints = Arc::new(Checkpoints::default());
        checkpoints.running.store(true, Ordering::Release);
        // What a runtime shutting down does to a queued blocking task: drops it unrun.
        drop(CheckpointDone(Arc::clone(&checkpoints)));
        assert!(!checkpoints.running.load(Ordering::Acquire));
    }

    #[tokio::test]
    async fn an_in_memory_database_runs_commits_inline_without_checkpoints() {
        let store = SqliteStore::open(SqliteConfig::in_memory())
            .await
            .expect("open");
        assert!(store.checkpoints.is_none());
        store
            .commit_now(&mut step(0))
            .expect("inline")
            .expect("written");
    }

    /// A batch whose serialization panics (a bug in a `BatchSource`).
    #[derive(Debug)]
    struct Panics;

    impl BatchSource for Panics {
        fn to_json(&self) -> Result<serde_json::Value, serde_json::Error> {
            panic!("to_json of a broken batch")
        }
        fn to_text(&self) -> Result<String, serde_json::Error> {
            panic!("to_text of a broken batch")
        }
        fn open_call(&self) -> Result<Option<(ToolCallId, ToolCallState)>, CommitViolation> {
            Ok(None)
        }
    }

    #[tokio::test]
    async fn a_panic_inside_an_inline_commit_is_a_typed_error_and_writes_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        let store = open(&dir, SqliteConfig::file).await;
        store
            .commit_now(&mut step(0))
            .expect("inline")
            .expect("written");
        let mut broken = step(1).with_batch(BatchData::typed(Arc::new(Panics)));
        let err = store
            .commit_now(&mut broken)
            .expect("inline")
            .expect_err("panicked");
        assert!(
            matches!(&err, StoreError::Task { detail } if detail.contains("to_text of a broken batch")),
            "{err:?}"
        );
        let thread = ThreadId::new("t1").expect("id");
        let stored = store
            .load_checkpoint(&thread)
            .await
            .expect("load")
            .expect("thread");
        assert_eq!(
            stored.messages.len(),
            1,
            "the panicked commit wrote nothing"
        );
        // The connection still works, inline.
        let receipt = store
            .commit_now(&mut step(1))
            .expect("inline")
            .expect("written");
        assert_eq!(receipt.message_count, 2);
    }

    /// Frames in the WAL (read through a second connection: a passive checkpoint that finds
    /// nothing to copy reports the log's size).
    fn wal_frames(path: &std::path::Path) -> i64 {
        let conn = Connection::open(path).expect("open");
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))
            .expect("checkpoint")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn inline_commits_keep_the_wal_short_with_checkpoints_on_the_blocking_pool() {
        wal_stays_short(true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn commits_on_the_blocking_pool_count_towards_checkpoints_too() {
        wal_stays_short(false).await;
    }

    /// Commits `4 * WRITES_PER_CHECKPOINT` steps (through `commit_now` if `inline`, else
    /// through `commit`) and checks the WAL was checkpointed along the way.
    async fn wal_stays_short(inline: bool) {
        let dir = tempfile::tempdir().expect("dir");
        let store = open(&dir, SqliteConfig::file).await;
        let checkpoints = store.checkpoints.clone().expect("inline commits");
        let commits = 4 * WRITES_PER_CHECKPOINT;
        let mut frames_after_first_commits = 0;
        for n in 0..u64::from(commits) {
            if inline {
                store
                    .commit_now(&mut step(n))
                    .expect("inline")
                    .expect("written");
            } else {
                store.commit(step(n)).await.expect("written");
            }
            if n == 9 {
                frames_after_first_commits = wal_frames(&dir.path().join("awaken.db"));
            }
            // Let a scheduled checkpoint finish (it holds the connection meanwhile; a commit
            // finding it busy would go to the blocking pool).
            while checkpoints.running.load(Ordering::Acquire) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        // Without checkpoints (SQLite's automatic ones are off) the WAL would hold every
        // commit's frames: about `commits / 10` times the first ten commits'.
        let frames = wal_frames(&dir.path().join("awaken.db"));
        assert!(frames_after_first_commits > 0);
        assert!(
            frames < frames_after_first_commits * i64::from(WRITES_PER_CHECKPOINT) / 5,
            "{frames} frames in the WAL after {commits} commits ({frames_after_first_commits} after 10)"
        );
    }
}
