//! State keys, their options and the registry that gives each name one type.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::num::NonZeroU32;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::StateError;

/// A typed piece of state, identified by its stable string name [`StateKey::KEY`].
///
/// The reducer [`StateKey::apply`] is the only way a value changes. It is called during a commit
/// on a private copy of the value; returning `Err` (use [`StateError::invalid_update`]) or
/// panicking abandons the whole commit, so a reducer may leave `value` half-changed when it
/// fails. A reducer must be deterministic and do no IO; it may run again when a commit is
/// retried. A key registered as [`MergeStrategy::Commutative`] promises that any order of its
/// updates gives the same value; prove it with `awaken_state::testing::check_commutative`
/// (cargo feature `testing`).
///
/// ```
/// use awaken_state::{StateError, StateKey};
///
/// struct TurnCount;
/// impl StateKey for TurnCount {
///     const KEY: &'static str = "example.turn_count";
///     type Value = u64;
///     type Update = u64;
///     fn apply(value: &mut u64, add: u64) -> Result<(), StateError> {
///         *value = value
///             .checked_add(add)
///             .ok_or_else(|| StateError::invalid_update(Self::KEY, "overflow"))?;
///         Ok(())
///     }
/// }
/// ```
pub trait StateKey: 'static + Send + Sync {
    /// The key's name: its one identity, in commands, exports and errors. Namespace it
    /// (`"plugin_id.what"`) and never change it once values are persisted.
    const KEY: &'static str;
    /// The value; `Default` is the value before any update (and after a reset). Keep `Default`
    /// cheap: every typed update also makes one, as room for the value it will produce. The
    /// value before any update is made once per OS thread and shared by the stores built there,
    /// so `Default` must give the same value every time (no clock, no random id), and a value
    /// must not share inner state that changes (an `Arc<Mutex<_>>`, an atomic) between copies.
    type Value: Clone + Default + Serialize + DeserializeOwned + Send + Sync + 'static;
    /// What a command carries to change the value.
    type Update: Clone + Serialize + DeserializeOwned + Send + Sync + 'static;

    /// Applies one update. Called only inside a commit; see the trait docs for failures.
    fn apply(value: &mut Self::Value, update: Self::Update) -> Result<(), StateError>;

    /// Whether [`apply`](Self::apply) leaves the value exactly as it was when it returns `Err`,
    /// and never panics. A typed update ([`crate::StateStore::update`]) of such a key then
    /// changes the stored value in place when nothing else holds it, instead of a copy that
    /// replaces it (no copy made, none dropped). Default `false`: a reducer may fail half-way.
    ///
    /// A promise the store cannot check: a key that sets it and then fails (or panics)
    /// half-way leaves its stored value half-changed at the same revision, unseen by change
    /// tracking (exports of changed keys, persistence) until the key's next successful write.
    /// Set it only for a reducer that checks before it changes anything.
    const APPLY_IN_PLACE: bool = false;
}

/// Where a key's value lives beyond the process.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum KeyScope {
    /// Never persisted; starts from `Default` in every process.
    Ephemeral,
    /// Persisted with the run, restored when the same run resumes (also in another process).
    #[default]
    Run,
    /// Persisted with the thread, visible to every later run of the thread.
    Thread,
    /// Shared by every thread of one profile (user or tenant).
    Profile,
}

impl KeyScope {
    /// Every scope, in declaration order.
    pub const ALL: [KeyScope; 4] = [
        KeyScope::Ephemeral,
        KeyScope::Run,
        KeyScope::Thread,
        KeyScope::Profile,
    ];
    /// The scopes that are persisted.
    pub const PERSISTED: [KeyScope; 3] = [KeyScope::Run, KeyScope::Thread, KeyScope::Profile];

    /// Whether values of this scope are exported and restored.
    pub fn is_persisted(self) -> bool {
        self != KeyScope::Ephemeral
    }
}

