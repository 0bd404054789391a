//! The translator from the neutral events to the AI SDK's UI message chunks: one assistant
//! message per activation, written as `data: {chunk}` Server-Sent Events and closed by
//! `data: [DONE]`.

use std::collections::{HashSet, VecDeque};

use awaken_event::{
    AgentEvent, ResumeDecision, StopReason, TerminationReason, ToolCallState, ToolResultStatus,
};
use axum::body::Bytes;
use serde_json::{Value, json};

use crate::live::Frame;
use crate::sse::{self, Encoder};

/// The response header that marks a UI message stream.
pub(crate) const STREAM_HEADER: &str = "x-vercel-ai-ui-message-stream";

/// The version of the UI message stream protocol written.
pub(crate) const STREAM_VERSION: &str = "v1";

/// A text or reasoning block open in the message, with its chunk id.
enum Block {
    Text(String),
    Reasoning(String),
}

/// Writes one activation's events as UI message chunks.
///
/// Every block it starts (text, reasoning, step) is ended before `finish` or `error`; the stream
/// is complete after the run's `RunFinish` or a notice that it cannot be followed, and always
/// ends with `data: [DONE]`.
#[derive(Default)]
pub(crate) struct UiMessageEncoder {
    /// Whether `start` was written.
    started: bool,
    /// The open text or reasoning block.
    block: Option<Block>,
    /// Blocks started so far (their ids are numbered by it).
    blocks: u32,
    /// Whether a step is open.
    step: bool,
    /// Calls whose input the client's message already shows (a resumed call is not announced
    /// again).
    known: HashSet<String>,
    /// Calls whose input was started in this stream (their argument deltas are forwarded).
    streaming: HashSet<String>,
    /// Calls a decision denied (closed as `tool-output-denied`).
    denied: HashSet<String>,
    /// Why the model stopped last.
    stop: Option<StopReason>,
    /// Whether `finish` or `error` was written: nothing follows but `[DONE]`.
    done: bool,
}

