//! The agent loop: a built run driven from its first commit to `RunFinish` through the phase
//! engine. [`Run`] holds what every step needs; its behaviour is split by stage:
//! `lifecycle` (opening and the one exit path) with `lease`, `step` (the step loop), `resumed`
//! (the first step of a resumed or recovered run), `inference`, `calls` and `concurrent` (the
//! tool calls), `invoke` (one tool's invocation), `stop` (stop conditions), `phase` (phases and
//! commands), `events` (events, open calls, messages and checkpoints) and `visible` (the state
//! shown to clients). This file names none of them: they add `impl Run` blocks.

use std::sync::Arc;

use awaken_event::{
    CancellationToken, CancelledOwned, EventSink, History, Message, RunId, ToolCallId,
    ToolCallResume, ToolDescriptor,
};
use awaken_llm::{InferenceExecutionError, ResponseCollector};
use awaken_phase::{PhaseEngine, PhaseError, RunIdentity};
use awaken_plugin::{LifecycleDispatcher, ToolGateHook};
use awaken_resolver::ResolvedAgent;
use awaken_spec::{InferenceOverride, Sections};
use awaken_state::KeyHandle;
use awaken_tool::{ToolBatch, ToolCallScope};

use crate::builtins::{RunStatsKey, StepDirectivesKey, StopRequestKey};
use crate::durable::Durable;
use crate::intercept::CallInterceptKey;
use crate::progress::ProgressQueue;
use crate::steering::Steering;

mod calls;
mod concurrent;
mod events;
mod inference;
mod invoke;
mod lease;
pub(crate) mod lifecycle;
mod phase;
mod resumed;
mod step;
mod stop;
mod visible;

/// A run being driven: what every step needs, kept for the activation's whole life (in the box
/// the activation built it in).
pub(crate) struct Run<'a> {
    sink: &'a dyn EventSink,
    // Kept in the box the resolver made (not copied out of it).
    resolved: Box<ResolvedAgent>,
    engine: PhaseEngine,
    identity: Arc<RunIdentity>,
    cancel: CancellationToken,
    /// Messages for the run, taken at the start of each step.
    steering: Steering,
    /// Shared with phase contexts and requests; appended in place once they are gone, so a
    /// step's cost does not grow with the thread.
    history: History,
    /// Boxed: most runs have none.
    run_override: Option<Box<InferenceOverride>>,
    gates: Vec<(String, Arc<dyn ToolGateHook>)>,
    /// The agent's sections, shared by every phase context of the run.
    sections: Arc<Sections>,
    lifecycle: LifecycleDispatcher,
    /// Whether the `chat` spans record message content.
    span_content: bool,
    step: u32,
    /// The step count when this activation began (a resumed run continues its numbering).
    first_step: u32,
    response: Option<String>,
    durable: Durable,
    /// The current step's tool batch.
    batch: Option<ToolBatch>,
    /// How this activation continues an earlier one, if it does (boxed: most activations
    /// start afresh).
    resume: Option<Box<Continue>>,
    /// Compaction fallbacks already reported (a new one becomes a warning event).
    seen_fallbacks: u64,
    /// The descriptors of the agent's tools, shared by every request of the run.
    tools: Arc<[ToolDescriptor]>,
    /// The request's strings (upstream model, system prompt, routing key), made once per run
    /// and shared by every request.
    request_strings: (Arc<str>, Option<Arc<str>>, Arc<str>),
    /// The call whose result commit was folded into the step's last commit (its `after_result`
    /// failpoint fires after that commit).
    folded_result: Option<ToolCallId>,
    /// The progress reports of the run's tool calls, emitted as events while a call runs.
    progress: Arc<ProgressQueue>,
    /// What every tool call's context shares (the ids, the cancellation, the progress queue),
    /// made once per run.
    tool_scope: ToolCallScope,
    /// Where the run's registry holds its statistics (read several times a step).
    stats_at: Option<KeyHandle<RunStatsKey>>,
    /// Where the run's registry holds the compaction state (`None`: the agent has no context
    /// policy, so nothing to read).
    compaction_at: Option<KeyHandle<awaken_context::CompactionKey>>,
    /// Where the run's registry holds the keys read every step or call: a plugin's stop
    /// request, the step's directives, an action's decision on a call (each found without a
    /// search by type).
    stop_at: Option<KeyHandle<StopRequestKey>>,
    directives_at: Option<KeyHandle<StepDirectivesKey>>,
    intercept_at: Option<KeyHandle<CallInterceptKey>>,
    /// What collects an inference's stream, and the calls its model began (by stream index):
    /// lent to each inference, so their lists are allocated once per run.
    collector: ResponseCollector,
    stream_calls: Vec<(u32, ToolCallId)>,
    /// The wait for the run's cancellation its inferences' streams share (made at the first
    /// inference; dropped, with the waker it registered, when the run ends).
    inference_waiter: Option<CancelledOwned>,
    /// The calls opened by an event (`ToolCallStart`, `ToolCallResumed`) and not yet closed by
    /// one (`ToolCallDone`, `ToolCallSuspended`): a step that fails closes them before it ends.
    open_calls: Vec<ToolCallId>,
    /// How many leading messages of the history are known to be sent as they are (no user
    /// message right after another, results in call order; a request looks only past them, see
    /// `Run::alternating`).
    alternating: u32,
    /// The watch of the agent's visible state keys (boxed: most agents have none, and then
    /// nothing watches the run's commits).
    visible: Option<Box<crate::shown::Visible>>,
    /// Steering messages whose commit failed: they wait in the run's pending commit, so the
    /// run's last commit decides whether they were taken (and at which step).
    steering_unanswered: Vec<(u32, crate::steering::Reply)>,
}

