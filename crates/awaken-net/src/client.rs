//! [`OutboundClient`]: HTTP through the guard. Names are resolved by the guard inside the
//! connection (one lookup, every address checked, the connection made to those addresses),
//! redirects are followed here, one checked hop at a time, and bodies are read up to a cap
//! within one deadline.

use std::error::Error as _;
use std::net::SocketAddr;
use std::sync::Arc;

use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use tokio::time::{Instant, timeout_at};
use url::Url;

use crate::error::OutboundError;
use crate::guard::OutboundGuard;

/// An HTTP client whose every connection and redirect passes an [`OutboundGuard`]; cheap to
/// clone (connections are pooled per client).
#[derive(Debug, Clone)]
pub struct OutboundClient {
    guard: OutboundGuard,
    http: reqwest::Client,
}

/// A request for [`OutboundClient::send`].
#[derive(Debug, Clone)]
pub struct OutboundRequest {
    method: Method,
    url: String,
    headers: HeaderMap,
    body: Option<Vec<u8>>,
}

impl OutboundRequest {
    /// A request with `method` to `url` (checked when sent), without headers or body.
    pub fn new(method: Method, url: impl Into<String>) -> Self {
        Self {
            method,
            url: url.into(),
            headers: HeaderMap::new(),
            body: None,
        }
    }

    /// A GET of `url`.
    pub fn get(url: impl Into<String>) -> Self {
        Self::new(Method::GET, url)
    }

    /// The request with the header `name: value` added. `Authorization`, `Cookie` and
    /// `Proxy-Authorization` are dropped when a redirect leaves the URL's origin.
    #[must_use]
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.append(name, value);
        self
    }

    /// The request with `body`, sent again on a 307 or 308 redirect.
    #[must_use]
    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Some(body.into());
        self
    }
}

/// A response whose body is read within the request's deadline and up to the configured cap.
#[derive(Debug)]
pub struct OutboundResponse {
    url: Url,
    inner: reqwest::Response,
    deadline: Instant,
    after: std::time::Duration,
    limit: u64,
    read: u64,
}

/// The start of a body, at most the asked length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyPrefix {
    /// The bytes read.
    pub bytes: Vec<u8>,
    /// Whether the body went on past them (reading stopped there).
    pub truncated: bool,
}

impl OutboundClient {
    /// A client over `guard`, with its connect timeout and user agent. The client never uses
    /// a proxy: a proxy would resolve names itself, out of the guard's sight.
    pub fn new(guard: OutboundGuard) -> Result<Self, OutboundError> {
        let config = guard.config();
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            .connect_timeout(config.connect_timeout())
            .dns_resolver(Arc::new(GuardedResolver {
                guard: guard.clone(),
            }));
        if let Some(agent) = config.user_agent() {
            builder = builder.user_agent(agent);
        }
        let http = builder
            .build()
            .map_err(|source| OutboundError::Client { source })?;
        Ok(Self { guard, http })
    }

    /// The guard.
    pub fn guard(&self) -> &OutboundGuard {
        &self.guard
    }

    /// GETs `url`.
    pub async fn get(&self, url: &str) -> Result<OutboundResponse, OutboundError> {
        self.send(OutboundRequest::get(url)).await
    }

    /// Sends `request`, following redirects (each target checked like the first URL) up to
    /// the configured number, and returns the first response that is not a redirect (or a
    /// redirect without `Location`). The total timeout counts from here to the body's end.
    pub async fn send(&self, request: OutboundRequest) -> Result<OutboundResponse, OutboundError> {
        let config = self.guard.config();
        let after = config.total_timeout();
        let deadline = Instant::now() + after;
        let OutboundRequest {
            mut method,
            url,
            mut headers,
            mut body,
        } = request;
        let mut url = self.guard.parse_url(&url)?;
        let mut from: Option<Url> = None;
        let mut redirects = 0;
        loop {
            let mut builder = self
                .http
                .request(method.clone(), url.clone())
                .headers(headers.clone());
            if let Some(bytes) = &body {
                builder = builder.body(bytes.clone());
            }
            let response = match timeout_at(deadline, builder.send()).await {
                Err(_) => Err(OutboundError::Timeout {
                    url: url.to_string(),
                    after,
                }),
                Ok(Err(e)) => Err(sent_error(&url, e)),
                Ok(Ok(response)) => Ok(response),
            }
            .map_err(|e| redirected(from.as_ref(), e))?;
            let status = response.status();
            let location = response.headers().get(header::LOCATION);
            let (true, Some(location)) = (is_followed(status), location) else {
                return Ok(OutboundResponse {
                    url,
                    inner: response,
                    deadline,
                    after,
                    limit: config.max_body_bytes(),
                    read: 0,
                });
            };
            if redirects == config.max_redirects() {
                return Err(OutboundError::TooManyRedirects {
                    url: url.to_string(),
                    limit: config.max_redirects(),
                });
            }
            let location = String::from_utf8_lossy(location.as_bytes()).into_owned();
            let next = url
                .join(&location)
                .map_err(|source| OutboundError::InvalidRedirect {
                    url: url.to_string(),
                    location: location.clone(),
                    source,
                })?;
            self.guard
                .check_url(&location, &next)
                .map_err(|e| redirected(Some(&url), e))?;
            tracing::debug!(from = %url, to = %next, status = status.as_u16(), "outbound redirect");
            if redirect_drops_body(status, &method) {
                method = if method == Method::HEAD {
                    Method::HEAD
                } else {
                    Method::GET
                };
                body = None;
                for name in [
                    header::CONTENT_TYPE,
                    header::CONTENT_LENGTH,
                    header::CONTENT_ENCODING,
                ] {
                    headers.remove(name);
                }
            }
            if next.origin() != url.origin() {
                for name in [
                    header::AUTHORIZATION,
                    header::COOKIE,
                    header::PROXY_AUTHORIZATION,
                ] {
                    headers.remove(name);
                }
            }
            redirects += 1;
            from = Some(std::mem::replace(&mut url, next));
        }
    }
}

