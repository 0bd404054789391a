//! `StateCommand`: what hooks, action handlers and tools return instead of changing state.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use serde::de::Error as _;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::StateError;
use crate::key::{ErasedUpdate, KeyMeta, KeyRegistry, StateKey, Stored};

/// Pure data describing a change: key updates, scheduled actions and effects, plus an optional
/// base revision. Nothing happens until a [`crate::StateStore`] (or a
/// [`crate::Transaction`]) commits it.
///
/// Updates are held in one of two forms:
/// - **typed** ([`update`](Self::update)): the Rust update, in the allocation that becomes the
///   value it produces; committing it does no JSON work;
/// - **JSON** ([`update_json`](Self::update_json), and every command read with serde): the key
///   name and a JSON update, parsed into the registered key's `Update` type at commit.
///
/// Both forms serialize the same way, so a command can be stored and read back:
/// `{"base_revision":…,"updates":[{"key":…,"update":…}],"actions":[…],"effects":[…]}`.
#[derive(Default, Clone)]
pub struct StateCommand {
    pub(crate) base_revision: Option<u64>,
    pub(crate) updates: Updates,
    pub(crate) actions: Vec<ScheduledAction>,
    pub(crate) effects: Vec<Effect>,
}

/// A command's key updates: most commands write one key, so the first update is held inline
/// and a list is allocated only for the second.
#[derive(Clone)]
pub(crate) enum Updates {
    /// No update, or exactly one.
    Inline(Option<KeyUpdate>),
    /// A list: two or more updates, or any number when read from a list or reserved for more.
    Heap(Vec<KeyUpdate>),
}

impl Default for Updates {
    fn default() -> Self {
        Updates::Inline(None)
    }
}

impl Updates {
    #[inline]
    pub(crate) fn as_slice(&self) -> &[KeyUpdate] {
        match self {
            Updates::Inline(None) => &[],
            Updates::Inline(Some(update)) => std::slice::from_ref(update),
            Updates::Heap(list) => list,
        }
    }

    #[inline]
    pub(crate) fn as_mut_slice(&mut self) -> &mut [KeyUpdate] {
        match self {
            Updates::Inline(None) => &mut [],
            Updates::Inline(Some(update)) => std::slice::from_mut(update),
            Updates::Heap(list) => list,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    #[inline]
    pub(crate) fn push(&mut self, update: KeyUpdate) {
        match self {
            Updates::Inline(slot @ None) => *slot = Some(update),
            Updates::Inline(Some(_)) => {
                let Updates::Inline(Some(first)) = std::mem::take(self) else {
                    unreachable!("matched just above")
                };
                let mut list = Vec::with_capacity(4);
                list.push(first);
                list.push(update);
                *self = Updates::Heap(list);
            }
            Updates::Heap(list) => list.push(update),
        }
    }

    /// Room for `additional` more updates without reallocating (a no-op while they fit inline).
    pub(crate) fn reserve(&mut self, additional: usize) {
        let len = self.len();
        if len + additional <= 1 {
            return;
        }
        match self {
            Updates::Heap(list) => list.reserve(additional),
            Updates::Inline(first) => {
                let mut list = Vec::with_capacity(len + additional);
                list.extend(first.take());
                *self = Updates::Heap(list);
            }
        }
    }

    #[inline]
    pub(crate) fn extend(&mut self, other: Updates) {
        match (&mut *self, other) {
            (_, Updates::Inline(None)) => {}
            (Updates::Inline(None), other) => *self = other,
            (_, Updates::Inline(Some(update))) => self.push(update),
            (Updates::Heap(list), Updates::Heap(more)) => list.extend(more),
            (Updates::Inline(Some(_)), Updates::Heap(more)) => {
                self.reserve(more.len());
                if let Updates::Heap(list) = self {
                    list.extend(more);
                }
            }
        }
    }
}

impl IntoIterator for Updates {
    type Item = KeyUpdate;
    type IntoIter =
        std::iter::Chain<std::option::IntoIter<KeyUpdate>, std::vec::IntoIter<KeyUpdate>>;

    fn into_iter(self) -> Self::IntoIter {
        match self {
            Updates::Inline(first) => first.into_iter().chain(Vec::new()),
            Updates::Heap(list) => None.into_iter().chain(list),
        }
    }
}

impl From<Vec<KeyUpdate>> for Updates {
    fn from(list: Vec<KeyUpdate>) -> Self {
        Updates::Heap(list)
    }
}

/// [`KeyUpdate::slot`] of an update whose key name was never looked up.
pub(crate) const UNRESOLVED: usize = usize::MAX;

/// One update of one key, typed or JSON (see [`StateCommand`]).
pub struct KeyUpdate {
    pub(crate) key: Cow<'static, str>,
    pub(crate) payload: Payload,
    /// Index of the key in a registry, remembered by the last lookup ([`UNRESOLVED`] before
    /// any). A hint only: a commit uses it after checking that the entry at this index of its
    /// own registry is this key (same key type, or same name for a JSON update), and looks the
    /// key up otherwise.
    pub(crate) slot: usize,
}

pub(crate) enum Payload {
    Typed(Arc<dyn ErasedUpdate>),
    Json(Box<serde_json::Value>),
}

/// An action for the phase engine to run in the EXECUTE part of a phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduledAction {
    /// Target phase, by name (the phase engine validates it).
    pub phase: String,
    /// Action key; selects the handler.
    pub key: String,
    /// The handler's input.
    pub payload: serde_json::Value,
}

/// An effect to dispatch after the commit that carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    /// Effect key; selects the handler.
    pub key: String,
    /// The handler's input.
    pub payload: serde_json::Value,
}

