//! Errors of registering plugins, building environments, loading and reloading.

use std::path::PathBuf;

use awaken_phase::PhaseEnvError;
use awaken_spec::SpecError;
use awaken_state::StateError;

/// What a plugin may contribute, named for errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContributionKind {
    /// A state key.
    StateKey,
    /// A profile key.
    ProfileKey,
    /// A scheduled-action handler.
    Action,
    /// An effect handler.
    Effect,
    /// A phase hook.
    PhaseHook,
    /// A tool-gate (or tool-policy) hook.
    GateHook,
    /// A tool.
    Tool,
    /// A request transform.
    RequestTransform,
    /// An agent definition.
    AgentDefinition,
}

impl std::fmt::Display for ContributionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::StateKey => "state key",
            Self::ProfileKey => "profile key",
            Self::Action => "scheduled action",
            Self::Effect => "effect",
            Self::PhaseHook => "phase hook",
            Self::GateHook => "tool-gate hook",
            Self::Tool => "tool",
            Self::RequestTransform => "request transform",
            Self::AgentDefinition => "agent definition",
        })
    }
}

/// A plugin-level failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// A state-level registration failed (duplicate key, ...).
    #[error("plugin `{plugin_id}`: {source}")]
    State {
        /// The plugin.
        plugin_id: String,
        /// The cause.
        #[source]
        source: StateError,
    },
    /// The plugin registered something twice.
    #[error("plugin `{plugin_id}` registers {kind} `{name}` twice")]
    Duplicate {
        /// The plugin.
        plugin_id: String,
        /// What it registered.
        kind: ContributionKind,
        /// Its name.
        name: String,
    },
    /// A phase hook for `ToolGate` (gate hooks are registered separately).
    #[error(
        "plugin `{plugin_id}` registers phase hook `{hook}` for tool_gate; use register_tool_gate_hook"
    )]
    ToolGatePhaseHook {
        /// The plugin.
        plugin_id: String,
        /// The hook.
        hook: String,
    },
    /// A tool was refused at registration (invalid schema, a re-run policy on a side-effecting
    /// tool, ...).
    #[error("plugin `{plugin_id}`: tool `{tool}` rejected: {reason}")]
    InvalidTool {
        /// The plugin.
        plugin_id: String,
        /// The tool id.
        tool: String,
        /// Why.
        reason: String,
    },
    /// The plugin's manifest is invalid.
    #[error("plugin `{plugin_id}`: invalid manifest field `{field}`: {reason}")]
    InvalidManifest {
        /// The plugin (or the raw id given).
        plugin_id: String,
        /// The field.
        field: String,
        /// Why.
        reason: String,
    },
    /// A hook of the plugin failed (lifecycle, activation, agent definitions, reload).
    #[error("plugin `{plugin_id}`: {hook} failed: {message}")]
    Hook {
        /// The plugin.
        plugin_id: String,
        /// Which hook.
        hook: String,
        /// What went wrong.
        message: String,
    },
    /// Code of the plugin panicked at one of its entry points; the panic was caught and is
    /// handled as an error of that entry point.
    #[error("plugin `{plugin_id}`: {entry_point} panicked: {message}")]
    Panicked {
        /// The plugin.
        plugin_id: String,
        /// The entry point (`register`, `on_activate`, `on_reload`, a lifecycle hook, ...).
        entry_point: String,
        /// The panic message.
        message: String,
    },
    /// An agent spec contributed by the plugin is invalid.
    #[error("plugin `{plugin_id}`: agent `{agent_id}`: {source}")]
    AgentSpec {
        /// The plugin.
        plugin_id: String,
        /// The agent.
        agent_id: String,
        /// The validation error.
        #[source]
        source: SpecError,
    },
}

impl PluginError {
    /// A `Hook` error, for plugin authors.
    pub fn hook(
        plugin_id: impl Into<String>,
        hook: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        PluginError::Hook {
            plugin_id: plugin_id.into(),
            hook: hook.into(),
            message: message.into(),
        }
    }

