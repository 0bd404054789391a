//! Conversation messages and the tool calls an assistant message carries.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::ToolCallId;
use crate::tool::ToolResult;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions for the model.
    System,
    /// The human (or the program acting for one).
    User,
    /// The model.
    Assistant,
    /// A tool's result, answering one tool call.
    Tool,
}

/// One block of a message's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// The model's visible reasoning, kept so it can be shown or sent back where a
    /// provider asks for it.
    Reasoning {
        /// The reasoning text.
        text: String,
    },
    /// An image, by URL (`https:` or `data:`).
    Image {
        /// Where the image is.
        url: String,
        /// Its media type, when known (`image/png`, ...).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        media_type: Option<String>,
    },
    /// Structured content, typically a tool's JSON result (shared with the result it shows).
    Json {
        /// The value.
        #[serde(deserialize_with = "crate::shared::arc_value")]
        value: Arc<Value>,
    },
    /// Marks an assistant message the model was cut off writing (its run was cancelled while
    /// the answer streamed): the blocks before it are what the model wrote up to then. Last in
    /// its message; carries nothing, and a provider sends nothing for it (the message goes to
    /// a model as an ordinary assistant message).
    Incomplete,
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        ContentBlock::Text { text: text.into() }
    }
}

/// A tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, unique within the thread.
    pub id: ToolCallId,
    /// The tool's name as the model used it.
    pub name: String,
    /// The parsed arguments (`null` when [`ToolCall::invalid_arguments`] is set). Shared: the
    /// history, the tool batch and the call's events hold the same value, never a copy.
    #[serde(deserialize_with = "crate::shared::arc_value")]
    pub arguments: Arc<Value>,
    /// The raw argument text when the model produced something that is not JSON. The call is
    /// kept in the history (so it can be answered) and closed with an error result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_arguments: Option<String>,
}

impl ToolCall {
    /// A call with parsed arguments.
    pub fn new(id: ToolCallId, name: impl Into<String>, arguments: impl Into<Arc<Value>>) -> Self {
        Self {
            id,
            name: name.into(),
            arguments: arguments.into(),
            invalid_arguments: None,
        }
    }

    /// Builds a call from the raw argument text a model streamed: parsed when it is JSON (an
    /// empty string counts as `{}`), otherwise kept raw in [`ToolCall::invalid_arguments`].
    pub fn from_raw_arguments(id: ToolCallId, name: impl Into<String>, raw: &str) -> Self {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return Self::new(id, name, Value::Object(Default::default()));
        }
        match serde_json::from_str::<Value>(trimmed) {
            Ok(arguments) => Self::new(id, name, arguments),
            Err(_) => Self {
                id,
                name: name.into(),
                arguments: Arc::new(Value::Null),
                invalid_arguments: Some(raw.to_owned()),
            },
        }
    }
}

thread_local! {
    static NO_CONTENT: Arc<[ContentBlock]> = Vec::new().into_iter().collect();
    static NO_TOOL_CALLS: Arc<[ToolCall]> = Vec::new().into_iter().collect();
}

/// An empty content list: this thread's own. `Arc::default()` of a slice is one static the
/// whole process shares, so every copy or drop of a message holding it would change one count
/// from every worker thread (a cache line they pass back and forth).
pub fn no_content() -> Arc<[ContentBlock]> {
    NO_CONTENT.try_with(Arc::clone).unwrap_or_default()
}

/// An empty tool call list: this thread's own (see [`no_content`]).
pub fn no_tool_calls() -> Arc<[ToolCall]> {
    NO_TOOL_CALLS.try_with(Arc::clone).unwrap_or_default()
}

/// One message of a conversation. Cheap to clone: content and calls are shared (a history is
/// copied into every request and phase context; its messages never are).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Its content blocks (may be empty for an assistant message that only calls tools).
    #[serde(default, skip_serializing_if = "slice_is_empty")]
    pub content: Arc<[ContentBlock]>,
    /// Tool calls (assistant messages only).
    #[serde(default, skip_serializing_if = "slice_is_empty")]
    pub tool_calls: Arc<[ToolCall]>,
    /// The call this message answers (tool messages only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<ToolCallId>,
}

impl Message {
    fn with_text(role: Role, text: impl Into<String>) -> Self {
        Self {
            role,
            content: Arc::new([ContentBlock::text(text)]),
            tool_calls: no_tool_calls(),
            tool_call_id: None,
        }
    }

    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        Self::with_text(Role::System, text)
    }

    /// A user message.
    pub fn user(text: impl Into<String>) -> Self {
        Self::with_text(Role::User, text)
    }

    /// An assistant message with text only.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::with_text(Role::Assistant, text)
    }

    /// An assistant message holding the `text` a model had written when it was cut off, marked
    /// [`ContentBlock::Incomplete`] (see [`Message::is_incomplete`]).
    pub fn incomplete_assistant(text: impl Into<String>) -> Self {
        Self {
            role: Role::Assistant,
            content: Arc::new([ContentBlock::text(text), ContentBlock::Incomplete]),
            tool_calls: no_tool_calls(),
            tool_call_id: None,
        }
    }

    /// An assistant message with optional text and tool calls.
    pub fn assistant_with_calls(text: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        let text = text.into();
        Self {
            role: Role::Assistant,
            content: if text.is_empty() {
                no_content()
            } else {
                Arc::new([ContentBlock::text(text)])
            },
            tool_calls: tool_calls.into(),
            tool_call_id: None,
        }
    }

    /// A tool message answering `call_id` with `result`: a string result becomes a text block,
    /// any other JSON a JSON block; an error result is marked so the model sees it failed.
    pub fn tool(call_id: ToolCallId, result: &ToolResult) -> Self {
        let block = match (&result.status, &*result.content) {
            (crate::tool::ToolResultStatus::Error, Value::String(s)) => {
                ContentBlock::text(format!("error: {s}"))
            }
            (_, Value::String(s)) => ContentBlock::text(s.clone()),
            (crate::tool::ToolResultStatus::Error, other) => ContentBlock::Json {
                value: Arc::new(serde_json::json!({ "error": other })),
            },
            (_, _) => ContentBlock::Json {
                value: result.content.clone(),
            },
        };
        Self {
            role: Role::Tool,
            content: Arc::new([block]),
            tool_calls: no_tool_calls(),
            tool_call_id: Some(call_id),
        }
    }

    /// Whether the model was cut off writing this message ([`ContentBlock::Incomplete`]).
    pub fn is_incomplete(&self) -> bool {
        self.content
            .iter()
            .any(|b| matches!(b, ContentBlock::Incomplete))
    }

    /// The concatenated text blocks of this message (reasoning excluded).
    pub fn text(&self) -> String {
        let mut out = String::new();
        for block in self.content.iter() {
            if let ContentBlock::Text { text } = block {
                out.push_str(text);
            }
        }
        out
    }

    /// The content rendered as one string for providers that take plain text: text blocks
    /// as they are, JSON blocks serialized.
    pub fn content_as_text(&self) -> String {
        let mut out = String::new();
        for block in self.content.iter() {
            match block {
                ContentBlock::Text { text } => out.push_str(text),
                ContentBlock::Json { value } => out.push_str(&value.to_string()),
                ContentBlock::Reasoning { .. }
                | ContentBlock::Image { .. }
                | ContentBlock::Incomplete => {}
            }
        }
        out
    }
}

fn slice_is_empty<T>(items: &Arc<[T]>) -> bool {
    items.is_empty()
}
