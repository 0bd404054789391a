//! The three-stage resolution of an agent: lookup, plugin pipeline, tool pipeline.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use awaken_event::{
    CancellationToken, EventSink, Message, RunId, TerminationReason, ThreadId, TokenUsage,
};
use awaken_llm::{LlmExecutor, RetryingExecutor};
use awaken_plugin::{ConfigSchema, ExecutionEnv, Plugin, SectionStatus, validate_sections};
use awaken_spec::{AgentSpec, EndpointSpec, InferenceOverride, ModelSpec, RETRY_SECTION};
use awaken_tool::{RegisteredTool, Tool};
use serde_json::json;

use crate::catalog::filter_catalog;
use crate::cycles::delegation_cycles;
use crate::error::{
    ModelResolveError, ResolveError, ResolveWarning, ValidationFailed, ValidationProblem,
    ValidationWarning,
};
use crate::pools::{PoolMembership, digest_lines};
use crate::registries::Registries;

/// The plugin id under which the resolver claims the `retry` section.
pub const RESOLVER_PLUGIN_ID: &str = "awaken-resolver";

/// The built-in plugins the runtime supplies for an agent: always its loop actions and stop
/// conditions; context management only when the spec sets `context_policy`.
pub trait BuiltinPlugins: Send + Sync {
    /// The built-ins for `spec` (resolved against `model`). An `Err` fails resolution.
    fn builtin_plugins(
        &self,
        spec: &AgentSpec,
        model: &ModelSpec,
    ) -> Result<Vec<Arc<dyn Plugin>>, String>;
}

/// No built-ins (for tests and tools that only inspect resolution).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoBuiltins;

impl BuiltinPlugins for NoBuiltins {
    fn builtin_plugins(
        &self,
        _spec: &AgentSpec,
        _model: &ModelSpec,
    ) -> Result<Vec<Arc<dyn Plugin>>, String> {
        Ok(Vec::new())
    }
}

/// Makes the tool through which an agent hands a task to a delegate agent.
pub trait DelegateToolFactory: Send + Sync {
    /// The tool by which `parent` calls `delegate`. Its id must be unique among the parent's
    /// tools. An `Err` fails resolution.
    fn delegate_tool(
        &self,
        parent: &AgentSpec,
        delegate: &AgentSpec,
    ) -> Result<Arc<dyn Tool>, String>;
}

/// A request handed to an execution backend.
#[derive(Debug, Clone)]
pub struct BackendRequest {
    /// The thread.
    pub thread_id: ThreadId,
    /// The run.
    pub run_id: RunId,
    /// The new messages.
    pub messages: Vec<Message>,
    /// A run-level inference override.
    pub overrides: Option<InferenceOverride>,
    /// Cancellation of the run.
    pub cancel: CancellationToken,
    /// Set when this request answers a remote run that waits for input: the handle an earlier
    /// outcome gave ([`BackendOutcome::waiting`]); the last user message is the answer. With
    /// its cancellation already fired, the request cancels that remote run instead.
    pub answering: Option<String>,
}

/// What a backend run produced.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendOutcome {
    /// Why it ended.
    pub termination: TerminationReason,
    /// The final text, if any.
    pub response: Option<String>,
    /// Token usage.
    pub usage: TokenUsage,
    /// Set when the remote run waits for input (`termination` is `Suspended`, the question in
    /// `response`): the remote side's handle on it (an A2A task id), which the request that
    /// answers passes in [`BackendRequest::answering`].
    pub waiting: Option<String>,
}

/// A backend failure.
#[derive(Debug, thiserror::Error)]
#[error("execution backend `{backend}` failed: {message}")]
pub struct BackendError {
    /// The backend's id.
    pub backend: String,
    /// What went wrong.
    pub message: String,
}

/// Runs endpoint-backed agents instead of the local loop (A2A and the like).
#[async_trait]
pub trait ExecutionBackend: Send + Sync + 'static {
    /// The backend's id.
    fn id(&self) -> &str;
    /// Whether this backend serves `endpoint`.
    fn claims(&self, endpoint: &EndpointSpec) -> bool;
    /// Runs `agent` for `request`, streaming its events to `sink` (one activation: `RunStart`
    /// … `RunFinish`).
    async fn run(
        &self,
        agent: &AgentSpec,
        request: BackendRequest,
        sink: &dyn EventSink,
    ) -> Result<BackendOutcome, BackendError>;
}

