//! Awaken's typed state: state keys and their registry, [`StateCommand`]s (pure data: key
//! updates, scheduled actions, effects), immutable [`Snapshot`]s, the [`StateStore`] whose
//! validated commits are the only way state changes, export and restore of persisted keys
//! ([`PersistedState`]) and change tracking so persistence writes deltas.
//!
//! A key is a type implementing [`StateKey`] with a stable name; the [`KeyRegistry`] maps each
//! name to exactly one Rust type and records its [`KeyOptions`] (scope, merge strategy). A
//! commit validates the whole command before publishing anything; a snapshot never changes
//! after it is taken, and taking one is O(1); a commit copies only the table paths it changes.
//!
//! This crate must never know phases, plugins, tools, LLMs or any IO: it reads no clock and no
//! environment. Scheduled actions and effects are carried as opaque data (phase name, key, JSON
//! payload) for the phase engine, which also raises the phase errors declared in
//! [`StateError`].
//!
//! With the cargo feature `testing`, the module `testing` offers the commutativity check every
//! `Commutative` key must pass.

mod command;
mod error;
mod exported;
mod key;
mod parallel;
mod snapshot;
mod store;
mod table;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use command::{Effect, KeyUpdate, ScheduledAction, StateCommand};
pub use error::StateError;
pub use exported::{DeltaValues, PersistedState, StateDelta, StateValue};
pub use key::{
    KeyDecl, KeyHandle, KeyInfo, KeyOptions, KeyRegistry, KeyScope, MergeStrategy, StateKey,
    panic_message,
};
pub use parallel::ParallelBatch;
pub use snapshot::Snapshot;
pub use store::{
    CommitObserver, Committed, ObserverId, Restored, StateStore, Transaction, UnknownKeyPolicy,
};

#[cfg(test)]
mod tests;