/// What a run is built from: everything the activation decided.
pub(crate) struct RunParts<'a> {
    pub(crate) sink: &'a dyn EventSink,
    pub(crate) resolved: Box<ResolvedAgent>,
    pub(crate) engine: PhaseEngine,
    pub(crate) identity: Arc<RunIdentity>,
    pub(crate) cancel: CancellationToken,
    pub(crate) steering: Steering,
    /// The thread's history, repaired.
    pub(crate) history: Vec<Message>,
    /// The activation's new messages.
    pub(crate) messages: Vec<Message>,
    pub(crate) run_override: Option<Box<InferenceOverride>>,
    pub(crate) lifecycle: LifecycleDispatcher,
    /// Whether the `chat` spans record message content.
    pub(crate) span_content: bool,
    pub(crate) durable: Durable,
    /// The stored batch of the run it continues.
    pub(crate) batch: Option<ToolBatch>,
    /// How it continues an earlier activation, if it does.
    pub(crate) resume: Option<Continue>,
    /// The parent run of a delegate's child run.
    pub(crate) parent_run_id: Option<RunId>,
}

impl<'a> Run<'a> {
    /// Builds the run from `parts`: its history (with the new messages, which the first commit
    /// writes), the per-run values every step shares, the registry positions of the keys it
    /// reads, and its `RunStart` fact pending for the first commit.
    pub(crate) fn new(parts: RunParts<'a>) -> Self {
        let RunParts {
            sink,
            resolved,
            engine,
            identity,
            cancel,
            steering,
            mut history,
            messages,
            run_override,
            lifecycle,
            span_content,
            durable,
            batch,
            resume,
            parent_run_id,
        } = parts;
        let gates = resolved
            .env
            .gate_hooks()
            .iter()
            .map(|g| (format!("{}/{}", g.plugin_id, g.name), g.hook.clone()))
            .collect();
        let sections = Arc::new(resolved.spec.sections.clone());
        let tools: Arc<[ToolDescriptor]> = resolved
            .tools
            .iter()
            .map(|t| t.tool.descriptor().clone())
            .collect();
        let request_strings = (
            Arc::<str>::from(resolved.model.upstream_model.as_str()),
            (!resolved.spec.system_prompt.is_empty())
                .then(|| Arc::<str>::from(resolved.spec.system_prompt.as_str())),
            Arc::<str>::from(identity.thread_id.as_str()),
        );
        let resumed = resume.is_some();
        // Room for the messages of a few steps, so a short run's history never grows (a
        // `realloc` takes the allocator arena's lock the other worker threads contend for).
        history.reserve(HISTORY_ROOM);
        let progress: Arc<ProgressQueue> = Arc::default();
        let tool_scope = ToolCallScope::new(
            identity.thread_id.clone(),
            identity.run_id.clone(),
            cancel.clone(),
        )
        .with_progress(progress.clone());
        let registry = engine.store().registry();
        let stats_at = registry.handle::<RunStatsKey>();
        let compaction_at = registry.handle::<awaken_context::CompactionKey>();
        let stop_at = registry.handle::<StopRequestKey>();
        let directives_at = registry.handle::<StepDirectivesKey>();
        let intercept_at = registry.handle::<CallInterceptKey>();
        let visible = crate::shown::Visible::of(registry);
        let mut run = Run {
            sink,
            resolved,
            engine,
            identity,
            cancel,
            steering,
            history: history.into(),
            run_override,
            gates,
            sections,
            lifecycle,
            span_content,
            step: 0,
            first_step: 0,
            response: None,
            durable,
            batch,
            resume: resume.map(Box::new),
            seen_fallbacks: 0,
            tools,
            request_strings,
            folded_result: None,
            progress,
            tool_scope,
            stats_at,
            compaction_at,
            stop_at,
            directives_at,
            intercept_at,
            collector: ResponseCollector::new(),
            stream_calls: Vec::new(),
            inference_waiter: None,
            open_calls: Vec::new(),
            alternating: 0,
            visible,
            steering_unanswered: Vec::new(),
        };
        let mut earlier_receipts = Vec::new();
        (run.seen_fallbacks, run.step) = run.engine.store().read(|s| {
            (
                run.compaction_fallbacks_in(s).0,
                run.stats_in(s, |s| {
                    earlier_receipts.clone_from(&s.steering_receipts);
                    s.steps
                }),
            )
        });
        if !earlier_receipts.is_empty() {
            // A continued run's messages taken before are not taken again if sent again.
            run.steering.taken_before(&earlier_receipts);
        }
        run.first_step = run.step;
        let span = tracing::Span::current();
        if !span.is_disabled() {
            span.record("run_id", tracing::field::display(&run.identity.run_id));
            if resumed {
                // A fresh run's span was named with its agent when it began.
                let agent = &*run.identity.agent_id;
                span.record("gen_ai.agent.name", agent);
                span.record("otel.name", format!("invoke_agent {agent}").as_str());
            }
        }
        for message in messages {
            run.push_message(message);
        }
        run.fact(awaken_event::AgentEvent::RunStart {
            thread_id: run.identity.thread_id.clone(),
            run_id: run.identity.run_id.clone(),
            agent_id: run.identity.agent_id.clone(),
            parent_run_id,
            resumed,
        });
        run
    }
}

