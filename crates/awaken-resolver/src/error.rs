//! Resolution errors, warnings and registration errors.

use awaken_llm::PoolError;
use awaken_plugin::{EnvError, RegistryError, SectionViolation};
use awaken_spec::SpecError;
use awaken_tool::ToolRegistrationError;

/// Why an agent could not be resolved. Resolution is all-or-nothing: nothing partial is returned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// No agent has this id.
    #[error("agent `{agent_id}` is not registered")]
    AgentNotFound {
        /// The id asked for.
        agent_id: String,
    },
    /// The agent's spec does not validate.
    #[error("agent `{agent_id}` has an invalid spec: {source}")]
    InvalidSpec {
        /// The agent.
        agent_id: String,
        /// The validation error.
        #[source]
        source: SpecError,
    },
    /// The agent is served by a remote endpoint; run it through its plan.
    #[error(
        "agent `{agent_id}` is served by endpoint `{endpoint}` and cannot be resolved for the local loop"
    )]
    RemoteAgentNotDirectlyRunnable {
        /// The agent.
        agent_id: String,
        /// Its endpoint URL.
        endpoint: String,
    },
    /// No execution backend claims the agent's endpoint.
    #[error("no execution backend claims endpoint `{endpoint}` of agent `{agent_id}`")]
    NoBackendForEndpoint {
        /// The agent.
        agent_id: String,
        /// Its endpoint URL.
        endpoint: String,
    },
    /// The agent's model id is not registered.
    #[error("agent `{agent_id}` uses model `{model_id}`, which is not registered")]
    ModelNotFound {
        /// The agent.
        agent_id: String,
        /// The model id.
        model_id: String,
    },
    /// The model's provider is not registered.
    #[error(
        "model `{model_id}` of agent `{agent_id}` is served by provider `{provider_id}`, which is not registered"
    )]
    ProviderNotFound {
        /// The agent.
        agent_id: String,
        /// The model.
        model_id: String,
        /// The provider id.
        provider_id: String,
    },
    /// The agent's model is a model pool that cannot be built (see [`ModelPoolError`]).
    #[error("agent `{agent_id}`: {source}")]
    ModelPool {
        /// The agent.
        agent_id: String,
        /// What is wrong with the pool.
        #[source]
        source: ModelPoolError,
    },
    /// A plugin the agent lists is not in the plugin source.
    #[error("agent `{agent_id}` lists plugin `{plugin_id}`, which is not registered")]
    PluginNotFound {
        /// The agent.
        agent_id: String,
        /// The plugin id.
        plugin_id: String,
    },
    /// A config section does not satisfy its claiming plugin's schema.
    #[error("agent `{agent_id}`: config section `{section}` (claimed by `{plugin_id}`) is invalid: {}", violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    InvalidPluginConfig {
        /// The agent.
        agent_id: String,
        /// The section.
        section: String,
        /// The claiming plugin.
        plugin_id: String,
        /// Every violation, with its JSON path.
        violations: Vec<SectionViolation>,
    },
    /// The built-in plugins could not be made for this agent.
    #[error("agent `{agent_id}`: built-in plugins: {message}")]
    BuiltinPlugins {
        /// The agent.
        agent_id: String,
        /// Why.
        message: String,
    },
    /// The execution environment could not be built.
    #[error("agent `{agent_id}`: {source}")]
    Env {
        /// The agent.
        agent_id: String,
        /// The cause, with its structure.
        #[source]
        source: EnvError,
    },
    /// A delegate names an agent that is not registered.
    #[error("agent `{agent_id}` delegates to `{delegate_id}`, which is not registered")]
    DelegateNotFound {
        /// The agent.
        agent_id: String,
        /// The delegate.
        delegate_id: String,
    },
    /// The agent has delegates but no delegate-tool factory is installed.
    #[error(
        "agent `{agent_id}` delegates to `{delegate_id}`, but no delegate tool factory is installed"
    )]
    NoDelegateFactory {
        /// The agent.
        agent_id: String,
        /// The delegate.
        delegate_id: String,
    },
    /// The delegate-tool factory refused.
    #[error("agent `{agent_id}`: delegate tool for `{delegate_id}`: {message}")]
    DelegateTool {
        /// The agent.
        agent_id: String,
        /// The delegate.
        delegate_id: String,
        /// Why.
        message: String,
    },
    /// A tool is invalid (schema, recovery policy).
    #[error("agent `{agent_id}`: {source}")]
    InvalidTool {
        /// The agent.
        agent_id: String,
        /// The cause.
        #[source]
        source: ToolRegistrationError,
    },
    /// Two tool sources provide the same id.
    #[error("tool id `{id}` is provided by both {first} and {second}")]
    ToolIdConflict {
        /// The id.
        id: String,
        /// The first source (`global`, `delegate:<agent>`, `plugin:<id>`, `provider:<id>`).
        first: String,
        /// The second source.
        second: String,
    },
}

