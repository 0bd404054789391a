//! [`MemoryStore`]: everything in process memory, for tests and as the library default.
//!
//! The store's tables and their locks are in `shards`; a thread (its row, state and log of
//! messages and events) in `thread`, a run's row in `runs`, and what is archived of both (in
//! [`crate::compact`]'s form) in `archive`. A commit is `transaction` (checks, then changes
//! with the `undo` log); reads are in `read`, run leases in `leases`.

use std::time::Duration;

use async_trait::async_trait;
use awaken_event::{ProfileId, RunId, ThreadId};

use crate::commit::{LeaseToken, RunRecord, ThreadCommit, Timestamp};
use crate::error::{CommitError, LeaseError, StoreError};
#[cfg(feature = "failpoints")]
use crate::failpoint::FailPoint;
use crate::store::{
    Checkpoint, ClaimedRun, CommitReceipt, ProfileState, StoredEvent, ThreadStore, ThreadSummary,
};

mod archive;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod leases;
mod maps;
mod read;
mod runs;
mod shards;
mod thread;
mod transaction;
mod undo;

use shards::Tables;
use transaction::WriteOptions;

/// A [`ThreadStore`] in process memory. Commits are atomic: every check runs before the first
/// change, and a failure between changes (an injected fault) is rolled back from an undo log,
/// so the cost of a commit stays proportional to what it writes.
///
/// Threads are spread over independently locked shards (by a hash of the thread id), so
/// commits to different threads rarely wait for each other. Profiles, shared by threads, and
/// the index of which thread each run is on (sharded by run id) have their own locks, always
/// taken after a shard's (a thread's shard, then a run index shard, then the profiles).
#[derive(Debug, Default)]
pub struct MemoryStore {
    tables: Tables,
    options: WriteOptions,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store that keeps a copy of every commit's messages and events as they came instead
    /// of its compact form: about six times the memory per finished thread, for no encoding.
    /// Reads give back the same either way.
    pub fn without_compaction() -> Self {
        Self {
            options: WriteOptions {
                compact: false,
                ..WriteOptions::default()
            },
            ..Self::default()
        }
    }

    /// Makes the next commit that reaches `point` fail there (tests of atomicity).
    #[cfg(feature = "failpoints")]
    pub fn arm_failpoint(&self, point: FailPoint) {
        self.options.failpoints.arm(point);
    }

    /// A commit, written at once (nothing in it waits).
    fn write(&self, commit: &ThreadCommit) -> Result<CommitReceipt, CommitError> {
        transaction::write(&self.tables, &self.options, commit)
    }
}

#[async_trait]
impl ThreadStore for MemoryStore {
    async fn commit(&self, commit: &ThreadCommit) -> Result<CommitReceipt, CommitError> {
        self.write(commit)
    }

    fn commit_now(&self, commit: &ThreadCommit) -> Option<Result<CommitReceipt, CommitError>> {
        Some(self.write(commit))
    }

    async fn load_checkpoint(
        &self,
        thread_id: &ThreadId,
    ) -> Result<Option<Checkpoint>, StoreError> {
        self.tables
            .checkpoint(thread_id)
            .map_err(|e| e.of_thread(thread_id))
    }

    async fn load_profile(&self, profile_id: &ProfileId) -> Result<ProfileState, StoreError> {
        Ok(self.tables.profile(profile_id))
    }

    async fn list_threads(&self) -> Result<Vec<ThreadSummary>, StoreError> {
        Ok(self.tables.threads())
    }

    async fn list_runs(&self, thread_id: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        self.tables
            .runs(thread_id)
            .map_err(|e| e.of_thread(thread_id))
    }

    async fn load_run(
        &self,
        thread_id: &ThreadId,
        run_id: &RunId,
    ) -> Result<Option<RunRecord>, StoreError> {
        self.tables
            .run(thread_id, run_id)
            .map_err(|e| e.of_thread(thread_id))
    }

    async fn latest_run(&self, thread_id: &ThreadId) -> Result<Option<RunRecord>, StoreError> {
        self.tables
            .latest_run(thread_id)
            .map_err(|e| e.of_thread(thread_id))
    }

    async fn run_thread(&self, run_id: &RunId) -> Result<Option<ThreadId>, StoreError> {
        Ok(self.tables.run_index(run_id).get(run_id).cloned())
    }

    async fn load_events(
        &self,
        thread_id: &ThreadId,
        since: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.tables
            .events(thread_id, since)
            .map_err(|e| e.of_thread(thread_id))
    }

    async fn delete_thread(&self, thread_id: &ThreadId) -> Result<bool, StoreError> {
        self.tables.delete_thread(thread_id)
    }

    async fn claim_runnable(
        &self,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<ClaimedRun>, StoreError> {
        self.tables
            .claim_runnable(worker_id, lease_duration, now, limit)
    }

    async fn claim_run(
        &self,
        run_id: &RunId,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Option<ClaimedRun>, StoreError> {
        self.tables
            .claim_run(run_id, worker_id, lease_duration, now)
    }

    async fn heartbeat(
        &self,
        lease: &LeaseToken,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Timestamp, LeaseError> {
        self.tables.heartbeat(lease, lease_duration, now)
    }

    async fn release(&self, lease: &LeaseToken) -> Result<bool, StoreError> {
        self.tables.release(lease)
    }
}

#[cfg(test)]
mod tests;
