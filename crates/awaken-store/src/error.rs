//! What can go wrong in a store: [`StoreError`] for a failure of the store itself (naming the
//! [`Database`] it came from, and of a [`StoreErrorKind`]), and the errors of the operations a
//! store may refuse, [`CommitError`] (a commit) and [`LeaseError`] (a heartbeat), each with the
//! refusals as their own variants and `Backend` for the rest.

use std::fmt;
use std::sync::Arc;

use awaken_event::{RunId, ThreadId};

use crate::commit::{CommitViolation, RunStatus};
use crate::failpoint::FailPoint;

/// Which database a [`StoreError`] is about, as its message names it: a SQLite file's path
/// (`:memory:` for a private in-memory database), or PostgreSQL's `host:port/dbname` with the
/// store's schema (never the password). Unnamed for an error that did not come from
/// a database (the memory store's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Database(Option<Arc<str>>);

impl Database {
    /// A database named `name`.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn named(name: impl Into<Arc<str>>) -> Self {
        Database(Some(name.into()))
    }

    /// The name, if the error came from a database.
    pub fn name(&self) -> Option<&str> {
        self.0.as_deref()
    }
}

impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name().unwrap_or("(unnamed)"))
    }
}

/// ` in <database>` for a named database, nothing otherwise (a message's suffix).
struct In<'a>(&'a Database);

impl fmt::Display for In<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.name() {
            Some(name) => write!(f, " in {name}"),
            None => Ok(()),
        }
    }
}

/// ` of thread <id>` for a read of a thread, nothing otherwise (a message's part).
struct Of<'a>(&'a Option<ThreadId>);

impl fmt::Display for Of<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(thread_id) => write!(f, " of thread {thread_id}"),
            None => Ok(()),
        }
    }
}

/// What kind of failure a [`StoreError`] is, for a caller that maps failures to outcomes (the
/// `awaken` command's exit codes): see [`StoreError::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store's data or medium failed, with a configuration that may well be right: a
    /// database file that is not a database, corrupt or truncated; a disk I/O error; a full
    /// disk or database; stored data that does not read back; a database locked by another
    /// process past the busy timeout; a PostgreSQL server that cannot be reached, out of
    /// resources or that closed the connection; an injected fault.
    Storage,
    /// The store is set up wrongly: an invalid configuration (a schema name, a URL that does not
    /// parse, a blank worker id), a SQLite path that cannot be opened or written (a missing
    /// directory, no permission, a read-only file), PostgreSQL credentials or a database name
    /// the server refuses, a database written by a newer build.
    Config,
    /// A fault of the program rather than of the store or its setup: a value that does not
    /// serialize, a blocking task that panicked or was cancelled, a driver error of another
    /// kind (a statement the database rejects).
    Internal,
}

