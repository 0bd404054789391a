//! The built-in plugins every agent gets (always active, whatever its activation filter): the
//! loop's actions and the stop conditions; context management (`awaken-context`) joins them
//! when the agent sets a context policy.

use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::TokenUsage;
use awaken_phase::{ActionHandler, HookError, Phase, PhaseContext, ScheduledActionSpec};
use awaken_plugin::{LifecycleHooks, Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_resolver::BuiltinPlugins;
use awaken_spec::{AgentSpec, InferenceOverride, ModelSpec};
use awaken_state::{
    KeyHandle, KeyOptions, KeyScope, MergeStrategy, Snapshot, StateCommand, StateError, StateKey,
};
use serde::{Deserialize, Serialize};

use crate::steering::SteeringReceipt;

/// Id of the loop-actions plugin.
pub const LOOP_ACTIONS_PLUGIN: &str = "awaken.loop_actions";
/// Id of the stop-conditions plugin.
pub const STOP_CONDITIONS_PLUGIN: &str = "awaken.stop_conditions";
/// Id of the plugin holding the model pool a run started on (only agents on a pool have it).
pub const MODEL_POOL_PLUGIN: &str = "awaken.model_pool";

/// Registers [`crate::pool::ModelPoolKey`]: a built-in of agents whose model is a pool only, so
/// other runs' state has one key fewer to index.
struct ModelPoolPlugin {
    manifest: PluginManifest,
}

impl Plugin for ModelPoolPlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }

    fn lifecycle_hooks(&self) -> LifecycleHooks {
        LifecycleHooks::NONE
    }

    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_key::<crate::pool::ModelPoolKey>(KeyOptions::new().with_scope(KeyScope::Run))
    }
}

/// What `BeforeInference` actions asked for the current step. Directives of an earlier step
/// are discarded by the reducer, so nothing leaks into the next step.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StepDirectives {
    /// The step these directives belong to.
    pub step: u32,
    /// Context messages added to this step's request.
    pub context_messages: Vec<String>,
    /// This step's inference override (highest precedence).
    pub inference: InferenceOverride,
    /// Tools removed from this step's request.
    pub excluded_tools: Vec<String>,
    /// If set, only these tools are offered in this step.
    pub include_only: Option<Vec<String>>,
}

/// A change to [`StepDirectives`], tagged with its step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirectiveUpdate {
    /// The step it applies to.
    pub step: u32,
    /// The change.
    pub change: DirectiveChange,
}

/// One directive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DirectiveChange {
    /// Add a context message.
    AddContextMessage {
        /// Its text.
        text: String,
    },
    /// Layer an inference override.
    SetInferenceOverride {
        /// The override.
        inference: InferenceOverride,
    },
    /// Remove a tool.
    ExcludeTool {
        /// The tool id.
        tool: String,
    },
    /// Offer only these tools.
    IncludeOnlyTools {
        /// The tool ids.
        tools: Vec<String>,
    },
}

/// The state key of [`StepDirectives`] (ephemeral: a step is never resumed half-way through
/// its `BeforeInference`).
pub struct StepDirectivesKey;

impl StateKey for StepDirectivesKey {
    const KEY: &'static str = "awaken.loop.step_directives";
    type Value = StepDirectives;
    type Update = DirectiveUpdate;

    fn apply(value: &mut StepDirectives, update: DirectiveUpdate) -> Result<(), StateError> {
        if value.step != update.step {
            *value = StepDirectives {
                step: update.step,
                ..StepDirectives::default()
            };
        }
        match update.change {
            DirectiveChange::AddContextMessage { text } => value.context_messages.push(text),
            DirectiveChange::SetInferenceOverride { inference } => {
                value.inference = value.inference.merge(&inference)
            }
            DirectiveChange::ExcludeTool { tool } => value.excluded_tools.push(tool),
            DirectiveChange::IncludeOnlyTools { tools } => value.include_only = Some(tools),
        }
        Ok(())
    }
}

