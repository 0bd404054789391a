//! The action queue and the dead-letter list: `Run`-scoped state keys, so both are persisted
//! with the run and survive a resume in another process.

use awaken_state::{KeyOptions, KeyRegistry, KeyScope, StateError, StateKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One queued action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuedAction {
    /// Unique within the run (assigned on enqueue, never reused).
    pub id: u64,
    /// The target phase, by name.
    pub phase: String,
    /// The action key.
    pub key: String,
    /// The JSON payload.
    pub payload: Value,
}

/// The queue's value.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ActionQueue {
    /// The id the next enqueued action gets.
    pub next_id: u64,
    /// Queued actions in scheduling order.
    pub items: Vec<QueuedAction>,
}

impl ActionQueue {
    /// The queued actions for `phase`, in order.
    pub fn for_phase<'a>(&'a self, phase: &'a str) -> impl Iterator<Item = &'a QueuedAction> + 'a {
        self.items.iter().filter(move |a| a.phase == phase)
    }
}

/// A change to the queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum QueueUpdate {
    /// Append actions (phase, key, payload); ids are assigned in order.
    Enqueue {
        /// The new actions.
        actions: Vec<(String, String, Value)>,
    },
    /// Remove actions by id (an id not queued is an error: it would mean a lost update).
    Remove {
        /// The ids.
        ids: Vec<u64>,
    },
}

/// The state key holding the action queue.
pub struct ActionQueueKey;

impl StateKey for ActionQueueKey {
    const KEY: &'static str = "awaken.phase.action_queue";
    type Value = ActionQueue;
    type Update = QueueUpdate;

    fn apply(value: &mut ActionQueue, update: QueueUpdate) -> Result<(), StateError> {
        match update {
            QueueUpdate::Enqueue { actions } => {
                for (phase, key, payload) in actions {
                    let id = value.next_id;
                    value.next_id += 1;
                    value.items.push(QueuedAction {
                        id,
                        phase,
                        key,
                        payload,
                    });
                }
            }
            QueueUpdate::Remove { ids } => {
                for id in ids {
                    let Some(pos) = value.items.iter().position(|a| a.id == id) else {
                        return Err(StateError::invalid_update(
                            Self::KEY,
                            format!("action {id} is not queued"),
                        ));
                    };
                    value.items.remove(pos);
                }
            }
        }
        Ok(())
    }
}

/// An action that could not be processed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The action as it was queued.
    pub action: QueuedAction,
    /// Why it was dead-lettered.
    pub reason: String,
}

/// The state key holding the run's dead letters (append-only).
pub struct DeadLettersKey;

impl StateKey for DeadLettersKey {
    const KEY: &'static str = "awaken.phase.dead_letters";
    type Value = Vec<DeadLetter>;
    type Update = Vec<DeadLetter>;

    fn apply(value: &mut Vec<DeadLetter>, update: Vec<DeadLetter>) -> Result<(), StateError> {
        value.extend(update);
        Ok(())
    }
}

/// How many keys [`register_engine_keys`] registers.
pub const ENGINE_KEY_COUNT: usize = 2;

/// Registers the engine's own keys (both `Run`-scoped, `Exclusive`). The environment's key
/// registry must contain them before a store is built over it.
pub fn register_engine_keys(registry: &mut KeyRegistry) -> Result<(), StateError> {
    let run = KeyOptions::new().with_scope(KeyScope::Run);
    registry.register_key::<ActionQueueKey>(run)?;
    registry.register_key::<DeadLettersKey>(run)
}
