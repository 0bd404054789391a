//! The environment the engine runs against: hooks per phase tagged with their plugin, and
//! action and effect handlers by key. A plain struct; the plugin crate builds it.

use std::sync::Arc;

use crate::action::{ErasedActionHandler, ErasedEffectHandler};
use crate::hook::PhaseHook;
use crate::phase::Phase;

/// Maps keyed by handler name, with the fast hasher the workspace uses for in-process maps.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A hook as installed: which plugin contributed it and under what name.
#[derive(Clone)]
pub struct RegisteredHook {
    /// The contributing plugin's id.
    pub plugin_id: Arc<str>,
    /// The hook's name (unique within the plugin and phase; used in errors and traces).
    pub name: Arc<str>,
    /// The hook.
    pub hook: Arc<dyn PhaseHook>,
}

/// An action handler as installed.
#[derive(Clone)]
pub struct RegisteredAction {
    /// The contributing plugin's id.
    pub plugin_id: Arc<str>,
    /// The handler.
    pub handler: Arc<dyn ErasedActionHandler>,
}

/// An effect handler as installed.
#[derive(Clone)]
pub struct RegisteredEffect {
    /// The contributing plugin's id.
    pub plugin_id: Arc<str>,
    /// The handler.
    pub handler: Arc<dyn ErasedEffectHandler>,
}

/// A contribution the environment refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PhaseEnvError {
    /// Phase hooks cannot target `ToolGate` (it is driven through gate hooks).
    #[error(
        "plugin `{plugin_id}` registers phase hook `{hook}` for tool_gate; use a tool-gate hook"
    )]
    ToolGateHook {
        /// The plugin.
        plugin_id: String,
        /// The hook.
        hook: String,
    },
    /// A plugin registered two hooks with one name for one phase.
    #[error("plugin `{plugin_id}` registers hook `{hook}` for {phase} twice")]
    DuplicateHook {
        /// The plugin.
        plugin_id: String,
        /// The phase.
        phase: Phase,
        /// The hook.
        hook: String,
    },
    /// An action handler targets `ToolGate`.
    #[error("plugin `{plugin_id}` registers action `{key}` for tool_gate, which runs no actions")]
    ActionForToolGate {
        /// The plugin.
        plugin_id: String,
        /// The action key.
        key: String,
    },
    /// Two handlers for one action key.
    #[error("scheduled action `{key}` is handled by both `{first}` and `{second}`")]
    DuplicateAction {
        /// The action key.
        key: String,
        /// The plugin that registered it first.
        first: String,
        /// The plugin that registered it again.
        second: String,
    },
    /// Two handlers for one effect key.
    #[error("effect `{key}` is handled by both `{first}` and `{second}`")]
    DuplicateEffect {
        /// The effect key.
        key: String,
        /// The plugin that registered it first.
        first: String,
        /// The plugin that registered it again.
        second: String,
    },
}

/// Hooks and handlers of one resolved agent.
#[derive(Clone, Default)]
pub struct PhaseEnv {
    hooks: [Vec<RegisteredHook>; 9],
    actions: HashMap<&'static str, RegisteredAction>,
    effects: HashMap<&'static str, RegisteredEffect>,
}

impl PhaseEnv {
    /// An empty environment.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a hook for `phase` (hooks run in the order they are added).
    pub fn add_hook(
        &mut self,
        phase: Phase,
        plugin_id: &str,
        name: &str,
        hook: Arc<dyn PhaseHook>,
    ) -> Result<(), PhaseEnvError> {
        self.add_hook_shared(phase, &Arc::from(plugin_id), Arc::from(name), hook)
    }

    /// As [`add_hook`](Self::add_hook), sharing the plugin id's allocation between the hooks
    /// of one plugin.
    pub fn add_hook_shared(
        &mut self,
        phase: Phase,
        plugin_id: &Arc<str>,
        name: Arc<str>,
        hook: Arc<dyn PhaseHook>,
    ) -> Result<(), PhaseEnvError> {
        if phase == Phase::ToolGate {
            return Err(PhaseEnvError::ToolGateHook {
                plugin_id: plugin_id.to_string(),
                hook: name.to_string(),
            });
        }
        let list = &mut self.hooks[phase as usize];
        if list
            .iter()
            .any(|h| h.plugin_id == *plugin_id && h.name == name)
        {
            return Err(PhaseEnvError::DuplicateHook {
                plugin_id: plugin_id.to_string(),
                phase,
                hook: name.to_string(),
            });
        }
        list.push(RegisteredHook {
            plugin_id: plugin_id.clone(),
            name,
            hook,
        });
        Ok(())
    }

    /// Installs an action handler.
    pub fn add_action(
        &mut self,
        plugin_id: &str,
        handler: Arc<dyn ErasedActionHandler>,
    ) -> Result<(), PhaseEnvError> {
        self.add_action_shared(&Arc::from(plugin_id), handler)
    }

    /// Makes room for `additional` more action handlers (one allocation for a plugin's
    /// handlers instead of a growing table).
    pub fn reserve_actions(&mut self, additional: usize) {
        self.actions.reserve(additional);
    }

    /// As [`add_action`](Self::add_action), sharing the plugin id's allocation between the
    /// handlers of one plugin.
    pub fn add_action_shared(
        &mut self,
        plugin_id: &Arc<str>,
        handler: Arc<dyn ErasedActionHandler>,
    ) -> Result<(), PhaseEnvError> {
        let key = handler.key();
        if handler.phase() == Phase::ToolGate {
            return Err(PhaseEnvError::ActionForToolGate {
                plugin_id: plugin_id.to_string(),
                key: key.into(),
            });
        }
        if let Some(existing) = self.actions.get(key) {
            return Err(PhaseEnvError::DuplicateAction {
                key: key.into(),
                first: existing.plugin_id.to_string(),
                second: plugin_id.to_string(),
            });
        }
        self.actions.insert(
            key,
            RegisteredAction {
                plugin_id: plugin_id.clone(),
                handler,
            },
        );
        Ok(())
    }

    /// Installs an effect handler.
    pub fn add_effect(
        &mut self,
        plugin_id: &str,
        handler: Arc<dyn ErasedEffectHandler>,
    ) -> Result<(), PhaseEnvError> {
        self.add_effect_shared(&Arc::from(plugin_id), handler)
    }

    /// As [`add_effect`](Self::add_effect), sharing the plugin id's allocation.
    pub fn add_effect_shared(
        &mut self,
        plugin_id: &Arc<str>,
        handler: Arc<dyn ErasedEffectHandler>,
    ) -> Result<(), PhaseEnvError> {
        let key = handler.key();
        if let Some(existing) = self.effects.get(key) {
            return Err(PhaseEnvError::DuplicateEffect {
                key: key.into(),
                first: existing.plugin_id.to_string(),
                second: plugin_id.to_string(),
            });
        }
        self.effects.insert(
            key,
            RegisteredEffect {
                plugin_id: plugin_id.clone(),
                handler,
            },
        );
        Ok(())
    }

    /// The hooks of `phase`, in order.
    pub fn hooks(&self, phase: Phase) -> &[RegisteredHook] {
        &self.hooks[phase as usize]
    }

    /// The handler of an action key.
    pub fn action(&self, key: &str) -> Option<&RegisteredAction> {
        self.actions.get(key)
    }

    /// The handler of an effect key.
    pub fn effect(&self, key: &str) -> Option<&RegisteredEffect> {
        self.effects.get(key)
    }

    /// Every action key with a handler.
    pub fn action_keys(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.actions.keys().copied()
    }

    /// Every effect key with a handler.
    pub fn effect_keys(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.effects.keys().copied()
    }
}
