//! The [`ThreadStore`] trait and what it reads back.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use awaken_event::{AgentEvent, Message, ProfileId, RunId, ThreadId};
use awaken_state::PersistedState;
use awaken_tool::ToolBatch;

use crate::commit::{LeaseToken, RunRecord, ThreadCommit, Timestamp};
use crate::error::{CommitError, LeaseError, StoreError};

/// What a successful commit left behind.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommitReceipt {
    /// The thread's message count after the commit (the next commit's guard).
    pub message_count: u64,
    /// Sequence number of the last stored event of the thread (0: none yet).
    pub last_event_seq: u64,
    /// The new version of every profile key the commit wrote (the next commit's guards).
    pub profile_versions: BTreeMap<String, u64>,
}

/// One profile key's value and version (the number of commits that wrote it).
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileEntry {
    /// The value, as exported.
    pub value: serde_json::Value,
    /// Its version: 1 after the first write, +1 per write.
    pub version: u64,
}

/// A profile's stored keys.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileState {
    /// The profile.
    pub profile_id: ProfileId,
    /// Key name → value and version. A key never written is absent (version 0).
    pub keys: BTreeMap<String, ProfileEntry>,
}

impl ProfileState {
    /// The values as a [`PersistedState`] for `StateStore::restore` (revision 0).
    pub fn to_persisted(&self) -> PersistedState {
        PersistedState {
            revision: 0,
            values: self
                .keys
                .iter()
                .map(|(k, e)| (k.clone(), e.value.clone()))
                .collect(),
        }
    }

    /// Every key's version: the guards of the next commit that writes them.
    pub fn versions(&self) -> BTreeMap<String, u64> {
        self.keys
            .iter()
            .map(|(k, e)| (k.clone(), e.version))
            .collect()
    }
}

/// A thread read back in one consistent read: what a run needs to continue.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The thread.
    pub thread_id: ThreadId,
    /// Every message, in order.
    pub messages: Vec<Message>,
    /// The thread-scoped state (revision: that of the last commit that wrote it).
    pub thread_state: PersistedState,
    /// The run committed last, if any.
    pub run: Option<RunRecord>,
    /// That run's run-scoped state.
    pub run_state: PersistedState,
    /// That run's profile state, when it has a profile.
    pub profile: Option<ProfileState>,
    /// That run's active tool batch, if any.
    pub batch: Option<ToolBatch>,
    /// Sequence number of the thread's last stored event (0: none).
    pub last_event_seq: u64,
}

impl Checkpoint {
    /// The guard of the next commit: the number of messages.
    pub fn message_count(&self) -> u64 {
        self.messages.len() as u64
    }
}

/// A thread as listed by [`ThreadStore::list_threads`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadSummary {
    /// The thread.
    pub thread_id: ThreadId,
    /// How many messages it holds.
    pub message_count: u64,
    /// The run committed last.
    pub latest_run_id: Option<RunId>,
    /// Time of its first commit.
    pub created_at: Timestamp,
    /// Time of its last commit.
    pub updated_at: Timestamp,
}

/// A stored lifecycle event.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// Its position in the thread's event log, from 1, without gaps.
    pub seq: u64,
    /// The run whose commit stored it.
    pub run_id: RunId,
    /// The event.
    pub event: AgentEvent,
}

/// A run handed to a worker by [`ThreadStore::claim_runnable`].
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedRun {
    /// The run's thread.
    pub thread_id: ThreadId,
    /// The run record.
    pub run: RunRecord,
    /// The lease to carry in commits, heartbeats and the release.
    pub lease: LeaseToken,
    /// When the lease expires unless renewed.
    pub expires_at: Timestamp,
}

