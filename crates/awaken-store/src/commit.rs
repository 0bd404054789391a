//! The unit a store writes: [`ThreadCommit`], its run record and its validation.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use awaken_event::{AgentEvent, Message, ProfileId, RunId, TerminationReason, ThreadId};
use awaken_event::{TokenUsage, ToolCallId, ToolCallState};
use awaken_state::StateDelta;
use awaken_tool::ToolBatch;
use serde::{Deserialize, Serialize};

/// A point in time as milliseconds since the Unix epoch, supplied by the caller: stores never
/// read a clock (tests control time).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The epoch itself.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// A timestamp `millis` milliseconds after the epoch.
    pub const fn from_unix_millis(millis: i64) -> Self {
        Timestamp(millis)
    }

    /// Milliseconds since the epoch.
    pub const fn as_unix_millis(self) -> i64 {
        self.0
    }

    /// The system clock's time now.
    pub fn now() -> Self {
        Self::from_system_time(SystemTime::now())
    }

    /// Converts a [`SystemTime`] (saturating; times before the epoch become the epoch).
    pub fn from_system_time(time: SystemTime) -> Self {
        let millis = time
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Timestamp(millis)
    }

    /// This time plus `duration` (saturating).
    pub fn saturating_add(self, duration: Duration) -> Self {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_add(millis))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Active (or interrupted by a crash: leases find it).
    Running,
    /// Suspended: waiting for an external decision on a tool call.
    Waiting,
    /// Finished; its record no longer changes meaningfully and it holds no lease.
    Done,
}

impl RunStatus {
    /// The stored name (`running`, `waiting`, `done`).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Done => "done",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "running" => Some(RunStatus::Running),
            "waiting" => Some(RunStatus::Waiting),
            "done" => Some(RunStatus::Done),
            _ => None,
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One run of an agent on a thread, as the store keeps it (written whole with every commit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run.
    pub run_id: RunId,
    /// The parent run, for a delegated child run.
    pub parent_run_id: Option<RunId>,
    /// The agent being run (not blank). Shared: the record is copied into every commit.
    pub agent_id: Arc<str>,
    /// The profile whose profile-scoped state the run reads and writes.
    pub profile_id: Option<ProfileId>,
    /// Where the run stands.
    pub status: RunStatus,
    /// Why it ended: `None` while `Running`, `Suspended` while `Waiting`, anything else once
    /// `Done`.
    pub termination: Option<TerminationReason>,
    /// Steps (inferences) taken so far.
    pub steps: u32,
    /// Token usage of the whole run so far.
    pub usage: TokenUsage,
    /// Digest of the resolved agent spec the run uses (detects a spec change on resume).
    pub spec_digest: Arc<str>,
    /// When the run was created; the store keeps the value of the run's first commit.
    pub created_at: Timestamp,
    /// When this commit was made (the caller's clock).
    pub updated_at: Timestamp,
}

impl RunRecord {
    /// A `Running` run at step 0 with no usage, created and updated at `now`.
    pub fn new(run_id: RunId, agent_id: impl Into<Arc<str>>, now: Timestamp) -> Self {
        Self {
            run_id,
            parent_run_id: None,
            agent_id: agent_id.into(),
            profile_id: None,
            status: RunStatus::Running,
            termination: None,
            steps: 0,
            usage: TokenUsage::default(),
            // The shared empty string: no allocation.
            spec_digest: Arc::default(),
            created_at: now,
            updated_at: now,
        }
    }
}

/// A lease on one run, held by one worker: what [`crate::ThreadStore::claim_runnable`] hands
/// out and a commit carries. The epoch grows with every claim of the run, so a token from
/// before a takeover never matches again.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LeaseToken {
    /// The leased run.
    pub run_id: RunId,
    /// The worker holding it (not blank).
    pub worker_id: String,
    /// The run's claim counter at the time of this claim.
    pub epoch: u64,
}