/// Where a resolved tool came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolSource {
    /// A global tool.
    Global,
    /// The tool of a delegate agent.
    Delegate(String),
    /// A plugin's tool.
    Plugin(String),
    /// A tool of a [`awaken_tool::ToolProvider`] (an MCP server's), by the provider's id.
    Provider(String),
}

impl std::fmt::Display for ToolSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolSource::Global => f.write_str("global"),
            ToolSource::Delegate(a) => write!(f, "delegate:{a}"),
            ToolSource::Plugin(p) => write!(f, "plugin:{p}"),
            ToolSource::Provider(p) => write!(f, "provider:{p}"),
        }
    }
}

/// A tool of the final set, with its compiled validator and source.
#[derive(Debug, Clone)]
pub struct ResolvedTool {
    /// The tool.
    pub tool: RegisteredTool,
    /// Where it came from.
    pub source: ToolSource,
}

/// A locally runnable agent. A fresh one per resolution: its environment and tool set are
/// built anew; its spec and model are the registries' (shared and immutable) as they are when
/// it is resolved.
#[derive(Clone)]
pub struct ResolvedAgent {
    /// The spec.
    pub spec: Arc<AgentSpec>,
    /// Its model (shared with the model registry); for a model pool, the spec derived from
    /// its members.
    pub model: Arc<ModelSpec>,
    /// The executor: the model's provider or the model pool, wrapped in `RetryingExecutor`
    /// when the `retry` section asks (around the pool, never around its members).
    pub executor: Arc<dyn LlmExecutor>,
    /// The membership of the model pool the agent's model names (`None` for a model): what a
    /// run records, so that its resume or recovery runs on the same members.
    pub pool: Option<Arc<PoolMembership>>,
    /// The execution environment.
    pub env: ExecutionEnv,
    /// The final tool set, in source order, after the catalog filter.
    pub tools: Vec<ResolvedTool>,
    /// Warnings found on the way.
    pub warnings: Vec<ResolveWarning>,
    /// Digest of the resolved spec (spec, model, a pool's membership, plugins with versions,
    /// tool ids), stable across processes.
    pub spec_digest: Arc<str>,
}

impl std::fmt::Debug for ResolvedAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedAgent")
            .field("agent", &self.spec.id)
            .field("model", &self.model.id)
            .field("executor", &self.executor.name())
            .field("pool", &self.pool)
            .field("env", &self.env)
            .field(
                "tools",
                &self
                    .tools
                    .iter()
                    .map(|t| t.tool.id().to_owned())
                    .collect::<Vec<_>>(),
            )
            .field("warnings", &self.warnings)
            .field("spec_digest", &self.spec_digest)
            .finish()
    }
}

/// An endpoint-backed agent and the backend that runs it.
#[derive(Clone)]
pub struct ResolvedBackendAgent {
    /// The spec.
    pub spec: Arc<AgentSpec>,
    /// The backend that claims its endpoint.
    pub backend: Arc<dyn ExecutionBackend>,
}

/// How a run executes: through the local loop or a backend.
#[derive(Clone)]
pub enum ResolvedRunPlan {
    /// The local loop.
    Local(Box<ResolvedAgent>),
    /// An execution backend.
    Backend(ResolvedBackendAgent),
}

/// Resolves agent ids against [`Registries`], with the runtime's injection points.
#[derive(Clone)]
pub struct Resolver {
    registries: Arc<Registries>,
    builtins: Arc<dyn BuiltinPlugins>,
    delegates: Option<Arc<dyn DelegateToolFactory>>,
    backends: Vec<Arc<dyn ExecutionBackend>>,
    /// The last digest computed for each agent, with the inputs it hashed: an agent resolved
    /// again with equal inputs reuses the hash (the inputs are still read afresh and compared
    /// on every resolution).
    digests: Arc<Mutex<HashMap<String, DigestEntry>>>,
}

/// What an agent's last digest hashed: its spec and model (compared as values, at a fraction
/// of the cost of serializing them) and the plugin and tool lines. A digest therefore names a
/// spec up to value equality: a spec that differs only in ways `==` ignores (`-0.0` for `0.0`,
/// or map order if serde_json's `preserve_order` is on) keeps the digest of the bytes first
/// hashed for it.
struct DigestEntry {
    spec: Arc<AgentSpec>,
    model: Arc<ModelSpec>,
    tail: Vec<u8>,
    digest: Arc<str>,
}

