//! `StateStore`: the one place state changes, through validated commits.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use crate::command::{Effect, KeyUpdate, Payload, ScheduledAction, StateCommand, Updates};
use crate::error::StateError;
use crate::exported::PersistedState;
use crate::key::{KeyEntry, KeyHandle, KeyRegistry, KeyScope, StateKey};
use crate::snapshot::{Snapshot, Version};
use crate::table::{SlotValue, Table};

/// Holds the current [`Snapshot`] and publishes new ones through commits.
///
/// Readers take snapshots at any time from any thread ([`snapshot`](Self::snapshot), O(1)).
/// Writers are serialized: a commit validates the whole command, applies it to a private copy
/// of the changed table paths and swaps the result in, so a failing commit (unknown key, type
/// mismatch, stale base revision, a reducer that fails or panics) leaves the store and its
/// revision exactly as they were. The revision moves by one per non-empty commit.
///
/// Commit observers ([`subscribe`](Self::subscribe)) are called after the swap, outside every
/// lock of the store, on the committing thread; they may read and even commit. When several
/// threads commit at once, observers may run concurrently and not in revision order; each call
/// carries its own revision and snapshot.
pub struct StateStore {
    registry: Arc<KeyRegistry>,
    /// What readers see. Replaced, under the `writer` lock, by every publishing commit; changed
    /// in place, under its own write lock, by a one-key commit or a typed update when no
    /// snapshot of it is held outside the store (see [`commit`](Self::commit)). A publishing
    /// writer holds a snapshot of the version it replaces until it has published, so nothing
    /// changes that version in place meanwhile.
    current: RwLock<Snapshot>,
    /// `current`'s revision, stored (under `current`'s write lock) by every write that changes
    /// it: [`revision`](Self::revision) reads it without taking a lock.
    published: AtomicU64,
    /// Serializes the writers of commands, transactions and restores (a typed update in place
    /// takes `current`'s write lock only). It holds no version: the store's own is then the
    /// only one when no snapshot is held elsewhere, which lets a commit change it in place.
    writer: Mutex<()>,
    observers: RwLock<Observers>,
    /// Number of subscribed observers, so a commit with none skips their lock.
    observer_count: AtomicUsize,
    next_observer: AtomicU64,
    /// The scope whose updates are journaled (as JSON, in commit order), when one is.
    journal_scope: Option<KeyScope>,
    journal: Mutex<Vec<(String, serde_json::Value)>>,
}

/// The subscribed observers; replaced (never mutated) so a commit can iterate a copy lock-free.
type Observers = Arc<Vec<(ObserverId, Arc<dyn CommitObserver>)>>;

/// What a successful commit published.
#[derive(Debug, Clone)]
pub struct Committed {
    /// The store's revision after the commit (unchanged for an empty command).
    pub revision: u64,
    /// The state at `revision`.
    pub snapshot: Snapshot,
    /// The committed command's scheduled actions, in order.
    pub actions: Vec<ScheduledAction>,
    /// The committed command's effects, in emission order (dispatch them against `snapshot`).
    pub effects: Vec<Effect>,
}

/// Called after every non-empty commit (see [`StateStore`] for threading). Must not panic: a
/// panic propagates to the committing caller after the commit is already published.
pub trait CommitObserver: Send + Sync {
    /// A commit was published.
    fn on_commit(&self, committed: &Committed);
}

impl<F: Fn(&Committed) + Send + Sync> CommitObserver for F {
    fn on_commit(&self, committed: &Committed) {
        self(committed)
    }
}

/// Identifies a subscription, to [`StateStore::unsubscribe`] it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObserverId(u64);

/// What [`StateStore::restore`] does with a key name that is not registered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UnknownKeyPolicy {
    /// Fail with `UnknownKey`; nothing is restored.
    #[default]
    Reject,
    /// Skip the key (it is listed in [`Restored::skipped`]) and restore the others.
    Skip,
}

