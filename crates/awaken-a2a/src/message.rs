//! A message between a client and an agent, and its parts.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Not given (invalid in a request).
    #[default]
    #[serde(rename = "ROLE_UNSPECIFIED")]
    Unspecified,
    /// The client (a person or another agent).
    #[serde(rename = "ROLE_USER")]
    User,
    /// The agent.
    #[serde(rename = "ROLE_AGENT")]
    Agent,
}

/// One message: its parts, who wrote it, and the context and task it belongs to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// The message's id, chosen by its writer.
    pub message_id: String,
    /// The conversation the message belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// The task the message belongs to (or answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Who wrote it.
    #[serde(default)]
    pub role: Role,
    /// Its content.
    #[serde(default)]
    pub parts: Vec<Part>,
    /// Extra data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// The URIs of the extensions the message uses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
    /// Other tasks the message refers to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reference_task_ids: Vec<String>,
}

impl Message {
    /// An agent's message of `parts`.
    pub fn agent(message_id: impl Into<String>, parts: Vec<Part>) -> Self {
        Self {
            message_id: message_id.into(),
            role: Role::Agent,
            parts,
            ..Self::default()
        }
    }

    /// A user's message of one text part.
    pub fn user_text(message_id: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            message_id: message_id.into(),
            role: Role::User,
            parts: vec![Part::text(text)],
            ..Self::default()
        }
    }

    /// Sets the context and task the message belongs to.
    pub fn in_task(mut self, context_id: impl Into<String>, task_id: impl Into<String>) -> Self {
        self.context_id = Some(context_id.into());
        self.task_id = Some(task_id.into());
        self
    }
}

/// One piece of a message or an artifact: text, structured data, a file by URL or inline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    /// The content (one of the protocol's `text`, `raw`, `url` and `data` fields).
    #[serde(flatten)]
    pub content: PartContent,
    /// Extra data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// A file's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// The content's media type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
}

/// What a part holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PartContent {
    /// Text.
    Text(String),
    /// A file's bytes, base64-encoded.
    Raw(String),
    /// A file by its URL.
    Url(String),
    /// Structured data (any JSON value).
    Data(Value),
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Self::of(PartContent::Text(text.into()))
    }

    /// A data part.
    pub fn data(data: Value) -> Self {
        Self::of(PartContent::Data(data))
    }

    fn of(content: PartContent) -> Self {
        Self {
            content,
            metadata: None,
            filename: None,
            media_type: None,
        }
    }

    /// The part's kind as the protocol names its field (`text`, `raw`, `url`, `data`).
    pub fn kind(&self) -> &'static str {
        match self.content {
            PartContent::Text(_) => "text",
            PartContent::Raw(_) => "raw",
            PartContent::Url(_) => "url",
            PartContent::Data(_) => "data",
        }
    }
}
