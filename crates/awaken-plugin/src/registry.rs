//! The plugin registry: plugins from a list, a configurator and directories, the
//! agent definitions they contribute, and atomic reload.
//!
//! A disabled plugin (`enabled = false`) is held back where plugins enter a snapshot: it is
//! loaded and its id counts against duplicates, but no accessor returns it, it is not ordered,
//! contributes no agent definitions and gets no `on_reload`; only its id is kept, so that a
//! caller can tell a disabled plugin from an unknown one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use awaken_spec::AgentSpec;

use crate::declarative::load_dir;
use crate::error::{ContributionKind, LoadError, PluginError, RegistryError};
use crate::isolate::{isolate, isolate_async};
use crate::order::execution_order;
use crate::plugin::{AgentBuildContext, OnConflict, Plugin};

/// A configurator: registers plugins into a fresh set; re-run on every reload.
pub type Configurator = Arc<dyn Fn(&mut PluginSet) -> Result<(), PluginError> + Send + Sync>;

/// Plugins being collected by a configurator.
#[derive(Default)]
pub struct PluginSet {
    plugins: Vec<Arc<dyn Plugin>>,
}

impl PluginSet {
    /// Adds a plugin to the set.
    pub fn register_bundle(&mut self, plugin: Arc<dyn Plugin>) {
        self.plugins.push(plugin);
    }
}

enum Source {
    Instances(Vec<Arc<dyn Plugin>>),
    Configurator(Configurator),
    Directory(PathBuf),
}

/// An agent definition in the registry, with the plugin that contributed it.
#[derive(Debug, Clone, PartialEq)]
pub struct RegisteredAgent {
    /// The agent.
    pub spec: AgentSpec,
    /// The contributing plugin.
    pub plugin_id: String,
}

/// The agent definitions built from the registry's plugins.
#[derive(Debug, Clone, Default)]
pub struct AgentConfigs {
    /// The registry version they were built from.
    pub version: u64,
    /// Definitions by agent id.
    pub agents: BTreeMap<String, RegisteredAgent>,
    /// Plugin batches refused (a conflict whose `on_conflict` is `error`, an invalid spec, a
    /// plugin whose `agent_definitions` failed or panicked); nothing of a refused batch was
    /// applied.
    pub rejected: Vec<Arc<RegistryError>>,
}

/// One immutable state of the registry: enabled plugins in execution order and their agents.
/// Holders of a snapshot keep it unchanged across reloads.
pub struct RegistrySnapshot {
    /// Increases with every registration and successful reload.
    pub version: u64,
    /// Enabled plugins only.
    plugins: Vec<Arc<dyn Plugin>>,
    /// Ids of the disabled plugins, in registration order.
    disabled: Vec<String>,
    agents: AgentConfigs,
}

impl RegistrySnapshot {
    /// The enabled plugin with this id (`None` for a disabled one).
    pub fn get_plugin(&self, plugin_id: &str) -> Option<Arc<dyn Plugin>> {
        self.plugins
            .iter()
            .find(|p| p.manifest().id == plugin_id)
            .cloned()
    }

    /// Every enabled plugin, in execution order.
    pub fn list_plugins(&self) -> &[Arc<dyn Plugin>] {
        &self.plugins
    }

    /// The ids of the plugins loaded but disabled, in registration order: they are in no list,
    /// define no agent and get no hook.
    pub fn disabled_plugin_ids(&self) -> &[String] {
        &self.disabled
    }

    /// The agent definitions (of enabled plugins).
    pub fn agent_configs(&self) -> &AgentConfigs {
        &self.agents
    }
}

impl std::fmt::Debug for RegistrySnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self
            .plugins
            .iter()
            .map(|p| p.manifest().id.as_str())
            .collect();
        f.debug_struct("RegistrySnapshot")
            .field("version", &self.version)
            .field("plugins", &ids)
            .field("disabled", &self.disabled)
            .finish()
    }
}

/// What a reload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// A new snapshot was swapped in, at this version.
    Applied {
        /// The new version.
        version: u64,
    },
    /// This reload id was already applied; nothing changed.
    AlreadyApplied,
}

/// Plugins for agent workers: register bundles directly, through a configurator or
/// from directories of declarative manifests; build the agent definitions they contribute;
/// reload atomically.
pub struct PluginRegistry {
    sources: Mutex<Vec<Source>>,
    current: RwLock<Arc<RegistrySnapshot>>,
    last_reload: Mutex<Option<String>>,
}

impl Default for PluginRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for PluginRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginRegistry")
            .field("current", &*self.snapshot())
            .finish_non_exhaustive()
    }
}