macro_rules! directive_action {
    ($(#[$doc:meta])* $name:ident, $key:literal, $payload:ty, |$p:ident| $change:expr) => {
        $(#[$doc])*
        pub struct $name;
        impl ScheduledActionSpec for $name {
            const KEY: &'static str = $key;
            const PHASE: Phase = Phase::BeforeInference;
            type Payload = $payload;
        }
        #[async_trait]
        impl ActionHandler<$name> for LoopActionHandler {
            async fn handle(&self, ctx: &PhaseContext, $p: $payload) -> Result<StateCommand, HookError> {
                Ok(StateCommand::new().with_update::<StepDirectivesKey>(DirectiveUpdate { step: ctx.step, change: $change }))
            }
        }
    };
}

/// Handles the loop's `BeforeInference` actions.
pub struct LoopActionHandler;

directive_action!(
    /// Adds a context message to this step's request: payload is the text.
    AddContextMessage, "awaken.loop.add_context_message", String, |text| DirectiveChange::AddContextMessage { text }
);
directive_action!(
    /// Layers an inference override over this step's request.
    SetInferenceOverride, "awaken.loop.set_inference_override", InferenceOverride,
    |inference| DirectiveChange::SetInferenceOverride { inference }
);
directive_action!(
    /// Removes a tool from this step's request: payload is the tool id.
    ExcludeTool, "awaken.loop.exclude_tool", String, |tool| DirectiveChange::ExcludeTool { tool }
);
directive_action!(
    /// Offers only these tools in this step's request.
    IncludeOnlyTools, "awaken.loop.include_only_tools", Vec<String>, |tools| DirectiveChange::IncludeOnlyTools { tools }
);

/// The loop-actions plugin.
pub struct LoopActionsPlugin {
    manifest: PluginManifest,
}

impl Default for LoopActionsPlugin {
    fn default() -> Self {
        Self {
            manifest: PluginManifest::new(LOOP_ACTIONS_PLUGIN),
        }
    }
}

impl Plugin for LoopActionsPlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }

    fn lifecycle_hooks(&self) -> LifecycleHooks {
        LifecycleHooks::NONE
    }

    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_key::<StepDirectivesKey>(KeyOptions::new().with_scope(KeyScope::Ephemeral))?;
        r.register_key::<crate::resume::ResumeDecisionsKey>(
            KeyOptions::new().with_scope(KeyScope::Run),
        )?;
        r.register_key::<crate::intercept::CallInterceptKey>(
            KeyOptions::new().with_scope(KeyScope::Ephemeral),
        )?;
        r.register_key::<crate::delegate::child::DelegationDepthKey>(
            KeyOptions::new().with_scope(KeyScope::Run),
        )?;
        r.register_key::<crate::delegate::remote::RemoteWaitsKey>(
            KeyOptions::new()
                .with_scope(KeyScope::Run)
                .with_merge(MergeStrategy::Commutative),
        )?;
        r.register_scheduled_action::<crate::intercept::InterceptToolCall, _>(
            crate::intercept::InterceptHandler,
        )?;
        r.register_scheduled_action::<AddContextMessage, _>(LoopActionHandler)?;
        r.register_scheduled_action::<SetInferenceOverride, _>(LoopActionHandler)?;
        r.register_scheduled_action::<ExcludeTool, _>(LoopActionHandler)?;
        r.register_scheduled_action::<IncludeOnlyTools, _>(LoopActionHandler)
    }
}

/// What the run has done so far, for stop conditions; carried over a resume.
///
/// Stored with every commit of the run and kept with the finished run, so its JSON leaves out
/// what is zero or empty (a missing field reads back as zero or empty): a run without tool
/// failures, reported usage or tools in its step stores two counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStats {
    /// Inferences made.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inferences: u32,
    /// Steps completed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub steps: u32,
    /// Tool calls that failed in a row (reset by a success).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub consecutive_errors: u32,
    /// Effect handlers that failed (the run went on; each was reported as a warning).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub handler_failures: u32,
    /// Token usage.
    #[serde(default, skip_serializing_if = "is_no_usage")]
    pub usage: TokenUsage,
    /// Tools whose calls completed, in the latest step. Shared lists of shared strings: the
    /// statistics are copied on every update while a snapshot holds them, and a copy of a
    /// shared list allocates nothing (an added tool makes a new list).
    #[serde(default = "no_tools", skip_serializing_if = "slice_is_empty")]
    pub tools_in_step: Arc<[Arc<str>]>,
    /// Tools whose calls completed in the last step that ended (what the step count took from
    /// `tools_in_step`): a run recovered between steps still applies `StopOnTool` to them.
    #[serde(default = "no_tools", skip_serializing_if = "slice_is_empty")]
    pub last_step_tools: Arc<[Arc<str>]>,
    /// The receipts of the steering messages the run took that came with one
    /// ([`Steering::send_with_receipt`](crate::Steering::send_with_receipt)), in the order
    /// taken: stored with the messages, they tell which ones the run has (empty: no
    /// allocation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steering_receipts: Vec<SteeringReceipt>,
}

