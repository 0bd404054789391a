//! The streamable HTTP connection to an MCP server: rmcp's transport over the workspace's
//! reqwest client. The client sends the configured headers, follows the protocol's session and
//! content-type rules, and enforces the transport's response limits itself.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future;
use futures_util::stream::{self, BoxStream};
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ServerJsonRpcMessage};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::common::client_side_sse::ExponentialBackoff;
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE, HEADER_LAST_EVENT_ID, HEADER_MCP_PROTOCOL_VERSION, HEADER_SESSION_ID,
    JSON_MIME_TYPE,
};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, HttpStatusError, InsufficientScopeError, SseError, StreamableHttpClient,
    StreamableHttpClientTransportConfig, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::{Sse, SseStream};
use tokio::sync::watch;

/// Same-origin redirects followed for one request.
const MAX_REDIRECTS: usize = 10;
/// Reconnections tried for a broken SSE stream (with exponential backoff from one second)
/// before the stream fails and any request waiting on it gets an error.
pub(crate) const SSE_RECONNECT_ATTEMPTS: usize = 5;

type Error = StreamableHttpError<HttpError>;
type Events = BoxStream<'static, Result<Sse, SseError>>;

/// A failure of the HTTP client itself; protocol failures (session expired, authorization
/// required, unexpected status) are [`StreamableHttpError`]'s own variants. No variant holds a
/// URL or a header value.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    /// A configured header is one the transport sets itself.
    #[error("header {name} is set by the MCP transport and cannot be configured")]
    ReservedHeader { name: HeaderName },
    /// reqwest could not build the client (its TLS backend failed to start).
    #[error("could not build the HTTP client")]
    Build(#[source] reqwest::Error),
    /// The JSON-RPC message could not be encoded.
    #[error("could not encode the JSON-RPC message")]
    Encode(#[source] serde_json::Error),
    /// The request was not answered: connection refused, connect timeout, TLS, redirect loop.
    #[error("HTTP request to the MCP server failed")]
    Send(#[source] reqwest::Error),
    /// The response body broke off.
    #[error("reading the MCP server's response failed")]
    Body(#[source] reqwest::Error),
    /// One SSE event grew past the transport's limit; its stream ends there.
    #[error("an SSE event exceeded the maximum size of {max_size} bytes")]
    EventTooLarge { max_size: usize },
    /// Resuming after `event_id` would download the oversized event that follows it again.
    #[error("not resuming the SSE stream after event {event_id:?}: the next event is too large")]
    OversizedEventAhead { event_id: String },
}

/// The GET requests for the stream a server sends its own messages on (a tool-list change,
/// say): how many were answered, and how many of those opened a stream; and whether the
/// server is stateless (its last `initialize` answer gave the client no id to send back), so
/// that no such GET is made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ServerStreams {
    pub(crate) answered: u64,
    pub(crate) opened: u64,
    pub(crate) stateless: bool,
}

/// A reqwest client speaking MCP's streamable HTTP for [`transport`]: the configured headers go
/// with every request, and the transport's response limits are enforced while reading.
#[derive(Clone, Debug)]
pub(crate) struct HttpClient {
    inner: reqwest::Client,
    /// Event ids followed by an oversized event. rmcp resumes a broken stream from its last id,
    /// which would fetch that event again and again, so those resumes are refused.
    oversized_after: Arc<Mutex<HashSet<String>>>,
    /// Counts the GET streams, for those who must know one is open: a server drops what it
    /// sends on its own while no such stream is open.
    server_streams: Arc<watch::Sender<ServerStreams>>,
}

impl HttpClient {
    /// A client sending `headers` with every request (marked sensitive: their values never show
    /// in `Debug` output) and giving up connecting after `connect_timeout`. Fails with
    /// [`HttpError::ReservedHeader`] on `Accept`, `Content-Type`, `Mcp-Session-Id`,
    /// `MCP-Protocol-Version` or `Last-Event-ID`, which the transport sets itself.
    pub(crate) fn new(
        mut headers: HeaderMap,
        connect_timeout: Duration,
    ) -> Result<Self, HttpError> {
        let reserved = [
            "accept",
            "content-type",
            HEADER_SESSION_ID,
            HEADER_MCP_PROTOCOL_VERSION,
            HEADER_LAST_EVENT_ID,
        ];
        let is_reserved = |name: &&HeaderName| {
            reserved
                .iter()
                .any(|r| name.as_str().eq_ignore_ascii_case(r))
        };
        if let Some(name) = headers.keys().find(is_reserved) {
            return Err(HttpError::ReservedHeader { name: name.clone() });
        }
        headers
            .values_mut()
            .for_each(|value| value.set_sensitive(true));
        let inner = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(connect_timeout)
            .redirect(redirect_policy())
            .build()
            .map_err(|e| HttpError::Build(e.without_url()))?;
        Ok(Self {
            inner,
            oversized_after: Arc::default(),
            server_streams: Arc::new(watch::Sender::new(ServerStreams::default())),
        })
    }

    /// The count of GET streams answered and opened, as it changes. The sender goes when the
    /// last clone of this client does, which ends the receiver's `changed()`.
    pub(crate) fn server_streams(&self) -> watch::Receiver<ServerStreams> {
        self.server_streams.subscribe()
    }

    /// A request carrying the session, bearer token and per-request headers rmcp passes (the
    /// negotiated `MCP-Protocol-Version` among them).
    fn request(
        &self,
        method: Method,
        uri: &str,
        session_id: Option<&str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<RequestBuilder, Error> {
        let mut request = self.inner.request(method, uri);
        if let Some(session_id) = session_id {
            request = request.header(HEADER_SESSION_ID, session_id);
        }
        if let Some(token) = auth_header {
            request = request.bearer_auth(token);
        }
        for (name, value) in custom_headers {
            if ["accept", HEADER_SESSION_ID, HEADER_LAST_EVENT_ID]
                .iter()
                .any(|r| name.as_str().eq_ignore_ascii_case(r))
            {
                return Err(StreamableHttpError::ReservedHeaderConflict(
                    name.to_string(),
                ));
            }
            request = request.header(name, value);
        }
        Ok(request)
    }

    /// The SSE events of `response`, none over `max_event_size` bytes; `resumed_from` is the
    /// `Last-Event-ID` the stream was opened with.
    fn events(
        &self,
        response: Response,
        resumed_from: Option<String>,
        max_event_size: usize,
    ) -> Events {
        // An oversized event fails the stream after the complete events before it; the
        // stream ends after its first error.
        let bytes = response.bytes_stream().scan(
            Some(EventLimit::new(max_event_size)),
            move |limit, chunk| {
                let Some(counter) = limit.as_mut() else {
                    return future::ready(None);
                };
                let items = match chunk {
                    Err(e) => [None, Some(Err(HttpError::Body(e.without_url())))],
                    Ok(chunk) => match counter.check(&chunk) {
                        Ok(()) => [Some(Ok(chunk)), None],
                        Err(start) => [
                            (start > 0).then(|| Ok(chunk.slice(..start))),
                            Some(Err(HttpError::EventTooLarge {
                                max_size: max_event_size,
                            })),
                        ],
                    },
                };
                if items[1].is_some() {
                    *limit = None;
                }
                future::ready(Some(stream::iter(items.into_iter().flatten())))
            },
        );
        let oversized_after = Arc::clone(&self.oversized_after);
        let mut last_id = resumed_from;
        SseStream::from_bytes_stream(bytes.flatten())
            .inspect(move |event| match event {
                Ok(event) => {
                    if let Some(id) = &event.id {
                        last_id = Some(id.clone());
                    }
                }
                Err(SseError::Body(e))
                    if matches!(e.downcast_ref(), Some(HttpError::EventTooLarge { .. })) =>
                {
                    if let Some(id) = last_id.take() {
                        oversized_after
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .insert(id);
                    }
                }
                Err(_) => {}
            })
            .boxed()
    }
}

impl StreamableHttpClient for HttpClient {
    type Error = HttpError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let limits = StreamableHttpResponseLimits::default();
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let body = serde_json::to_vec(&message)
            .map_err(|e| StreamableHttpError::Client(HttpError::Encode(e)))?;
        let request = self
            .request(
                Method::POST,
                &uri,
                session_id.as_deref(),
                auth_header,
                custom_headers,
            )?
            .header(
                header::ACCEPT,
                format!("{JSON_MIME_TYPE}, {EVENT_STREAM_MIME_TYPE}"),
            )
            .header(header::CONTENT_TYPE, JSON_MIME_TYPE)
            .body(body);
        let response = send(request).await?;
        let status = response.status();
        if let Some(error) = auth_error(&response) {
            return Err(error);
        }
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && session_id.is_some() {
            return Err(StreamableHttpError::SessionExpired);
        }
        let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
        let is = |expected| {
            content_type
                .as_ref()
                .is_some_and(|ct| media_type_is(ct, expected))
        };
        if !status.is_success() {
            return post_failure(response, is(JSON_MIME_TYPE), limits).await;
        }
        let new_session = response.headers().get(HEADER_SESSION_ID);
        let new_session = new_session.and_then(|v| v.to_str().ok()).map(str::to_owned);
        if is_initialize(&message) {
            // The transport opens the server's own stream only when the answer named an id.
            let stateless = new_session.is_none();
            self.server_streams
                .send_if_modified(|s| std::mem::replace(&mut s.stateless, stateless) != stateless);
        }
        if is(EVENT_STREAM_MIME_TYPE) {
            let events = self.events(response, None, limits.max_sse_event_size);
            return Ok(StreamableHttpPostResponse::Sse(events, new_session));
        }
        // A notification or reply awaits nothing: any 2xx answer is as good as 202 Accepted.
        let awaits_reply = matches!(message, ClientJsonRpcMessage::Request(_));
        if is(JSON_MIME_TYPE) {
            let body = read_body(response, limits.max_json_response_size, false).await?;
            return match serde_json::from_slice(&body) {
                Ok(reply) => Ok(StreamableHttpPostResponse::Json(reply, new_session)),
                Err(_) if !awaits_reply => Ok(StreamableHttpPostResponse::Accepted),
                Err(e) => Err(StreamableHttpError::UnexpectedServerResponse(
                    format!("the JSON body is not a JSON-RPC message: {e}").into(),
                )),
            };
        }
        match content_type {
            _ if !awaits_reply => Ok(StreamableHttpPostResponse::Accepted),
            ct => {
                Err(StreamableHttpError::UnexpectedContentType(ct.map(|ct| {
                    String::from_utf8_lossy(ct.as_bytes()).into_owned()
                })))
            }
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error> {
        let request = self.request(
            Method::DELETE,
            &uri,
            Some(&session_id),
            auth_header,
            custom_headers,
        )?;
        let status = send(request).await?.status();
        match status {
            StatusCode::METHOD_NOT_ALLOWED => {
                Err(StreamableHttpError::ServerDoesNotSupportDeleteSession)
            }
            // 404: the server has already forgotten the session.
            _ if status.is_success() || status == StatusCode::NOT_FOUND => Ok(()),
            _ => Err(unexpected_status(status, b"")),
        }
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Events, Error> {
        let max = StreamableHttpResponseLimits::default().max_sse_event_size;
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            max,
        )
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<Events, Error> {
        // The GET's outcome is counted, whichever way it ends.
        let opened = async {
            if let Some(id) = &last_event_id
                && self
                    .oversized_after
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .contains(id)
            {
                let event_id = id.clone();
                return Err(StreamableHttpError::Client(
                    HttpError::OversizedEventAhead { event_id },
                ));
            }
            let mut request = self
                .request(
                    Method::GET,
                    &uri,
                    session_id.as_deref(),
                    auth_header,
                    custom_headers,
                )?
                .header(header::ACCEPT, EVENT_STREAM_MIME_TYPE);
            if let Some(id) = &last_event_id {
                request = request.header(HEADER_LAST_EVENT_ID, id.as_str());
            }
            let response = send(request).await?;
            let status = response.status();
            if status == StatusCode::METHOD_NOT_ALLOWED {
                return Err(StreamableHttpError::ServerDoesNotSupportSse);
            }
            if let Some(error) = auth_error(&response) {
                return Err(error);
            }
            if status == StatusCode::NOT_FOUND && session_id.is_some() {
                return Err(StreamableHttpError::SessionExpired);
            }
            if !status.is_success() {
                return Err(retryable_status(&response)
                    .map_or_else(|| unexpected_status(status, b""), Error::from));
            }
            let content_type = response.headers().get(header::CONTENT_TYPE);
            if !content_type.is_some_and(|ct| media_type_is(ct, EVENT_STREAM_MIME_TYPE)) {
                let content_type =
                    content_type.map(|ct| String::from_utf8_lossy(ct.as_bytes()).into_owned());
                return Err(StreamableHttpError::UnexpectedContentType(content_type));
            }
            Ok(self.events(response, last_event_id, max_sse_event_size))
        }
        .await;
        self.server_streams.send_modify(|streams| {
            streams.answered += 1;
            streams.opened += u64::from(opened.is_ok());
        });
        opened
    }
}

/// rmcp's streamable HTTP transport to the MCP endpoint `url` over `client`. rmcp's defaults
/// hold (16 MiB per SSE event and per JSON body, a new session after a 404, sixteen POSTs at
/// once) except that a broken SSE stream is reconnected at most [`SSE_RECONNECT_ATTEMPTS`]
/// times, so a request whose response stream is lost fails instead of waiting forever.
/// Spawns the transport's worker, so it must be called inside a Tokio runtime.
pub(crate) fn transport(
    url: &str,
    client: HttpClient,
) -> StreamableHttpClientTransport<HttpClient> {
    let mut retry = ExponentialBackoff::default();
    retry.max_times = Some(SSE_RECONNECT_ATTEMPTS);
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    config.retry_config = Arc::new(retry);
    StreamableHttpClientTransport::with_client(client, config)
}

/// Whether `message` is an `initialize` request.
fn is_initialize(message: &ClientJsonRpcMessage) -> bool {
    matches!(
        message,
        ClientJsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::InitializeRequest(_))
    )
}

/// Sends `request`; the error leaves the URL out (its query may hold a key).
async fn send(request: RequestBuilder) -> Result<Response, Error> {
    let response = request.send().await;
    response.map_err(|e| StreamableHttpError::Client(HttpError::Send(e.without_url())))
}

/// A POST answered with an error status: a JSON-RPC error in the body answers the request;
/// otherwise the status (with the start of a body that is no JSON-RPC error) is the error.
async fn post_failure(
    response: Response,
    is_json: bool,
    limits: StreamableHttpResponseLimits,
) -> Result<StreamableHttpPostResponse, Error> {
    let status = response.status();
    let retryable = retryable_status(&response);
    let auth = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
    if !is_json || auth || status == StatusCode::TOO_MANY_REQUESTS {
        if let Some(error) = retryable {
            return Err(error.into());
        }
        let body = read_body(response, limits.max_error_response_size, true).await;
        return Err(unexpected_status(status, &body.unwrap_or_default()));
    }
    let body = match read_body(response, limits.max_json_response_size, false).await {
        Ok(body) => body,
        Err(error) => return Err(retryable.map_or(error, Error::from)),
    };
    if let Ok(error @ ServerJsonRpcMessage::Error(_)) = serde_json::from_slice(&body) {
        return Ok(StreamableHttpPostResponse::Json(error, None));
    }
    let shown = &body[..body.len().min(limits.max_error_response_size)];
    Err(retryable.map_or_else(|| unexpected_status(status, shown), Error::from))
}

/// The body of `response`, at most `max` bytes: beyond that, the start when `truncate`, else
/// [`StreamableHttpError::ResponseBodyTooLarge`].
async fn read_body(mut response: Response, max: usize, truncate: bool) -> Result<Vec<u8>, Error> {
    if !truncate
        && response
            .content_length()
            .is_some_and(|length| length > max as u64)
    {
        return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| StreamableHttpError::Client(HttpError::Body(e.without_url())))?
    {
        let room = max - body.len();
        if chunk.len() > room {
            if !truncate {
                return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
            }
            body.extend_from_slice(&chunk[..room]);
            break;
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A 401 or 403 carrying a `WWW-Authenticate` challenge, as rmcp's authorization errors.
fn auth_error(response: &Response) -> Option<Error> {
    let challenge = response
        .headers()
        .get(header::WWW_AUTHENTICATE)?
        .to_str()
        .ok()?
        .to_owned();
    match response.status() {
        StatusCode::UNAUTHORIZED => Some(StreamableHttpError::AuthRequired(
            AuthRequiredError::new(challenge),
        )),
        StatusCode::FORBIDDEN => {
            let scope = challenge_scope(&challenge);
            Some(StreamableHttpError::InsufficientScope(
                InsufficientScopeError::new(challenge, scope),
            ))
        }
        _ => None,
    }
}

/// The `scope` parameter of a `WWW-Authenticate` challenge, quoted or not.
fn challenge_scope(challenge: &str) -> Option<String> {
    let lower = challenge.to_ascii_lowercase();
    let (at, _) = lower
        .match_indices("scope=")
        .find(|(at, _)| lower[..*at].ends_with([' ', '\t', ',']))?;
    let rest = &challenge[at + "scope=".len()..];
    let value = match rest.strip_prefix('"') {
        Some(quoted) => &quoted[..quoted.find('"')?],
        None => rest.split([',', ';', ' ', '\t']).next()?,
    };
    (!value.is_empty()).then(|| value.to_owned())
}

/// A 429 or 5xx status with its `Retry-After`, which the caller may retry after.
fn retryable_status(response: &Response) -> Option<HttpStatusError> {
    let status = response.status();
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let retry_after = response.headers().get(header::RETRY_AFTER);
    let retry_after = retry_after.and_then(|v| v.to_str().ok()).map(str::to_owned);
    Some(HttpStatusError::new(status.as_u16(), retry_after))
}

/// An unexpected status, with the start of its body when there is one.
fn unexpected_status(status: StatusCode, body: &[u8]) -> Error {
    let message = match body {
        [] => format!("HTTP {status}"),
        body => format!("HTTP {status}: {}", String::from_utf8_lossy(body)),
    };
    StreamableHttpError::UnexpectedServerResponse(message.into())
}

/// Whether a `Content-Type` names `expected`, whatever its case and parameters.
fn media_type_is(content_type: &HeaderValue, expected: &str) -> bool {
    let essence = content_type
        .as_bytes()
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default();
    essence
        .trim_ascii()
        .eq_ignore_ascii_case(expected.as_bytes())
}

/// Follows only same-origin 307 and 308 redirects, which keep the method and body (a server
/// moving `/mcp` to `/mcp/`). Any other redirect would drop the POST body or hand the session
/// and configured headers to another host, so it comes back as an unexpected status.
fn redirect_policy() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT
        );
        let origin = attempt.url().origin();
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == origin);
        if keeps_body && same_origin && attempt.previous().len() <= MAX_REDIRECTS {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// The size of the SSE event being received, across chunks: each field line's bytes plus one
/// for its line break (CRLF counts one). Comment lines count only while they are being received;
/// the blank line that ends an event starts the count again.
#[derive(Debug)]
struct EventLimit {
    max: usize,
    size: usize,
    /// Bytes of the current line so far.
    line: usize,
    /// The current line is a comment (starts with `:`).
    comment: bool,
    /// The previous byte was a CR, so a LF now completes that line break.
    after_cr: bool,
}

impl EventLimit {
    fn new(max: usize) -> Self {
        Self {
            max,
            size: 0,
            line: 0,
            comment: false,
            after_cr: false,
        }
    }

    /// Counts `chunk`. Once the current event is over the limit, fails with the offset in
    /// `chunk` where that event starts (0 when it started in an earlier chunk).
    fn check(&mut self, chunk: &[u8]) -> Result<(), usize> {
        let mut start = 0;
        for (at, &byte) in chunk.iter().enumerate() {
            if byte == b'\n' && self.after_cr {
                self.after_cr = false;
                continue;
            }
            self.after_cr = byte == b'\r';
            if !matches!(byte, b'\r' | b'\n') {
                self.comment = if self.line == 0 {
                    byte == b':'
                } else {
                    self.comment
                };
                self.line += 1;
                self.size += 1;
            } else if self.line == 0 {
                self.size = 0;
                start = at + 1;
            } else {
                self.size = if self.comment {
                    self.size - self.line
                } else {
                    self.size + 1
                };
                self.line = 0;
            }
            if self.size > self.max {
                return Err(start);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
