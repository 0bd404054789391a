//! The translator from the neutral events of one activation to AG-UI 1.0 events, and the
//! [`Encoder`] that writes them as Server-Sent Events (`data: {json}` per event).
//!
//! The translator keeps the protocol's ordering whatever the run does: `RUN_STARTED` first;
//! every text message, reasoning message, tool call and step opened before its content and
//! closed before the run ends; nothing after `RUN_FINISHED` or `RUN_ERROR`.

use std::collections::{BTreeSet, VecDeque};

use awaken_event::{AgentEvent, Message, Role, SuspendTicket, TerminationReason, TokenUsage};
use axum::body::Bytes;
use serde_json::{Map, Value, json};

use crate::live::Frame;
use crate::sse::{self, Encoder};

/// The `reason` of an interrupt that waits for a decision on a tool call.
pub(crate) const TOOL_APPROVAL: &str = "tool_approval";

/// What the translator knows of the run before its first event.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunContext {
    /// The client's `threadId`.
    pub(crate) thread_id: String,
    /// The client's `runId`, echoed on `RUN_STARTED` and `RUN_FINISHED`.
    pub(crate) run_id: String,
    /// The client's `parentRunId`, echoed on `RUN_STARTED`.
    pub(crate) parent_run_id: Option<String>,
    /// A `MESSAGES_SNAPSHOT` to send right after `RUN_STARTED` (a resumed run's thread).
    pub(crate) snapshot: Option<Vec<Value>>,
    /// Calls still waiting from before this activation (a resume that decided only some):
    /// they are interrupts again if the run ends waiting.
    pub(crate) waiting: Vec<SuspendTicket>,
    /// Calls the client holds already (the waiting calls a resume answers, in the snapshot):
    /// their start and arguments are not sent again, only their result.
    pub(crate) announced: Vec<String>,
}

/// A tool call opened with `TOOL_CALL_START` and not yet closed.
#[derive(Debug)]
struct OpenCall {
    id: String,
    /// Whether some argument text was sent as `TOOL_CALL_ARGS`.
    args_sent: bool,
}

/// Translates one activation's events, in order, to AG-UI events.
#[derive(Debug)]
pub(crate) struct Translator {
    ctx: RunContext,
    started: bool,
    /// `RUN_FINISHED` or `RUN_ERROR` was sent: nothing more is.
    done: bool,
    /// The open step's name.
    step: Option<String>,
    /// The assistant message of the current step (text and tool calls share it).
    message: Option<String>,
    messages: u32,
    /// Messages sent to the run in flight, so far.
    added: u32,
    text_open: bool,
    /// The open reasoning message's id.
    reasoning: Option<String>,
    reasonings: u32,
    calls: Vec<OpenCall>,
    interrupts: Vec<Value>,
    /// The state's top-level keys as this stream's events set them.
    keys: BTreeSet<String>,
}

impl Translator {
    pub(crate) fn new(ctx: RunContext) -> Self {
        Self {
            ctx,
            started: false,
            done: false,
            step: None,
            message: None,
            messages: 0,
            added: 0,
            text_open: false,
            reasoning: None,
            reasonings: 0,
            calls: Vec::new(),
            interrupts: Vec::new(),
            keys: BTreeSet::new(),
        }
    }