/// The resolver's own claim on the retry section, beside the plugins' claims.
fn retry_claim() -> &'static (String, ConfigSchema) {
    static CLAIM: OnceLock<(String, ConfigSchema)> = OnceLock::new();
    CLAIM.get_or_init(|| (RESOLVER_PLUGIN_ID.to_owned(), retry_schema().clone()))
}

fn retry_schema() -> &'static ConfigSchema {
    static SCHEMA: OnceLock<ConfigSchema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let duration =
            json!({"type": ["string", "integer"], "minimum": 0, "pattern": "^[0-9]+(ms|s|m|h)?$"});
        ConfigSchema::new(
            RETRY_SECTION,
            json!({
                "type": "object",
                "properties": {
                    "max_retries": {"type": "integer", "minimum": 0},
                    "initial_backoff": duration,
                    "max_backoff": duration,
                    "multiplier": {"type": "number", "minimum": 1},
                    "jitter": {"type": "boolean"}
                },
                "additionalProperties": false
            }),
        )
        .unwrap_or_else(|e| unreachable!("the retry schema is a constant and compiles: {e}"))
    })
}

impl Resolver {
    /// A resolver over `registries` with the runtime's built-in plugins.
    pub fn new(registries: Arc<Registries>, builtins: Arc<dyn BuiltinPlugins>) -> Self {
        Self {
            registries,
            builtins,
            delegates: None,
            backends: Vec::new(),
            digests: Arc::default(),
        }
    }

    /// Installs the delegate-tool factory.
    pub fn with_delegate_factory(mut self, factory: Arc<dyn DelegateToolFactory>) -> Self {
        self.delegates = Some(factory);
        self
    }

    /// Adds an execution backend.
    pub fn with_backend(mut self, backend: Arc<dyn ExecutionBackend>) -> Self {
        self.backends.push(backend);
        self
    }

    /// The registries.
    pub fn registries(&self) -> &Arc<Registries> {
        &self.registries
    }

    fn lookup(&self, agent_id: &str) -> Result<Arc<AgentSpec>, ResolveError> {
        let spec = self
            .registries
            .agent(agent_id)
            .ok_or_else(|| ResolveError::AgentNotFound {
                agent_id: agent_id.to_owned(),
            })?;
        spec.validate()
            .map_err(|source| ResolveError::InvalidSpec {
                agent_id: agent_id.to_owned(),
                source,
            })?;
        Ok(spec)
    }

    /// The run plan for `agent_id`: local, or the backend that claims its endpoint.
    pub fn plan(&self, agent_id: &str) -> Result<ResolvedRunPlan, ResolveError> {
        self.plan_with_pool(agent_id, None)
    }

    /// [`Resolver::plan`] for a run that recorded the membership `recorded` of its model pool
    /// when it started (a resume or a recovery): when the agent still names that pool and its
    /// members have changed since, the agent runs on a pool of the recorded members
    /// ([`Registries::resolve_model_with_pool`]; a recorded member that is no longer a
    /// registered model is [`crate::ModelPoolError::RecordedMemberNotFound`]), and its digest
    /// is the one of those members.
    pub fn plan_with_pool(
        &self,
        agent_id: &str,
        recorded: Option<&PoolMembership>,
    ) -> Result<ResolvedRunPlan, ResolveError> {
        let spec = self.lookup(agent_id)?;
        match &spec.endpoint {
            None => Ok(ResolvedRunPlan::Local(Box::new(
                self.resolve_spec(spec, recorded)?,
            ))),
            Some(endpoint) => {
                let backend = self
                    .backends
                    .iter()
                    .find(|b| b.claims(endpoint))
                    .cloned()
                    .ok_or_else(|| ResolveError::NoBackendForEndpoint {
                        agent_id: agent_id.to_owned(),
                        endpoint: endpoint.url.clone(),
                    })?;
                Ok(ResolvedRunPlan::Backend(ResolvedBackendAgent {
                    spec,
                    backend,
                }))
            }
        }
    }

