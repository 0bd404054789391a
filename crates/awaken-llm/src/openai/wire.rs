//! The chat-completions wire format: the request body, the response and chunk shapes
//! (borrowed, so text without escapes is not copied), and the status-to-error mapping.

use std::borrow::Cow;
use std::time::Duration;

use awaken_event::{ContentBlock, Message, Role, StopReason, TokenUsage};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{InferenceExecutionError, truncate};
use crate::request::InferenceRequest;
pub use crate::retry_after::parse_retry_after;

/// Which body field carries the output-token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MaxTokensField {
    /// `max_tokens`: what OpenAI-compatible servers (vLLM, Ollama, llama.cpp, LM Studio) read.
    #[default]
    MaxTokens,
    /// `max_completion_tokens`: what OpenAI's reasoning models require.
    MaxCompletionTokens,
}

/// Options of the request body that come from the executor's configuration.
#[derive(Debug, Clone, Default)]
pub struct BodyOptions<'a> {
    /// Ask for an SSE stream.
    pub stream: bool,
    /// With `stream`, send `stream_options.include_usage = true`.
    pub include_usage: bool,
    /// Which field the max-tokens override goes into.
    pub max_tokens_field: MaxTokensField,
    /// Extra top-level fields (they never replace the fields set from the request).
    pub extra: Option<&'a Map<String, Value>>,
    /// A body field to carry the request's routing key in (e.g. `prompt_cache_key`, `user`).
    pub routing_field: Option<&'a str>,
}

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'static str>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Option<WireContent<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireToolCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum WireContent<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<WirePart<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WirePart<'a> {
    Text { text: Cow<'a, str> },
    ImageUrl { image_url: WireImage<'a> },
}

#[derive(Serialize)]
struct WireImage<'a> {
    url: &'a str,
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    r#type: &'static str,
    function: WireFunctionCall<'a>,
}

#[derive(Serialize)]
struct WireFunctionCall<'a> {
    name: &'a str,
    arguments: Cow<'a, str>,
}

#[derive(Serialize)]
struct WireTool<'a> {
    r#type: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

fn wire_message(m: &Message) -> WireMessage<'_> {
    let has_image = m
        .content
        .iter()
        .any(|b| matches!(b, ContentBlock::Image { .. }));
    let content = if has_image && m.role == Role::User {
        let parts = m
            .content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(WirePart::Text {
                    text: Cow::Borrowed(text),
                }),
                ContentBlock::Json { value } => Some(WirePart::Text {
                    text: Cow::Owned(value.to_string()),
                }),
                ContentBlock::Image { url, .. } => Some(WirePart::ImageUrl {
                    image_url: WireImage { url },
                }),
                _ => None,
            })
            .collect();
        Some(WireContent::Parts(parts))
    } else {
        let text = match &m.content[..] {
            [ContentBlock::Text { text }] => Cow::Borrowed(text.as_str()),
            _ => Cow::Owned(m.content_as_text()),
        };
        if text.is_empty() && m.role == Role::Assistant && !m.tool_calls.is_empty() {
            None
        } else {
            Some(WireContent::Text(text))
        }
    };
    let tool_calls = m
        .tool_calls
        .iter()
        .map(|c| WireToolCall {
            id: c.id.as_str(),
            r#type: "function",
            function: WireFunctionCall {
                name: &c.name,
                arguments: match &c.invalid_arguments {
                    Some(raw) => Cow::Borrowed(raw.as_str()),
                    None => Cow::Owned(c.arguments.to_string()),
                },
            },
        })
        .collect();
    WireMessage {
        role: role_name(m.role),
        content,
        tool_calls,
        tool_call_id: m.tool_call_id.as_ref().map(|id| id.as_str()),
    }
}

