//! The five registries (agents, tools, models, providers, plugins) as traits with map-backed
//! implementations, and [`Registries`], which collects them with deferred errors, along with
//! the model pools (whose ids share the namespace of model ids).

use std::collections::BTreeMap;

/// The registries' maps: a fast hash (every resolution looks its model, provider and each
/// plugin up; ids come from the application's own configuration, so SipHash's protection
/// against chosen keys buys nothing here).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
use std::sync::{Arc, Mutex, OnceLock};

use awaken_llm::LlmExecutor;
use awaken_plugin::{Plugin, PluginRegistry};
use awaken_spec::{AgentSpec, ModelPoolSpec, ModelSpec};
use awaken_tool::{RegisteredTool, Tool, ToolProvider};

use crate::error::{ModelPoolError, ModelResolveError, RegistrationError};
use crate::pools::{
    BuiltPool, MemberParts, PoolEntry, PoolMembership, RecordedMember, ResolvedModel, build_pool,
};

/// Agent specs by id.
pub trait AgentSpecRegistry: Send + Sync {
    /// The spec with this id (shared where the registry keeps it shared: then a resolution per
    /// run reads it without copying it).
    fn get_agent(&self, id: &str) -> Option<Arc<AgentSpec>>;
    /// Every id, sorted.
    fn agent_ids(&self) -> Vec<String>;
}

/// Global tools, in registration order.
pub trait ToolRegistry: Send + Sync {
    /// Every tool, in order.
    fn tools(&self) -> Vec<RegisteredTool>;
}

/// Model specs by id.
pub trait ModelRegistry: Send + Sync {
    /// The model with this id (shared, like agent specs).
    fn get_model(&self, id: &str) -> Option<Arc<ModelSpec>>;
}

/// Model executors by provider id.
pub trait ProviderRegistry: Send + Sync {
    /// The executor with this id.
    fn get_provider(&self, id: &str) -> Option<Arc<dyn LlmExecutor>>;
}

/// Plugins by id.
pub trait PluginSource: Send + Sync {
    /// The plugin with this id.
    fn get_plugin(&self, id: &str) -> Option<Arc<dyn Plugin>>;
}

/// A map of agent specs.
#[derive(Debug, Clone, Default)]
pub struct MapAgentSpecRegistry(BTreeMap<String, Arc<AgentSpec>>);

impl AgentSpecRegistry for MapAgentSpecRegistry {
    fn get_agent(&self, id: &str) -> Option<Arc<AgentSpec>> {
        self.0.get(id).cloned()
    }
    fn agent_ids(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }
}

/// An ordered list of global tools, their schemas compiled once.
#[derive(Debug, Clone, Default)]
pub struct MapToolRegistry(Vec<RegisteredTool>);

impl ToolRegistry for MapToolRegistry {
    fn tools(&self) -> Vec<RegisteredTool> {
        self.0.clone()
    }
}

/// A map of model specs.
#[derive(Debug, Clone, Default)]
pub struct MapModelRegistry(HashMap<String, Arc<ModelSpec>>);

impl ModelRegistry for MapModelRegistry {
    fn get_model(&self, id: &str) -> Option<Arc<ModelSpec>> {
        self.0.get(id).cloned()
    }
}

/// A map of executors.
#[derive(Clone, Default)]
pub struct MapProviderRegistry(HashMap<String, Arc<dyn LlmExecutor>>);

impl ProviderRegistry for MapProviderRegistry {
    fn get_provider(&self, id: &str) -> Option<Arc<dyn LlmExecutor>> {
        self.0.get(id).cloned()
    }
}

/// A map of plugins.
#[derive(Clone, Default)]
pub struct MapPluginSource(HashMap<String, Arc<dyn Plugin>>);

impl PluginSource for MapPluginSource {
    fn get_plugin(&self, id: &str) -> Option<Arc<dyn Plugin>> {
        self.0.get(id).cloned()
    }
}

/// A plugin registry is a plugin source (its current snapshot, so a reload is seen by the next
/// resolution)...
impl PluginSource for PluginRegistry {
    fn get_plugin(&self, id: &str) -> Option<Arc<dyn Plugin>> {
        PluginRegistry::get_plugin(self, id)
    }
}

