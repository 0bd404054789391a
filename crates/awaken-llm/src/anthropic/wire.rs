//! The Messages wire format: the request body, the stream event and message shapes (borrowed,
//! so text without escapes is not copied), and the status-to-error mapping.

use std::borrow::Cow;
use std::time::Duration;

use awaken_event::{ContentBlock, Message, Role, StopReason, TokenUsage};
use awaken_spec::ReasoningEffort;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{InferenceExecutionError, truncate};
use crate::request::InferenceRequest;

/// The `anthropic-version` header every request carries.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The output-token limit sent when the request sets none (the API requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The smallest thinking budget the API accepts.
pub const MIN_THINKING_BUDGET: u32 = 1024;

/// Options of the request body that come from the executor's configuration.
#[derive(Debug, Clone)]
pub struct BodyOptions<'a> {
    /// Ask for an SSE stream.
    pub stream: bool,
    /// `max_tokens` when the request's overrides set none.
    pub default_max_tokens: u32,
    /// Extra top-level fields (they never replace the fields set from the request).
    pub extra: Option<&'a Map<String, Value>>,
}

impl Default for BodyOptions<'_> {
    fn default() -> Self {
        Self {
            stream: true,
            default_max_tokens: DEFAULT_MAX_TOKENS,
            extra: None,
        }
    }
}

/// The extended-thinking budget (`thinking.budget_tokens`) a reasoning effort asks for:
///
/// | effort | budget |
/// |---|---|
/// | `none` | no thinking |
/// | `minimal` | 1024 (the API's minimum) |
/// | `low` | 4096 |
/// | `medium` | 12288 |
/// | `high` | 24576 |
pub fn thinking_budget(effort: ReasoningEffort) -> Option<u32> {
    match effort {
        ReasoningEffort::None => None,
        ReasoningEffort::Minimal => Some(MIN_THINKING_BUDGET),
        ReasoningEffort::Low => Some(4096),
        ReasoningEffort::Medium => Some(12_288),
        ReasoningEffort::High => Some(24_576),
    }
}

#[derive(Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<Cow<'a, str>>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<Thinking>,
    stream: bool,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

#[derive(Serialize)]
struct Thinking {
    r#type: &'static str,
    budget_tokens: u32,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: Cow<'a, str>,
    },
    Image {
        source: ImageSource<'a>,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Cow<'a, Value>,
    },
    ToolResult {
        tool_use_id: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        content: Option<ResultContent<'a>>,
        is_error: bool,
    },
}

#[derive(Serialize)]
#[serde(untagged)]
enum ResultContent<'a> {
    Text(Cow<'a, str>),
    Blocks(Vec<Block<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ImageSource<'a> {
    Base64 { media_type: &'a str, data: &'a str },
    Url { url: &'a str },
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    input_schema: Cow<'a, Value>,
}

/// A `data:<media type>;base64,<data>` URL becomes a base64 source, anything else a URL source.
fn image_source<'a>(url: &'a str, media_type: Option<&'a str>) -> ImageSource<'a> {
    if let Some(rest) = url.strip_prefix("data:")
        && let Some((meta, data)) = rest.split_once(',')
        && let Some(declared) = meta.strip_suffix(";base64")
    {
        let media_type = if declared.is_empty() {
            media_type.unwrap_or("image/png")
        } else {
            declared
        };
        return ImageSource::Base64 { media_type, data };
    }
    ImageSource::Url { url }
}

/// The blocks a user, assistant or tool message's content becomes: text (JSON serialized),
/// and images where `images` allows them. Empty text is left out (the API rejects it), as
/// are reasoning (its signature is not kept) and the incomplete marker.
fn content_blocks<'a>(content: &'a [ContentBlock], images: bool, out: &mut Vec<Block<'a>>) {
    for block in content {
        match block {
            ContentBlock::Text { text } if !text.is_empty() => out.push(Block::Text {
                text: Cow::Borrowed(text),
            }),
            ContentBlock::Json { value } => out.push(Block::Text {
                text: Cow::Owned(value.to_string()),
            }),
            ContentBlock::Image { url, media_type } if images => out.push(Block::Image {
                source: image_source(url, media_type.as_deref()),
            }),
            _ => {}
        }
    }
}

fn tool_result(index: usize, m: &Message) -> Result<Block<'_>, InferenceExecutionError> {
    let Some(id) = &m.tool_call_id else {
        return Err(InferenceExecutionError::InvalidRequest {
            status: None,
            message: format!(
                "message {index} is a tool result without the id of the call it answers"
            ),
        });
    };
    let has_image = m
        .content
        .iter()
        .any(|b| matches!(b, ContentBlock::Image { .. }));
    let content = if has_image {
        let mut blocks = Vec::new();
        content_blocks(&m.content, true, &mut blocks);
        Some(ResultContent::Blocks(blocks))
    } else {
        let text = match &m.content[..] {
            [ContentBlock::Text { text }] => Cow::Borrowed(text.as_str()),
            _ => Cow::Owned(m.content_as_text()),
        };
        (!text.is_empty()).then_some(ResultContent::Text(text))
    };
    Ok(Block::ToolResult {
        tool_use_id: id.as_str(),
        content,
        is_error: crate::scripted::is_error_result(m),
    })
}

