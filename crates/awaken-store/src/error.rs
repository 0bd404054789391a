//! What can go wrong in a store.

use awaken_event::{RunId, ThreadId};

use crate::commit::CommitViolation;
use crate::failpoint::FailPoint;

/// Why a store operation failed. A failed commit wrote nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// [`crate::ThreadCommit::validate`] rejected the commit (or the store found the same kind
    /// of inconsistency against stored data, such as a kept batch with an open call on a
    /// finished run).
    #[error("invalid commit for thread {thread_id}: {violation}")]
    InvalidCommit {
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
    /// The writer's lease is no longer the run's lease (released, or claimed by another worker
    /// after it expired).
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
    pub(crate) fn invalid(thread_id: &ThreadId, violation: CommitViolation) -> Self {
        StoreError::InvalidCommit {
            thread_id: thread_id.clone(),
            violation,
        }
    }

    pub(crate) fn corrupt(what: &'static str, detail: impl ToString) -> Self {
        StoreError::Corrupt {
            what,
            detail: detail.to_string(),
        }
    }

    /// Whether retrying on fresh state can succeed: a stale message guard or a profile conflict.
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            StoreError::VersionConflict { .. } | StoreError::ProfileConflict { .. }
        )
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