/// The outcome of a restore.
#[derive(Debug, Clone)]
pub struct Restored {
    /// The store's revision after the restore (unchanged if nothing was restored).
    pub revision: u64,
    /// Names of the restored keys, sorted.
    pub restored: Vec<String>,
    /// Names skipped under [`UnknownKeyPolicy::Skip`], sorted.
    pub skipped: Vec<String>,
}

/// A writer's view: the writer lock and the current state.
struct Head<'a> {
    snapshot: Snapshot,
    _writer: MutexGuard<'a, ()>,
}

impl std::ops::Deref for Head<'_> {
    type Target = Snapshot;
    fn deref(&self) -> &Snapshot {
        &self.snapshot
    }
}

impl std::ops::DerefMut for Head<'_> {
    fn deref_mut(&mut self) -> &mut Snapshot {
        &mut self.snapshot
    }
}

/// Whether [`StateStore::commit_in_place`] committed.
enum InPlace {
    Done(Committed),
    No(StateCommand),
}

/// Several commands applied one after another to staged state, published as one commit.
///
/// Made by [`StateStore::transaction`]. Each [`apply`](Self::apply) is atomic: if it fails, the
/// transaction is as before it. [`snapshot`](Self::snapshot) shows the staged state, so work
/// can run on top of what is already staged (the phase engine re-runs deferred hooks this
/// way). [`commit`](Self::commit) publishes everything as one revision, or fails with
/// `StaleRevision` if another commit was published since the transaction began. Dropping the
/// transaction discards it.
pub struct Transaction<'s> {
    store: &'s StateStore,
    base: Snapshot,
    staged: Table,
    changed: bool,
    actions: Vec<ScheduledAction>,
    effects: Vec<Effect>,
    /// Journaled updates of the applied commands, handed to the store at publication.
    journaled: Vec<(String, serde_json::Value)>,
}

impl StateStore {
    /// A store over `registry` (frozen from now on), every key at its default, revision 0.
    /// A shared registry (`Arc<KeyRegistry>`) is used as it is: stores over the same keys
    /// need no copy each.
    pub fn new(registry: impl Into<Arc<KeyRegistry>>) -> Self {
        let registry: Arc<KeyRegistry> = registry.into();
        let defaults: Vec<_> = registry
            .entries()
            .iter()
            .map(|e| e.default.clone())
            .collect();
        let snapshot = Snapshot::new(Version {
            revision: 0,
            staged: false,
            table: Table::build(&defaults),
            registry: registry.clone(),
        });
        StateStore {
            registry,
            current: RwLock::new(snapshot.clone()),
            published: AtomicU64::new(0),
            writer: Mutex::new(()),
            observers: RwLock::new(Arc::new(Vec::new())),
            observer_count: AtomicUsize::new(0),
            next_observer: AtomicU64::new(0),
            journal_scope: None,
            journal: Mutex::new(Vec::new()),
        }
    }

    /// A store that also journals every committed update of a key of `scope`, as JSON in
    /// commit order, so they can be applied again to other values (profile keys: a write
    /// refused because another thread changed the key is redone on the fresh value).
    pub fn with_journal(registry: impl Into<Arc<KeyRegistry>>, scope: KeyScope) -> Self {
        Self {
            journal_scope: Some(scope),
            ..Self::new(registry)
        }
    }