/// Appends `blocks` as a `role` turn, merged into the previous turn when it has the same role
/// (the API wants user and assistant turns to alternate).
fn push_turn<'a>(turns: &mut Vec<WireMessage<'a>>, role: &'static str, blocks: Vec<Block<'a>>) {
    if blocks.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == role => last.content.extend(blocks),
        _ => turns.push(WireMessage {
            role,
            content: blocks,
        }),
    }
}

/// The Messages request body for `request` (JSON bytes).
///
/// - The system prompt, then the text of any system message in the history (in order, joined
///   by a blank line), is the top-level `system`; no message has the system role.
/// - User messages become `text` (JSON content serialized) and `image` blocks; assistant
///   messages `text` and `tool_use` blocks (arguments that are not a JSON object are sent as
///   `{}`); tool messages `tool_result` blocks in a user turn, `is_error` when the message
///   has the form `Message::tool` gives an error result. Consecutive turns of one role are
///   merged, tool results first in their turn. Empty text, reasoning (whose signature is not
///   kept) and messages left without content are not sent.
/// - `max_tokens` is the overrides' limit, else `options.default_max_tokens`.
/// - A reasoning effort other than `none` enables extended thinking with
///   [`thinking_budget`]'s budget. Without a `max_tokens` override the budget is added to the
///   default limit, so the answer keeps its room; with one, the budget is cut to fit below it,
///   and thinking is left off when the limit is at most [`MIN_THINKING_BUDGET`]. Thinking is
///   also left off while the latest assistant message calls tools (the API would want that
///   message's signed thinking back), and with thinking on `temperature` and `top_p` are not
///   sent (the API refuses them then).
///
/// A tool message without a `tool_call_id` is [`InferenceExecutionError::InvalidRequest`].
pub fn request_body(
    request: &InferenceRequest,
    options: &BodyOptions<'_>,
) -> Result<Vec<u8>, InferenceExecutionError> {
    let mut system: Option<Cow<'_, str>> = request
        .system_prompt
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(Cow::Borrowed);
    let mut turns: Vec<WireMessage<'_>> = Vec::with_capacity(request.messages.len());
    for (index, m) in request.messages.iter().enumerate() {
        match m.role {
            Role::System => {
                let text = m.content_as_text();
                if !text.is_empty() {
                    system = Some(match system {
                        Some(before) => Cow::Owned(format!("{before}\n\n{text}")),
                        None => Cow::Owned(text),
                    });
                }
            }
            Role::User => {
                let mut blocks = Vec::with_capacity(m.content.len());
                content_blocks(&m.content, true, &mut blocks);
                push_turn(&mut turns, "user", blocks);
            }
            Role::Assistant => {
                let mut blocks = Vec::with_capacity(m.content.len() + m.tool_calls.len());
                content_blocks(&m.content, false, &mut blocks);
                blocks.extend(m.tool_calls.iter().map(|c| Block::ToolUse {
                    id: c.id.as_str(),
                    name: &c.name,
                    input: if c.arguments.is_object() {
                        Cow::Borrowed(&*c.arguments)
                    } else {
                        Cow::Owned(Value::Object(Map::new()))
                    },
                }));
                push_turn(&mut turns, "assistant", blocks);
            }
            Role::Tool => push_turn(&mut turns, "user", vec![tool_result(index, m)?]),
        }
    }
    // The API wants a user turn's tool results before anything else in it (stable: calls keep
    // their order, as do the other blocks).
    for turn in turns.iter_mut().filter(|t| t.role == "user") {
        turn.content
            .sort_by_key(|b| !matches!(b, Block::ToolResult { .. }));
    }
    let tools = request
        .tools
        .iter()
        .map(|t| WireTool {
            name: &t.name,
            description: &t.description,
            input_schema: if t.parameters.is_object() {
                Cow::Borrowed(&*t.parameters)
            } else {
                Cow::Owned(serde_json::json!({"type": "object"}))
            },
        })
        .collect();

    let o = &request.overrides;
    let mid_tool_use = request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant)
        .is_some_and(|m| !m.tool_calls.is_empty());
    let budget = o
        .reasoning_effort
        .and_then(thinking_budget)
        .filter(|_| !mid_tool_use);
    let (max_tokens, budget) = match (budget, o.max_tokens) {
        (None, limit) => (limit.unwrap_or(options.default_max_tokens), None),
        (Some(b), None) => (options.default_max_tokens.saturating_add(b), Some(b)),
        (Some(b), Some(limit)) if limit > MIN_THINKING_BUDGET => (limit, Some(b.min(limit - 1))),
        (Some(_), Some(limit)) => (limit, None),
    };
    let thinking = budget.map(|budget_tokens| Thinking {
        r#type: "enabled",
        budget_tokens,
    });
    let mut body = MessagesRequest {
        model: request.effective_model(),
        max_tokens,
        system,
        messages: turns,
        tools,
        temperature: o.temperature.filter(|_| thinking.is_none()),
        top_p: o.top_p.filter(|_| thinking.is_none()),
        thinking,
        stream: options.stream,
        extra: Map::new(),
    };
    let serialize_error = |e: serde_json::Error| InferenceExecutionError::InvalidRequest {
        status: None,
        message: format!("the request could not be serialized: {e}"),
    };
    if let Some(more) = options.extra.filter(|m| !m.is_empty()) {
        // Extra fields go in only where the typed body has nothing, so they cannot clobber it.
        let taken = serde_json::to_value(&body).map_err(serialize_error)?;
        body.extra = more
            .iter()
            .filter(|(k, _)| taken.get(k.as_str()).is_none())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
    }
    serde_json::to_vec(&body).map_err(serialize_error)
}

