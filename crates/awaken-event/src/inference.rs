//! What a model call produced: the assistant message, token usage and why it stopped.

use serde::{Deserialize, Serialize};

use crate::message::Message;

/// Token counts reported by a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache (part of `input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_input_tokens: u64,
    /// Reasoning tokens (part of `output_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl TokenUsage {
    /// Input plus output tokens.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Adds `other` field by field (saturating).
    pub fn add(&mut self, other: &TokenUsage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_input_tokens = self
            .cached_input_tokens
            .saturating_add(other.cached_input_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
    }
}

/// Why the model stopped producing output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It finished its turn.
    #[default]
    EndTurn,
    /// It asked for tool calls.
    ToolCalls,
    /// It hit the output token limit.
    MaxTokens,
    /// The provider's content filter stopped it.
    ContentFiltered,
    /// The provider gave a reason this vocabulary does not know.
    Other,
}

impl StopReason {
    /// Every reason, in declaration order.
    pub const ALL: [StopReason; 5] = [
        StopReason::EndTurn,
        StopReason::ToolCalls,
        StopReason::MaxTokens,
        StopReason::ContentFiltered,
        StopReason::Other,
    ];
}

/// One inference's collected result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferenceResponse {
    /// The assistant message (text and tool calls).
    pub message: Message,
    /// Token usage of this call.
    pub usage: TokenUsage,
    /// Why it stopped.
    pub stop_reason: StopReason,
}
