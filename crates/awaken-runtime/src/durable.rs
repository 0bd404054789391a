//! Where a run's facts become committed: every durable step of a run is one `ThreadCommit`, and
//! the lifecycle events about it are stored with it and emitted after it.

use std::collections::BTreeMap;
use std::sync::Arc;

use awaken_event::{
    AgentEvent, EventSink, Message, TerminationReason, ThreadId, TokenUsage, ToolCallId,
    ToolCallState,
};
use awaken_state::{
    KeyScope, Snapshot, StateCommand, StateDelta, StateError, StateStore, UnknownKeyPolicy,
};
use awaken_store::{
    BatchData, BatchSource, BatchWrite, LeaseToken, RunRecord, RunStatus, StoreError, ThreadCommit,
    ThreadStore,
};
use awaken_tool::{BatchCall, ToolBatch};

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
    /// The run's next commit, kept from one commit to the next (boxed: every run's future
    /// holds this): the thread, the run's record, the messages already in the store (its
    /// guard), the run's messages and lifecycle events not yet committed (in order), and the
    /// run's lease when a recovery claimed the run. A store writing at once only reads these
    /// (see `ThreadStore::commit_now`): a failed commit leaves the messages and events to
    /// commit again, a written one its events to emit, and the record is not copied (a store
    /// that writes later gets a copy of it all, see `handed_over`).
    /// Between commits its state and batch are empty.
    pending: Box<ThreadCommit>,
    /// Which of the pending events are about facts of the next commit, emitted after it
    /// (indices).
    after_commit: Vec<usize>,
    /// The state revision the last commit exported up to.
    state_revision: u64,
    /// Whether a commit that set or cleared the run's batch failed, and no later commit has
    /// written the batch: the store still holds an older one.
    batch_unwritten: bool,
    /// What guards and redoes the run's profile writes, when the run has a profile (boxed:
    /// most runs have none, and every run's future holds this).
    pub(crate) profile: Option<Box<ProfileJournal>>,
}

/// What a run with a profile keeps about its profile's keys.
#[derive(Default)]
pub(crate) struct ProfileJournal {
    /// The version at which each key of the run's profile was read (0: absent); a written
    /// key's version moves with each commit that writes it.
    pub(crate) versions: BTreeMap<String, u64>,
    /// Profile writes of the run not yet durable (journaled updates, in order), kept across
    /// retries of one commit.
    pending: Vec<(String, serde_json::Value)>,
    /// How many times a profile conflict was retried (all commits of the run).
    retries: u32,
}

impl ProfileJournal {
    /// A journal of a profile whose keys were read at `versions`.
    pub(crate) fn new(versions: BTreeMap<String, u64>) -> Self {
        Self {
            versions,
            ..Self::default()
        }
    }
}

