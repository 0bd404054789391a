//! The run's side of the state shown to clients (`crate::shown`): the snapshot right after
//! `RunStart`, the queued deltas before the run's next event, and the end of the watch.

use awaken_event::AgentEvent;
use serde_json::Value;

use crate::run::Run;
use crate::shown::{Observer, unshown};

impl Run<'_> {
    /// Right after `RunStart`: subscribes the watch of the visible keys (if the agent has
    /// any) and emits the `StateSnapshot` of their values.
    pub(super) fn show_state(&mut self) {
        let Some(visible) = self.visible.as_deref_mut() else {
            return;
        };
        let store = self.engine.store();
        // Subscribed first: a commit between the two is in the snapshot or queued after it.
        visible.subscription = Some(store.subscribe(Observer(visible.watch.clone())));
        let (revision, state, failures) = visible.watch.start(store);
        self.sink.emit(&AgentEvent::StateSnapshot {
            revision,
            state: Value::Object(state),
        });
        for e in failures {
            self.durable.note(unshown(&e), self.sink);
        }
    }

    /// Emits what commits changed in the visible keys since the last call
    /// ([`Visible::emit_changes`]). Called only when the agent has visible keys.
    #[cold]
    pub(super) fn show_changes(&mut self) {
        if let Some(visible) = self.visible.as_deref() {
            visible.emit_changes(self.sink, &mut self.durable);
        }
    }

    /// After `RunFinish`: ends the watch (later commits are not shown).
    pub(super) fn stop_showing_state(&mut self) {
        let Some(visible) = self.visible.as_deref_mut() else {
            return;
        };
        if let Some(id) = visible.subscription.take() {
            self.engine.store().unsubscribe(id);
        }
        for e in visible.watch.take_failures() {
            tracing::warn!(error = %e, "a visible state value was not shown: the run had finished");
        }
    }
}
