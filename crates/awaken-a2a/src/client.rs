//! The A2A client: [`A2aBackend`] runs an endpoint agent whose protocol is `a2a` on its remote
//! host over the HTTP+JSON binding, as an [`ExecutionBackend`]. A run sends the request's last
//! user message with `message:stream` and translates the task's stream into the neutral events
//! of one activation; [`A2aBackend::discover`] checks each endpoint's agent card before a
//! runtime is built on it.
//!
//! The request is derived from the run, so a request sent again after a crash is the same
//! request: the message id from the run id, the context id from the thread id. An outbound call
//! carries only the bearer token the backend was told to read for that agent, from the
//! environment variable it names.

mod sse;
mod stream;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use awaken_event::{RunId, ThreadId};
use awaken_resolver::ExecutionBackend;
use awaken_spec::{AgentSpec, EndpointSpec};
use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderValue};

use crate::card::AgentCard;
use crate::{AGENT_CARD_PATH, HTTP_JSON_BINDING, PROTOCOL_VERSION, VERSION_HEADER};

/// The backend's id ([`ExecutionBackend::id`]).
pub const A2A_BACKEND_ID: &str = "a2a";

/// The endpoint protocol the backend claims (`endpoint.protocol = "a2a"`, in any case).
pub const A2A_ENDPOINT_PROTOCOL: &str = "a2a";

/// How long connecting to a remote agent may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long fetching a card, or asking for a task's cancellation, may take in all.
const SHORT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The most bytes of a card (or of an error body) read.
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Reads an environment variable (the process environment unless replaced, for tests).
type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Runs endpoint agents whose protocol is `a2a` on their remote A2A host.
///
/// Cheap to clone (the HTTP client and the credential table are shared).
#[derive(Clone)]
pub struct A2aBackend {
    http: reqwest::Client,
    /// Agent id → the environment variable holding its bearer token.
    bearer_token_env: Arc<HashMap<String, String>>,
    env: EnvLookup,
}

impl std::fmt::Debug for A2aBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2aBackend")
            .field("bearer_token_env", &self.bearer_token_env)
            .finish_non_exhaustive()
    }
}

/// The HTTP client could not be made (its TLS set-up failed).
#[derive(Debug, thiserror::Error)]
#[error("the A2A client's HTTP client could not be built")]
pub struct ClientBuildError {
    #[source]
    source: reqwest::Error,
}

/// An endpoint agent whose card passed [`A2aBackend::discover`]'s checks.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveredAgent {
    /// The agent's id.
    pub agent_id: String,
    /// Where its card was read.
    pub card_url: String,
    /// The card.
    pub card: AgentCard,
}

/// Why an endpoint agent's card did not pass [`A2aBackend::discover`]'s checks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoverError {
    /// The card could not be fetched (no connection, or the body could not be read).
    #[error(
        "agent `{agent_id}`: the card at {url} could not be fetched: {}",
        chain(source)
    )]
    Unreachable {
        /// The agent.
        agent_id: String,
        /// The card's URL.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The host answered with an error status.
    #[error("agent `{agent_id}`: the card at {url} answered HTTP {status}")]
    Status {
        /// The agent.
        agent_id: String,
        /// The card's URL.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// The body is no A2A v1.0 agent card.
    #[error("agent `{agent_id}`: the card at {url} is not an A2A agent card: {source}")]
    InvalidCard {
        /// The agent.
        agent_id: String,
        /// The card's URL.
        url: String,
        /// Where the JSON did not fit.
        #[source]
        source: serde_json::Error,
    },
    /// The card offers no HTTP+JSON interface of protocol version 1.0.
    #[error(
        "agent `{agent_id}`: the card at {url} offers no {HTTP_JSON_BINDING} interface of \
         protocol version {PROTOCOL_VERSION} (it offers: {offered})"
    )]
    NoHttpJsonInterface {
        /// The agent.
        agent_id: String,
        /// The card's URL.
        url: String,
        /// The interfaces the card offers, as `binding version`, comma-separated.
        offered: String,
    },
    /// The card does not declare the streaming capability the backend runs on.
    #[error("agent `{agent_id}`: the card at {url} does not declare `capabilities.streaming`")]
    NoStreaming {
        /// The agent.
        agent_id: String,
        /// The card's URL.
        url: String,
    },
    /// The agent's bearer token is configured but its variable is not set.
    #[error(
        "agent `{agent_id}`: its bearer token variable `{variable}` is not set or holds no valid token"
    )]
    MissingCredential {
        /// The agent.
        agent_id: String,
        /// The environment variable.
        variable: String,
    },
}

