//! `http_get`: an HTTP(S) GET to the hosts the agent file allows, redirects included.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use awaken::event::{EffectClass, ToolDescriptor};
use awaken::tool::{ToolCallContext, ToolError, ToolOutput};
use reqwest::Url;
use serde_json::{Value, json};

use super::confine::failed;

/// Most bytes of a body returned unless the agent file says otherwise.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 64 * 1024;

/// Redirects followed at most.
const MAX_REDIRECTS: usize = 5;

/// `http_get {"url": string}`: fetches `url` (http or https) when its host is allowed and
/// returns the status, the content type and at most `max_bytes` of the body as text.
pub(crate) struct HttpGet {
    allow: Arc<[String]>,
    max_bytes: u64,
    client: reqwest::Client,
}

/// Whether `host` (as a URL gives it; IPv6 in brackets) matches an entry of `allow`: equal
/// ignoring case, or a subdomain of `suffix` for an entry `*.suffix`.
pub(crate) fn host_allowed(allow: &[String], host: &str) -> bool {
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase();
    allow.iter().any(|entry| {
        let entry = entry.to_ascii_lowercase();
        match entry.strip_prefix("*.") {
            Some(suffix) => host
                .strip_suffix(suffix)
                .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
            None => entry == host,
        }
    })
}

/// Why `url` may not be fetched, if it may not.
fn refusal(allow: &[String], url: &Url) -> Option<String> {
    if !matches!(url.scheme(), "http" | "https") {
        return Some(format!(
            "`{url}` is not an http or https URL (scheme `{}`)",
            url.scheme()
        ));
    }
    let Some(host) = url.host_str() else {
        return Some(format!("`{url}` has no host"));
    };
    (!host_allowed(allow, host)).then(|| {
        format!(
            "host `{host}` is not allowed for http_get (allowed: {})",
            allow.join(", ")
        )
    })
}

impl HttpGet {
    /// A tool that may reach `allow` and returns at most `max_bytes` of each body.
    pub(crate) fn new(allow: Vec<String>, max_bytes: u64) -> anyhow::Result<Self> {
        let allow: Arc<[String]> = allow.into();
        let for_redirects = Arc::clone(&allow);
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            match refusal(&for_redirects, attempt.url()) {
                Some(reason) => attempt.error(format!("redirected: {reason}")),
                None => attempt.follow(),
            }
        });
        let client = reqwest::Client::builder()
            .redirect(policy)
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .user_agent(concat!("awaken/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| anyhow::anyhow!("the http_get tool's HTTP client: {e}"))?;
        Ok(Self {
            allow,
            max_bytes,
            client,
        })
    }

    async fn fetch(&self, url: Url) -> Result<Value, ToolError> {
        let shown = url.to_string();
        let mut response = self.client.get(url).send().await.map_err(|e| {
            failed(format!(
                "GET {shown} failed: {}",
                std::error::Error::source(&e)
                    .map_or_else(|| e.to_string(), |s| format!("{e}: {s}"))
            ))
        })?;
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let limit = usize::try_from(self.max_bytes).unwrap_or(usize::MAX);
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| failed(format!("reading the body of {shown} failed: {e}")))?
        {
            let room = limit - body.len();
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        Ok(json!({
            "url": shown,
            "status": status,
            "content_type": content_type,
            "body": String::from_utf8_lossy(&body),
            "truncated": truncated,
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
                self.allow.join(", ")
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
        let url = Url::parse(requested)
            .map_err(|e| failed(format!("`{requested}` is not a URL: {e}")))?;
        if let Some(reason) = refusal(&self.allow, &url) {
            return Err(failed(reason));
        }
        tokio::select! {
            result = self.fetch(url) => result.map(ToolOutput::success),
            () = ctx.cancel_token().cancelled() => Err(ToolError::Cancelled { tool_id: "http_get".into() }),
        }
    }
}