/// Durable storage of threads: the one boundary where a run's facts become committed.
///
/// Every method may be called concurrently from several tasks (and, for a shared database,
/// several processes). A method that returns `Err` wrote nothing; calling it again is safe,
/// except that a repeated successful `commit` is a new commit (its guard then refuses it with
/// `VersionConflict` if it appended messages). Stores never read a clock: time comes in.
///
/// A store reads the commit it is given and copies what it keeps (a state value or a batch's
/// call is a shared reference, so copying them costs a reference count each): a refused or
/// failed commit wrote nothing and the caller still holds it whole, to correct and commit
/// again, or to drop.
#[async_trait]
pub trait ThreadStore: Send + Sync {
    /// Writes `commit` atomically, or nothing.
    ///
    /// Called by the runtime at each checkpoint (before a tool runs, after it, at step end and
    /// at run end). Refusals: [`CommitError::Invalid`] ([`ThreadCommit::validate`], or a
    /// finished run keeping a stored batch with an open call), `VersionConflict` (the thread
    /// holds another number of messages than `expected_message_count`), `ProfileConflict` (a
    /// profile key's version moved), `LeaseLost` (the commit's lease is not the run's lease any
    /// more), `RunOnOtherThread`, `ThreadBusy` (below); `Backend` when the store failed. A
    /// `Done` run's lease is released.
    ///
    /// One run at a time holds a thread: while a run of the thread is `Running` or `Waiting`,
    /// a commit of any other run to it (a new run's first commit, or a finished run's) is
    /// refused with [`CommitError::ThreadBusy`] naming the holder. The holder's own commits go
    /// through, and once one of them is `Done` another run may start. The check is made inside
    /// the write, against concurrent commits too: of several first commits of new runs on one
    /// thread at once, one goes through. To start a run on a thread whose holder's process is
    /// gone, claim the holder ([`claim_run`](Self::claim_run), which takes a run whose lease
    /// expired or that has none) and commit it `Done` with that lease (the old holder's later
    /// commits are then `LeaseLost`, also once another run holds the thread); a `Waiting`
    /// holder is closed by a commit of it as `Done`.
    async fn commit(&self, commit: &ThreadCommit) -> Result<CommitReceipt, CommitError>;

    /// [`commit`](Self::commit) without a future, for a store that can write at once (the
    /// memory store always; SQLite when its connection and the database's write lock are free,
    /// see `SqliteConfig::inline_commits`): `Some` with what `commit` would return, or `None`
    /// when the store takes no shortcut now (nothing was written; call `commit`). The default
    /// takes none.
    ///
    /// It saves the boxed future of a dynamically dispatched `commit` (with SQLite, a thread
    /// hop too) on every commit of a runtime that commits often.
    fn commit_now(&self, commit: &ThreadCommit) -> Option<Result<CommitReceipt, CommitError>> {
        let _ = commit;
        None
    }

    /// Reads the thread back in one consistent read; `None` if it was never committed (or was
    /// deleted).
    async fn load_checkpoint(&self, thread_id: &ThreadId)
    -> Result<Option<Checkpoint>, StoreError>;

    /// A profile's keys with their versions (empty for an unknown profile), for a new thread.
    async fn load_profile(&self, profile_id: &ProfileId) -> Result<ProfileState, StoreError>;

    /// Every thread, ordered by thread id.
    async fn list_threads(&self) -> Result<Vec<ThreadSummary>, StoreError>;

    /// The runs of a thread, oldest first (by creation time, then run id).
    async fn list_runs(&self, thread_id: &ThreadId) -> Result<Vec<RunRecord>, StoreError>;

    /// The record of run `run_id` if thread `thread_id` holds it (`None`: no such run on the
    /// thread). The default looks through the thread's runs; the stores read the one record.
    async fn load_run(
        &self,
        thread_id: &ThreadId,
        run_id: &RunId,
    ) -> Result<Option<RunRecord>, StoreError> {
        let runs = self.list_runs(thread_id).await?;
        Ok(runs.into_iter().find(|r| r.run_id == *run_id))
    }

    /// The record of the thread's latest run, as its checkpoint holds it (`None`: the thread has
    /// none, or is unknown). The default reads the whole checkpoint; the stores read the one record, so a
    /// look at where a long thread stands costs what a short one's does.
    async fn latest_run(&self, thread_id: &ThreadId) -> Result<Option<RunRecord>, StoreError> {
        Ok(self
            .load_checkpoint(thread_id)
            .await?
            .and_then(|checkpoint| checkpoint.run))
    }

    /// The thread of run `run_id`, if it is stored. The default looks through every thread's
    /// runs; the stores answer from their index of runs.
    async fn run_thread(&self, run_id: &RunId) -> Result<Option<ThreadId>, StoreError> {
        for thread in self.list_threads().await? {
            let runs = self.list_runs(&thread.thread_id).await?;
            if runs.iter().any(|r| r.run_id == *run_id) {
                return Ok(Some(thread.thread_id));
            }
        }
        Ok(None)
    }

    /// The thread's stored events with a sequence number above `since` (0: all), in order.
    async fn load_events(
        &self,
        thread_id: &ThreadId,
        since: u64,
    ) -> Result<Vec<StoredEvent>, StoreError>;

    /// Deletes the thread with its messages, events, state, runs (with their state, batches and
    /// leases). Profile state stays. `false` if there was no such thread.
    async fn delete_thread(&self, thread_id: &ThreadId) -> Result<bool, StoreError>;

