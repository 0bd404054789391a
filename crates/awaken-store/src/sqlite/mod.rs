//! [`SqliteStore`]: the embedded default (feature `sqlite`), one file in WAL mode.
//!
//! This module holds the configuration, the store with its connection and WAL checkpoints, and
//! the [`ThreadStore`] implementation; the schema is in `schema`, a commit's transaction in
//! `commit`, and the reads in `load`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use awaken_event::{ProfileId, RunId, ThreadId};
use rusqlite::{Connection, TransactionBehavior, params};

use crate::codec::{self, RUN_COLUMNS, RawRun};
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
mod load;
mod schema;

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

    /// The database as the store's errors name it: the file's path, or `:memory:`.
    fn database(&self) -> Database {
        match &self.path {
            Some(path) => Database::named(path.display().to_string()),
            None => Database::named(":memory:"),
        }
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
/// transaction. Its errors name the file ([`StoreError::database`]).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    /// The file, as errors name it.
    database: Database,
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

impl SqliteStore {
    /// Opens (creating if needed) the database, sets WAL and `synchronous`, and migrates the
    /// schema. Another process opening or writing the file at the same time is waited for, up
    /// to the busy timeout. Errors name the file: `SchemaTooNew` if it was written by a newer
    /// build, `Sqlite` otherwise ([`StoreError::kind`] tells a file that is not a database, is
    /// damaged or stayed locked from a path that cannot be opened).
    pub async fn open(config: SqliteConfig) -> Result<Self, StoreError> {
        let inline = config.commits_inline();
        let own_checkpoints = config.own_checkpoints();
        let busy_timeout = config.busy_timeout;
        let database = config.database();
        let conn = blocking(move || open_connection(&config))
            .await?
            .map_err(|e| e.in_database(&database))?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            database,
            failpoints: Arc::new(Failpoints::default()),
            inline,
            busy_timeout,
            checkpoints: own_checkpoints.then(Arc::default),
        })
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

    /// [`with_conn`](Self::with_conn) for a write: counted towards the next WAL checkpoint.
    async fn write_conn<T: Send + 'static, E: From<StoreError> + InDatabase + Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection, &Failpoints) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
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

    /// Runs `f` with the store's connection on the blocking pool (`E`: its error, which a
    /// failure of the blocking task becomes too; an error from the database names the file).
    async fn with_conn<T: Send + 'static, E: From<StoreError> + InDatabase + Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection, &Failpoints) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E> {
        let conn = Arc::clone(&self.conn);
        let failpoints = Arc::clone(&self.failpoints);
        blocking(move || {
            // A panic inside a transaction rolls it back when the transaction drops, so a
            // poisoned connection is still consistent.
            let mut conn = conn.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut conn, &failpoints)
        })
        .await?
        .map_err(|e| e.in_database(&self.database))
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

/// The first pause of an open between two attempts while another connection holds a lock it
/// needs; each next pause doubles, up to [`OPEN_PAUSE_MAX`].
const OPEN_PAUSE_FIRST: Duration = Duration::from_millis(2);

/// The longest pause of an open between two attempts.
const OPEN_PAUSE_MAX: Duration = Duration::from_millis(100);

/// Opens the database and sets it up ([`set_up`]); while another connection holds a lock the
/// set-up needs, tries again after a pause, until the busy timeout has passed (then the last
/// error, `DatabaseBusy`).
fn open_connection(config: &SqliteConfig) -> Result<Connection, StoreError> {
    let mut conn = match &config.path {
        Some(path) => Connection::open(path)?,
        None => Connection::open_in_memory()?,
    };
    conn.busy_timeout(config.busy_timeout)?;
    let deadline = Instant::now() + config.busy_timeout;
    let mut pause = OPEN_PAUSE_FIRST;
    loop {
        let set = set_up(&mut conn, config);
        let busy = matches!(&set, Err(StoreError::Sqlite { source, .. }) if is_busy(source));
        let now = Instant::now();
        if !busy || now >= deadline {
            return set.map(|()| conn);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(OPEN_PAUSE_MAX);
    }
}

/// Sets the connection's pragmas and migrates the schema. Switching a new file to WAL and the
/// migration's `BEGIN IMMEDIATE` can fail at once with `SQLITE_BUSY` while another connection
/// sets the same file up: SQLite does not wait (its busy handler is not called) where waiting
/// could deadlock, so [`open_connection`] tries again. Each step can run again after a failure.
fn set_up(conn: &mut Connection, config: &SqliteConfig) -> Result<(), StoreError> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", config.synchronous.pragma())?;
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    if config.own_checkpoints() {
        // The store checkpoints on the blocking pool ([`Checkpoints`]), not inside a commit.
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    }
    schema::migrate(conn)
}

/// Whether SQLite refused for a lock another connection holds.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// A claim's `RETURNING thread_id, lease_epoch, <run columns>` row.
fn claimed_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, i64, RawRun)> {
    Ok((r.get(0)?, r.get(1)?, load::raw_run(r, 2)?))
}

#[async_trait]
impl ThreadStore for SqliteStore {
    /// Validates the commit on the caller's thread, then writes a copy of it on the blocking
    /// pool (the task needs a commit of its own: the caller's stays with the caller).
    async fn commit(&self, commit: &ThreadCommit) -> Result<CommitReceipt, CommitError> {
        commit
            .validate()
            .map_err(|v| CommitError::invalid(&commit.thread_id, v))?;
        let commit = commit.clone();
        self.write_conn(move |conn, fp| commit::write(conn, &commit, fp))
            .await
    }