impl RunStats {
    /// The statistics of a stored run state (the defaults when it holds none, or holds
    /// something else under their key).
    pub fn of_stored(state: &awaken_state::PersistedState) -> Self {
        state
            .values
            .get(RunStatsKey::KEY)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }
}

fn slice_is_empty<T>(list: &Arc<[T]>) -> bool {
    list.is_empty()
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_no_usage(usage: &TokenUsage) -> bool {
    *usage == TokenUsage::default()
}

thread_local! {
    static NO_TOOLS: Arc<[Arc<str>]> = Vec::new().into_iter().collect();
}

/// An empty tool list: this thread's own (`Arc::default()` of a slice is one static the whole
/// process shares, whose count every worker thread would change each step).
fn no_tools() -> Arc<[Arc<str>]> {
    NO_TOOLS.try_with(Arc::clone).unwrap_or_default()
}

impl Default for RunStats {
    fn default() -> Self {
        Self {
            inferences: 0,
            steps: 0,
            consecutive_errors: 0,
            handler_failures: 0,
            usage: TokenUsage::default(),
            tools_in_step: no_tools(),
            last_step_tools: no_tools(),
            steering_receipts: Vec::new(),
        }
    }
}

/// A change to [`RunStats`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StatsUpdate {
    /// An inference with its usage.
    Inference {
        /// Its usage.
        usage: TokenUsage,
    },
    /// A tool call closed.
    ToolClosed {
        /// The tool id.
        tool: Arc<str>,
        /// Whether it failed.
        failed: bool,
    },
    /// A step ended.
    StepEnded,
    /// Effect handlers failed.
    HandlersFailed {
        /// How many.
        count: u32,
    },
    /// Steering messages with receipts were taken at a step.
    Steered {
        /// Their receipts, in the order taken.
        receipts: Vec<Arc<str>>,
        /// The step.
        step: u32,
    },
}

/// The state key of [`RunStats`].
pub struct RunStatsKey;

impl StateKey for RunStatsKey {
    const KEY: &'static str = "awaken.stop.run_stats";
    type Value = RunStats;
    type Update = StatsUpdate;
    // Counting never fails: the statistics are counted in place.
    const APPLY_IN_PLACE: bool = true;

    fn apply(value: &mut RunStats, update: StatsUpdate) -> Result<(), StateError> {
        match update {
            StatsUpdate::Inference { usage } => {
                value.inferences = value.inferences.saturating_add(1);
                value.usage.add(&usage);
            }
            StatsUpdate::ToolClosed { tool, failed } => {
                value.consecutive_errors = if failed {
                    value.consecutive_errors.saturating_add(1)
                } else {
                    0
                };
                // One allocation, at the list's new length.
                value.tools_in_step = value
                    .tools_in_step
                    .iter()
                    .cloned()
                    .chain(std::iter::once(tool))
                    .collect();
            }
            StatsUpdate::StepEnded => {
                value.steps = value.steps.saturating_add(1);
                value.last_step_tools = std::mem::replace(&mut value.tools_in_step, no_tools());
            }
            StatsUpdate::HandlersFailed { count } => {
                value.handler_failures = value.handler_failures.saturating_add(count);
            }
            StatsUpdate::Steered { receipts, step } => value.steering_receipts.extend(
                receipts
                    .into_iter()
                    .map(|receipt| SteeringReceipt { receipt, step }),
            ),
        }
        Ok(())
    }
}

/// `K` in `snapshot`, through its handle when the run's registry has one (a key the registry
/// lacks is the error `Snapshot::get` gives).
pub(crate) fn read_key<K: StateKey>(
    snapshot: &Snapshot,
    key: Option<KeyHandle<K>>,
) -> Result<&K::Value, StateError> {
    match key {
        Some(key) => snapshot.get_by(key),
        None => snapshot.get::<K>(),
    }
}