/// The chat-completions request body for `request` (JSON bytes).
pub fn request_body(
    request: &InferenceRequest,
    options: &BodyOptions<'_>,
) -> Result<Vec<u8>, serde_json::Error> {
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if let Some(system) = &request.system_prompt {
        messages.push(WireMessage {
            role: "system",
            content: Some(WireContent::Text(Cow::Borrowed(system))),
            tool_calls: Vec::new(),
            tool_call_id: None,
        });
    }
    messages.extend(request.messages.iter().map(wire_message));
    let tools = request
        .tools
        .iter()
        .map(|t| WireTool {
            r#type: "function",
            function: WireFunction {
                name: &t.name,
                description: &t.description,
                parameters: &t.parameters,
            },
        })
        .collect();
    let o = &request.overrides;
    let (max_tokens, max_completion_tokens) = match options.max_tokens_field {
        MaxTokensField::MaxTokens => (o.max_tokens, None),
        MaxTokensField::MaxCompletionTokens => (None, o.max_tokens),
    };
    let mut body = ChatRequest {
        model: request.effective_model(),
        messages,
        tools,
        temperature: o.temperature,
        top_p: o.top_p,
        max_tokens,
        max_completion_tokens,
        reasoning_effort: o.reasoning_effort.map(|e| e.as_str()),
        stream: options.stream,
        stream_options: (options.stream && options.include_usage).then_some(StreamOptions {
            include_usage: true,
        }),
        extra: Map::new(),
    };
    // Extra fields go in only where the typed body has nothing, so they cannot clobber it.
    let taken = serde_json::to_value(&body)?;
    let mut extra = Map::new();
    if let (Some(field), Some(key)) = (options.routing_field, &request.routing_key) {
        extra.insert(field.to_owned(), Value::String(key.to_string()));
    }
    if let Some(more) = options.extra {
        for (k, v) in more {
            extra.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    if let Value::Object(set) = &taken {
        extra.retain(|k, _| !set.contains_key(k));
    }
    body.extra = extra;
    serde_json::to_vec(&body)
}

/// A string that borrows from the input when it holds no escapes.
#[derive(Debug, Deserialize)]
pub(crate) struct Text<'a>(#[serde(borrow)] pub(crate) Cow<'a, str>);

#[derive(Debug, Deserialize)]
pub(crate) struct Chunk<'a> {
    /// The first choice only (the executor asks for `n = 1`); the others are skipped
    /// without allocating.
    #[serde(borrow, default)]
    pub(crate) choices: Option<FirstChoice<'a>>,
    #[serde(default)]
    pub(crate) usage: Option<WireUsage>,
    #[serde(borrow, default)]
    pub(crate) error: Option<WireError<'a>>,
}

