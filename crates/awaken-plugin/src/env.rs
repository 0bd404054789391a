//! `ExecutionEnv`: the execution environment a run resolves, built from the agent's plugins
//! and the built-ins in the one plugin order.

use std::collections::BTreeSet;
use std::sync::Arc;

use awaken_phase::{ENGINE_KEY_COUNT, PhaseEnv, register_engine_keys};
use awaken_state::KeyRegistry;
use awaken_tool::Tool;

use crate::config::ConfigSchema;
use crate::error::{ContributionKind, EnvError, PluginError};
use crate::gate::ToolGateHook;
use crate::isolate::isolate;
use crate::order::execution_order;
use crate::plugin::Plugin;
use crate::registrar::PluginRegistrar;
use crate::transform::RegisteredTransform;

/// Hash maps of one environment build (short string keys, hashed many times per resolution).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A tool contributed by a plugin.
#[derive(Clone)]
pub struct PluginTool {
    /// The contributing plugin.
    pub plugin_id: Arc<str>,
    /// The tool.
    pub tool: Arc<dyn Tool>,
}

/// A tool-gate hook as installed.
#[derive(Clone)]
pub struct RegisteredGateHook {
    /// The contributing plugin.
    pub plugin_id: Arc<str>,
    /// The hook's name.
    pub name: Arc<str>,
    /// The hook.
    pub hook: Arc<dyn ToolGateHook>,
}

/// Everything a run executes against: the ordered plugins, the phase environment, the state
/// keys (the engine's included), plugin tools, gate hooks, transforms and config claims.
#[derive(Clone)]
pub struct ExecutionEnv {
    plugins: Vec<Arc<dyn Plugin>>,
    /// Whether `plugins[i]` contributes behaviour (a flag per plugin: no copy of its id).
    active: Vec<bool>,
    phase_env: Arc<PhaseEnv>,
    keys: Arc<KeyRegistry>,
    tools: Vec<PluginTool>,
    gate_hooks: Vec<RegisteredGateHook>,
    transforms: Vec<RegisteredTransform>,
    config_claims: Vec<(String, ConfigSchema)>,
}

