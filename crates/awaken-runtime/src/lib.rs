//! Awaken's agent runtime: [`AgentRuntimeBuilder`] over the resolver's registries, the agent
//! loop (each activation `RunStart` … `RunFinish` through the phase engine: `StepStart`,
//! `BeforeInference`, request transforms, streamed inference, `AfterInference`, the tool calls
//! with their gates, `StepEnd`), the built-in plugins (loop actions, stop conditions, context
//! management when the agent has a context policy, and the standard `permission` plugin), the
//! neutral event stream and typed termination.
//!
//! Every durable step is one `ThreadCommit` to the runtime's `ThreadStore` (memory by
//! default): the run's start, the assistant message with its calls `Requested`, each call
//! `Executing` before the tool runs, each result (the last one with the step's end), the run's
//! end. Lifecycle events are stored with their commit; events about committed facts are
//! emitted after it.
//!
//! Tool calls run one after another, or concurrently when the agent sets `parallel_tools`
//! (calls whose tools declare overlapping writes still one after another, in call order).
//! A suspended call parks the run until [`AgentRuntime::resume`] (in any process on the same
//! store); [`AgentRuntime::recover`] continues runs a crash cut short, through the store's
//! leases, and [`AgentRuntime::take_over`] the one of a given thread (a queued run, started
//! with the id [`RunActivation::with_run_id`] gave it); delegates run as child runs;
//! endpoint-backed agents run through their execution backend. A run with a profile id sees
//! the profile's keys and writes them with version guards; a write refused because another
//! thread changed the key is redone on the fresh value. A run on a model pool records the pool's members ([`ModelPoolKey`]), and its resume
//! or recovery runs on those members even when the pool has changed since.
//!
//! The code follows an activation's stages: `activation` loads the stored thread, decides
//! between a new run, a resume and a recovery, and builds the run; `run` drives it (the step
//! loop, inference, the tool calls, stop conditions, the one exit path); `durable` writes its
//! commits (the commit path and the profile journal). `runtime` and
//! `builder` are the façade; the value types (`request`, `outcome`, `error`, `handle`, `ids`)
//! are leaf modules, and no two files of the crate refer to each other in a circle.
//!
//! This crate must never know wire protocols or terminal UI.

mod activation;
mod active;
mod builder;
mod builtins;
mod delegate;
mod durable;
mod error;
#[doc(hidden)]
pub mod failpoint;
mod handle;
mod ids;
mod inner;
mod intercept;
mod outcome;
mod permission;
mod pool;
mod progress;
mod recovered;
mod repair;
mod request;
mod resume;
mod run;
mod runtime;
mod shown;
mod steering;
mod turns;

pub use active::ShutdownMode;
pub use builder::{AgentRuntimeBuilder, BuildError};
pub use builtins::{
    AddContextMessage, DirectiveChange, DirectiveUpdate, ExcludeTool, IncludeOnlyTools,
    LOOP_ACTIONS_PLUGIN, LoopActionHandler, LoopActionsPlugin, RequestStop, RequestStopHandler,
    RunStats, RunStatsKey, RuntimeBuiltins, STOP_CONDITIONS_PLUGIN, SetInferenceOverride,
    StatsUpdate, StepDirectives, StepDirectivesKey, StopConditionsPlugin, StopRequest,
    StopRequestKey,
};
pub use delegate::{
    DEFAULT_MAX_DELEGATION_DEPTH, DelegationDepthKey, RemoteWait, RemoteWaitUpdate, RemoteWaitsKey,
    delegate_tool_id,
};
pub use error::{CheckpointError, RunError};
pub use handle::RunHandle;
pub use ids::{IdSource, SequentialIds, SystemIds, process_worker_id};
pub use intercept::{CallIntercept, CallInterceptKey, InterceptHandler, InterceptToolCall};
pub use outcome::RunOutcome;
pub use permission::{PERMISSION_PLUGIN, PermissionGate, PermissionPlugin, PermissionRefusal};
pub use pool::ModelPoolKey;
pub use recovered::{RecoveredRun, Takeover};
pub use request::{RecoverConfig, RunActivation};
pub use resume::{DecisionError, DecisionsUpdate, Resume, ResumeDecisionsKey};
pub use runtime::AgentRuntime;
pub use steering::{NotTaken, Steering, SteeringReceipt, Taken};
