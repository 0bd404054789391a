//! `http_get`: an HTTP(S) GET to the hosts the agent file allows, through the outbound guard:
//! every URL, redirects included, must name an allowed host and reach only public addresses or
//! the ranges the agent file allows.

use std::time::Duration;

use async_trait::async_trait;
use awaken::event::{EffectClass, ToolDescriptor};
use awaken::tool::{ToolCallContext, ToolError, ToolOutput};
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