impl UiMessageEncoder {
    /// An encoder for a client that has nothing of the message yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// An encoder for a client whose message already shows these calls (an approval's
    /// continuation): their inputs are not sent again, only how they end.
    pub(crate) fn continuing(known: impl IntoIterator<Item = String>) -> Self {
        Self {
            known: known.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Writes the chunks of `event`.
    pub(crate) fn event(&mut self, event: &AgentEvent, out: &mut VecDeque<Bytes>) {
        if self.done {
            return;
        }
        if !self.started {
            self.started = true;
            let mut start = json!({"type": "start"});
            if let AgentEvent::RunStart {
                run_id, thread_id, ..
            } = event
            {
                // A resumed activation keeps its run id: the continuation of an approval is the
                // same assistant message.
                start["messageId"] = json!(run_id);
                start["messageMetadata"] = json!({"threadId": thread_id, "runId": run_id});
            }
            chunk(out, &start);
        }
        match event {
            AgentEvent::StepStart { .. } => {
                self.close_block(out);
                if self.step {
                    chunk(out, &json!({"type": "finish-step"}));
                }
                self.step = true;
                chunk(out, &json!({"type": "start-step"}));
            }
            AgentEvent::StepEnd { .. } => self.close_step(out),
            AgentEvent::TextDelta { delta } => {
                let id = self.open_text(out);
                chunk(
                    out,
                    &json!({"type": "text-delta", "id": id, "delta": delta}),
                );
            }
            AgentEvent::ReasoningDelta { delta } => {
                let id = self.open_reasoning(out);
                chunk(
                    out,
                    &json!({"type": "reasoning-delta", "id": id, "delta": delta}),
                );
            }
            AgentEvent::ToolCallStart { call_id, name } => {
                self.close_block(out);
                if !self.known.contains(call_id.as_str()) {
                    self.streaming.insert(call_id.to_string());
                    chunk(
                        out,
                        &json!({"type": "tool-input-start", "toolCallId": call_id, "toolName": name}),
                    );
                }
            }
            AgentEvent::ToolCallArgsDelta { call_id, delta }
                if self.streaming.contains(call_id.as_str()) =>
            {
                chunk(
                    out,
                    &json!({"type": "tool-input-delta", "toolCallId": call_id, "inputTextDelta": delta}),
                );
            }
            AgentEvent::ToolCallReady {
                call_id,
                name,
                arguments,
            } => {
                self.close_block(out);
                self.streaming.remove(call_id.as_str());
                if !self.known.contains(call_id.as_str()) {
                    chunk(
                        out,
                        &json!({
                            "type": "tool-input-available",
                            "toolCallId": call_id,
                            "toolName": name,
                            "input": &**arguments,
                        }),
                    );
                }
            }
            AgentEvent::ToolCallSuspended { call_id, ticket } => {
                self.close_block(out);
                chunk(
                    out,
                    &json!({
                        "type": "tool-approval-request",
                        "approvalId": call_id,
                        "toolCallId": call_id,
                        "reason": ticket.message,
                    }),
                );
            }
            AgentEvent::ToolCallResumed {
                call_id,
                decision: ResumeDecision::Deny,
            } => {
                self.denied.insert(call_id.to_string());
            }
            AgentEvent::ToolCallDone {
                call_id,
                result,
                state,
            } => {
                self.close_block(out);
                let denied =
                    *state == ToolCallState::Cancelled && self.denied.contains(call_id.as_str());
                let failed = result.status == ToolResultStatus::Error
                    || matches!(
                        state,
                        ToolCallState::Failed
                            | ToolCallState::Blocked
                            | ToolCallState::Cancelled
                            | ToolCallState::OutcomeUnknown
                    );
                let part = if denied {
                    json!({"type": "tool-output-denied", "toolCallId": call_id})
                } else if failed {
                    json!({
                        "type": "tool-output-error",
                        "toolCallId": call_id,
                        "errorText": error_text(&result.content, *state),
                    })
                } else {
                    json!({"type": "tool-output-available", "toolCallId": call_id, "output": &*result.content})
                };
                chunk(out, &part);
            }
            AgentEvent::InferenceComplete { stop_reason, .. } => self.stop = Some(*stop_reason),
            AgentEvent::RunFinish {
                thread_id,
                run_id,
                termination,
                usage,
                ..
            } => {
                self.close_step(out);
                if let TerminationReason::Error { message } = &**termination {
                    chunk(out, &json!({"type": "error", "errorText": message}));
                } else {
                    chunk(
                        out,
                        &json!({
                            "type": "finish",
                            "finishReason": finish_reason(termination, self.stop),
                            "messageMetadata": {
                                "threadId": thread_id,
                                "runId": run_id,
                                "termination": termination,
                                "usage": usage,
                            },
                        }),
                    );
                }
                self.done = true;
            }
            // Progress, state, warnings and in-run errors have no chunk of their own (the run's
            // end says whether it failed), nor a user's message added to the run (the stream is
            // the assistant's message).
            _ => {}
        }
    }

    /// The id of the open text block, starting one if another block is open.
    fn open_text(&mut self, out: &mut VecDeque<Bytes>) -> String {
        if let Some(Block::Text(id)) = &self.block {
            return id.clone();
        }
        self.close_block(out);
        self.blocks += 1;
        let id = format!("text-{}", self.blocks);
        chunk(out, &json!({"type": "text-start", "id": id}));
        self.block = Some(Block::Text(id.clone()));
        id
    }

    /// The id of the open reasoning block, starting one if another block is open.
    fn open_reasoning(&mut self, out: &mut VecDeque<Bytes>) -> String {
        if let Some(Block::Reasoning(id)) = &self.block {
            return id.clone();
        }
        self.close_block(out);
        self.blocks += 1;
        let id = format!("reasoning-{}", self.blocks);
        chunk(out, &json!({"type": "reasoning-start", "id": id}));
        self.block = Some(Block::Reasoning(id.clone()));
        id
    }

    fn close_block(&mut self, out: &mut VecDeque<Bytes>) {
        match self.block.take() {
            Some(Block::Text(id)) => chunk(out, &json!({"type": "text-end", "id": id})),
            Some(Block::Reasoning(id)) => chunk(out, &json!({"type": "reasoning-end", "id": id})),
            None => {}
        }
    }

    fn close_step(&mut self, out: &mut VecDeque<Bytes>) {
        self.close_block(out);
        if std::mem::take(&mut self.step) {
            chunk(out, &json!({"type": "finish-step"}));
        }
    }

    /// Ends the message with an `error` chunk, after closing what is open.
    fn fail(&mut self, message: &str, out: &mut VecDeque<Bytes>) {
        if self.done {
            return;
        }
        if !self.started {
            self.started = true;
            chunk(out, &json!({"type": "start"}));
        }
        self.close_step(out);
        chunk(out, &json!({"type": "error", "errorText": message}));
        self.done = true;
    }
}

impl Encoder for UiMessageEncoder {
    fn frame(&mut self, frame: &Frame, out: &mut VecDeque<Bytes>) {
        match frame.event() {
            Some(event) => self.event(&event, out),
            None => self.fail(
                &format!("event {} could not be written to the stream", frame.id),
                out,
            ),
        }
    }

    fn notice(&mut self, kind: &str, data: &Value, out: &mut VecDeque<Bytes>) {
        // A client that fell behind gets the stored events that follow: the message goes on
        // without the text deltas it missed.
        if kind == "lagged" {
            return;
        }
        let message = if kind == "shutdown" {
            "the server is shutting down; the run goes on from its last checkpoint when it restarts"
                .to_owned()
        } else {
            data.get("message")
                .and_then(Value::as_str)
                .map_or_else(|| format!("the stream ended: {kind}"), str::to_owned)
        };
        self.fail(&message, out);
    }

    fn end(&mut self, out: &mut VecDeque<Bytes>) {
        self.fail("the stream ended before the run finished", out);
        out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
    }

    fn complete(&self) -> bool {
        self.done
    }
}

/// Writes one chunk as an SSE `data` line.
fn chunk(out: &mut VecDeque<Bytes>, value: &Value) {
    out.push_back(sse::data(value));
}

/// The AI SDK's finish reason for an activation that ended as `termination`, the model having
/// stopped last for `stop`.
fn finish_reason(termination: &TerminationReason, stop: Option<StopReason>) -> &'static str {
    match termination {
        TerminationReason::NaturalEnd => match stop {
            Some(StopReason::MaxTokens) => "length",
            Some(StopReason::ContentFiltered) => "content-filter",
            _ => "stop",
        },
        TerminationReason::Suspended => "tool-calls",
        TerminationReason::Cancelled => "interrupted",
        TerminationReason::Error { .. } => "error",
        _ => "other",
    }
}

/// The text of a failed call's result: a string as it is, other JSON as its text.
fn error_text(content: &Value, state: ToolCallState) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Null => format!("the call ended {state}"),
        other => other.to_string(),
    }
}