    /// Claims up to `limit` `Running` runs whose lease is free or expired at `now`, for
    /// `worker_id`, until `now + lease_duration`: the runs claimed fewest times first, then the
    /// oldest update, so a run whose continuation keeps failing goes behind the others instead
    /// of being claimed first every time (every claim counts, a resume's `claim_run` too). A delegate's child run (one with a parent) is never
    /// claimed: its parent's call continues it. (A `Waiting` run waits for a decision, not for
    /// a worker: the resume that brings one claims it with [`claim_run`](Self::claim_run), so
    /// waiting runs never stand in the way of the runs a recovery is for.)
    /// Each claim increments the run's lease epoch, so the previous holder's token is lost.
    /// Concurrent claimers never get the same run.
    async fn claim_runnable(
        &self,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<ClaimedRun>, StoreError>;

    /// Claims one run — the way a worker resuming a waiting run takes its lease (a new run is
    /// created leased: [`ThreadCommit::new_lease`]) — for `worker_id` until
    /// `now + lease_duration`, if the run is
    /// unfinished and its lease is free or expired. `None`: another worker holds it, it is
    /// finished, or there is no such run. Increments the lease epoch like `claim_runnable`.
    async fn claim_run(
        &self,
        run_id: &RunId,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Option<ClaimedRun>, StoreError>;

    /// Extends `lease` to `now + lease_duration` and returns the new expiry.
    /// [`LeaseError::Lost`] if it is not the run's lease any more (taken over, released, or the
    /// run finished): its holder must stop writing the run. An expired lease nobody claimed
    /// since is still held and is renewed.
    async fn heartbeat(
        &self,
        lease: &LeaseToken,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Timestamp, LeaseError>;

    /// Gives `lease` up; `false` if it was not held any more.
    async fn release(&self, lease: &LeaseToken) -> Result<bool, StoreError>;
}

/// A shared store is a store (the runtime and a recovery task can hold one `Arc`).
#[async_trait]
impl<T: ThreadStore + ?Sized> ThreadStore for std::sync::Arc<T> {
    async fn commit(&self, commit: &ThreadCommit) -> Result<CommitReceipt, CommitError> {
        (**self).commit(commit).await
    }

    fn commit_now(&self, commit: &ThreadCommit) -> Option<Result<CommitReceipt, CommitError>> {
        (**self).commit_now(commit)
    }

    async fn load_checkpoint(
        &self,
        thread_id: &ThreadId,
    ) -> Result<Option<Checkpoint>, StoreError> {
        (**self).load_checkpoint(thread_id).await
    }

    async fn load_profile(&self, profile_id: &ProfileId) -> Result<ProfileState, StoreError> {
        (**self).load_profile(profile_id).await
    }

    async fn list_threads(&self) -> Result<Vec<ThreadSummary>, StoreError> {
        (**self).list_threads().await
    }

    async fn list_runs(&self, thread_id: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        (**self).list_runs(thread_id).await
    }

    async fn load_run(
        &self,
        thread_id: &ThreadId,
        run_id: &RunId,
    ) -> Result<Option<RunRecord>, StoreError> {
        (**self).load_run(thread_id, run_id).await
    }

    async fn latest_run(&self, thread_id: &ThreadId) -> Result<Option<RunRecord>, StoreError> {
        (**self).latest_run(thread_id).await
    }

    async fn run_thread(&self, run_id: &RunId) -> Result<Option<ThreadId>, StoreError> {
        (**self).run_thread(run_id).await
    }

    async fn load_events(
        &self,
        thread_id: &ThreadId,
        since: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        (**self).load_events(thread_id, since).await
    }

    async fn delete_thread(&self, thread_id: &ThreadId) -> Result<bool, StoreError> {
        (**self).delete_thread(thread_id).await
    }

    async fn claim_runnable(
        &self,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<ClaimedRun>, StoreError> {
        (**self)
            .claim_runnable(worker_id, lease_duration, now, limit)
            .await
    }

    async fn heartbeat(
        &self,
        lease: &LeaseToken,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Timestamp, LeaseError> {
        (**self).heartbeat(lease, lease_duration, now).await
    }

    async fn release(&self, lease: &LeaseToken) -> Result<bool, StoreError> {
        (**self).release(lease).await
    }

    async fn claim_run(
        &self,
        run_id: &RunId,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Option<ClaimedRun>, StoreError> {
        (**self)
            .claim_run(run_id, worker_id, lease_duration, now)
            .await
    }
}