/// How updates of one key from parallel commands combine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeStrategy {
    /// At most one of several parallel commands may write the key; two writers conflict.
    #[default]
    Exclusive,
    /// Updates commute: parallel writers are all applied, in any order, with the same result.
    Commutative,
}

/// A typed key's place in one [`KeyRegistry`], found once by [`KeyRegistry::handle`]: reads
/// and updates through it skip the lookup by type. A handle is checked where it is used, never
/// trusted: used with another registry, where its place holds another key, it reads and writes
/// `K` as [`Snapshot::get`](crate::Snapshot::get) would.
pub struct KeyHandle<K> {
    /// The key's index plus one, so that `Option<KeyHandle<K>>` is as small as the handle.
    slot: NonZeroU32,
    key: PhantomData<fn() -> K>,
}

impl<K> KeyHandle<K> {
    /// The key's index in the registry it came from.
    pub(crate) fn index(self) -> usize {
        self.slot.get() as usize - 1
    }
}

impl<K> Clone for KeyHandle<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for KeyHandle<K> {}

impl<K> PartialEq for KeyHandle<K> {
    fn eq(&self, other: &Self) -> bool {
        self.slot == other.slot
    }
}

impl<K> Eq for KeyHandle<K> {}

impl<K: StateKey> fmt::Debug for KeyHandle<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyHandle({:?} at {})", K::KEY, self.index())
    }
}

/// Options given when a key is registered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyOptions {
    /// Where the value is persisted; default [`KeyScope::Run`].
    pub scope: KeyScope,
    /// How parallel writers combine; default [`MergeStrategy::Exclusive`].
    pub merge: MergeStrategy,
    /// Shown to clients: runs report the key's value in `StateSnapshot` and `StateDelta`
    /// events. Default `false`.
    #[serde(default)]
    pub visible: bool,
}

impl KeyOptions {
    /// Default options: `Run` scope, `Exclusive` merge, not visible.
    pub fn new() -> Self {
        Self::default()
    }

    /// With the given scope.
    pub fn with_scope(mut self, scope: KeyScope) -> Self {
        self.scope = scope;
        self
    }

    /// With the given merge strategy.
    pub fn with_merge(mut self, merge: MergeStrategy) -> Self {
        self.merge = merge;
        self
    }

    /// Shown to clients or not (see [`visible`](Self::visible)).
    pub fn with_visible(mut self, visible: bool) -> Self {
        self.visible = visible;
        self
    }
}

/// What the registry knows about one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyInfo {
    /// The key name.
    pub name: &'static str,
    /// The Rust type implementing [`StateKey`].
    pub type_name: &'static str,
    /// Options given at registration.
    pub options: KeyOptions,
}

/// The set of registered keys: one Rust type per name, in registration order.
///
/// Build it while plugins register, then hand it to [`crate::StateStore::new`], which freezes
/// it. Every registration path ([`register_key`](Self::register_key),
/// [`register_profile_key`](Self::register_profile_key), [`extend`](Self::extend)) rejects a
/// name that is already taken, whatever its type.
#[derive(Clone, Default)]
pub struct KeyRegistry {
    entries: Vec<KeyEntry>,
    /// Index by name; built only past [`SMALL_REGISTRY`] keys (below, a scan of `entries`
    /// finds a key as fast, and a run's registry is a kilobyte smaller).
    by_name: HashMap<&'static str, u32, BuildNameHasher>,
    /// The same indexes by key type: typed reads and updates find their key without hashing
    /// its name (a key type has one name, so its type identifies it). Built with `by_name`.
    by_type: HashMap<TypeId, u32, BuildTypeHasher>,
    /// How many keys are [`KeyOptions::visible`], counted as they are registered.
    visible: u32,
}

/// Up to this many keys, a registry finds a key by scanning its entries.
const SMALL_REGISTRY: usize = 16;

