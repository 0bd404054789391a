//! The `Plugin` trait: identity, registration, configuration, activation and lifecycle hooks.

use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{RunId, TerminationReason, ToolCallId};
use awaken_phase::RunIdentity;
use awaken_spec::{AgentSpec, Sections};
use awaken_state::StateCommand;
use serde::{Deserialize, Serialize};

use crate::config::ConfigSchema;
use crate::error::PluginError;
use crate::hooks::LifecycleHooks;
use crate::manifest::PluginManifest;
use crate::registrar::PluginRegistrar;

/// What happens when a contributed agent's id is already defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnConflict {
    /// Refuse the contributing plugin's whole batch (the default).
    #[default]
    Error,
    /// Keep the existing definition, drop the incoming one.
    Skip,
    /// Replace the existing definition.
    Overwrite,
}

/// An agent a plugin contributes to the registry.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentDefinition {
    /// The agent.
    pub spec: AgentSpec,
    /// What to do if its id is taken.
    pub on_conflict: OnConflict,
}

impl AgentDefinition {
    /// A definition with the default `on_conflict` (`error`).
    pub fn new(spec: AgentSpec) -> Self {
        Self {
            spec,
            on_conflict: OnConflict::Error,
        }
    }

    /// Sets `on_conflict`.
    pub fn with_on_conflict(mut self, on_conflict: OnConflict) -> Self {
        self.on_conflict = on_conflict;
        self
    }
}

/// The view a plugin gets while the registry builds agent definitions: the definitions so far
/// (from plugins earlier in order) and the power to replace them.
#[derive(Debug, Clone, Default)]
pub struct AgentBuildContext {
    pub(crate) agents: Vec<AgentSpec>,
}

impl AgentBuildContext {
    /// The agent definitions so far, in order.
    pub fn list_agent_configs(&self) -> &[AgentSpec] {
        &self.agents
    }

    /// Replaces the definitions so far (applied with the plugin's batch, all or nothing).
    pub fn set_agent_configs(&mut self, agents: Vec<AgentSpec>) {
        self.agents = agents;
    }
}

/// A run, as lifecycle hooks see it.
#[derive(Debug, Clone)]
pub struct RunLifecycle {
    /// The run's identity.
    pub run: Arc<RunIdentity>,
    /// Whether this activation resumes a waiting or recovered run.
    pub resumed: bool,
    /// The parent run, for a delegated child run.
    pub parent_run_id: Option<RunId>,
}

/// A delegation, as lifecycle hooks see it: a parent run handing a task to a sub-agent.
#[derive(Debug, Clone)]
pub struct DelegateCall {
    /// The parent run.
    pub parent: Arc<RunIdentity>,
    /// The parent's tool call that delegates.
    pub call_id: ToolCallId,
    /// The delegate agent.
    pub agent_id: String,
    /// The child run.
    pub child_run_id: RunId,
}

/// The future of a lifecycle hook, as `#[async_trait]` makes it.
pub type HookFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), PluginError>> + Send + 'a>>;

/// A default lifecycle hook's future: done at once, and of size zero (boxing it allocates
/// nothing).
struct NoOp;

impl std::future::Future for NoOp {
    type Output = Result<(), PluginError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// An Awaken plugin.
///
/// `register` declares what the plugin contributes (structural parts, always installed, and
/// behavioural parts, installed only when the plugin passes the agent's activation filter); it
/// is called once per environment build, so it must be deterministic and cheap. The lifecycle
/// hooks (`on_runtime_*`, `on_run_*`, `on_delegate_*`) are observational: they cannot change
/// the run; an error or a timeout is logged and counted and the others still run. `on_reload`
/// is the exception: a reload is applied only if every enabled plugin's `on_reload` succeeds.
/// A disabled plugin ([`PluginManifest::enabled`]) is never called.
///
/// A panic in any method but `manifest` is caught where it is called (an async hook's whole
/// future included) and handled as an `Err` of that method, as
/// [`PluginError::Panicked`] naming the plugin and the method; the runtime stays usable.
#[async_trait]
pub trait Plugin: Send + Sync + 'static {
    /// The plugin's manifest.
    fn manifest(&self) -> &PluginManifest;

    /// Declares the plugin's contributions. An `Err` fails the environment build.
    fn register(&self, registrar: &mut PluginRegistrar) -> Result<(), PluginError>;

