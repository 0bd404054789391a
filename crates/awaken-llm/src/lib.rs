//! Awaken's inference layer: what one model call is asked ([`InferenceRequest`]), the
//! streaming executor contract ([`LlmExecutor`], [`LlmStreamEvent`], collected into
//! `awaken_event::InferenceResponse`), the classified [`InferenceExecutionError`], the
//! [`RetryingExecutor`], the deterministic [`ScriptedExecutor`] and, with the `openai` feature
//! (on by default), the OpenAI-compatible chat-completions executor
//! ([`openai::OpenAiExecutor`]) with its IO-free SSE parser and stream decoder.
//!
//! This crate must never know plugins, state, tools' execution or the agent loop: it turns a
//! request into events and an error class, nothing more. Cancellation is dropping a stream
//! (or wrapping it with [`with_cancellation`] and cancelling the run's token).

mod cancel;
mod error;
mod event;
mod executor;
pub mod openai;
mod request;
mod retry;
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
pub use request::InferenceRequest;
pub use retry::{RetryPolicy, RetryingExecutor};
pub use scripted::{
    Script, ScriptError, ScriptToolCall, ScriptTurn, ScriptedError, ScriptedErrorKind,
    ScriptedExecutor,
};
pub use sse::{SseEvent, SseParser};
