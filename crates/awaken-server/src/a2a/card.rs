//! The agent cards: one per agent, its interface at `/a2a/{agent}` (HTTP+JSON, 1.0), its
//! skills the agent itself and its tools.

use awaken_a2a::{
    AgentCapabilities, AgentCard, AgentInterface, AgentSkill, HTTP_JSON_BINDING,
    HttpAuthSecurityScheme, PROTOCOL_VERSION, SecurityRequirement, SecurityScheme, StringList,
};
use axum::http::HeaderMap;
use axum::http::header;

use crate::app::AgentServer;

/// The media types an agent takes and answers with.
const MODES: [&str; 2] = ["text/plain", "application/json"];

/// The card of `agent` as reached at `base` (`http://host:port`); `None` for no such agent.
pub(crate) fn card(server: &AgentServer, agent: &str, base: &str) -> Option<AgentCard> {
    let resolver = server.shared.runtime.resolver();
    let spec = resolver.registries().agent(agent)?;
    let description = if spec.description.trim().is_empty() {
        format!("The Awaken agent `{agent}`")
    } else {
        spec.description.clone()
    };
    let mut skills = vec![AgentSkill {
        id: agent.to_owned(),
        name: agent.to_owned(),
        description: description.clone(),
        tags: vec!["agent".to_owned()],
        ..AgentSkill::default()
    }];
    // (An agent that does not resolve now still has its card: its tools are left out.)
    if let Ok(resolved) = resolver.resolve(agent) {
        skills.extend(resolved.tools.iter().map(|t| {
            let d = t.tool.descriptor();
            AgentSkill {
                id: format!("tool:{}", d.id),
                name: d.name.to_string(),
                description: d.description.to_string(),
                tags: vec!["tool".to_owned()],
                ..AgentSkill::default()
            }
        }));
    }
    let mut card = AgentCard {
        name: agent.to_owned(),
        description,
        supported_interfaces: vec![AgentInterface {
            url: format!("{base}/a2a/{agent}"),
            protocol_binding: HTTP_JSON_BINDING.to_owned(),
            tenant: None,
            protocol_version: PROTOCOL_VERSION.to_owned(),
        }],
        version: env!("CARGO_PKG_VERSION").to_owned(),
        capabilities: AgentCapabilities {
            streaming: Some(true),
            push_notifications: Some(false),
            extended_agent_card: None,
        },
        default_input_modes: MODES.map(str::to_owned).to_vec(),
        default_output_modes: MODES.map(str::to_owned).to_vec(),
        skills,
        ..AgentCard::default()
    };
    if server.shared.config.auth_token.is_some() {
        card.security_schemes.insert(
            "bearer".to_owned(),
            SecurityScheme::HttpAuthSecurityScheme(HttpAuthSecurityScheme {
                description: Some("the server's token: `Authorization: Bearer <token>`".into()),
                scheme: "Bearer".to_owned(),
                bearer_format: None,
            }),
        );
        card.security_requirements.push(SecurityRequirement {
            schemes: [("bearer".to_owned(), StringList::default())].into(),
        });
    }
    Some(card)
}

/// The agent the host's own card describes: the configured default, else the first agent.
pub(crate) fn default_agent(server: &AgentServer) -> Option<String> {
    if let Some(agent) = &server.shared.config.default_agent {
        return Some(agent.clone());
    }
    let registries = server.shared.runtime.resolver().registries();
    registries.agent_ids().into_iter().next()
}

/// The server's base URL as the client reached it: `X-Forwarded-Proto` (else `http`) and the
/// `Host` header; `None` when the host is missing or not a host name with an optional port.
pub(crate) fn base_url(headers: &HeaderMap) -> Option<String> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let valid = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']' | '_'));
    if !valid {
        return None;
    }
    let scheme = match headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
    {
        Some("https") => "https",
        _ => "http",
    };
    Some(format!("{scheme}://{host}"))
}
