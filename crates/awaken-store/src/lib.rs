//! Awaken's durable stores, the one boundary where a run's facts become committed: the
//! [`ThreadCommit`] that is the unit written (new messages guarded by the expected message
//! count, the run record, the changed run-, thread- and profile-scoped state as deltas, the
//! active tool batch, the lifecycle events, the writer's lease token), the [`ThreadStore`] trait
//! that writes a commit atomically or not at all and reads a thread back as one consistent
//! [`Checkpoint`], run leases for several workers ([`ThreadStore::claim_runnable`],
//! [`ThreadStore::heartbeat`], [`ThreadStore::release`]) with the clock as an input, and three
//! backends that pass one conformance suite: [`MemoryStore`] (tests, the library default),
//! [`SqliteStore`] (feature `sqlite`, the embedded default) and [`PostgresStore`] (feature
//! `postgres`, several workers on one database).
//!
//! A store reads the commit it is given and copies what it keeps; a refused or failed commit
//! wrote nothing and the caller still holds it. Errors say which: [`CommitError`] has a variant
//! per refusal (an invalid commit, a stale message guard, a profile conflict, a lost lease, a
//! run of another thread, a thread another run holds) and `Backend` for a failure of the store,
//! which is a [`StoreError`], the error of every operation that cannot be refused, naming the
//! [`Database`] it came from and telling a damaged store from a wrong setup
//! ([`StoreErrorKind`]); a heartbeat's lost lease is [`LeaseError::Lost`]. One run at a time
//! holds a thread: while a run is `Running` or `Waiting`, every backend refuses another run's
//! commit to its thread ([`CommitError::ThreadBusy`]).
//!
//! This crate must never know the agent loop, plugins or the phase engine: it stores what the
//! runtime hands it and gives it back. The tool batch is [`awaken_tool::ToolBatch`] itself: the
//! memory store keeps a copy of it (its calls shared), the SQL stores write its serde form and
//! read it back with its invariants checked (a stored batch that does not read back is
//! [`StoreError::Corrupt`]); [`ThreadCommit::validate`] reads its calls' states. A commit's cost
//! does not grow with the thread's length: messages are appended by index and only changed keys
//! are upserted.

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod codec;
mod commit;
mod compact;
mod error;
mod failpoint;
mod json_depth;
mod lease;
mod memory;
mod one_run;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store;

pub use commit::{
    BatchWrite, CommitViolation, LeaseToken, NewLease, RunRecord, RunStatus, ThreadCommit,
    Timestamp,
};
pub use error::{CommitError, Database, LeaseError, StoreError, StoreErrorKind};
pub use failpoint::FailPoint;
pub use memory::MemoryStore;
/// The compact form's writers and readers, for the fuzz targets (feature `fuzzing`).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use memory::fuzzing;
#[cfg(feature = "postgres")]
pub use postgres::{
    ClaimedJob, DeadJob, Enqueued, FleetListener, FleetWake, Hear, JobBeat, JobId, JobLease,
    JobState, NewJob, PostgresConfig, PostgresStore, QueueDepth, QueueError, Retried, RunQueue,
    SteerAnswer, SteerId, SteerMessage, ThreadJob,
};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteConfig, SqliteStore, Synchronous};
pub use store::{
    Checkpoint, ClaimedRun, CommitReceipt, ProfileEntry, ProfileState, StoredEvent, ThreadStore,
    ThreadSummary,
};

#[cfg(test)]
mod tests;
