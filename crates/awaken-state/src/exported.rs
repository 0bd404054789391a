//! Exported state as a commit carries it: each changed key's value, turned into JSON only when a
//! store writes it out ([`StateValue`], [`StateDelta`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::StateError;
use crate::key::{AnyValue, KeyCodec};

/// Persisted values by key name, as JSON: what [`Snapshot::export`](crate::Snapshot::export)
/// writes and [`crate::StateStore::restore`] reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PersistedState {
    /// Revision of the snapshot the values were exported from.
    pub revision: u64,
    /// JSON value of each exported key.
    pub values: BTreeMap<String, serde_json::Value>,
}

/// One exported key value: the key's typed value (immutable, shared with the snapshot it came
/// from) with its codec, or JSON. JSON or text is produced only when asked for, so a store that
/// keeps values in memory never serializes them.
#[derive(Clone)]
pub struct StateValue(Repr);

#[derive(Clone)]
enum Repr {
    Json(serde_json::Value),
    Typed {
        name: &'static str,
        value: Arc<AnyValue>,
        codec: &'static dyn KeyCodec,
    },
}

impl StateValue {
    /// A value given as JSON.
    pub fn json(value: serde_json::Value) -> Self {
        Self(Repr::Json(value))
    }

    pub(crate) fn typed(
        name: &'static str,
        value: Arc<AnyValue>,
        codec: &'static dyn KeyCodec,
    ) -> Self {
        Self(Repr::Typed { name, value, codec })
    }

    /// The value as JSON.
    ///
    /// # Errors
    /// The value's `Serialize` failed (a type that cannot be JSON, such as a map with
    /// non-string keys).
    pub fn to_json(&self) -> Result<serde_json::Value, StateError> {
        match &self.0 {
            Repr::Json(v) => Ok(v.clone()),
            Repr::Typed { name, value, codec } => codec.value_to_json(name, &**value),
        }
    }

    /// The value as JSON, without a copy when it already is JSON.
    ///
    /// # Errors
    /// As [`to_json`](Self::to_json).
    pub fn into_json(self) -> Result<serde_json::Value, StateError> {
        match self.0 {
            Repr::Json(v) => Ok(v),
            Repr::Typed { name, value, codec } => codec.value_to_json(name, &*value),
        }
    }

    /// The value as JSON text (serialized directly, with no JSON tree in between).
    ///
    /// # Errors
    /// As [`to_json`](Self::to_json).
    pub fn to_text(&self) -> Result<String, StateError> {
        match &self.0 {
            Repr::Json(v) => serde_json::to_string(v).map_err(|e| StateError::Serialize {
                key: String::new(),
                source: Arc::new(e),
            }),
            Repr::Typed { name, value, codec } => codec.value_to_text(name, &**value),
        }
    }
}

impl From<serde_json::Value> for StateValue {
    fn from(value: serde_json::Value) -> Self {
        Self::json(value)
    }
}

impl fmt::Debug for StateValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_json() {
            Ok(v) => write!(f, "{v}"),
            Err(e) => write!(f, "<{e}>"),
        }
    }
}

/// Equal when both serialize to the same JSON (two values that do not serialize are unequal).
impl PartialEq for StateValue {
    fn eq(&self, other: &Self) -> bool {
        matches!((self.to_json(), other.to_json()), (Ok(a), Ok(b)) if a == b)
    }
}

/// The changed keys of one scope, as a commit carries them (see
/// [`Snapshot::export_changed_in_each`](crate::Snapshot::export_changed_in_each)).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StateDelta {
    /// Revision of the snapshot the values were exported from.
    pub revision: u64,
    /// Value of each exported key (names borrowed from the registry when exported from a
    /// snapshot: no copy per key and commit).
    pub values: DeltaValues,
}

