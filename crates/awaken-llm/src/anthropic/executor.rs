//! The HTTP executor for the Messages API, over reqwest with rustls.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value};

use super::decoder::MessagesStreamDecoder;
use super::wire::{
    ANTHROPIC_VERSION, BodyOptions, DEFAULT_MAX_TOKENS, error_from_status, request_body,
};
use crate::error::InferenceExecutionError;
use crate::event::{LlmEventStream, LlmStreamEvent};
use crate::executor::LlmExecutor;
use crate::http::{self, ApiKey, Endpoint, StreamDecoder};
use crate::request::InferenceRequest;

/// Configuration of an [`AnthropicExecutor`]. `docs/providers.md` describes each field.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AnthropicConfig {
    /// The API root without the version: `https://api.anthropic.com` (default). `/v1/messages`
    /// is appended (only `/messages` to a base that already ends in `/v1`).
    pub base_url: String,
    /// Sent as `x-api-key` when set (a local proxy may need none).
    pub api_key: Option<ApiKey>,
    /// `max_tokens` when the request's overrides set none (the API requires a limit).
    /// Default [`DEFAULT_MAX_TOKENS`].
    pub max_tokens: u32,
    /// How long to wait for the response headers (and, for a plain JSON answer, the whole
    /// body). Default 120 s.
    pub request_timeout: Duration,
    /// How long a stream may stay silent between two chunks. Default 120 s. (The API sends a
    /// `ping` now and then, which counts.)
    pub stream_idle_timeout: Duration,
    /// How long to wait for the TCP (and TLS) connection. Default 10 s.
    pub connect_timeout: Duration,
    /// Extra HTTP headers (e.g. `anthropic-beta`).
    pub extra_headers: Vec<(String, String)>,
    /// Extra top-level body fields (e.g. `{"top_k": 5}`, `metadata`); fields the request sets
    /// win.
    pub extra_body: Map<String, Value>,
    /// The executor's name for logs (default `"anthropic"`).
    pub name: String,
}

impl Default for AnthropicConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.anthropic.com".to_owned(),
            api_key: None,
            max_tokens: DEFAULT_MAX_TOKENS,
            request_timeout: Duration::from_secs(120),
            stream_idle_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            extra_headers: Vec::new(),
            extra_body: Map::new(),
            name: "anthropic".to_owned(),
        }
    }
}

impl AnthropicConfig {
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

    /// Sets the default `max_tokens`.
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens;
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
    config: AnthropicConfig,
    client: reqwest::Client,
    endpoint: Endpoint,
    headers: HeaderMap,
}

/// Calls Anthropic's Messages API.
///
/// Each call is one streamed `POST {base_url}/v1/messages` with `x-api-key` and
/// `anthropic-version: 2023-06-01`; [`super::request_body`] describes the body and
/// [`MessagesStreamDecoder`] the decoding (a server that answers with a whole JSON message
/// instead of a stream is decoded too). HTTP errors map to [`InferenceExecutionError`] classes
/// as [`super::error_from_status`] describes; a `Retry-After` header becomes the error's
/// `retry_after`. A request that cannot be sent is [`InferenceExecutionError::Connection`],
/// naming the host and port and what failed there. Dropping the stream aborts the request and
/// closes its connection. The key is never logged, and is cut out of any error body that
/// quotes it.
#[derive(Debug, Clone)]
pub struct AnthropicExecutor {
    inner: Arc<Inner>,
}

impl AnthropicExecutor {
    /// An executor for `config`. Fails with [`InferenceExecutionError::Config`] when the base
    /// URL, a header or the API key cannot be used, or `max_tokens` is 0.
    pub fn new(config: AnthropicConfig) -> Result<Self, InferenceExecutionError> {
        let path = if config.base_url.trim_end_matches('/').ends_with("/v1") {
            "/messages"
        } else {
            "/v1/messages"
        };
        let endpoint = Endpoint::new(&config.base_url, path)?;
        if config.max_tokens == 0 {
            return Err(InferenceExecutionError::Config {
                field: "max_tokens",
                reason: "must be at least 1".to_owned(),
            });
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        if let Some(key) = &config.api_key {
            headers.insert(
                HeaderName::from_static("x-api-key"),
                http::secret_header(key.expose(), "api_key")?,
            );
        }
        http::extra_headers(&mut headers, &config.extra_headers)?;
        let client = http::client(config.connect_timeout)?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                client,
                endpoint,
                headers,
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &AnthropicConfig {
        &self.inner.config
    }
}

impl LlmExecutor for AnthropicExecutor {
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

impl Inner {
    async fn start(
        self: Arc<Self>,
        request: InferenceRequest,
    ) -> Result<LlmEventStream, InferenceExecutionError> {
        let config = &self.config;
        let options = BodyOptions {
            stream: true,
            default_max_tokens: config.max_tokens,
            extra: Some(&config.extra_body),
        };
        let body = request_body(&request, &options)?;
        let model = request.effective_model();
        let builder = self
            .client
            .post(self.endpoint.url.clone())
            .headers(self.headers.clone())
            .header(header::ACCEPT, "text/event-stream")
            .body(body);
        tracing::debug!(
            executor = %config.name,
            url = %self.endpoint.shown_url,
            model = %model,
            messages = request.messages.len(),
            tools = request.tools.len(),
            "messages request"
        );
        let sent = tokio::time::timeout(config.request_timeout, builder.send()).await;
        let mut response = match sent {
            Err(_) => {
                return Err(InferenceExecutionError::Timeout {
                    after: config.request_timeout,
                    waiting_for: "response headers",
                });
            }
            Ok(Err(e)) => return Err(self.endpoint.send_error(e)),
            Ok(Ok(r)) => r,
        };
        let status = response.status();
        if !status.is_success() {
            let after = http::retry_after(response.headers());
            let mut body = http::error_body(&mut response, config.request_timeout).await;
            if let Some(key) = &config.api_key {
                body = key.redact(body);
            }
            let error = error_from_status(
                status.as_u16(),
                after,
                &body,
                model,
                &self.endpoint.shown_url,
            );
            tracing::debug!(executor = %config.name, status = status.as_u16(), error = %error, "messages request failed");
            return Err(error);
        }
        if !http::is_event_stream(&response) {
            let body = http::whole_body(response, config.request_timeout).await?;
            let events = MessagesStreamDecoder::decode_message(&body)?;
            return Ok(stream::iter(events.into_iter().map(Ok)).boxed());
        }
        Ok(http::body_stream(
            response,
            MessagesStreamDecoder::new(),
            config.stream_idle_timeout,
        ))
    }
}

impl StreamDecoder for MessagesStreamDecoder {
    fn push(
        &mut self,
        bytes: &[u8],
        out: &mut Vec<LlmStreamEvent>,
    ) -> Result<(), InferenceExecutionError> {
        MessagesStreamDecoder::push(self, bytes, out)
    }

    fn finish(&mut self, out: &mut Vec<LlmStreamEvent>) -> Result<(), InferenceExecutionError> {
        MessagesStreamDecoder::finish(self, out)
    }

    fn is_done(&self) -> bool {
        MessagesStreamDecoder::is_done(self)
    }
}
