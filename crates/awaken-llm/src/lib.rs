//! Awaken's inference layer: what one model call is asked ([`InferenceRequest`]), the
//! streaming executor contract ([`LlmExecutor`], [`LlmStreamEvent`], collected into
//! `awaken_event::InferenceResponse`), the classified [`InferenceExecutionError`], the
//! [`RetryingExecutor`], the [`ModelPool`] (failover across members), the deterministic
//! [`ScriptedExecutor`], with the `openai` feature (on by default) the OpenAI-compatible
//! chat-completions executor
//! ([`openai::OpenAiExecutor`]), and with the `anthropic` feature the Anthropic Messages
//! executor (`anthropic::AnthropicExecutor`); each protocol's SSE stream decoder is IO-free
//! and always built.
//!
//! This crate must never know plugins, state, tools' execution or the agent loop: it turns a
//! request into events and an error class, nothing more. Cancellation is dropping a stream
//! (or wrapping it with [`with_cancellation`] and cancelling the run's token).

pub mod anthropic;
mod cancel;
mod error;
mod event;
mod executor;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod http;
pub mod openai;
mod pool;
mod request;
mod retry;
mod retry_after;
mod route;
mod scripted;
mod sse;

#[cfg(test)]
mod tests;

pub use cancel::{CancellableStream, with_cancellation};
pub use error::{
    BoxError, ConnectionAttempt, ConnectionFailure, ErrorClass, InferenceExecutionError,
};
pub use event::{LlmEventStream, LlmStreamEvent, ResponseCollector, collect_stream};
pub use executor::{LlmExecutor, LlmResponseFuture};
pub use pool::{
    BreakerPolicy, BreakerState, DEFAULT_COOL_DOWN, DEFAULT_FAILURES_TO_OPEN, DEFAULT_ROUTING_KEY,
    FailedOver, FailoverReason, ModelPool, PoolClock, PoolError, PoolMember, PoolRoute,
    SystemClock, is_failover_error, pool_context_window,
};
pub use request::InferenceRequest;
pub use retry::{RetryPolicy, RetryingExecutor};
pub use scripted::{
    Script, ScriptError, ScriptToolCall, ScriptTurn, ScriptedError, ScriptedErrorKind,
    ScriptedExecutor,
};
pub use sse::{SseEvent, SseParser};
