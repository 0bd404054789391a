//! [`ApiError`]: every refusal as a JSON body with a stable `code`, a message and, where it
//! applies, the field at fault.

use std::time::Duration;

use awaken_runtime::RunError;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A refused or failed request: its status, a stable machine-readable `code`, a message for
/// people and the request field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The stable code (`unknown_agent`, `thread_busy`, ...).
    pub code: &'static str,
    /// What went wrong.
    pub message: String,
    /// The request field at fault, if one is.
    pub field: Option<&'static str>,
    /// For 503: how long to wait before trying again.
    pub retry_after: Option<Duration>,
}

impl ApiError {
    /// An error with no field.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            field: None,
            retry_after: None,
        }
    }

    /// 400 naming `field`.
    pub fn bad_field(code: &'static str, field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field: Some(field),
            ..Self::new(StatusCode::BAD_REQUEST, code, message)
        }
    }

    /// 404.
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    /// 409.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    /// 500 for a failure of the server's own (the store, most often).
    pub fn internal(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, code, message)
    }

    /// 503 with `Retry-After`.
    pub fn unavailable(code: &'static str, message: impl Into<String>, retry: Duration) -> Self {
        Self {
            retry_after: Some(retry),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": {"code": self.code, "message": self.message}});
        if let Some(field) = self.field {
            body["error"]["field"] = field.into();
        }
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(retry) = self.retry_after {
            let secs = retry.as_secs_f64().ceil().max(1.0) as u64;
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"awaken\""),
            );
        }
        response
    }
}

impl From<RunError> for ApiError {
    fn from(e: RunError) -> Self {
        let message = e.to_string();
        match &e {
            RunError::Resolve(_) | RunError::BackendPlan { .. } => {
                ApiError::bad_field("unresolved_agent", "agent", message)
            }
            RunError::ThreadWaiting { .. } => ApiError::conflict("thread_waiting", message),
            RunError::ThreadBusy { .. } | RunError::TakenOver { .. } => {
                ApiError::conflict("thread_busy", message)
            }
            RunError::NotWaiting { .. } => ApiError::conflict("not_waiting", message),
            RunError::Decision { .. } => {
                ApiError::bad_field("invalid_decision", "decisions", message)
            }
            RunError::RunIdTaken { .. } => ApiError::conflict("run_id_taken", message),
            RunError::ShuttingDown => {
                ApiError::unavailable("shutting_down", message, Duration::from_secs(1))
            }
            RunError::Commit { source, .. } if source.is_refusal() => {
                ApiError::conflict("thread_changed", message)
            }
            RunError::EndNotWritten { .. } => ApiError::internal("end_not_written", message),
            _ => ApiError::internal("run_failed", message),
        }
    }
}

/// The store failed: 500, with its message.
pub(crate) fn store_failed(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal("store_failed", format!("the thread store failed: {e}"))
}
