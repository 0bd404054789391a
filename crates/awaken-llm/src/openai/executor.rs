//! The HTTP executor for chat completions, over reqwest with rustls.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value};

use super::decoder::ChatStreamDecoder;
use super::wire::{
    BodyOptions, MaxTokensField, error_from_status, parse_retry_after, request_body,
};
use crate::error::{ConnectionAttempt, ConnectionFailure, InferenceExecutionError};
use crate::event::{LlmEventStream, LlmStreamEvent};
use crate::executor::LlmExecutor;
use crate::request::InferenceRequest;

/// An API key. Its `Debug` prints `ApiKey(<redacted>)`; it has no `Display`, is sent only as
/// a sensitive `Authorization: Bearer` header, and is never logged.
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
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Where the request's routing key (session affinity) goes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RoutingKeyPlacement {
    /// Not sent.
    #[default]
    Omit,
    /// As this HTTP header (e.g. `x-session-affinity` for a sticky load balancer).
    Header(String),
    /// As this top-level body field (e.g. `prompt_cache_key` for OpenAI, `user`).
    BodyField(String),
}

/// Configuration of an [`OpenAiExecutor`]. `docs/providers.md` describes each field.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OpenAiConfig {
    /// The API root, up to and including the version: `https://api.openai.com/v1`,
    /// `http://localhost:11434/v1` (Ollama), `http://localhost:8000/v1` (vLLM), ...
    /// `/chat/completions` is appended.
    pub base_url: String,
    /// Sent as `Authorization: Bearer <key>` when set (local servers usually need none).
    pub api_key: Option<ApiKey>,
    /// Stream the response over SSE (default `true`); `false` makes one plain request.
    pub stream: bool,
    /// With `stream`, ask for usage in the final chunk (`stream_options.include_usage`,
    /// default `true`). Turn off for servers that reject `stream_options`.
    pub include_usage: bool,
    /// How long to wait for the response headers (and, without `stream`, the whole body).
    /// Default 120 s.
    pub request_timeout: Duration,
    /// How long a stream may stay silent between two chunks. Default 120 s.
    pub stream_idle_timeout: Duration,
    /// How long to wait for the TCP (and TLS) connection. Default 10 s.
    pub connect_timeout: Duration,
    /// Which field carries `max_tokens` (default `max_tokens`).
    pub max_tokens_field: MaxTokensField,
    /// Where the routing key goes (default: not sent).
    pub routing_key: RoutingKeyPlacement,
    /// Extra HTTP headers (e.g. `OpenAI-Organization`).
    pub extra_headers: Vec<(String, String)>,
    /// Extra top-level body fields (e.g. `{"seed": 1}`); fields the request sets win.
    pub extra_body: Map<String, Value>,
    /// The executor's name for logs (default `"openai"`).
    pub name: String,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com/v1".to_owned(),
            api_key: None,
            stream: true,
            include_usage: true,
            request_timeout: Duration::from_secs(120),
            stream_idle_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            max_tokens_field: MaxTokensField::MaxTokens,
            routing_key: RoutingKeyPlacement::Omit,
            extra_headers: Vec::new(),
            extra_body: Map::new(),
            name: "openai".to_owned(),
        }
    }
}

impl OpenAiConfig {
    /// The defaults with this base URL.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            ..Self::default()
        }
    }

    /// Sets the API key.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(ApiKey::new(key));
        self
    }

    /// Sets streaming on or off.
    pub fn with_stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// Sets `stream_options.include_usage`.
    pub fn with_include_usage(mut self, include: bool) -> Self {
        self.include_usage = include;
        self
    }

    /// Sets the request timeout.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the stream idle timeout.
    pub fn with_stream_idle_timeout(mut self, timeout: Duration) -> Self {
        self.stream_idle_timeout = timeout;
        self
    }

    /// Sets the connect timeout.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the max-tokens field.
    pub fn with_max_tokens_field(mut self, field: MaxTokensField) -> Self {
        self.max_tokens_field = field;
        self
    }

    /// Sets where the routing key goes.
    pub fn with_routing_key(mut self, placement: RoutingKeyPlacement) -> Self {
        self.routing_key = placement;
        self
    }

    /// Adds an HTTP header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_headers.push((name.into(), value.into()));
        self
    }

    /// Adds a body field.
    pub fn with_body_field(mut self, name: impl Into<String>, value: Value) -> Self {
        self.extra_body.insert(name.into(), value);
        self
    }

    /// Sets the executor's name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
}