impl KeyRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty registry with room for `keys` keys (registering up to that many never grows
    /// it).
    pub fn with_capacity(keys: usize) -> Self {
        let indexed = if keys > SMALL_REGISTRY { keys } else { 0 };
        Self {
            entries: Vec::with_capacity(keys),
            by_name: HashMap::with_capacity_and_hasher(indexed, BuildNameHasher),
            by_type: HashMap::with_capacity_and_hasher(indexed, BuildTypeHasher),
            visible: 0,
        }
    }

    /// Whether lookups scan the entries (no index built).
    fn is_small(&self) -> bool {
        self.entries.len() <= SMALL_REGISTRY
    }

    /// Registers `K` under `K::KEY` with `options`.
    ///
    /// `Err(StateError::DuplicateKey)` when the name is taken (by `K` or another type); the
    /// registry is then unchanged.
    pub fn register_key<K: StateKey>(&mut self, options: KeyOptions) -> Result<(), StateError> {
        self.insert(KeyEntry::of::<K>(options))
    }

    /// Registers `K` as a [`KeyScope::Profile`] key (merge `Exclusive`).
    pub fn register_profile_key<K: StateKey>(&mut self) -> Result<(), StateError> {
        self.register_key::<K>(KeyOptions::new().with_scope(KeyScope::Profile))
    }

    /// Adds a declared key, moved in: `Err(StateError::DuplicateKey)` when its name is taken
    /// (the registry is then unchanged).
    pub fn add(&mut self, key: KeyDecl) -> Result<(), StateError> {
        self.insert(key.0)
    }

    /// Adds every key of `other` (e.g. another plugin's keys), all or none: if any name of
    /// `other` is already registered here, returns `DuplicateKey` for the first such name in
    /// `other`'s order and changes nothing.
    pub fn extend(&mut self, other: &KeyRegistry) -> Result<(), StateError> {
        for entry in &other.entries {
            if let Some(existing) = self.entry(entry.name) {
                return Err(duplicate(existing, entry));
            }
        }
        for entry in &other.entries {
            self.insert(entry.clone())?;
        }
        Ok(())
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.index_of(name).is_some()
    }

    /// What is known about `name`, if registered.
    pub fn info(&self, name: &str) -> Option<KeyInfo> {
        self.entry(name).map(KeyEntry::info)
    }

    /// Options of `name`, if registered.
    pub fn options(&self, name: &str) -> Option<KeyOptions> {
        self.entry(name).map(|e| e.options)
    }

    /// Every registered key, in registration order.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = KeyInfo> + '_ {
        self.entries.iter().map(KeyEntry::info)
    }

    /// How many keys the registry has room for without growing.
    pub fn capacity(&self) -> usize {
        self.entries.capacity()
    }

    /// Gives back the room made for keys that were not registered (a registry built with
    /// room for an estimate keeps only what it holds).
    pub fn shrink_to_fit(&mut self) {
        self.entries.shrink_to_fit();
        self.by_name.shrink_to_fit();
        self.by_type.shrink_to_fit();
    }

    /// Number of registered keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether some key is [`KeyOptions::visible`]: one stored count, no scan.
    pub fn has_visible_keys(&self) -> bool {
        self.visible > 0
    }

    /// The keys shown to clients ([`KeyOptions::visible`]), in registration order.
    pub fn visible_keys(&self) -> impl Iterator<Item = KeyInfo> + '_ {
        self.entries
            .iter()
            .filter(|e| e.options.visible)
            .map(KeyEntry::info)
    }

    /// Whether a write of `name` conflicts with a parallel write of the same key: true for
    /// `Exclusive` keys and for unregistered names (which a commit rejects anyway).
    pub fn is_exclusive(&self, name: &str) -> bool {
        self.options(name)
            .is_none_or(|o| o.merge == MergeStrategy::Exclusive)
    }

    fn insert(&mut self, entry: KeyEntry) -> Result<(), StateError> {
        if let Some(existing) = self.entry(entry.name) {
            return Err(duplicate(existing, &entry));
        }
        let index = u32::try_from(self.entries.len()).map_err(|_| StateError::InvalidUpdate {
            key: entry.name.to_owned(),
            reason: "too many state keys".to_owned(),
        })?;
        let (name, key_type) = (entry.name, entry.key_type);
        self.visible += u32::from(entry.options.visible);
        self.entries.push(entry);
        if self.entries.len() == SMALL_REGISTRY + 1 {
            // Past the small size: index every key.
            self.by_name.reserve(self.entries.len());
            self.by_type.reserve(self.entries.len());
            for (i, e) in (0u32..).zip(&self.entries) {
                self.by_name.insert(e.name, i);
                self.by_type.insert(e.key_type, i);
            }
        } else if !self.is_small() {
            self.by_name.insert(name, index);
            self.by_type.insert(key_type, index);
        }
        Ok(())
    }

    /// A handle on `K` in this registry, for code that reads or updates `K` often
    /// ([`Snapshot::get_by`](crate::Snapshot::get_by),
    /// [`StateStore::update_by`](crate::StateStore::update_by)); `None` if `K` is not
    /// registered with this type.
    pub fn handle<K: StateKey>(&self) -> Option<KeyHandle<K>> {
        let index = self.index_of_type(TypeId::of::<K>())?;
        let slot = u32::try_from(index + 1).ok().and_then(NonZeroU32::new)?;
        Some(KeyHandle {
            slot,
            key: PhantomData,
        })
    }

    /// Index of `name`, if registered.
    pub(crate) fn index_of(&self, name: &str) -> Option<usize> {
        if self.is_small() {
            self.entries.iter().position(|e| e.name == name)
        } else {
            self.by_name.get(name).map(|&i| i as usize)
        }
    }

    pub(crate) fn entry(&self, name: &str) -> Option<&KeyEntry> {
        self.index_of(name).map(|i| &self.entries[i])
    }

    /// Index and entry of `name`, or `UnknownKey`.
    pub(crate) fn resolve(&self, name: &str) -> Result<(usize, &KeyEntry), StateError> {
        match self.index_of(name) {
            Some(i) => Ok((i, &self.entries[i])),
            None => Err(StateError::UnknownKey {
                key: name.to_owned(),
            }),
        }
    }

    /// Index of `K`, checking that the name is registered with this very type.
    pub(crate) fn resolve_typed<K: StateKey>(&self) -> Result<usize, StateError> {
        if let Some(index) = self.index_of_type(TypeId::of::<K>()) {
            return Ok(index);
        }
        // Not registered with this type: the name tells which error.
        let (_, entry) = self.resolve(K::KEY)?;
        Err(StateError::KeyTypeMismatch {
            key: K::KEY.to_owned(),
            registered_type: entry.type_name,
            used_type: std::any::type_name::<K>(),
        })
    }

    /// Index of the key registered with the `StateKey` type `key_type`, if any.
    pub(crate) fn index_of_type(&self, key_type: TypeId) -> Option<usize> {
        if self.is_small() {
            self.entries.iter().position(|e| e.key_type == key_type)
        } else {
            self.by_type.get(&key_type).map(|&i| i as usize)
        }
    }

    pub(crate) fn entry_at(&self, index: usize) -> &KeyEntry {
        &self.entries[index]
    }

    pub(crate) fn entries(&self) -> &[KeyEntry] {
        &self.entries
    }
}