impl StateCommand {
    /// An empty command.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requires the store to be at `revision` when this command commits (else
    /// `StaleRevision`). Use it when the command was computed from a snapshot and must not
    /// apply on top of changes made since.
    pub fn with_base_revision(mut self, revision: u64) -> Self {
        self.base_revision = Some(revision);
        self
    }

    /// Adds a typed update of `K` (no JSON work at commit).
    pub fn update<K: StateKey>(&mut self, update: K::Update) -> &mut Self {
        self.updates.push(KeyUpdate {
            key: Cow::Borrowed(K::KEY),
            payload: Payload::Typed(Arc::new(Stored::update(update, KeyMeta::of::<K>()))),
            slot: UNRESOLVED,
        });
        self
    }

    /// Builder form of [`update`](Self::update).
    pub fn with_update<K: StateKey>(mut self, update: K::Update) -> Self {
        self.update::<K>(update);
        self
    }

    /// Adds an update of the key named `key`, as JSON of its `Update` type; it is checked at
    /// commit (`UnknownKey`, `UpdateDeserialize`).
    pub fn update_json(&mut self, key: impl Into<String>, update: serde_json::Value) -> &mut Self {
        self.updates.push(KeyUpdate {
            key: Cow::Owned(key.into()),
            payload: Payload::Json(Box::new(update)),
            slot: UNRESOLVED,
        });
        self
    }

    /// Schedules an action for `phase` (by name) with a JSON payload.
    pub fn schedule_json(
        &mut self,
        phase: impl Into<String>,
        key: impl Into<String>,
        payload: serde_json::Value,
    ) -> &mut Self {
        self.actions.push(ScheduledAction {
            phase: phase.into(),
            key: key.into(),
            payload,
        });
        self
    }

    /// Emits an effect with a JSON payload.
    pub fn emit_json(&mut self, key: impl Into<String>, payload: serde_json::Value) -> &mut Self {
        self.effects.push(Effect {
            key: key.into(),
            payload,
        });
        self
    }

    /// The base revision, if set.
    pub fn base_revision(&self) -> Option<u64> {
        self.base_revision
    }

    /// Key updates, in order.
    #[inline]
    pub fn updates(&self) -> &[KeyUpdate] {
        self.updates.as_slice()
    }

    /// Scheduled actions, in order.
    pub fn actions(&self) -> &[ScheduledAction] {
        &self.actions
    }

    /// Effects, in emission order.
    pub fn effects(&self) -> &[Effect] {
        &self.effects
    }

