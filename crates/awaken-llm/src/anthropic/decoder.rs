//! Decoding a Messages SSE stream (or a whole message) into [`LlmStreamEvent`]s.

use awaken_event::{StopReason, ToolCallId};

use super::wire::{StreamEvent, UsageSoFar, WireBlock, WireReply, error_from_event, stop_reason};
use crate::error::InferenceExecutionError;
use crate::event::LlmStreamEvent;
use crate::sse::{SseEvent, SseParser};

/// The longest SSE line or event accepted (an event is normally a few hundred bytes).
const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// What an open content block (by its wire index) carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    Text,
    Thinking,
    /// A tool call, with its dense index among the response's calls.
    ToolUse(u32),
    /// A block this decoder does not surface (`redacted_thinking`, server tool blocks, ...).
    Ignored,
}

/// Turns a Messages response body into [`LlmStreamEvent`]s. IO-free: feed it the body's bytes
/// in pieces of any size with [`MessagesStreamDecoder::push`], then call
/// [`MessagesStreamDecoder::finish`] at the end of the body.
///
/// - Events are told apart by their JSON `type`: `message_start` (input usage, cache reads
///   and writes included), `content_block_start` (`text`, `thinking`, `tool_use`: a
///   `ToolCallStart`), `content_block_delta` (`text_delta`, `thinking_delta` as
///   `ReasoningDelta`, `input_json_delta` as `ToolCallArgsDelta`; `signature_delta` and
///   `citations_delta` are dropped), `content_block_stop`, `message_delta` (stop reason,
///   output usage), `message_stop`, `ping`, `error`. Unknown events and block types are
///   skipped, as the API asks of clients.
/// - Tool calls are numbered 0, 1, … in the order they start, whatever the blocks' own
///   indexes (which count text and thinking blocks too).
/// - `Usage` and `Stop` are emitted together at `message_stop`, once, last. A body that ends
///   before `message_stop` is [`InferenceExecutionError::StreamInterrupted`].
/// - An `error` event becomes the error [`super::error_from_event`] maps it to. An event that
///   is not valid JSON, a delta for a block that never started, or a `tool_use` block without
///   a usable id or name is [`InferenceExecutionError::MalformedResponse`].
#[derive(Debug, Default)]
pub struct MessagesStreamDecoder {
    sse: SseParser,
    state: DecodeState,
}

#[derive(Debug, Default)]
struct DecodeState {
    /// Open blocks by wire index (a handful per response: a list beats a map).
    blocks: Vec<(u32, BlockKind)>,
    calls: u32,
    usage: Option<UsageSoFar>,
    stop: Option<StopReason>,
    model: String,
    done: bool,
}

impl MessagesStreamDecoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the stream is complete (the `Stop` event was emitted); later bytes are ignored.
    pub fn is_done(&self) -> bool {
        self.state.done
    }

    /// Feeds the next piece of the SSE body, appending the events it completes to `out`.
    pub fn push(
        &mut self,
        bytes: &[u8],
        out: &mut Vec<LlmStreamEvent>,
    ) -> Result<(), InferenceExecutionError> {
        if self.state.done {
            return Ok(());
        }
        let state = &mut self.state;
        self.sse
            .push(bytes, |event: SseEvent<'_>| state.on_sse(event, out))?;
        if self.sse.buffered_len() > MAX_EVENT_BYTES {
            return Err(InferenceExecutionError::malformed(
                format!("an SSE event grew past {MAX_EVENT_BYTES} bytes without ending"),
                "",
                None,
            ));
        }
        Ok(())
    }

    /// Ends the body: fails with [`InferenceExecutionError::StreamInterrupted`] unless
    /// `message_stop` was seen.
    pub fn finish(
        &mut self,
        _out: &mut Vec<LlmStreamEvent>,
    ) -> Result<(), InferenceExecutionError> {
        if self.state.done {
            return Ok(());
        }
        Err(InferenceExecutionError::interrupted(
            "the response body ended before the stream was complete (no message_stop)",
        ))
    }

    /// Decodes a whole non-streamed Messages response into the events a stream would have
    /// carried.
    pub fn decode_message(body: &[u8]) -> Result<Vec<LlmStreamEvent>, InferenceExecutionError> {
        let text = std::str::from_utf8(body).map_err(|_| {
            InferenceExecutionError::malformed(
                "the message is not UTF-8",
                &String::from_utf8_lossy(body),
                None,
            )
        })?;
        let message: WireReply<'_> = serde_json::from_str(text).map_err(|e| {
            let reason = if e.is_data() {
                "the response does not have the shape of a message"
            } else {
                "the response is not valid JSON"
            };
            InferenceExecutionError::malformed(reason, text, Some(e))
        })?;
        if let Some(error) = &message.error {
            let model = message.model.as_deref().unwrap_or("");
            return Err(error_from_event(error.kind(), error.message(), model));
        }
        let mut state = DecodeState::default();
        let mut out = Vec::new();
        if let Some(u) = &message.usage {
            state
                .usage
                .get_or_insert_with(UsageSoFar::default)
                .update(u);
        }
        for (index, block) in message.content.iter().enumerate() {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            state.start_block(index, block, text, &mut out)?;
        }
        state.stop = message.stop_reason.as_deref().map(stop_reason);
        state.end(&mut out);
        Ok(out)
    }
}

