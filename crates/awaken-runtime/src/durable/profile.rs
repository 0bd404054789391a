//! The profile journal: what a run with a profile keeps about its profile's keys, so that its
//! writes are guarded by the versions they were read at and a refused write is redone on the
//! fresh value, for as long as other writers make progress.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use awaken_state::{KeyScope, StateCommand, StateDelta, StateError, StateStore, UnknownKeyPolicy};
use awaken_store::ProfileState;

/// How many conflicts in a row one commit retries when the fresh profile shows no other
/// writer's progress (no key's version moved): a store that keeps refusing without a newer
/// value would otherwise be retried for ever.
const MAX_STALLED_RETRIES: u32 = 3;

/// The longest pause between two attempts of one commit, in microseconds (the window doubles
/// from 1 ms).
const MAX_BACKOFF_MICROS: u64 = 64_000;

/// What a run with a profile keeps about its profile's keys.
#[derive(Default)]
pub(crate) struct ProfileJournal {
    /// The version at which each key of the run's profile was read (0: absent); a written
    /// key's version moves with each commit that writes it.
    versions: BTreeMap<String, u64>,
    /// Profile writes of the run not yet durable (journaled updates, in order), kept across
    /// retries of one commit.
    pending: Vec<(String, serde_json::Value)>,
    /// Conflicts retried by the commit being written (0 after each written commit).
    attempts: u32,
    /// Of those, how many in a row found no key's version moved.
    stalled: u32,
    /// The jitter's state, seeded at random per journal so that contending runs spread their retries.
    jitter: u64,
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

    /// Whether the commit being written may retry another profile conflict: always while
    /// each conflict shows another writer's progress (a conflict means some other commit of
    /// the key was written, so the profile as a whole moves on).
    pub(super) fn may_retry(&self) -> bool {
        self.stalled < MAX_STALLED_RETRIES
    }

    /// Counts a conflict the commit retries and returns the pause before the retry: a random
    /// part of a window that doubles from 1 ms up to [`MAX_BACKOFF_MICROS`] (full jitter), so that
    /// runs contending for one key stop colliding in step.
    pub(super) fn backoff(&mut self) -> Duration {
        self.attempts = self.attempts.saturating_add(1);
        let window = (1000u64 << self.attempts.min(16).saturating_sub(1)).min(MAX_BACKOFF_MICROS);
        if self.jitter == 0 {
            self.jitter = RandomState::new().hash_one(self.attempts);
        }
        // splitmix64: enough spread for a pause, no dependency.
        self.jitter = self.jitter.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.jitter;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Duration::from_micros(z % (window + 1))
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
        let moved = versions
            .iter()
            .any(|(k, v)| *v > self.versions.get(k).copied().unwrap_or(0));
        self.stalled = if moved { 0 } else { self.stalled + 1 };
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
        self.attempts = 0;
        self.stalled = 0;
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
