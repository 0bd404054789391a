//! Where a run's facts become committed: every durable step of a run is one `ThreadCommit`, and
//! the lifecycle events about it are stored with it and emitted after it. The commit itself
//! (built, written, retried) is in `commit`; the profile journal in `profile`.

use std::sync::Arc;

use awaken_event::{AgentEvent, EventSink, Message, TerminationReason, ThreadId, TokenUsage};
use awaken_store::{LeaseToken, NewLease, RunRecord, RunStatus, ThreadCommit, ThreadStore};

pub(crate) use crate::error::CheckpointError;
use crate::error::RunError;
use crate::ids::IdSource;

mod commit;
pub(crate) mod profile;

use profile::ProfileJournal;

impl CheckpointError {
    /// The run's error for a failed first commit of an activation on `thread_id`.
    pub(crate) fn into_run_error(self, thread_id: &ThreadId) -> RunError {
        match self {
            CheckpointError::Commit(source) => RunError::Commit {
                thread_id: thread_id.clone(),
                source,
            },
            CheckpointError::Store(e) => RunError::Store(e),
            CheckpointError::State(source) => RunError::State {
                thread_id: thread_id.clone(),
                source,
            },
        }
    }
}

/// What a commit does to the run's tool batch. While an earlier commit's change of the batch is
/// unwritten, a commit that would keep the store's batch writes the run's (or clears it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchChange {
    /// The stored batch stays.
    Keep,
    /// The run's batch as it is now is written (lent to the commit, not copied); as `Keep`
    /// when the run has none.
    Write,
    /// The run has no batch any more.
    Clear,
}

/// Writes a run's commits and holds back lifecycle events until their commit.
pub(crate) struct Durable {
    store: Arc<dyn ThreadStore>,
    ids: Arc<dyn IdSource>,
    /// The run's next commit, kept from one commit to the next (boxed: it is large, and the
    /// run holds it for its whole life): the thread, the run's record, the messages already in
    /// the store (its guard), the run's messages and lifecycle events not yet committed (in
    /// order), and the run's lease when a recovery claimed the run. Stores only read it: a
    /// failed commit leaves the messages and events to commit again, a written one its events
    /// to emit, and the record is never copied for a commit. Between commits its state, profile
    /// guards and batch are empty.
    pending: Box<ThreadCommit>,
    /// Events about facts of the next commit, emitted after it. The commit stores them after
    /// the pending (already emitted) events, so the stored order is the order of emission.
    facts: Vec<AgentEvent>,
    /// The sequence number the thread's next stored event gets.
    next_seq: u64,
    /// The state revision the last commit exported up to.
    state_revision: u64,
    /// The state revision of the last commit's look at the state, with the step count and
    /// usage it read then.
    last_look: Option<(u64, u32, TokenUsage)>,
    /// Whether a commit that set or cleared the run's batch failed, and no later commit has
    /// written the batch: the store still holds an older one.
    batch_unwritten: bool,
    /// What guards and redoes the run's profile writes, when the run has a profile (boxed:
    /// most runs have none).
    profile: Option<Box<ProfileJournal>>,
}

impl Durable {
    /// The commit writer of a run whose next commit carries `record`, on a thread whose store
    /// holds `persisted_messages` and events up to `last_event_seq`, its state exported up to
    /// `state_revision`.
    pub(crate) fn new(
        store: Arc<dyn ThreadStore>,
        ids: Arc<dyn IdSource>,
        thread_id: ThreadId,
        record: RunRecord,
        persisted_messages: u64,
        last_event_seq: u64,
        state_revision: u64,
    ) -> Self {
        Self {
            store,
            ids,
            pending: Box::new(ThreadCommit::new(thread_id, record, persisted_messages)),
            facts: Vec::new(),
            next_seq: last_event_seq + 1,
            state_revision,
            last_look: None,
            batch_unwritten: false,
            profile: None,
        }
    }

    /// Guards the run's profile writes with `journal` (a run with a profile).
    pub(crate) fn with_profile(mut self, journal: Option<ProfileJournal>) -> Self {
        self.profile = journal.map(Box::new);
        self
    }

    /// The lease the run's commits carry, when a recovery claimed the run.
    pub(crate) fn lease(&self) -> Option<&LeaseToken> {
        self.pending.lease.as_ref()
    }

    /// Carries `lease` in the run's commits from now on.
    pub(crate) fn set_lease(&mut self, lease: Option<LeaseToken>) {
        self.pending.lease = lease;
    }

    /// Creates the run leased to `lease`'s worker, when the next commit is its first.
    pub(crate) fn set_new_lease(&mut self, lease: Option<NewLease>) {
        self.pending.new_lease = lease;
    }

    /// A message of the run, written with the next commit.
    pub(crate) fn push_message(&mut self, message: Message) {
        self.pending.messages.push(message);
    }

    /// An event emitted now (stored with the next commit if it is a lifecycle event, under the
    /// sequence number the sink is told).
    pub(crate) fn note(&mut self, event: AgentEvent, sink: &dyn EventSink) {
        if event.is_lifecycle() {
            sink.emit_stored(&event, self.next_seq + self.pending.events.len() as u64);
            self.pending.events.push(event);
        } else {
            sink.emit(&event);
        }
    }

    /// An event about a fact of the next commit: stored with it and emitted after it.
    pub(crate) fn fact(&mut self, event: AgentEvent) {
        self.facts.push(event);
    }

    /// Emits the held-back events without a commit (when the run can no longer commit): they
    /// are not stored, so the sink gets no sequence numbers. A steered message never stored
    /// was not taken (its sender is told so): no event says it was added.
    pub(crate) fn flush_uncommitted(&mut self, sink: &dyn EventSink) {
        for event in self.facts.drain(..) {
            if !matches!(event, AgentEvent::MessageAdded { .. }) {
                sink.emit(&event);
            }
        }
        self.pending.events.clear();
    }

    /// Marks the run finished (or waiting) for the final commit.
    pub(crate) fn finish(&mut self, termination: &TerminationReason) {
        let record = &mut self.pending.run;
        record.status = if *termination == TerminationReason::Suspended {
            RunStatus::Waiting
        } else {
            RunStatus::Done
        };
        record.termination = Some(termination.clone());
    }
}