/// ...and a source of agent definitions (those its plugins contribute).
impl AgentSpecRegistry for PluginRegistry {
    fn get_agent(&self, id: &str) -> Option<Arc<AgentSpec>> {
        self.snapshot()
            .agent_configs()
            .agents
            .get(id)
            .map(|a| Arc::new(a.spec.clone()))
    }
    fn agent_ids(&self) -> Vec<String> {
        self.snapshot()
            .agent_configs()
            .agents
            .keys()
            .cloned()
            .collect()
    }
}

/// The five registries, collected with deferred errors: a duplicate id (or an invalid global
/// tool) is recorded, not returned, and reported by [`Registries::errors`] and by validation.
///
/// Model pools are registered beside the models, under ids of the same namespace. Each pool is
/// built once, when a resolution first needs it, and kept for the registries' lifetime, so its
/// breakers see every run; a pool rebuilt from a membership a run recorded is kept likewise,
/// one per distinct membership.
#[derive(Clone, Default)]
pub struct Registries {
    pub(crate) agents: MapAgentSpecRegistry,
    pub(crate) tools: MapToolRegistry,
    /// Tool sets asked for their tools at each resolution, in registration order.
    pub(crate) tool_providers: Vec<Arc<dyn ToolProvider>>,
    pub(crate) models: MapModelRegistry,
    pub(crate) pools: HashMap<String, PoolEntry>,
    /// Pools rebuilt from a membership a run recorded, by that membership.
    pub(crate) pinned: Arc<Mutex<HashMap<PoolMembership, BuiltPool>>>,
    pub(crate) providers: MapProviderRegistry,
    pub(crate) plugins: MapPluginSource,
    /// Ids of the disabled plugins added directly (held back from the plugin source).
    pub(crate) disabled_plugins: Vec<String>,
    pub(crate) plugin_registries: Vec<Arc<PluginRegistry>>,
    pub(crate) errors: Vec<RegistrationError>,
}

impl std::fmt::Debug for Registries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registries")
            .field("agents", &self.agents.agent_ids())
            .field(
                "tools",
                &self
                    .tools
                    .0
                    .iter()
                    .map(|t| t.id().to_owned())
                    .collect::<Vec<_>>(),
            )
            .field(
                "tool_providers",
                &self
                    .tool_providers
                    .iter()
                    .map(|p| p.id())
                    .collect::<Vec<_>>(),
            )
            .field("models", &self.models.0.keys().collect::<Vec<_>>())
            .field("model_pools", &self.pools.keys().collect::<Vec<_>>())
            .field("providers", &self.providers.0.keys().collect::<Vec<_>>())
            .field("plugins", &self.plugins.0.keys().collect::<Vec<_>>())
            .field("disabled_plugins", &self.disabled_plugins)
            .field("errors", &self.errors)
            .finish()
    }
}

impl Registries {
    /// Empty registries.
    pub fn new() -> Self {
        Self::default()
    }

    fn duplicate(&mut self, kind: &'static str, id: &str) {
        self.errors.push(RegistrationError::Duplicate {
            kind,
            id: id.to_owned(),
        });
    }

    /// Adds an agent spec.
    pub fn with_agent_spec(mut self, spec: AgentSpec) -> Self {
        self.add_agent_spec(spec);
        self
    }

    /// Adds agent specs.
    pub fn with_agent_specs(mut self, specs: impl IntoIterator<Item = AgentSpec>) -> Self {
        for spec in specs {
            self.add_agent_spec(spec);
        }
        self
    }

    /// Adds an agent spec in place.
    pub fn add_agent_spec(&mut self, spec: AgentSpec) {
        if self.agents.0.contains_key(&spec.id) {
            self.duplicate("agent", &spec.id);
        } else {
            self.agents.0.insert(spec.id.clone(), Arc::new(spec));
        }
    }