/// How many more messages a run's history has room for when the run starts.
const HISTORY_ROOM: usize = 16;

/// How an activation continues an earlier one.
pub(crate) enum Continue {
    /// A human's resume: the decisions recorded earlier, and this activation's.
    Decide(Vec<ToolCallResume>, Vec<ToolCallResume>),
    /// A recovery after a crash: a `Requested` call is gated again, an `Executing` one follows
    /// its tool's recovery policy.
    Recover,
}

/// Why a step could not go on.
enum Failure {
    Cancelled,
    Error(String),
}

impl From<PhaseError> for Failure {
    fn from(e: PhaseError) -> Self {
        match e {
            PhaseError::Cancelled { .. } => Failure::Cancelled,
            other => Failure::Error(other.to_string()),
        }
    }
}

impl From<InferenceExecutionError> for Failure {
    fn from(e: InferenceExecutionError) -> Self {
        if e.is_cancelled() {
            Failure::Cancelled
        } else {
            Failure::Error(format!("inference failed: {e}"))
        }
    }
}

impl Failure {
    fn message_ref(&self) -> &str {
        match self {
            Failure::Cancelled => "cancelled",
            Failure::Error(m) => m,
        }
    }

    fn message(&self) -> String {
        match self {
            Failure::Cancelled => "cancelled".into(),
            Failure::Error(m) => m.clone(),
        }
    }

    /// The result of a call the failure left without one.
    fn call_reason(&self) -> &'static str {
        match self {
            Failure::Cancelled => "not executed: the run was cancelled",
            Failure::Error(_) => "not finished: the run failed",
        }
    }
}
