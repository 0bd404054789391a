//! A plugin's identity and its capability bound.

use std::collections::BTreeSet;

use awaken_phase::Phase;
use serde::{Deserialize, Serialize};

use crate::error::{ContributionKind, PluginError};

/// A plugin's identity: its id (the one identity every contribution is stamped with), version,
/// priority among ready plugins, whether it is enabled, what it depends on, and what it may
/// contribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginManifest {
    /// The plugin's id.
    pub id: String,
    /// Its version.
    pub version: semver::Version,
    /// Among plugins whose dependencies are placed, higher priority goes first.
    pub priority: i32,
    /// A disabled plugin is invisible: a registry neither lists nor returns it, builds none of
    /// its agent definitions and calls none of its hooks, and an environment build skips it.
    pub enabled: bool,
    /// Ids of plugins that must come before this one.
    pub depends_on: Vec<String>,
    /// What the plugin may contribute.
    pub bound: CapabilityBound,
}

impl PluginManifest {
    /// An enabled plugin at version 0.1.0, priority 0, no dependencies, unbounded.
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            version: semver::Version::new(0, 1, 0),
            priority: 0,
            enabled: true,
            depends_on: Vec::new(),
            bound: CapabilityBound::unbounded(),
        }
    }

    /// Sets the version from text (`1.2.3`); an invalid version is an error naming the field.
    pub fn with_version(mut self, version: &str) -> Result<Self, PluginError> {
        self.version =
            semver::Version::parse(version).map_err(|e| PluginError::InvalidManifest {
                plugin_id: self.id.clone(),
                field: "version".into(),
                reason: format!("{version:?} is not a semantic version: {e}"),
            })?;
        Ok(self)
    }

    /// Sets the priority.
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Enables or disables the plugin.
    pub fn with_enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// Adds a dependency.
    pub fn with_dependency(mut self, plugin_id: impl Into<String>) -> Self {
        self.depends_on.push(plugin_id.into());
        self
    }

    /// Sets the capability bound.
    pub fn with_bound(mut self, bound: CapabilityBound) -> Self {
        self.bound = bound;
        self
    }

    /// Checks the id and dependencies.
    pub fn validate(&self) -> Result<(), PluginError> {
        let bad = |field: &str, reason: String| PluginError::InvalidManifest {
            plugin_id: self.id.clone(),
            field: field.into(),
            reason,
        };
        // Printable ASCII (most ids) is checked a byte at a time; anything else by character.
        let printable_ascii = !self.id.is_empty() && self.id.bytes().all(|b| b.is_ascii_graphic());
        if !printable_ascii
            && (self.id.trim().is_empty()
                || self.id.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(bad(
                "id",
                format!("{:?} must be non-empty without whitespace", self.id),
            ));
        }
        if self.depends_on.iter().any(|d| d == &self.id) {
            return Err(bad("depends_on", "a plugin cannot depend on itself".into()));
        }
        Ok(())
    }
}

/// What a plugin may contribute. `None` in a field means "anything of that kind"; `Some(set)`
/// allows only the listed names (an empty set forbids the kind). A bound limits contributions;
/// it grants no permission of any kind.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilityBound {
    /// State key names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_keys: Option<BTreeSet<String>>,
    /// Profile key names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_keys: Option<BTreeSet<String>>,
    /// Scheduled-action keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actions: Option<BTreeSet<String>>,
    /// Effect keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effects: Option<BTreeSet<String>>,
    /// Phases the plugin may hook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_hooks: Option<BTreeSet<Phase>>,
    /// Names of tool-gate (and tool-policy) hooks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_hooks: Option<BTreeSet<String>>,
    /// Tool ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<BTreeSet<String>>,
    /// Names of request transforms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_transforms: Option<BTreeSet<String>>,
    /// Agent ids the plugin may define.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_definitions: Option<BTreeSet<String>>,
}

fn set<I: IntoIterator<Item = S>, S: Into<String>>(items: I) -> Option<BTreeSet<String>> {
    Some(items.into_iter().map(Into::into).collect())
}

impl CapabilityBound {
    /// Anything may be contributed.
    pub fn unbounded() -> Self {
        Self::default()
    }

    /// Nothing may be contributed until allowed with the `with_*` methods.
    pub fn nothing() -> Self {
        Self {
            state_keys: Some(BTreeSet::new()),
            profile_keys: Some(BTreeSet::new()),
            actions: Some(BTreeSet::new()),
            effects: Some(BTreeSet::new()),
            phase_hooks: Some(BTreeSet::new()),
            gate_hooks: Some(BTreeSet::new()),
            tools: Some(BTreeSet::new()),
            request_transforms: Some(BTreeSet::new()),
            agent_definitions: Some(BTreeSet::new()),
        }
    }

    /// Allows exactly these state keys.
    pub fn with_state_keys<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.state_keys = set(names);
        self
    }

    /// Allows exactly these profile keys.
    pub fn with_profile_keys<S: Into<String>>(
        mut self,
        names: impl IntoIterator<Item = S>,
    ) -> Self {
        self.profile_keys = set(names);
        self
    }

    /// Allows exactly these action keys.
    pub fn with_actions<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.actions = set(names);
        self
    }

    /// Allows exactly these effect keys.
    pub fn with_effects<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.effects = set(names);
        self
    }

    /// Allows hooks in exactly these phases.
    pub fn with_phase_hooks(mut self, phases: impl IntoIterator<Item = Phase>) -> Self {
        self.phase_hooks = Some(phases.into_iter().collect());
        self
    }

    /// Allows exactly these gate hooks.
    pub fn with_gate_hooks<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.gate_hooks = set(names);
        self
    }

    /// Allows exactly these tools.
    pub fn with_tools<S: Into<String>>(mut self, ids: impl IntoIterator<Item = S>) -> Self {
        self.tools = set(ids);
        self
    }

    /// Allows exactly these request transforms.
    pub fn with_request_transforms<S: Into<String>>(
        mut self,
        names: impl IntoIterator<Item = S>,
    ) -> Self {
        self.request_transforms = set(names);
        self
    }

    /// Allows exactly these agent definitions.
    pub fn with_agent_definitions<S: Into<String>>(
        mut self,
        ids: impl IntoIterator<Item = S>,
    ) -> Self {
        self.agent_definitions = set(ids);
        self
    }

    /// Whether a contribution of `kind` named `name` is within the bound.
    pub fn allows(&self, kind: ContributionKind, name: &str) -> bool {
        let list = match kind {
            ContributionKind::StateKey => &self.state_keys,
            ContributionKind::ProfileKey => &self.profile_keys,
            ContributionKind::Action => &self.actions,
            ContributionKind::Effect => &self.effects,
            ContributionKind::GateHook => &self.gate_hooks,
            ContributionKind::Tool => &self.tools,
            ContributionKind::RequestTransform => &self.request_transforms,
            ContributionKind::AgentDefinition => &self.agent_definitions,
            ContributionKind::PhaseHook => return true,
        };
        list.as_ref().is_none_or(|s| s.contains(name))
    }

    /// Whether a phase hook in `phase` is within the bound.
    pub fn allows_phase(&self, phase: Phase) -> bool {
        self.phase_hooks.as_ref().is_none_or(|s| s.contains(&phase))
    }
}
