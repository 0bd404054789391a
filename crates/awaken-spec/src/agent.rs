//! The agent spec: everything a user configures about one agent.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::context::ContextPolicy;
use crate::duration::DurationSpec;
use crate::error::{SpecError, parse_json, parse_toml};
use crate::glob::Glob;
use crate::inference::InferenceOverride;
use crate::permission::{PERMISSION_SECTION, PermissionConfig};
use crate::sections::{RETRY_SECTION, RetryConfig, Sections};

/// Default for [`AgentSpec::max_rounds`].
pub const DEFAULT_MAX_ROUNDS: u32 = 25;

/// A remote endpoint that runs an agent instead of the local loop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    /// Where the agent is served.
    pub url: String,
    /// The protocol, when the URL does not say (`a2a`, ...). Execution backends claim
    /// endpoints by protocol or URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The environment variable holding the bearer token sent to this endpoint (read when a
    /// request is sent, never stored; the token of a server serving this agent is never sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_env: Option<String>,
}

/// A condition that ends a run as `Stopped` (besides `max_rounds`, which is a field of its own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum StopConditionSpec {
    /// Stop once the run's total tokens reach the budget.
    TokenBudget {
        /// Input plus output tokens.
        max_total_tokens: u64,
    },
    /// Stop after a call of this tool completes.
    StopOnTool {
        /// The tool id.
        tool: String,
    },
    /// Stop after this many consecutive failed tool calls.
    ConsecutiveErrors {
        /// How many in a row.
        max: u32,
    },
}

fn default_max_rounds() -> u32 {
    DEFAULT_MAX_ROUNDS
}

/// One agent's configuration. Parse with [`AgentSpec::from_toml_str`] /
/// [`AgentSpec::from_json_str`] (both validate) or build with the `with_*` methods and call
/// [`AgentSpec::validate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// The agent's id.
    pub id: String,
    /// The model id (required for a local agent).
    #[serde(default)]
    pub model: String,
    /// What the agent is for (shown to a parent when it is a delegate).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The system prompt.
    #[serde(default)]
    pub system_prompt: String,
    /// At most this many inferences per run.
    #[serde(default = "default_max_rounds")]
    pub max_rounds: u32,
    /// Plugins to load, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plugin_ids: Vec<String>,
    /// If non-empty, only these plugins contribute behaviour (built-ins always do).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active_hook_filter: Vec<String>,
    /// Plugin configuration sections.
    #[serde(default, skip_serializing_if = "Sections::is_empty")]
    pub sections: Sections,
    /// Agent ids this agent can hand tasks to (each becomes a tool).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delegates: Vec<String>,
    /// A remote endpoint serving this agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<EndpointSpec>,
    /// Context management; setting it adds the context plugins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_policy: Option<ContextPolicy>,
    /// Tool ids allowed (absent, together with `allowed_tool_patterns`: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
    /// Globs of tool ids allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tool_patterns: Option<Vec<Glob>>,
    /// Tool ids removed (exclusion always wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded_tools: Vec<String>,
    /// Globs of tool ids removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded_tool_patterns: Vec<Glob>,
    /// Extra stop conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_conditions: Vec<StopConditionSpec>,
    /// Run a step's tool calls concurrently (calls with overlapping writes stay ordered).
    #[serde(default)]
    pub parallel_tools: bool,
    /// Time limit of one tool call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_timeout: Option<DurationSpec>,
    /// Agent-default inference parameters.
    #[serde(default, skip_serializing_if = "InferenceOverride::is_empty")]
    pub inference: InferenceOverride,
}

