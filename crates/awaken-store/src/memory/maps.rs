//! The memory store's maps: the hash maps every table uses, a stored state and its keys, the
//! profiles, and how a table's lock is taken.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use awaken_event::ProfileId;
use awaken_state::{PersistedState, StateValue};

use crate::error::StoreError;
use crate::store::ProfileEntry;

/// The store's hash maps: a fast hash with a per-process random seed (ids are short strings
/// hashed several times per commit, where SipHash would cost a visible share of it; see
/// ADR 0009). `hashbrown`'s for its raw entries: a commit finds its thread and run by
/// reference, where `entry` takes an owned key (a clone and a drop of each shared id, four
/// atomic operations per commit).
pub(super) type HashMap<K, V> = hashbrown::HashMap<K, V, MapHasher>;
pub(super) type MapHasher = foldhash::fast::RandomState;

/// A state key's name: borrowed from the registry when the commit carried it so.
pub(super) type StateKeyName = std::borrow::Cow<'static, str>;

/// A run's or thread's stored state. Hashed, not ordered: a commit writes each changed key with
/// one string comparison instead of a walk through a tree's nodes; a load sorts (through
/// `PersistedState`).
pub(super) type StateMap = HashMap<StateKeyName, StateValue>;

/// Every profile's keys.
pub(super) type Profiles = HashMap<ProfileId, BTreeMap<String, ProfileEntry>>;

/// Locks `m`. A panic while holding a lock cannot leave a half-applied commit (the undo log
/// runs on errors, and nothing in the write path panics), so the data is still consistent.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A stored state as a load returns it (`what` names it in the error).
pub(super) fn persisted<'a>(
    what: &'static str,
    revision: u64,
    values: impl IntoIterator<Item = (&'a StateKeyName, &'a StateValue)>,
) -> Result<PersistedState, StoreError> {
    PersistedState::from_values(revision, values)
        .map_err(|source| StoreError::StateValue { what, source })
}
