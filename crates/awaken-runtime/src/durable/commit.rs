//! The commit path: a run's next commit built from what the run did since the last one, written
//! by the store, written again on fresh profile values after a profile conflict, and the events
//! about it emitted after it.

use std::collections::BTreeMap;

use awaken_context::CompactionKey;
use awaken_event::EventSink;
use awaken_state::{KeyHandle, KeyScope, Snapshot, StateDelta, StateKey, StateStore};
use awaken_store::{BatchWrite, CommitError};
use awaken_tool::ToolBatch;

use crate::builtins::{RunStatsKey, stats_at_in};
use crate::durable::{BatchChange, CheckpointError, Durable};
use crate::failpoint;

impl Durable {
    /// Commits what the run did since the last commit, then emits the events about it to
    /// `sink`.
    ///
    /// The commit carries the run's record with its step count and usage (the statistics at
    /// registry position `stats_at` of `state`), the run's new messages and lifecycle events,
    /// the keys of `state` changed since the last commit, and what `batch` says of the run's
    /// batch (`run_batch`, lent to the commit and back in place after it, also when the commit
    /// fails); when an earlier commit that changed the batch failed, a commit that would keep
    /// the store's older batch writes the run's (or clears it). Profile keys are guarded by the
    /// versions they were read at: a conflict redoes the run's profile writes on the fresh
    /// values and commits again. Nothing of a failed commit is written; its messages and events
    /// wait for the next one.
    pub(crate) async fn commit(
        &mut self,
        state: &StateStore,
        stats_at: Option<KeyHandle<RunStatsKey>>,
        batch: BatchChange,
        run_batch: &mut Option<ToolBatch>,
        sink: &dyn EventSink,
    ) -> Result<(), CheckpointError> {
        // Keeping the store's batch (a run without one keeps it too) writes the run's instead
        // while an earlier change of it is unwritten.
        let write_run_batch = matches!(batch, BatchChange::Write) && run_batch.is_some();
        let batch = match batch {
            BatchChange::Clear => BatchWrite::Clear,
            _ if write_run_batch || self.batch_unwritten => {
                run_batch.take().map_or(BatchWrite::Clear, BatchWrite::Set)
            }
            _ => BatchWrite::Keep,
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
        let pending = &mut *self.pending;
        let record = &mut pending.run;
        record.steps = steps;
        record.usage = usage;
        record.updated_at = self.ids.timestamp();
        // Profile keys written since the last commit, each guarded by the version it was
        // read at: a concurrent writer's change is a `ProfileConflict`, never a lost update.
        // (A run without a profile commits none of its profile keys.)
        let writes_profile = match self.profile.as_deref() {
            Some(journal) if !pending.profile_state.values.is_empty() => {
                pending.profile_versions = journal.guards(&pending.profile_state);
                true
            }
            _ => {
                pending.profile_state.values.clear();
                false
            }
        };
        let writes_batch = !matches!(batch, BatchWrite::Keep);
        pending.batch = batch;
        // The facts follow the events already emitted.
        let emitted = pending.events.len();
        pending.events.append(&mut self.facts);
        let mut retried = false;
        let receipt = loop {
            // `(*self.store)`: the store's own method, not the `Arc` forwarding impl (which
            // would box a second future around it). A store that writes at once (the memory
            // store) needs no future at all.
            let written = match (*self.store).commit_now(&self.pending) {
                Some(written) => written,
                None => (*self.store).commit(&self.pending).await,
            };
            match written {
                Err(CommitError::ProfileConflict { key })
                    if writes_profile && self.profile.as_ref().is_some_and(|p| p.may_retry()) =>
                {
                    tracing::info!(key = %key, "profile key changed under the run: redoing its writes on the fresh value");
                    // (Boxed: a conflict is rare, and every commit's future would hold room
                    // for the reload.)
                    let redone = Box::pin(self.redo_profile_writes(state)).await;
                    match redone {
                        Ok((delta, guards)) => {
                            self.pending.profile_state = delta;
                            self.pending.profile_versions = guards;
                            retried = true;
                        }
                        Err(e) => break Err(e),
                    }
                }
                written => break written.map_err(CheckpointError::from),
            }
        };
        let pending = &mut *self.pending;
        // The run's batch goes back to the run; the state's values (shared with the state) are
        // let go, their lists keeping their room for the next export.
        if let BatchWrite::Set(lent) = std::mem::take(&mut pending.batch) {
            *run_batch = Some(lent);
        }
        if writes_batch {
            self.batch_unwritten = receipt.is_err();
        }
        pending.run_state.values.clear();
        pending.thread_state.values.clear();
        pending.profile_state.values.clear();
        let guards = std::mem::take(&mut pending.profile_versions);
        // Not written: the messages and events wait for the next commit (or, for the events,
        // are flushed unstored).
        let receipt = match receipt {
            Ok(receipt) => receipt,
            Err(e) => {
                self.facts.extend(self.pending.events.drain(emitted..));
                return Err(e);
            }
        };
        if compaction {
            failpoint::hit("after_compaction_commit", None);
        }
        self.pending.expected_message_count = receipt.message_count;
        if let Some(journal) = self.profile.as_deref_mut() {
            journal.committed(writes_profile.then_some(&guards), state);
        }
        // After a retry the redone values were restored into the run's state after the
        // export: they are committed too.
        self.state_revision = if retried { state.revision() } else { exported };
        // The store numbered the commit's events up to its last one.
        let first = receipt.last_event_seq + 1 - self.pending.events.len() as u64;
        self.next_seq = receipt.last_event_seq + 1;
        if !self.pending.events.is_empty() {
            sink.committed(receipt.last_event_seq);
        }
        for (seq, event) in (first..).zip(&self.pending.events).skip(emitted) {
            sink.emit_stored(event, seq);
        }
        // Their room is kept for the next commit.
        self.pending.messages.clear();
        self.pending.events.clear();
        Ok(())
    }

    /// Puts into the next commit the keys `snapshot` (the state now) changed since the last
    /// commit, in the commit's kept lists (emptied after every commit, their room kept).
    /// Returns the revision exported. A state still at the last commit's revision changed no
    /// key: nothing is looked up, and the lists stay empty.
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

    /// After a profile conflict: waits a jittered pause, reloads the profile and redoes the
    /// run's journaled profile writes on it. Returns the commit's new profile delta with its
    /// guards.
    async fn redo_profile_writes(
        &mut self,
        state: &StateStore,
    ) -> Result<(StateDelta, BTreeMap<String, u64>), CheckpointError> {
        let Some(profile_id) = self.pending.run.profile_id.clone() else {
            return Ok((StateDelta::default(), BTreeMap::new()));
        };
        let journal = self.profile.get_or_insert_default();
        let pause = journal.backoff();
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let journal = self.profile.get_or_insert_default();
        journal.take_writes(state);
        let fresh = self.store.load_profile(&profile_id).await?;
        Ok(journal.redo(&fresh, state)?)
    }
}
