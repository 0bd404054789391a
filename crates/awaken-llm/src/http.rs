//! What the HTTP executors share: the redacted API key, the endpoint and how a failed send is
//! reported, the retry-after headers, the error body, and the SSE body stream that feeds an
//! IO-free decoder.

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::error::{ConnectionAttempt, ConnectionFailure, InferenceExecutionError};
use crate::event::{LlmEventStream, LlmStreamEvent};

/// An API key. Its `Debug` prints `ApiKey(<redacted>)`; it has no `Display`, is sent only as
/// a sensitive header, and is never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the key replaced by `<redacted>` (a provider that
    /// quotes the key in an error must not put it in the error's message).
    pub(crate) fn redact(&self, text: String) -> String {
        if self.0.is_empty() || !text.contains(&self.0) {
            text
        } else {
            text.replace(&self.0, "<redacted>")
        }
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// A sensitive header value holding a key; `field` names the configuration field in the error.
pub(crate) fn secret_header(
    value: &str,
    field: &'static str,
) -> Result<HeaderValue, InferenceExecutionError> {
    let mut value = HeaderValue::from_str(value).map_err(|_| InferenceExecutionError::Config {
        field,
        reason: "holds characters not allowed in an HTTP header".to_owned(),
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// Appends the configured extra headers to `headers`.
pub(crate) fn extra_headers(
    headers: &mut HeaderMap,
    extra: &[(String, String)],
) -> Result<(), InferenceExecutionError> {
    for (name, value) in extra {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            InferenceExecutionError::Config {
                field: "extra_headers",
                reason: format!("{name:?} is not a header name"),
            }
        })?;
        let value = HeaderValue::from_str(value).map_err(|_| InferenceExecutionError::Config {
            field: "extra_headers",
            reason: format!("the value of {name} is not a valid header value"),
        })?;
        headers.append(name, value);
    }
    Ok(())
}

/// The URL an executor posts to, and how it is shown.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub(crate) url: reqwest::Url,
    /// `url` without user info and query, for logs and errors (a key may hide in either).
    pub(crate) shown_url: String,
    /// `url`'s host (IPv6 in brackets) and port, for connection errors.
    host: String,
    port: u16,
}

impl Endpoint {
    /// `{base_url}{path}` (a trailing `/` of the base dropped); fails with
    /// [`InferenceExecutionError::Config`] on `base_url` when it is not an http(s) URL.
    pub(crate) fn new(base_url: &str, path: &str) -> Result<Self, InferenceExecutionError> {
        let base = base_url.trim_end_matches('/');
        let url = reqwest::Url::parse(&format!("{base}{path}")).map_err(|e| {
            InferenceExecutionError::Config {
                field: "base_url",
                reason: format!("{base_url:?} is not a URL: {e}"),
            }
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(InferenceExecutionError::Config {
                field: "base_url",
                reason: format!("scheme {:?} is not http or https", url.scheme()),
            });
        }
        let host = url.host_str().unwrap_or_default().to_owned();
        let port = url
            .port_or_known_default()
            .unwrap_or(if url.scheme() == "https" { 443 } else { 80 });
        let mut shown = url.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        shown.set_query(None);
        Ok(Self {
            url,
            shown_url: shown.to_string(),
            host,
            port,
        })
    }

    /// The error for a request that could not be sent (the client has no overall timeout, so
    /// a reqwest timeout is the connect timeout).
    pub(crate) fn send_error(&self, e: reqwest::Error) -> InferenceExecutionError {
        let kind = if e.is_timeout() {
            ConnectionFailure::TimedOut
        } else {
            ConnectionFailure::classify(&e)
        };
        InferenceExecutionError::Connection {
            url: self.shown_url.clone(),
            attempt: Box::new(ConnectionAttempt::new(self.host.clone(), self.port, kind)),
            source: Box::new(e.without_url()),
        }
    }
}

/// A client with this connect timeout.
pub(crate) fn client(
    connect_timeout: Duration,
) -> Result<reqwest::Client, InferenceExecutionError> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .build()
        .map_err(|e| InferenceExecutionError::Config {
            field: "client",
            reason: e.to_string(),
        })
}

/// Reads an error body, at most 64 KiB, within `timeout`.
pub(crate) async fn error_body(response: &mut reqwest::Response, timeout: Duration) -> String {
    let mut body = Vec::new();
    let read = async {
        while let Ok(Some(chunk)) = response.chunk().await {
            body.extend_from_slice(&chunk);
            if body.len() > 64 * 1024 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(timeout, read).await;
    String::from_utf8_lossy(&body).into_owned()
}

/// The delay a response asks for: `retry-after-ms` (OpenAI) when present, else `Retry-After`
/// in seconds or as an HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
    {
        return Some(Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX));
    }
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    crate::retry_after::parse_retry_after(value, now)
}

/// Whether the response is an SSE stream.
pub(crate) fn is_event_stream(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Reads a whole (non-streamed) body within `timeout`.
pub(crate) async fn whole_body(
    response: reqwest::Response,
    timeout: Duration,
) -> Result<impl std::ops::Deref<Target = [u8]>, InferenceExecutionError> {
    tokio::time::timeout(timeout, response.bytes())
        .await
        .map_err(|_| InferenceExecutionError::Timeout {
            after: timeout,
            waiting_for: "response body",
        })?
        .map_err(|e| InferenceExecutionError::StreamInterrupted {
            reason: "reading the response body failed".to_owned(),
            source: Some(Box::new(e.without_url())),
        })
}

/// An IO-free decoder of a streamed body, fed piece by piece.
pub(crate) trait StreamDecoder: Send + 'static {
    /// Feeds the next piece, appending the events it completes to `out`.
    fn push(
        &mut self,
        bytes: &[u8],
        out: &mut Vec<LlmStreamEvent>,
    ) -> Result<(), InferenceExecutionError>;

    /// Ends the body.
    fn finish(&mut self, out: &mut Vec<LlmStreamEvent>) -> Result<(), InferenceExecutionError>;

    /// Whether the stream is complete.
    fn is_done(&self) -> bool;
}

/// The events of a streamed response body, decoded by `decoder`; a body silent for longer
/// than `idle_timeout` ends with [`InferenceExecutionError::Timeout`]. Dropping the stream
/// drops the response, which closes its connection.
pub(crate) fn body_stream<D: StreamDecoder>(
    response: reqwest::Response,
    decoder: D,
    idle_timeout: Duration,
) -> LlmEventStream {
    let state = BodyStream {
        response: Some(response),
        decoder,
        queue: VecDeque::new(),
        scratch: Vec::new(),
        error: None,
        idle_timeout,
    };
    stream::unfold(state, BodyStream::next).boxed()
}

struct BodyStream<D> {
    response: Option<reqwest::Response>,
    decoder: D,
    queue: VecDeque<LlmStreamEvent>,
    scratch: Vec<LlmStreamEvent>,
    error: Option<InferenceExecutionError>,
    idle_timeout: Duration,
}

impl<D: StreamDecoder> BodyStream<D> {
    async fn next(mut self) -> Option<(Result<LlmStreamEvent, InferenceExecutionError>, Self)> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                return Some((Ok(event), self));
            }
            if let Some(error) = self.error.take() {
                self.response = None;
                return Some((Err(error), self));
            }
            let response = self.response.as_mut()?;
            let chunk = tokio::time::timeout(self.idle_timeout, response.chunk()).await;
            let result = match chunk {
                Err(_) => Err(InferenceExecutionError::Timeout {
                    after: self.idle_timeout,
                    waiting_for: "next stream chunk",
                }),
                Ok(Err(e)) => Err(InferenceExecutionError::StreamInterrupted {
                    reason: "the connection failed while streaming".to_owned(),
                    source: Some(Box::new(e.without_url())),
                }),
                Ok(Ok(Some(bytes))) => self.decoder.push(&bytes, &mut self.scratch),
                Ok(Ok(None)) => {
                    self.response = None;
                    self.decoder.finish(&mut self.scratch)
                }
            };
            self.queue.extend(self.scratch.drain(..));
            if let Err(e) = result {
                tracing::debug!(error = %e, "response stream failed");
                self.error = Some(e);
            } else if self.decoder.is_done() {
                // Complete: drop the response (what may follow is only the body's end).
                self.response = None;
            }
        }
    }
}