impl OutboundResponse {
    /// The URL that answered (the last redirect's target).
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.inner.status()
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        self.inner.headers()
    }

    /// The next piece of the body, `None` at its end. Fails with `BodyTooLarge` once the body
    /// passes the configured cap and with `Timeout` at the request's deadline.
    pub async fn chunk(&mut self) -> Result<Option<Vec<u8>>, OutboundError> {
        let piece = match timeout_at(self.deadline, self.inner.chunk()).await {
            Err(_) => {
                return Err(OutboundError::Timeout {
                    url: self.url.to_string(),
                    after: self.after,
                });
            }
            Ok(Err(source)) => {
                return Err(OutboundError::Request {
                    url: self.url.to_string(),
                    source,
                });
            }
            Ok(Ok(None)) => return Ok(None),
            Ok(Ok(Some(piece))) => piece,
        };
        self.read = self.read.saturating_add(piece.len() as u64);
        if self.read > self.limit {
            return Err(self.too_large());
        }
        Ok(Some(piece.to_vec()))
    }

    /// The whole body; `BodyTooLarge` (without reading) when its declared length passes the
    /// cap, or as soon as what arrives does.
    pub async fn bytes(mut self) -> Result<Vec<u8>, OutboundError> {
        if self.inner.content_length().is_some_and(|n| n > self.limit) {
            return Err(self.too_large());
        }
        let mut body = Vec::new();
        while let Some(piece) = self.chunk().await? {
            body.extend_from_slice(&piece);
        }
        Ok(body)
    }

    /// At most `max` bytes of the body, and never more than the cap; reading stops once more
    /// arrived, and the prefix says it was cut.
    pub async fn prefix(mut self, max: usize) -> Result<BodyPrefix, OutboundError> {
        let max = max.min(usize::try_from(self.limit).unwrap_or(usize::MAX));
        // The prefix cuts at `max` itself, so the cap never fails a read here.
        self.limit = u64::MAX;
        let mut bytes = Vec::new();
        while let Some(piece) = self.chunk().await? {
            let room = max - bytes.len();
            if piece.len() > room {
                bytes.extend_from_slice(&piece[..room]);
                return Ok(BodyPrefix {
                    bytes,
                    truncated: true,
                });
            }
            bytes.extend_from_slice(&piece);
        }
        Ok(BodyPrefix {
            bytes,
            truncated: false,
        })
    }

    fn too_large(&self) -> OutboundError {
        OutboundError::BodyTooLarge {
            url: self.url.to_string(),
            limit: self.limit,
        }
    }
}

/// The connection's resolver: the guard resolves and checks, and the connection is made to
/// exactly the addresses it returns.
struct GuardedResolver {
    guard: OutboundGuard,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = self.guard.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addresses = guard.resolve_checked(&host).await?;
            let addrs: reqwest::dns::Addrs = Box::new(
                addresses
                    .into_iter()
                    .map(|address| SocketAddr::new(address, 0)),
            );
            Ok(addrs)
        })
    }
}

/// The error of a send: the guard's refusal when the connection's resolver raised one (found
/// in the HTTP client's chain of sources), else the client's error.
fn sent_error(url: &Url, error: reqwest::Error) -> OutboundError {
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(ours) = cause
            .downcast_ref::<OutboundError>()
            .and_then(OutboundError::copy_of_resolution)
        {
            return ours;
        }
        source = cause.source();
    }
    OutboundError::Request {
        url: url.to_string(),
        source: error,
    }
}

/// `error` wrapped as a redirect's when `from` redirected to the URL that failed.
fn redirected(from: Option<&Url>, error: OutboundError) -> OutboundError {
    match from {
        Some(from) => OutboundError::Redirect {
            from: from.to_string(),
            error: Box::new(error),
        },
        None => error,
    }
}

/// Whether `status` is a redirect the client follows (as browsers do: not 300 or 304).
fn is_followed(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::SEE_OTHER
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    )
}

/// Whether a redirect with `status` turns the request into a GET without body: 303 always
/// (but HEAD), 301 and 302 for a POST, as browsers do; 307 and 308 keep both.
fn redirect_drops_body(status: StatusCode, method: &Method) -> bool {
    match status {
        StatusCode::SEE_OTHER => true,
        StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND => *method == Method::POST,
        _ => false,
    }
}
