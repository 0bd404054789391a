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
    /// No response (or no next chunk of a stream) arrived in time. A connection that could not
    /// be made in time is a [`InferenceExecutionError::Connection`] of kind
    /// [`ConnectionFailure::TimedOut`] instead.
    #[error("inference timed out after {after:?} waiting for {waiting_for}")]
    Timeout {
        /// The timeout that elapsed.
        after: Duration,
        /// What was awaited: `"response headers"`, `"response body"` or
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
    /// The request could not be sent (connection refused, DNS, TLS, timeout, reset before a
    /// response). The message names the address and what failed there, e.g. `connection
    /// refused by 127.0.0.1:9 (is the server running?)`.
    #[error(
        "could not reach the provider at {url}: {}",
        describe_connection(.attempt, .source.as_ref())
    )]
    Connection {
        /// The URL that was called (without user info or query).
        url: String,
        /// Where the connection went and what failed there (boxed: it is rare, and every
        /// stream item is as large as the largest error).
        attempt: Box<ConnectionAttempt>,
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
    /// The provider does not know the model (HTTP 404 with a provider error that names a
    /// model, such as OpenAI's `model_not_found`).
    #[error("model {model:?} not found: {message}")]
    ModelNotFound {
        /// The upstream model name that was asked for.
        model: String,
        /// The provider's message.
        message: String,
    },
    /// The server has no endpoint at the URL called (HTTP 404 whose body is not a provider
    /// error about a model: an HTML page, plain `Not Found`, `{"detail":"Not Found"}`, ...):
    /// the base URL is wrong.
    #[error(
        "the server has no `POST {url}` (HTTP 404{}){}",
        fmt_detail(.message),
        fmt_suggestion(url)
    )]
    EndpointNotFound {
        /// The URL that was called (without user info or query); [`Self::suggested_base_url`]
        /// derives the base URL to try instead.
        url: String,
        /// The start of the server's answer (at most 200 bytes).
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

fn fmt_detail(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

fn fmt_suggestion(url: &str) -> String {
    match versioned_base_url(url) {
        Some(base) => format!("; the base URL may lack its version segment: try `{base}`"),
        None => String::new(),
    }
}

/// For a `{base}/chat/completions` URL whose base path has no version segment (`v1`, `v1beta`,
/// `v2`, ...), the base with `/v1` appended.
fn versioned_base_url(url: &str) -> Option<String> {
    let base = url.strip_suffix("/chat/completions")?;
    let after_scheme = base.split_once("://").map_or(base, |(_, rest)| rest);
    let path = after_scheme.split_once('/').map_or("", |(_, path)| path);
    let is_version = |segment: &str| {
        let mut chars = segment.chars();
        chars.next() == Some('v') && chars.next().is_some_and(|c| c.is_ascii_digit())
    };
    (!path.split('/').any(is_version)).then(|| format!("{base}/v1"))
}

/// Where a connection went and what failed there.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionAttempt {
    /// The host called: a name, an IPv4 address or a bracketed IPv6 address.
    pub host: String,
    /// The port called.
    pub port: u16,
    /// What failed.
    pub kind: ConnectionFailure,
}

impl ConnectionAttempt {
    /// A failed attempt to reach `host:port`.
    pub fn new(host: impl Into<String>, port: u16, kind: ConnectionFailure) -> Self {
        Self {
            host: host.into(),
            port,
            kind,
        }
    }
}

fn describe_connection(
    attempt: &ConnectionAttempt,
    source: &(dyn std::error::Error + Send + Sync + 'static),
) -> String {
    let ConnectionAttempt { host, port, kind } = attempt;
    let cause = chain(source)
        .last()
        .map(ToString::to_string)
        .unwrap_or_default();
    match kind {
        ConnectionFailure::Refused => {
            format!("connection refused by {host}:{port} (is the server running?)")
        }
        ConnectionFailure::Dns => format!("cannot resolve host {host:?} (DNS): {cause}"),
        ConnectionFailure::Tls => format!("TLS handshake with {host}:{port} failed: {cause}"),
        ConnectionFailure::TimedOut => format!("connecting to {host}:{port} timed out"),
        ConnectionFailure::Reset => {
            format!("the connection to {host}:{port} was closed before a response: {cause}")
        }
        ConnectionFailure::Other => format!("sending the request to {host}:{port} failed: {cause}"),
    }
}

impl InferenceExecutionError {
    /// For [`Self::EndpointNotFound`] from a base URL without a version segment, the base URL
    /// with `/v1` to try instead.
    pub fn suggested_base_url(&self) -> Option<String> {
        match self {
            Self::EndpointNotFound { url, .. } => versioned_base_url(url),
            _ => None,
        }
    }

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
            | Self::EndpointNotFound { .. }
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

/// What failed when a request could not be sent: the `kind` of an
/// [`InferenceExecutionError::Connection`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectionFailure {
    /// Nothing accepted the connection at the address (no server listens there).
    Refused,
    /// The host name could not be resolved.
    Dns,
    /// The TLS handshake failed (an untrusted or mismatched certificate, a server that does not
    /// speak TLS, ...).
    Tls,
    /// The connection was not made within the connect timeout (the executor's or the system's).
    TimedOut,
    /// The connection was reset or closed before a response arrived.
    Reset,
    /// Anything else.
    Other,
}

impl ConnectionFailure {
    /// Classifies a transport error by walking its source chain (stepping into the error an
    /// `io::Error` wraps): an `io::Error` of kind `ConnectionRefused` is `Refused`; hyper's
    /// `dns error` or a failed address lookup is `Dns`; a timeout is `TimedOut`; a rustls error
    /// (an `InvalidData` IO error, or a message about a certificate, an alert, a handshake or
    /// TLS) is `Tls`; a reset, aborted, broken or closed connection is `Reset`; anything else is
    /// `Other`. The first rule that matches any error of the chain wins.
    pub fn classify(error: &(dyn std::error::Error + 'static)) -> Self {
        use std::io::ErrorKind as K;
        let links: Vec<(Option<K>, String)> = chain(error)
            .map(|e| {
                let kind = e.downcast_ref::<std::io::Error>().map(std::io::Error::kind);
                (kind, e.to_string().to_ascii_lowercase())
            })
            .collect();
        let any = |test: fn(Option<K>, &str) -> bool| links.iter().any(|(k, t)| test(*k, t));
        if any(|kind, _| kind == Some(K::ConnectionRefused)) {
            Self::Refused
        } else if any(|_, text| mentions(text, &["dns error", "failed to lookup address"])) {
            Self::Dns
        } else if any(|kind, text| kind == Some(K::TimedOut) || text.contains("timed out")) {
            Self::TimedOut
        } else if any(|kind, text| kind == Some(K::InvalidData) || mentions(text, TLS_WORDS)) {
            Self::Tls
        } else if any(|kind, text| {
            matches!(
                kind,
                Some(K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof)
            ) || mentions(text, &["connection closed", "connection reset"])
        }) {
            Self::Reset
        } else {
            Self::Other
        }
    }
}

fn mentions(text: &str, needles: &[&str]) -> bool {
    needles.iter().any(|n| text.contains(n))
}

/// Words of rustls' (and tokio-rustls') error messages.
const TLS_WORDS: &[&str] = &[
    "tls",
    "certificate",
    "handshake",
    "alert",
    "peer is incompatible",
    "peer misbehaved",
    "corrupt message",
];

/// `error` and its sources, stepping into the error an `io::Error` wraps (its own `source`
/// skips that error and gives the wrapped error's source).
fn chain<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |e| match e.downcast_ref::<std::io::Error>() {
        Some(io) => io
            .get_ref()
            .map(|inner| inner as &(dyn std::error::Error + 'static)),
        None => e.source(),
    })
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
