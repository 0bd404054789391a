//! The HTTP executor for chat completions, over reqwest with rustls.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value};

use super::decoder::ChatStreamDecoder;
use super::wire::{BodyOptions, MaxTokensField, error_from_status, request_body};
use crate::error::InferenceExecutionError;
use crate::event::{LlmEventStream, LlmStreamEvent};
use crate::executor::LlmExecutor;
use crate::http::{self, ApiKey, Endpoint, StreamDecoder};
use crate::request::InferenceRequest;

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
    endpoint: Endpoint,
    headers: HeaderMap,
}

/// Calls an OpenAI-compatible chat-completions endpoint.
///
/// Each call is one `POST {base_url}/chat/completions`, streamed over SSE (default) or not.
/// HTTP errors map to [`InferenceExecutionError`] classes as [`super::error_from_status`]
/// describes; a `Retry-After` (or `retry-after-ms`) header becomes the error's `retry_after`.
/// A request that cannot be sent is [`InferenceExecutionError::Connection`], naming the host
/// and port and what failed there ([`ConnectionFailure`](crate::ConnectionFailure): refused, DNS, TLS, timed out, ...).
/// Dropping the stream aborts the request and closes its connection.
#[derive(Debug, Clone)]
pub struct OpenAiExecutor {
    inner: Arc<Inner>,
}

impl OpenAiExecutor {
    /// An executor for `config`. Fails with [`InferenceExecutionError::Config`] when the base
    /// URL, a header or the API key cannot be used.
    pub fn new(config: OpenAiConfig) -> Result<Self, InferenceExecutionError> {
        let endpoint = Endpoint::new(&config.base_url, "/chat/completions")?;
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(key) = &config.api_key {
            headers.insert(
                header::AUTHORIZATION,
                http::secret_header(&format!("Bearer {}", key.expose()), "api_key")?,
            );
        }
        http::extra_headers(&mut headers, &config.extra_headers)?;
        if let RoutingKeyPlacement::Header(name) = &config.routing_key {
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                InferenceExecutionError::Config {
                    field: "routing_key",
                    reason: format!("{name:?} is not a header name"),
                }
            })?;
        }
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
            .post(self.endpoint.url.clone())
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
            url = %self.endpoint.shown_url,
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
                &model,
                &self.endpoint.shown_url,
            );
            tracing::debug!(executor = %config.name, status = status.as_u16(), error = %error, "chat completion failed");
            return Err(error);
        }
        if !config.stream || !http::is_event_stream(&response) {
            let body = http::whole_body(response, config.request_timeout).await?;
            let events = ChatStreamDecoder::decode_completion(&body)?;
            return Ok(stream::iter(events.into_iter().map(Ok)).boxed());
        }
        Ok(http::body_stream(
            response,
            ChatStreamDecoder::new(),
            config.stream_idle_timeout,
        ))
    }
}

impl StreamDecoder for ChatStreamDecoder {
    fn push(
        &mut self,
        bytes: &[u8],
        out: &mut Vec<LlmStreamEvent>,
    ) -> Result<(), InferenceExecutionError> {
        ChatStreamDecoder::push(self, bytes, out)
    }

    fn finish(&mut self, out: &mut Vec<LlmStreamEvent>) -> Result<(), InferenceExecutionError> {
        ChatStreamDecoder::finish(self, out)
    }

    fn is_done(&self) -> bool {
        ChatStreamDecoder::is_done(self)
    }
}