/// The lease a commit that creates its run gives its writer
/// ([`ThreadCommit::with_new_lease`]): the run exists leased from its first commit, so no
/// recovery can claim it before its worker does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewLease {
    /// The worker the new run is leased to (not blank).
    pub worker_id: String,
    /// When the lease expires unless a heartbeat renews it.
    pub expires_at: Timestamp,
}

impl NewLease {
    /// This lease's token on the run `run_id` it created: the run's first claim, epoch 1.
    pub fn token(&self, run_id: &RunId) -> LeaseToken {
        LeaseToken {
            run_id: run_id.clone(),
            worker_id: self.worker_id.clone(),
            epoch: 1,
        }
    }
}

/// What a commit does to the run's active tool batch.
///
/// The batch travels as it is: the memory store keeps a copy of it (its calls and results are
/// shared, so copying a one-call batch is one allocation), a SQL store writes its serde form.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum BatchWrite {
    /// The stored batch stays as it is.
    #[default]
    Keep,
    /// The run's active batch becomes this one.
    Set(ToolBatch),
    /// The run has no active batch any more.
    Clear,
}

/// Everything one commit writes to a thread, atomically or not at all.
///
/// Build it with [`ThreadCommit::new`] and the `with_*` methods; the fields are public so a
/// runtime can also fill them directly. [`validate`](Self::validate) is called by every store
/// before any write.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadCommit {
    /// The thread written to.
    pub thread_id: ThreadId,
    /// The run record after this commit (written whole).
    pub run: RunRecord,
    /// The number of messages the thread holds before this commit (the message guard): the
    /// commit is refused with `CommitError::VersionConflict` if the store holds another
    /// number.
    pub expected_message_count: u64,
    /// Messages appended after the first `expected_message_count`.
    pub messages: Vec<Message>,
    /// Changed `Run`-scoped keys (`Snapshot::export_changed_in(KeyScope::Run, since)`).
    pub run_state: StateDelta,
    /// Changed `Thread`-scoped keys.
    pub thread_state: StateDelta,
    /// Changed `Profile`-scoped keys of the run's profile.
    pub profile_state: StateDelta,
    /// The version at which each profile key was read (0: absent). Every key of
    /// `profile_state` needs one (its guard); other listed keys are checked as read guards.
    pub profile_versions: BTreeMap<String, u64>,
    /// What happens to the run's active tool batch.
    pub batch: BatchWrite,
    /// Lifecycle events to store with the commit (no token deltas), in emission order.
    pub events: Vec<AgentEvent>,
    /// The writer's lease, when leases are in use: the commit is refused with
    /// `CommitError::LeaseLost` unless it is still the run's current lease. `None`: no lease
    /// check.
    pub lease: Option<LeaseToken>,
    /// When this commit creates its run, the run starts leased to this worker at epoch 1
    /// ([`NewLease::token`]). When the run exists, the commit is checked as if it carried
    /// that token (`lease` takes precedence): refused with `CommitError::LeaseLost` unless the
    /// run is still leased to the worker at epoch 1 (the same first commit made again).
    pub new_lease: Option<NewLease>,
}