    /// Resolves `agent_id` for the local loop, all or nothing.
    pub fn resolve(&self, agent_id: &str) -> Result<ResolvedAgent, ResolveError> {
        let spec = self.lookup(agent_id)?;
        self.resolve_spec(spec, None)
    }

    fn resolve_spec(
        &self,
        spec: Arc<AgentSpec>,
        recorded: Option<&PoolMembership>,
    ) -> Result<ResolvedAgent, ResolveError> {
        // For the errors (the spec is shared, not copied, by a resolution that succeeds).
        let agent_id = &spec.id;
        if let Some(endpoint) = &spec.endpoint {
            return Err(ResolveError::RemoteAgentNotDirectlyRunnable {
                agent_id: agent_id.clone(),
                endpoint: endpoint.url.clone(),
            });
        }

        // Stage 1: model (or pool), executor, retry.
        let resolved_model = self
            .registries
            .resolve_model_with_pool(&spec.model, recorded)
            .map_err(|e| e.for_agent(agent_id))?;
        let model = resolved_model.spec;
        let pool = resolved_model.pool;
        let mut executor = resolved_model.executor;
        let retry = spec.retry().map_err(|source| ResolveError::InvalidSpec {
            agent_id: agent_id.clone(),
            source,
        })?;
        if retry.max_retries > 0 {
            executor = Arc::new(RetryingExecutor::new(executor, &retry));
        }

        // Stage 2: plugins, built-ins, sections, environment.
        let mut warnings = Vec::new();
        let mut user_plugins = Vec::with_capacity(spec.plugin_ids.len());
        for plugin_id in &spec.plugin_ids {
            match self.registries.plugin(plugin_id) {
                Some(plugin) => user_plugins.push(plugin),
                // A disabled plugin is left out: the agent runs without it.
                None if self.registries.is_plugin_disabled(plugin_id) => {
                    warnings.push(ResolveWarning::DisabledPlugin {
                        plugin_id: plugin_id.clone(),
                    });
                }
                None => {
                    return Err(ResolveError::PluginNotFound {
                        agent_id: agent_id.clone(),
                        plugin_id: plugin_id.clone(),
                    });
                }
            }
        }
        let builtins = self
            .builtins
            .builtin_plugins(&spec, &model)
            .map_err(|message| ResolveError::BuiltinPlugins {
                agent_id: agent_id.clone(),
                message,
            })?;
        let env = ExecutionEnv::from_plugins(&user_plugins, &builtins, &spec.active_hook_filter)
            .map_err(|source| ResolveError::Env {
                agent_id: agent_id.clone(),
                source,
            })?;
        let claims = std::iter::once(retry_claim()).chain(env.config_claims());
        for report in validate_sections(&spec.sections, claims) {
            match report.status {
                SectionStatus::Invalid(violations) => {
                    return Err(ResolveError::InvalidPluginConfig {
                        agent_id: agent_id.clone(),
                        section: report.section,
                        plugin_id: report.claimed_by.unwrap_or_default(),
                        violations,
                    });
                }
                SectionStatus::Unclaimed => warnings.push(ResolveWarning::UnclaimedSection {
                    section: report.section,
                }),
                SectionStatus::Valid | SectionStatus::Missing => {}
            }
        }

        // Stage 3: global tools, delegate tools, plugin tools; conflicts; catalog.
        let mut collected: Vec<ResolvedTool> = self
            .registries
            .global_tools()
            .iter()
            .map(|t| ResolvedTool {
                tool: t.clone(),
                source: ToolSource::Global,
            })
            .collect();
        for provider in self.registries.tool_providers() {
            for tool in provider.tools().iter() {
                push_unique(
                    &mut collected,
                    ResolvedTool {
                        tool: tool.clone(),
                        source: ToolSource::Provider(provider.id().to_owned()),
                    },
                )?;
            }
        }
        for delegate_id in &spec.delegates {
            let delegate = self.registries.agent(delegate_id).ok_or_else(|| {
                ResolveError::DelegateNotFound {
                    agent_id: agent_id.clone(),
                    delegate_id: delegate_id.clone(),
                }
            })?;
            let factory =
                self.delegates
                    .as_ref()
                    .ok_or_else(|| ResolveError::NoDelegateFactory {
                        agent_id: agent_id.clone(),
                        delegate_id: delegate_id.clone(),
                    })?;
            let tool = factory.delegate_tool(&spec, &delegate).map_err(|message| {
                ResolveError::DelegateTool {
                    agent_id: agent_id.clone(),
                    delegate_id: delegate_id.clone(),
                    message,
                }
            })?;
            let tool = RegisteredTool::new(tool).map_err(|source| ResolveError::InvalidTool {
                agent_id: agent_id.clone(),
                source,
            })?;
            push_unique(
                &mut collected,
                ResolvedTool {
                    tool,
                    source: ToolSource::Delegate(delegate_id.clone()),
                },
            )?;
        }
        for plugin_tool in env.tools() {
            let tool = RegisteredTool::new(plugin_tool.tool.clone()).map_err(|source| {
                ResolveError::InvalidTool {
                    agent_id: agent_id.clone(),
                    source,
                }
            })?;
            push_unique(
                &mut collected,
                ResolvedTool {
                    tool,
                    source: ToolSource::Plugin(plugin_tool.plugin_id.to_string()),
                },
            )?;
        }
        let ids: Vec<&str> = collected.iter().map(|t| t.tool.id()).collect();
        let catalog = filter_catalog(&spec, &ids);
        warnings.extend(catalog.warnings);
        if let Ok(Some(permission)) = spec.permission() {
            for (i, rule) in permission.rules.iter().enumerate() {
                let matched: Vec<bool> = ids
                    .iter()
                    .zip(&catalog.keep)
                    .filter(|(id, _)| rule.tool.matches(id))
                    .map(|(_, keep)| *keep)
                    .collect();
                if !matched.is_empty() && matched.iter().all(|k| !k) {
                    warnings.push(ResolveWarning::PermissionRuleForFilteredTool {
                        rule: i,
                        tool: rule.tool.to_string(),
                    });
                }
            }
        }
        let tools: Vec<ResolvedTool> = collected
            .into_iter()
            .zip(catalog.keep)
            .filter_map(|(t, keep)| keep.then_some(t))
            .collect();
        for w in &warnings {
            tracing::warn!(agent = %spec.id, warning = %w, "resolution warning");
        }
        let spec_digest = self.digest(&spec, &model, digest_tail(pool.as_deref(), &env, &tools));
        Ok(ResolvedAgent {
            spec,
            model,
            executor,
            pool,
            env,
            tools,
            warnings,
            spec_digest,
        })
    }

