//! Decoding a chat-completions SSE stream (or a whole completion) into [`LlmStreamEvent`]s.

use std::sync::atomic::{AtomicU64, Ordering};

use awaken_event::{StopReason, TokenUsage, ToolCallId};

use super::wire::{Chunk, ToolCallDelta, stop_reason};
use crate::error::InferenceExecutionError;
use crate::event::LlmStreamEvent;
use crate::sse::{SseEvent, SseParser};

/// The longest SSE line or event accepted (a chunk is normally a few hundred bytes).
pub(crate) const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug)]
struct CallSlot {
    wire_index: u32,
    id: Option<String>,
    name: String,
    started: bool,
    out_index: u32,
    pending_args: String,
}

/// Turns a chat-completions response body into [`LlmStreamEvent`]s. IO-free: feed it the
/// body's bytes in pieces of any size with [`ChatStreamDecoder::push`], then call
/// [`ChatStreamDecoder::finish`] at the end of the body.
///
/// - Tool-call fragments are assembled per wire `index`; a call's `ToolCallStart` is emitted
///   once its name is known (argument fragments that came earlier follow it at once). A call
///   without an id gets a generated one (`call_<unique>`).
/// - `Usage` (the last one a chunk carried, e.g. the final chunk sent for
///   `stream_options.include_usage`) and `Stop` are emitted together at the end: at
///   `data: [DONE]`, or at the end of the body when a `finish_reason` was seen. A body that
///   ends with neither is an interrupted stream.
/// - `finish_reason: "stop"` after tool calls is reported as `StopReason::ToolCalls` (some
///   servers send `stop` there).
/// - A chunk that is not valid JSON is [`InferenceExecutionError::MalformedResponse`]; an
///   `{"error": ...}` chunk becomes the error it describes.
#[derive(Debug, Default)]
pub struct ChatStreamDecoder {
    sse: SseParser,
    calls: Vec<CallSlot>,
    usage: Option<TokenUsage>,
    finish: Option<StopReason>,
    done: bool,
}

impl ChatStreamDecoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the stream is complete (the `Stop` event was emitted); later bytes are ignored.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Feeds the next piece of the SSE body, appending the events it completes to `out`.
    pub fn push(
        &mut self,
        bytes: &[u8],
        out: &mut Vec<LlmStreamEvent>,
    ) -> Result<(), InferenceExecutionError> {
        if self.done {
            return Ok(());
        }
        let Self {
            sse,
            calls,
            usage,
            finish,
            done,
        } = self;
        let mut state = DecodeState {
            calls,
            usage,
            finish,
            done,
        };
        sse.push(bytes, |event: SseEvent<'_>| state.on_sse(event, out))?;
        if sse.buffered_len() > MAX_EVENT_BYTES {
            return Err(InferenceExecutionError::malformed(
                format!("an SSE event grew past {MAX_EVENT_BYTES} bytes without ending"),
                "",
                None,
            ));
        }
        Ok(())
    }

    /// Ends the body: emits the final `Usage`/`Stop` when a `finish_reason` was seen without
    /// `[DONE]`, and fails with [`InferenceExecutionError::StreamInterrupted`] when neither was.
    pub fn finish(&mut self, out: &mut Vec<LlmStreamEvent>) -> Result<(), InferenceExecutionError> {
        if self.done {
            return Ok(());
        }
        if self.finish.is_none() {
            return Err(InferenceExecutionError::interrupted(
                "the response body ended before the stream was complete (no finish_reason and no [DONE])",
            ));
        }
        let Self {
            calls,
            usage,
            finish,
            done,
            ..
        } = self;
        DecodeState {
            calls,
            usage,
            finish,
            done,
        }
        .end(out)
    }

    /// Decodes a whole non-streamed completion body into the events a stream would have
    /// carried.
    pub fn decode_completion(body: &[u8]) -> Result<Vec<LlmStreamEvent>, InferenceExecutionError> {
        let text = std::str::from_utf8(body).map_err(|_| {
            InferenceExecutionError::malformed(
                "the completion is not UTF-8",
                &String::from_utf8_lossy(body),
                None,
            )
        })?;
        let mut decoder = Self::new();
        let mut out = Vec::new();
        let mut state = DecodeState {
            calls: &mut decoder.calls,
            usage: &mut decoder.usage,
            finish: &mut decoder.finish,
            done: &mut decoder.done,
        };
        state.on_json(text, &mut out)?;
        if state.finish.is_none() {
            *state.finish = Some(StopReason::EndTurn);
        }
        state.end(&mut out)?;
        Ok(out)
    }
}

struct DecodeState<'s> {
    calls: &'s mut Vec<CallSlot>,
    usage: &'s mut Option<TokenUsage>,
    finish: &'s mut Option<StopReason>,
    done: &'s mut bool,
}

