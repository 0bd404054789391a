//! The profile journal: what a run with a profile keeps about its profile's keys, so that its
//! writes are guarded by the versions they were read at and a refused write is redone on the
//! fresh value.

use std::collections::BTreeMap;

use awaken_state::{KeyScope, StateCommand, StateDelta, StateError, StateStore, UnknownKeyPolicy};
use awaken_store::ProfileState;

/// How many profile conflicts one run retries before its commit fails.
const MAX_PROFILE_RETRIES: u32 = 16;

/// What a run with a profile keeps about its profile's keys.
#[derive(Default)]
pub(crate) struct ProfileJournal {
    /// The version at which each key of the run's profile was read (0: absent); a written
    /// key's version moves with each commit that writes it.
    versions: BTreeMap<String, u64>,
    /// Profile writes of the run not yet durable (journaled updates, in order), kept across
    /// retries of one commit.
    pending: Vec<(String, serde_json::Value)>,
    /// How many times a profile conflict was retried (all commits of the run).
    retries: u32,
}

impl ProfileJournal {
    /// A journal of `profile` as the run read it.
    pub(crate) fn read(profile: &ProfileState) -> Self {
        Self {
            versions: versions_of(profile),
            ..Self::default()
        }
    }

    /// The guard of each profile key `delta` writes: the version it was read at.
    pub(super) fn guards(&self, delta: &StateDelta) -> BTreeMap<String, u64> {
        delta
            .values
            .keys()
            .map(|k| {
                (
                    k.to_string(),
                    self.versions.get(k.as_ref()).copied().unwrap_or(0),
                )
            })
            .collect()
    }

    /// Whether another profile conflict of the run may be retried.
    pub(super) fn may_retry(&self) -> bool {
        self.retries < MAX_PROFILE_RETRIES
    }

    /// Counts a profile conflict the run retries.
    pub(super) fn count_retry(&mut self) {
        self.retries += 1;
    }

    /// Redoes the run's journaled profile writes on `fresh`, the profile as it is after a
    /// conflict (in a scratch store over the run's keys), and puts the results into the run's
    /// state. Returns the results with the fresh versions as their guards.
    pub(super) fn redo(
        &mut self,
        fresh: &ProfileState,
        state: &StateStore,
    ) -> Result<(StateDelta, BTreeMap<String, u64>), StateError> {
        let scratch = StateStore::new(state.registry().clone());
        scratch.restore(&fresh.to_persisted(), UnknownKeyPolicy::Skip)?;
        let base = scratch.revision();
        let mut redo = StateCommand::new();
        for (key, update) in &self.pending {
            redo.update_json(key.clone(), update.clone());
        }
        scratch.commit(redo)?;
        let delta = scratch
            .snapshot()
            .export_changed_in(KeyScope::Profile, base)?;
        let versions = versions_of(fresh);
        let guards = delta
            .values
            .keys()
            .map(|k| (k.clone(), versions.get(k).copied().unwrap_or(0)))
            .collect();
        self.versions = versions;
        // The run goes on from the redone values.
        state.restore(&delta, UnknownKeyPolicy::Skip)?;
        // (A restore is not journaled: the pending writes stay the record until durable.)
        Ok((delta.into(), guards))
    }

    /// Moves the profile writes `state` journaled since the last commit here, where they stay
    /// until a commit makes them durable.
    pub(super) fn take_writes(&mut self, state: &StateStore) {
        self.pending.extend(state.take_journal());
    }

    /// After a written commit: each key it wrote (`guards`, the versions it was written over)
    /// is at the next version now, and the run's journaled writes are durable.
    pub(super) fn committed(&mut self, guards: Option<&BTreeMap<String, u64>>, state: &StateStore) {
        for (key, read) in guards.into_iter().flatten() {
            self.versions.insert(key.clone(), read + 1);
        }
        self.pending.clear();
        state.take_journal();
    }
}

/// The version of each key of `profile`.
fn versions_of(profile: &ProfileState) -> BTreeMap<String, u64> {
    profile
        .keys
        .iter()
        .map(|(k, e)| (k.clone(), e.version))
        .collect()
}