    /// `sha256:<hex>` of the serialized spec, model and `tail`, reusing the agent's last
    /// digest when they are unchanged.
    fn digest(&self, spec: &Arc<AgentSpec>, model: &Arc<ModelSpec>, tail: Vec<u8>) -> Arc<str> {
        let mut digests = self.digests.lock().unwrap_or_else(|e| e.into_inner());
        // The registries' shared specs: the same ones compare equal without reading them.
        if let Some(last) = digests.get(&spec.id)
            && last.tail == tail
            && (Arc::ptr_eq(&last.spec, spec) || last.spec == *spec)
            && (Arc::ptr_eq(&last.model, model) || last.model == *model)
        {
            return last.digest.clone();
        }
        let mut w = awaken_tool::DigestWriter::new();
        // Writing into a hash cannot fail.
        let _ = std::io::Write::write_all(&mut w, &digest_input(spec, model, &tail));
        let digest: Arc<str> = w.finish().into();
        digests.insert(
            spec.id.clone(),
            DigestEntry {
                spec: Arc::clone(spec),
                model: Arc::clone(model),
                tail,
                digest: digest.clone(),
            },
        );
        digest
    }

    /// Reports every recorded registration problem, every model pool that cannot be built
    /// (its spec, a member that is no registered model or is a pool, a member whose provider
    /// is missing), and every agent that fails a dry resolution (its plan, for endpoint-backed
    /// agents), all of them. Of an agent that fails, every id it names that no registry holds
    /// (its model or the model's provider, plugins, delegates) is reported, not only the one
    /// its resolution stopped at.
    pub fn validate(&self) -> Result<(), ValidationFailed> {
        let mut problems: Vec<ValidationProblem> = self
            .registries
            .registration_problems()
            .into_iter()
            .map(ValidationProblem::Registration)
            .collect();
        for pool_id in self.registries.model_pool_ids() {
            if let Err(ModelResolveError::Pool(e)) = self.registries.resolve_model(&pool_id) {
                problems.push(ValidationProblem::ModelPool(e));
            }
        }
        for id in self.registries.agent_ids() {
            let Err(e) = self.plan(&id) else { continue };
            // The resolution stopped at its first failure; the other ids it would have looked
            // up are looked up here. A missing one it stopped at is among them.
            let missing = self.missing_references(&id);
            let stopped_at_missing = matches!(
                e,
                ResolveError::ModelNotFound { .. }
                    | ResolveError::ProviderNotFound { .. }
                    | ResolveError::PluginNotFound { .. }
                    | ResolveError::DelegateNotFound { .. }
            );
            if !stopped_at_missing || missing.is_empty() {
                problems.push(ValidationProblem::Agent(e));
            }
            problems.extend(missing.into_iter().map(ValidationProblem::Agent));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ValidationFailed { problems })
        }
    }

    /// What validation notices that does not fail it, about the registered agents together:
    /// each group of agents that delegate to each other in a circle
    /// ([`ValidationWarning::DelegationCycle`], named by its shortest cycle). A cycle may be
    /// intended, so `validate` does not report it; an agent delegating to itself is an invalid
    /// spec, which `validate` reports.
    pub fn validation_warnings(&self) -> Vec<ValidationWarning> {
        delegation_cycles(&self.registries)
    }

    /// Every id a locally run agent names that no registry holds, in the order resolution
    /// looks them up: the model (or, when it is there, its provider), the plugins, the
    /// delegates. Empty for an agent that is not registered or runs on an endpoint (its plan
    /// reports what is wrong with it).
    fn missing_references(&self, agent_id: &str) -> Vec<ResolveError> {
        let Some(spec) = self.registries.agent(agent_id) else {
            return Vec::new();
        };
        if spec.endpoint.is_some() {
            return Vec::new();
        }
        let mut missing = Vec::new();
        // A pool's own problems are reported with the pool.
        let pool = self.registries.model_pool(&spec.model).is_some();
        match self.registries.model(&spec.model) {
            None if pool => {}
            None => missing.push(ResolveError::ModelNotFound {
                agent_id: spec.id.clone(),
                model_id: spec.model.clone(),
            }),
            Some(model) if self.registries.provider(&model.provider).is_none() => {
                missing.push(ResolveError::ProviderNotFound {
                    agent_id: spec.id.clone(),
                    model_id: model.id.clone(),
                    provider_id: model.provider.clone(),
                });
            }
            Some(_) => {}
        }
        // An id listed twice (an invalid spec) is reported once; a disabled plugin is not
        // missing (resolution leaves it out).
        for (i, plugin_id) in spec.plugin_ids.iter().enumerate() {
            if !spec.plugin_ids[..i].contains(plugin_id)
                && self.registries.plugin(plugin_id).is_none()
                && !self.registries.is_plugin_disabled(plugin_id)
            {
                missing.push(ResolveError::PluginNotFound {
                    agent_id: spec.id.clone(),
                    plugin_id: plugin_id.clone(),
                });
            }
        }
        for (i, delegate_id) in spec.delegates.iter().enumerate() {
            if !spec.delegates[..i].contains(delegate_id)
                && self.registries.agent(delegate_id).is_none()
            {
                missing.push(ResolveError::DelegateNotFound {
                    agent_id: spec.id.clone(),
                    delegate_id: delegate_id.clone(),
                });
            }
        }
        missing
    }
}

