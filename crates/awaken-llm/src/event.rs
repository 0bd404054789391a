//! The events of a streamed inference and their collection into an [`InferenceResponse`].

use std::pin::Pin;
use std::sync::Arc;

use awaken_event::ContentBlock;
use awaken_event::{
    InferenceResponse, Message, Role, StopReason, TokenUsage, ToolCall, ToolCallId,
};
use futures_core::Stream;

use crate::error::InferenceExecutionError;
use crate::route::PoolRoute;

/// One event of a streamed inference.
///
/// The grammar of a successful stream: any number of text, reasoning and tool-call events,
/// at most one [`LlmStreamEvent::Usage`], then exactly one [`LlmStreamEvent::Stop`], which is
/// last. A `ToolCallStart` for an index comes before every `ToolCallArgsDelta` for it; deltas
/// of different calls may interleave. A stream that ends without `Stop` was interrupted.
/// A [`crate::ModelPool`] puts one [`LlmStreamEvent::Routed`] before all of these; it is not
/// model output.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LlmStreamEvent {
    /// A piece of the answer's text.
    TextDelta(String),
    /// A piece of the model's visible reasoning.
    ReasoningDelta(String),
    /// The model started a tool call.
    ToolCallStart {
        /// The call's position in this response (0-based; the key of later argument deltas).
        index: u32,
        /// The call's id.
        id: ToolCallId,
        /// The tool's name.
        name: String,
    },
    /// A piece of a tool call's JSON argument text.
    ToolCallArgsDelta {
        /// The call's position, as in its `ToolCallStart`.
        index: u32,
        /// The next fragment of the argument text.
        delta: String,
    },
    /// Token usage of the call.
    Usage(TokenUsage),
    /// The model stopped; the last event of a complete stream.
    Stop(StopReason),
    /// Which member of a [`crate::ModelPool`] answers (and which were passed over): the first
    /// event of a pool's stream, sent once a member yielded its first event. Not model output;
    /// [`ResponseCollector`] ignores it. Boxed: it is rare, and every stream item is as large
    /// as the largest event.
    Routed(Box<PoolRoute>),
}

/// The stream `LlmExecutor::execute_stream` returns. It owns everything it needs (`'static`),
/// so it may outlive the executor's borrow; dropping it cancels the call.
pub type LlmEventStream =
    Pin<Box<dyn Stream<Item = Result<LlmStreamEvent, InferenceExecutionError>> + Send + 'static>>;

#[derive(Debug)]
struct PartialCall {
    index: u32,
    id: ToolCallId,
    name: String,
    arguments: String,
}

/// Folds stream events into an [`InferenceResponse`]: text and reasoning concatenated,
/// tool-call argument fragments assembled per index (in the order the calls started, parsed
/// with [`ToolCall::from_raw_arguments`] so non-JSON arguments are kept raw), the last usage.
/// A [`LlmStreamEvent::Routed`] event leaves the response unchanged.
#[derive(Debug, Default)]
pub struct ResponseCollector {
    text: String,
    reasoning: String,
    calls: Vec<PartialCall>,
    usage: TokenUsage,
    stop: Option<StopReason>,
}

impl ResponseCollector {
    /// An empty collector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one event. Fails with [`InferenceExecutionError::MalformedResponse`] when the
    /// event breaks the stream grammar (an event after `Stop`, arguments for a call that never
    /// started, the same index started twice).
    pub fn push(&mut self, event: LlmStreamEvent) -> Result<(), InferenceExecutionError> {
        if self.stop.is_some() {
            return Err(InferenceExecutionError::malformed(
                "event after the stop event",
                &format!("{event:?}"),
                None,
            ));
        }
        match event {
            LlmStreamEvent::TextDelta(t) => append(&mut self.text, t),
            LlmStreamEvent::ReasoningDelta(t) => append(&mut self.reasoning, t),
            LlmStreamEvent::ToolCallStart { index, id, name } => {
                if self.calls.iter().any(|c| c.index == index) {
                    return Err(InferenceExecutionError::malformed(
                        format!("tool call {index} started twice"),
                        &name,
                        None,
                    ));
                }
                self.calls.push(PartialCall {
                    index,
                    id,
                    name,
                    arguments: String::new(),
                });
            }
            LlmStreamEvent::ToolCallArgsDelta { index, delta } => {
                match self.calls.iter_mut().find(|c| c.index == index) {
                    Some(call) => append(&mut call.arguments, delta),
                    None => {
                        return Err(InferenceExecutionError::malformed(
                            format!("arguments for tool call {index}, which never started"),
                            &delta,
                            None,
                        ));
                    }
                }
            }
            LlmStreamEvent::Usage(u) => self.usage = u,
            LlmStreamEvent::Stop(reason) => self.stop = Some(reason),
            LlmStreamEvent::Routed(_) => {}
        }
        Ok(())
    }

    /// The collected response. Fails with [`InferenceExecutionError::StreamInterrupted`] when
    /// no `Stop` event arrived.
    pub fn finish(mut self) -> Result<InferenceResponse, InferenceExecutionError> {
        self.take()
    }

    /// As [`finish`](Self::finish), leaving the collector empty for the next stream, with the
    /// room its list of calls had (a caller collecting one stream after another allocates
    /// that list once).
    pub fn take(&mut self) -> Result<InferenceResponse, InferenceExecutionError> {
        let Some(stop_reason) = self.stop.take() else {
            self.clear();
            return Err(InferenceExecutionError::interrupted(
                "the stream ended without a stop event",
            ));
        };
        // Each list is collected straight into its shared slice (one allocation, no vector
        // copied into it).
        let reasoning = (!self.reasoning.is_empty()).then(|| ContentBlock::Reasoning {
            text: std::mem::take(&mut self.reasoning),
        });
        let text =
            (!self.text.is_empty()).then(|| ContentBlock::text(std::mem::take(&mut self.text)));
        let content: Arc<[ContentBlock]> = match (reasoning, text) {
            (None, None) => awaken_event::no_content(),
            (Some(block), None) | (None, Some(block)) => Arc::new([block]),
            (Some(reasoning), Some(text)) => Arc::new([reasoning, text]),
        };
        let tool_calls: Arc<[ToolCall]> = if self.calls.is_empty() {
            awaken_event::no_tool_calls()
        } else {
            self.calls
                .drain(..)
                .map(|c| ToolCall::from_raw_arguments(c.id, c.name, &c.arguments))
                .collect()
        };
        Ok(InferenceResponse {
            message: Message {
                role: Role::Assistant,
                content,
                tool_calls,
                tool_call_id: None,
            },
            usage: std::mem::take(&mut self.usage),
            stop_reason,
        })
    }

    /// Forgets everything collected (keeping the room of its list of calls).
    pub fn clear(&mut self) {
        self.text.clear();
        self.reasoning.clear();
        self.calls.clear();
        self.usage = TokenUsage::default();
        self.stop = None;
    }
}

/// Appends a streamed fragment to `buffer`, taking the fragment's own string when the buffer is
/// still empty (most fragments of a short answer are the first).
fn append(buffer: &mut String, fragment: String) {
    if buffer.is_empty() {
        *buffer = fragment;
    } else {
        buffer.push_str(&fragment);
    }
}

/// Drains `stream` into an [`InferenceResponse`], failing with its first error.
pub async fn collect_stream(
    mut stream: LlmEventStream,
) -> Result<InferenceResponse, InferenceExecutionError> {
    use futures_util::StreamExt;
    let mut collector = ResponseCollector::new();
    while let Some(event) = stream.next().await {
        collector.push(event?)?;
    }
    collector.finish()
}
