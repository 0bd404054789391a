//! The agent card: who an agent is, where it is reached (its supported interfaces), what it
//! can do (capabilities, skills) and how a client authenticates.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// An agent's self-description, served at [`crate::AGENT_CARD_PATH`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCard {
    /// The agent's name.
    pub name: String,
    /// What the agent does.
    pub description: String,
    /// Where and how the agent is reached, the preferred interface first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supported_interfaces: Vec<AgentInterface>,
    /// Who provides the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<AgentProvider>,
    /// The agent's version.
    pub version: String,
    /// A page about the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documentation_url: Option<String>,
    /// The optional features the agent supports.
    #[serde(default)]
    pub capabilities: AgentCapabilities,
    /// The authentication schemes, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub security_schemes: BTreeMap<String, SecurityScheme>,
    /// Which schemes a client must satisfy (any one requirement of the list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_requirements: Vec<SecurityRequirement>,
    /// The media types the agent takes, unless a skill says otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub default_input_modes: Vec<String>,
    /// The media types the agent answers with, unless a skill says otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub default_output_modes: Vec<String>,
    /// What the agent can be asked to do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<AgentSkill>,
}

/// One way to reach an agent: a URL, the protocol binding spoken there and its version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInterface {
    /// The base URL of the interface (the binding's paths follow it).
    pub url: String,
    /// `HTTP+JSON`, `JSONRPC` or `GRPC`.
    pub protocol_binding: String,
    /// The tenant a client names in its requests, if the host has several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The protocol version spoken there (`1.0`).
    pub protocol_version: String,
}

/// The organisation that provides an agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentProvider {
    /// The provider's website.
    pub url: String,
    /// The provider's name.
    pub organization: String,
}

/// The optional features of the protocol an agent supports (absent: not supported).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCapabilities {
    /// Streaming responses (`message:stream`, `tasks/{id}:subscribe`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streaming: Option<bool>,
    /// Push notifications of task updates to a client's webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_notifications: Option<bool>,
    /// An extended card for authenticated clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extended_agent_card: Option<bool>,
}

/// Something an agent can be asked to do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSkill {
    /// The skill's id, unique in the card.
    pub id: String,
    /// The skill's name.
    pub name: String,
    /// What the skill does.
    pub description: String,
    /// Keywords.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Example requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<String>,
    /// The media types the skill takes, when not the card's defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_modes: Vec<String>,
    /// The media types the skill answers with, when not the card's defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_modes: Vec<String>,
}

/// An authentication scheme (only the HTTP scheme is modelled: a bearer token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SecurityScheme {
    /// HTTP authentication (`Authorization: <scheme> <credentials>`).
    HttpAuthSecurityScheme(HttpAuthSecurityScheme),
}

/// HTTP authentication with `scheme` (`Bearer`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpAuthSecurityScheme {
    /// What the scheme is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The HTTP authentication scheme (`Bearer`).
    pub scheme: String,
    /// A hint of the bearer token's format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_format: Option<String>,
}

/// The schemes a client satisfies together, by name, each with the scopes it needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecurityRequirement {
    /// Scheme name to its scopes.
    pub schemes: BTreeMap<String, StringList>,
}

/// A list of strings (the protocol's wrapper for map values).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StringList {
    /// The strings.
    #[serde(default)]
    pub list: Vec<String>,
}
