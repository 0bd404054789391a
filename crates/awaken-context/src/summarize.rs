//! Summaries: the [`Summarizer`] trait and [`LlmSummarizer`], which asks a model.

use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{CancellationToken, ContentBlock, Message, Role};
use awaken_llm::{
    InferenceExecutionError, InferenceRequest, LlmExecutor, collect_stream, with_cancellation,
};
use awaken_spec::InferenceOverride;

/// The instructions [`LlmSummarizer`] gives the model by default.
pub const DEFAULT_SUMMARY_INSTRUCTIONS: &str = "You compress the earlier part of a conversation between a user, an AI assistant and its tools, so the assistant can continue the work without it. Write a concise summary that keeps: the user's goals and constraints, decisions made, facts and results obtained from tools (names, numbers, paths, identifiers), open questions and what remains to be done. Omit pleasantries and repetition. If a previous summary is given, merge it with the new messages into one summary. Reply with the summary only.";

/// What a summary is asked for: the previous summary (of the messages before
/// `first_index`), and the messages to fold into it.
#[derive(Debug, Clone, Copy)]
pub struct SummaryRequest<'a> {
    /// The summary of the messages before `first_index`, if any.
    pub previous: Option<&'a str>,
    /// The messages to summarise, oldest first.
    pub messages: &'a [Message],
    /// The index of `messages[0]` in the thread.
    pub first_index: usize,
    /// The run's cancellation.
    pub cancel: &'a CancellationToken,
}

/// Why a summary could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SummaryError {
    /// The model call failed.
    #[error("the summary call failed: {0}")]
    Inference(#[source] InferenceExecutionError),
    /// The model answered with no text.
    #[error("the summary came back empty")]
    Empty,
    /// The run was cancelled during the call.
    #[error("the summary call was cancelled")]
    Cancelled,
    /// Another reason.
    #[error("{message}")]
    Other {
        /// Why.
        message: String,
    },
}

/// Makes summaries for the compaction plugin.
///
/// Called from the compaction action's handler (once per action; it may do IO). An `Err`
/// makes compaction fall back to truncation and is reported (a failed call is not retried
/// before the history has grown). It must honour `request.cancel`; `Cancelled` is not counted
/// as a failure.
#[async_trait]
pub trait Summarizer: Send + Sync + 'static {
    /// Summarises `request.messages`, merged with `request.previous`.
    async fn summarize(&self, request: SummaryRequest<'_>) -> Result<String, SummaryError>;
}

/// A [`Summarizer`] over any [`LlmExecutor`]: one non-tool call whose user message is a
/// transcript of the range (and the previous summary), under [`DEFAULT_SUMMARY_INSTRUCTIONS`].
pub struct LlmSummarizer {
    executor: Arc<dyn LlmExecutor>,
    upstream_model: String,
    instructions: String,
    max_tokens: Option<u32>,
}

impl LlmSummarizer {
    /// Summaries by `upstream_model` through `executor`.
    pub fn new(executor: Arc<dyn LlmExecutor>, upstream_model: impl Into<String>) -> Self {
        Self {
            executor,
            upstream_model: upstream_model.into(),
            instructions: DEFAULT_SUMMARY_INSTRUCTIONS.to_owned(),
            max_tokens: None,
        }
    }

    /// Replaces the instructions.
    pub fn with_instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = instructions.into();
        self
    }

    /// Caps the summary's length (the call's `max_tokens`).
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    /// The request sent for `request`.
    pub fn request(&self, request: &SummaryRequest<'_>) -> InferenceRequest {
        InferenceRequest::new(
            self.upstream_model.clone(),
            vec![Message::user(transcript(request))],
        )
        .with_system_prompt(self.instructions.clone())
        .with_overrides(InferenceOverride {
            max_tokens: self.max_tokens,
            ..InferenceOverride::default()
        })
    }
}

#[async_trait]
impl Summarizer for LlmSummarizer {
    async fn summarize(&self, request: SummaryRequest<'_>) -> Result<String, SummaryError> {
        let stream = with_cancellation(
            self.executor.execute_stream(self.request(&request)),
            request.cancel.clone(),
        );
        let response = collect_stream(stream).await.map_err(|e| {
            if e.is_cancelled() {
                SummaryError::Cancelled
            } else {
                SummaryError::Inference(e)
            }
        })?;
        let text = response.message.text();
        if text.trim().is_empty() {
            return Err(SummaryError::Empty);
        }
        Ok(text.trim().to_owned())
    }
}

/// The range as plain text: one paragraph per message, `[n] role: content`, tool calls as
/// `→ name(arguments)`, results as `← call_id: content`.
pub fn transcript(request: &SummaryRequest<'_>) -> String {
    let mut out = String::new();
    if let Some(previous) = request.previous {
        let _ = writeln!(out, "Summary so far:\n{previous}\n");
    }
    let _ = writeln!(out, "New messages:");
    for (i, message) in request.messages.iter().enumerate() {
        let n = request.first_index + i + 1;
        let role = match message.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        let _ = write!(out, "[{n}] {role}:");
        if let Some(id) = &message.tool_call_id {
            let _ = write!(out, " ← {id}:");
        }
        for block in message.content.iter() {
            match block {
                ContentBlock::Text { text } => {
                    let _ = write!(out, " {text}");
                }
                ContentBlock::Json { value } => {
                    let _ = write!(out, " {value}");
                }
                ContentBlock::Image { .. } => out.push_str(" [image]"),
                // Reasoning and later kinds are not part of what happened.
                _ => {}
            }
        }
        for call in message.tool_calls.iter() {
            let args = call
                .invalid_arguments
                .clone()
                .unwrap_or_else(|| call.arguments.to_string());
            let _ = write!(out, " → {}({args})", call.name);
        }
        out.push('\n');
    }
    out
}