    /// Takes the journaled updates (key name, update JSON) committed since the last take.
    pub fn take_journal(&self) -> Vec<(String, serde_json::Value)> {
        std::mem::take(&mut *self.journal.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn append_journal(&self, entries: Vec<(String, serde_json::Value)>) {
        if !entries.is_empty() {
            self.journal
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(entries);
        }
    }

    /// The registered keys.
    pub fn registry(&self) -> &KeyRegistry {
        &self.registry
    }

    /// The current state. O(1).
    pub fn snapshot(&self) -> Snapshot {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Calls `f` with the current state, without taking a [`snapshot`](Self::snapshot) (no
    /// shared count changes hands). Commits wait while `f` runs: keep it short, and never
    /// commit to this store from it (that would wait for itself).
    #[inline]
    pub fn read<T>(&self, f: impl FnOnce(&Snapshot) -> T) -> T {
        f(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The current revision, read without a lock (every change of the state advances it). A
    /// call racing a commit on another thread sees the revision before or after it; once a
    /// commit has returned, or a snapshot shows its change, this shows its revision too.
    pub fn revision(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }

    /// Validates and applies `command` as one commit.
    ///
    /// Checks, before anything is published: the base revision (if set) is the current one;
    /// every updated key is registered with the type used; JSON updates parse; every reducer
    /// succeeds without panicking. On any failure the store is unchanged. An empty command
    /// (no updates, actions or effects) publishes nothing and keeps the revision.
    ///
    /// A command of one key update (the run's statistics, several times a step) is applied in
    /// place, without copying a table path or allocating a version, when no snapshot of the
    /// current state is held outside the store: then nobody can see the change but through the
    /// store, which is what a commit means. The new value is computed first and put in only if
    /// its reducer succeeds, so a failure still changes nothing. Readers on other threads wait
    /// for the reducer meanwhile.
    pub fn commit(&self, command: StateCommand) -> Result<Committed, StateError> {
        let writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let command = match self.commit_in_place(command)? {
            InPlace::Done(committed) => {
                drop(writer);
                self.notify(&committed);
                return Ok(committed);
            }
            InPlace::No(command) => command,
        };
        let mut head = self.head(writer);
        check_base(command.base_revision, head.revision())?;
        if command.is_empty() {
            return Ok(Committed {
                revision: head.revision(),
                snapshot: head.clone(),
                actions: Vec::new(),
                effects: Vec::new(),
            });
        }
        let revision = head.revision() + 1;
        let mut table = head.version.table.clone();
        let mut journaled = Vec::new();
        let journal = self.journal_scope.map(|scope| (scope, &mut journaled));
        apply_updates(
            &self.registry,
            &mut table,
            command.updates,
            revision,
            journal,
        )?;
        let committed = Committed {
            revision,
            snapshot: self.publish(&mut head, revision, table),
            actions: command.actions,
            effects: command.effects,
        };
        self.append_journal(journaled);
        drop(head);
        self.notify(&committed);
        Ok(committed)
    }

    /// [`update`](Self::update) through a handle found once ([`KeyRegistry::handle`]): no
    /// search. A handle whose place holds another key is not trusted.
    pub fn update_by<K: StateKey>(
        &self,
        key: KeyHandle<K>,
        update: K::Update,
    ) -> Result<u64, StateError> {
        self.update_at::<K>(Some(key.index()), update)
    }

    /// Commits one typed update of `K`, as [`commit`](Self::commit) commits a command of that
    /// one update (the reducer's result checked before anything changes — for a key with
    /// [`StateKey::APPLY_IN_PLACE`], by the key's promise that a failing reducer changes
    /// nothing —, a new revision, seen by every later snapshot, observers notified), without
    /// building a command: for a caller that updates a key of its own often (the run's
    /// statistics, several times a step; [`update_by`](Self::update_by) skips the lookup). A
    /// journaled key, a key not registered as `K`, or a current state that a snapshot outside
    /// the store holds takes the command path (and its errors). Returns the new revision.
    pub fn update<K: StateKey>(&self, update: K::Update) -> Result<u64, StateError> {
        self.update_at::<K>(None, update)
    }

    /// [`update`](Self::update) at `at`, `K`'s position when known (a wrong one is not
    /// trusted).
    fn update_at<K: StateKey>(
        &self,
        at: Option<usize>,
        update: K::Update,
    ) -> Result<u64, StateError> {
        let index = at
            .filter(|&i| {
                self.registry
                    .entries()
                    .get(i)
                    .is_some_and(|e| e.key_type == std::any::TypeId::of::<K>())
            })
            .or_else(|| self.registry.index_of_type(std::any::TypeId::of::<K>()))
            .filter(|&i| {
                self.journal_scope
                    .is_none_or(|scope| self.registry.entries()[i].options.scope != scope)
            });
        if let Some(index) = index {
            // `current`'s write lock alone (not the writer lock): a writer that builds a new
            // version holds a snapshot of the one it replaces until it publishes, so the
            // version is not this store's alone meanwhile and is not changed in place here.
            let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
            if let Some(version) = Arc::get_mut(&mut current.version) {
                if K::APPLY_IN_PLACE {
                    apply_in_place::<K>(version, index, update)?;
                } else {
                    put_in_place(
                        version,
                        index,
                        K::KEY,
                        |current| crate::key::updated::<K>(current, update),
                        crate::key::put_value::<K>,
                    )?;
                }
                let revision = version.revision;
                self.published.store(revision, Ordering::Release);
                // Observers are told as for a command, after the locks are released.
                let committed =
                    (self.observer_count.load(Ordering::Acquire) > 0).then(|| Committed {
                        revision,
                        snapshot: current.clone(),
                        actions: Vec::new(),
                        effects: Vec::new(),
                    });
                drop(current);
                if let Some(committed) = committed {
                    self.notify(&committed);
                }
                return Ok(revision);
            }
            drop(current);
        }
        Ok(self
            .commit(StateCommand::new().with_update::<K>(update))?
            .revision)
    }

    /// Starts a transaction on the current state.
    pub fn transaction(&self) -> Transaction<'_> {
        let base = self.snapshot();
        Transaction {
            store: self,
            staged: base.version.table.clone(),
            base,
            changed: false,
            actions: Vec::new(),
            effects: Vec::new(),
            journaled: Vec::new(),
        }
    }

    /// Sets the persisted keys in `state` to its values, all or none, as one commit.
    ///
    /// Every value is parsed before anything changes. Errors: `UnknownKey` for a name that is
    /// not registered (unless `policy` is [`UnknownKeyPolicy::Skip`]), `NotPersisted` for an
    /// ephemeral key, `ValueDeserialize` for a value of the wrong shape. Keys not named in
    /// `state` keep their values. Restored keys count as changed at the new revision.
    pub fn restore(
        &self,
        state: &PersistedState,
        policy: UnknownKeyPolicy,
    ) -> Result<Restored, StateError> {
        let mut parsed = Vec::with_capacity(state.values.len());
        let mut skipped = Vec::new();
        for (name, json) in &state.values {
            let (index, entry) = match self.registry.resolve(name) {
                Ok(found) => found,
                Err(_) if policy == UnknownKeyPolicy::Skip => {
                    skipped.push(name.clone());
                    continue;
                }
                Err(e) => return Err(e),
            };
            if !entry.options.scope.is_persisted() {
                return Err(StateError::NotPersisted { key: name.clone() });
            }
            parsed.push((
                index,
                entry.codec.value_from_json(entry.name, json.clone())?,
            ));
        }
        let restored: Vec<String> = parsed
            .iter()
            .map(|(i, _)| self.registry.entry_at(*i).name.to_owned())
            .collect();
        let mut head = self.lock_writer();
        if parsed.is_empty() {
            return Ok(Restored {
                revision: head.revision(),
                restored,
                skipped,
            });
        }
        let revision = head.revision() + 1;
        let mut table = head.version.table.clone();
        for (index, value) in parsed {
            let slot = table
                .slot_mut(index, revision)
                .ok_or_else(|| StateError::UnknownKey {
                    key: self.registry.entry_at(index).name.to_owned(),
                })?;
            slot.value = value;
            slot.changed_at = revision;
        }
        let committed = Committed {
            revision,
            snapshot: self.publish(&mut head, revision, table),
            actions: Vec::new(),
            effects: Vec::new(),
        };
        drop(head);
        self.notify(&committed);
        Ok(Restored {
            revision,
            restored,
            skipped,
        })
    }

    /// Calls `observer` after every later non-empty commit.
    pub fn subscribe(&self, observer: impl CommitObserver + 'static) -> ObserverId {
        let id = ObserverId(self.next_observer.fetch_add(1, Ordering::Relaxed));
        let mut observers = self
            .observers
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let mut list = Vec::clone(&observers);
        list.push((id, Arc::new(observer)));
        self.observer_count.store(list.len(), Ordering::Release);
        *observers = Arc::new(list);
        id
    }

    /// Removes a subscription; `false` if it was not there.
    pub fn unsubscribe(&self, id: ObserverId) -> bool {
        let mut observers = self
            .observers
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let mut list = Vec::clone(&observers);
        let before = list.len();
        list.retain(|(i, _)| *i != id);
        let removed = list.len() != before;
        self.observer_count.store(list.len(), Ordering::Release);
        *observers = Arc::new(list);
        removed
    }

    fn lock_writer(&self) -> Head<'_> {
        self.head(self.writer.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The current state for a writer holding `writer` (no other commit can publish meanwhile).
    fn head<'a>(&'a self, writer: MutexGuard<'a, ()>) -> Head<'a> {
        Head {
            snapshot: self.snapshot(),
            _writer: writer,
        }
    }

    /// [`commit`](Self::commit)'s path for a one-key command when the store's version is not
    /// shared; the command back otherwise. The caller holds the writer lock.
    fn commit_in_place(&self, mut command: StateCommand) -> Result<InPlace, StateError> {
        if command.updates.len() != 1 || self.journal_scope.is_some() {
            return Ok(InPlace::No(command));
        }
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let Some(version) = Arc::get_mut(&mut current.version) else {
            return Ok(InPlace::No(command));
        };
        check_base(command.base_revision, version.revision)?;
        let revision = version.revision + 1;
        let Some(mut update) = std::mem::take(&mut command.updates).into_iter().next() else {
            unreachable!("one update, counted above")
        };
        let entry = locate(&self.registry, &mut update)?;
        make_typed(entry, &mut update)?;
        let (index, Payload::Typed(typed)) = (update.slot, update.payload) else {
            unreachable!("made typed just above")
        };
        put_in_place(
            version,
            index,
            entry.name,
            |current| typed.apply_copy(entry.name, current),
            |slot, value| *slot = value,
        )?;
        self.published.store(revision, Ordering::Release);
        Ok(InPlace::Done(Committed {
            revision,
            snapshot: current.clone(),
            actions: command.actions,
            effects: command.effects,
        }))
    }

    /// Swaps in a new version as the head and for readers.
    fn publish(&self, head: &mut Snapshot, revision: u64, table: Table) -> Snapshot {
        let snapshot = Snapshot::new(Version {
            revision,
            staged: false,
            table,
            registry: self.registry.clone(),
        });
        let old = {
            let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
            self.published.store(revision, Ordering::Release);
            std::mem::replace(&mut *current, snapshot.clone())
        };
        drop(old); // outside the read/write lock: freeing old nodes must not block readers
        *head = snapshot.clone();
        snapshot
    }

    fn notify(&self, committed: &Committed) {
        if self.observer_count.load(Ordering::Acquire) == 0 {
            return;
        }
        let observers = self
            .observers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for (_, observer) in observers.iter() {
            observer.on_commit(committed);
        }
    }
}

/// Replaces the value at `index` of a version no one else holds with what `make` makes of the
/// current one (`put` puts it into the slot), at the next revision: the new value first, the
/// table changes only after (a failure changes nothing).
fn put_in_place<N>(
    version: &mut Version,
    index: usize,
    name: &str,
    make: impl FnOnce(&crate::key::AnyValue) -> Result<N, StateError>,
    put: impl FnOnce(&mut Arc<crate::key::AnyValue>, N),
) -> Result<(), StateError> {
    let unknown = || StateError::UnknownKey {
        key: name.to_owned(),
    };
    let revision = version.revision + 1;
    let value = {
        let slot = version.table.get(index).ok_or_else(unknown)?;
        make(&*slot.value)?
    };
    let slot = version
        .table
        .slot_mut(index, revision)
        .ok_or_else(unknown)?;
    put(&mut slot.value, value);
    slot.changed_at = revision;
    version.revision = revision;
    Ok(())
}

/// Applies `update` of a key whose reducer changes nothing when it fails
/// ([`StateKey::APPLY_IN_PLACE`]) in a version no one else holds: to the stored value itself
/// when no snapshot shares it (no copy made, none dropped), else to a copy put in its place.
/// A failure leaves the value and the revision as they were (the path to the slot may have
/// been made private, which changes no value).
fn apply_in_place<K: StateKey>(
    version: &mut Version,
    index: usize,
    update: K::Update,
) -> Result<(), StateError> {
    let revision = version.revision + 1;
    let slot = version
        .table
        .slot_mut(index, revision)
        .ok_or_else(|| StateError::UnknownKey {
            key: K::KEY.to_owned(),
        })?;
    match Arc::get_mut(&mut slot.value)
        .and_then(|v| v.downcast_mut::<crate::key::Stored<K::Value, K::Update>>())
    {
        Some(stored) => {
            crate::key::apply_to::<K>(stored, update)?;
        }
        // Shared (a snapshot or an export holds it): a new value, the shared one left as it is
        // (known to be shared: not asked again).
        None => {
            let value = crate::key::updated::<K>(&*slot.value, update)?;
            slot.value = crate::key::new_value::<K>(value);
        }
    }
    slot.changed_at = revision;
    version.revision = revision;
    Ok(())
}

impl fmt::Debug for StateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateStore")
            .field("revision", &self.revision())
            .field("keys", &self.registry.len())
            .finish()
    }
}

impl Transaction<'_> {
    /// The revision the transaction started from.
    pub fn base_revision(&self) -> u64 {
        self.base.revision()
    }

    /// The staged state: the base plus every command applied so far. Its
    /// [`revision`](Snapshot::revision) is the base revision and
    /// [`is_staged`](Snapshot::is_staged) is true.
    pub fn snapshot(&self) -> Snapshot {
        if !self.changed {
            return self.base.clone();
        }
        Snapshot::new(Version {
            revision: self.base.revision(),
            staged: true,
            table: self.staged.clone(),
            registry: self.store.registry.clone(),
        })
    }

    /// Applies `command` to the staged state, validating it as [`StateStore::commit`] does (a
    /// base revision must equal [`base_revision`](Self::base_revision)). On `Err` the
    /// transaction is unchanged.
    pub fn apply(&mut self, command: StateCommand) -> Result<(), StateError> {
        check_base(command.base_revision, self.base.revision())?;
        if !command.updates.is_empty() {
            let registry = &self.store.registry;
            let revision = self.base.revision() + 1;
            let mut journaled = Vec::new();
            let journal = self
                .store
                .journal_scope
                .map(|scope| (scope, &mut journaled));
            if self.changed {
                let mut table = self.staged.clone();
                apply_updates(registry, &mut table, command.updates, revision, journal)?;
                self.staged = table;
            } else if let Err(e) = apply_updates(
                registry,
                &mut self.staged,
                command.updates,
                revision,
                journal,
            ) {
                // Nothing was staged: the table is the base's, shared, so the writes copied
                // what they changed; going back to the base undoes them.
                self.staged = self.base.version.table.clone();
                return Err(e);
            }
            self.changed = true;
            self.journaled.extend(journaled);
        }
        self.actions.extend(command.actions);
        self.effects.extend(command.effects);
        Ok(())
    }

    /// Whether nothing (no update, action or effect) has been applied.
    pub fn is_empty(&self) -> bool {
        !self.changed && self.actions.is_empty() && self.effects.is_empty()
    }

    /// Publishes everything applied as one commit (revision + 1), with the actions and effects
    /// of all applied commands in order. `Err(StaleRevision)` if the store moved since the
    /// transaction began; the store is then unchanged. An empty transaction publishes nothing.
    pub fn commit(self) -> Result<Committed, StateError> {
        let store = self.store;
        let mut head = store.lock_writer();
        let actual = head.revision();
        if actual != self.base.revision() {
            return Err(StateError::StaleRevision {
                expected: self.base.revision(),
                actual,
            });
        }
        if self.is_empty() {
            return Ok(Committed {
                revision: actual,
                snapshot: self.base,
                actions: Vec::new(),
                effects: Vec::new(),
            });
        }
        let revision = actual + 1;
        let committed = Committed {
            revision,
            snapshot: store.publish(&mut head, revision, self.staged),
            actions: self.actions,
            effects: self.effects,
        };
        store.append_journal(self.journaled);
        drop(head);
        store.notify(&committed);
        Ok(committed)
    }
}

impl fmt::Debug for Transaction<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transaction")
            .field("base_revision", &self.base.revision())
            .field("changed", &self.changed)
            .field("actions", &self.actions.len())
            .field("effects", &self.effects.len())
            .finish()
    }
}

fn check_base(base: Option<u64>, actual: u64) -> Result<(), StateError> {
    match base {
        Some(expected) if expected != actual => Err(StateError::StaleRevision { expected, actual }),
        _ => Ok(()),
    }
}

/// The registered key `update` writes, its index remembered in `update.slot` (`UnknownKey`).
fn locate<'r>(
    registry: &'r KeyRegistry,
    update: &mut KeyUpdate,
) -> Result<&'r KeyEntry, StateError> {
    let (index, entry) = match update.locate(registry) {
        Some(index) => (index, registry.entry_at(index)),
        None => registry.resolve(&update.key)?,
    };
    update.slot = index;
    Ok(entry)
}