    /// Takes the scheduled actions out of the command (e.g. to turn them into an update of the
    /// phase engine's action queue before committing).
    pub fn take_actions(&mut self) -> Vec<ScheduledAction> {
        std::mem::take(&mut self.actions)
    }

    /// Takes the effects out of the command.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// No updates, actions or effects (a base revision alone does not count).
    pub fn is_empty(&self) -> bool {
        self.updates.is_empty() && self.actions.is_empty() && self.effects.is_empty()
    }

    /// Names of the keys this command writes, each once, sorted.
    pub fn written_keys(&self) -> BTreeSet<&str> {
        self.updates().iter().map(|u| u.key()).collect()
    }

    /// Names of the keys this command writes that `registry` says are exclusive (unregistered
    /// names count as exclusive), each once, sorted.
    pub fn exclusive_keys<'a>(&'a self, registry: &KeyRegistry) -> BTreeSet<&'a str> {
        self.updates()
            .iter()
            .map(|u| u.key())
            .filter(|k| registry.is_exclusive(k))
            .collect()
    }

    /// The first key (in key-name order) that both commands write and that is exclusive, or
    /// `None` if they can be merged. Symmetric: `a.conflict_with(b) == b.conflict_with(a)`.
    /// A key written twice by one command is not a conflict.
    pub fn conflict_with<'a>(
        &'a self,
        other: &StateCommand,
        registry: &KeyRegistry,
    ) -> Option<&'a str> {
        let theirs = other.exclusive_keys(registry);
        if theirs.is_empty() {
            return None;
        }
        self.exclusive_keys(registry)
            .into_iter()
            .find(|k| theirs.contains(k))
    }

    /// Concatenates commands in order, as repeated [`extend`](Self::extend) would, allocating
    /// each list once.
    pub fn concat(commands: Vec<StateCommand>) -> StateCommand {
        let mut out = StateCommand::new();
        out.updates
            .reserve(commands.iter().map(|c| c.updates.len()).sum());
        for c in commands {
            out.base_revision = min_base(out.base_revision, c.base_revision);
            out.updates.extend(c.updates);
            append(&mut out.actions, c.actions);
            append(&mut out.effects, c.effects);
        }
        out
    }

    /// Appends `other` after this command (sequential composition: its updates apply after
    /// ours, its actions and effects follow ours). Never fails. If both have a base revision,
    /// the lower one is kept (the stricter check).
    #[inline]
    pub fn extend(&mut self, other: StateCommand) {
        self.base_revision = min_base(self.base_revision, other.base_revision);
        self.updates.extend(other.updates);
        append(&mut self.actions, other.actions);
        append(&mut self.effects, other.effects);
    }

    /// Merges two commands computed in parallel from one snapshot: `Err(ExclusiveKeyConflict)`
    /// naming the [first conflicting key](Self::conflict_with) if both write one `Exclusive`
    /// key; otherwise `self` then `other`, as [`extend`](Self::extend).
    pub fn merge_parallel(
        mut self,
        other: StateCommand,
        registry: &KeyRegistry,
    ) -> Result<StateCommand, StateError> {
        if let Some(key) = self.conflict_with(&other, registry) {
            return Err(StateError::ExclusiveKeyConflict {
                key: key.to_owned(),
            });
        }
        self.extend(other);
        Ok(self)
    }

    /// The command as JSON (the same form as its `Serialize` impl).
    pub fn to_json(&self) -> Result<serde_json::Value, StateError> {
        serde_json::to_value(self).map_err(|e| StateError::Serialize {
            key: "<command>".to_owned(),
            source: std::sync::Arc::new(e),
        })
    }
}

/// `to.extend(more)`, but taking `more`'s list when `to` is empty (most commands have no actions
/// or effects, so most calls move nothing).
#[inline]
fn append<T>(to: &mut Vec<T>, more: Vec<T>) {
    if to.is_empty() {
        *to = more;
    } else {
        to.extend(more);
    }
}

