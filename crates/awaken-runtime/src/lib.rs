//! Awaken's agent runtime: [`AgentRuntimeBuilder`] over the resolver's registries, the agent
//! loop (each activation `RunStart` … `RunFinish` through the phase engine: `StepStart`,
//! `BeforeInference`, request transforms, streamed inference, `AfterInference`, the tool calls
//! with their gates, `StepEnd`), the built-in plugins (loop actions and stop conditions), the
//! neutral event stream and typed termination.
//!
//! Work in progress (issue 10): thread histories are kept in memory (the durable
//! `ThreadStore` and the tool-batch checkpoints are wired next), tool calls run one after
//! another, and endpoint-backed agents are not driven yet. This crate must never know wire
//! protocols or terminal UI.

mod builtins;
mod run;
mod runtime;

pub use builtins::{
    AddContextMessage, DirectiveChange, DirectiveUpdate, ExcludeTool, IncludeOnlyTools,
    LOOP_ACTIONS_PLUGIN, LoopActionHandler, LoopActionsPlugin, RequestStop, RequestStopHandler,
    RunStats, RunStatsKey, RuntimeBuiltins, STOP_CONDITIONS_PLUGIN, SetInferenceOverride,
    StatsUpdate, StepDirectives, StepDirectivesKey, StopConditionsPlugin, StopRequest,
    StopRequestKey,
};
pub use run::usage_of;
pub use runtime::{
    AgentRuntime, AgentRuntimeBuilder, BuildError, IdSource, RunActivation, RunError, RunHandle,
    RunOutcome, SequentialIds, SystemIds,
};