/// Why a model pool could not be built from the registries.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelPoolError {
    /// The pool's spec does not validate.
    #[error("model pool `{pool_id}`: {source}")]
    InvalidSpec {
        /// The pool.
        pool_id: String,
        /// The validation error, naming the field.
        #[source]
        source: SpecError,
    },
    /// A member names no registered model.
    #[error("model pool `{pool_id}`: member `{member}` is not a registered model")]
    MemberNotFound {
        /// The pool.
        pool_id: String,
        /// The member's model id.
        member: String,
    },
    /// A member names another pool: pools do not nest.
    #[error(
        "model pool `{pool_id}`: member `{member}` is itself a model pool; a pool's members are models"
    )]
    NestedPool {
        /// The pool.
        pool_id: String,
        /// The member's id (a pool id).
        member: String,
    },
    /// A member model's provider is not registered.
    #[error(
        "model pool `{pool_id}`: member `{member}` is served by provider `{provider_id}`, which is not registered"
    )]
    ProviderNotFound {
        /// The pool.
        pool_id: String,
        /// The member's model id.
        member: String,
        /// The provider id the member model names.
        provider_id: String,
    },
    /// The members share no modality, so no request suits all of them.
    #[error("model pool `{pool_id}`: its members support no modality in common")]
    NoCommonModality {
        /// The pool.
        pool_id: String,
    },
    /// The pool refused its members (a member model's `upstream_model` is blank, ...).
    #[error("{source}")]
    Build {
        /// The pool.
        pool_id: String,
        /// The pool's refusal (its message names the pool and the member).
        #[source]
        source: PoolError,
    },
    /// A resumed or recovered run started with a member that is no longer a registered model.
    #[error(
        "model pool `{pool_id}`: the run started with member `{member}`, which is no longer a registered model"
    )]
    RecordedMemberNotFound {
        /// The pool.
        pool_id: String,
        /// The recorded member's model id.
        member: String,
    },
}

impl ModelPoolError {
    /// The pool the error is about.
    pub fn pool_id(&self) -> &str {
        match self {
            Self::InvalidSpec { pool_id, .. }
            | Self::MemberNotFound { pool_id, .. }
            | Self::NestedPool { pool_id, .. }
            | Self::ProviderNotFound { pool_id, .. }
            | Self::NoCommonModality { pool_id }
            | Self::Build { pool_id, .. }
            | Self::RecordedMemberNotFound { pool_id, .. } => pool_id,
        }
    }
}

/// Why a model id (a model's or a pool's) could not be resolved to a spec and an executor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelResolveError {
    /// No model or pool has this id.
    #[error("model `{model_id}` is not registered")]
    ModelNotFound {
        /// The id.
        model_id: String,
    },
    /// The model's provider is not registered.
    #[error("model `{model_id}` is served by provider `{provider_id}`, which is not registered")]
    ProviderNotFound {
        /// The model.
        model_id: String,
        /// The provider id.
        provider_id: String,
    },
    /// The id names a pool that cannot be built.
    #[error(transparent)]
    Pool(#[from] ModelPoolError),
}

impl ModelResolveError {
    /// The same failure as a resolution error of agent `agent_id`.
    pub(crate) fn for_agent(self, agent_id: &str) -> ResolveError {
        let agent_id = agent_id.to_owned();
        match self {
            Self::ModelNotFound { model_id } => ResolveError::ModelNotFound { agent_id, model_id },
            Self::ProviderNotFound {
                model_id,
                provider_id,
            } => ResolveError::ProviderNotFound {
                agent_id,
                model_id,
                provider_id,
            },
            Self::Pool(source) => ResolveError::ModelPool { agent_id, source },
        }
    }
}

