//! The OpenAI chat-completions protocol (also spoken by vLLM, Ollama, LM Studio, llama.cpp
//! server and others).
//!
//! The wire format, the stream decoder and the status mapping are IO-free and always built;
//! the HTTP executor ([`OpenAiExecutor`]) needs the `openai` feature.

mod decoder;
#[cfg(feature = "openai")]
mod executor;
mod wire;

#[cfg(feature = "openai")]
pub use crate::http::ApiKey;
pub use decoder::ChatStreamDecoder;
#[cfg(feature = "openai")]
pub use executor::{OpenAiConfig, OpenAiExecutor, RoutingKeyPlacement};
pub use wire::{BodyOptions, MaxTokensField, error_from_status, parse_retry_after, request_body};
