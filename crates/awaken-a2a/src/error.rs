//! The protocol's errors ([`A2aError`]) and the HTTP+JSON binding's error body
//! ([`ErrorBody`], a `google.rpc.Status` whose `ErrorInfo` detail names the A2A reason).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The `@type` of the error detail that carries the A2A reason.
const ERROR_INFO_TYPE: &str = "type.googleapis.com/google.rpc.ErrorInfo";

/// The domain of the A2A reasons.
const A2A_DOMAIN: &str = "a2a-protocol.org";

/// A request the binding refuses or fails, with what was wrong and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum A2aError {
    /// No task has the id (or the caller may not see it).
    #[error("no task `{task_id}`")]
    TaskNotFound {
        /// The id asked for.
        task_id: String,
    },
    /// The task cannot be canceled in its state.
    #[error("task `{task_id}` cannot be canceled: {reason}")]
    TaskNotCancelable {
        /// The task.
        task_id: String,
        /// Why not.
        reason: String,
    },
    /// The server sends no push notifications.
    #[error(
        "push notifications are not supported: follow a task with `message:stream` or `tasks/{{id}}:subscribe`"
    )]
    PushNotificationNotSupported,
    /// The operation is not offered (in this state, or at all).
    #[error("{operation} is not supported: {reason}")]
    UnsupportedOperation {
        /// The operation.
        operation: String,
        /// Why not.
        reason: String,
    },
    /// The request's body is not JSON (its `Content-Type`).
    #[error(
        "the request's content type `{content_type}` is not supported: send `application/json` or `application/a2a+json`"
    )]
    UnsupportedMediaType {
        /// The `Content-Type` given.
        content_type: String,
    },
    /// A message part of a kind the agent does not take.
    #[error(
        "part {index} of the message is a `{kind}` part: this agent takes `text` and `data` parts"
    )]
    ContentTypeNotSupported {
        /// The part's position in the message.
        index: usize,
        /// Its kind (`raw`, `url`).
        kind: String,
    },
    /// The client speaks a protocol version the server does not.
    #[error("A2A version `{version}` is not supported: this server speaks 1.0")]
    VersionNotSupported {
        /// The version the client named (`A2A-Version`).
        version: String,
    },
    /// A parameter is missing or wrong.
    #[error("invalid `{field}`: {detail}")]
    InvalidParams {
        /// The parameter (a JSON path such as `message.parts[0]`).
        field: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The request cannot be read (not JSON, not the operation's shape).
    #[error("invalid request: {detail}")]
    InvalidRequest {
        /// What is wrong.
        detail: String,
    },
    /// No operation at that path, or no agent of that name.
    #[error("not found: {what}")]
    MethodNotFound {
        /// What was not found.
        what: String,
    },
    /// A refusal of the server's own that the protocol has no reason for (a busy thread, a
    /// missing token, a full server): its HTTP status and the server's stable code.
    #[error("{detail}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The server's stable code (`thread_busy`, `unauthorized`, ...).
        code: String,
        /// What went wrong.
        detail: String,
    },
    /// The server failed.
    #[error("internal error: {detail}")]
    Internal {
        /// What failed.
        detail: String,
    },
}