/// Something resolution noticed that does not stop it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResolveWarning {
    /// A catalog pattern matched no tool.
    UnmatchedPattern {
        /// `allowed_tool_patterns` or `excluded_tool_patterns`.
        field: &'static str,
        /// The pattern.
        pattern: String,
    },
    /// A catalog entry looks like a permission rule (contains `(`); it probably belongs in
    /// the `permission` section.
    PermissionLikeCatalogEntry {
        /// The catalog field.
        field: &'static str,
        /// The entry.
        entry: String,
    },
    /// A permission rule names only tools the catalog filtered out.
    PermissionRuleForFilteredTool {
        /// The rule's index in the `permission` section.
        rule: usize,
        /// Its tool glob.
        tool: String,
    },
    /// A config section no plugin claims (maybe a typo).
    UnclaimedSection {
        /// The section key.
        section: String,
    },
    /// The agent lists a plugin that is disabled; it resolves without it.
    DisabledPlugin {
        /// The plugin id.
        plugin_id: String,
    },
}

impl std::fmt::Display for ResolveWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnmatchedPattern { field, pattern } => {
                write!(f, "{field} pattern `{pattern}` matches no tool")
            }
            Self::PermissionLikeCatalogEntry { field, entry } => write!(
                f,
                "{field} entry `{entry}` looks like a permission rule; put it in the `permission` section"
            ),
            Self::PermissionRuleForFilteredTool { rule, tool } => {
                write!(
                    f,
                    "permission rule {rule} (`{tool}`) names only tools the catalog filtered out"
                )
            }
            Self::UnclaimedSection { section } => {
                write!(f, "config section `{section}` is claimed by no plugin")
            }
            Self::DisabledPlugin { plugin_id } => {
                write!(
                    f,
                    "plugin `{plugin_id}` is disabled; the agent runs without it"
                )
            }
        }
    }
}

/// Something validation noticed about the registered agents together that does not fail it
/// (see `Resolver::validation_warnings`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValidationWarning {
    /// Agents that delegate to each other in a circle, directly or through others. It may be
    /// intended (a writer and a reviewer handing work back and forth); the runtime's delegation
    /// depth limit bounds how deep such a chain of child runs goes.
    DelegationCycle {
        /// The shortest cycle through the group's first agent (by id), in delegation order,
        /// that agent not repeated at the end.
        cycle: Vec<String>,
        /// Every agent of the group (each reaches every other one), sorted by id: more than
        /// `cycle` when the group holds several cycles.
        agents: Vec<String>,
    },
}

impl std::fmt::Display for ValidationWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::DelegationCycle { cycle, agents } => {
                // Back to where it started: `a → b → a`.
                let path: Vec<&str> = cycle
                    .iter()
                    .chain(cycle.first())
                    .map(String::as_str)
                    .collect();
                write!(f, "delegation cycle: {}", path.join(" → "))?;
                if agents.len() > cycle.len() {
                    write!(
                        f,
                        " (agents {} all delegate to each other, directly or through others)",
                        agents.join(", ")
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// A registration refused by [`crate::Registries`], recorded and reported later.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationError {
    /// An id registered twice in one registry.
    #[error("{kind} `{id}` is registered twice")]
    Duplicate {
        /// `agent`, `tool`, `model` (model and pool ids share one namespace), `provider` or
        /// `plugin`.
        kind: &'static str,
        /// The id.
        id: String,
    },
    /// A global tool is invalid.
    #[error("{0}")]
    InvalidTool(String),
    /// A plugin registry refused agent definitions.
    #[error("{0}")]
    AgentDefinitions(String),
}

impl From<&RegistryError> for RegistrationError {
    fn from(e: &RegistryError) -> Self {
        RegistrationError::AgentDefinitions(e.to_string())
    }
}

/// Everything `validate` found, all of it.
#[derive(Debug, thiserror::Error)]
#[error("{} problem(s): {}", problems.len(), problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ValidationFailed {
    /// Each problem.
    pub problems: Vec<ValidationProblem>,
}

/// One problem found by `validate`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationProblem {
    /// A recorded registration error.
    #[error(transparent)]
    Registration(RegistrationError),
    /// An agent that fails a dry resolution.
    #[error(transparent)]
    Agent(ResolveError),
    /// A registered model pool that cannot be built (whether an agent uses it or not).
    #[error(transparent)]
    ModelPool(ModelPoolError),
}