impl DecodeState<'_> {
    fn on_sse(
        &mut self,
        event: SseEvent<'_>,
        out: &mut Vec<LlmStreamEvent>,
    ) -> Result<(), InferenceExecutionError> {
        if *self.done {
            return Ok(());
        }
        let data = event.data.trim();
        if data == "[DONE]" {
            return self.end(out);
        }
        if data.is_empty() {
            return Ok(());
        }
        self.on_json(data, out)
    }

    fn on_json(
        &mut self,
        data: &str,
        out: &mut Vec<LlmStreamEvent>,
    ) -> Result<(), InferenceExecutionError> {
        let chunk: Chunk<'_> = serde_json::from_str(data).map_err(|e| {
            let reason = if e.is_data() {
                "a chunk does not have the shape of a chat-completion chunk"
            } else {
                "a chunk is not valid JSON"
            };
            InferenceExecutionError::malformed(reason, data, Some(e))
        })?;
        if let Some(error) = &chunk.error {
            return Err(error.to_error());
        }
        if let Some(u) = &chunk.usage {
            *self.usage = Some(u.to_usage());
        }
        // Only the first choice is used (n = 1 is what the executor asks for).
        let Some(choice) = chunk.choices.as_ref().and_then(|c| c.0.as_ref()) else {
            return Ok(());
        };
        if let Some(delta) = &choice.delta {
            let reasoning = delta
                .reasoning_content
                .as_ref()
                .or(delta.reasoning.as_ref());
            if let Some(r) = reasoning.filter(|r| !r.0.is_empty()) {
                out.push(LlmStreamEvent::ReasoningDelta(r.0.to_string()));
            }
            if let Some(c) = delta.content.as_ref().filter(|c| !c.0.is_empty()) {
                out.push(LlmStreamEvent::TextDelta(c.0.to_string()));
            }
            if let Some(calls) = &delta.tool_calls {
                for (position, call) in calls.iter().enumerate() {
                    self.on_tool_call(call, position, out);
                }
            }
        }
        if let Some(reason) = &choice.finish_reason {
            *self.finish = Some(stop_reason(&reason.0));
        }
        Ok(())
    }

    fn on_tool_call(
        &mut self,
        call: &ToolCallDelta<'_>,
        position: usize,
        out: &mut Vec<LlmStreamEvent>,
    ) {
        let id = call
            .id
            .as_ref()
            .map(|i| i.0.as_ref())
            .filter(|i| !i.is_empty());
        let slot = match call.index {
            Some(index) => self.calls.iter().position(|s| s.wire_index == index),
            // No index (some servers): match by id, else continue the last call.
            None => match id {
                Some(id) => self.calls.iter().position(|s| s.id.as_deref() == Some(id)),
                None if position == 0 && !self.calls.is_empty() => Some(self.calls.len() - 1),
                None => None,
            },
        };
        let slot = match slot {
            Some(i) => i,
            None => {
                let wire_index = call.index.unwrap_or(self.calls.len() as u32);
                self.calls.push(CallSlot {
                    wire_index,
                    id: None,
                    name: String::new(),
                    started: false,
                    out_index: self.calls.len() as u32,
                    pending_args: String::new(),
                });
                self.calls.len() - 1
            }
        };
        let s = &mut self.calls[slot];
        if s.id.is_none() {
            s.id = id.map(str::to_owned);
        }
        let function = call.function.as_ref();
        if let Some(name) = function.and_then(|f| f.name.as_ref())
            && !s.started
        {
            s.name.push_str(&name.0);
        }
        let args = function
            .and_then(|f| f.arguments.as_ref())
            .map(|a| a.0.as_ref())
            .unwrap_or("");
        if !s.started && !s.name.is_empty() {
            s.started = true;
            let id =
                s.id.as_deref()
                    .and_then(|i| ToolCallId::new(i).ok())
                    .unwrap_or_else(generated_call_id);
            out.push(LlmStreamEvent::ToolCallStart {
                index: s.out_index,
                id,
                name: s.name.clone(),
            });
            let mut pending = std::mem::take(&mut s.pending_args);
            pending.push_str(args);
            if !pending.is_empty() {
                out.push(LlmStreamEvent::ToolCallArgsDelta {
                    index: s.out_index,
                    delta: pending,
                });
            }
        } else if s.started {
            if !args.is_empty() {
                out.push(LlmStreamEvent::ToolCallArgsDelta {
                    index: s.out_index,
                    delta: args.to_owned(),
                });
            }
        } else {
            s.pending_args.push_str(args);
        }
    }

    fn end(&mut self, out: &mut Vec<LlmStreamEvent>) -> Result<(), InferenceExecutionError> {
        if let Some(unnamed) = self.calls.iter().find(|s| !s.started) {
            return Err(InferenceExecutionError::malformed(
                format!("tool call {} never got a name", unnamed.wire_index),
                &unnamed.pending_args,
                None,
            ));
        }
        if let Some(u) = self.usage.take() {
            out.push(LlmStreamEvent::Usage(u));
        }
        let mut stop = self.finish.take().unwrap_or(StopReason::EndTurn);
        if stop == StopReason::EndTurn && !self.calls.is_empty() {
            stop = StopReason::ToolCalls;
        }
        out.push(LlmStreamEvent::Stop(stop));
        *self.done = true;
        Ok(())
    }
}

/// A call id for a provider that sent none: unique within the process and across restarts.
fn generated_call_id() -> ToolCallId {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let text = format!("call_{nanos:x}{n:x}");
    match ToolCallId::new(&text) {
        Ok(id) => id,
        // `text` is ASCII alphanumerics and `_`, never empty or long; this arm is unreachable
        // in practice but kept free of panics.
        Err(_) => generated_call_id(),
    }
}
