//! One inference: the request built from the agent, the run and the step's directives (its
//! user turns merged and its results in call order, as the model is sent them), the model's
//! stream relayed as events and collected into a response, and what a cancelled or failed
//! stream leaves.

use std::sync::Arc;

use awaken_event::{
    AgentEvent, ContentBlock, EventSink, History, InferenceResponse, Message, Role, StopReason,
    ToolCallState, ToolDescriptor, ToolResult,
};
use awaken_llm::{
    CancellableStream, ErrorClass, InferenceExecutionError, InferenceRequest, LlmStreamEvent,
};
use awaken_state::Snapshot;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tracing::Instrument;

use crate::builtins::StepDirectives;
use crate::builtins::read_key;
use crate::run::{Failure, Run};
use crate::turns;

impl Run<'_> {
    /// The current step's directives in `snapshot` (none when they are an earlier step's).
    pub(super) fn directives_in(&self, snapshot: &Snapshot) -> StepDirectives {
        match read_key(snapshot, self.directives_at) {
            Ok(d) if d.step == self.step => d.clone(),
            _ => StepDirectives::default(),
        }
    }

    /// The step's request: the run's history (with the directives' context messages), the
    /// agent's tools (narrowed by the directives), the agent's inference settings under the
    /// run's and then the step's overrides.
    pub(super) fn request(&self, directives: &StepDirectives) -> InferenceRequest {
        let spec = &self.resolved.spec;
        // The agent's tools are the same every step: shared, unless a directive narrows them.
        let tools: Arc<[ToolDescriptor]> =
            if directives.excluded_tools.is_empty() && directives.include_only.is_none() {
                self.tools.clone()
            } else {
                self.tools
                    .iter()
                    .filter(|d| !directives.excluded_tools.contains(&d.id))
                    .filter(|d| {
                        directives
                            .include_only
                            .as_ref()
                            .is_none_or(|only| only.contains(&d.id))
                    })
                    .cloned()
                    .collect()
            };
        let messages: History = if directives.context_messages.is_empty() {
            self.history.clone()
        } else {
            let mut messages = self.history.to_vec();
            messages.extend(
                directives
                    .context_messages
                    .iter()
                    .map(|t| Message::system(t.clone())),
            );
            messages.into()
        };
        let mut overrides = spec.inference.clone();
        if let Some(run) = self.run_override.as_deref() {
            overrides = overrides.merge(run);
        }
        overrides = overrides.merge(&directives.inference);
        let (model, system_prompt, routing_key) = &self.request_strings;
        // Built whole: `InferenceRequest::new` would take the process-wide empty tool slice
        // (`Arc::default()`, one count every worker thread changes) only to drop it again.
        InferenceRequest {
            upstream_model: model.clone(),
            messages,
            tools,
            system_prompt: system_prompt.clone(),
            overrides,
            routing_key: Some(routing_key.clone()),
        }
    }

    /// `request` as the model is sent it: each run of adjacent user messages merged into one,
    /// each assistant message's results in call order (see `turns`). Done after the
    /// transforms, which count and cut the thread's messages as they are stored (a compaction
    /// summary covers a number of them). A request holding the history itself is looked at
    /// only past the messages seen before; one whose messages a directive or transform rebuilt
    /// (a copy already) is looked at whole.
    pub(super) fn alternating(&mut self, mut request: InferenceRequest) -> InferenceRequest {
        let first = if History::ptr_eq(&request.messages, &self.history) {
            let first = turns::first_irregular(&self.history, self.alternating as usize);
            // Below the true count when it does not fit: only more is looked at again.
            self.alternating =
                u32::try_from(first.unwrap_or(self.history.len())).unwrap_or(u32::MAX);
            first
        } else {
            turns::first_irregular(&request.messages, 0)
        };
        if let Some(first) = first {
            request.messages = turns::regular(&request.messages, first).into();
        }
        request
    }

    /// [`Run::stream_inference`] in a `chat` span with the OpenTelemetry GenAI attributes: the
    /// provider and model asked, and the usage and finish reason of the answer; with the
    /// runtime's `with_span_content`, the messages sent and received too.
    pub(super) async fn infer(
        &mut self,
        request: InferenceRequest,
    ) -> Result<InferenceResponse, Failure> {
        let asked = request.effective_model_shared();
        let model = &*asked;
        let span = tracing::info_span!(
            "chat",
            otel.name = %format_args!("chat {model}"),
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = self.resolved.executor.name(),
            gen_ai.request.model = model,
            gen_ai.response.model = tracing::field::Empty,
            gen_ai.response.finish_reasons = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            gen_ai.conversation.id = %self.identity.thread_id,
            error.type = tracing::field::Empty,
            gen_ai.system_instructions = tracing::field::Empty,
            gen_ai.input.messages = tracing::field::Empty,
            gen_ai.output.messages = tracing::field::Empty,
        );
        // Rendered only when asked for and someone listens: no cost otherwise.
        let content = self.span_content && !span.is_disabled();
        if content {
            if let Some(system) = &request.system_prompt {
                let instructions = json!([{"type": "text", "content": &**system}]);
                span.record(
                    "gen_ai.system_instructions",
                    instructions.to_string().as_str(),
                );
            }
            let input: Vec<Value> = request.messages.iter().map(message_json).collect();
            span.record(
                "gen_ai.input.messages",
                Value::Array(input).to_string().as_str(),
            );
        }
        let response = self
            .stream_inference(request, Arc::clone(&asked))
            .instrument(span.clone())
            .await;
        if let Ok(r) = &response
            && !span.is_disabled()
        {
            span.record(
                "gen_ai.response.finish_reasons",
                finish_reason(r.stop_reason),
            );
            span.record("gen_ai.usage.input_tokens", r.usage.input_tokens);
            span.record("gen_ai.usage.output_tokens", r.usage.output_tokens);
            if content {
                let mut output = message_json(&r.message);
                output["finish_reason"] = finish_reason(r.stop_reason).into();
                span.record(
                    "gen_ai.output.messages",
                    Value::Array(vec![output]).to_string().as_str(),
                );
            }
        }
        response
    }

    /// Streams `request` to the agent's model: text, reasoning and tool-call deltas relayed as
    /// events as they come, the response collected. A cancelled stream keeps the text written
    /// so far as an incomplete assistant message; the calls a failed stream began are closed.
    /// `model` is the model asked (`request.effective_model_shared()`), until a pool names the
    /// member that answers.
    async fn stream_inference(
        &mut self,
        request: InferenceRequest,
        mut model: Arc<str>,
    ) -> Result<InferenceResponse, Failure> {
        let started = tokio::time::Instant::now();
        // The run's one wait for its cancellation, lent to each inference's stream: its waker
        // is registered with the token once per run, not once per inference.
        let waiter = self
            .inference_waiter
            .take()
            .unwrap_or_else(|| self.cancel.clone().into_cancelled());
        let mut stream =
            CancellableStream::with_waiter(self.resolved.executor.execute_stream(request), waiter);
        // The run's collector and list of begun calls (`stream_calls`: by stream index, a few,
        // searched, not hashed) are used in place: their lists keep their room from one
        // inference to the next, and the inference's future holds no second copy. Every way
        // out of this function empties them; emptied here too, so an inference abandoned
        // mid-stream could never leave its text or calls to the next.
        self.collector.clear();
        self.stream_calls.clear();
        let mut failure = None;
        while let Some(item) = stream.next().await {
            let event = match item {
                Ok(e) => e,
                Err(e) => {
                    tracing::Span::current().record("error.type", error_type(&e));
                    failure = Some(Failure::from(e));
                    break;
                }
            };
            // A delta is lent to its event and taken back for the collector (no copy per
            // fragment).
            let event = match event {
                LlmStreamEvent::TextDelta(delta) if !delta.is_empty() => {
                    LlmStreamEvent::TextDelta(relay(self.sink, AgentEvent::TextDelta { delta }))
                }
                LlmStreamEvent::ReasoningDelta(delta) if !delta.is_empty() => {
                    LlmStreamEvent::ReasoningDelta(relay(
                        self.sink,
                        AgentEvent::ReasoningDelta { delta },
                    ))
                }
                LlmStreamEvent::ToolCallStart { index, id, name } => {
                    match self.stream_calls.iter_mut().find(|(i, _)| *i == index) {
                        Some((_, known)) => *known = id.clone(),
                        None => self.stream_calls.push((index, id.clone())),
                    }
                    self.opened(&id);
                    self.note(AgentEvent::ToolCallStart {
                        call_id: id.clone(),
                        name: self.shared_tool_name(&name),
                    });
                    LlmStreamEvent::ToolCallStart { index, id, name }
                }
                LlmStreamEvent::ToolCallArgsDelta { index, delta } => {
                    let delta = match self.stream_calls.iter().find(|(i, _)| *i == index) {
                        Some((_, id)) => relay(
                            self.sink,
                            AgentEvent::ToolCallArgsDelta {
                                call_id: id.clone(),
                                delta,
                            },
                        ),
                        None => delta,
                    };
                    LlmStreamEvent::ToolCallArgsDelta { index, delta }
                }
                // A pool names the member that answers: the model the step records.
                LlmStreamEvent::Routed(route) => {
                    model = route.upstream_model.clone();
                    LlmStreamEvent::Routed(route)
                }
                other => other,
            };
            if let Err(e) = self.collector.push(event) {
                failure = Some(Failure::from(e));
                break;
            }
        }
        self.inference_waiter = Some(stream.into_waiter());
        let result = match failure {
            Some(Failure::Cancelled) => {
                // What the model had written is kept (it has been shown): the run's last commit
                // stores it, marked incomplete. Its reasoning and begun calls are not kept.
                if let Some(text) = self.written_so_far() {
                    self.push_message(Message::incomplete_assistant(text));
                }
                Err(Failure::Cancelled)
            }
            Some(f) => Err(f),
            None => self.collector.take().map_err(Failure::from),
        };
        self.collector.clear();
        let mut calls = std::mem::take(&mut self.stream_calls);
        if result.is_err() {
            // Calls the model began but never finished get their closing event.
            calls.sort_by_key(|(i, _)| *i);
            for (_, call_id) in calls.drain(..) {
                self.closed(&call_id);
                self.note(AgentEvent::ToolCallDone {
                    call_id,
                    result: ToolResult::error("not executed: the inference failed").into(),
                    state: ToolCallState::Cancelled,
                });
            }
        }
        calls.clear();
        self.stream_calls = calls;
        let response = result?;
        tracing::Span::current().record("gen_ai.response.model", &*model);
        self.note(AgentEvent::InferenceComplete {
            model,
            usage: response.usage,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            stop_reason: response.stop_reason,
        });
        Ok(response)
    }

    /// The text the collector holds of an inference that did not finish, if any. The collector
    /// gives up a response only after a stop, so one is added for it (its calls, unfinished,
    /// are dropped with the rest).
    fn written_so_far(&mut self) -> Option<String> {
        // A stream that did stop refuses a second stop; its response is there all the same.
        let _ = self.collector.push(LlmStreamEvent::Stop(StopReason::Other));
        let text = self.collector.take().ok()?.message.text();
        (!text.is_empty()).then_some(text)
    }

    /// How many times compaction fell back to truncation on this thread, and the last error.
    pub(super) fn compaction_fallbacks_in<'s>(
        &self,
        snapshot: &'s Snapshot,
    ) -> (u64, Option<&'s str>) {
        // An agent without a context policy has no compaction key.
        match self.compaction_at.and_then(|key| snapshot.get_by(key).ok()) {
            Some(state) => (state.fallbacks, state.last_error.as_deref()),
            None => (0, None),
        }
    }
}