impl fmt::Debug for KeyRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.keys()).finish()
    }
}

/// FNV-1a over the key name: names are short and chosen by developers, not attackers, and every
/// typed read and every update looks one up, so SipHash's cost buys nothing here.
#[derive(Clone, Copy, Default)]
struct BuildNameHasher;

impl std::hash::BuildHasher for BuildNameHasher {
    type Hasher = NameHasher;
    fn build_hasher(&self) -> NameHasher {
        NameHasher(0xcbf2_9ce4_8422_2325)
    }
}

struct NameHasher(u64);

impl std::hash::Hasher for NameHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// Hashes a `TypeId` by taking the 64 bits it writes as they are: they are a hash already.
#[derive(Clone, Copy, Default)]
struct BuildTypeHasher;

impl std::hash::BuildHasher for BuildTypeHasher {
    type Hasher = TypeHasher;
    fn build_hasher(&self) -> TypeHasher {
        TypeHasher(NameHasher(0xcbf2_9ce4_8422_2325))
    }
}

struct TypeHasher(NameHasher);

impl std::hash::Hasher for TypeHasher {
    fn finish(&self) -> u64 {
        self.0.finish()
    }

    fn write_u64(&mut self, n: u64) {
        self.0.0 ^= n;
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }
}

/// One key as declared, before it joins a registry: what a plugin's registrar collects, for
/// [`KeyRegistry::add`] to move in (no registry of its own per plugin, no copy).
pub struct KeyDecl(KeyEntry);