    /// A `Panicked` error: `plugin_id`'s code at `entry_point` panicked with `message`.
    pub fn panicked(
        plugin_id: impl Into<String>,
        entry_point: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        PluginError::Panicked {
            plugin_id: plugin_id.into(),
            entry_point: entry_point.into(),
            message: message.into(),
        }
    }
}

/// Why an [`crate::ExecutionEnv`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// A plugin depends on one that is not in the list (or is disabled).
    #[error("plugin `{plugin_id}` depends on `{missing}`, which is not loaded or is disabled")]
    MissingDependency {
        /// The dependent plugin.
        plugin_id: String,
        /// The missing one.
        missing: String,
    },
    /// Plugins depend on each other in a cycle.
    #[error("plugins depend on each other in a cycle: {}", members.join(" -> "))]
    DependencyCycle {
        /// The members of the cycle, in dependency order, the first repeated at the end.
        members: Vec<String>,
    },
    /// Two plugins have one id.
    #[error("plugin id `{plugin_id}` is used twice")]
    DuplicatePlugin {
        /// The id.
        plugin_id: String,
    },
    /// Two plugins contribute the same key, action, effect or tool id.
    #[error("{kind} `{name}` is contributed by both `{first}` and `{second}`")]
    DuplicateContribution {
        /// What.
        kind: ContributionKind,
        /// Its name.
        name: String,
        /// The plugin that contributed it first.
        first: String,
        /// The plugin that contributed it again.
        second: String,
    },
    /// A contribution outside the plugin's capability bound.
    #[error("plugin `{plugin_id}` contributes {kind} `{name}`, outside its capability bound")]
    OutsideBound {
        /// The plugin.
        plugin_id: String,
        /// What.
        kind: ContributionKind,
        /// Its name (for a phase hook: `phase/hook`).
        name: String,
    },
    /// The plugin's `register` failed.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The phase environment refused a contribution.
    #[error(transparent)]
    Phase(#[from] PhaseEnvError),
    /// The engine's own keys could not be registered (a plugin took their names).
    #[error("the phase engine's keys could not be registered: {0}")]
    EngineKeys(#[source] StateError),
}

/// Why loading declarative plugins from a directory failed. Nothing is registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The directory or one of its `*.toml` entries could not be read (a broken symlink, a
    /// symlink loop, no permission, ...).
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// A `*.toml` entry of the directory is not a regular file (after following symlinks).
    #[error("cannot load {}: it is {kind}, not a regular file", path.display())]
    NotAFile {
        /// The entry.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// A manifest file is not valid.
    #[error("{}{}: {source}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Manifest {
        /// The file.
        path: PathBuf,
        /// The line, when the parser gave one.
        line: Option<usize>,
        /// What is wrong.
        #[source]
        source: SpecError,
    },
    /// A manifest names a plugin that is already registered.
    #[error("{}: {source}", path.display())]
    Plugin {
        /// The file.
        path: PathBuf,
        /// The registry's refusal.
        #[source]
        source: RegistryError,
    },
}

/// A refusal of the plugin registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// A plugin id registered twice.
    #[error("plugin `{plugin_id}` is already registered")]
    DuplicatePlugin {
        /// The id.
        plugin_id: String,
    },
    /// An agent id collides and its `on_conflict` is `error`.
    #[error("agent `{agent_id}` from plugin `{plugin_id}` collides with an existing definition")]
    AgentConflict {
        /// The agent.
        agent_id: String,
        /// The contributing plugin.
        plugin_id: String,
    },
    /// A plugin failed while contributing agent definitions.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// A source (configurator or directory) failed while the registry was rebuilt.
    #[error(transparent)]
    Load(Box<LoadError>),
    /// Plugins failed to reload; the old snapshot stays.
    #[error("reload `{reload_id}` failed, the previous plugins stay active: {}", failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    ReloadFailed {
        /// The reload id.
        reload_id: String,
        /// Each failing plugin's error.
        failures: Vec<PluginError>,
    },
}
