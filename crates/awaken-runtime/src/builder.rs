//! [`AgentRuntimeBuilder`]: collects the registries and settings of a runtime, then builds an
//! [`AgentRuntime`] (with every agent dry-resolved, or unchecked).

use std::sync::Arc;

use awaken_llm::LlmExecutor;
use awaken_plugin::{LifecycleDispatcher, Plugin, PluginRegistry};
use awaken_resolver::{
    ExecutionBackend, RegistrationError, Registries, Resolver, ValidationFailed,
};
use awaken_spec::{AgentSpec, ModelPoolSpec, ModelSpec};
use awaken_store::{MemoryStore, ThreadStore};
use awaken_tool::{Tool, ToolProvider};

use crate::builtins::RuntimeBuiltins;
use crate::delegate::{DEFAULT_MAX_DELEGATION_DEPTH, DelegateFactory};
use crate::ids::{IdSource, SystemIds};
use crate::inner::{RuntimeInner, Worker};
use crate::permission::PermissionPlugin;
use crate::runtime::AgentRuntime;

/// Why `build` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Duplicate ids or invalid registrations, from `build_unchecked` (`build` reports them
    /// with every other problem, as `ValidationFailed`).
    #[error("registration failed: {}", errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Registration {
        /// Every recorded error.
        errors: Vec<RegistrationError>,
    },
    /// Every problem `build` found: registration errors and agents that fail their dry
    /// resolution, all of them.
    #[error(transparent)]
    ValidationFailed(#[from] ValidationFailed),
}

/// Collects registries and settings, then builds an [`AgentRuntime`].
pub struct AgentRuntimeBuilder {
    registries: Registries,
    ids: Arc<dyn IdSource>,
    store: Arc<dyn ThreadStore>,
    /// The context plugins' token estimator (`None`: the default estimator).
    estimator: Option<Arc<dyn awaken_context::TokenEstimator>>,
    /// Execution backends for endpoint-backed agents.
    backends: Vec<Arc<dyn ExecutionBackend>>,
    worker: Option<Worker>,
    /// The deepest a delegate's child run may be below its root run.
    max_delegation_depth: u32,
    /// Whether `chat` spans record message content.
    span_content: bool,
}

impl Default for AgentRuntimeBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentRuntimeBuilder {
    /// An empty builder with system ids.
    pub fn new() -> Self {
        let mut registries = Registries::new();
        // The standard permission plugin is in every runtime's plugin source; agents turn it
        // on by listing it.
        registries.add_plugin(Arc::new(PermissionPlugin::default()));
        Self {
            registries,
            ids: Arc::new(SystemIds::default()),
            store: Arc::new(MemoryStore::new()),
            estimator: None,
            backends: Vec::new(),
            worker: None,
            max_delegation_depth: DEFAULT_MAX_DELEGATION_DEPTH,
            span_content: false,
        }
    }

    /// Adds an agent spec.
    pub fn with_agent_spec(mut self, spec: AgentSpec) -> Self {
        self.registries.add_agent_spec(spec);
        self
    }

    /// Adds agent specs.
    pub fn with_agent_specs(mut self, specs: impl IntoIterator<Item = AgentSpec>) -> Self {
        for s in specs {
            self.registries.add_agent_spec(s);
        }
        self
    }

