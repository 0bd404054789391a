//! The commit path: a run's next commit built from what the run did since the last one, written
//! by the store, retried after a profile conflict, and the events about it emitted after it.

use std::collections::BTreeMap;

use awaken_context::CompactionKey;
use awaken_event::EventSink;
use awaken_state::{KeyHandle, KeyScope, Snapshot, StateDelta, StateKey, StateStore};
use awaken_store::{BatchWrite, CommitReceipt, StoreError, ThreadCommit};
use awaken_tool::ToolBatch;

use crate::builtins::{RunStatsKey, stats_at_in};
use crate::durable::{CheckpointError, Durable};
use crate::failpoint;

impl Durable {
    /// Commits what the run did since the last commit, then emits the events about it to
    /// `sink`.
    ///
    /// The commit carries the run's record with its step count and usage (the statistics at
    /// registry position `stats_at` of `state`), the run's new messages and lifecycle events,
    /// the keys of `state` changed since the last commit, and `batch`; when an earlier commit
    /// that changed the batch failed, it writes `run_batch` (the run's batch now, or none)
    /// instead of keeping the store's older one. Profile keys are guarded by the versions
    /// they were read at: a conflict redoes the run's profile writes on the fresh values and
    /// commits again. Nothing of a failed commit is written; its messages and events wait for
    /// the next one.
    pub(crate) async fn commit(
        &mut self,
        state: &StateStore,
        stats_at: Option<KeyHandle<RunStatsKey>>,
        batch: BatchWrite,
        run_batch: Option<&ToolBatch>,
        sink: &dyn EventSink,
    ) -> Result<(), CheckpointError> {
        let batch = match batch {
            BatchWrite::Keep if self.batch_unwritten => {
                run_batch.map_or(BatchWrite::Clear, |b| BatchWrite::Set(b.clone()))
            }
            batch => batch,
        };
        // One look at the state for the record's counts and the commit's changed keys (no
        // snapshot is kept while the commit is written); none when the state has not moved
        // since the last commit's look (every change advances its revision).
        let revision = state.revision();
        let (steps, usage, exported) = match self.last_look {
            Some((at, steps, usage)) if at == revision && self.state_revision == revision => {
                (steps, usage, revision)
            }
            _ => state.read(|s| {
                let (steps, usage) = stats_at_in(s, stats_at, |s| (s.steps, s.usage));
                (steps, usage, self.export(s))
            }),
        };
        self.last_look = Some((exported, steps, usage));
        // Crash tests: this commit carries a compaction's summary (or its failure).
        let compaction = self
            .pending
            .thread_state
            .values
            .contains_key(<CompactionKey as StateKey>::KEY);
        let record = &mut self.pending.run;
        record.steps = steps;
        record.usage = usage;
        record.updated_at = self.ids.timestamp();
        // Profile keys written since the last commit, each guarded by the version it was
        // read at: a concurrent writer's change is a `ProfileConflict`, never a lost update.
        // (A run without a profile commits none of its profile keys.)
        let profile_delta = std::mem::take(&mut self.pending.profile_state);
        let mut profile = match self.profile.as_deref() {
            Some(journal) if !profile_delta.values.is_empty() => {
                let guards = journal.guards(&profile_delta);
                Some((profile_delta, guards))
            }
            _ => None,
        };
        let mut retried = false;
        let writes_batch = !matches!(batch, BatchWrite::Keep);
        let pending = &mut *self.pending;
        pending.batch = batch;
        // `(*self.store)`: the store's own method, not the `Arc` forwarding impl (which would
        // box a second future around it on every commit).
        let receipt = match &mut profile {
            // A store that writes at once (the memory store) needs no future.
            None => match (*self.store).commit_now(pending) {
                Some(written) => written.map_err(CheckpointError::from),
                // A store's future takes a commit of its own (in the store's boxed future).
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
            failpoint::hit("after_compaction_commit", None);
        }
        self.pending.expected_message_count = receipt.message_count;
        if let Some(journal) = self.profile.as_deref_mut() {
            journal.committed(profile.as_ref().map(|(_, guards)| guards), state);
        }
        // After a retry the redone values were restored into the run's state after the
        // export: they are committed too.
        self.state_revision = if retried { state.revision() } else { exported };
        for i in self.after_commit.drain(..) {
            sink.emit(&self.pending.events[i]);
        }
        // Their room is kept for the next commit.
        self.pending.messages.clear();
        self.pending.events.clear();
        Ok(())
    }

    /// Puts into the next commit the keys `snapshot` (the state now) changed since the last
    /// commit, in the commit's kept lists (a store writing at once leaves them their room).
    /// Returns the revision exported. A state still at the last commit's revision changed no
    /// key: nothing is looked up, and the lists stay empty, as every commit leaves them.
    fn export(&mut self, snapshot: &Snapshot) -> u64 {
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

    /// Writes `commit` with the profile keys `written` (and their guards); after a profile
    /// conflict the run's writes are redone on the fresh values and the commit is written
    /// again, as long as the journal allows another retry. Returns the receipt and whether the
    /// writes were redone.
    async fn commit_guarded(
        &mut self,
        commit: ThreadCommit,
        written: &mut (StateDelta, BTreeMap<String, u64>),
        state: &StateStore,
    ) -> Result<(CommitReceipt, bool), CheckpointError> {
        let mut retried = false;
        loop {
            let attempt = commit
                .clone()
                .with_profile_state(written.0.clone(), written.1.clone());
            match (*self.store).commit(attempt).await {
                Ok(receipt) => return Ok((receipt, retried)),
                Err(StoreError::ProfileConflict { key })
                    if self.profile.as_ref().is_some_and(|p| p.may_retry()) =>
                {
                    if let Some(journal) = &mut self.profile {
                        journal.count_retry();
                    }
                    tracing::info!(key = %key, "profile key changed under the run: redoing its writes on the fresh value");
                    *written = self.redo_profile_writes(state).await?;
                    retried = true;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// After a profile conflict: reloads the profile and redoes the run's journaled profile
    /// writes on it. Returns the commit's new profile delta with its guards.
    async fn redo_profile_writes(
        &mut self,
        state: &StateStore,
    ) -> Result<(StateDelta, BTreeMap<String, u64>), CheckpointError> {
        let Some(profile_id) = self.pending.run.profile_id.clone() else {
            return Ok((StateDelta::default(), BTreeMap::new()));
        };
        let journal = self.profile.get_or_insert_default();
        journal.take_writes(state);
        let fresh = self.store.load_profile(&profile_id).await?;
        Ok(journal.redo(&fresh, state)?)
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