/// One event of a Messages stream; which fields are set depends on its `type`.
#[derive(Debug, Deserialize)]
pub(crate) struct StreamEvent<'a> {
    #[serde(borrow)]
    pub(crate) r#type: Cow<'a, str>,
    #[serde(default)]
    pub(crate) index: Option<u32>,
    #[serde(borrow, default)]
    pub(crate) content_block: Option<WireBlock<'a>>,
    #[serde(borrow, default)]
    pub(crate) delta: Option<WireDelta<'a>>,
    #[serde(borrow, default)]
    pub(crate) message: Option<WireReply<'a>>,
    #[serde(default)]
    pub(crate) usage: Option<WireUsage>,
    #[serde(borrow, default)]
    pub(crate) error: Option<WireError<'a>>,
}

/// A content block: as `content_block_start` opens it, or whole in a non-streamed message.
#[derive(Debug, Deserialize)]
pub(crate) struct WireBlock<'a> {
    #[serde(borrow)]
    pub(crate) r#type: Cow<'a, str>,
    #[serde(borrow, default)]
    pub(crate) id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) thinking: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(crate) input: Option<Value>,
}

/// The `delta` of a `content_block_delta` (typed) or of a `message_delta` (stop reason).
#[derive(Debug, Deserialize)]
pub(crate) struct WireDelta<'a> {
    #[serde(borrow, default)]
    pub(crate) r#type: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) partial_json: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) thinking: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) stop_reason: Option<Cow<'a, str>>,
}

/// The `message` of a `message_start`, or a whole non-streamed message (or its error).
#[derive(Debug, Deserialize)]
pub(crate) struct WireReply<'a> {
    #[serde(borrow, default)]
    pub(crate) model: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(crate) usage: Option<WireUsage>,
    #[serde(borrow, default)]
    pub(crate) content: Vec<WireBlock<'a>>,
    #[serde(borrow, default)]
    pub(crate) stop_reason: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) error: Option<WireError<'a>>,
}

/// Token counts; a later report's counts replace the earlier ones (they are cumulative).
#[derive(Debug, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

/// The usage reported so far in a stream.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct UsageSoFar {
    input: u64,
    output: u64,
    cache_creation: u64,
    cache_read: u64,
}

impl UsageSoFar {
    pub(crate) fn update(&mut self, u: &WireUsage) {
        let set = |field: &mut u64, value: Option<u64>| {
            if let Some(v) = value {
                *field = v;
            }
        };
        set(&mut self.input, u.input_tokens);
        set(&mut self.output, u.output_tokens);
        set(&mut self.cache_creation, u.cache_creation_input_tokens);
        set(&mut self.cache_read, u.cache_read_input_tokens);
    }

    /// As [`TokenUsage`]: the input counts every prompt token (the API's `input_tokens` leave
    /// out the cached and the cache-writing ones); the cached ones are those read.
    pub(crate) fn to_usage(self) -> TokenUsage {
        TokenUsage {
            input_tokens: self
                .input
                .saturating_add(self.cache_read)
                .saturating_add(self.cache_creation),
            output_tokens: self.output,
            cached_input_tokens: self.cache_read,
            reasoning_tokens: 0,
        }
    }
}