impl AgentSpec {
    /// An agent using `model`, with defaults everywhere else.
    pub fn new(id: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            model: model.into(),
            description: String::new(),
            system_prompt: String::new(),
            max_rounds: DEFAULT_MAX_ROUNDS,
            plugin_ids: Vec::new(),
            active_hook_filter: Vec::new(),
            sections: Sections::new(),
            delegates: Vec::new(),
            endpoint: None,
            context_policy: None,
            allowed_tools: None,
            allowed_tool_patterns: None,
            excluded_tools: Vec::new(),
            excluded_tool_patterns: Vec::new(),
            stop_conditions: Vec::new(),
            parallel_tools: false,
            tool_timeout: None,
            inference: InferenceOverride::default(),
        }
    }

    /// Parses and validates an agent from TOML.
    pub fn from_toml_str(text: &str) -> Result<Self, SpecError> {
        let spec: Self = parse_toml(text)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parses and validates an agent from JSON.
    pub fn from_json_str(text: &str) -> Result<Self, SpecError> {
        let spec: Self = parse_json(text)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks every field, naming the first that is wrong as `agent.<field>`.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.id.trim().is_empty() {
            return Err(SpecError::invalid("agent.id", "must not be blank"));
        }
        if self.id.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(SpecError::invalid(
                "agent.id",
                format!("{:?} contains whitespace", self.id),
            ));
        }
        if self.endpoint.is_none() && self.model.trim().is_empty() {
            return Err(SpecError::invalid(
                "agent.model",
                "a local agent must name a model",
            ));
        }
        if let Some(e) = &self.endpoint
            && e.url.trim().is_empty()
        {
            return Err(SpecError::invalid(
                "agent.endpoint.url",
                "must not be blank",
            ));
        }
        if self.max_rounds == 0 {
            return Err(SpecError::invalid("agent.max_rounds", "must be at least 1"));
        }
        check_ids("agent.plugin_ids", &self.plugin_ids)?;
        check_ids("agent.active_hook_filter", &self.active_hook_filter)?;
        check_ids("agent.delegates", &self.delegates)?;
        if self.delegates.iter().any(|d| d == &self.id) {
            return Err(SpecError::invalid(
                "agent.delegates",
                "an agent cannot delegate to itself",
            ));
        }
        if let Some(tools) = &self.allowed_tools {
            check_ids("agent.allowed_tools", tools)?;
        }
        check_ids("agent.excluded_tools", &self.excluded_tools)?;
        for (i, c) in self.stop_conditions.iter().enumerate() {
            let field = format!("agent.stop_conditions[{i}]");
            match c {
                StopConditionSpec::TokenBudget {
                    max_total_tokens: 0,
                } => {
                    return Err(SpecError::invalid(
                        field,
                        "max_total_tokens must be at least 1",
                    ));
                }
                StopConditionSpec::ConsecutiveErrors { max: 0 } => {
                    return Err(SpecError::invalid(field, "max must be at least 1"));
                }
                StopConditionSpec::StopOnTool { tool } if tool.trim().is_empty() => {
                    return Err(SpecError::invalid(field, "tool must not be blank"));
                }
                _ => {}
            }
        }
        if let Some(t) = self.tool_timeout
            && t.get().is_zero()
        {
            return Err(SpecError::invalid(
                "agent.tool_timeout",
                "must be longer than zero",
            ));
        }
        self.inference.validate("agent.inference")?;
        if let Some(p) = &self.context_policy {
            p.validate()?;
        }
        if let Some(permission) = self
            .sections
            .get_typed::<PermissionConfig>(PERMISSION_SECTION)?
        {
            permission.validate()?;
        }
        if let Some(retry) = self.sections.get_typed::<RetryConfig>(RETRY_SECTION)? {
            retry.validate()?;
        }
        Ok(())
    }

    /// The typed `permission` section, if present.
    pub fn permission(&self) -> Result<Option<PermissionConfig>, SpecError> {
        self.sections.get_typed(PERMISSION_SECTION)
    }

    /// The typed `retry` section (defaults when absent: no retries).
    pub fn retry(&self) -> Result<RetryConfig, SpecError> {
        Ok(self.sections.get_typed(RETRY_SECTION)?.unwrap_or_default())
    }

    /// Sets the description.
    pub fn with_description(mut self, text: impl Into<String>) -> Self {
        self.description = text.into();
        self
    }

    /// Sets the system prompt.
    pub fn with_system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = prompt.into();
        self
    }

    /// Sets `max_rounds`.
    pub fn with_max_rounds(mut self, n: u32) -> Self {
        self.max_rounds = n;
        self
    }

    /// Appends a plugin id.
    pub fn with_plugin(mut self, id: impl Into<String>) -> Self {
        self.plugin_ids.push(id.into());
        self
    }

    /// Appends a plugin id to the activation filter.
    pub fn with_active_hook(mut self, id: impl Into<String>) -> Self {
        self.active_hook_filter.push(id.into());
        self
    }

    /// Sets a config section.
    pub fn with_section(mut self, key: impl Into<String>, value: Value) -> Self {
        self.sections.insert(key, value);
        self
    }

    /// Appends a delegate agent id.
    pub fn with_delegate(mut self, agent_id: impl Into<String>) -> Self {
        self.delegates.push(agent_id.into());
        self
    }

    /// Sets the remote endpoint.
    pub fn with_endpoint(mut self, endpoint: EndpointSpec) -> Self {
        self.endpoint = Some(endpoint);
        self
    }

    /// Sets the context policy.
    pub fn with_context_policy(mut self, policy: ContextPolicy) -> Self {
        self.context_policy = Some(policy);
        self
    }

    /// Allows a tool id (switching the catalog from allow-all to an allow list).
    pub fn with_allowed_tool(mut self, id: impl Into<String>) -> Self {
        self.allowed_tools
            .get_or_insert_with(Vec::new)
            .push(id.into());
        self
    }

    /// Allows tool ids matching a glob.
    pub fn with_allowed_tool_pattern(mut self, pattern: Glob) -> Self {
        self.allowed_tool_patterns
            .get_or_insert_with(Vec::new)
            .push(pattern);
        self
    }

    /// Excludes a tool id.
    pub fn with_excluded_tool(mut self, id: impl Into<String>) -> Self {
        self.excluded_tools.push(id.into());
        self
    }

    /// Excludes tool ids matching a glob.
    pub fn with_excluded_tool_pattern(mut self, pattern: Glob) -> Self {
        self.excluded_tool_patterns.push(pattern);
        self
    }

    /// Adds a stop condition.
    pub fn with_stop_condition(mut self, condition: StopConditionSpec) -> Self {
        self.stop_conditions.push(condition);
        self
    }

    /// Runs tool calls concurrently.
    pub fn with_parallel_tools(mut self, on: bool) -> Self {
        self.parallel_tools = on;
        self
    }

    /// Sets the tool timeout.
    pub fn with_tool_timeout(mut self, timeout: DurationSpec) -> Self {
        self.tool_timeout = Some(timeout);
        self
    }

    /// Sets the agent-default inference parameters.
    pub fn with_inference(mut self, inference: InferenceOverride) -> Self {
        self.inference = inference;
        self
    }
}

fn check_ids(field: &str, ids: &[String]) -> Result<(), SpecError> {
    // A short list (an agent's usual plugins or tools) is checked for repeats by comparing
    // with the ids before (no set to build: resolution validates its spec on every run).
    const SCANNED: usize = 16;
    let scan = ids.len() <= SCANNED;
    let mut seen = HashSet::with_capacity(if scan { 0 } else { ids.len() });
    for (i, id) in ids.iter().enumerate() {
        if id.trim().is_empty() {
            return Err(SpecError::invalid(
                format!("{field}[{i}]"),
                "must not be blank",
            ));
        }
        let repeated = if scan {
            ids[..i].contains(id)
        } else {
            !seen.insert(id.as_str())
        };
        if repeated {
            return Err(SpecError::invalid(
                format!("{field}[{i}]"),
                format!("{id:?} is listed twice"),
            ));
        }
    }
    Ok(())
}