/// Emits a delta event to `sink` and hands its text back.
fn relay(sink: &dyn EventSink, event: AgentEvent) -> String {
    sink.emit(&event);
    match event {
        AgentEvent::TextDelta { delta }
        | AgentEvent::ReasoningDelta { delta }
        | AgentEvent::ToolCallArgsDelta { delta, .. } => delta,
        _ => unreachable!("only delta events are relayed"),
    }
}

/// The OpenTelemetry GenAI finish reason for `reason`.
fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::EndTurn => "stop",
        StopReason::ToolCalls => "tool_calls",
        StopReason::MaxTokens => "length",
        StopReason::ContentFiltered => "content_filter",
        StopReason::Other => "other",
    }
}

/// `message` in the shape of the GenAI conventions' message content: its role and its parts
/// (text, reasoning, images by URI, tool calls, and a tool message's result as one
/// `tool_call_response`).
fn message_json(message: &Message) -> Value {
    let role = match message.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut parts: Vec<Value> = Vec::new();
    if message.role == Role::Tool {
        let response = match &*message.content {
            [ContentBlock::Json { value }] => (**value).clone(),
            [ContentBlock::Text { text }] => Value::String(text.clone()),
            blocks => Value::Array(blocks.iter().filter_map(part_json).collect()),
        };
        parts.push(json!({
            "type": "tool_call_response",
            "id": message.tool_call_id.as_ref().map(|id| id.as_str()),
            "response": response,
        }));
    } else {
        parts.extend(message.content.iter().filter_map(part_json));
        for call in message.tool_calls.iter() {
            let arguments = match &call.invalid_arguments {
                Some(raw) => Value::String(raw.clone()),
                None => (*call.arguments).clone(),
            };
            parts.push(json!({
                "type": "tool_call",
                "id": call.id.as_str(),
                "name": call.name,
                "arguments": arguments,
            }));
        }
    }
    json!({"role": role, "parts": parts})
}

/// One content block as a message part (`None` for what carries no content).
fn part_json(block: &ContentBlock) -> Option<Value> {
    Some(match block {
        ContentBlock::Text { text } => json!({"type": "text", "content": text}),
        ContentBlock::Reasoning { text } => json!({"type": "reasoning", "content": text}),
        ContentBlock::Image { url, media_type } => {
            let mut part = json!({"type": "uri", "modality": "image", "uri": url});
            if let Some(media_type) = media_type {
                part["mime_type"] = media_type.as_str().into();
            }
            part
        }
        ContentBlock::Json { value } => json!({"type": "json", "content": &**value}),
        _ => return None,
    })
}

/// The `error.type` of a failed inference: its class (`cancelled`, `retryable`, `permanent`).
fn error_type(e: &InferenceExecutionError) -> &'static str {
    match e.class() {
        ErrorClass::Cancelled => "cancelled",
        ErrorClass::Retryable => "retryable",
        ErrorClass::Permanent => "permanent",
    }
}