/// Why [`ThreadCommit::validate`] rejected a commit (`CommitError::Invalid`). Nothing was
/// written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CommitViolation {
    /// A required identifier is blank.
    #[error("{field} is blank")]
    BlankId {
        /// Which field.
        field: &'static str,
    },
    /// The run names itself as its parent.
    #[error("run {run_id} names itself as its parent")]
    OwnParent {
        /// The run.
        run_id: RunId,
    },
    /// Status and termination disagree (`Running` has none, `Waiting` is `Suspended`, `Done`
    /// has another one).
    #[error("a {status} run cannot have termination {termination}")]
    StatusTermination {
        /// The status.
        status: RunStatus,
        /// The termination kind, or `none`.
        termination: &'static str,
    },
    /// The run was updated before it was created.
    #[error("updated_at {updated_at} is before created_at {created_at}")]
    TimeTravel {
        /// Creation time.
        created_at: Timestamp,
        /// Update time.
        updated_at: Timestamp,
    },
    /// Profile state or profile versions without a profile id on the run.
    #[error("profile state is written but the run has no profile id")]
    ProfileStateWithoutProfile,
    /// A profile key is written without the version it was read at.
    #[error("profile key {key:?} is written without the version it was read at")]
    UnguardedProfileKey {
        /// The key.
        key: String,
    },
    /// An event that is not a lifecycle event (a token delta, a state snapshot, ...).
    #[error("event {event_type} is not a lifecycle event and is not stored")]
    NotLifecycleEvent {
        /// Its type tag.
        event_type: &'static str,
    },
    /// The lease token names another run or a blank worker.
    #[error("the lease token is for run {lease_run_id}, the commit is for run {run_id}")]
    LeaseForOtherRun {
        /// The commit's run.
        run_id: RunId,
        /// The token's run.
        lease_run_id: RunId,
    },
    /// A finished run still holds a call that is not closed.
    #[error("the run is done but tool call {call_id} is still {state:?}")]
    CallInFlight {
        /// The open call.
        call_id: ToolCallId,
        /// Its state.
        state: ToolCallState,
    },
}

impl ThreadCommit {
    /// A commit of `run` to `thread_id`, which holds `expected_message_count` messages; no new
    /// messages, state, batch change, events or lease yet.
    pub fn new(thread_id: ThreadId, run: RunRecord, expected_message_count: u64) -> Self {
        Self {
            thread_id,
            run,
            expected_message_count,
            messages: Vec::new(),
            run_state: StateDelta::default(),
            thread_state: StateDelta::default(),
            profile_state: StateDelta::default(),
            profile_versions: BTreeMap::new(),
            batch: BatchWrite::Keep,
            events: Vec::new(),
            lease: None,
            new_lease: None,
        }
    }

    /// Appends these messages.
    pub fn with_messages(mut self, messages: impl IntoIterator<Item = Message>) -> Self {
        self.messages.extend(messages);
        self
    }

    /// Writes these changed run-scoped keys.
    pub fn with_run_state(mut self, delta: impl Into<StateDelta>) -> Self {
        self.run_state = delta.into();
        self
    }

    /// Writes these changed thread-scoped keys.
    pub fn with_thread_state(mut self, delta: impl Into<StateDelta>) -> Self {
        self.thread_state = delta.into();
        self
    }

    /// Writes these changed profile keys, each guarded by the version it was read at.
    pub fn with_profile_state(
        mut self,
        delta: impl Into<StateDelta>,
        versions: BTreeMap<String, u64>,
    ) -> Self {
        self.profile_state = delta.into();
        self.profile_versions = versions;
        self
    }

    /// Sets the run's active batch to this one.
    pub fn with_batch(mut self, batch: ToolBatch) -> Self {
        self.batch = BatchWrite::Set(batch);
        self
    }

    /// Clears the run's active batch.
    pub fn with_batch_cleared(mut self) -> Self {
        self.batch = BatchWrite::Clear;
        self
    }

    /// Stores these lifecycle events.
    pub fn with_events(mut self, events: impl IntoIterator<Item = AgentEvent>) -> Self {
        self.events.extend(events);
        self
    }

    /// Checks the writer's lease.
    pub fn with_lease(mut self, lease: LeaseToken) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Leases the run to its writer when this commit creates it.
    pub fn with_new_lease(mut self, lease: NewLease) -> Self {
        self.new_lease = Some(lease);
        self
    }