/// Makes `update`'s payload typed for `entry`: a typed update must be of the key's type
/// (`KeyTypeMismatch`), a JSON one must parse as its `Update`.
fn make_typed(entry: &KeyEntry, update: &mut KeyUpdate) -> Result<(), StateError> {
    match &mut update.payload {
        Payload::Typed(typed) => {
            if typed.key_type() != entry.key_type {
                return Err(StateError::KeyTypeMismatch {
                    key: entry.name.to_owned(),
                    registered_type: entry.type_name,
                    used_type: typed.type_name(),
                });
            }
        }
        Payload::Json(json) => {
            let typed = entry.codec.update_from_json(entry.name, json.take())?;
            update.payload = Payload::Typed(typed);
        }
    }
    Ok(())
}

/// Validates every update (key registered, type matches, JSON parses), then runs the reducers on
/// `table`, marking written slots with `revision`. On `Err`, `table` is half-written and must be
/// discarded by the caller.
fn apply_updates(
    registry: &KeyRegistry,
    table: &mut Table,
    mut updates: Updates,
    revision: u64,
    mut journal: Option<(KeyScope, &mut Vec<(String, serde_json::Value)>)>,
) -> Result<(), StateError> {
    for update in updates.as_mut_slice() {
        let entry = locate(registry, update)?;
        if let Some((scope, entries)) = journal.as_mut()
            && entry.options.scope == *scope
        {
            let json = match &update.payload {
                Payload::Typed(typed) => typed.to_json().map_err(|e| StateError::Serialize {
                    key: entry.name.to_owned(),
                    source: Arc::new(e),
                })?,
                Payload::Json(json) => (**json).clone(),
            };
            entries.push((entry.name.to_owned(), json));
        }
        make_typed(entry, update)?;
    }
    table.write_each(
        revision,
        updates,
        |update| update.slot,
        |update, value| {
            let Payload::Typed(typed) = update.payload else {
                unreachable!("every payload was made typed above")
            };
            match value {
                Some(SlotValue::Private(value)) => typed.apply(&update.key, value).map(|()| None),
                Some(SlotValue::Shared(current)) => {
                    typed.apply_copy(&update.key, &**current).map(Some)
                }
                None => Err(StateError::UnknownKey {
                    key: update.key.to_string(),
                }),
            }
        },
    )
}
