//! Exported state as a commit carries it: each changed key's value, turned into JSON only when a
//! store writes it out ([`StateValue`], [`StateDelta`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::error::StateError;
use crate::key::{AnyValue, KeyCodec};
use crate::snapshot::PersistedState;

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
    pub values: BTreeMap<Cow<'static, str>, StateValue>,
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
            values: state
                .values
                .into_iter()
                .map(|(k, v)| (Cow::Owned(k), StateValue::json(v)))
                .collect(),
        }
    }
}