/// The first element of the `choices` array, if any.
#[derive(Debug)]
pub(crate) struct FirstChoice<'a>(pub(crate) Option<ChunkChoice<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for FirstChoice<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = FirstChoice<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of choices")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let first = seq.next_element::<ChunkChoice<'a>>()?;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(FirstChoice(first))
            }
        }
        d.deserialize_seq(Visit(std::marker::PhantomData))
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChunkChoice<'a> {
    #[serde(borrow, default, alias = "message")]
    pub(crate) delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    pub(crate) finish_reason: Option<Text<'a>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Delta<'a> {
    #[serde(borrow, default)]
    pub(crate) content: Option<Text<'a>>,
    #[serde(borrow, default)]
    pub(crate) reasoning_content: Option<Text<'a>>,
    #[serde(borrow, default)]
    pub(crate) reasoning: Option<Text<'a>>,
    #[serde(borrow, default)]
    pub(crate) tool_calls: Option<Vec<ToolCallDelta<'a>>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ToolCallDelta<'a> {
    #[serde(default)]
    pub(crate) index: Option<u32>,
    #[serde(borrow, default)]
    pub(crate) id: Option<Text<'a>>,
    #[serde(borrow, default)]
    pub(crate) function: Option<FunctionDelta<'a>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct FunctionDelta<'a> {
    #[serde(borrow, default)]
    pub(crate) name: Option<Text<'a>>,
    #[serde(borrow, default)]
    pub(crate) arguments: Option<Text<'a>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Debug, Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    pub(crate) fn to_usage(&self) -> TokenUsage {
        TokenUsage {
            input_tokens: self.prompt_tokens,
            output_tokens: self.completion_tokens,
            cached_input_tokens: self
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            reasoning_tokens: self
                .completion_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct WireError<'a> {
    #[serde(borrow, default)]
    message: Option<Text<'a>>,
    #[serde(borrow, default)]
    r#type: Option<Text<'a>>,
    #[serde(default)]
    code: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct ErrorEnvelope<'a> {
    #[serde(borrow)]
    error: WireErrorOrText<'a>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum WireErrorOrText<'a> {
    #[serde(borrow)]
    Object(WireError<'a>),
    Text(Text<'a>),
}

impl WireError<'_> {
    fn code(&self) -> String {
        match &self.code {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => String::new(),
        }
    }

    fn message(&self) -> String {
        self.message
            .as_ref()
            .map(|m| m.0.to_string())
            .unwrap_or_default()
    }

    /// The error an in-stream `{"error": ...}` event stands for (no HTTP status).
    pub(crate) fn to_error(&self) -> InferenceExecutionError {
        let message = self.message();
        let code = self.code();
        let kind = self.r#type.as_ref().map(|t| t.0.as_ref()).unwrap_or("");
        if is_context_overflow(&code, &message) {
            return InferenceExecutionError::ContextOverflow { message };
        }
        if is_content_filter(&code) {
            return InferenceExecutionError::ContentFiltered { message };
        }
        if code.contains("rate_limit") || kind.contains("rate_limit") {
            return InferenceExecutionError::RateLimited {
                retry_after: None,
                message,
            };
        }
        if kind == "invalid_request_error" {
            return InferenceExecutionError::InvalidRequest {
                status: None,
                message,
            };
        }
        InferenceExecutionError::ServerError {
            status: None,
            message: if message.is_empty() { code } else { message },
        }
    }
}

fn is_context_overflow(code: &str, message: &str) -> bool {
    if code == "context_length_exceeded" || code == "string_above_max_length" {
        return true;
    }
    let m = message.to_ascii_lowercase();
    [
        "context length",
        "context_length",
        "context window",
        "maximum context",
        "prompt is too long",
        "too many tokens",
        "exceeds the available context",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

fn is_content_filter(code: &str) -> bool {
    code == "content_filter" || code == "content_policy_violation"
}

/// The error an HTTP error status stands for, given the `Retry-After` delay, the response body,
/// the model that was asked for and the URL that was called (`url`, shown in errors: pass it
/// without user info or query):
///
/// | status | error |
/// |---|---|
/// | 429 | `RateLimited` (with `retry_after`) |
/// | 401, 403 | `Unauthorized` |
/// | 404 with a JSON error whose code is `model_not_found` or whose message speaks of a model | `ModelNotFound` |
/// | other 404 (an HTML page, plain `Not Found`, `{"detail":"Not Found"}`, ...) | `EndpointNotFound` (with a suggested base URL when `url`'s path has no version segment) |
/// | 408 | `Timeout` |
/// | 400, 413, 422 with a context-length code or message | `ContextOverflow` |
/// | 400 with a content-filter code | `ContentFiltered` |
/// | other 4xx | `InvalidRequest` |
/// | 503, 529 | `Overloaded` (with `retry_after`) |
/// | other 5xx (and anything else) | `ServerError` |
pub fn error_from_status(
    status: u16,
    retry_after: Option<Duration>,
    body: &str,
    model: &str,
    url: &str,
) -> InferenceExecutionError {
    let parsed: Option<ErrorEnvelope<'_>> = serde_json::from_str(body).ok();
    let (message, code) = match &parsed {
        Some(ErrorEnvelope {
            error: WireErrorOrText::Object(e),
        }) => (e.message(), e.code()),
        Some(ErrorEnvelope {
            error: WireErrorOrText::Text(t),
        }) => (t.0.to_string(), String::new()),
        None => (truncate(body.trim(), 1000).to_owned(), String::new()),
    };
    match status {
        429 => InferenceExecutionError::RateLimited {
            retry_after,
            message,
        },
        401 | 403 => InferenceExecutionError::Unauthorized { status, message },
        404 if is_json(body, &parsed) && names_a_model(&code, &message, model) => {
            InferenceExecutionError::ModelNotFound {
                model: model.to_owned(),
                message,
            }
        }
        404 => InferenceExecutionError::EndpointNotFound {
            url: url.to_owned(),
            message: truncate(&message, 200).to_owned(),
        },
        408 => InferenceExecutionError::Timeout {
            after: Duration::ZERO,
            waiting_for: "response headers",
        },
        400 | 413 | 422 if is_context_overflow(&code, &message) => {
            InferenceExecutionError::ContextOverflow { message }
        }
        400 if is_content_filter(&code) => InferenceExecutionError::ContentFiltered { message },
        400..=499 => InferenceExecutionError::InvalidRequest {
            status: Some(status),
            message,
        },
        503 | 529 => InferenceExecutionError::Overloaded {
            status,
            retry_after,
            message,
        },
        _ => InferenceExecutionError::ServerError {
            status: Some(status),
            message,
        },
    }
}

/// Whether a body is JSON (an error envelope, or any other JSON value).
fn is_json(body: &str, envelope: &Option<ErrorEnvelope<'_>>) -> bool {
    envelope.is_some() || serde_json::from_str::<serde::de::IgnoredAny>(body).is_ok()
}

/// Whether a 404's error is about the model: OpenAI's `model_not_found` code, or a message that
/// names the model or speaks of one (Ollama's `model "x" not found`, vLLM's
/// ``The model `x` does not exist``).
fn names_a_model(code: &str, message: &str, model: &str) -> bool {
    code == "model_not_found"
        || (!model.is_empty() && message.contains(model))
        || message.to_ascii_lowercase().contains("model")
}

pub(crate) fn stop_reason(finish: &str) -> StopReason {
    match finish {
        "stop" | "end_turn" | "eos" => StopReason::EndTurn,
        "tool_calls" | "function_call" => StopReason::ToolCalls,
        "length" | "max_tokens" => StopReason::MaxTokens,
        "content_filter" => StopReason::ContentFiltered,
        _ => StopReason::Other,
    }
}