impl std::fmt::Debug for ExecutionEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutionEnv")
            .field("plugins", &self.plugin_ids())
            .field(
                "active",
                &self
                    .plugins
                    .iter()
                    .zip(&self.active)
                    .filter(|(_, active)| **active)
                    .map(|(p, _)| p.manifest().id.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("keys", &self.keys.len())
            .field(
                "tools",
                &self
                    .tools
                    .iter()
                    .map(|t| t.tool.descriptor().id)
                    .collect::<Vec<_>>(),
            )
            .field(
                "gate_hooks",
                &self
                    .gate_hooks
                    .iter()
                    .map(|g| format!("{}/{}", g.plugin_id, g.name))
                    .collect::<Vec<_>>(),
            )
            .field(
                "transforms",
                &self
                    .transforms
                    .iter()
                    .map(|t| format!("{}/{}", t.plugin_id, t.transform.name()))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A phase environment's error, a key taken twice as the environment's
/// [`EnvError::DuplicateContribution`] of `kind`.
fn duplicate(e: awaken_phase::PhaseEnvError, kind: ContributionKind) -> EnvError {
    use awaken_phase::PhaseEnvError::{DuplicateAction, DuplicateEffect};
    match e {
        DuplicateAction { key, first, second } | DuplicateEffect { key, first, second } => {
            EnvError::DuplicateContribution {
                kind,
                name: key,
                first,
                second,
            }
        }
        other => other.into(),
    }
}

fn outside(plugin_id: &str, kind: ContributionKind, name: impl Into<String>) -> EnvError {
    EnvError::OutsideBound {
        plugin_id: plugin_id.to_owned(),
        kind,
        name: name.into(),
    }
}

impl ExecutionEnv {
    /// Builds the environment. `user_plugins` are the agent's plugins in its `plugin_ids`
    /// order, `builtin_plugins` the runtime's (always active); disabled plugins are skipped;
    /// the order is the one plugin order (a stable topological sort by `depends_on`, higher
    /// `priority` first among ready plugins). `active_hook_filter` empty means every plugin
    /// contributes behaviour; otherwise only listed plugins (and the built-ins) do. Structural
    /// parts are installed for every plugin. A plugin whose `register` or `config_schemas`
    /// fails or panics fails the build ([`EnvError::Plugin`], a panic as
    /// [`PluginError::Panicked`]).
    pub fn from_plugins(
        user_plugins: &[Arc<dyn Plugin>],
        builtin_plugins: &[Arc<dyn Plugin>],
        active_hook_filter: &[String],
    ) -> Result<Self, EnvError> {
        let enabled: Vec<Arc<dyn Plugin>> = user_plugins
            .iter()
            .chain(builtin_plugins)
            .filter(|p| p.manifest().enabled)
            .cloned()
            .collect();
        for p in &enabled {
            p.manifest().validate()?;
        }
        let plugins = execution_order(&enabled)?;

        // Room for the engine's keys and three per plugin (the built-ins register two or three):
        // growing the registry would reallocate its entries (with glibc, every `realloc` takes
        // an arena lock other threads contend for), and much room to spare is memory every run
        // holds.
        let mut keys = KeyRegistry::with_capacity(ENGINE_KEY_COUNT + 3 * plugins.len());
        register_engine_keys(&mut keys).map_err(EnvError::EngineKeys)?;
        // Each key's owner (for the error naming both owners of a name).
        let mut key_owner: HashMap<&'static str, &str> =
            HashMap::with_capacity_and_hasher(keys.capacity(), Default::default());
        key_owner.extend(keys.keys().map(|k| (k.name, "awaken-phase")));
        let mut phase_env = PhaseEnv::new();
        // Owners are the plugins' ids, borrowed from `plugins` (no copy per contribution).
        let mut tool_owner: HashMap<String, &str> = HashMap::default();
        // The parts of the environment, put together at the end (placeholders for the shared
        // registry and phase environment would be two allocations thrown away).
        let mut env_plugins = Vec::with_capacity(plugins.len());
        let mut env_active = Vec::with_capacity(plugins.len());
        let mut env_tools = Vec::new();
        let mut env_gate_hooks = Vec::new();
        let mut env_transforms = Vec::new();
        let mut env_config_claims = Vec::new();

        let mut registrar: Option<PluginRegistrar> = None;
        for plugin in &plugins {
            let manifest = plugin.manifest();
            let id = manifest.id.as_str();
            let bound = &manifest.bound;
            // One registrar for every plugin, emptied in between: its lists keep their room
            // (a fresh one per plugin allocated each list again).
            let r = match &mut registrar {
                Some(r) => {
                    r.restart(id);
                    r
                }
                None => registrar.insert(PluginRegistrar::new(id)),
            };
            isolate(id, "register", || plugin.register(r))??;
            let shared_id = r.shared_id().clone();

            // Structural parts, for every plugin.
            for (name, kind) in &r.key_kinds {
                if !bound.allows(*kind, name) {
                    return Err(outside(id, *kind, *name));
                }
                if let Some(first) = key_owner.get(*name) {
                    return Err(EnvError::DuplicateContribution {
                        kind: *kind,
                        name: (*name).to_owned(),
                        first: first.to_string(),
                        second: id.to_owned(),
                    });
                }
                key_owner.insert(name, id);
            }
            for key in r.keys.drain(..) {
                keys.add(key).map_err(|source| PluginError::State {
                    plugin_id: id.to_owned(),
                    source,
                })?;
            }
            phase_env.reserve_actions(r.actions.len());
            for handler in r.actions.drain(..) {
                let key = handler.key();
                if !bound.allows(ContributionKind::Action, key) {
                    return Err(outside(id, ContributionKind::Action, key));
                }
                // The phase environment finds a key taken twice, with both owners.
                phase_env
                    .add_action_shared(&shared_id, handler)
                    .map_err(|e| duplicate(e, ContributionKind::Action))?;
            }
            for handler in r.effects.drain(..) {
                let key = handler.key();
                if !bound.allows(ContributionKind::Effect, key) {
                    return Err(outside(id, ContributionKind::Effect, key));
                }
                phase_env
                    .add_effect_shared(&shared_id, handler)
                    .map_err(|e| duplicate(e, ContributionKind::Effect))?;
            }

            // Behavioural parts: checked against the bound always, installed only if active.
            for (phase, name, _) in &r.phase_hooks {
                if !bound.allows_phase(*phase) {
                    return Err(outside(
                        id,
                        ContributionKind::PhaseHook,
                        format!("{phase}/{name}"),
                    ));
                }
            }
            for (name, _) in &r.gate_hooks {
                if !bound.allows(ContributionKind::GateHook, name) {
                    return Err(outside(id, ContributionKind::GateHook, name.clone()));
                }
            }
            let tool_ids: Vec<String> = r.tools.iter().map(|t| t.descriptor().id).collect();
            for tool_id in &tool_ids {
                if !bound.allows(ContributionKind::Tool, tool_id) {
                    return Err(outside(id, ContributionKind::Tool, tool_id.clone()));
                }
            }
            let mut transform_names = BTreeSet::new();
            for t in &r.transforms {
                let name = t.name();
                if !bound.allows(ContributionKind::RequestTransform, name) {
                    return Err(outside(id, ContributionKind::RequestTransform, name));
                }
                if !transform_names.insert(name.to_owned()) {
                    return Err(PluginError::Duplicate {
                        plugin_id: id.to_owned(),
                        kind: ContributionKind::RequestTransform,
                        name: name.to_owned(),
                    }
                    .into());
                }
            }

            // The built-ins are a handful: a scan finds one.
            let active = builtin_plugins.iter().any(|b| b.manifest().id == id)
                || active_hook_filter.is_empty()
                || active_hook_filter.iter().any(|f| f == id);
            env_active.push(active);
            if active {
                for (phase, name, hook) in r.phase_hooks.drain(..) {
                    phase_env.add_hook_shared(phase, &shared_id, name, hook)?;
                }
                let plugin_id = shared_id.clone();
                for (name, hook) in r.gate_hooks.drain(..) {
                    env_gate_hooks.push(RegisteredGateHook {
                        plugin_id: plugin_id.clone(),
                        name: name.into(),
                        hook,
                    });
                }
                for (tool, tool_id) in r.tools.drain(..).zip(tool_ids) {
                    if let Some(first) = tool_owner.insert(tool_id.clone(), id) {
                        return Err(EnvError::DuplicateContribution {
                            kind: ContributionKind::Tool,
                            name: tool_id,
                            first: first.to_owned(),
                            second: id.to_owned(),
                        });
                    }
                    env_tools.push(PluginTool {
                        plugin_id: plugin_id.clone(),
                        tool,
                    });
                }
                for transform in r.transforms.drain(..) {
                    env_transforms.push(RegisteredTransform {
                        plugin_id: plugin_id.clone(),
                        transform,
                    });
                }
            }
            for schema in isolate(id, "config_schemas", || plugin.config_schemas())? {
                env_config_claims.push((id.to_owned(), schema));
            }
            env_plugins.push(plugin.clone());
        }
        // The estimate's spare room is given back (glibc shrinks a block in place): every run
        // holds its registry for its whole life.
        keys.shrink_to_fit();
        Ok(ExecutionEnv {
            plugins: env_plugins,
            active: env_active,
            phase_env: Arc::new(phase_env),
            keys: Arc::new(keys),
            tools: env_tools,
            gate_hooks: env_gate_hooks,
            transforms: env_transforms,
            config_claims: env_config_claims,
        })
    }

    /// The plugins in execution order (enabled only).
    pub fn plugins(&self) -> &[Arc<dyn Plugin>] {
        &self.plugins
    }

    /// Their ids, in order.
    pub fn plugin_ids(&self) -> Vec<&str> {
        self.plugins
            .iter()
            .map(|p| p.manifest().id.as_str())
            .collect()
    }

    /// Whether the plugin contributes behaviour.
    pub fn is_active(&self, plugin_id: &str) -> bool {
        self.plugins
            .iter()
            .zip(&self.active)
            .any(|(p, active)| *active && p.manifest().id == plugin_id)
    }

    /// The phase environment (hooks of active plugins, every plugin's handlers).
    pub fn phase_env(&self) -> &Arc<PhaseEnv> {
        &self.phase_env
    }

    /// Every state key (the phase engine's included).
    pub fn keys(&self) -> &KeyRegistry {
        &self.keys
    }

    /// The same registry, shared: a run's state store takes it without a copy.
    pub fn shared_keys(&self) -> &Arc<KeyRegistry> {
        &self.keys
    }

    /// Tools of active plugins, in plugin order.
    pub fn tools(&self) -> &[PluginTool] {
        &self.tools
    }

    /// Gate hooks of active plugins, in plugin order.
    pub fn gate_hooks(&self) -> &[RegisteredGateHook] {
        &self.gate_hooks
    }

    /// Request transforms of active plugins, in plugin order.
    pub fn transforms(&self) -> &[RegisteredTransform] {
        &self.transforms
    }

    /// Config sections claimed by the plugins, as `(plugin id, schema)`.
    pub fn config_claims(&self) -> &[(String, ConfigSchema)] {
        &self.config_claims
    }
}
