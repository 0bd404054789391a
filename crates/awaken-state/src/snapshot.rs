//! Immutable snapshots and their export to JSON.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::error::StateError;
use crate::exported::{PersistedState, StateDelta, StateValue};
use crate::key::{
    AnyValue, KeyEntry, KeyHandle, KeyRegistry, KeyScope, StateKey, Stored, downcast,
};
use crate::table::Table;

/// An immutable view of all state at one revision.
///
/// Cloning or taking one is O(1) (one `Arc`); it never changes, whatever is committed later,
/// and it keeps alive only the values it shares with newer versions. Reads are typed
/// ([`get`](Self::get)) or by name as JSON ([`get_json`](Self::get_json)); a key never written
/// reads as its `Default`.
#[derive(Clone)]
pub struct Snapshot {
    pub(crate) version: Arc<Version>,
}

pub(crate) struct Version {
    pub(crate) revision: u64,
    pub(crate) staged: bool,
    pub(crate) table: Table,
    pub(crate) registry: Arc<KeyRegistry>,
}

/// A key's value as an export carries it: typed, serialized when a store asks.
fn exported(entry: &KeyEntry, value: &Arc<AnyValue>) -> StateValue {
    StateValue::typed(entry.name, value.clone(), entry.codec)
}

impl Snapshot {
    pub(crate) fn new(version: Version) -> Self {
        Snapshot {
            version: Arc::new(version),
        }
    }

    /// Revision of the last commit this state contains (0: nothing committed yet). For a
    /// transaction's staged snapshot, the revision the transaction started from.
    pub fn revision(&self) -> u64 {
        self.version.revision
    }

    /// Whether this is a transaction's staged (not yet published) state.
    pub fn is_staged(&self) -> bool {
        self.version.staged
    }

    /// The registry of the store this snapshot comes from.
    pub fn registry(&self) -> &KeyRegistry {
        &self.version.registry
    }

    /// The value of `K`. `Err(UnknownKey)` if `K::KEY` is not registered,
    /// `Err(KeyTypeMismatch)` if it is registered with another type.
    pub fn get<K: StateKey>(&self) -> Result<&K::Value, StateError> {
        let index = self.version.registry.resolve_typed::<K>()?;
        let slot = self.slot(index, K::KEY)?;
        downcast::<Stored<K::Value, K::Update>>(K::KEY, &*slot.value).map(|s| &s.value)
    }

    /// [`get`](Self::get) through a handle found once ([`KeyRegistry::handle`]): no search. A
    /// handle from another registry, whose place holds another key, is checked and ignored.
    #[inline]
    pub fn get_by<K: StateKey>(&self, key: KeyHandle<K>) -> Result<&K::Value, StateError> {
        self.get_at::<K>(Some(key.index()))
    }

    /// [`get`](Self::get), looking at `position` first: a position that does not hold `K` in
    /// this snapshot's registry is checked and ignored, and `K` is looked up as `get` would.
    #[inline]
    fn get_at<K: StateKey>(&self, position: Option<usize>) -> Result<&K::Value, StateError> {
        let registry = &self.version.registry;
        match position {
            Some(index)
                if registry
                    .entries()
                    .get(index)
                    .is_some_and(|e| e.key_type == std::any::TypeId::of::<K>()) =>
            {
                let slot = self.slot(index, K::KEY)?;
                downcast::<Stored<K::Value, K::Update>>(K::KEY, &*slot.value).map(|s| &s.value)
            }
            _ => self.get::<K>(),
        }
    }

    /// The value of `K`, or `None` if `K` is not registered (with this type): for a key that
    /// only some agents have, read without making the error `get` would.
    pub fn find<K: StateKey>(&self) -> Option<&K::Value> {
        let index = self
            .version
            .registry
            .index_of_type(std::any::TypeId::of::<K>())?;
        let slot = self.version.table.get(index)?;
        downcast::<Stored<K::Value, K::Update>>(K::KEY, &*slot.value)
            .ok()
            .map(|s| &s.value)
    }

    /// The value of the key named `key`, as JSON.
    pub fn get_json(&self, key: &str) -> Result<serde_json::Value, StateError> {
        let (index, entry) = self.version.registry.resolve(key)?;
        let slot = self.slot(index, key)?;
        entry.codec.value_to_json(entry.name, &*slot.value)
    }

    /// Revision of the last commit that wrote `key` (0 if never written).
    pub fn changed_at(&self, key: &str) -> Result<u64, StateError> {
        let (index, _) = self.version.registry.resolve(key)?;
        Ok(self.slot(index, key)?.changed_at)
    }

    /// Every key of `scope`, as JSON. Empty for [`KeyScope::Ephemeral`], which is never
    /// exported.
    pub fn export(&self, scope: KeyScope) -> Result<PersistedState, StateError> {
        self.export_where(|s| s == scope && s.is_persisted())
    }

    /// Every persisted key (scopes `Run`, `Thread` and `Profile`), as JSON.
    pub fn export_persisted(&self) -> Result<PersistedState, StateError> {
        self.export_where(KeyScope::is_persisted)
    }

    /// The persisted keys written by commits after `since_revision`, as JSON: what a store
    /// must write to go from the export at `since_revision` to this one. Its cost grows with
    /// the number of changed keys, not with the number of keys.
    pub fn export_changed(&self, since_revision: u64) -> Result<PersistedState, StateError> {
        self.export_changed_where(since_revision, KeyScope::is_persisted)
    }

