//! Store faults: [`FaultyStore`] passes every call to the store it wraps and, for the commit
//! of a run the soak chose, arms one of the store's failpoints (`arm_failpoint`, the store's
//! `failpoints` feature) just before it. Around that commit it reads the thread back, so the
//! soak can check that the failed commit wrote nothing and that everything committed before
//! it is still there after the run.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use awaken_event::{ProfileId, RunId, ThreadId};
use awaken_store::{
    Checkpoint, ClaimedRun, CommitError, CommitReceipt, FailPoint, LeaseError, LeaseToken,
    MemoryStore, ProfileState, RunRecord, SqliteStore, StoreError, StoredEvent, ThreadCommit,
    ThreadStore, ThreadSummary, Timestamp,
};

/// A store whose failpoints the soak can arm.
pub(crate) trait Armable: ThreadStore + 'static {
    /// Makes the store's next commit that reaches `point` fail there.
    fn arm(&self, point: FailPoint);
}

impl Armable for MemoryStore {
    fn arm(&self, point: FailPoint) {
        self.arm_failpoint(point);
    }
}

impl Armable for SqliteStore {
    fn arm(&self, point: FailPoint) {
        self.arm_failpoint(point);
    }
}

/// What a thread held, read back in full.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Holding {
    /// Its checkpoint (`None`: never committed).
    pub(crate) checkpoint: Option<Checkpoint>,
    /// Its stored events (empty when not asked for).
    pub(crate) events: Vec<StoredEvent>,
    /// Its runs.
    pub(crate) runs: Vec<RunRecord>,
}

impl Holding {
    /// Reads `thread_id` back from `store`, its events too when `events` says so.
    pub(crate) async fn read(
        store: &dyn ThreadStore,
        thread_id: &ThreadId,
        events: bool,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            checkpoint: store.load_checkpoint(thread_id).await?,
            events: if events {
                store.load_events(thread_id, 0).await?
            } else {
                Vec::new()
            },
            runs: store.list_runs(thread_id).await?,
        })
    }
}

/// The fault injected into a run's commit and what the store held around it.
#[derive(Debug)]
pub(crate) struct Injected {
    /// Whether the commit failed with the injected error at the armed point.
    pub(crate) fired: bool,
    /// The thread before the commit (`Err`: it could not be read).
    pub(crate) before: Result<Holding, StoreError>,
    /// The thread right after the failed commit.
    pub(crate) after: Result<Holding, StoreError>,
}

/// A store that fails the commit the soak chose; see the module docs. Runs through it go one
/// at a time while a fault is planned (the failpoint is the store's, not the run's).
pub(crate) struct FaultyStore<S> {
    inner: S,
    /// Commits since [`FaultyStore::plan`].
    commits: AtomicU32,
    /// The commit to fail (0: none), read on every commit without a lock.
    target_at: AtomicU32,
    /// And where.
    target: Mutex<Option<(u32, FailPoint)>>,
    injected: Mutex<Option<Injected>>,
}

impl<S: Armable> FaultyStore<S> {
    /// Wraps `inner`.
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            commits: AtomicU32::new(0),
            target_at: AtomicU32::new(0),
            target: Mutex::new(None),
            injected: Mutex::new(None),
        }
    }

    /// Starts counting the commits of a run, failing number `at_commit` (from 1) at `point`
    /// when given.
    pub(crate) fn plan(&self, fault: Option<(u32, FailPoint)>) {
        self.commits.store(0, Ordering::Relaxed);
        self.target_at
            .store(fault.map_or(0, |(at, _)| at), Ordering::Relaxed);
        *lock(&self.target) = fault;
        *lock(&self.injected) = None;
    }

    /// The commits made since [`FaultyStore::plan`] (refused and failed ones included).
    pub(crate) fn commits(&self) -> u32 {
        self.commits.load(Ordering::Relaxed)
    }

    /// The injected fault, once its commit was made; clears the plan.
    pub(crate) fn take_injected(&self) -> Option<Injected> {
        self.target_at.store(0, Ordering::Relaxed);
        *lock(&self.target) = None;
        lock(&self.injected).take()
    }

    fn is_target(&self, commit: u32) -> Option<FailPoint> {
        if self.target_at.load(Ordering::Relaxed) != commit {
            return None;
        }
        match *lock(&self.target) {
            Some((at, point)) if at == commit => Some(point),
            _ => None,
        }
    }

    async fn fail(
        &self,
        commit: &ThreadCommit,
        point: FailPoint,
    ) -> Result<CommitReceipt, CommitError> {
        let before = Holding::read(&self.inner, &commit.thread_id, true).await;
        self.inner.arm(point);
        let written = self.inner.commit(commit).await;
        let fired = matches!(
            &written,
            Err(CommitError::Backend(StoreError::Injected { point: p })) if *p == point
        );
        let after = Holding::read(&self.inner, &commit.thread_id, true).await;
        *lock(&self.injected) = Some(Injected {
            fired,
            before,
            after,
        });
        written
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[async_trait]
impl<S: Armable> ThreadStore for FaultyStore<S> {
    async fn commit(&self, commit: &ThreadCommit) -> Result<CommitReceipt, CommitError> {
        let n = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        match self.is_target(n) {
            Some(point) => self.fail(commit, point).await,
            None => self.inner.commit(commit).await,
        }
    }

    fn commit_now(&self, commit: &ThreadCommit) -> Option<Result<CommitReceipt, CommitError>> {
        // The chosen commit takes the path with a future, which reads the thread around it.
        let next = self.commits.load(Ordering::Relaxed) + 1;
        if self.is_target(next).is_some() {
            return None;
        }
        let written = self.inner.commit_now(commit)?;
        self.commits.store(next, Ordering::Relaxed);
        Some(written)
    }

    async fn load_checkpoint(
        &self,
        thread_id: &ThreadId,
    ) -> Result<Option<Checkpoint>, StoreError> {
        self.inner.load_checkpoint(thread_id).await
    }

    async fn load_profile(&self, profile_id: &ProfileId) -> Result<ProfileState, StoreError> {
        self.inner.load_profile(profile_id).await
    }

    async fn list_threads(&self) -> Result<Vec<ThreadSummary>, StoreError> {
        self.inner.list_threads().await
    }

    async fn list_runs(&self, thread_id: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.list_runs(thread_id).await
    }

    async fn load_events(
        &self,
        thread_id: &ThreadId,
        since: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.load_events(thread_id, since).await
    }

    async fn delete_thread(&self, thread_id: &ThreadId) -> Result<bool, StoreError> {
        self.inner.delete_thread(thread_id).await
    }

    async fn claim_runnable(
        &self,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<ClaimedRun>, StoreError> {
        self.inner
            .claim_runnable(worker_id, lease_duration, now, limit)
            .await
    }

    async fn claim_run(
        &self,
        run_id: &RunId,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Option<ClaimedRun>, StoreError> {
        self.inner
            .claim_run(run_id, worker_id, lease_duration, now)
            .await
    }

    async fn heartbeat(
        &self,
        lease: &LeaseToken,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Timestamp, LeaseError> {
        self.inner.heartbeat(lease, lease_duration, now).await
    }

    async fn release(&self, lease: &LeaseToken) -> Result<bool, StoreError> {
        self.inner.release(lease).await
    }
}