impl PluginRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self {
            sources: Mutex::new(Vec::new()),
            current: RwLock::new(Arc::new(RegistrySnapshot {
                version: 0,
                plugins: Vec::new(),
                disabled: Vec::new(),
                agents: AgentConfigs::default(),
            })),
            last_reload: Mutex::new(None),
        }
    }

    /// A registry holding `plugins`; a duplicate id is refused.
    pub fn from_plugins(plugins: Vec<Arc<dyn Plugin>>) -> Result<Self, RegistryError> {
        let registry = Self::new();
        for p in plugins {
            registry.register_bundle(p)?;
        }
        Ok(registry)
    }

    /// A registry filled by `configurator`, which is re-run on every reload.
    pub fn from_configurator(
        configurator: impl Fn(&mut PluginSet) -> Result<(), PluginError> + Send + Sync + 'static,
    ) -> Result<Self, RegistryError> {
        let registry = Self::new();
        registry.add_source(Source::Configurator(Arc::new(configurator)))?;
        Ok(registry)
    }

    /// Registers one plugin. A second plugin with the same id is refused.
    pub fn register_bundle(&self, plugin: Arc<dyn Plugin>) -> Result<(), RegistryError> {
        self.add_source(Source::Instances(vec![plugin]))
    }

    /// Loads every `*.toml` declarative plugin manifest in `dir` (sorted by file name); the
    /// directory is read again on every reload. One bad entry — a manifest that does not
    /// parse, or an entry that cannot be read as a file (see [`load_dir`](crate::load_dir)) —
    /// fails the whole load, naming it (and the line, or the cause), with nothing registered.
    pub fn load_dir(&self, dir: impl AsRef<Path>) -> Result<(), LoadError> {
        let dir = dir.as_ref().to_path_buf();
        // Parse first, so a bad file registers nothing.
        load_dir(&dir)?;
        self.add_source(Source::Directory(dir.clone()))
            .map_err(|source| LoadError::Plugin { path: dir, source })
    }

    fn add_source(&self, source: Source) -> Result<(), RegistryError> {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        sources.push(source);
        match build(&sources, self.snapshot().version + 1) {
            Ok(snapshot) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(snapshot);
                Ok(())
            }
            Err(e) => {
                sources.pop();
                Err(e)
            }
        }
    }

    /// The current snapshot (cheap: shared).
    pub fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The enabled plugin with this id, in the current snapshot.
    pub fn get_plugin(&self, plugin_id: &str) -> Option<Arc<dyn Plugin>> {
        self.snapshot().get_plugin(plugin_id)
    }

    /// Every enabled plugin of the current snapshot, in execution order.
    pub fn list_plugins(&self) -> Vec<Arc<dyn Plugin>> {
        self.snapshot().plugins.clone()
    }

    /// The agent definitions of the current snapshot (contributed by enabled plugins).
    pub fn build_agent_configs(&self) -> AgentConfigs {
        self.snapshot().agents.clone()
    }

    /// Rebuilds the registry from its sources (configurators re-run, directories re-read),
    /// calls every new enabled plugin's `on_reload(reload_id)` in order, and swaps the new
    /// snapshot in only if all succeed (an `on_reload` that panics fails, as
    /// [`PluginError::Panicked`] in [`RegistryError::ReloadFailed`]). A repeated `reload_id`
    /// is a no-op. Holders of the old snapshot keep it unchanged; the next run sees the new
    /// one.
    pub async fn reload(&self, reload_id: &str) -> Result<ReloadOutcome, RegistryError> {
        if self
            .last_reload
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
            == Some(reload_id)
        {
            return Ok(ReloadOutcome::AlreadyApplied);
        }
        let version = self.snapshot().version + 1;
        let snapshot = {
            let sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
            build(&sources, version)?
        };
        let mut failures = Vec::new();
        for plugin in &snapshot.plugins {
            // A panic is the plugin's refusal, like an error.
            let id = plugin.manifest().id.as_str();
            let reloaded =
                isolate_async(id, "on_reload", async { plugin.on_reload(reload_id).await });
            if let Err(e) = reloaded.await.and_then(|r| r) {
                failures.push(e);
            }
        }
        if !failures.is_empty() {
            return Err(RegistryError::ReloadFailed {
                reload_id: reload_id.to_owned(),
                failures,
            });
        }
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(snapshot);
        *self.last_reload.lock().unwrap_or_else(|e| e.into_inner()) = Some(reload_id.to_owned());
        Ok(ReloadOutcome::Applied { version })
    }
}

