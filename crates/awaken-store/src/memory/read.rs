//! Reads of the memory store: what is shared under a shard's lock is decoded after it is
//! released.

use awaken_event::{ProfileId, RunId, ThreadId};
use awaken_state::PersistedState;

use crate::commit::RunRecord;
use crate::error::StoreError;
use crate::store::{Checkpoint, ProfileState, StoredEvent, ThreadSummary};

use super::maps::{Profiles, lock, persisted};
use super::shards::Tables;
use super::thread::EventParts;

impl Tables {
    /// See `ThreadStore::load_checkpoint`.
    pub(super) fn checkpoint(
        &self,
        thread_id: &ThreadId,
    ) -> Result<Option<Checkpoint>, StoreError> {
        let shard = self.shard(thread_id);
        let Some((data, thread)) = shard
            .threads
            .get(thread_id)
            .and_then(|t| Some((t, t.row.as_ref()?)))
        else {
            return Ok(None);
        };
        let run_id = &thread.latest_run_id;
        let run = match shard.runs.get(run_id) {
            Some(slot) => Some(slot.load(run_id, &self.digests)?),
            None => None,
        };
        let messages = data.message_parts();
        let profile = run
            .as_ref()
            .and_then(|r| r.record.profile_id.as_ref())
            .map(|p| profile_state(&lock(&self.profiles), p));
        let (run, run_state, batch) = match run {
            Some(r) => (Some(r.record), r.state, r.batch),
            None => (None, PersistedState::default(), None),
        };
        let mut checkpoint = Checkpoint {
            thread_id: thread_id.clone(),
            messages: Vec::new(),
            thread_state: persisted(
                "thread state",
                thread.state_revision,
                data.state.iter().flat_map(|state| state.iter()),
            )?,
            run,
            run_state,
            profile,
            batch,
            last_event_seq: data.last_event_seq(),
        };
        // Decoded after the shard's lock is released.
        drop(shard);
        checkpoint.messages = messages.decode()?;
        Ok(Some(checkpoint))
    }

    /// See `ThreadStore::load_profile`.
    pub(super) fn profile(&self, profile_id: &ProfileId) -> ProfileState {
        profile_state(&lock(&self.profiles), profile_id)
    }

    /// See `ThreadStore::list_threads`.
    pub(super) fn threads(&self) -> Vec<ThreadSummary> {
        let mut threads: Vec<ThreadSummary> = Vec::new();
        for shard in &self.shards {
            let shard = lock(shard);
            threads.extend(shard.threads.iter().filter_map(|(id, data)| {
                let t = data.row.as_ref()?;
                Some(ThreadSummary {
                    thread_id: id.clone(),
                    message_count: data.message_count as u64,
                    latest_run_id: Some(t.latest_run_id.clone()),
                    created_at: t.created_at,
                    updated_at: t.updated_at,
                })
            }));
        }
        threads.sort_unstable_by(|a, b| a.thread_id.cmp(&b.thread_id));
        threads
    }

    /// See `ThreadStore::latest_run`.
    pub(super) fn latest_run(&self, thread_id: &ThreadId) -> Result<Option<RunRecord>, StoreError> {
        let shard = self.shard(thread_id);
        let Some(thread) = shard.threads.get(thread_id).and_then(|t| t.row.as_ref()) else {
            return Ok(None);
        };
        let run_id = &thread.latest_run_id;
        shard
            .runs
            .get(run_id)
            .map(|slot| slot.record(run_id, &self.digests))
            .transpose()
    }

    /// See `ThreadStore::load_run`.
    pub(super) fn run(
        &self,
        thread_id: &ThreadId,
        run_id: &RunId,
    ) -> Result<Option<RunRecord>, StoreError> {
        match self.shard(thread_id).runs.get(run_id) {
            Some(slot) if slot.is_on(thread_id)? => slot.record(run_id, &self.digests).map(Some),
            _ => Ok(None),
        }
    }

    /// See `ThreadStore::list_runs`.
    pub(super) fn runs(&self, thread_id: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        let shard = self.shard(thread_id);
        let mut runs: Vec<RunRecord> = Vec::new();
        for (run_id, slot) in &shard.runs {
            if slot.is_on(thread_id)? {
                runs.push(slot.record(run_id, &self.digests)?);
            }
        }
        runs.sort_by(|a, b| (a.created_at, &a.run_id).cmp(&(b.created_at, &b.run_id)));
        Ok(runs)
    }

    /// See `ThreadStore::load_events`.
    pub(super) fn events(
        &self,
        thread_id: &ThreadId,
        since: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let parts = self
            .shard(thread_id)
            .threads
            .get(thread_id)
            .map(|t| t.events_since(since));
        // Decoded after the shard's lock is released.
        parts.map_or_else(|| Ok(Vec::new()), EventParts::decode)
    }
}

/// `profile_id`'s keys in `profiles` (none if it has none).
fn profile_state(profiles: &Profiles, profile_id: &ProfileId) -> ProfileState {
    ProfileState {
        profile_id: profile_id.clone(),
        keys: profiles.get(profile_id).cloned().unwrap_or_default(),
    }
}