#[derive(Debug)]
struct Inner {
    config: OpenAiConfig,
    client: reqwest::Client,
    url: reqwest::Url,
    /// `url` without user info and query, for logs and errors (a key may hide in either).
    shown_url: String,
    /// `url`'s host (IPv6 in brackets) and port, for connection errors.
    host: String,
    port: u16,
    headers: HeaderMap,
}

/// Calls an OpenAI-compatible chat-completions endpoint.
///
/// Each call is one `POST {base_url}/chat/completions`, streamed over SSE (default) or not.
/// HTTP errors map to [`InferenceExecutionError`] classes as [`super::error_from_status`]
/// describes; a `Retry-After` (or `retry-after-ms`) header becomes the error's `retry_after`.
/// A request that cannot be sent is [`InferenceExecutionError::Connection`], naming the host
/// and port and what failed there ([`ConnectionFailure`]: refused, DNS, TLS, timed out, ...).
/// Dropping the stream aborts the request and closes its connection.
#[derive(Debug, Clone)]
pub struct OpenAiExecutor {
    inner: Arc<Inner>,
}

impl OpenAiExecutor {
    /// An executor for `config`. Fails with [`InferenceExecutionError::Config`] when the base
    /// URL, a header or the API key cannot be used.
    pub fn new(config: OpenAiConfig) -> Result<Self, InferenceExecutionError> {
        let base = config.base_url.trim_end_matches('/');
        let url = reqwest::Url::parse(&format!("{base}/chat/completions")).map_err(|e| {
            InferenceExecutionError::Config {
                field: "base_url",
                reason: format!("{:?} is not a URL: {e}", config.base_url),
            }
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(InferenceExecutionError::Config {
                field: "base_url",
                reason: format!("scheme {:?} is not http or https", url.scheme()),
            });
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(key) = &config.api_key {
            let mut value =
                HeaderValue::from_str(&format!("Bearer {}", key.expose())).map_err(|_| {
                    InferenceExecutionError::Config {
                        field: "api_key",
                        reason: "holds characters not allowed in an HTTP header".to_owned(),
                    }
                })?;
            value.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, value);
        }
        for (name, value) in &config.extra_headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                InferenceExecutionError::Config {
                    field: "extra_headers",
                    reason: format!("{name:?} is not a header name"),
                }
            })?;
            let value =
                HeaderValue::from_str(value).map_err(|_| InferenceExecutionError::Config {
                    field: "extra_headers",
                    reason: format!("the value of {name} is not a valid header value"),
                })?;
            headers.append(name, value);
        }
        if let RoutingKeyPlacement::Header(name) = &config.routing_key {
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                InferenceExecutionError::Config {
                    field: "routing_key",
                    reason: format!("{name:?} is not a header name"),
                }
            })?;
        }
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| InferenceExecutionError::Config {
                field: "client",
                reason: e.to_string(),
            })?;
        let host = url.host_str().unwrap_or_default().to_owned();
        let port = url
            .port_or_known_default()
            .unwrap_or(if url.scheme() == "https" { 443 } else { 80 });
        let mut shown = url.clone();
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        shown.set_query(None);
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                client,
                url,
                shown_url: shown.to_string(),
                host,
                port,
                headers,
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &OpenAiConfig {
        &self.inner.config
    }
}

impl LlmExecutor for OpenAiExecutor {
    fn name(&self) -> &str {
        &self.inner.config.name
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let inner = Arc::clone(&self.inner);
        stream::once(async move {
            match inner.start(request).await {
                Ok(stream) => stream,
                Err(e) => stream::once(async move { Err(e) }).boxed(),
            }
        })
        .flatten()
        .boxed()
    }
}

/// Reads an error body, at most 64 KiB, within `timeout`.
async fn error_body(response: &mut reqwest::Response, timeout: Duration) -> String {
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

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
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
    parse_retry_after(value, now)
}