/// An error object: `{"type": "overloaded_error", "message": "Overloaded"}`.
#[derive(Debug, Deserialize)]
pub(crate) struct WireError<'a> {
    #[serde(borrow, default)]
    pub(crate) r#type: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(crate) message: Option<Cow<'a, str>>,
}

impl WireError<'_> {
    pub(crate) fn kind(&self) -> &str {
        self.r#type.as_deref().unwrap_or("")
    }

    pub(crate) fn message(&self) -> &str {
        self.message.as_deref().unwrap_or("")
    }
}

#[derive(Debug, Deserialize)]
struct ErrorEnvelope<'a> {
    #[serde(borrow)]
    error: WireError<'a>,
}

/// Whether a message speaks of a prompt too long for the context window.
fn is_context_overflow(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "prompt is too long",
        "exceed context limit",
        "context window",
        "context length",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

/// Whether a `not_found_error` is about the model: its message names it (`model: <name>`) or
/// speaks of a model.
fn names_a_model(message: &str, model: &str) -> bool {
    (!model.is_empty() && message.contains(model)) || message.to_ascii_lowercase().contains("model")
}

/// The error an `error` event of a stream stands for (`kind` is the error's `type`):
///
/// | type | error |
/// |---|---|
/// | `overloaded_error` | `Overloaded` (status 529) |
/// | `rate_limit_error` | `RateLimited` |
/// | `api_error`, `timeout_error`, any other | `ServerError` |
/// | `authentication_error` | `Unauthorized` (401) |
/// | `permission_error` | `Unauthorized` (403) |
/// | `not_found_error` naming a model | `ModelNotFound` |
/// | `invalid_request_error`, `request_too_large`, `billing_error`, other `not_found_error` | `ContextOverflow` when the message says the prompt is too long, else `InvalidRequest` |
pub fn error_from_event(kind: &str, message: &str, model: &str) -> InferenceExecutionError {
    let message = message.to_owned();
    match kind {
        "overloaded_error" => InferenceExecutionError::Overloaded {
            status: 529,
            retry_after: None,
            message,
        },
        "rate_limit_error" => InferenceExecutionError::RateLimited {
            retry_after: None,
            message,
        },
        "authentication_error" => InferenceExecutionError::Unauthorized {
            status: 401,
            message,
        },
        "permission_error" => InferenceExecutionError::Unauthorized {
            status: 403,
            message,
        },
        "not_found_error" if names_a_model(&message, model) => {
            InferenceExecutionError::ModelNotFound {
                model: model.to_owned(),
                message,
            }
        }
        "invalid_request_error" | "request_too_large" | "billing_error" | "not_found_error" => {
            if is_context_overflow(&message) {
                InferenceExecutionError::ContextOverflow { message }
            } else {
                InferenceExecutionError::InvalidRequest {
                    status: None,
                    message,
                }
            }
        }
        _ => InferenceExecutionError::ServerError {
            status: None,
            message: if message.is_empty() {
                kind.to_owned()
            } else {
                message
            },
        },
    }
}

/// The error an HTTP error status stands for, given the `Retry-After` delay, the response body
/// (`{"type":"error","error":{"type":…,"message":…}}`, or anything else), the model that was
/// asked for and the URL that was called (`url`, shown in errors: pass it without user info or
/// query):
///
/// | status | error |
/// |---|---|
/// | 429 | `RateLimited` (with `retry_after`) |
/// | 401, 403 | `Unauthorized` |
/// | 404 with a `not_found_error` that names a model or speaks of one | `ModelNotFound` |
/// | other 404 | `EndpointNotFound` (the base URL is wrong) |
/// | 408 | `Timeout` |
/// | 400, 413 whose message says the prompt is too long | `ContextOverflow` |
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
    let (kind, message) = match &parsed {
        Some(envelope) => (envelope.error.kind(), envelope.error.message().to_owned()),
        None => ("", truncate(body.trim(), 1000).to_owned()),
    };
    match status {
        429 => InferenceExecutionError::RateLimited {
            retry_after,
            message,
        },
        401 | 403 => InferenceExecutionError::Unauthorized { status, message },
        404 if kind == "not_found_error" && names_a_model(&message, model) => {
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
        400 | 413 if is_context_overflow(&message) => {
            InferenceExecutionError::ContextOverflow { message }
        }
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

/// The stop reason a Messages `stop_reason` stands for.
pub(crate) fn stop_reason(reason: &str) -> StopReason {
    match reason {
        "end_turn" | "stop_sequence" => StopReason::EndTurn,
        "tool_use" => StopReason::ToolCalls,
        "max_tokens" | "model_context_window_exceeded" => StopReason::MaxTokens,
        "refusal" => StopReason::ContentFiltered,
        _ => StopReason::Other,
    }
}