/// Collects the plugins of every source, holds the disabled ones back, orders the enabled ones
/// and builds their agent definitions.
fn build(sources: &[Source], version: u64) -> Result<RegistrySnapshot, RegistryError> {
    let mut plugins: Vec<Arc<dyn Plugin>> = Vec::new();
    for source in sources {
        match source {
            Source::Instances(list) => plugins.extend(list.iter().cloned()),
            Source::Configurator(f) => {
                let mut set = PluginSet::default();
                f(&mut set)?;
                plugins.extend(set.plugins);
            }
            Source::Directory(dir) => {
                let loaded = load_dir(dir).map_err(|e| RegistryError::Load(Box::new(e)))?;
                plugins.extend(loaded);
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    for p in &plugins {
        if !seen.insert(p.manifest().id.clone()) {
            return Err(RegistryError::DuplicatePlugin {
                plugin_id: p.manifest().id.clone(),
            });
        }
    }
    // Ids are unique across enabled and disabled plugins alike (checked above); past this
    // point a disabled plugin is only its id.
    let (plugins, disabled): (Vec<_>, Vec<_>) =
        plugins.into_iter().partition(|p| p.manifest().enabled);
    let disabled = disabled.iter().map(|p| p.manifest().id.clone()).collect();
    // The registry lists every enabled plugin; ordering needs all dependencies present, so if
    // one is missing (or disabled) the plugins are listed in registration order (the
    // environment build reports the missing dependency when an agent uses it).
    let ordered = match execution_order(&plugins) {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "plugins listed in registration order");
            plugins
        }
    };
    let agents = build_agents(&ordered, version);
    Ok(RegistrySnapshot {
        version,
        plugins: ordered,
        disabled,
        agents,
    })
}

/// Each plugin, in order, contributes a batch through the build context; a batch applies all
/// or nothing.
fn build_agents(plugins: &[Arc<dyn Plugin>], version: u64) -> AgentConfigs {
    let mut configs = AgentConfigs {
        version,
        ..AgentConfigs::default()
    };
    let mut order: Vec<String> = Vec::new();
    for plugin in plugins {
        let id = plugin.manifest().id.clone();
        let mut ctx = AgentBuildContext {
            agents: order
                .iter()
                .filter_map(|a| configs.agents.get(a))
                .map(|r| r.spec.clone())
                .collect(),
        };
        let before: Vec<AgentSpec> = ctx.agents.clone();
        match apply_batch(plugin.as_ref(), &mut ctx, &before, &configs) {
            Ok(next) => {
                order = next.iter().map(|(a, _)| a.clone()).collect();
                configs.agents = next.into_iter().collect();
            }
            Err(e) => {
                tracing::error!(plugin = %id, error = %e, "agent definitions refused");
                configs.rejected.push(Arc::new(e));
            }
        }
    }
    configs
}

type Batch = Vec<(String, RegisteredAgent)>;

fn apply_batch(
    plugin: &dyn Plugin,
    ctx: &mut AgentBuildContext,
    before: &[AgentSpec],
    configs: &AgentConfigs,
) -> Result<Batch, RegistryError> {
    let plugin_id = plugin.manifest().id.clone();
    let definitions = isolate(&plugin_id, "agent_definitions", || {
        plugin.agent_definitions(ctx)
    })??;
    // The list after the plugin's replacement (if it replaced it), keeping who defined what.
    let mut next: Batch = Vec::new();
    for spec in &ctx.agents {
        let owner = if before.contains(spec) {
            configs
                .agents
                .get(&spec.id)
                .map_or_else(|| plugin_id.clone(), |r| r.plugin_id.clone())
        } else {
            plugin_id.clone()
        };
        next.push((
            spec.id.clone(),
            RegisteredAgent {
                spec: spec.clone(),
                plugin_id: owner,
            },
        ));
    }
    let bound = &plugin.manifest().bound;
    for def in definitions {
        let agent_id = def.spec.id.clone();
        if !bound.allows(ContributionKind::AgentDefinition, &agent_id) {
            return Err(RegistryError::Plugin(PluginError::Hook {
                plugin_id,
                hook: "agent_definitions".into(),
                message: format!("agent `{agent_id}` is outside the plugin's capability bound"),
            }));
        }
        def.spec
            .validate()
            .map_err(|source| PluginError::AgentSpec {
                plugin_id: plugin_id.clone(),
                agent_id: agent_id.clone(),
                source,
            })?;
        let entry = RegisteredAgent {
            spec: def.spec,
            plugin_id: plugin_id.clone(),
        };
        match next.iter().position(|(a, _)| a == &agent_id) {
            None => next.push((agent_id, entry)),
            Some(i) => match def.on_conflict {
                OnConflict::Error => {
                    return Err(RegistryError::AgentConflict {
                        agent_id,
                        plugin_id,
                    });
                }
                OnConflict::Skip => {}
                OnConflict::Overwrite => next[i] = (agent_id, entry),
            },
        }
    }
    Ok(next)
}