impl A2aBackend {
    /// A backend that sends no credentials until told which to send
    /// ([`A2aBackend::with_bearer_token_env`]).
    pub fn new() -> Result<Self, ClientBuildError> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            // A redirect would carry the request (and its token) to a host not configured.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|source| ClientBuildError { source })?;
        Ok(Self {
            http,
            bearer_token_env: Arc::default(),
            env: Arc::new(|name| std::env::var(name).ok()),
        })
    }

    /// Sends `Authorization: Bearer <token>` on every call for `agent_id`, the token read from
    /// the environment variable `variable` at each call. A call whose variable is unset fails.
    /// An endpoint's own `bearer_token_env` takes precedence.
    pub fn with_bearer_token_env(
        mut self,
        agent_id: impl Into<String>,
        variable: impl Into<String>,
    ) -> Self {
        Arc::make_mut(&mut self.bearer_token_env).insert(agent_id.into(), variable.into());
        self
    }

    /// Reads environment variables through `lookup` instead of the process environment.
    pub fn with_env_lookup(
        mut self,
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.env = Arc::new(lookup);
        self
    }

    /// The A2A message id a run sends: derived from the run id alone, so a run sent again
    /// (after a crash, with the same run id) carries the same message id.
    pub fn message_id(run_id: &RunId) -> String {
        format!("awaken-{run_id}")
    }

    /// The A2A context id of a thread: the remote side of the thread's conversation.
    pub fn context_id(thread_id: &ThreadId) -> String {
        thread_id.to_string()
    }

    /// Fetches and checks the card of each agent in `agents` whose endpoint this backend
    /// claims (others are skipped): reachable, an HTTP+JSON interface of protocol version 1.0,
    /// the streaming capability. The first agent that fails ends the check with its error.
    pub async fn discover<'a>(
        &self,
        agents: impl IntoIterator<Item = &'a AgentSpec>,
    ) -> Result<Vec<DiscoveredAgent>, DiscoverError> {
        let mut found = Vec::new();
        for agent in agents {
            let Some(endpoint) = agent.endpoint.as_ref().filter(|e| self.claims(e)) else {
                continue;
            };
            found.push(self.discover_one(agent, endpoint).await?);
        }
        Ok(found)
    }

    async fn discover_one(
        &self,
        agent: &AgentSpec,
        endpoint: &EndpointSpec,
    ) -> Result<DiscoveredAgent, DiscoverError> {
        let url = format!("{}{AGENT_CARD_PATH}", base_url(endpoint));
        let request = self
            .http
            .get(&url)
            .timeout(SHORT_CALL_TIMEOUT)
            .header(VERSION_HEADER, PROTOCOL_VERSION)
            .header(ACCEPT, "application/json");
        let request = self.authorize(agent, request).map_err(|variable| {
            DiscoverError::MissingCredential {
                agent_id: agent.id.clone(),
                variable,
            }
        })?;
        let unreachable = |source| DiscoverError::Unreachable {
            agent_id: agent.id.clone(),
            url: url.clone(),
            source,
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        if !status.is_success() {
            return Err(DiscoverError::Status {
                agent_id: agent.id.clone(),
                url,
                status: status.as_u16(),
            });
        }
        let body = read_prefix(response, MAX_BODY_BYTES)
            .await
            .map_err(unreachable)?;
        let card: AgentCard =
            serde_json::from_slice(&body).map_err(|source| DiscoverError::InvalidCard {
                agent_id: agent.id.clone(),
                url: url.clone(),
                source,
            })?;
        let speaks_v1 = card.supported_interfaces.iter().any(|i| {
            i.protocol_binding.eq_ignore_ascii_case(HTTP_JSON_BINDING)
                && is_protocol_v1_0(&i.protocol_version)
        });
        if !speaks_v1 {
            let offered = card
                .supported_interfaces
                .iter()
                .map(|i| format!("{} {}", i.protocol_binding, i.protocol_version))
                .collect::<Vec<_>>();
            return Err(DiscoverError::NoHttpJsonInterface {
                agent_id: agent.id.clone(),
                url,
                offered: if offered.is_empty() {
                    "none".to_owned()
                } else {
                    offered.join(", ")
                },
            });
        }
        if card.capabilities.streaming != Some(true) {
            return Err(DiscoverError::NoStreaming {
                agent_id: agent.id.clone(),
                url,
            });
        }
        Ok(DiscoveredAgent {
            agent_id: agent.id.clone(),
            card_url: url,
            card,
        })
    }

    /// Adds the agent's bearer token to `request`, if one is configured (its endpoint's
    /// `bearer_token_env`, else [`A2aBackend::with_bearer_token_env`]); `Err` names the
    /// configured variable that is not set.
    fn authorize(
        &self,
        agent: &AgentSpec,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::RequestBuilder, String> {
        let named = agent
            .endpoint
            .as_ref()
            .and_then(|e| e.bearer_token_env.as_ref());
        let Some(variable) = named.or_else(|| self.bearer_token_env.get(&agent.id)) else {
            return Ok(request);
        };
        let token = (self.env)(variable)
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| variable.clone())?;
        let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
            .map_err(|_| variable.clone())?;
        value.set_sensitive(true);
        Ok(request.header(AUTHORIZATION, value))
    }
}

/// The endpoint's URL without a trailing `/`, to which the binding's paths are appended.
fn base_url(endpoint: &EndpointSpec) -> &str {
    endpoint.url.trim().trim_end_matches('/')
}

/// Whether `version` is protocol version 1.0 (`1.0`, or `1.0.x`).
fn is_protocol_v1_0(version: &str) -> bool {
    let mut parts = version.trim().split('.');
    parts.next() == Some("1") && parts.next() == Some("0")
}

/// The first `max` bytes of a response's body.
async fn read_prefix(
    mut response: reqwest::Response,
    max: usize,
) -> Result<Vec<u8>, reqwest::Error> {
    let mut body = Vec::new();
    while body.len() < max {
        let Some(chunk) = response.chunk().await? else {
            break;
        };
        let room = max - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    Ok(body)
}

/// An error with its sources, `: `-separated (a transport error names its cause only there).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}