/// Why a store failed: its I/O, its database, data it holds that does not read back, a value it
/// could not serialize, its configuration, or a fault a test injected. An operation that fails
/// so wrote nothing; what a store refuses on purpose (a commit, a lease) has its own error
/// ([`CommitError`], [`LeaseError`]) wrapping this one for its backend failures.
///
/// The variants that come from a database (`Corrupt`, `SchemaTooNew`, `Sqlite`, `Postgres`)
/// name it ([`Database`]); [`kind`](Self::kind) tells a failure of the store's data or medium
/// from a wrong configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Stored data could not be read back (a row that does not parse).
    #[error("stored {what}{}{} could not be read: {detail}", Of(.thread_id), In(.database))]
    Corrupt {
        /// What was being read (`message`, `run record`, ...).
        what: &'static str,
        /// Why.
        detail: String,
        /// The thread being read, for a read of one (a checkpoint, its runs, its events).
        thread_id: Option<ThreadId>,
        /// The database holding it (unnamed for the memory store).
        database: Database,
    },
    /// A value could not be serialized for storage.
    #[error("could not serialize {what}: {source}")]
    Serialize {
        /// What was being written.
        what: &'static str,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// A state value could not be serialized for storage.
    #[error("could not serialize {what}: {source}")]
    StateValue {
        /// What was being written.
        what: &'static str,
        /// The state error (names the key).
        #[source]
        source: awaken_state::StateError,
    },
    /// The database holds a schema newer than this code knows.
    #[error(
        "the database schema{} is at version {found}; this build knows up to {supported}",
        In(.database)
    )]
    SchemaTooNew {
        /// The stored version.
        found: i64,
        /// The newest version this build can migrate to.
        supported: i64,
        /// The database.
        database: Database,
    },
    /// The store's configuration is unusable.
    #[error("invalid store configuration: {detail}")]
    Config {
        /// What is wrong.
        detail: String,
    },
    /// A fault injected through a failpoint (feature `failpoints`, tests only).
    #[error("injected failure at {point:?}")]
    Injected {
        /// Where.
        point: FailPoint,
    },
    /// The blocking task running a SQLite call panicked or was cancelled.
    #[error("the store's blocking task failed: {detail}")]
    Task {
        /// What the runtime reported.
        detail: String,
    },
    /// SQLite reported an error.
    #[cfg(feature = "sqlite")]
    #[error("SQLite database {database}: {source}")]
    Sqlite {
        /// The database file.
        database: Database,
        /// The driver's error.
        #[source]
        source: rusqlite::Error,
    },
    /// PostgreSQL reported an error (or the connection failed).
    #[cfg(feature = "postgres")]
    #[error("PostgreSQL database {database}: {}", postgres_message(.source))]
    Postgres {
        /// The server and database.
        database: Database,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
}

impl StoreError {
    pub(crate) fn corrupt(what: &'static str, detail: impl ToString) -> Self {
        StoreError::Corrupt {
            what,
            detail: detail.to_string(),
            thread_id: None,
            database: Database::default(),
        }
    }

    /// Names `thread` in a `Corrupt` error of a read of it that does not name a thread yet.
    pub(crate) fn of_thread(mut self, thread: &ThreadId) -> Self {
        if let StoreError::Corrupt { thread_id, .. } = &mut self
            && thread_id.is_none()
        {
            *thread_id = Some(thread.clone());
        }
        self
    }

    /// The database the error came from, if it came from one.
    pub fn database(&self) -> Option<&Database> {
        match self {
            StoreError::Corrupt { database, .. } | StoreError::SchemaTooNew { database, .. } => {
                Some(database)
            }
            #[cfg(feature = "sqlite")]
            StoreError::Sqlite { database, .. } => Some(database),
            #[cfg(feature = "postgres")]
            StoreError::Postgres { database, .. } => Some(database),
            _ => None,
        }
        .filter(|d| d.name().is_some())
    }

    /// What kind of failure this is ([`StoreErrorKind`]): a failure of the store's data or
    /// medium (`Storage`), a wrong setup (`Config`), or a fault of the program (`Internal`).
    pub fn kind(&self) -> StoreErrorKind {
        match self {
            StoreError::Corrupt { .. } | StoreError::Injected { .. } => StoreErrorKind::Storage,
            StoreError::SchemaTooNew { .. } | StoreError::Config { .. } => StoreErrorKind::Config,
            StoreError::Serialize { .. }
            | StoreError::StateValue { .. }
            | StoreError::Task { .. } => StoreErrorKind::Internal,
            #[cfg(feature = "sqlite")]
            StoreError::Sqlite { source, .. } => sqlite_kind(source),
            #[cfg(feature = "postgres")]
            StoreError::Postgres { source, .. } => postgres_kind(source),
        }
    }

    /// Whether the store's data or medium failed ([`StoreErrorKind::Storage`]): a damaged or
    /// unreadable database, a disk or server that failed, a full database.
    pub fn is_storage_failure(&self) -> bool {
        self.kind() == StoreErrorKind::Storage
    }

    /// The database field of a variant that comes from a database.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn database_mut(&mut self) -> Option<&mut Database> {
        match self {
            StoreError::Corrupt { database, .. } | StoreError::SchemaTooNew { database, .. } => {
                Some(database)
            }
            #[cfg(feature = "sqlite")]
            StoreError::Sqlite { database, .. } => Some(database),
            #[cfg(feature = "postgres")]
            StoreError::Postgres { database, .. } => Some(database),
            _ => None,
        }
    }
}

