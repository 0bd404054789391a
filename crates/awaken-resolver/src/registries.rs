//! The five registries (agents, tools, models, providers, plugins) as traits with map-backed
//! implementations, and [`Registries`], which collects them with deferred errors.

use std::collections::BTreeMap;

/// The registries' maps: a fast hash (every resolution looks its model, provider and each
/// plugin up; ids come from the application's own configuration, so SipHash's protection
/// against chosen keys buys nothing here).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
use std::sync::Arc;

use awaken_llm::LlmExecutor;
use awaken_plugin::{Plugin, PluginRegistry};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_tool::{RegisteredTool, Tool};

use crate::error::RegistrationError;

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
#[derive(Clone, Default)]
pub struct Registries {
    pub(crate) agents: MapAgentSpecRegistry,
    pub(crate) tools: MapToolRegistry,
    pub(crate) models: MapModelRegistry,
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
            .field("models", &self.models.0.keys().collect::<Vec<_>>())
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

    /// Adds a model spec.
    pub fn with_model(mut self, model: ModelSpec) -> Self {
        self.add_model(model);
        self
    }

    /// Adds a model spec in place.
    pub fn add_model(&mut self, model: ModelSpec) {
        if self.models.0.contains_key(&model.id) {
            self.duplicate("model", &model.id);
        } else {
            self.models.0.insert(model.id.clone(), Arc::new(model));
        }
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

    /// The model with this id.
    pub fn model(&self, id: &str) -> Option<Arc<ModelSpec>> {
        self.models.get_model(id)
    }

    /// The executor with this provider id.
    pub fn provider(&self, id: &str) -> Option<Arc<dyn LlmExecutor>> {
        self.providers.get_provider(id)
    }

    /// The global tools, in order.
    pub fn global_tools(&self) -> &[RegisteredTool] {
        &self.tools.0
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
