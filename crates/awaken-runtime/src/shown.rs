//! The state a run shows its clients: the values of the agent's visible keys
//! ([`KeyOptions::visible`](awaken_state::KeyOptions::visible)) in a `StateSnapshot` right after
//! the activation's `RunStart`, then a `StateDelta` after each commit that changed one of them.
//!
//! A commit observer on the run's state store sees every published commit (hooks, actions,
//! tools, restores), wherever it was made, and queues the changed values; the run emits the
//! queue on its own task before its next event (`run::visible`). An agent without a visible
//! key has no observer at all: its commits skip the store's observer list (one atomic load they
//! already do) and nothing is serialized.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use awaken_event::{AgentEvent, EventSink, WarningKind};
use awaken_state::{CommitObserver, Committed, KeyRegistry, ObserverId, StateError, StateStore};
use serde_json::{Map, Value};

use crate::durable::Durable;

/// A run's watch over its visible keys, and its subscription once the snapshot is taken.
pub(crate) struct Visible {
    pub(crate) watch: Arc<StateWatch>,
    pub(crate) subscription: Option<ObserverId>,
}

impl Visible {
    /// The watch over `registry`'s visible keys; `None` when it has none.
    pub(crate) fn of(registry: &KeyRegistry) -> Option<Box<Visible>> {
        if !registry.has_visible_keys() {
            return None;
        }
        Some(Box::new(Visible {
            watch: Arc::new(StateWatch {
                keys: registry.visible_keys().map(|k| k.name).collect(),
                pending: Mutex::default(),
            }),
            subscription: None,
        }))
    }

    /// Emits what commits changed in the visible keys since the last call: a warning per
    /// value that could not be serialized (noted in `durable`), then the `StateDelta`s.
    pub(crate) fn emit_changes(&self, sink: &dyn EventSink, durable: &mut Durable) {
        for e in self.watch.take_failures() {
            durable.note(unshown(&e), sink);
        }
        self.watch.emit_deltas(sink);
    }
}

/// The visible keys' names and what the commits since the last emission changed.
pub(crate) struct StateWatch {
    /// The visible keys, in registration order.
    keys: Vec<&'static str>,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    /// Whether the snapshot was taken: earlier commits are in it.
    started: bool,
    /// The last revision whose changes are queued or emitted.
    reported: u64,
    /// Changed values per commit, in revision order, not yet emitted.
    deltas: Vec<(u64, Map<String, Value>)>,
    /// Values that could not be serialized, not yet reported.
    failures: Vec<StateError>,
}

impl StateWatch {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the state now as the activation's snapshot: its revision, every visible value
    /// and the values that could not be serialized. Later commits are queued from here on.
    pub(crate) fn start(&self, store: &StateStore) -> (u64, Map<String, Value>, Vec<StateError>) {
        // Under the lock: a commit published after the snapshot waits to be queued until the
        // snapshot's revision is set, one published before it is in the snapshot.
        let mut pending = self.lock();
        let snapshot = store.snapshot();
        pending.started = true;
        pending.reported = snapshot.revision();
        let mut state = Map::with_capacity(self.keys.len());
        let mut failures = Vec::new();
        for &key in &self.keys {
            match snapshot.get_json(key) {
                Ok(value) => {
                    state.insert(key.to_owned(), value);
                }
                Err(e) => failures.push(e),
            }
        }
        (snapshot.revision(), state, failures)
    }

    /// Queues the visible values changed since the last queued revision, at `committed`'s.
    /// Observers of concurrent commits may run out of revision order: a later commit's
    /// snapshot holds the earlier one's changes, so those are queued with it and the earlier
    /// commit, seen after it, queues nothing (no older value is ever emitted after a newer).
    fn observe(&self, committed: &Committed) {
        let mut pending = self.lock();
        if !pending.started || committed.revision <= pending.reported {
            return;
        }
        let since = std::mem::replace(&mut pending.reported, committed.revision);
        let snapshot = &committed.snapshot;
        let mut changes = Map::new();
        for &key in &self.keys {
            if !snapshot.changed_at(key).is_ok_and(|at| at > since) {
                continue;
            }
            match snapshot.get_json(key) {
                Ok(value) => {
                    changes.insert(key.to_owned(), value);
                }
                Err(e) => pending.failures.push(e),
            }
        }
        if !changes.is_empty() {
            pending.deltas.push((committed.revision, changes));
        }
    }

    /// Emits the queued deltas to `sink`, in revision order.
    fn emit_deltas(&self, sink: &dyn EventSink) {
        let deltas = std::mem::take(&mut self.lock().deltas);
        for (revision, changes) in deltas {
            sink.emit(&AgentEvent::StateDelta {
                revision,
                changes: Value::Object(changes),
            });
        }
    }

    pub(crate) fn take_failures(&self) -> Vec<StateError> {
        std::mem::take(&mut self.lock().failures)
    }
}

/// The store's observer of a run's visible keys.
pub(crate) struct Observer(pub(crate) Arc<StateWatch>);

impl CommitObserver for Observer {
    fn on_commit(&self, committed: &Committed) {
        self.0.observe(committed);
    }
}

/// A sink that emits the queued deltas before each event it forwards: the run's commits
/// emit their events through it, so a change made while a commit is written (profile values
/// redone after a conflict) is shown before the commit's facts (the last one's `RunFinish`).
pub(crate) struct ChangesFirst<'s> {
    sink: &'s dyn EventSink,
    watch: &'s StateWatch,
}

impl<'s> ChangesFirst<'s> {
    pub(crate) fn new(sink: &'s dyn EventSink, visible: &'s Visible) -> Self {
        Self {
            sink,
            watch: &visible.watch,
        }
    }
}

impl EventSink for ChangesFirst<'_> {
    fn emit(&self, event: &AgentEvent) {
        self.watch.emit_deltas(self.sink);
        self.sink.emit(event);
    }

    fn emit_stored(&self, event: &AgentEvent, seq: u64) {
        self.watch.emit_deltas(self.sink);
        self.sink.emit_stored(event, seq);
    }

    fn committed(&self, last_seq: u64) {
        self.watch.emit_deltas(self.sink);
        self.sink.committed(last_seq);
    }
}

/// The warning about a visible value that could not be serialized (the run goes on).
pub(crate) fn unshown(error: &StateError) -> AgentEvent {
    AgentEvent::Warning {
        kind: WarningKind::Other,
        detail: format!("{error}; the value is not shown to clients"),
    }
}