/// How many profile conflicts one run retries before its commit fails.
const MAX_PROFILE_RETRIES: u32 = 16;

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
            pending: Box::new(ThreadCommit::new(thread_id, record, persisted_messages)),
            after_commit: Vec::new(),
            state_revision,
            batch_unwritten: false,
            profile: None,
        }
    }

    /// The lease the run's commits carry, when a recovery claimed the run.
    pub(crate) fn lease(&self) -> Option<&LeaseToken> {
        self.pending.lease.as_ref()
    }

    /// Carries `lease` in the run's commits from now on.
    pub(crate) fn set_lease(&mut self, lease: Option<LeaseToken>) {
        self.pending.lease = lease;
    }

    /// A message of the run, written with the next commit.
    pub(crate) fn push_message(&mut self, message: Message) {
        self.pending.messages.push(message);
    }

    /// An event emitted now (stored with the next commit if it is a lifecycle event).
    pub(crate) fn note(&mut self, event: AgentEvent, sink: &dyn EventSink) {
        sink.emit(&event);
        if event.is_lifecycle() {
            self.pending.events.push(event);
        }
    }

    /// An event about a fact of the next commit: stored with it and emitted after it.
    pub(crate) fn fact(&mut self, event: AgentEvent) {
        self.after_commit.push(self.pending.events.len());
        self.pending.events.push(event);
    }

    /// Emits the held-back events without a commit (when the run can no longer commit).
    pub(crate) fn flush_uncommitted(&mut self, sink: &dyn EventSink) {
        for i in self.after_commit.drain(..) {
            sink.emit(&self.pending.events[i]);
        }
        self.pending.events.clear();
    }

    /// Puts into the next commit what it writes of the run's state: the keys `snapshot` (the
    /// state now) changed since the last commit, in the commit's kept lists (a store writing
    /// at once leaves them their room; the profile's list, and the others after a store that
    /// writes later, are made again). Returns the revision exported. Taken by the caller in
    /// the same look at the state as the record's counts (no snapshot is kept while the
    /// commit is written). A state still at the last commit's revision changed no key (every
    /// change advances it): nothing is looked up, and the lists stay empty, as every commit
    /// leaves them.
    pub(crate) fn export(&mut self, snapshot: &Snapshot) -> u64 {
        if snapshot.revision() == self.state_revision {
            return self.state_revision;
        }
        let pending = &mut *self.pending;
        snapshot.export_changed_in_each_into(
            [KeyScope::Run, KeyScope::Thread, KeyScope::Profile],
            self.state_revision,
            [
                &mut pending.run_state,
                &mut pending.thread_state,
                &mut pending.profile_state,
            ],
        );
        snapshot.revision()
    }

    /// The state revision the last commit exported up to.
    pub(crate) fn committed_revision(&self) -> u64 {
        self.state_revision
    }

    /// Whether the store holds an older batch than the run's (a commit that changed it failed):
    /// the caller's next commit must then write the run's batch (or clear it), even one that
    /// changes nothing else of it.
    pub(crate) fn batch_unwritten(&self) -> bool {
        self.batch_unwritten
    }

    /// Commits what the run did since the last commit — messages, changed run and thread
    /// state (put into the commit by [`export`](Self::export) from `state`'s snapshot at
    /// `exported_revision`), the batch, lifecycle events — then emits those events to `sink`.
    pub(crate) async fn commit(
        &mut self,
        state: &StateStore,
        exported_revision: u64,
        batch: BatchWrite,
        steps: u32,
        usage: TokenUsage,
        sink: &dyn EventSink,
    ) -> Result<(), CheckpointError> {
        // Crash tests: this commit carries a compaction's summary (or its failure).
        let compaction = self
            .pending
            .thread_state
            .values
            .contains_key(<awaken_context::CompactionKey as awaken_state::StateKey>::KEY);
        let record = &mut self.pending.run;
        record.steps = steps;
        record.usage = usage;
        record.updated_at = self.ids.timestamp();
        // Profile keys written since the last commit, each guarded by the version it was
        // read at: a concurrent writer's change is a `ProfileConflict`, never a lost update;
        // the run's writes are then redone on the fresh values and the commit retried.
        // (A run without a profile commits none of its profile keys.)
        let profile_delta = std::mem::take(&mut self.pending.profile_state);
        let mut profile = match self.profile.as_deref().map(|p| &p.versions) {
            Some(versions) => {
                let guards: BTreeMap<String, u64> = profile_delta
                    .values
                    .keys()
                    .map(|k| {
                        (
                            k.to_string(),
                            versions.get(k.as_ref()).copied().unwrap_or(0),
                        )
                    })
                    .collect();
                (!profile_delta.values.is_empty()).then_some((profile_delta, guards))
            }
            None => None,
        };
        let mut retried = false;
        let writes_batch = !matches!(batch, BatchWrite::Keep);
        let pending = &mut *self.pending;
        pending.batch = batch;
        // `(*self.store)`: the store's own method, not the `Arc` forwarding impl (which would box
        // a second future around it on every commit).
        let receipt = match &mut profile {
            // A store that writes at once (the memory store) needs no future.
            None => match (*self.store).commit_now(pending) {
                Some(written) => written.map_err(CheckpointError::from),
                // A store's future takes a commit of its own (in the store's boxed future: the
                // run's future need not hold room for it).
                None => (*self.store)
                    .commit(handed_over(pending))
                    .await
                    .map_err(CheckpointError::from),
            },
            // Only a run writing profile keys keeps its commit across awaits for a retry.
            Some(written) => {
                let commit = handed_over(pending);
                Box::pin(self.commit_guarded(commit, written, state))
                    .await
                    .map(|(receipt, redone)| {
                        retried = redone;
                        receipt
                    })
            }
        };
        // What a store only read of the state and the batch is let go (each commit brings its
        // own); the lists keep their room for the next export.
        let pending = &mut *self.pending;
        pending.run_state.values.clear();
        pending.thread_state.values.clear();
        pending.batch = BatchWrite::Keep;
        if writes_batch {
            self.batch_unwritten = receipt.is_err();
        }
        // Not written: the messages and events wait for the next commit (or, for the events,
        // are flushed unstored).
        let receipt = receipt?;
        if compaction {
            crate::failpoint::hit("after_compaction_commit", None);
        }
        self.pending.expected_message_count = receipt.message_count;
        if let (Some(journal), Some((_, guards))) = (self.profile.as_deref_mut(), &profile) {
            for (key, read) in guards {
                journal.versions.insert(key.clone(), read + 1);
            }
        }
        // The journaled profile writes are durable now.
        if let Some(journal) = &mut self.profile {
            journal.pending.clear();
            state.take_journal();
        }
        // After a retry the redone values were restored into the run's state after the
        // export: they are committed too.
        self.state_revision = if retried {
            state.revision()
        } else {
            exported_revision
        };
        for i in self.after_commit.drain(..) {
            sink.emit(&self.pending.events[i]);
        }
        // Their room is kept for the next commit.
        self.pending.messages.clear();
        self.pending.events.clear();
        Ok(())
    }

    /// Commits `commit` with the profile keys `written` (and their guards), retried after a
    /// profile conflict with the run's writes redone on the fresh values (up to
    /// `MAX_PROFILE_RETRIES` times). Returns the receipt and whether the writes were redone.
    async fn commit_guarded(
        &mut self,
        commit: ThreadCommit,
        written: &mut (StateDelta, BTreeMap<String, u64>),
        state: &StateStore,
    ) -> Result<(awaken_store::CommitReceipt, bool), CheckpointError> {
        let mut retried = false;
        loop {
            let attempt = commit
                .clone()
                .with_profile_state(written.0.clone(), written.1.clone());
            match (*self.store).commit(attempt).await {
                Ok(receipt) => return Ok((receipt, retried)),
                Err(StoreError::ProfileConflict { key })
                    if self
                        .profile
                        .as_ref()
                        .is_some_and(|p| p.retries < MAX_PROFILE_RETRIES) =>
                {
                    if let Some(journal) = &mut self.profile {
                        journal.retries += 1;
                    }
                    tracing::info!(key = %key, "profile key changed under the run: redoing its writes on the fresh value");
                    *written = self.redo_profile_writes(state).await?;
                    retried = true;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// After a profile conflict: reloads the profile, redoes the run's journaled profile writes
    /// on the fresh values (in a scratch store over the run's keys), puts the results into the
    /// run's state, and returns them with the fresh versions as the commit's profile delta.
    async fn redo_profile_writes(
        &mut self,
        state: &StateStore,
    ) -> Result<(StateDelta, BTreeMap<String, u64>), CheckpointError> {
        let Some(profile_id) = self.pending.run.profile_id.clone() else {
            return Ok((StateDelta::default(), BTreeMap::new()));
        };
        let journal = self.profile.get_or_insert_default();
        journal.pending.extend(state.take_journal());
        let fresh = self.store.load_profile(&profile_id).await?;
        let scratch = StateStore::new(state.registry().clone());
        scratch.restore(&fresh.to_persisted(), UnknownKeyPolicy::Skip)?;
        let base = scratch.revision();
        let mut redo = StateCommand::new();
        for (key, update) in &journal.pending {
            redo.update_json(key.clone(), update.clone());
        }
        scratch.commit(redo)?;
        let delta = scratch
            .snapshot()
            .export_changed_in(KeyScope::Profile, base)?;
        let versions: BTreeMap<String, u64> = fresh
            .keys
            .iter()
            .map(|(k, e)| (k.clone(), e.version))
            .collect();
        let guards = delta
            .values
            .keys()
            .map(|k| (k.clone(), versions.get(k).copied().unwrap_or(0)))
            .collect();
        journal.versions = versions;
        // The run goes on from the redone values.
        state.restore(&delta, UnknownKeyPolicy::Skip)?;
        // (A restore is not journaled: the pending writes stay the record until durable.)
        Ok((delta.into(), guards))
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

/// A commit of its own for a store's future, which takes it: `commit`'s state deltas, profile
/// versions and batch moved into it, the rest copied (the messages and events stay in
/// `commit`, to commit again after a failure, or to emit).
fn handed_over(commit: &mut ThreadCommit) -> ThreadCommit {
    ThreadCommit {
        thread_id: commit.thread_id.clone(),
        run: commit.run.clone(),
        expected_message_count: commit.expected_message_count,
        messages: commit.messages.clone(),
        run_state: std::mem::take(&mut commit.run_state),
        thread_state: std::mem::take(&mut commit.thread_state),
        profile_state: std::mem::take(&mut commit.profile_state),
        profile_versions: std::mem::take(&mut commit.profile_versions),
        batch: std::mem::replace(&mut commit.batch, BatchWrite::Keep),
        events: commit.events.clone(),
        lease: commit.lease.clone(),
    }
}

/// The batch as a commit carries it: a copy kept typed, serialized only by a store that writes
/// it out (the in-memory store keeps it as it is). A batch of one call (most steps) is copied
/// into the shared value itself: one allocation per commit, not two.
pub(crate) fn batch_set(batch: &ToolBatch) -> BatchWrite {
    let typed = match batch.calls() {
        [call] => TypedBatch::One(call.clone()),
        _ => TypedBatch::Many(batch.clone()),
    };
    BatchWrite::Set(BatchData::typed(Arc::new(typed)))
}

/// A [`ToolBatch`] as a [`BatchSource`]: its one call inline, or the batch.
#[derive(Debug)]
enum TypedBatch {
    One(BatchCall),
    Many(ToolBatch),
}

impl TypedBatch {
    fn calls(&self) -> &[BatchCall] {
        match self {
            Self::One(call) => std::slice::from_ref(call),
            Self::Many(batch) => batch.calls(),
        }
    }
}

/// The serde form of a `ToolBatch` (`{"calls": [...]}`), which a one-call batch writes the
/// same way.
impl serde::Serialize for TypedBatch {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Many(batch) => batch.serialize(serializer),
            Self::One(call) => {
                use serde::ser::SerializeStruct;
                let mut batch = serializer.serialize_struct("ToolBatch", 1)?;
                batch.serialize_field("calls", std::slice::from_ref(call))?;
                batch.end()
            }
        }
    }
}

impl BatchSource for TypedBatch {
    fn to_json(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::to_value(self)
    }

    fn to_text(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    fn open_call(
        &self,
    ) -> Result<Option<(ToolCallId, ToolCallState)>, awaken_store::CommitViolation> {
        Ok(self
            .calls()
            .iter()
            .find(|c| !c.state().is_terminal())
            .map(|c| (c.id().clone(), c.state())))
    }

    /// A `ToolBatch` is a batch by construction (its every change checked).
    fn check(&self) -> Result<(), awaken_store::CommitViolation> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use awaken_event::{SuspendTicket, ToolCall, ToolCallId, ToolResult};
    use awaken_store::BatchWrite;
    use awaken_tool::ToolBatch;
    use serde_json::json;

    use super::batch_set;

    fn call(id: &str) -> ToolCall {
        ToolCall::new(
            ToolCallId::new(id).expect("id"),
            "echo",
            json!({"text": id}),
        )
    }

    fn id(s: &str) -> ToolCallId {
        ToolCallId::new(s).expect("id")
    }

    /// What a commit carries of `batch`: as JSON, as text, and its open call.
    fn carried(batch: &ToolBatch) -> (serde_json::Value, String, Option<String>) {
        let BatchWrite::Set(data) = batch_set(batch) else {
            panic!("a set batch")
        };
        let open = data
            .open_call()
            .expect("a batch")
            .map(|(id, state)| format!("{id}:{state:?}"));
        (
            data.to_json().expect("json"),
            data.to_text().expect("text"),
            open,
        )
    }

    /// A commit's copy of a batch reads and writes as the batch itself, whatever its calls and
    /// their states (a one-call batch is copied differently from a longer one).
    #[test]
    fn a_commits_batch_is_written_as_the_tool_batch() {
        let mut batches = vec![
            ToolBatch::default(),
            ToolBatch::new([call("a")]).expect("one"),
        ];
        let mut one = ToolBatch::new([call("a")]).expect("one");
        one.start(&id("a")).expect("start");
        batches.push(one.clone());
        one.succeed(&id("a"), ToolResult::success(json!({"echoed": "a"})))
            .expect("succeed");
        batches.push(one);
        let mut two = ToolBatch::new([call("a"), call("b")]).expect("two");
        two.start(&id("a")).expect("start");
        two.fail(&id("a"), ToolResult::error("no")).expect("fail");
        let ticket = SuspendTicket {
            suspension_id: "s1".into(),
            call: awaken_tool::pending_call(&call("b")),
            message: "approve?".into(),
            response_schema: None,
            resume_mode: Default::default(),
        };
        two.suspend(&id("b"), ticket).expect("suspend");
        batches.push(two);
        for batch in &batches {
            let (value, text, open) = carried(batch);
            assert_eq!(
                value,
                serde_json::to_value(batch).expect("json"),
                "{batch:?}"
            );
            assert_eq!(text, serde_json::to_string(batch).expect("text"));
            assert_eq!(
                open,
                batch
                    .open_calls()
                    .next()
                    .map(|c| format!("{}:{:?}", c.id(), c.state()))
            );
            // And it reads back as the same batch.
            let back: ToolBatch = serde_json::from_value(value).expect("a tool batch");
            assert_eq!(&back, batch);
        }
    }
}
