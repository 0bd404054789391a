//! Why an inference failed, classified as retryable, permanent or cancelled.

use std::time::Duration;

/// A boxed error source (transport errors of the HTTP client, ...).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The class of an [`InferenceExecutionError`]: what a caller may do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Trying again later may succeed (rate limits, overload, timeouts, interrupted streams,
    /// server errors, failed connections).
    Retryable,
    /// Trying again with the same request will fail the same way.
    Permanent,
    /// The call was cancelled; nothing to retry.
    Cancelled,
}

/// Why an inference call failed.
///
/// Every variant belongs to one [`ErrorClass`]; [`InferenceExecutionError::is_retryable`] and
/// [`InferenceExecutionError::retry_after`] are what `RetryingExecutor` looks at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InferenceExecutionError {
    // ---- retryable ----
    /// The provider rate-limited the call (HTTP 429).
    #[error("rate limited by the provider{}: {message}", fmt_after(.retry_after))]
    RateLimited {
        /// How long the provider asked to wait, when it said.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// The provider is overloaded (HTTP 503 / 529).
    #[error("provider overloaded (HTTP {status}){}: {message}", fmt_after(.retry_after))]
    Overloaded {
        /// The HTTP status.
        status: u16,
        /// How long the provider asked to wait, when it said.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// No response (or no next chunk of a stream) arrived in time.
    #[error("inference timed out after {after:?} waiting for {waiting_for}")]
    Timeout {
        /// The timeout that elapsed.
        after: Duration,
        /// What was awaited: `"connection"`, `"response headers"`, `"response body"` or
        /// `"next stream chunk"`.
        waiting_for: &'static str,
    },
    /// The response stream broke off before it was complete (connection dropped, body error,
    /// end of stream without a stop).
    #[error("the response stream was interrupted: {reason}")]
    StreamInterrupted {
        /// What happened.
        reason: String,
        /// The transport error, when there was one.
        #[source]
        source: Option<BoxError>,
    },
    /// The provider failed with a server error (HTTP 5xx, or an error event in a stream).
    #[error("provider server error{}: {message}", fmt_status(.status))]
    ServerError {
        /// The HTTP status, when the error came as a status.
        status: Option<u16>,
        /// The provider's message.
        message: String,
    },
    /// The request could not be sent (connection refused, DNS, TLS, reset before a response).
    #[error("could not reach the provider at {url}: {source}")]
    Connection {
        /// The URL that was called.
        url: String,
        /// The transport error.
        #[source]
        source: BoxError,
    },

    // ---- permanent ----
    /// The provider rejected the request (HTTP 400 / 422 and other 4xx not listed here).
    #[error("the provider rejected the request{}: {message}", fmt_status(.status))]
    InvalidRequest {
        /// The HTTP status, when the rejection came as a status.
        status: Option<u16>,
        /// The provider's message.
        message: String,
    },
    /// The credentials were missing or refused (HTTP 401 / 403).
    #[error("unauthorized (HTTP {status}): {message}")]
    Unauthorized {
        /// The HTTP status.
        status: u16,
        /// The provider's message (never contains the key).
        message: String,
    },
    /// The provider does not know the model (HTTP 404).
    #[error("model {model:?} not found: {message}")]
    ModelNotFound {
        /// The upstream model name that was asked for.
        model: String,
        /// The provider's message.
        message: String,
    },
    /// The prompt does not fit the model's context window.
    #[error("the request exceeds the model's context window: {message}")]
    ContextOverflow {
        /// The provider's message.
        message: String,
    },
    /// The provider's content filter refused the request.
    #[error("the provider's content filter refused the request: {message}")]
    ContentFiltered {
        /// The provider's message.
        message: String,
    },
    /// The provider answered something that is not the protocol (bad JSON in a chunk, a
    /// response without choices, ...).
    #[error("malformed provider response: {reason} (in {snippet:?})")]
    MalformedResponse {
        /// What was wrong.
        reason: String,
        /// The start of the offending payload (at most 200 bytes).
        snippet: String,
        /// The JSON error, when it was one.
        #[source]
        source: Option<serde_json::Error>,
    },
    /// A scripted executor was asked for more turns than its script has.
    #[error("the script has no turn left: all {turns} turns were used")]
    ScriptExhausted {
        /// How many turns the script had.
        turns: usize,
    },
    /// The executor is misconfigured (bad base URL, header value, ...).
    #[error("executor misconfigured: `{field}`: {reason}")]
    Config {
        /// The configuration field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },

    // ---- cancelled ----
    /// The call was cancelled before it completed.
    #[error("inference cancelled")]
    Cancelled,
}

fn fmt_after(after: &Option<Duration>) -> String {
    match after {
        Some(d) => format!(" (retry after {d:?})"),
        None => String::new(),
    }
}

fn fmt_status(status: &Option<u16>) -> String {
    match status {
        Some(s) => format!(" (HTTP {s})"),
        None => String::new(),
    }
}

impl InferenceExecutionError {
    /// The class of this error.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::RateLimited { .. }
            | Self::Overloaded { .. }
            | Self::Timeout { .. }
            | Self::StreamInterrupted { .. }
            | Self::ServerError { .. }
            | Self::Connection { .. } => ErrorClass::Retryable,
            Self::InvalidRequest { .. }
            | Self::Unauthorized { .. }
            | Self::ModelNotFound { .. }
            | Self::ContextOverflow { .. }
            | Self::ContentFiltered { .. }
            | Self::MalformedResponse { .. }
            | Self::ScriptExhausted { .. }
            | Self::Config { .. } => ErrorClass::Permanent,
            Self::Cancelled => ErrorClass::Cancelled,
        }
    }

    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        self.class() == ErrorClass::Retryable
    }

    /// Whether the call was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.class() == ErrorClass::Cancelled
    }

    /// How long the provider asked to wait before trying again, when it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after, .. } | Self::Overloaded { retry_after, .. } => {
                *retry_after
            }
            _ => None,
        }
    }

    /// A [`InferenceExecutionError::StreamInterrupted`] without a source.
    pub fn interrupted(reason: impl Into<String>) -> Self {
        Self::StreamInterrupted {
            reason: reason.into(),
            source: None,
        }
    }

    /// A [`InferenceExecutionError::MalformedResponse`] quoting the start of `payload`.
    pub fn malformed(
        reason: impl Into<String>,
        payload: &str,
        source: Option<serde_json::Error>,
    ) -> Self {
        Self::MalformedResponse {
            reason: reason.into(),
            snippet: truncate(payload, 200).to_owned(),
            source,
        }
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