    /// Adds a global tool (its schema is compiled now; an invalid one is recorded).
    pub fn with_tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.add_tool(tool);
        self
    }

    /// Adds a global tool in place.
    pub fn add_tool(&mut self, tool: Arc<dyn Tool>) {
        match RegisteredTool::new(tool) {
            Ok(t) if self.tools.0.iter().any(|e| e.id() == t.id()) => {
                self.duplicate("tool", t.id())
            }
            Ok(t) => self.tools.0.push(t),
            Err(e) => self
                .errors
                .push(RegistrationError::InvalidTool(e.to_string())),
        }
    }

    /// Adds a tool provider, whose tools each resolution takes as they are then.
    pub fn with_tool_provider(mut self, provider: Arc<dyn ToolProvider>) -> Self {
        self.add_tool_provider(provider);
        self
    }

    /// Adds a tool provider in place (a second one with the same id is recorded as a
    /// duplicate).
    pub fn add_tool_provider(&mut self, provider: Arc<dyn ToolProvider>) {
        if self.tool_providers.iter().any(|p| p.id() == provider.id()) {
            self.duplicate("tool provider", provider.id());
        } else {
            self.tool_providers.push(provider);
        }
    }

    /// Adds a model spec.
    pub fn with_model(mut self, model: ModelSpec) -> Self {
        self.add_model(model);
        self
    }

    /// Adds a model spec in place (its id must be no other model's or pool's).
    pub fn add_model(&mut self, model: ModelSpec) {
        if self.model_id_taken(&model.id) {
            self.duplicate("model", &model.id);
        } else {
            self.models.0.insert(model.id.clone(), Arc::new(model));
        }
    }

    /// Adds a model pool: agents (and context policies) name it like a model.
    pub fn with_model_pool(mut self, pool: ModelPoolSpec) -> Self {
        self.add_model_pool(pool);
        self
    }

    /// Adds a model pool in place. Its id shares the namespace of model ids: an id a model or
    /// another pool has is recorded as a duplicate `model`. The pool is checked (its spec, its
    /// members) by validation and by the first resolution that needs it.
    pub fn add_model_pool(&mut self, pool: ModelPoolSpec) {
        if self.model_id_taken(&pool.id) {
            self.duplicate("model", &pool.id);
        } else {
            self.pools.insert(
                pool.id.clone(),
                PoolEntry {
                    spec: Arc::new(pool),
                    built: OnceLock::new(),
                },
            );
        }
    }

    /// Whether a model or a pool has this id.
    fn model_id_taken(&self, id: &str) -> bool {
        self.models.0.contains_key(id) || self.pools.contains_key(id)
    }

    /// Adds an executor under a provider id.
    pub fn with_provider(mut self, id: impl Into<String>, executor: Arc<dyn LlmExecutor>) -> Self {
        self.add_provider(id, executor);
        self
    }

    /// Adds an executor in place.
    pub fn add_provider(&mut self, id: impl Into<String>, executor: Arc<dyn LlmExecutor>) {
        let id = id.into();
        match self.providers.0.entry(id) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let id = e.key().clone();
                self.duplicate("provider", &id);
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(executor);
            }
        }
    }

    /// Adds a plugin to the plugin source; a disabled one is held back (see
    /// [`Registries::add_plugin`]).
    pub fn with_plugin(mut self, plugin: Arc<dyn Plugin>) -> Self {
        self.add_plugin(plugin);
        self
    }

    /// Adds a plugin in place. A disabled plugin is not added to the plugin source (it is in
    /// no list and gets no hook); only its id is kept, so an agent naming it resolves without
    /// it. Its id still counts against duplicates.
    pub fn add_plugin(&mut self, plugin: Arc<dyn Plugin>) {
        let id = plugin.manifest().id.clone();
        if self.plugin_id_taken(&id) {
            self.duplicate("plugin", &id);
        } else if plugin.manifest().enabled {
            self.plugins.0.insert(id, plugin);
        } else {
            self.disabled_plugins.push(id);
        }
    }

    /// Whether a plugin with this id, enabled or disabled, was added directly or is in a plugin
    /// registry.
    fn plugin_id_taken(&self, id: &str) -> bool {
        self.plugins.0.contains_key(id)
            || self.disabled_plugins.iter().any(|d| d == id)
            || self.plugin_registries.iter().any(|r| {
                let snapshot = r.snapshot();
                snapshot.get_plugin(id).is_some()
                    || snapshot.disabled_plugin_ids().iter().any(|d| d == id)
            })
    }

    /// Adds a plugin registry: a plugin source and a source of agent definitions, read afresh
    /// at every resolution (so its reloads are seen by the next run).
    pub fn with_plugin_registry(mut self, registry: Arc<PluginRegistry>) -> Self {
        self.add_plugin_registry(registry);
        self
    }

    /// Adds a plugin registry in place.
    pub fn add_plugin_registry(&mut self, registry: Arc<PluginRegistry>) {
        let snapshot = registry.snapshot();
        let ids = snapshot
            .list_plugins()
            .iter()
            .map(|p| &p.manifest().id)
            .chain(snapshot.disabled_plugin_ids());
        for id in ids {
            if self.plugin_id_taken(id) {
                self.duplicate("plugin", id);
            }
        }
        self.plugin_registries.push(registry);
    }

    /// The registration errors recorded so far.
    pub fn errors(&self) -> &[RegistrationError] {
        &self.errors
    }

    /// The agent spec with this id: the explicit specs first, then plugin registries in order.
    pub fn agent(&self, id: &str) -> Option<Arc<AgentSpec>> {
        self.agents
            .get_agent(id)
            .or_else(|| self.plugin_registries.iter().find_map(|r| r.get_agent(id)))
    }

    /// Every agent id, sorted and deduplicated.
    pub fn agent_ids(&self) -> Vec<String> {
        let mut ids = self.agents.agent_ids();
        for r in &self.plugin_registries {
            ids.extend(AgentSpecRegistry::agent_ids(r.as_ref()));
        }
        ids.sort();
        ids.dedup();
        ids
    }

    /// Every plugin of the plugin source (enabled ones only): those added directly (by id),
    /// then those of each plugin registry's current snapshot that no earlier one shadows.
    pub fn plugins(&self) -> Vec<Arc<dyn Plugin>> {
        let mut plugins: Vec<Arc<dyn Plugin>> = self.plugins.0.values().cloned().collect();
        plugins.sort_by(|a, b| a.manifest().id.cmp(&b.manifest().id));
        for registry in &self.plugin_registries {
            for plugin in registry.list_plugins() {
                if !plugins
                    .iter()
                    .any(|p| p.manifest().id == plugin.manifest().id)
                {
                    plugins.push(plugin);
                }
            }
        }
        plugins
    }

    /// The plugin registries added (their plugins and agent definitions reload together).
    pub fn plugin_registries(&self) -> &[Arc<PluginRegistry>] {
        &self.plugin_registries
    }

    /// The plugin with this id (`None` for a disabled one).
    pub fn plugin(&self, id: &str) -> Option<Arc<dyn Plugin>> {
        self.plugins
            .get_plugin(id)
            .or_else(|| self.plugin_registries.iter().find_map(|r| r.get_plugin(id)))
    }

    /// Whether `id` names a disabled plugin, added directly or in a plugin registry's current
    /// snapshot (and no enabled plugin has that id).
    pub fn is_plugin_disabled(&self, id: &str) -> bool {
        self.plugin(id).is_none()
            && (self.disabled_plugins.iter().any(|d| d == id)
                || self
                    .plugin_registries
                    .iter()
                    .any(|r| r.snapshot().disabled_plugin_ids().iter().any(|d| d == id)))
    }

    /// The model with this id (a model's own spec; a pool's id gives `None`, see
    /// [`Registries::resolve_model`]).
    pub fn model(&self, id: &str) -> Option<Arc<ModelSpec>> {
        self.models.get_model(id)
    }

    /// The model pool with this id.
    pub fn model_pool(&self, id: &str) -> Option<Arc<ModelPoolSpec>> {
        self.pools.get(id).map(|p| Arc::clone(&p.spec))
    }

    /// Every model pool id, sorted.
    pub fn model_pool_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.pools.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// What the model id `id` resolves to: a model's spec and its provider's executor, or a
    /// pool's derived spec and the pool (the same pool, and so the same breakers, for every
    /// resolution).
    pub fn resolve_model(&self, id: &str) -> Result<ResolvedModel, ModelResolveError> {
        self.resolve_model_with_pool(id, None)
    }

    /// [`Registries::resolve_model`] for a run that recorded `recorded` when it started: when
    /// `id` is the pool `recorded` names and its members have changed since, the result is a
    /// pool of the recorded members (each still a registered model with its provider; its
    /// requests carry the recorded upstream models) under the pool's breaker policy of now.
    /// Otherwise, and when the members are unchanged, the pool of now.
    pub fn resolve_model_with_pool(
        &self,
        id: &str,
        recorded: Option<&PoolMembership>,
    ) -> Result<ResolvedModel, ModelResolveError> {
        let Some(entry) = self.pools.get(id) else {
            let model = self
                .model(id)
                .ok_or_else(|| ModelResolveError::ModelNotFound {
                    model_id: id.to_owned(),
                })?;
            let executor = self.provider(&model.provider).ok_or_else(|| {
                ModelResolveError::ProviderNotFound {
                    model_id: model.id.clone(),
                    provider_id: model.provider.clone(),
                }
            })?;
            return Ok(ResolvedModel {
                spec: model,
                executor,
                pool: None,
            });
        };
        let current = self.current_pool(entry)?;
        match recorded {
            Some(recorded) if recorded.pool == id && *recorded != *current.membership => {
                Ok(self.pinned_pool(&entry.spec, recorded)?.resolved())
            }
            _ => Ok(current.resolved()),
        }
    }

    /// The pool of `entry`, built on first use.
    fn current_pool<'a>(&self, entry: &'a PoolEntry) -> Result<&'a BuiltPool, ModelPoolError> {
        if let Some(built) = entry.built.get() {
            return Ok(built);
        }
        let spec = &entry.spec;
        let pool_id = || spec.id.clone();
        spec.validate()
            .map_err(|source| ModelPoolError::InvalidSpec {
                pool_id: pool_id(),
                source,
            })?;
        let mut members = Vec::with_capacity(spec.members.len());
        for member in &spec.members {
            if self.pools.contains_key(&member.model) {
                return Err(ModelPoolError::NestedPool {
                    pool_id: pool_id(),
                    member: member.model.clone(),
                });
            }
            let model =
                self.model(&member.model)
                    .ok_or_else(|| ModelPoolError::MemberNotFound {
                        pool_id: pool_id(),
                        member: member.model.clone(),
                    })?;
            let recorded = RecordedMember {
                model: member.model.clone(),
                upstream_model: model.upstream_model.clone(),
                weight: member.weight,
                fallback_only: member.fallback_only,
            };
            members.push(self.member_parts(spec, recorded, model)?);
        }
        let built = build_pool(spec, members)?;
        // Two first resolutions at once may both build; the first one stored is kept by all.
        Ok(entry.built.get_or_init(|| built))
    }

    /// The pool of `spec` over the members `recorded` lists, built once per membership.
    fn pinned_pool(
        &self,
        spec: &ModelPoolSpec,
        recorded: &PoolMembership,
    ) -> Result<BuiltPool, ModelPoolError> {
        if let Some(built) = self.pinned_lock().get(recorded) {
            return Ok(built.clone());
        }
        let mut members = Vec::with_capacity(recorded.members.len());
        for member in &recorded.members {
            // A member that is now a pool, or nothing, is no longer a registered model.
            let model = self.model(&member.model).ok_or_else(|| {
                ModelPoolError::RecordedMemberNotFound {
                    pool_id: spec.id.clone(),
                    member: member.model.clone(),
                }
            })?;
            members.push(self.member_parts(spec, member.clone(), model)?);
        }
        let built = build_pool(spec, members)?;
        Ok(self
            .pinned_lock()
            .entry(recorded.clone())
            .or_insert(built)
            .clone())
    }

    fn pinned_lock(&self) -> std::sync::MutexGuard<'_, HashMap<PoolMembership, BuiltPool>> {
        self.pinned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A member of pool `spec` with the executor of `model`'s provider.
    fn member_parts(
        &self,
        spec: &ModelPoolSpec,
        recorded: RecordedMember,
        model: Arc<ModelSpec>,
    ) -> Result<MemberParts, ModelPoolError> {
        let executor =
            self.provider(&model.provider)
                .ok_or_else(|| ModelPoolError::ProviderNotFound {
                    pool_id: spec.id.clone(),
                    member: model.id.clone(),
                    provider_id: model.provider.clone(),
                })?;
        Ok(MemberParts {
            recorded,
            model,
            executor,
        })
    }

    /// The executor with this provider id.
    pub fn provider(&self, id: &str) -> Option<Arc<dyn LlmExecutor>> {
        self.providers.get_provider(id)
    }

    /// The global tools, in order.
    pub fn global_tools(&self) -> &[RegisteredTool] {
        &self.tools.0
    }

    /// The tool providers, in order.
    pub fn tool_providers(&self) -> &[Arc<dyn ToolProvider>] {
        &self.tool_providers
    }

    /// Registration problems to report at validation: recorded errors, agents defined both
    /// explicitly and by a plugin registry, and plugin batches a registry refused.
    pub(crate) fn registration_problems(&self) -> Vec<RegistrationError> {
        let mut problems = self.errors.clone();
        for r in &self.plugin_registries {
            let configs = r.build_agent_configs();
            for id in configs.agents.keys() {
                if self.agents.0.contains_key(id) {
                    problems.push(RegistrationError::Duplicate {
                        kind: "agent",
                        id: id.clone(),
                    });
                }
            }
            problems.extend(
                configs
                    .rejected
                    .iter()
                    .map(|e| RegistrationError::from(e.as_ref())),
            );
        }
        problems
    }
}