impl Inner {
    async fn start(
        self: Arc<Self>,
        request: InferenceRequest,
    ) -> Result<LlmEventStream, InferenceExecutionError> {
        let config = &self.config;
        let routing_field = match &config.routing_key {
            RoutingKeyPlacement::BodyField(f) => Some(f.as_str()),
            _ => None,
        };
        let options = BodyOptions {
            stream: config.stream,
            include_usage: config.include_usage,
            max_tokens_field: config.max_tokens_field,
            extra: Some(&config.extra_body),
            routing_field,
        };
        let body = request_body(&request, &options).map_err(|e| {
            InferenceExecutionError::InvalidRequest {
                status: None,
                message: format!("the request could not be serialized: {e}"),
            }
        })?;
        let model = request.effective_model().to_owned();
        let mut builder = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .body(body);
        if config.stream {
            builder = builder.header(header::ACCEPT, "text/event-stream");
        }
        if let (RoutingKeyPlacement::Header(name), Some(key)) =
            (&config.routing_key, &request.routing_key)
        {
            builder = builder.header(name.as_str(), &**key);
        }
        tracing::debug!(
            executor = %config.name,
            url = %self.shown_url,
            model = %model,
            stream = config.stream,
            messages = request.messages.len(),
            tools = request.tools.len(),
            "chat completion request"
        );
        let sent = tokio::time::timeout(config.request_timeout, builder.send()).await;
        let mut response = match sent {
            Err(_) => {
                return Err(InferenceExecutionError::Timeout {
                    after: config.request_timeout,
                    waiting_for: "response headers",
                });
            }
            Ok(Err(e)) => {
                // The client has no overall timeout: a reqwest timeout is the connect timeout.
                let kind = if e.is_timeout() {
                    ConnectionFailure::TimedOut
                } else {
                    ConnectionFailure::classify(&e)
                };
                return Err(InferenceExecutionError::Connection {
                    url: self.shown_url.clone(),
                    attempt: Box::new(ConnectionAttempt::new(self.host.clone(), self.port, kind)),
                    source: Box::new(e.without_url()),
                });
            }
            Ok(Ok(r)) => r,
        };
        let status = response.status();
        if !status.is_success() {
            let after = retry_after(response.headers());
            let body = error_body(&mut response, config.request_timeout).await;
            let error = error_from_status(status.as_u16(), after, &body, &model, &self.shown_url);
            tracing::debug!(executor = %config.name, status = status.as_u16(), error = %error, "chat completion failed");
            return Err(error);
        }
        let is_sse = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !config.stream || !is_sse {
            let body = tokio::time::timeout(config.request_timeout, response.bytes())
                .await
                .map_err(|_| InferenceExecutionError::Timeout {
                    after: config.request_timeout,
                    waiting_for: "response body",
                })?
                .map_err(|e| InferenceExecutionError::StreamInterrupted {
                    reason: "reading the response body failed".to_owned(),
                    source: Some(Box::new(e.without_url())),
                })?;
            let events = ChatStreamDecoder::decode_completion(&body)?;
            return Ok(stream::iter(events.into_iter().map(Ok)).boxed());
        }
        let state = BodyStream {
            response: Some(response),
            decoder: ChatStreamDecoder::new(),
            queue: VecDeque::new(),
            scratch: Vec::new(),
            error: None,
            idle_timeout: config.stream_idle_timeout,
        };
        Ok(stream::unfold(state, BodyStream::next).boxed())
    }
}

struct BodyStream {
    response: Option<reqwest::Response>,
    decoder: ChatStreamDecoder,
    queue: VecDeque<LlmStreamEvent>,
    scratch: Vec<LlmStreamEvent>,
    error: Option<InferenceExecutionError>,
    idle_timeout: Duration,
}

impl BodyStream {
    async fn next(
        mut self,
    ) -> Option<(Result<LlmStreamEvent, InferenceExecutionError>, BodyStream)> {
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
                tracing::debug!(error = %e, "chat completion stream failed");
                self.error = Some(e);
            } else if self.decoder.is_done() {
                // Complete: drop the response (the rest of the body is only the terminator).
                self.response = None;
            }
        }
    }
}
