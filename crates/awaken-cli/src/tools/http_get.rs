//! `http_get`: an HTTP(S) GET to the hosts the agent file allows, through the outbound guard:
//! every URL, redirects included, must name an allowed host and reach only public addresses or
//! the ranges the agent file allows.

use std::fmt::Write as _;
use std::time::Duration;

use async_trait::async_trait;
use awaken::event::{EffectClass, ToolDescriptor};
use awaken::tool::{ToolCallContext, ToolError, ToolOutput, Violation};
use awaken_net::{
    HostAllowList, IpRange, OutboundClient, OutboundConfig, OutboundError, OutboundGuard, header,
};
use serde_json::{Value, json};

use super::confine::failed;

/// Most bytes of a body returned unless the agent file says otherwise.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 64 * 1024;

/// Redirects followed at most.
const MAX_REDIRECTS: usize = 5;

/// `http_get {"url": string}`: fetches `url` (http or https) when its host is allowed and its
/// addresses pass the guard, and returns the status, the content type and at most `max_bytes`
/// of the body as text.
pub(crate) struct HttpGet {
    allow: HostAllowList,
    max_bytes: u64,
    client: OutboundClient,
}

impl HttpGet {
    /// A tool that may reach `allow_hosts`, at public addresses or in `allow_ranges`, and
    /// returns at most `max_bytes` of each body.
    pub(crate) fn new(
        allow_hosts: Vec<String>,
        allow_ranges: Vec<IpRange>,
        max_bytes: u64,
    ) -> anyhow::Result<Self> {
        let allow = HostAllowList::new(allow_hosts)
            .map_err(|e| anyhow::anyhow!("tools.http_get.allow_hosts: {e}"))?;
        let config = OutboundConfig::new()
            .with_allowed_hosts(allow.clone())
            .with_allowed_ranges(allow_ranges)
            .with_max_redirects(MAX_REDIRECTS)
            .with_max_body_bytes(max_bytes)
            .with_connect_timeout(Duration::from_secs(10))
            .with_total_timeout(Duration::from_secs(60))
            .with_user_agent(concat!("awaken/", env!("CARGO_PKG_VERSION")));
        let client = OutboundClient::new(OutboundGuard::new(config))
            .map_err(|e| anyhow::anyhow!("the http_get tool's HTTP client: {e}"))?;
        Ok(Self {
            allow,
            max_bytes,
            client,
        })
    }

    async fn fetch(&self, url: &str) -> Result<Value, OutboundError> {
        let response = self.client.get(url).await?;
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let answered = response.url().to_string();
        let limit = usize::try_from(self.max_bytes).unwrap_or(usize::MAX);
        let body = response.prefix(limit).await?;
        Ok(json!({
            "url": answered,
            "status": status,
            "content_type": content_type,
            "body": String::from_utf8_lossy(&body.bytes),
            "truncated": body.truncated,
        }))
    }
}

#[async_trait]
impl awaken::tool::Tool for HttpGet {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(
            "http_get",
            format!(
                "Fetch a URL with HTTP GET and return its status and text body. Allowed hosts: {}.",
                self.allow.entries().join(", ")
            ),
        )
        .with_parameters(json!({
            "type": "object",
            "properties": {"url": {"type": "string", "minLength": 1}},
            "required": ["url"],
            "additionalProperties": false
        }))
        .with_effect(EffectClass::ReadOnly)
    }

    /// The URL as the guard parses it (scheme and host in lower case, the default port
    /// dropped, `.` and `..` segments resolved), with percent-encoded letters, digits and
    /// `-._~` decoded and other escapes in upper case, without a fragment (never sent) and
    /// without the trailing dot of a fully qualified host name: the one spelling the rules
    /// and approvals see. A URL the guard refuses without a lookup is refused here, before any
    /// gate, and so is one with a user name or password (another spelling of the same
    /// resource, which would also send them).
    fn normalize_arguments(&self, args: &Value) -> Result<Option<Value>, ToolError> {
        let Some(requested) = args.get("url").and_then(Value::as_str) else {
            return Ok(None);
        };
        let violation = |message: String| ToolError::InvalidArguments {
            tool_id: "http_get".to_owned(),
            violations: vec![Violation {
                path: "/url".to_owned(),
                message,
            }],
        };
        let refused = |e: OutboundError| violation(e.to_string());
        let guard = self.client.guard();
        let mut parsed = guard.parse_url(requested).map_err(refused)?;
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(violation(format!(
                "`{requested}` carries a user name or password; a URL with credentials is not fetched"
            )));
        }
        parsed.set_fragment(None);
        // `example.com.` is `example.com` (an IPv4 address with a dot is refused by the guard).
        if let Some(host) = parsed.host_str().filter(|h| h.ends_with('.')) {
            let name = host.trim_end_matches('.').to_owned();
            parsed
                .set_host(Some(&name))
                .map_err(|e| violation(format!("`{requested}` has no host name: {e}")))?;
        }
        // Decoding may reveal `.` segments (`%2e`): parse again.
        let canonical = guard
            .parse_url(&uniform_escapes(parsed.as_str()))
            .map_err(refused)?;
        if canonical.as_str() == requested {
            return Ok(None);
        }
        let mut args = args.clone();
        args["url"] = Value::String(canonical.into());
        Ok(Some(args))
    }

    async fn execute(&self, args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        let requested = args["url"].as_str().unwrap_or_default();
        tokio::select! {
            result = self.fetch(requested) => result
                .map(ToolOutput::success)
                .map_err(|e| failed(e.to_string())),
            () = ctx.cancel_token().cancelled() => Err(ToolError::Cancelled { tool_id: "http_get".into() }),
        }
    }
}

/// `url` with every `%XX` escape of an unreserved character (a letter, a digit, `-._~`)
/// decoded and every other escape's hex digits in upper case (RFC 3986, 6.2.2): the escapes
/// that spell the same URL differently.
pub(super) fn uniform_escapes(url: &str) -> String {
    let bytes = url.as_bytes();
    let mut out = String::with_capacity(url.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| url.get(i + 1..i + 3))
            .flatten()
            .filter(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(b) if b.is_ascii_alphanumeric() || b"-._~".contains(&b) => {
                out.push(char::from(b));
                i += 3;
            }
            Some(b) => {
                let _ = write!(out, "%{b:02X}");
                i += 3;
            }
            None => {
                let c = url[i..].chars().next().unwrap_or_default();
                out.push(c);
                i += c.len_utf8().max(1);
            }
        }
    }
    out
}