fn json_reason(e: &serde_json::Error) -> &'static str {
    if e.is_data() {
        "an event does not have the shape of a Messages stream event"
    } else {
        "an event is not valid JSON"
    }
}

impl DecodeState {
    fn on_sse(
        &mut self,
        event: SseEvent<'_>,
        out: &mut Vec<LlmStreamEvent>,
    ) -> Result<(), InferenceExecutionError> {
        if self.done {
            return Ok(());
        }
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(());
        }
        let event: StreamEvent<'_> = serde_json::from_str(data)
            .map_err(|e| InferenceExecutionError::malformed(json_reason(&e), data, Some(e)))?;
        match event.r#type.as_ref() {
            "message_start" => {
                if let Some(message) = &event.message {
                    if let Some(model) = &message.model {
                        model.as_ref().clone_into(&mut self.model);
                    }
                    if let Some(u) = &message.usage {
                        self.usage.get_or_insert_with(UsageSoFar::default).update(u);
                    }
                }
            }
            "content_block_start" => {
                let (Some(index), Some(block)) = (event.index, &event.content_block) else {
                    return Err(InferenceExecutionError::malformed(
                        "content_block_start without an index or a content_block",
                        data,
                        None,
                    ));
                };
                self.start_block(index, block, data, out)?;
            }
            "content_block_delta" => self.on_delta(&event, data, out)?,
            "content_block_stop" => {
                if let Some(index) = event.index {
                    self.blocks.retain(|(i, _)| *i != index);
                }
            }
            "message_delta" => {
                if let Some(reason) = event.delta.as_ref().and_then(|d| d.stop_reason.as_deref()) {
                    self.stop = Some(stop_reason(reason));
                }
                if let Some(u) = &event.usage {
                    self.usage.get_or_insert_with(UsageSoFar::default).update(u);
                }
            }
            "message_stop" => self.end(out),
            "error" => {
                let (kind, message) = event
                    .error
                    .as_ref()
                    .map_or(("", ""), |e| (e.kind(), e.message()));
                return Err(error_from_event(kind, message, &self.model));
            }
            // `ping` and event types added later.
            _ => {}
        }
        Ok(())
    }

    fn start_block(
        &mut self,
        index: u32,
        block: &WireBlock<'_>,
        data: &str,
        out: &mut Vec<LlmStreamEvent>,
    ) -> Result<(), InferenceExecutionError> {
        let kind = match block.r#type.as_ref() {
            "text" => {
                if let Some(text) = block.text.as_deref().filter(|t| !t.is_empty()) {
                    out.push(LlmStreamEvent::TextDelta(text.to_owned()));
                }
                BlockKind::Text
            }
            "thinking" => {
                if let Some(text) = block.thinking.as_deref().filter(|t| !t.is_empty()) {
                    out.push(LlmStreamEvent::ReasoningDelta(text.to_owned()));
                }
                BlockKind::Thinking
            }
            "tool_use" => {
                let id = block
                    .id
                    .as_deref()
                    .and_then(|id| ToolCallId::new(id).ok())
                    .ok_or_else(|| {
                        InferenceExecutionError::malformed(
                            "a tool_use block without a usable id",
                            data,
                            None,
                        )
                    })?;
                let name = block
                    .name
                    .as_deref()
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| {
                        InferenceExecutionError::malformed(
                            "a tool_use block without a name",
                            data,
                            None,
                        )
                    })?;
                let call = self.calls;
                self.calls += 1;
                out.push(LlmStreamEvent::ToolCallStart {
                    index: call,
                    id,
                    name: name.to_owned(),
                });
                // Streamed calls start with `{}` and send their input as deltas; a whole
                // message (or a proxy) may carry the input here.
                if let Some(input) = block
                    .input
                    .as_ref()
                    .filter(|v| v.as_object().is_some_and(|o| !o.is_empty()))
                {
                    out.push(LlmStreamEvent::ToolCallArgsDelta {
                        index: call,
                        delta: input.to_string(),
                    });
                }
                BlockKind::ToolUse(call)
            }
            _ => BlockKind::Ignored,
        };
        match self.blocks.iter_mut().find(|(i, _)| *i == index) {
            Some(slot) => slot.1 = kind,
            None => self.blocks.push((index, kind)),
        }
        Ok(())
    }

    fn on_delta(
        &mut self,
        event: &StreamEvent<'_>,
        data: &str,
        out: &mut Vec<LlmStreamEvent>,
    ) -> Result<(), InferenceExecutionError> {
        let Some(delta) = &event.delta else {
            return Err(InferenceExecutionError::malformed(
                "content_block_delta without a delta",
                data,
                None,
            ));
        };
        let kind = event
            .index
            .and_then(|index| self.blocks.iter().find(|(i, _)| *i == index))
            .map(|(_, kind)| *kind)
            .ok_or_else(|| {
                InferenceExecutionError::malformed(
                    "a delta for a content block that was never started",
                    data,
                    None,
                )
            })?;
        let mismatch = || {
            InferenceExecutionError::malformed(
                "a delta that does not fit its content block",
                data,
                None,
            )
        };
        match delta.r#type.as_deref().unwrap_or("") {
            "text_delta" => {
                if kind != BlockKind::Text {
                    return Err(mismatch());
                }
                if let Some(text) = delta.text.as_deref().filter(|t| !t.is_empty()) {
                    out.push(LlmStreamEvent::TextDelta(text.to_owned()));
                }
            }
            "thinking_delta" => {
                if kind != BlockKind::Thinking {
                    return Err(mismatch());
                }
                if let Some(text) = delta.thinking.as_deref().filter(|t| !t.is_empty()) {
                    out.push(LlmStreamEvent::ReasoningDelta(text.to_owned()));
                }
            }
            "input_json_delta" => {
                let BlockKind::ToolUse(call) = kind else {
                    // Server tool blocks stream their input too; they are not ours to run.
                    return if kind == BlockKind::Ignored {
                        Ok(())
                    } else {
                        Err(mismatch())
                    };
                };
                if let Some(json) = delta.partial_json.as_deref().filter(|j| !j.is_empty()) {
                    out.push(LlmStreamEvent::ToolCallArgsDelta {
                        index: call,
                        delta: json.to_owned(),
                    });
                }
            }
            // `signature_delta`, `citations_delta` and delta types added later.
            _ => {}
        }
        Ok(())
    }

    fn end(&mut self, out: &mut Vec<LlmStreamEvent>) {
        if let Some(u) = self.usage.take() {
            out.push(LlmStreamEvent::Usage(u.to_usage()));
        }
        let stop = self.stop.take().unwrap_or(if self.calls > 0 {
            StopReason::ToolCalls
        } else {
            StopReason::EndTurn
        });
        out.push(LlmStreamEvent::Stop(stop));
        self.blocks.clear();
        self.done = true;
    }
}