    /// [`export_changed`](Self::export_changed) restricted to one scope.
    pub fn export_changed_in(
        &self,
        scope: KeyScope,
        since_revision: u64,
    ) -> Result<PersistedState, StateError> {
        self.export_changed_where(since_revision, |s| s == scope && s.is_persisted())
    }

    /// The keys of several scopes changed after `since_revision`, in one pass over the changed
    /// keys: one [`StateDelta`] per scope, in the order given. The values stay typed (shared
    /// with this snapshot) until a store asks for their JSON.
    pub fn export_changed_in_each<const N: usize>(
        &self,
        scopes: [KeyScope; N],
        since_revision: u64,
    ) -> [StateDelta; N] {
        let mut out: [StateDelta; N] = std::array::from_fn(|_| StateDelta::default());
        self.export_changed_in_each_into(scopes, since_revision, out.each_mut());
        out
    }

    /// [`export_changed_in_each`](Self::export_changed_in_each) into deltas kept from an
    /// earlier export (emptied first; their room is reused, no list allocated once it is
    /// large enough).
    pub fn export_changed_in_each_into<const N: usize>(
        &self,
        scopes: [KeyScope; N],
        since_revision: u64,
        mut out: [&mut StateDelta; N],
    ) {
        // One walk of the changed parts of the table counts each scope's keys and keeps what it
        // found on the stack, so each list grows once, to its size, if at all (growing one
        // entry at a time reallocated it up to five times per commit with many changed keys).
        // A commit changes a few keys; when more changed than the stack holds, a second walk
        // fills the lists.
        const KEPT: usize = 4;
        let mut kept: [Option<(usize, &KeyEntry, &Arc<AnyValue>)>; KEPT] = [None; KEPT];
        let mut found = 0;
        let mut counts = [0usize; N];
        self.for_each_changed_persisted(since_revision, |entry, value| {
            if let Some(i) = scopes.iter().position(|s| *s == entry.options.scope) {
                if let Some(slot) = kept.get_mut(found) {
                    *slot = Some((i, entry, value));
                }
                found += 1;
                counts[i] += 1;
            }
        });
        for (delta, count) in out.iter_mut().zip(counts) {
            delta.revision = self.revision();
            delta.values.clear();
            delta.values.reserve_exact(count);
        }
        if found <= KEPT {
            for (i, entry, value) in kept.into_iter().flatten() {
                out[i].values.push_new(entry.name, exported(entry, value));
            }
        } else {
            self.for_each_changed_persisted(since_revision, |entry, value| {
                if let Some(i) = scopes.iter().position(|s| *s == entry.options.scope) {
                    out[i].values.push_new(entry.name, exported(entry, value));
                }
            });
        }
    }

    /// Every key (ephemeral ones included) as `name = json` lines in registration order; for
    /// logs and tests.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for entry in self.version.registry.entries() {
            let json = self
                .get_json(entry.name)
                .map(|v| v.to_string())
                .unwrap_or_else(|e| format!("<{e}>"));
            out.push_str(entry.name);
            out.push_str(" = ");
            out.push_str(&json);
            out.push('\n');
        }
        out
    }

    fn export_where(&self, keep: impl Fn(KeyScope) -> bool) -> Result<PersistedState, StateError> {
        let mut values = BTreeMap::new();
        for (index, entry) in self.version.registry.entries().iter().enumerate() {
            if keep(entry.options.scope) {
                let slot = self.slot(index, entry.name)?;
                values.insert(
                    entry.name.to_owned(),
                    entry.codec.value_to_json(entry.name, &*slot.value)?,
                );
            }
        }
        Ok(PersistedState {
            revision: self.revision(),
            values,
        })
    }

    fn export_changed_where(
        &self,
        since: u64,
        keep: impl Fn(KeyScope) -> bool,
    ) -> Result<PersistedState, StateError> {
        let mut values = BTreeMap::new();
        self.for_each_changed_persisted(since, |entry, value| {
            if keep(entry.options.scope) {
                values.insert(Cow::Borrowed(entry.name), exported(entry, value));
            }
        });
        PersistedState::from_values(self.revision(), &values)
    }

    /// Calls `f` with the entry and value of every persisted key written by a commit after
    /// `since`, in key order, without visiting unchanged parts of the table.
    fn for_each_changed_persisted<'s>(
        &'s self,
        since: u64,
        mut f: impl FnMut(&'s KeyEntry, &'s Arc<AnyValue>),
    ) {
        let registry = &self.version.registry;
        self.version
            .table
            .for_each_changed(since, &mut |index, slot| {
                let entry = registry.entry_at(index);
                if entry.options.scope.is_persisted() {
                    f(entry, &slot.value);
                }
            });
    }

    fn slot(&self, index: usize, key: &str) -> Result<&crate::table::Slot, StateError> {
        // Every registered index has a slot; a miss would be a bug, reported rather than panicking.
        self.version
            .table
            .get(index)
            .ok_or_else(|| StateError::UnknownKey {
                key: key.to_owned(),
            })
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("revision", &self.revision())
            .field("staged", &self.is_staged())
            .field("keys", &self.version.registry.len())
            .finish()
    }
}