fn min_base(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl KeyUpdate {
    /// Index of the update's key in `registry`, if the name is registered: the remembered
    /// [`slot`](Self::slot) if the entry there is this key, else looked up by key type (typed
    /// updates: no name hashing) or by name. A typed update of another type than the registered
    /// one gets its name's index (a commit then reports the mismatch).
    #[inline]
    pub(crate) fn locate(&self, registry: &KeyRegistry) -> Option<usize> {
        let key_type = match &self.payload {
            Payload::Typed(typed) => Some(typed.key_type()),
            Payload::Json(_) => None,
        };
        if let Some(entry) = registry.entries().get(self.slot) {
            let same = match key_type {
                Some(key_type) => entry.key_type == key_type,
                None => std::ptr::eq(entry.name, &*self.key) || entry.name == self.key,
            };
            if same {
                return Some(self.slot);
            }
        }
        key_type
            .and_then(|t| registry.index_of_type(t))
            .or_else(|| registry.index_of(&self.key))
    }

    /// The key name.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether the update is typed (else JSON).
    pub fn is_typed(&self) -> bool {
        matches!(self.payload, Payload::Typed(_))
    }

    /// The update as JSON.
    pub fn to_json(&self) -> Result<serde_json::Value, StateError> {
        match &self.payload {
            Payload::Json(v) => Ok(serde_json::Value::clone(v)),
            Payload::Typed(u) => u.to_json().map_err(|e| StateError::Serialize {
                key: self.key.to_string(),
                source: std::sync::Arc::new(e),
            }),
        }
    }
}

impl Clone for KeyUpdate {
    fn clone(&self) -> Self {
        let payload = match &self.payload {
            Payload::Typed(u) => Payload::Typed(u.clone_update()),
            Payload::Json(v) => Payload::Json(v.clone()),
        };
        KeyUpdate {
            key: self.key.clone(),
            payload,
            slot: UNRESOLVED,
        }
    }
}

impl fmt::Debug for KeyUpdate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("KeyUpdate");
        s.field("key", &self.key);
        match &self.payload {
            Payload::Typed(u) => match u.to_json() {
                Ok(json) => s.field("typed", &json),
                Err(_) => s.field("typed", &u.type_name()),
            },
            Payload::Json(v) => s.field("json", v),
        };
        s.finish()
    }
}

impl fmt::Debug for StateCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateCommand")
            .field("base_revision", &self.base_revision)
            .field("updates", &self.updates())
            .field("actions", &self.actions)
            .field("effects", &self.effects)
            .finish()
    }
}

#[derive(Serialize)]
struct KeyUpdateRef<'a> {
    key: &'a str,
    update: serde_json::Value,
}

#[derive(Deserialize)]
struct KeyUpdateOwned {
    key: String,
    update: serde_json::Value,
}

impl Serialize for KeyUpdate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let update = self.to_json().map_err(S::Error::custom)?;
        KeyUpdateRef {
            key: &self.key,
            update,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for KeyUpdate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let KeyUpdateOwned { key, update } = KeyUpdateOwned::deserialize(deserializer)?;
        if key.is_empty() {
            return Err(D::Error::custom("state key name is empty"));
        }
        Ok(KeyUpdate {
            key: Cow::Owned(key),
            payload: Payload::Json(Box::new(update)),
            slot: UNRESOLVED,
        })
    }
}

#[derive(Serialize)]
struct CommandRef<'a> {
    base_revision: Option<u64>,
    updates: &'a [KeyUpdate],
    actions: &'a [ScheduledAction],
    effects: &'a [Effect],
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandOwned {
    #[serde(default)]
    base_revision: Option<u64>,
    #[serde(default)]
    updates: Vec<KeyUpdate>,
    #[serde(default)]
    actions: Vec<ScheduledAction>,
    #[serde(default)]
    effects: Vec<Effect>,
}

impl Serialize for StateCommand {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        CommandRef {
            base_revision: self.base_revision,
            updates: self.updates(),
            actions: &self.actions,
            effects: &self.effects,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for StateCommand {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let c = CommandOwned::deserialize(deserializer)?;
        Ok(StateCommand {
            base_revision: c.base_revision,
            updates: c.updates.into(),
            actions: c.actions,
            effects: c.effects,
        })
    }
}