/// The values of a [`StateDelta`]: each key once, in the order they were added (a snapshot's
/// export adds them in key registration order).
///
/// A list rather than a sorted map: a commit builds it once and a store reads it once, so
/// ordering the names (several string comparisons and a tree node per key) was wasted work.
/// Lookups by name are linear; equality ignores the order.
#[derive(Clone, Default)]
pub struct DeltaValues(Vec<(Cow<'static, str>, StateValue)>);

impl DeltaValues {
    /// No values.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sets `key` to `value`; returns the value it replaces.
    pub fn insert(
        &mut self,
        key: impl Into<Cow<'static, str>>,
        value: StateValue,
    ) -> Option<StateValue> {
        let key = key.into();
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, old)) => Some(std::mem::replace(old, value)),
            None => {
                self.0.push((key, value));
                None
            }
        }
    }

    /// Room for `n` more values (exactly: an export knows how many it adds).
    pub(crate) fn reserve_exact(&mut self, n: usize) {
        self.0.reserve_exact(n);
    }

    /// Removes every value, keeping the room.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Takes every value, in order, keeping the room (a store writing a commit's delta leaves
    /// it for the runtime's next export).
    pub fn drain(&mut self) -> impl ExactSizeIterator<Item = (Cow<'static, str>, StateValue)> + '_ {
        self.0.drain(..)
    }

    /// Adds a key known to be absent (an export visits each key once).
    pub(crate) fn push_new(&mut self, key: &'static str, value: StateValue) {
        debug_assert!(!self.contains_key(key), "{key} exported twice");
        self.0.push((Cow::Borrowed(key), value));
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&StateValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether `key` has a value.
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The names, in order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &Cow<'static, str>> {
        self.0.iter().map(|(k, _)| k)
    }

    /// The names, in order, taken.
    pub fn into_keys(self) -> impl ExactSizeIterator<Item = Cow<'static, str>> {
        self.0.into_iter().map(|(k, _)| k)
    }

    /// The names and values, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&Cow<'static, str>, &StateValue)> {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl fmt::Debug for DeltaValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Equal when both hold the same keys with equal values, in any order.
impl PartialEq for DeltaValues {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

impl std::ops::Index<&str> for DeltaValues {
    type Output = StateValue;

    /// # Panics
    /// `key` has no value.
    fn index(&self, key: &str) -> &StateValue {
        self.get(key)
            .unwrap_or_else(|| panic!("no value for state key {key}"))
    }
}

impl IntoIterator for DeltaValues {
    type Item = (Cow<'static, str>, StateValue);
    type IntoIter = std::vec::IntoIter<(Cow<'static, str>, StateValue)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a DeltaValues {
    type Item = (&'a Cow<'static, str>, &'a StateValue);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (Cow<'static, str>, StateValue)>,
        fn(&'a (Cow<'static, str>, StateValue)) -> (&'a Cow<'static, str>, &'a StateValue),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

/// A later value of a key replaces an earlier one (as a map's would).
impl<K: Into<Cow<'static, str>>> FromIterator<(K, StateValue)> for DeltaValues {
    fn from_iter<I: IntoIterator<Item = (K, StateValue)>>(iter: I) -> Self {
        let mut out = Self::new();
        for (k, v) in iter {
            out.insert(k, v);
        }
        out
    }
}

impl From<BTreeMap<Cow<'static, str>, StateValue>> for DeltaValues {
    fn from(map: BTreeMap<Cow<'static, str>, StateValue>) -> Self {
        Self(map.into_iter().collect())
    }
}

impl StateDelta {
    /// The same as JSON.
    ///
    /// # Errors
    /// A value's `Serialize` failed.
    pub fn to_persisted(&self) -> Result<PersistedState, StateError> {
        PersistedState::from_values(self.revision, &self.values)
    }
}

impl PersistedState {
    /// The JSON of `values` (a delta's, or values a store kept as commits carried them) at
    /// `revision`.
    ///
    /// # Errors
    /// A value's `Serialize` failed.
    pub fn from_values<'a>(
        revision: u64,
        values: impl IntoIterator<Item = (&'a Cow<'static, str>, &'a StateValue)>,
    ) -> Result<Self, StateError> {
        let mut json = BTreeMap::new();
        for (k, v) in values {
            json.insert(k.to_string(), v.to_json()?);
        }
        Ok(Self {
            revision,
            values: json,
        })
    }
}

impl From<PersistedState> for StateDelta {
    fn from(state: PersistedState) -> Self {
        Self {
            revision: state.revision,
            // A map's keys are distinct: no search per key.
            values: DeltaValues(
                state
                    .values
                    .into_iter()
                    .map(|(k, v)| (Cow::Owned(k), StateValue::json(v)))
                    .collect(),
            ),
        }
    }
}