impl KeyDecl {
    /// `K` under `K::KEY` with `options`.
    pub fn of<K: StateKey>(options: KeyOptions) -> Self {
        Self(KeyEntry::of::<K>(options))
    }

    /// The key's name.
    pub fn name(&self) -> &'static str {
        self.0.name
    }

    /// The key's options.
    pub fn options(&self) -> KeyOptions {
        self.0.options
    }

    /// The error of declaring `other` when this key already has its name.
    pub fn duplicate(&self, other: &KeyDecl) -> StateError {
        duplicate(&self.0, &other.0)
    }
}

impl fmt::Debug for KeyDecl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyDecl")
            .field("name", &self.0.name)
            .field("type", &self.0.type_name)
            .field("options", &self.0.options)
            .finish()
    }
}

fn duplicate(existing: &KeyEntry, new: &KeyEntry) -> StateError {
    StateError::DuplicateKey {
        key: new.name.to_owned(),
        first_type: existing.type_name,
        second_type: new.type_name,
    }
}

// ---------------------------------------------------------------------------------------------
// Type erasure. Values live as `Arc<dyn Any>` holding a `Stored<V, U>`; updates travel as
// `Arc<dyn ErasedUpdate>` holding a `Stored<V, U>` too, so that the allocation made for an update
// becomes the value it produces. The erased code is generic over the value and update types only
// (not over the key type), so many keys with the same types share one copy of it; what depends
// on the key type is one static `KeyMeta` per key.

pub(crate) type AnyValue = dyn Any + Send + Sync;

/// One registered key.
#[derive(Clone)]
pub(crate) struct KeyEntry {
    pub(crate) name: &'static str,
    pub(crate) key_type: TypeId,
    pub(crate) type_name: &'static str,
    pub(crate) options: KeyOptions,
    pub(crate) default: Arc<AnyValue>,
    pub(crate) codec: &'static dyn KeyCodec,
}

impl KeyEntry {
    fn of<K: StateKey>(options: KeyOptions) -> Self {
        KeyEntry {
            name: K::KEY,
            key_type: TypeId::of::<K>(),
            type_name: std::any::type_name::<K>(),
            options,
            default: default_of::<K>(),
            codec: &MetaOf::<K>::CODEC,
        }
    }

    fn info(&self) -> KeyInfo {
        KeyInfo {
            name: self.name,
            type_name: self.type_name,
            options: self.options,
        }
    }
}

thread_local! {
    /// Each key's default value, made once per OS thread and shared by every registry built on
    /// it: a registry is built for every run (its agent is resolved afresh), and a value is
    /// never changed where it is shared (an update of a shared value makes a new one).
    static DEFAULTS: std::cell::RefCell<HashMap<TypeId, Arc<AnyValue>, BuildTypeHasher>> =
        std::cell::RefCell::new(HashMap::with_hasher(BuildTypeHasher));
}

