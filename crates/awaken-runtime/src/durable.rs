//! The run's committed-fact boundary (seed 003): every durable step of a run is one
//! `ThreadCommit`, and the lifecycle events about it are stored with it and emitted after it.

use std::collections::BTreeMap;
use std::sync::Arc;

use awaken_event::{AgentEvent, EventSink, Message, TerminationReason, ThreadId, TokenUsage};
use awaken_state::{KeyScope, StateError, StateStore};
use awaken_store::{
    BatchWrite, LeaseToken, RunRecord, RunStatus, StoreError, ThreadCommit, ThreadStore, Timestamp,
};
use awaken_tool::ToolBatch;

use crate::runtime::IdSource;

/// Why a commit of the run failed (nothing of it was written).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckpointError {
    #[error("state export failed: {0}")]
    State(#[from] StateError),
    #[error("the store refused the commit: {0}")]
    Store(#[from] StoreError),
}

/// Writes a run's commits and holds back lifecycle events until their commit.
pub(crate) struct Durable {
    store: Arc<dyn ThreadStore>,
    ids: Arc<dyn IdSource>,
    thread_id: ThreadId,
    pub(crate) record: RunRecord,
    /// Messages already in the store.
    persisted_messages: u64,
    /// Messages of the run not yet committed.
    new_messages: Vec<Message>,
    /// Lifecycle events not yet committed, in order.
    events: Vec<AgentEvent>,
    /// Events about facts of the next commit, emitted after it.
    after_commit: Vec<AgentEvent>,
    /// The state revision the last commit exported up to.
    state_revision: u64,
    /// The run's lease, carried by every commit, when a recovery claimed the run.
    pub(crate) lease: Option<LeaseToken>,
    /// The version at which each key of the run's profile was read (0: absent), when the run
    /// has a profile; a written key's version moves with each commit that writes it.
    pub(crate) profile_versions: Option<BTreeMap<String, u64>>,
}

impl Durable {
    pub(crate) fn new(
        store: Arc<dyn ThreadStore>,
        ids: Arc<dyn IdSource>,
        thread_id: ThreadId,
        record: RunRecord,
        persisted_messages: u64,
        state_revision: u64,
    ) -> Self {
        Self {
            store,
            ids,
            thread_id,
            record,
            persisted_messages,
            new_messages: Vec::new(),
            events: Vec::new(),
            after_commit: Vec::new(),
            state_revision,
            lease: None,
            profile_versions: None,
        }
    }

    /// A message of the run, written with the next commit.
    pub(crate) fn push_message(&mut self, message: Message) {
        self.new_messages.push(message);
    }

    /// An event emitted now (stored with the next commit if it is a lifecycle event).
    pub(crate) fn note(&mut self, event: AgentEvent, sink: &dyn EventSink) {
        if event.is_lifecycle() {
            self.events.push(event.clone());
        }
        sink.emit(&event);
    }

    /// An event about a fact of the next commit: stored with it and emitted after it.
    pub(crate) fn fact(&mut self, event: AgentEvent) {
        self.events.push(event.clone());
        self.after_commit.push(event);
    }

    /// Emits the held-back events without a commit (when the run can no longer commit).
    pub(crate) fn flush_uncommitted(&mut self, sink: &dyn EventSink) {
        for event in self.after_commit.drain(..) {
            sink.emit(&event);
        }
        self.events.clear();
    }

    /// Commits what the run did since the last commit — messages, changed run and thread
    /// state, the batch, lifecycle events — then emits those events to `sink`.
    pub(crate) async fn commit(
        &mut self,
        state: &StateStore,
        batch: BatchWrite,
        steps: u32,
        usage: TokenUsage,
        sink: &dyn EventSink,
    ) -> Result<(), CheckpointError> {
        let snapshot = state.snapshot();
        let run_state = snapshot.export_changed_in(KeyScope::Run, self.state_revision)?;
        let thread_state = snapshot.export_changed_in(KeyScope::Thread, self.state_revision)?;
        // Crash tests: this commit carries a compaction's summary (or its failure).
        let compaction = thread_state
            .values
            .contains_key(<awaken_context::CompactionKey as awaken_state::StateKey>::KEY);
        self.record.steps = steps;
        self.record.usage = usage;
        self.record.updated_at =
            Timestamp::from_unix_millis(i64::try_from(self.ids.now_ms()).unwrap_or(i64::MAX));
        let mut commit = ThreadCommit::new(
            self.thread_id.clone(),
            self.record.clone(),
            self.persisted_messages,
        )
        .with_messages(self.new_messages.iter().cloned())
        .with_run_state(run_state)
        .with_thread_state(thread_state)
        .with_events(self.events.iter().cloned());
        commit.batch = batch;
        commit.lease = self.lease.clone();
        // Profile keys written since the last commit, each guarded by the version it was
        // read at: a concurrent writer's change is a `ProfileConflict`, never a lost update.
        let mut profile_written = Vec::new();
        if let Some(versions) = &self.profile_versions {
            let delta = snapshot.export_changed_in(KeyScope::Profile, self.state_revision)?;
            if !delta.values.is_empty() {
                let guards: BTreeMap<String, u64> = delta
                    .values
                    .keys()
                    .map(|k| (k.clone(), versions.get(k).copied().unwrap_or(0)))
                    .collect();
                profile_written = delta.values.keys().cloned().collect();
                commit = commit.with_profile_state(delta, guards);
            }
        }
        let receipt = self.store.commit(commit).await?;
        if compaction {
            crate::failpoint::hit("after_compaction_commit", None);
        }
        self.persisted_messages = receipt.message_count;
        if let Some(versions) = &mut self.profile_versions {
            for key in profile_written {
                *versions.entry(key).or_insert(0) += 1;
            }
        }
        self.new_messages.clear();
        self.state_revision = snapshot.revision();
        self.events.clear();
        for event in self.after_commit.drain(..) {
            sink.emit(&event);
        }
        Ok(())
    }

    /// Marks the run finished (or waiting) for the final commit.
    pub(crate) fn finish(&mut self, termination: &TerminationReason) {
        self.record.status = if *termination == TerminationReason::Suspended {
            RunStatus::Waiting
        } else {
            RunStatus::Done
        };
        self.record.termination = Some(termination.clone());
    }
}

/// The batch as the store keeps it.
pub(crate) fn batch_json(batch: &ToolBatch) -> BatchWrite {
    match serde_json::to_value(batch) {
        Ok(v) => BatchWrite::Set(v),
        Err(e) => {
            tracing::error!(error = %e, "tool batch does not serialize; kept as it was");
            BatchWrite::Keep
        }
    }
}