/// The kind of a SQLite error: the file's content or the disk (`Storage`), the path or its
/// permissions (`Config`), or anything else (`Internal`).
#[cfg(feature = "sqlite")]
fn sqlite_kind(e: &rusqlite::Error) -> StoreErrorKind {
    use rusqlite::ErrorCode as C;
    match e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            C::DatabaseCorrupt
            | C::NotADatabase
            | C::SystemIoFailure
            | C::DiskFull
            | C::DatabaseBusy
            | C::DatabaseLocked
            | C::FileLockingProtocolFailed
            | C::NoLargeFileSupport
            | C::OutOfMemory => StoreErrorKind::Storage,
            C::CannotOpen
            | C::PermissionDenied
            | C::ReadOnly
            | C::AuthorizationForStatementDenied => StoreErrorKind::Config,
            _ => StoreErrorKind::Internal,
        },
        // A stored value of another type or range than its column's: the data does not read
        // back.
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::InvalidColumnType(..) => StoreErrorKind::Storage,
        _ => StoreErrorKind::Internal,
    }
}

/// The kind of a PostgreSQL error, by its SQLSTATE when the server sent one: refused
/// credentials, an unknown database or schema, missing privileges (`Config`); a lost
/// connection, the server's resources, an operator's intervention, its I/O or corrupt data
/// (`Storage`). Without one, a connection that failed or closed is `Storage`.
#[cfg(feature = "postgres")]
fn postgres_kind(e: &tokio_postgres::Error) -> StoreErrorKind {
    if let Some(code) = e.code() {
        let code = code.code();
        if code == "42501" {
            return StoreErrorKind::Config;
        }
        return match code.get(..2) {
            Some("28" | "3D" | "3F") => StoreErrorKind::Config,
            Some("08" | "53" | "57" | "58" | "XX") => StoreErrorKind::Storage,
            _ => StoreErrorKind::Internal,
        };
    }
    let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
    if e.is_closed() || io {
        StoreErrorKind::Storage
    } else {
        StoreErrorKind::Internal
    }
}

/// A PostgreSQL error's message with the server's own (the driver's says only `db error`).
#[cfg(feature = "postgres")]
fn postgres_message(e: &tokio_postgres::Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

#[cfg(feature = "sqlite")]
impl From<rusqlite::Error> for StoreError {
    /// Unnamed: the store names its database when the error leaves it.
    fn from(source: rusqlite::Error) -> Self {
        StoreError::Sqlite {
            database: Database::default(),
            source,
        }
    }
}

#[cfg(feature = "postgres")]
impl From<tokio_postgres::Error> for StoreError {
    /// Unnamed: the store names its database when the error leaves it.
    fn from(source: tokio_postgres::Error) -> Self {
        StoreError::Postgres {
            database: Database::default(),
            source,
        }
    }
}

/// Why a commit was not written: refused (the variants other than `Backend`: the commit itself
/// is inconsistent, or what the store holds moved since the caller read it), or the store
/// failed (`Backend`). Either way nothing of it was written, and the caller still holds the
/// commit whole, to correct and commit again, or to drop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// [`crate::ThreadCommit::validate`] rejected the commit, or the store found the same kind
    /// of inconsistency against what it holds (a finished run keeping a batch with an open
    /// call).
    #[error("invalid commit for thread {thread_id}: {violation}")]
    Invalid {
        /// The thread.
        thread_id: ThreadId,
        /// What is wrong.
        #[source]
        violation: CommitViolation,
    },
    /// The message guard is stale: the thread holds `actual` messages, the commit expected
    /// `expected`. Reload the checkpoint and retry on fresh state.
    #[error(
        "stale message guard: the commit expected {expected} messages, the thread holds {actual}"
    )]
    VersionConflict {
        /// The commit's expected message count.
        expected: u64,
        /// The stored message count.
        actual: u64,
    },
    /// A profile key changed since the commit read it (another thread of the profile wrote
    /// it). Reload the profile and retry on fresh state.
    #[error("profile key {key:?} changed since it was read")]
    ProfileConflict {
        /// The key.
        key: String,
    },
    /// The commit's lease is no longer the run's lease (released, claimed by another worker
    /// after it expired, or the run finished): another worker owns the run now.
    #[error("the lease on run {run_id} was lost")]
    LeaseLost {
        /// The run.
        run_id: RunId,
    },
    /// The run already belongs to another thread.
    #[error("run {run_id} belongs to thread {stored_thread_id}, not to {thread_id}")]
    RunOnOtherThread {
        /// The run.
        run_id: RunId,
        /// The thread the commit names.
        thread_id: ThreadId,
        /// The thread the run is stored under.
        stored_thread_id: ThreadId,
    },
    /// Another run holds the thread: it is `Running` or `Waiting` there, and only it may
    /// commit to the thread until a commit of it is `Done` (see [`crate::ThreadStore::commit`]).
    /// A new run starts once the holder is done: it finishes, a resume or a superseding run
    /// closes its waiting calls, or a recovery claims it and closes it.
    #[error("thread {thread_id} is held by run {run_id}, which is {status}")]
    ThreadBusy {
        /// The thread.
        thread_id: ThreadId,
        /// The run that holds it.
        run_id: RunId,
        /// Its status (`Running` or `Waiting`).
        status: RunStatus,
    },
    /// The store failed (its I/O or database, data it holds, serialization, an injected
    /// fault): the commit may go through if tried again once the store works.
    #[error(transparent)]
    Backend(#[from] StoreError),
}