/// `K`'s default value: this OS thread's shared one (a new one while the thread is being torn
/// down).
fn default_of<K: StateKey>() -> Arc<AnyValue> {
    let make = || new_value::<K>(K::Value::default());
    DEFAULTS
        .try_with(|defaults| {
            // (`try_borrow_mut`: a `Default` that registers keys itself gets its own value.)
            match defaults.try_borrow_mut() {
                Ok(mut defaults) => defaults
                    .entry(TypeId::of::<K>())
                    .or_insert_with(make)
                    .clone(),
                Err(_) => make(),
            }
        })
        .unwrap_or_else(|_| make())
}

/// The JSON side of a key: parse updates, read and write values.
pub(crate) trait KeyCodec: Send + Sync {
    fn update_from_json(
        &self,
        key: &str,
        json: serde_json::Value,
    ) -> Result<Arc<dyn ErasedUpdate>, StateError>;
    fn value_to_json(&self, key: &str, value: &AnyValue) -> Result<serde_json::Value, StateError>;
    fn value_to_text(&self, key: &str, value: &AnyValue) -> Result<String, StateError>;
    fn value_from_json(
        &self,
        key: &str,
        json: serde_json::Value,
    ) -> Result<Arc<AnyValue>, StateError>;
}

type Reducer<V, U> = fn(&mut V, U) -> Result<(), StateError>;

/// What the erased code needs to know of a key type: one static per key type.
pub(crate) struct KeyMeta<V, U> {
    key_type: fn() -> TypeId,
    key_type_name: fn() -> &'static str,
    apply: Reducer<V, U>,
}

/// Holds the `KeyMeta` constant of `K`.
struct MetaOf<K>(PhantomData<K>);

impl<K: StateKey> MetaOf<K> {
    const META: KeyMeta<K::Value, K::Update> = KeyMeta {
        key_type: TypeId::of::<K>,
        key_type_name: std::any::type_name::<K>,
        apply: K::apply,
    };
    /// The key's codec, a static too (no allocation per registration).
    const CODEC: Codec<K::Value, K::Update> = Codec { meta: &Self::META };
}

impl<V, U> KeyMeta<V, U> {
    pub(crate) fn of<K: StateKey<Value = V, Update = U>>() -> &'static KeyMeta<V, U> {
        &MetaOf::<K>::META
    }
}

/// How a value of a key with value type `V` and update type `U` is stored, and how a typed
/// update of it travels in a command: one allocation for both.
///
/// An update is a `Stored` whose `update` is set and whose `value` is a placeholder
/// (`V::default()`). A commit that applies it to a value shared with earlier snapshots copies
/// that value into the update's own allocation, runs the reducer there and publishes it: an
/// update costs one allocation, not two (a box for the update, then an `Arc` for the copy). A
/// published value always has `update: None`; the room it keeps for one update is the price.
#[derive(Clone)]
pub(crate) struct Stored<V: 'static, U: 'static> {
    pub(crate) value: V,
    update: Option<U>,
    meta: &'static KeyMeta<V, U>,
}

impl<V: 'static, U: 'static> Stored<V, U> {
    /// A value to publish.
    pub(crate) fn value(value: V, meta: &'static KeyMeta<V, U>) -> Self {
        Stored {
            value,
            update: None,
            meta,
        }
    }
}

impl<V: Default + 'static, U: 'static> Stored<V, U> {
    /// An update, to apply in a commit.
    pub(crate) fn update(update: U, meta: &'static KeyMeta<V, U>) -> Self {
        Stored {
            value: V::default(),
            update: Some(update),
            meta,
        }
    }
}

struct Codec<V: 'static, U: 'static> {
    meta: &'static KeyMeta<V, U>,
}