    /// Commits on the caller's thread when commits may run inline, the connection is free and
    /// no other process holds the write lock (nothing is waited for here); `None` (nothing
    /// written) for the blocking pool otherwise.
    fn commit_now(&self, commit: &ThreadCommit) -> Option<Result<CommitReceipt, CommitError>> {
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
            return Some(Err(CommitError::invalid(&commit.thread_id, v)));
        }
        // Another process's write lock is not waited for here: with no busy timeout, `BEGIN
        // IMMEDIATE` fails at once, nothing is written, and the pool does the waiting.
        if conn.busy_timeout(Duration::ZERO).is_err() {
            return None;
        }
        // A panic is a typed error here as it is from the blocking pool (the transaction,
        // dropped while unwinding, rolls back).
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            commit::write(&mut conn, commit, &self.failpoints)
        }))
        .unwrap_or_else(|panic| {
            Err(StoreError::Task {
                detail: format!(
                    "the commit panicked: {}",
                    awaken_state::panic_message(&*panic)
                ),
            }
            .into())
        });
        if let Err(e) = conn.busy_timeout(self.busy_timeout) {
            tracing::warn!(error = %e, "sqlite store: the busy timeout was not restored");
        }
        drop(conn);
        if let Err(CommitError::Backend(StoreError::Sqlite { source, .. })) = &written
            && source.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy)
        {
            return None;
        }
        if written.is_ok() {
            self.count_write();
        }
        Some(written.map_err(|e| e.in_database(&self.database)))
    }

    async fn load_checkpoint(
        &self,
        thread_id: &ThreadId,
    ) -> Result<Option<Checkpoint>, StoreError> {
        let thread = thread_id.clone();
        self.with_conn(move |conn, _| load::checkpoint(conn, &thread))
            .await
            .map_err(|e| e.of_thread(thread_id))
    }

    async fn load_profile(&self, profile_id: &ProfileId) -> Result<ProfileState, StoreError> {
        let profile_id = profile_id.clone();
        self.with_conn(move |conn, _| load::profile(conn, &profile_id))
            .await
    }

    async fn list_threads(&self) -> Result<Vec<ThreadSummary>, StoreError> {
        self.with_conn(|conn, _| load::threads(conn)).await
    }

    async fn list_runs(&self, thread_id: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        let thread = thread_id.clone();
        self.with_conn(move |conn, _| load::runs(conn, &thread))
            .await
            .map_err(|e| e.of_thread(thread_id))
    }

    async fn latest_run(&self, thread_id: &ThreadId) -> Result<Option<RunRecord>, StoreError> {
        let thread = thread_id.clone();
        self.with_conn(move |conn, _| load::latest_run(conn, &thread))
            .await
            .map_err(|e| e.of_thread(thread_id))
    }

    async fn load_run(
        &self,
        thread_id: &ThreadId,
        run_id: &RunId,
    ) -> Result<Option<RunRecord>, StoreError> {
        let (thread, run) = (thread_id.clone(), run_id.clone());
        self.with_conn(move |conn, _| load::run(conn, &thread, &run))
            .await
            .map_err(|e| e.of_thread(thread_id))
    }

    async fn run_thread(&self, run_id: &RunId) -> Result<Option<ThreadId>, StoreError> {
        let run = run_id.clone();
        self.with_conn(move |conn, _| load::run_thread(conn, &run))
            .await
    }

    async fn load_events(
        &self,
        thread_id: &ThreadId,
        since: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let thread = thread_id.clone();
        self.with_conn(move |conn, _| load::events(conn, &thread, since))
            .await
            .map_err(|e| e.of_thread(thread_id))
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
        lease::check_worker(worker_id)?;
        let worker = worker_id.to_owned();
        let expires_at = now.saturating_add(lease_duration);
        self.write_conn(move |conn, _| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut out = Vec::new();
            {
                let mut stmt = tx.prepare_cached(&format!(
                    "UPDATE runs SET lease_owner = ?1, lease_epoch = lease_epoch + 1, \
                         lease_expires_at = ?2 \
                     WHERE run_id IN (SELECT run_id FROM runs WHERE status = 'running' \
                         AND parent_run_id IS NULL \
                         AND (lease_owner IS NULL OR lease_expires_at <= ?3) \
                         ORDER BY lease_epoch, updated_at, run_id LIMIT ?4) \
                     RETURNING thread_id, lease_epoch, {RUN_COLUMNS}"
                ))?;
                let rows = stmt.query_map(
                    params![
                        worker,
                        expires_at.as_unix_millis(),
                        now.as_unix_millis(),
                        codec::int(limit as u64)
                    ],
                    claimed_row,
                )?;
                for row in rows {
                    let (tid, epoch, raw) = row?;
                    out.push(codec::claimed_run(&tid, epoch, raw, &worker, expires_at)?);
                }
            }
            tx.commit()?;
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
        lease::check_worker(worker_id)?;
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
                claimed_row,
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
    ) -> Result<Timestamp, LeaseError> {
        let held = lease.clone();
        let expires_at = now.saturating_add(lease_duration);
        let renewed = self
            .write_conn(move |conn, _| -> Result<usize, StoreError> {
                Ok(conn
                    .prepare_cached(
                        "UPDATE runs SET lease_expires_at = ?1 WHERE run_id = ?2 \
                         AND lease_owner = ?3 AND lease_epoch = ?4",
                    )?
                    .execute(params![
                        expires_at.as_unix_millis(),
                        held.run_id.as_str(),
                        held.worker_id,
                        codec::int(held.epoch)
                    ])?)
            })
            .await?;
        if renewed == 0 {
            return Err(LeaseError::Lost {
                run_id: lease.run_id.clone(),
            });
        }
        Ok(expires_at)
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
mod tests;
