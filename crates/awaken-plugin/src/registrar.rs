//! The registrar a plugin declares its contributions through: structural parts
//! (state keys, profile keys, scheduled-action and effect handlers), always installed, and
//! behavioural parts (phase hooks, tool-gate and tool-policy hooks, tools, request transforms),
//! installed only when the plugin passes the agent's activation filter.

use std::sync::Arc;

use awaken_phase::{
    ActionHandler, EffectHandler, EffectSpec, ErasedActionHandler, ErasedEffectHandler, Phase,
    PhaseHook, ScheduledActionSpec, erase_action, erase_effect,
};
use awaken_state::{KeyDecl, KeyOptions, KeyScope, StateKey};
use awaken_tool::Tool;

use crate::error::{ContributionKind, PluginError};
use crate::gate::{PolicyGate, ToolGateHook, ToolPolicyHook};
use crate::transform::InferenceRequestTransform;

/// Everything one plugin registered, stamped with its id.
pub struct PluginRegistrar {
    plugin_id: Arc<str>,
    /// The plugin's keys, moved into the environment's registry when it is built.
    pub(crate) keys: Vec<KeyDecl>,
    pub(crate) key_kinds: Vec<(&'static str, ContributionKind)>,
    pub(crate) actions: Vec<Arc<dyn ErasedActionHandler>>,
    pub(crate) effects: Vec<Arc<dyn ErasedEffectHandler>>,
    pub(crate) phase_hooks: Vec<(Phase, Arc<str>, Arc<dyn PhaseHook>)>,
    pub(crate) gate_hooks: Vec<(String, Arc<dyn ToolGateHook>)>,
    pub(crate) tools: Vec<Arc<dyn Tool>>,
    pub(crate) transforms: Vec<Arc<dyn InferenceRequestTransform>>,
}

impl std::fmt::Debug for PluginRegistrar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginRegistrar")
            .field("plugin_id", &self.plugin_id)
            .field("keys", &self.key_kinds)
            .field(
                "actions",
                &self.actions.iter().map(|a| a.key()).collect::<Vec<_>>(),
            )
            .field(
                "effects",
                &self.effects.iter().map(|e| e.key()).collect::<Vec<_>>(),
            )
            .field(
                "phase_hooks",
                &self
                    .phase_hooks
                    .iter()
                    .map(|(p, n, _)| (p, n))
                    .collect::<Vec<_>>(),
            )
            .field(
                "gate_hooks",
                &self.gate_hooks.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field(
                "tools",
                &self
                    .tools
                    .iter()
                    .map(|t| t.descriptor().id)
                    .collect::<Vec<_>>(),
            )
            .field(
                "transforms",
                &self
                    .transforms
                    .iter()
                    .map(|t| t.name().to_owned())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl PluginRegistrar {
    /// A registrar for the plugin `plugin_id`.
    pub fn new(plugin_id: impl Into<Arc<str>>) -> Self {
        Self {
            plugin_id: plugin_id.into(),
            keys: Vec::new(),
            key_kinds: Vec::new(),
            actions: Vec::new(),
            effects: Vec::new(),
            phase_hooks: Vec::new(),
            gate_hooks: Vec::new(),
            tools: Vec::new(),
            transforms: Vec::new(),
        }
    }

    /// Empties the registrar for the plugin `plugin_id`, keeping its lists' room (one registrar
    /// serves every plugin of an environment build).
    pub(crate) fn restart(&mut self, plugin_id: &str) {
        self.plugin_id = plugin_id.into();
        self.keys.clear();
        self.key_kinds.clear();
        self.actions.clear();
        self.effects.clear();
        self.phase_hooks.clear();
        self.gate_hooks.clear();
        self.tools.clear();
        self.transforms.clear();
    }

    /// The plugin's id, shared.
    pub(crate) fn shared_id(&self) -> &Arc<str> {
        &self.plugin_id
    }

    /// The plugin's id, stamped on every contribution.
    pub fn plugin_id(&self) -> &str {
        &self.plugin_id
    }

    fn duplicate(&self, kind: ContributionKind, name: impl Into<String>) -> PluginError {
        PluginError::Duplicate {
            plugin_id: self.plugin_id.to_string(),
            kind,
            name: name.into(),
        }
    }

    /// Structural: registers state key `K` (a second registration of its name fails).
    pub fn register_key<K: StateKey>(&mut self, options: KeyOptions) -> Result<(), PluginError> {
        let kind = if options.scope == KeyScope::Profile {
            ContributionKind::ProfileKey
        } else {
            ContributionKind::StateKey
        };
        let key = KeyDecl::of::<K>(options);
        // A plugin declares a handful of keys: a scan finds a second use of a name.
        if let Some(first) = self.keys.iter().find(|k| k.name() == K::KEY) {
            return Err(PluginError::State {
                plugin_id: self.plugin_id.to_string(),
                source: first.duplicate(&key),
            });
        }
        self.keys.push(key);
        self.key_kinds.push((K::KEY, kind));
        Ok(())
    }

    /// Structural: registers profile key `K` (shared by every thread of a profile).
    pub fn register_profile_key<K: StateKey>(&mut self) -> Result<(), PluginError> {
        self.register_key::<K>(KeyOptions::new().with_scope(KeyScope::Profile))
    }

    /// Structural: registers the handler of scheduled action `A`.
    pub fn register_scheduled_action<A: ScheduledActionSpec, H: ActionHandler<A>>(
        &mut self,
        handler: H,
    ) -> Result<(), PluginError> {
        if self.actions.iter().any(|a| a.key() == A::KEY) {
            return Err(self.duplicate(ContributionKind::Action, A::KEY));
        }
        if A::PHASE == Phase::ToolGate {
            return Err(PluginError::Hook {
                plugin_id: self.plugin_id.to_string(),
                hook: "register_scheduled_action".into(),
                message: format!(
                    "action `{}` targets tool_gate, which runs no actions",
                    A::KEY
                ),
            });
        }
        if self.actions.capacity() == 0 {
            // Room for a plugin's usual handful: no reallocation while it registers them.
            self.actions.reserve_exact(8);
        }
        self.actions.push(erase_action::<A, H>(handler));
        Ok(())
    }

    /// Structural: registers the handler of effect `E`.
    pub fn register_effect<E: EffectSpec, H: EffectHandler<E>>(
        &mut self,
        handler: H,
    ) -> Result<(), PluginError> {
        if self.effects.iter().any(|e| e.key() == E::KEY) {
            return Err(self.duplicate(ContributionKind::Effect, E::KEY));
        }
        self.effects.push(erase_effect::<E, H>(handler));
        Ok(())
    }

    /// Behavioural: registers a phase hook named `name` (unique per plugin and phase). Hooks
    /// for `ToolGate` are refused: use [`Self::register_tool_gate_hook`].
    pub fn register_phase_hook(
        &mut self,
        phase: Phase,
        name: impl AsRef<str>,
        hook: Arc<dyn PhaseHook>,
    ) -> Result<(), PluginError> {
        let name = name.as_ref();
        if phase == Phase::ToolGate {
            return Err(PluginError::ToolGatePhaseHook {
                plugin_id: self.plugin_id.to_string(),
                hook: name.to_owned(),
            });
        }
        if self
            .phase_hooks
            .iter()
            .any(|(p, n, _)| *p == phase && &**n == name)
        {
            return Err(self.duplicate(ContributionKind::PhaseHook, format!("{phase}/{name}")));
        }
        self.phase_hooks.push((phase, Arc::from(name), hook));
        Ok(())
    }

    /// Behavioural: registers a tool-gate hook named `name`.
    pub fn register_tool_gate_hook(
        &mut self,
        name: impl Into<String>,
        hook: Arc<dyn ToolGateHook>,
    ) -> Result<(), PluginError> {
        let name = name.into();
        if self.gate_hooks.iter().any(|(n, _)| *n == name) {
            return Err(self.duplicate(ContributionKind::GateHook, name));
        }
        self.gate_hooks.push((name, hook));
        Ok(())
    }

    /// Behavioural: registers a typed tool-policy hook, run inside `ToolGate` like a gate hook.
    pub fn register_tool_policy_hook<P: ToolPolicyHook>(
        &mut self,
        name: impl Into<String>,
        policy: P,
    ) -> Result<(), PluginError> {
        self.register_tool_gate_hook(name, Arc::new(PolicyGate(policy)))
    }

    /// Behavioural: registers a tool (its id must be unique in the plugin; across plugins and
    /// global tools the resolver checks).
    pub fn register_tool(&mut self, tool: Arc<dyn Tool>) -> Result<(), PluginError> {
        let id = tool.descriptor().id;
        if self.tools.iter().any(|t| t.descriptor().id == id) {
            return Err(self.duplicate(ContributionKind::Tool, id));
        }
        self.tools.push(tool);
        Ok(())
    }

    /// Behavioural: registers a request transform. Fire-and-forget: a transform
    /// registered twice under one name is reported when the environment is built.
    pub fn register_request_transform(&mut self, transform: Arc<dyn InferenceRequestTransform>) {
        self.transforms.push(transform);
    }
}