impl<V, U> KeyCodec for Codec<V, U>
where
    V: Clone + Default + Serialize + DeserializeOwned + Send + Sync + 'static,
    U: Clone + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    fn update_from_json(
        &self,
        key: &str,
        json: serde_json::Value,
    ) -> Result<Arc<dyn ErasedUpdate>, StateError> {
        let update: U =
            serde_json::from_value(json).map_err(|e| StateError::UpdateDeserialize {
                key: key.to_owned(),
                source: Arc::new(e),
            })?;
        Ok(Arc::new(Stored::update(update, self.meta)))
    }

    fn value_to_json(&self, key: &str, value: &AnyValue) -> Result<serde_json::Value, StateError> {
        let stored = downcast::<Stored<V, U>>(key, value)?;
        serde_json::to_value(&stored.value).map_err(|e| StateError::Serialize {
            key: key.to_owned(),
            source: Arc::new(e),
        })
    }

    fn value_to_text(&self, key: &str, value: &AnyValue) -> Result<String, StateError> {
        let stored = downcast::<Stored<V, U>>(key, value)?;
        serde_json::to_string(&stored.value).map_err(|e| StateError::Serialize {
            key: key.to_owned(),
            source: Arc::new(e),
        })
    }

    fn value_from_json(
        &self,
        key: &str,
        json: serde_json::Value,
    ) -> Result<Arc<AnyValue>, StateError> {
        let value: V = serde_json::from_value(json).map_err(|e| StateError::ValueDeserialize {
            key: key.to_owned(),
            source: Arc::new(e),
        })?;
        Ok(Arc::new(Stored::value(value, self.meta)))
    }
}

/// A typed update without its key type in the signature.
pub(crate) trait ErasedUpdate: Send + Sync {
    /// `TypeId` of the `StateKey` type the update was made for.
    fn key_type(&self) -> TypeId;
    /// Name of the `StateKey` type the update was made for (for errors).
    fn type_name(&self) -> &'static str;
    /// Applies the reducer to `value`, held by this commit's private copy of the table: in
    /// place if no snapshot shares the value, else as [`apply_copy`](Self::apply_copy), the
    /// copy replacing `value`. Panics of the reducer come back as `ReducerPanicked`.
    fn apply(self: Arc<Self>, key: &str, value: &mut Arc<AnyValue>) -> Result<(), StateError>;
    /// Applies the reducer to a copy of `current` (a value snapshots share) made in the update's
    /// own allocation, and returns that allocation as the new value.
    fn apply_copy(
        self: Arc<Self>,
        key: &str,
        current: &AnyValue,
    ) -> Result<Arc<AnyValue>, StateError>;
    fn to_json(&self) -> Result<serde_json::Value, serde_json::Error>;
    fn clone_update(&self) -> Arc<dyn ErasedUpdate>;
}

impl<V, U> ErasedUpdate for Stored<V, U>
where
    V: Clone + Default + Send + Sync + 'static,
    U: Clone + Serialize + Send + Sync + 'static,
{
    fn key_type(&self) -> TypeId {
        (self.meta.key_type)()
    }

    fn type_name(&self) -> &'static str {
        (self.meta.key_type_name)()
    }

    fn apply(self: Arc<Self>, key: &str, value: &mut Arc<AnyValue>) -> Result<(), StateError> {
        // The count, a plain load, spares the usual case (a value shared with snapshots)
        // `get_mut`'s atomic exchange.
        if Arc::strong_count(value) == 1
            && let Some(current) = Arc::get_mut(value)
        {
            let Some(current) = current.downcast_mut::<Stored<V, U>>() else {
                return Err(mismatch::<V>(key));
            };
            let reducer = self.meta.apply;
            let update = Arc::unwrap_or_clone(self).update;
            return reduce(reducer, key, &mut current.value, update);
        }
        *value = self.apply_copy(key, &**value)?;
        Ok(())
    }

    fn apply_copy(
        self: Arc<Self>,
        key: &str,
        current: &AnyValue,
    ) -> Result<Arc<AnyValue>, StateError> {
        let mut cell = self;
        // Unique: a command's update is never shared (cloning a command copies it).
        let this = Arc::make_mut(&mut cell);
        let update = this.update.take();
        this.value
            .clone_from(&downcast::<Stored<V, U>>(key, current)?.value);
        reduce(this.meta.apply, key, &mut this.value, update)?;
        Ok(cell)
    }

    fn to_json(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::to_value(&self.update)
    }

    fn clone_update(&self) -> Arc<dyn ErasedUpdate> {
        Arc::new(Stored {
            value: V::default(),
            update: self.update.clone(),
            meta: self.meta,
        })
    }
}