    /// Whether the run's last event (`RUN_FINISHED` or `RUN_ERROR`) was sent.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// The AG-UI events for `event`.
    pub(crate) fn event(&mut self, event: &AgentEvent, out: &mut Vec<Value>) {
        if self.done {
            return;
        }
        if !self.started {
            self.start(event, out);
            if matches!(event, AgentEvent::RunStart { .. }) {
                return;
            }
        }
        match event {
            // A second start in one stream is not this activation's: it is left out.
            AgentEvent::RunStart { .. } => {}
            AgentEvent::StepStart { step } => {
                self.close_step(out);
                let name = format!("step-{step}");
                out.push(json!({"type": "STEP_STARTED", "stepName": name}));
                self.step = Some(name);
            }
            AgentEvent::StepEnd { .. } => self.close_step(out),
            AgentEvent::TextDelta { delta } => {
                if delta.is_empty() {
                    return;
                }
                self.close_reasoning(out);
                let id = self.message_id();
                if !self.text_open {
                    out.push(
                        json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant"}),
                    );
                    self.text_open = true;
                }
                out.push(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": delta}));
            }
            AgentEvent::ReasoningDelta { delta } => {
                if delta.is_empty() {
                    return;
                }
                self.close_text(out);
                let id = match &self.reasoning {
                    Some(id) => id.clone(),
                    None => {
                        self.reasonings += 1;
                        let id = format!("{}-r{}", self.ctx.run_id, self.reasonings);
                        out.push(json!({"type": "REASONING_START", "messageId": id}));
                        out.push(json!({"type": "REASONING_MESSAGE_START", "messageId": id, "role": "reasoning"}));
                        self.reasoning = Some(id.clone());
                        id
                    }
                };
                out.push(
                    json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": id, "delta": delta}),
                );
            }
            AgentEvent::ToolCallStart { call_id, .. }
            | AgentEvent::ToolCallArgsDelta { call_id, .. }
            | AgentEvent::ToolCallReady { call_id, .. }
                if self.ctx.announced.iter().any(|a| a == call_id.as_str()) => {}
            AgentEvent::ToolCallStart { call_id, name } => {
                self.open_call(call_id.as_str(), name, out);
            }
            AgentEvent::ToolCallArgsDelta { call_id, delta } => {
                if delta.is_empty() {
                    return;
                }
                if let Some(call) = self.calls.iter_mut().find(|c| c.id == call_id.as_str()) {
                    call.args_sent = true;
                    out.push(
                        json!({"type": "TOOL_CALL_ARGS", "toolCallId": call.id, "delta": delta}),
                    );
                }
            }
            AgentEvent::ToolCallReady {
                call_id,
                name,
                arguments,
            } => {
                let id = call_id.as_str();
                if !self.calls.iter().any(|c| c.id == id) {
                    self.open_call(id, name, out);
                }
                let streamed = self.calls.iter().any(|c| c.id == id && c.args_sent);
                if !streamed && !arguments.is_null() {
                    out.push(json!({"type": "TOOL_CALL_ARGS", "toolCallId": id, "delta": arguments.to_string()}));
                }
                self.close_call(id, out);
            }
            AgentEvent::ToolCallDone {
                call_id, result, ..
            } => {
                let id = call_id.as_str();
                self.close_call(id, out);
                let content = match &*result.content {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                out.push(json!({
                    "type": "TOOL_CALL_RESULT",
                    "messageId": result_message_id(id),
                    "toolCallId": id,
                    "content": content,
                    "role": "tool",
                }));
            }
            AgentEvent::ToolCallSuspended { call_id, ticket } => {
                self.close_call(call_id.as_str(), out);
                let interrupt = interrupt(ticket);
                self.interrupts.retain(|i| i["id"] != interrupt["id"]);
                self.interrupts.push(interrupt);
            }
            AgentEvent::ToolCallProgress { call_id, progress } => {
                out.push(json!({
                    "type": "CUSTOM",
                    "name": "awaken.tool_call_progress",
                    "value": {"toolCallId": call_id, "progress": progress},
                }));
            }
            AgentEvent::StateSnapshot { state, .. } => {
                self.keys = state
                    .as_object()
                    .map(|o| o.keys().cloned().collect())
                    .unwrap_or_default();
                out.push(json!({"type": "STATE_SNAPSHOT", "snapshot": state}));
            }
            AgentEvent::StateDelta { changes, .. } => {
                let delta = patch(changes, &mut self.keys);
                if !delta.is_empty() {
                    out.push(json!({"type": "STATE_DELTA", "delta": delta}));
                }
            }
            AgentEvent::Warning { kind, detail } => {
                out.push(json!({
                    "type": "CUSTOM",
                    "name": "awaken.warning",
                    "value": {"kind": kind, "detail": detail},
                }));
            }
            AgentEvent::Error { message } => {
                out.push(json!({"type": "CUSTOM", "name": "awaken.error", "value": {"message": message}}));
            }
            AgentEvent::MessageAdded { message, .. } => self.added(message, out),
            AgentEvent::RunFinish {
                termination,
                response,
                usage,
                ..
            } => self.finish(termination, response.as_deref(), usage, out),
            // Known to the runtime only: the resumed decision shows in the call's result, the
            // inference in the run's usage, a dead-lettered action in the run's own log.
            _ => {}
        }
    }

    /// A notice outside the log: the run cannot be followed to its end on this stream.
    pub(crate) fn notice(&mut self, kind: &str, data: &Value, out: &mut Vec<Value>) {
        let message = data
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("the stream of the run was interrupted");
        self.error(kind, message, out);
    }

    /// The stream ended: a run not finished on it ends with `RUN_ERROR`.
    pub(crate) fn end(&mut self, out: &mut Vec<Value>) {
        self.error(
            "stream_ended",
            "the stream ended before the run finished; the thread holds what it did",
            out,
        );
    }

    /// `RUN_ERROR` with `code`, unless the run's last event was sent.
    fn error(&mut self, code: &str, message: &str, out: &mut Vec<Value>) {
        if self.done {
            return;
        }
        out.push(json!({"type": "RUN_ERROR", "message": message, "code": code}));
        self.done = true;
    }

    fn start(&mut self, event: &AgentEvent, out: &mut Vec<Value>) {
        self.started = true;
        let mut started = json!({
            "type": "RUN_STARTED",
            "threadId": self.ctx.thread_id,
            "runId": self.ctx.run_id,
        });
        if let Some(parent) = &self.ctx.parent_run_id {
            started["parentRunId"] = parent.as_str().into();
        }
        if let AgentEvent::RunStart {
            run_id,
            agent_id,
            resumed,
            ..
        } = event
        {
            started["metadata"] = json!({
                "awaken": {"runId": run_id, "agentId": agent_id, "resumed": resumed},
            });
        }
        out.push(started);
        if let Some(messages) = self.ctx.snapshot.take() {
            out.push(json!({"type": "MESSAGES_SNAPSHOT", "messages": messages}));
        }
    }

    /// The id of the current step's assistant message (a new one at the first need).
    fn message_id(&mut self) -> String {
        if let Some(id) = &self.message {
            return id.clone();
        }
        self.messages += 1;
        let id = format!("{}-m{}", self.ctx.run_id, self.messages);
        self.message = Some(id.clone());
        id
    }

    /// A message sent to the run in flight, as a text message of its role (a tool message is
    /// not one a client sends).
    fn added(&mut self, message: &Message, out: &mut Vec<Value>) {
        let role = match message.role {
            Role::User => "user",
            Role::System => "system",
            Role::Assistant => "assistant",
            Role::Tool => return,
        };
        self.close_step(out);
        self.added += 1;
        let id = format!("{}-u{}", self.ctx.run_id, self.added);
        out.push(json!({"type": "TEXT_MESSAGE_START", "messageId": id, "role": role}));
        let text = message.text();
        if !text.is_empty() {
            out.push(json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": text}));
        }
        out.push(json!({"type": "TEXT_MESSAGE_END", "messageId": id}));
    }

    fn open_call(&mut self, id: &str, name: &str, out: &mut Vec<Value>) {
        self.close_text(out);
        self.close_reasoning(out);
        if self.calls.iter().any(|c| c.id == id) {
            return;
        }
        let parent = self.message_id();
        out.push(json!({
            "type": "TOOL_CALL_START",
            "toolCallId": id,
            "toolCallName": name,
            "parentMessageId": parent,
        }));
        self.calls.push(OpenCall {
            id: id.to_owned(),
            args_sent: false,
        });
    }

    fn close_call(&mut self, id: &str, out: &mut Vec<Value>) {
        if let Some(at) = self.calls.iter().position(|c| c.id == id) {
            self.calls.remove(at);
            out.push(json!({"type": "TOOL_CALL_END", "toolCallId": id}));
        }
    }

    fn close_text(&mut self, out: &mut Vec<Value>) {
        if self.text_open {
            self.text_open = false;
            if let Some(id) = &self.message {
                out.push(json!({"type": "TEXT_MESSAGE_END", "messageId": id}));
            }
        }
    }

    fn close_reasoning(&mut self, out: &mut Vec<Value>) {
        if let Some(id) = self.reasoning.take() {
            out.push(json!({"type": "REASONING_MESSAGE_END", "messageId": id}));
            out.push(json!({"type": "REASONING_END", "messageId": id}));
        }
    }

    /// Closes everything the step opened, then the step.
    fn close_step(&mut self, out: &mut Vec<Value>) {
        self.close_text(out);
        self.close_reasoning(out);
        for call in std::mem::take(&mut self.calls) {
            out.push(json!({"type": "TOOL_CALL_END", "toolCallId": call.id}));
        }
        self.message = None;
        if let Some(name) = self.step.take() {
            out.push(json!({"type": "STEP_FINISHED", "stepName": name}));
        }
    }

    fn finish(
        &mut self,
        termination: &TerminationReason,
        response: Option<&str>,
        usage: &TokenUsage,
        out: &mut Vec<Value>,
    ) {
        self.close_step(out);
        let mut finished = json!({
            "type": "RUN_FINISHED",
            "threadId": self.ctx.thread_id,
            "runId": self.ctx.run_id,
        });
        match termination {
            TerminationReason::Error { message } => {
                return self.error("run_failed", message, out);
            }
            TerminationReason::Suspended => {
                let mut interrupts: Vec<Value> = self
                    .ctx
                    .waiting
                    .iter()
                    .map(interrupt)
                    .filter(|i| !self.interrupts.iter().any(|n| n["id"] == i["id"]))
                    .collect();
                interrupts.append(&mut self.interrupts);
                if interrupts.is_empty() {
                    return self.error(
                        "no_interrupts",
                        "the run waits for decisions, but no waiting call is known to this stream: GET /v1/threads/{thread} lists them",
                        out,
                    );
                }
                finished["outcome"] = json!({"type": "interrupt", "interrupts": interrupts});
            }
            TerminationReason::Cancelled => {
                finished["outcome"] = json!({"type": "cancelled"});
            }
            other => {
                finished["outcome"] = json!({"type": "success"});
                if let Some(text) = response {
                    finished["result"] = text.into();
                }
                if let TerminationReason::Stopped { code, detail } = other {
                    finished["metadata"] =
                        json!({"awaken": {"stopped": {"code": code, "detail": detail}}});
                }
            }
        }
        if usage.input_tokens > 0 || usage.output_tokens > 0 {
            finished["usage"] = json!([{
                "inputTokens": usage.input_tokens,
                "outputTokens": usage.output_tokens,
                "totalTokens": usage.total(),
            }]);
        }
        out.push(finished);
        self.done = true;
    }
}

/// The id of the tool message that carries `call_id`'s result.
pub(crate) fn result_message_id(call_id: &str) -> String {
    format!("{call_id}-result")
}

/// A suspended call as an AG-UI interrupt: its id is the call's; its metadata shows the tool,
/// the arguments and their digest (which a resume entry may send back), and what is asked.
pub(crate) fn interrupt(ticket: &SuspendTicket) -> Value {
    let call = &ticket.call;
    let mut interrupt = json!({
        "id": call.call_id,
        "reason": TOOL_APPROVAL,
        "message": ticket.message,
        "toolCallId": call.call_id,
        "metadata": {
            "toolName": call.tool_name,
            "arguments": call.arguments,
            "argumentDigest": call.argument_digest,
            "suspensionId": ticket.suspension_id,
            "resumeMode": ticket.resume_mode,
        },
    });
    if let Some(schema @ Value::Object(_)) = &ticket.response_schema {
        interrupt["responseSchema"] = schema.clone();
    }
    interrupt
}

/// A state delta's `changes` (key → new value, `null` for a removed key) as JSON Patch
/// operations on the top-level keys: `replace` for a key the stream set before (`keys`), `add`
/// for another, `remove` for a removed key the stream set (a `remove` of a key the client may
/// not hold would fail the whole patch there, so it is left out).
pub(crate) fn patch(changes: &Value, keys: &mut BTreeSet<String>) -> Vec<Value> {
    let Some(changes) = changes.as_object() else {
        return Vec::new();
    };
    let mut ops = Vec::with_capacity(changes.len());
    for (key, value) in changes {
        let path = format!("/{}", key.replace('~', "~0").replace('/', "~1"));
        match value {
            Value::Null if keys.remove(key) => ops.push(json!({"op": "remove", "path": path})),
            Value::Null => {}
            v if keys.contains(key) => {
                ops.push(json!({"op": "replace", "path": path, "value": v}));
            }
            v => {
                keys.insert(key.clone());
                ops.push(json!({"op": "add", "path": path, "value": v}));
            }
        }
    }
    ops
}

/// A thread's messages as AG-UI messages, for `MESSAGES_SNAPSHOT`. Stored messages carry no
/// id: each gets `{thread}-{index}`, and a tool message the id of its call's result (the same
/// `TOOL_CALL_RESULT` uses). Tool messages of the calls in `skip` (those waiting, whose stored
/// message is a placeholder) are left out.
pub(crate) fn messages_snapshot(thread: &str, messages: &[Message], skip: &[String]) -> Vec<Value> {
    let mut out = Vec::with_capacity(messages.len());
    for (index, m) in messages.iter().enumerate() {
        let id = format!("{thread}-{index}");
        let text = m.text();
        let value = match m.role {
            Role::System => json!({"id": id, "role": "system", "content": text}),
            Role::User => json!({"id": id, "role": "user", "content": text}),
            Role::Assistant => {
                let mut a = Map::new();
                a.insert("id".into(), id.into());
                a.insert("role".into(), "assistant".into());
                if !text.is_empty() {
                    a.insert("content".into(), text.into());
                }
                if !m.tool_calls.is_empty() {
                    let calls: Vec<Value> = m
                        .tool_calls
                        .iter()
                        .map(|c| {
                            let arguments = match &c.invalid_arguments {
                                Some(raw) => raw.clone(),
                                None => c.arguments.to_string(),
                            };
                            json!({
                                "id": c.id,
                                "type": "function",
                                "function": {"name": c.name, "arguments": arguments},
                            })
                        })
                        .collect();
                    a.insert("toolCalls".into(), calls.into());
                }
                Value::Object(a)
            }
            Role::Tool => {
                let Some(call) = &m.tool_call_id else {
                    continue;
                };
                if skip.iter().any(|s| s == call.as_str()) {
                    continue;
                }
                json!({
                    "id": result_message_id(call.as_str()),
                    "role": "tool",
                    "toolCallId": call,
                    "content": m.content_as_text(),
                })
            }
        };
        out.push(value);
    }
    out
}

/// The AG-UI stream of one activation: each translated event as `data: {json}`.
pub(crate) struct AguiEncoder {
    translator: Translator,
    buf: Vec<Value>,
}

impl AguiEncoder {
    pub(crate) fn new(ctx: RunContext) -> Self {
        Self {
            translator: Translator::new(ctx),
            buf: Vec::new(),
        }
    }

    fn flush(&mut self, out: &mut VecDeque<Bytes>) {
        for event in self.buf.drain(..) {
            out.push_back(sse::data(&event));
        }
    }
}

impl Encoder for AguiEncoder {
    fn frame(&mut self, frame: &Frame, out: &mut VecDeque<Bytes>) {
        match frame.event() {
            Some(event) => self.translator.event(&event, &mut self.buf),
            None => self.translator.error(
                "unreadable_event",
                "the server could not write one of the run's events",
                &mut self.buf,
            ),
        }
        self.flush(out);
    }

    fn notice(&mut self, kind: &str, data: &Value, out: &mut VecDeque<Bytes>) {
        self.translator.notice(kind, data, &mut self.buf);
        self.flush(out);
    }

    fn end(&mut self, out: &mut VecDeque<Bytes>) {
        self.translator.end(&mut self.buf);
        self.flush(out);
    }

    fn complete(&self) -> bool {
        self.translator.is_done()
    }
}