    /// The lease the store checks the commit against, given whether the run exists: the
    /// writer's, or, on a run that exists, the token of the lease the commit would have created
    /// it with (so only a first commit made again by the writer it leased the run to goes
    /// through).
    pub(crate) fn lease_to_check(&self, run_exists: bool) -> Option<Cow<'_, LeaseToken>> {
        match (&self.lease, &self.new_lease) {
            (Some(lease), _) => Some(Cow::Borrowed(lease)),
            (None, Some(new)) if run_exists => Some(Cow::Owned(new.token(&self.run.run_id))),
            _ => None,
        }
    }

    /// The lease this commit gives its run if it creates it: none for a run done at once.
    pub(crate) fn lease_to_create(&self) -> Option<&NewLease> {
        self.new_lease
            .as_ref()
            .filter(|_| self.run.status != RunStatus::Done)
    }

    /// The thread's message count after this commit.
    pub fn message_count_after(&self) -> u64 {
        self.expected_message_count
            .saturating_add(self.messages.len() as u64)
    }

    /// Rejects an inconsistent commit before anything is written: blank agent id or lease
    /// worker (checked or new), a run that is its own parent, a status that disagrees with the
    /// termination, `updated_at` before `created_at`, profile state without a profile id or a profile key
    /// without its version guard, a non-lifecycle event, a lease for another run, and a `Done`
    /// run whose batch still holds a call that is not closed.
    ///
    /// Checks that need stored data (the guards, the lease, a kept batch of a finished run) are
    /// made by the store inside its write.
    pub fn validate(&self) -> Result<(), CommitViolation> {
        let run = &self.run;
        // (`trim().is_empty()`, without finding where the trimmed text would end.)
        if run.agent_id.chars().all(char::is_whitespace) {
            return Err(CommitViolation::BlankId { field: "agent_id" });
        }
        if run.parent_run_id.as_ref() == Some(&run.run_id) {
            return Err(CommitViolation::OwnParent {
                run_id: run.run_id.clone(),
            });
        }
        let consistent = match (run.status, &run.termination) {
            (RunStatus::Running, None) => true,
            (RunStatus::Waiting, Some(TerminationReason::Suspended)) => true,
            (RunStatus::Done, Some(t)) => !matches!(t, TerminationReason::Suspended),
            _ => false,
        };
        if !consistent {
            return Err(CommitViolation::StatusTermination {
                status: run.status,
                termination: run.termination.as_ref().map_or("none", |t| t.kind()),
            });
        }
        if run.updated_at < run.created_at {
            return Err(CommitViolation::TimeTravel {
                created_at: run.created_at,
                updated_at: run.updated_at,
            });
        }
        let profile_written =
            !self.profile_state.values.is_empty() || !self.profile_versions.is_empty();
        if profile_written && run.profile_id.is_none() {
            return Err(CommitViolation::ProfileStateWithoutProfile);
        }
        if let Some(key) = self
            .profile_state
            .values
            .keys()
            .find(|k| !self.profile_versions.contains_key(k.as_ref()))
        {
            return Err(CommitViolation::UnguardedProfileKey {
                key: key.to_string(),
            });
        }
        if let Some(event) = self.events.iter().find(|e| !e.is_lifecycle()) {
            return Err(CommitViolation::NotLifecycleEvent {
                event_type: event.type_name(),
            });
        }
        if let Some(lease) = &self.lease {
            if lease.worker_id.chars().all(char::is_whitespace) {
                return Err(CommitViolation::BlankId {
                    field: "lease.worker_id",
                });
            }
            if lease.run_id != run.run_id {
                return Err(CommitViolation::LeaseForOtherRun {
                    run_id: run.run_id.clone(),
                    lease_run_id: lease.run_id.clone(),
                });
            }
        }
        if let Some(lease) = &self.new_lease
            && lease.worker_id.chars().all(char::is_whitespace)
        {
            return Err(CommitViolation::BlankId {
                field: "new_lease.worker_id",
            });
        }
        if let BatchWrite::Set(batch) = &self.batch {
            check_batch(batch, run.status)?;
        }
        Ok(())
    }
}

/// Checks that a `Done` run's batch holds no call that is not closed.
pub(crate) fn check_batch(batch: &ToolBatch, status: RunStatus) -> Result<(), CommitViolation> {
    if status != RunStatus::Done {
        return Ok(());
    }
    match batch.open_calls().next() {
        Some(open) => Err(CommitViolation::CallInFlight {
            call_id: open.id().clone(),
            state: open.state(),
        }),
        None => Ok(()),
    }
}
