//! Phase hooks: pure functions from a phase context to a state command.

use async_trait::async_trait;
use awaken_state::{StateCommand, StateError};

use crate::context::PhaseContext;

/// Why a hook, an action handler or an effect handler failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HookError {
    /// The handler reports a failure in its own words.
    #[error("{message}")]
    Failed {
        /// What went wrong.
        message: String,
    },
    /// Building the command failed (a serialization error, ...).
    #[error(transparent)]
    State(#[from] StateError),
    /// Another error, kept as the source.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl HookError {
    /// A `Failed` error.
    pub fn failed(message: impl Into<String>) -> Self {
        HookError::Failed {
            message: message.into(),
        }
    }
}

/// A plugin's hook for one phase (any phase but `ToolGate`).
///
/// Called once per phase run, concurrently with the phase's other hooks, all against one frozen
/// snapshot; it returns the changes it wants as a [`StateCommand`] (key updates, scheduled
/// actions, effects). Hooks must be pure — context in, command out, no IO — because the engine
/// may run a hook twice: when its writes conflict with an earlier hook's on an `Exclusive` key,
/// its first command is discarded entirely and it runs again on the state that includes the
/// earlier writes. An `Err` (or a panic) fails the phase and nothing of its GATHER is published.
#[async_trait]
pub trait PhaseHook: Send + Sync + 'static {
    /// Computes this hook's command for the phase.
    async fn run(&self, ctx: &PhaseContext) -> Result<StateCommand, HookError>;

    /// The same computation without a future, for hooks that never wait: `Some` result means
    /// the engine uses it and does not call [`PhaseHook::run`]. The default, `None`, sends
    /// every call through `run`. Synchronous hooks (like [`FnHook`]) override it to save the
    /// future's allocation on every phase.
    fn run_sync(&self, _ctx: &PhaseContext) -> Option<Result<StateCommand, HookError>> {
        None
    }
}

/// A phase hook made from a synchronous closure.
pub struct FnHook<F>(pub F);

#[async_trait]
impl<F> PhaseHook for FnHook<F>
where
    F: Fn(&PhaseContext) -> Result<StateCommand, HookError> + Send + Sync + 'static,
{
    async fn run(&self, ctx: &PhaseContext) -> Result<StateCommand, HookError> {
        (self.0)(ctx)
    }

    fn run_sync(&self, ctx: &PhaseContext) -> Option<Result<StateCommand, HookError>> {
        Some((self.0)(ctx))
    }
}
