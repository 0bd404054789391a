//! Awaken's phase engine. A run is driven through nine [`Phase`]s; in
//! each, the plugins' [`PhaseHook`]s run concurrently against one frozen snapshot and return
//! [`StateCommand`](awaken_state::StateCommand)s (GATHER). Commands writing disjoint
//! `Exclusive` keys merge into one commit; when two write the same one, the engine applies a
//! greedy compatible batch and re-runs each deferred hook alone on the state that includes what
//! was applied before it — all inside one transaction published as a single commit, or nothing
//! if a hook fails. Then scheduled actions for the phase are processed in rounds, at most
//! [`DEFAULT_MAX_PHASE_ROUNDS`] (EXECUTE). Effects are dispatched after the commit that carries
//! them, outside any lock.
//!
//! This crate must never know plugins (it runs a plain [`PhaseEnv`] the plugin crate builds),
//! tool execution, LLM providers or IO.

mod abandon;
mod action;
mod context;
mod engine;
mod env;
mod hook;
mod phase;
mod queue;

pub use action::{
    ActionHandler, CommandExt, EffectContext, EffectHandler, EffectSpec, ErasedActionHandler,
    ErasedEffectHandler, HandlerFailure, ScheduledActionSpec, erase_action, erase_effect,
};
pub use context::{PhaseContext, RunIdentity, ToolPhaseInfo};
pub use engine::{
    DEFAULT_MAX_PHASE_ROUNDS, EffectFailure, EffectStats, PhaseEngine, PhaseError, PhaseReport,
    SubmitNow, SubmitReport,
};
pub use env::{PhaseEnv, PhaseEnvError, RegisteredAction, RegisteredEffect, RegisteredHook};
pub use hook::{FnHook, HookError, PhaseHook};
pub use phase::{Phase, UnknownPhase};
pub use queue::{
    ActionQueue, ActionQueueKey, DeadLetter, DeadLettersKey, ENGINE_KEY_COUNT, QueueUpdate,
    QueuedAction, register_engine_keys,
};
