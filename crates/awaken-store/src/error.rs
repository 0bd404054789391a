//! What can go wrong in a store: [`StoreError`] for a failure of the store itself, and the
//! errors of the operations a store may refuse, [`CommitError`] (a commit) and [`LeaseError`]
//! (a heartbeat), each with the refusals as their own variants and `Backend` for the rest.

use awaken_event::{RunId, ThreadId};

use crate::commit::CommitViolation;
use crate::failpoint::FailPoint;

/// Why a store failed: its I/O, its database, data it holds that does not read back, a value it
/// could not serialize, its configuration, or a fault a test injected. An operation that fails
/// so wrote nothing; what a store refuses on purpose (a commit, a lease) has its own error
/// ([`CommitError`], [`LeaseError`]) wrapping this one for its backend failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Stored data could not be read back (a row that does not parse).
    #[error("stored {what} could not be read: {detail}")]
    Corrupt {
        /// What was being read (`message`, `run record`, ...).
        what: &'static str,
        /// Why.
        detail: String,
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
    #[error("the database schema is at version {found}; this build knows up to {supported}")]
    SchemaTooNew {
        /// The stored version.
        found: i64,
        /// The newest version this build can migrate to.
        supported: i64,
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
    #[error("sqlite: {source}")]
    Sqlite {
        /// The driver's error.
        #[source]
        source: rusqlite::Error,
    },
    /// PostgreSQL reported an error (or the connection failed).
    #[cfg(feature = "postgres")]
    #[error("postgres: {source}")]
    Postgres {
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
        }
    }
}

#[cfg(feature = "sqlite")]
impl From<rusqlite::Error> for StoreError {
    fn from(source: rusqlite::Error) -> Self {
        StoreError::Sqlite { source }
    }
}

#[cfg(feature = "postgres")]
impl From<tokio_postgres::Error> for StoreError {
    fn from(source: tokio_postgres::Error) -> Self {
        StoreError::Postgres { source }
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

    /// Whether the commit can succeed when made again on fresh state: a stale message guard
    /// or a profile conflict (the thread or the profile changed since the caller read it).
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            CommitError::VersionConflict { .. } | CommitError::ProfileConflict { .. }
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