    /// The config sections the plugin claims, with their JSON Schemas.
    fn config_schemas(&self) -> Vec<ConfigSchema> {
        Vec::new()
    }

    /// Agents the plugin contributes (see [`AgentBuildContext`]). Called when the registry
    /// builds its agent definitions, in plugin order.
    fn agent_definitions(
        &self,
        _ctx: &mut AgentBuildContext,
    ) -> Result<Vec<AgentDefinition>, PluginError> {
        Ok(Vec::new())
    }

    /// Called at run start, after resolution, with the agent's sections; the returned command
    /// is committed before the `RunStart` hooks. An `Err` (or a panic) fails the run.
    fn on_activate(&self, _sections: &Sections) -> Result<Option<StateCommand>, PluginError> {
        Ok(None)
    }

    /// Called at run end; the returned command is committed with the run's last commit. An
    /// `Err` (or a panic) is reported as an error event and the run still ends.
    fn on_deactivate(&self) -> Result<Option<StateCommand>, PluginError> {
        Ok(None)
    }

    /// The lifecycle hooks this plugin implements: a dispatch calls (and counts) only the
    /// plugins whose set holds its hook. Defaults to every hook, so a plugin that overrides a
    /// hook is called without declaring it; a plugin that declares a smaller set is not called
    /// for the hooks outside it, even if it overrides them. A plugin with none
    /// ([`LifecycleHooks::NONE`]) costs a run's dispatches no clock reading and no lock.
    fn lifecycle_hooks(&self) -> LifecycleHooks {
        LifecycleHooks::ALL
    }

    /// The runtime started.
    async fn on_runtime_start(&self) -> Result<(), PluginError> {
        Ok(())
    }

    /// The runtime is shutting down.
    async fn on_runtime_shutdown(&self) -> Result<(), PluginError> {
        Ok(())
    }

    /// An activation started.
    ///
    /// (Written out as `#[async_trait]` expands an `async fn`, so a plugin implements it as
    /// one; the default's future is a unit value, boxed without an allocation: every run calls
    /// this on every plugin.)
    fn on_run_start<'life0, 'life1, 'async_trait>(
        &'life0 self,
        _run: &'life1 RunLifecycle,
    ) -> HookFuture<'async_trait>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(NoOp)
    }

    /// An activation ended normally: natural end, stopped or suspended. (Written out like
    /// [`on_run_start`](Self::on_run_start), for the same reason.)
    fn on_run_complete<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        _run: &'life1 RunLifecycle,
        _termination: &'life2 TerminationReason,
    ) -> HookFuture<'async_trait>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(NoOp)
    }

    /// An activation ended with an error.
    async fn on_run_error(&self, _run: &RunLifecycle, _error: &str) -> Result<(), PluginError> {
        Ok(())
    }

    /// An activation was cancelled.
    async fn on_run_cancel(&self, _run: &RunLifecycle) -> Result<(), PluginError> {
        Ok(())
    }

    /// A parent run is about to start a delegate's child run.
    async fn on_delegate_call_start(&self, _call: &DelegateCall) -> Result<(), PluginError> {
        Ok(())
    }

    /// A delegate's child run finished; `response` is its final text.
    async fn on_delegate_call_complete(
        &self,
        _call: &DelegateCall,
        _response: &str,
    ) -> Result<(), PluginError> {
        Ok(())
    }

    /// A delegate's child run failed.
    async fn on_delegate_call_error(
        &self,
        _call: &DelegateCall,
        _error: &str,
    ) -> Result<(), PluginError> {
        Ok(())
    }

    /// A delegate's result is about to be handed back to the parent.
    async fn on_delegate_return_start(&self, _call: &DelegateCall) -> Result<(), PluginError> {
        Ok(())
    }

    /// A delegate's result was handed back to the parent.
    async fn on_delegate_return_complete(&self, _call: &DelegateCall) -> Result<(), PluginError> {
        Ok(())
    }

    /// Handing a delegate's result back failed.
    async fn on_delegate_return_error(
        &self,
        _call: &DelegateCall,
        _error: &str,
    ) -> Result<(), PluginError> {
        Ok(())
    }

    /// The registry is reloading under `reload_id`. An `Err` (or a panic) keeps the previous
    /// registry.
    async fn on_reload(&self, _reload_id: &str) -> Result<(), PluginError> {
        Ok(())
    }
}