/// Runs `reducer`; a panic comes back as `ReducerPanicked`, a missing update (one applied
/// already) as `InvalidUpdate`.
fn reduce<V, U>(
    reducer: Reducer<V, U>,
    key: &str,
    target: &mut V,
    update: Option<U>,
) -> Result<(), StateError> {
    let Some(update) = update else {
        return Err(StateError::InvalidUpdate {
            key: key.to_owned(),
            reason: "the update was already applied".to_owned(),
        });
    };
    match catch_unwind(AssertUnwindSafe(|| reducer(target, update))) {
        Ok(result) => result,
        Err(payload) => Err(StateError::ReducerPanicked {
            key: key.to_owned(),
            message: panic_message(payload.as_ref()),
        }),
    }
}

/// `current` (a value of `K`) with `update` applied, as the value to publish; `current` is
/// not changed (a failing or panicking reducer leaves nothing changed).
pub(crate) fn updated<K: StateKey>(
    current: &AnyValue,
    update: K::Update,
) -> Result<K::Value, StateError> {
    let meta = KeyMeta::of::<K>();
    let mut value = downcast::<Stored<K::Value, K::Update>>(K::KEY, current)?
        .value
        .clone();
    reduce(meta.apply, K::KEY, &mut value, Some(update))?;
    Ok(value)
}

/// Applies `update` to the stored value itself (a key whose reducer leaves the value as it was
/// when it fails: [`StateKey::APPLY_IN_PLACE`]).
pub(crate) fn apply_to<K: StateKey>(
    stored: &mut Stored<K::Value, K::Update>,
    update: K::Update,
) -> Result<(), StateError> {
    reduce(stored.meta.apply, K::KEY, &mut stored.value, Some(update))?;
    stored.update = None;
    Ok(())
}

/// Publishes `value` (of `K`) in `slot`: into the value the slot holds when nothing else
/// shares it (no allocation), else as a new one.
pub(crate) fn put_value<K: StateKey>(slot: &mut Arc<AnyValue>, value: K::Value) {
    match Arc::get_mut(slot).and_then(|v| v.downcast_mut::<Stored<K::Value, K::Update>>()) {
        Some(stored) => {
            stored.value = value;
            stored.update = None;
        }
        None => *slot = new_value::<K>(value),
    }
}

/// `value` (of `K`) as a new stored value, for a slot whose value something else shares.
pub(crate) fn new_value<K: StateKey>(value: K::Value) -> Arc<AnyValue> {
    Arc::new(Stored::value(value, KeyMeta::of::<K>()))
}

pub(crate) fn downcast<'a, V: 'static>(
    key: &str,
    value: &'a AnyValue,
) -> Result<&'a V, StateError> {
    value.downcast_ref::<V>().ok_or_else(|| mismatch::<V>(key))
}

fn mismatch<V>(key: &str) -> StateError {
    StateError::KeyTypeMismatch {
        key: key.to_owned(),
        registered_type: "another value type",
        used_type: std::any::type_name::<V>(),
    }
}

/// The message of a caught panic's payload (a `&str` or a `String`), for the typed error that
/// reports it; shared by the crates that catch panics of user code.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
