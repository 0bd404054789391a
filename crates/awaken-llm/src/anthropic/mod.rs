//! Anthropic's Messages protocol (`POST /v1/messages`).
//!
//! The wire format, the stream decoder and the status mapping are IO-free and always built;
//! the HTTP executor (`AnthropicExecutor`) needs the `anthropic` feature.

mod decoder;
#[cfg(feature = "anthropic")]
mod executor;
mod wire;

#[cfg(feature = "anthropic")]
pub use crate::http::ApiKey;
pub use decoder::MessagesStreamDecoder;
#[cfg(feature = "anthropic")]
pub use executor::{AnthropicConfig, AnthropicExecutor};
pub use wire::{
    ANTHROPIC_VERSION, BodyOptions, DEFAULT_MAX_TOKENS, MIN_THINKING_BUDGET, error_from_event,
    error_from_status, request_body, thinking_budget,
};
