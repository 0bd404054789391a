//! Scheduled actions and effects: typed specs, their handlers, the type-erased adapters the
//! engine stores, and typed `schedule_action` / `emit` on commands.

use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use awaken_state::{Snapshot, StateCommand, StateError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::context::PhaseContext;
use crate::engine::PhaseEngine;
use crate::hook::HookError;
use crate::phase::Phase;

/// A kind of scheduled action: a key, the phase whose EXECUTE loop processes it, a payload.
pub trait ScheduledActionSpec: Send + Sync + 'static {
    /// The action's key (one handler per key).
    const KEY: &'static str;
    /// The phase that processes it (never `ToolGate`).
    const PHASE: Phase;
    /// Its payload.
    type Payload: Serialize + DeserializeOwned + Send + Sync + 'static;
}

/// Processes actions of kind `A`.
///
/// Called exactly once per queued action, in the EXECUTE loop of `A::PHASE`, on a fresh
/// snapshot. May do IO (compaction calls a model from one). Its command commits together with
/// the action's removal from the queue; it may schedule more actions (for this phase: processed
/// in the next round). An `Err` or a panic (caught) dead-letters the action with the error,
/// named with the handler's plugin; the phase goes on.
#[async_trait]
pub trait ActionHandler<A: ScheduledActionSpec>: Send + Sync + 'static {
    /// Handles one action.
    async fn handle(
        &self,
        ctx: &PhaseContext,
        payload: A::Payload,
    ) -> Result<StateCommand, HookError>;
}

/// A kind of effect: a typed event emitted on a command and handled after its commit.
pub trait EffectSpec: Send + Sync + 'static {
    /// The effect's key (one handler per key).
    const KEY: &'static str;
    /// Its payload.
    type Payload: Serialize + DeserializeOwned + Send + Sync + 'static;
}

/// What an effect handler sees: the state of the commit that emitted the effect, and the
/// engine, through which it may submit further commands.
#[derive(Clone)]
pub struct EffectContext {
    /// The state right after the emitting commit.
    pub snapshot: Snapshot,
    /// The engine (submitting a command from here is safe: no engine lock is held).
    pub engine: PhaseEngine,
}

/// Handles effects of kind `E`.
///
/// Called after the commit carrying the effect, in emission order, outside any engine lock.
/// A failure (an `Err`, or a panic, caught) is logged and counted with the handler's plugin;
/// it never rolls the commit back.
#[async_trait]
pub trait EffectHandler<E: EffectSpec>: Send + Sync + 'static {
    /// Handles one effect.
    async fn handle(&self, ctx: &EffectContext, payload: E::Payload) -> Result<(), HookError>;
}

/// Why an action or effect could not be handled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerFailure {
    /// The JSON payload does not decode into the handler's payload type.
    #[error("payload of `{key}` does not decode: {source}")]
    Decode {
        /// The action or effect key.
        key: String,
        /// The decode error.
        #[source]
        source: serde_json::Error,
    },
    /// The handler returned an error.
    #[error("handler of `{key}` failed: {source}")]
    Handler {
        /// The action or effect key.
        key: String,
        /// Its error.
        #[source]
        source: HookError,
    },
    /// The handler panicked.
    #[error("handler of `{key}` panicked: {message}")]
    Panicked {
        /// The action or effect key.
        key: String,
        /// The panic message.
        message: String,
    },
}

/// A scheduled-action handler with its payload type erased, as the engine stores it.
#[async_trait]
pub trait ErasedActionHandler: Send + Sync + 'static {
    /// The action key.
    fn key(&self) -> &'static str;
    /// The phase it runs in.
    fn phase(&self) -> Phase;
    /// Decodes the payload and runs the handler.
    async fn handle_json(
        &self,
        ctx: &PhaseContext,
        payload: &Value,
    ) -> Result<StateCommand, HandlerFailure>;
}

/// An effect handler with its payload type erased.
#[async_trait]
pub trait ErasedEffectHandler: Send + Sync + 'static {
    /// The effect key.
    fn key(&self) -> &'static str;
    /// Decodes the payload and runs the handler.
    async fn handle_json(&self, ctx: &EffectContext, payload: &Value)
    -> Result<(), HandlerFailure>;
}

struct TypedAction<A, H>(H, PhantomData<fn() -> A>);
struct TypedEffect<E, H>(H, PhantomData<fn() -> E>);

#[async_trait]
impl<A: ScheduledActionSpec, H: ActionHandler<A>> ErasedActionHandler for TypedAction<A, H> {
    fn key(&self) -> &'static str {
        A::KEY
    }
    fn phase(&self) -> Phase {
        A::PHASE
    }
    async fn handle_json(
        &self,
        ctx: &PhaseContext,
        payload: &Value,
    ) -> Result<StateCommand, HandlerFailure> {
        let payload =
            A::Payload::deserialize(payload).map_err(|source| HandlerFailure::Decode {
                key: A::KEY.to_owned(),
                source,
            })?;
        self.0
            .handle(ctx, payload)
            .await
            .map_err(|source| HandlerFailure::Handler {
                key: A::KEY.to_owned(),
                source,
            })
    }
}

#[async_trait]
impl<E: EffectSpec, H: EffectHandler<E>> ErasedEffectHandler for TypedEffect<E, H> {
    fn key(&self) -> &'static str {
        E::KEY
    }
    async fn handle_json(
        &self,
        ctx: &EffectContext,
        payload: &Value,
    ) -> Result<(), HandlerFailure> {
        let payload =
            E::Payload::deserialize(payload).map_err(|source| HandlerFailure::Decode {
                key: E::KEY.to_owned(),
                source,
            })?;
        self.0
            .handle(ctx, payload)
            .await
            .map_err(|source| HandlerFailure::Handler {
                key: E::KEY.to_owned(),
                source,
            })
    }
}

/// Erases a typed action handler.
pub fn erase_action<A: ScheduledActionSpec, H: ActionHandler<A>>(
    handler: H,
) -> Arc<dyn ErasedActionHandler> {
    Arc::new(TypedAction::<A, H>(handler, PhantomData))
}

/// Erases a typed effect handler.
pub fn erase_effect<E: EffectSpec, H: EffectHandler<E>>(
    handler: H,
) -> Arc<dyn ErasedEffectHandler> {
    Arc::new(TypedEffect::<E, H>(handler, PhantomData))
}

use serde::Deserialize as _;

/// Typed scheduling and emitting on a [`StateCommand`].
pub trait CommandExt {
    /// Schedules an action of kind `A` for `A::PHASE`.
    fn schedule_action<A: ScheduledActionSpec>(
        &mut self,
        payload: A::Payload,
    ) -> Result<&mut Self, StateError>;
    /// Emits an effect of kind `E`.
    fn emit<E: EffectSpec>(&mut self, payload: E::Payload) -> Result<&mut Self, StateError>;
}

fn to_json(key: &str, payload: &impl Serialize) -> Result<Value, StateError> {
    serde_json::to_value(payload).map_err(|e| StateError::Serialize {
        key: key.to_owned(),
        source: Arc::new(e),
    })
}

impl CommandExt for StateCommand {
    fn schedule_action<A: ScheduledActionSpec>(
        &mut self,
        payload: A::Payload,
    ) -> Result<&mut Self, StateError> {
        let json = to_json(A::KEY, &payload)?;
        Ok(self.schedule_json(A::PHASE.as_str(), A::KEY, json))
    }

    fn emit<E: EffectSpec>(&mut self, payload: E::Payload) -> Result<&mut Self, StateError> {
        let json = to_json(E::KEY, &payload)?;
        Ok(self.emit_json(E::KEY, json))
    }
}