impl A2aError {
    /// The A2A reason (`TASK_NOT_FOUND`), carried by the body's `ErrorInfo` detail.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TaskNotFound { .. } => "TASK_NOT_FOUND",
            Self::TaskNotCancelable { .. } => "TASK_NOT_CANCELABLE",
            Self::PushNotificationNotSupported => "PUSH_NOTIFICATION_NOT_SUPPORTED",
            Self::UnsupportedOperation { .. } => "UNSUPPORTED_OPERATION",
            Self::UnsupportedMediaType { .. } | Self::ContentTypeNotSupported { .. } => {
                "CONTENT_TYPE_NOT_SUPPORTED"
            }
            Self::VersionNotSupported { .. } => "VERSION_NOT_SUPPORTED",
            Self::InvalidParams { .. } => "INVALID_PARAMS",
            Self::InvalidRequest { .. } => "INVALID_REQUEST",
            Self::MethodNotFound { .. } => "METHOD_NOT_FOUND",
            Self::Refused { status, .. } if *status >= 500 => "INTERNAL_ERROR",
            Self::Refused { .. } => "INVALID_REQUEST",
            Self::Internal { .. } => "INTERNAL_ERROR",
        }
    }

    /// The HTTP status the binding answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::TaskNotFound { .. } | Self::MethodNotFound { .. } => 404,
            Self::UnsupportedMediaType { .. } => 415,
            Self::Refused { status, .. } => *status,
            Self::Internal { .. } => 500,
            _ => 400,
        }
    }

    /// The `google.rpc.Code` name of the error (`NOT_FOUND`, `INVALID_ARGUMENT`, ...).
    pub fn grpc_status(&self) -> &'static str {
        match self {
            Self::TaskNotFound { .. } | Self::MethodNotFound { .. } => "NOT_FOUND",
            Self::TaskNotCancelable { .. }
            | Self::PushNotificationNotSupported
            | Self::UnsupportedOperation { .. }
            | Self::VersionNotSupported { .. } => "FAILED_PRECONDITION",
            Self::UnsupportedMediaType { .. }
            | Self::ContentTypeNotSupported { .. }
            | Self::InvalidParams { .. }
            | Self::InvalidRequest { .. } => "INVALID_ARGUMENT",
            Self::Refused { status, .. } => match status {
                401 => "UNAUTHENTICATED",
                403 => "PERMISSION_DENIED",
                409 => "ABORTED",
                413 | 429 => "RESOURCE_EXHAUSTED",
                503 => "UNAVAILABLE",
                s if *s >= 500 => "INTERNAL",
                _ => "INVALID_ARGUMENT",
            },
            Self::Internal { .. } => "INTERNAL",
        }
    }

    /// The structured fields of the error, as the `ErrorInfo` detail's metadata.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        let pairs: Vec<(&str, &str)> = match self {
            Self::TaskNotFound { task_id } | Self::TaskNotCancelable { task_id, .. } => {
                vec![("taskId", task_id)]
            }
            Self::UnsupportedOperation { operation, .. } => vec![("operation", operation)],
            Self::UnsupportedMediaType { content_type } => vec![("contentType", content_type)],
            Self::ContentTypeNotSupported { kind, .. } => vec![("partKind", kind)],
            Self::VersionNotSupported { version } => vec![("version", version)],
            Self::InvalidParams { field, .. } => vec![("field", field)],
            Self::Refused { code, .. } => vec![("code", code)],
            _ => Vec::new(),
        };
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// The binding's error body of the error.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorStatus {
                code: self.http_status(),
                status: self.grpc_status().to_owned(),
                message: self.to_string(),
                details: vec![ErrorDetail {
                    type_url: ERROR_INFO_TYPE.to_owned(),
                    reason: self.reason().to_owned(),
                    domain: A2A_DOMAIN.to_owned(),
                    metadata: self.metadata(),
                }],
            },
        }
    }
}

/// The HTTP+JSON binding's error body: `{"error": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorStatus,
}

/// A `google.rpc.Status`: the HTTP status, the code's name, a message and typed details.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorStatus {
    /// The HTTP status.
    pub code: u16,
    /// The `google.rpc.Code` name.
    pub status: String,
    /// What went wrong, for people.
    pub message: String,
    /// Typed details; the first `ErrorInfo` carries the A2A reason.
    #[serde(default)]
    pub details: Vec<ErrorDetail>,
}

/// A `google.rpc.ErrorInfo` detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// `type.googleapis.com/google.rpc.ErrorInfo`.
    #[serde(rename = "@type")]
    pub type_url: String,
    /// The A2A reason (`TASK_NOT_FOUND`).
    pub reason: String,
    /// `a2a-protocol.org`.
    pub domain: String,
    /// The error's structured fields.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}