impl CommitError {
    pub(crate) fn invalid(thread_id: &ThreadId, violation: CommitViolation) -> Self {
        CommitError::Invalid {
            thread_id: thread_id.clone(),
            violation,
        }
    }

    /// Whether the store refused the commit (every variant but `Backend`): the store works, and
    /// the same commit is refused again until the caller changes it or what it guards.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, CommitError::Backend(_))
    }

    /// Whether someone else changed what the commit builds on since the caller read it, so the
    /// commit can succeed when made again on fresh state: a stale message guard, a profile
    /// conflict, or a thread another run holds (`ThreadBusy`: the other run started or is still
    /// going; a new run goes through once that one is done).
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            CommitError::VersionConflict { .. }
                | CommitError::ProfileConflict { .. }
                | CommitError::ThreadBusy { .. }
        )
    }
}

#[cfg(feature = "sqlite")]
impl From<rusqlite::Error> for CommitError {
    fn from(source: rusqlite::Error) -> Self {
        CommitError::Backend(source.into())
    }
}

#[cfg(feature = "postgres")]
impl From<tokio_postgres::Error> for CommitError {
    fn from(source: tokio_postgres::Error) -> Self {
        CommitError::Backend(source.into())
    }
}

/// Why a lease was not renewed ([`crate::ThreadStore::heartbeat`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The token is no longer the run's lease (another worker took the run over, the lease was
    /// released, the run finished, or there is no such run): its holder must stop writing the
    /// run.
    #[error("the lease on run {run_id} was lost")]
    Lost {
        /// The run.
        run_id: RunId,
    },
    /// The store failed; the lease may still be held.
    #[error(transparent)]
    Backend(#[from] StoreError),
}

/// An error that can name the database it came from: what a SQL store's operations return.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) trait InDatabase {
    /// Names `db` in the error if it came from a database and names none yet.
    fn in_database(self, db: &Database) -> Self;
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl InDatabase for StoreError {
    fn in_database(mut self, db: &Database) -> Self {
        if let Some(slot) = self.database_mut()
            && slot.name().is_none()
        {
            *slot = db.clone();
        }
        self
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl InDatabase for CommitError {
    fn in_database(self, db: &Database) -> Self {
        match self {
            CommitError::Backend(e) => CommitError::Backend(e.in_database(db)),
            refused => refused,
        }
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl InDatabase for LeaseError {
    fn in_database(self, db: &Database) -> Self {
        match self {
            LeaseError::Backend(e) => LeaseError::Backend(e.in_database(db)),
            lost => lost,
        }
    }
}