    /// Adds a global tool.
    pub fn with_tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.registries.add_tool(tool);
        self
    }

    /// Adds a tool provider (the tools of an MCP server): each run takes its tools as they
    /// are when the run is resolved.
    pub fn with_tool_provider(mut self, provider: Arc<dyn ToolProvider>) -> Self {
        self.registries.add_tool_provider(provider);
        self
    }

    /// Adds a model.
    pub fn with_model(mut self, model: ModelSpec) -> Self {
        self.registries.add_model(model);
        self
    }

    /// Adds a model pool: agents and context policies name it like a model. It is built once,
    /// so its breakers see every run of the runtime; a run records its members when it starts,
    /// and its resume or recovery runs on those members even if the pool has changed since.
    pub fn with_model_pool(mut self, pool: ModelPoolSpec) -> Self {
        self.registries.add_model_pool(pool);
        self
    }

    /// Adds a provider executor.
    pub fn with_provider(mut self, id: impl Into<String>, executor: Arc<dyn LlmExecutor>) -> Self {
        self.registries.add_provider(id, executor);
        self
    }

    /// Adds a plugin to the plugin source.
    pub fn with_plugin(mut self, plugin: Arc<dyn Plugin>) -> Self {
        self.registries.add_plugin(plugin);
        self
    }

    /// Adds a plugin registry (plugins and agent definitions).
    pub fn with_plugin_registry(mut self, registry: Arc<PluginRegistry>) -> Self {
        self.registries.add_plugin_registry(registry);
        self
    }

    /// Adds an execution backend: agents whose endpoint it claims run through it.
    pub fn with_backend(mut self, backend: Arc<dyn ExecutionBackend>) -> Self {
        self.backends.push(backend);
        self
    }

    /// Gives the runtime a worker identity: every run it starts or resumes then holds a lease
    /// on the store (renewed every third of `lease_duration`, released at the end), so that a
    /// `recover` in another process never takes a live run over and two processes never
    /// resume one waiting run. Use it whenever several processes share a store.
    pub fn with_worker(
        mut self,
        worker_id: impl Into<String>,
        lease_duration: std::time::Duration,
    ) -> Self {
        self.worker = Some(Worker {
            id: worker_id.into(),
            lease_duration,
        });
        self
    }

    /// Sets how deep below its root run a delegate's child run may be (default
    /// [`DEFAULT_MAX_DELEGATION_DEPTH`]; a root run is at depth 0, its child at 1). A delegate
    /// call from a run at this depth starts no child: the model gets an error result naming
    /// the limit. 0 turns delegation off.
    pub fn with_max_delegation_depth(mut self, depth: u32) -> Self {
        self.max_delegation_depth = depth;
        self
    }

    /// Makes each inference's `chat` span record the messages sent and received, as the
    /// OpenTelemetry GenAI conventions' `gen_ai.input.messages`, `gen_ai.output.messages` and
    /// `gen_ai.system_instructions` (JSON). Off by default: message content (the user's, the
    /// model's, tool arguments and results, the system prompt) is then on no span, and costs
    /// nothing. Turn on only where the spans' destination may hold that content.
    pub fn with_span_content(mut self, on: bool) -> Self {
        self.span_content = on;
        self
    }

    /// Sets the thread store (default: a [`MemoryStore`]).
    pub fn with_store(mut self, store: Arc<dyn ThreadStore>) -> Self {
        self.store = store;
        self
    }

    /// Sets the id and clock source.
    pub fn with_ids(mut self, ids: Arc<dyn IdSource>) -> Self {
        self.ids = ids;
        self
    }

    /// Sets the token estimator of the context plugins, used by agents with a
    /// `context_policy` (default: `awaken_context::DefaultEstimator`).
    pub fn with_token_estimator(
        mut self,
        estimator: Arc<dyn awaken_context::TokenEstimator>,
    ) -> Self {
        self.estimator = Some(estimator);
        self
    }

    /// Builds the runtime and dry-resolves every agent; every problem is reported at once
    /// ([`BuildError::ValidationFailed`]: the recorded registration errors, such as duplicate
    /// ids, and every agent's resolution failures). What validation notices without failing
    /// (agents delegating to each other in a cycle, `Resolver::validation_warnings`) is logged
    /// as a warning.
    pub fn build(self) -> Result<AgentRuntime, BuildError> {
        let runtime = self.assemble();
        runtime.resolver().validate()?;
        for warning in runtime.resolver().validation_warnings() {
            tracing::warn!(%warning, "agent validation");
        }
        Ok(runtime)
    }

    /// Builds without the dry resolution; duplicate ids are still reported
    /// ([`BuildError::Registration`]).
    pub fn build_unchecked(self) -> Result<AgentRuntime, BuildError> {
        if !self.registries.errors().is_empty() {
            return Err(BuildError::Registration {
                errors: self.registries.errors().to_vec(),
            });
        }
        Ok(self.assemble())
    }

    /// The runtime over the registries as they are (their recorded errors not looked at).
    fn assemble(self) -> AgentRuntime {
        let registries = Arc::new(self.registries);
        let mut builtins = RuntimeBuiltins::new(registries.clone());
        if let Some(estimator) = self.estimator {
            builtins = builtins.with_estimator(estimator);
        }
        let delegates = DelegateFactory::new(self.max_delegation_depth);
        let mut resolver = Resolver::new(registries, Arc::new(builtins))
            .with_delegate_factory(Arc::new(delegates.clone()));
        for backend in self.backends {
            resolver = resolver.with_backend(backend);
        }
        let inner = Arc::new(RuntimeInner {
            resolver,
            ids: self.ids,
            store: self.store,
            lifecycle: LifecycleDispatcher::default(),
            active: Arc::default(),
            worker: self.worker,
            span_content: self.span_content,
        });
        delegates.bind(&inner);
        AgentRuntime::from_inner(inner)
    }
}

impl AgentRuntime {
    /// A builder.
    pub fn builder() -> AgentRuntimeBuilder {
        AgentRuntimeBuilder::new()
    }
}