/// `f` of the run statistics in `snapshot`, read in place through `key` when the run's
/// registry has it (the defaults when absent).
pub(crate) fn stats_at_in<T>(
    snapshot: &Snapshot,
    key: Option<KeyHandle<RunStatsKey>>,
    f: impl FnOnce(&RunStats) -> T,
) -> T {
    match read_key(snapshot, key) {
        Ok(stats) => f(stats),
        Err(_) => f(&RunStats::default()),
    }
}

/// A stop asked by a plugin (first request wins).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopRequest {
    /// Machine-readable code.
    pub code: String,
    /// Human-readable detail.
    pub detail: String,
}

/// The state key holding the first stop request.
pub struct StopRequestKey;

impl StateKey for StopRequestKey {
    const KEY: &'static str = "awaken.stop.request";
    type Value = Option<StopRequest>;
    type Update = StopRequest;

    fn apply(value: &mut Option<StopRequest>, update: StopRequest) -> Result<(), StateError> {
        if value.is_none() {
            *value = Some(update);
        }
        Ok(())
    }
}

/// The action a plugin schedules to end the run as `Stopped { code, detail }` at the end of
/// the current step.
pub struct RequestStop;

impl ScheduledActionSpec for RequestStop {
    const KEY: &'static str = "awaken.stop.request_stop";
    const PHASE: Phase = Phase::StepEnd;
    type Payload = StopRequest;
}

/// Records stop requests.
pub struct RequestStopHandler;

#[async_trait]
impl ActionHandler<RequestStop> for RequestStopHandler {
    async fn handle(
        &self,
        _ctx: &PhaseContext,
        request: StopRequest,
    ) -> Result<StateCommand, HookError> {
        Ok(StateCommand::new().with_update::<StopRequestKey>(request))
    }
}

/// The stop-conditions plugin: its keys and the `RequestStop` action; the loop evaluates the
/// conditions after every step.
pub struct StopConditionsPlugin {
    manifest: PluginManifest,
}

impl Default for StopConditionsPlugin {
    fn default() -> Self {
        Self {
            manifest: PluginManifest::new(STOP_CONDITIONS_PLUGIN),
        }
    }
}

impl Plugin for StopConditionsPlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }

    fn lifecycle_hooks(&self) -> LifecycleHooks {
        LifecycleHooks::NONE
    }

    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_key::<RunStatsKey>(KeyOptions::new().with_scope(KeyScope::Run))?;
        r.register_key::<StopRequestKey>(KeyOptions::new().with_scope(KeyScope::Run))?;
        r.register_scheduled_action::<RequestStop, _>(RequestStopHandler)
    }
}

/// The runtime's [`BuiltinPlugins`]: loop actions and stop conditions for every agent; the
/// context-transform and compaction plugins (`awaken-context`) when the agent sets a
/// `context_policy` — made afresh for every resolution, since they cache one run's token counts.
#[derive(Clone)]
pub struct RuntimeBuiltins {
    loop_actions: Arc<dyn Plugin>,
    stop_conditions: Arc<dyn Plugin>,
    model_pool: Arc<dyn Plugin>,
    /// Where a context policy's summary model and its provider are looked up (none: a policy
    /// with a compaction threshold fails resolution).
    registries: Option<Arc<awaken_resolver::Registries>>,
    /// The context plugins' token estimator.
    estimator: Arc<dyn awaken_context::TokenEstimator>,
}

impl Default for RuntimeBuiltins {
    fn default() -> Self {
        Self {
            loop_actions: Arc::new(LoopActionsPlugin::default()),
            stop_conditions: Arc::new(StopConditionsPlugin::default()),
            model_pool: Arc::new(ModelPoolPlugin {
                manifest: PluginManifest::new(MODEL_POOL_PLUGIN),
            }),
            registries: None,
            estimator: Arc::new(awaken_context::DefaultEstimator),
        }
    }
}

impl RuntimeBuiltins {
    /// The built-ins of a runtime over `registries` (where a context policy's summary model
    /// and its provider are found).
    pub fn new(registries: Arc<awaken_resolver::Registries>) -> Self {
        Self {
            registries: Some(registries),
            ..Self::default()
        }
    }