fn push_unique(tools: &mut Vec<ResolvedTool>, tool: ResolvedTool) -> Result<(), ResolveError> {
    if let Some(existing) = tools.iter().find(|t| t.tool.id() == tool.tool.id()) {
        return Err(ResolveError::ToolIdConflict {
            id: tool.tool.id().to_owned(),
            first: existing.source.to_string(),
            second: tool.source.to_string(),
        });
    }
    tools.push(tool);
    Ok(())
}

/// The serialized form of what a run uses, which its digest hashes: the spec, the model, the
/// plugins (id and version) and the tool ids. The serialized forms are deterministic (structs
/// in field order, maps sorted), so equal inputs give equal bytes.
/// The bytes a spec digest hashes: the spec, the model, then [`digest_tail`].
fn digest_input(spec: &AgentSpec, model: &ModelSpec, tail: &[u8]) -> Vec<u8> {
    let mut w = Vec::with_capacity(1024);
    // Writing into a vector cannot fail, and these types always serialize.
    let _ = serde_json::to_writer(&mut w, spec);
    w.push(b'\n');
    let _ = serde_json::to_writer(&mut w, model);
    w.extend_from_slice(tail);
    w
}

/// The digest's lines for a model pool's membership (when the model is a pool), the plugins
/// (id and version, in order) and the tools (ids, sorted).
fn digest_tail(
    pool: Option<&PoolMembership>,
    env: &ExecutionEnv,
    tools: &[ResolvedTool],
) -> Vec<u8> {
    let mut w = Vec::with_capacity(256);
    if let Some(pool) = pool {
        digest_lines(pool, &mut w);
    }
    for p in env.plugins() {
        let m = p.manifest();
        w.extend_from_slice(b"\nplugin ");
        w.extend_from_slice(m.id.as_bytes());
        w.push(b'@');
        push_version(&mut w, &m.version);
    }
    let tool_ids: BTreeSet<&str> = tools.iter().map(|t| t.tool.id()).collect();
    for id in tool_ids {
        w.extend_from_slice(b"\ntool ");
        w.extend_from_slice(id.as_bytes());
    }
    w
}

