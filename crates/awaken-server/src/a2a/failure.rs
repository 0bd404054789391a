//! The A2A edge's refusals: [`A2aFailure`], an `A2aError` answered with the binding's error
//! body and HTTP status, and the conversions from the server's own refusals.

use std::time::Duration;

use awaken_a2a::{A2A_JSON_MEDIA_TYPE, A2aError};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::ApiError;

/// A refusal or failure of an A2A request, answered with the binding's error body.
#[derive(Debug)]
pub(crate) struct A2aFailure {
    error: A2aError,
    /// For 503: how long to wait before trying again.
    retry_after: Option<Duration>,
}

impl From<A2aError> for A2aFailure {
    fn from(error: A2aError) -> Self {
        Self {
            error,
            retry_after: None,
        }
    }
}

impl IntoResponse for A2aFailure {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.error.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = json_response(status, &self.error.body());
        let headers = response.headers_mut();
        if let Some(retry) = self.retry_after {
            let secs = retry.as_secs_f64().ceil().max(1.0) as u64;
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                headers.insert(header::RETRY_AFTER, v);
            }
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"awaken\""),
            );
        }
        response
    }
}

/// An A2A handler's result.
pub(crate) type A2aResult<T = Response> = Result<T, A2aFailure>;

/// A native refusal as an A2A error: 400 names its field as invalid params; 5xx fails; the
/// rest keep their status and code.
pub(crate) fn from_api(e: ApiError) -> A2aFailure {
    let retry_after = e.retry_after;
    let error = match e.status.as_u16() {
        400 => A2aError::InvalidParams {
            field: e.field.unwrap_or("message").to_owned(),
            detail: e.message,
        },
        500 => A2aError::Internal { detail: e.message },
        status => A2aError::Refused {
            status,
            code: e.code.to_owned(),
            detail: e.message,
        },
    };
    A2aFailure { error, retry_after }
}

/// The store failed.
pub(crate) fn store_error(e: impl std::fmt::Display) -> A2aFailure {
    A2aError::Internal {
        detail: format!("the thread store failed: {e}"),
    }
    .into()
}

/// The refusal of a request without the server's token.
pub(crate) fn unauthorized() -> Response {
    A2aFailure::from(A2aError::Refused {
        status: 401,
        code: "unauthorized".to_owned(),
        detail: "this server needs `Authorization: Bearer <token>`".to_owned(),
    })
    .into_response()
}

/// `value` as a JSON body of the binding's media type.
pub(crate) fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(A2A_JSON_MEDIA_TYPE),
            )],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unserialisable answer: {e}"),
        )
            .into_response(),
    }
}