    /// Sets the context plugins' token estimator (default: `DefaultEstimator`).
    pub fn with_estimator(mut self, estimator: Arc<dyn awaken_context::TokenEstimator>) -> Self {
        self.estimator = estimator;
        self
    }
}

/// The summary models of a context policy, looked up in the runtime's registries: a model, or
/// a model pool (resolved as for an agent, to the same pool).
struct SummaryModelsIn<'a>(Option<&'a awaken_resolver::Registries>);

impl awaken_context::SummaryModels for SummaryModelsIn<'_> {
    fn model(&self, id: &str) -> Option<ModelSpec> {
        let registries = self.0?;
        match registries.model_pool(id) {
            // A pool that cannot be built is reported by validation with its reason.
            Some(_) => registries
                .resolve_model(id)
                .ok()
                .map(|resolved| (*resolved.spec).clone()),
            None => registries.model(id).map(|m| (*m).clone()),
        }
    }

    fn executor(&self, model: &ModelSpec) -> Option<Arc<dyn awaken_llm::LlmExecutor>> {
        let registries = self.0?;
        match registries.model_pool(&model.id) {
            Some(_) => registries.resolve_model(&model.id).ok().map(|r| r.executor),
            None => registries.provider(&model.provider),
        }
    }
}

impl BuiltinPlugins for RuntimeBuiltins {
    fn builtin_plugins(
        &self,
        spec: &AgentSpec,
        model: &ModelSpec,
    ) -> Result<Vec<Arc<dyn Plugin>>, String> {
        let mut plugins = vec![self.loop_actions.clone(), self.stop_conditions.clone()];
        if let Some(registries) = &self.registries
            && registries.model_pool(&model.id).is_some()
        {
            plugins.push(self.model_pool.clone());
        }
        if spec.context_policy.is_some() {
            let models = SummaryModelsIn(self.registries.as_deref());
            let context = awaken_context::ContextPlugins::for_agent(
                spec,
                model,
                &models,
                self.estimator.clone(),
            )
            .map_err(|e| e.to_string())?;
            plugins.extend(context);
        }
        Ok(plugins)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(names: &[&str]) -> Arc<[Arc<str>]> {
        names.iter().map(|n| Arc::from(*n)).collect()
    }

    #[test]
    fn run_stats_store_only_what_is_not_zero_or_empty() {
        let fresh = RunStats::default();
        assert_eq!(serde_json::to_string(&fresh).expect("json"), "{}");
        let quiet = RunStats {
            inferences: 5,
            steps: 5,
            ..RunStats::default()
        };
        assert_eq!(
            serde_json::to_string(&quiet).expect("json"),
            r#"{"inferences":5,"steps":5}"#
        );
        for stats in [fresh, quiet] {
            let text = serde_json::to_string(&stats).expect("json");
            assert_eq!(
                serde_json::from_str::<RunStats>(&text).expect("read"),
                stats
            );
        }
    }

    #[test]
    fn run_stats_round_trip_whole_and_read_the_earlier_form() {
        let busy = RunStats {
            inferences: 3,
            steps: 2,
            consecutive_errors: 1,
            handler_failures: 2,
            usage: TokenUsage {
                input_tokens: 10,
                output_tokens: 4,
                ..TokenUsage::default()
            },
            tools_in_step: tools(&["echo"]),
            last_step_tools: tools(&["echo", "search"]),
            steering_receipts: vec![SteeringReceipt {
                receipt: "41".into(),
                step: 2,
            }],
        };
        let text = serde_json::to_string(&busy).expect("json");
        let mut stored = awaken_state::PersistedState::default();
        stored.values.insert(
            RunStatsKey::KEY.to_owned(),
            serde_json::from_str(&text).expect("value"),
        );
        assert_eq!(RunStats::of_stored(&stored), busy);
        assert_eq!(serde_json::from_str::<RunStats>(&text).expect("read"), busy);
        // Stored before zero fields were left out: every field written.
        let earlier = r#"{"inferences":5,"steps":5,"consecutive_errors":0,"usage":{"input_tokens":0,"output_tokens":0},"tools_in_step":[]}"#;
        assert_eq!(
            serde_json::from_str::<RunStats>(earlier).expect("read"),
            RunStats {
                inferences: 5,
                steps: 5,
                ..RunStats::default()
            }
        );
    }
}
