//! The one error type of the crate.

use std::sync::Arc;

/// Everything that can go wrong with state: registration, commands, commits, export and restore,
/// plus the errors the phase engine (`awaken-phase`) raises.
///
/// Every variant names the key (or phase) it is about. Errors from serde keep their source.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// A key name was registered a second time (with the same Rust type or another one).
    #[error("state key `{key}` is already registered (as {first_type}; again as {second_type})")]
    DuplicateKey {
        /// The key name.
        key: String,
        /// Rust type of the first registration.
        first_type: &'static str,
        /// Rust type of the rejected registration.
        second_type: &'static str,
    },
    /// A command, a read or a restore named a key that is not registered.
    #[error("state key `{key}` is not registered")]
    UnknownKey {
        /// The key name.
        key: String,
    },
    /// A key name is registered with another Rust type than the one used to read or write it.
    #[error("state key `{key}` is registered as {registered_type}, used as {used_type}")]
    KeyTypeMismatch {
        /// The key name.
        key: String,
        /// Rust type recorded at registration.
        registered_type: &'static str,
        /// Rust type used by the caller.
        used_type: &'static str,
    },
    /// A command's base revision is not the store's current revision.
    #[error("stale state: command expects revision {expected}, store is at {actual}")]
    StaleRevision {
        /// The revision the command (or transaction) was based on.
        expected: u64,
        /// The store's revision at commit time.
        actual: u64,
    },
    /// A reducer rejected an update. Reducers return this variant for invalid updates.
    #[error("update of state key `{key}` rejected: {reason}")]
    InvalidUpdate {
        /// The key name.
        key: String,
        /// Why the reducer rejected the update.
        reason: String,
    },
    /// A reducer panicked; the commit was abandoned.
    #[error("reducer of state key `{key}` panicked: {message}")]
    ReducerPanicked {
        /// The key name.
        key: String,
        /// The panic payload if it was a string.
        message: String,
    },
    /// A JSON update could not be read as the key's `Update` type.
    #[error("update of state key `{key}` is not valid JSON for its type: {source}")]
    UpdateDeserialize {
        /// The key name.
        key: String,
        /// The serde error.
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// A persisted JSON value could not be read as the key's `Value` type.
    #[error("persisted value of state key `{key}` is not valid for its type: {source}")]
    ValueDeserialize {
        /// The key name.
        key: String,
        /// The serde error.
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// A value or an update could not be serialized to JSON.
    #[error("state key `{key}` could not be serialized: {source}")]
    Serialize {
        /// The key name.
        key: String,
        /// The serde error.
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// Two commands merged as parallel both write the same `Exclusive` key.
    #[error("parallel commands both write exclusive state key `{key}`")]
    ExclusiveKeyConflict {
        /// The first conflicting key in key-name order.
        key: String,
    },
    /// A restore named an `Ephemeral` key, which is never persisted.
    #[error("state key `{key}` is ephemeral and cannot be restored")]
    NotPersisted {
        /// The key name.
        key: String,
    },
    /// A phase's EXECUTE loop still had work after `max_rounds` rounds (raised by the phase
    /// engine).
    #[error("phase {phase} did not converge within {max_rounds} rounds")]
    PhaseRunLoopExceeded {
        /// The phase, by name.
        phase: String,
        /// The round limit that was reached.
        max_rounds: usize,
    },
    /// A command scheduled an action that no handler is registered for (raised by the phase
    /// engine at submit).
    #[error("no handler is registered for scheduled action `{key}`")]
    UnknownScheduledActionHandler {
        /// The action key.
        key: String,
    },
    /// A command emitted an effect that no handler is registered for (raised by the phase
    /// engine at submit).
    #[error("no handler is registered for effect `{key}`")]
    UnknownEffectHandler {
        /// The effect key.
        key: String,
    },
    /// A second handler was registered for a scheduled-action key (raised at registration).
    #[error("a handler for scheduled action `{key}` is already registered")]
    DuplicateScheduledActionHandler {
        /// The action key.
        key: String,
    },
    /// A second handler was registered for an effect key (raised at registration).
    #[error("a handler for effect `{key}` is already registered")]
    DuplicateEffectHandler {
        /// The effect key.
        key: String,
    },
    /// A scheduled action targets a phase that does not exist or cannot run actions.
    #[error("scheduled action `{key}` targets phase `{phase}`, which cannot run actions")]
    InvalidActionPhase {
        /// The phase name given by the action.
        phase: String,
        /// The action key.
        key: String,
    },
}

impl StateError {
    /// The error a reducer returns to reject an update.
    pub fn invalid_update(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidUpdate {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The state key (or action/effect key) the error is about, if it names one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::DuplicateKey { key, .. }
            | Self::UnknownKey { key }
            | Self::KeyTypeMismatch { key, .. }
            | Self::InvalidUpdate { key, .. }
            | Self::ReducerPanicked { key, .. }
            | Self::UpdateDeserialize { key, .. }
            | Self::ValueDeserialize { key, .. }
            | Self::Serialize { key, .. }
            | Self::ExclusiveKeyConflict { key }
            | Self::NotPersisted { key }
            | Self::UnknownScheduledActionHandler { key }
            | Self::UnknownEffectHandler { key }
            | Self::DuplicateScheduledActionHandler { key }
            | Self::DuplicateEffectHandler { key }
            | Self::InvalidActionPhase { key, .. } => Some(key),
            Self::StaleRevision { .. } | Self::PhaseRunLoopExceeded { .. } => None,
        }
    }
}