/// Appends `version` as its `Display` writes it (`1.2.3`, then `-pre` and `+build` when
/// present), without the formatting machinery, which is a visible share of a resolution with
/// many plugins (`resolver/resolve_8_plugins_64_tools` in `docs/performance.md`).
fn push_version(w: &mut Vec<u8>, version: &semver::Version) {
    push_decimal(w, version.major);
    w.push(b'.');
    push_decimal(w, version.minor);
    w.push(b'.');
    push_decimal(w, version.patch);
    if !version.pre.is_empty() {
        w.push(b'-');
        w.extend_from_slice(version.pre.as_str().as_bytes());
    }
    if !version.build.is_empty() {
        w.push(b'+');
        w.extend_from_slice(version.build.as_str().as_bytes());
    }
}

fn push_decimal(w: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    w.extend_from_slice(&digits[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha256(bytes: &[u8]) -> String {
        let mut w = awaken_tool::DigestWriter::new();
        let _ = std::io::Write::write_all(&mut w, bytes);
        w.finish()
    }

    #[test]
    fn versions_are_written_as_displayed() {
        for text in [
            "0.1.0",
            "1.2.3",
            "10.200.3000",
            "18446744073709551615.0.9",
            "1.0.0-alpha.1",
            "1.0.0+build.5",
            "2.3.4-rc.1+sha.abc",
        ] {
            let version = semver::Version::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let mut w = Vec::new();
            push_version(&mut w, &version);
            assert_eq!(String::from_utf8_lossy(&w), version.to_string(), "{text}");
        }
    }

    #[test]
    fn a_digest_hashes_its_inputs_and_follows_every_change() {
        let r = Resolver::new(Arc::new(Registries::new()), Arc::new(NoBuiltins));
        let spec = Arc::new(AgentSpec::new("a", "m"));
        let model = Arc::new(ModelSpec::new("m", "p", "upstream"));
        let tail = b"\nplugin x@1".to_vec();
        let first = r.digest(&spec, &model, tail.clone());
        assert_eq!(&*first, sha256(&digest_input(&spec, &model, &tail)));
        // Equal inputs: the same digest (reused), also from equal copies of the specs.
        assert_eq!(r.digest(&spec, &model, tail.clone()), first);
        let (spec_copy, model_copy) = (Arc::new((*spec).clone()), Arc::new((*model).clone()));
        assert_eq!(r.digest(&spec_copy, &model_copy, tail.clone()), first);
        // Any changed input: another digest, the hash of the new inputs.
        let prompted = Arc::new((*spec).clone().with_system_prompt("Be brief."));
        let changed = r.digest(&prompted, &model, tail.clone());
        assert_ne!(changed, first);
        assert_eq!(&*changed, sha256(&digest_input(&prompted, &model, &tail)));
        let other_model = Arc::new(ModelSpec::new("m", "p", "other-upstream"));
        assert_ne!(r.digest(&spec, &other_model, tail.clone()), first);
        assert_ne!(r.digest(&spec, &model, b"\nplugin x@2".to_vec()), first);
        // Back to the first inputs: the first digest again.
        assert_eq!(r.digest(&spec, &model, tail), first);
    }
}
