//! The agent loop: one activation from `RunStart` to `RunFinish` through the phase engine.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use awaken_event::{
    AgentEvent, CancellationToken, EventSink, History, Message, ResumeDecision, ResumeMode, RunId,
    SuspendTicket, TerminationReason, ThreadId, ToolCall, ToolCallId, ToolCallResume,
    ToolCallState, ToolDescriptor, ToolResult, WarningKind,
};
use awaken_llm::{
    CancellableStream, InferenceExecutionError, InferenceRequest, LlmStreamEvent, ResponseCollector,
};
use awaken_phase::{
    EffectFailure, Phase, PhaseContext, PhaseEngine, PhaseError, PhaseReport, RunIdentity,
    ToolPhaseInfo,
};
use awaken_plugin::{
    LifecycleDispatcher, LifecycleEvent, RunLifecycle, TokenCounts, TransformContext,
    apply_transforms,
};
use awaken_resolver::{BackendRequest, ResolvedAgent, ResolvedRunPlan, ResolvedTool};
use awaken_spec::{InferenceOverride, StopConditionSpec};
use awaken_state::{
    KeyScope, PersistedState, Snapshot, StateCommand, StateStore, UnknownKeyPolicy,
};
use awaken_store::{BatchWrite, ClaimedRun, LeaseToken, RunRecord, RunStatus};
use awaken_tool::{
    GateResolution, OUTCOME_UNKNOWN_MESSAGE, RecoveryAction, ToolBatch, ToolCallScope,
    ToolGateHook, ToolInterceptPayload, ToolOutput, evaluate_gates, pending_call,
};
use futures_util::StreamExt;
use tracing::Instrument;

use crate::builtins::{
    RunStats, RunStatsKey, StatsUpdate, StepDirectives, StepDirectivesKey, StopRequestKey,
};
use crate::durable::{CheckpointError, Durable, batch_set};
use crate::intercept::CallInterceptKey;
use crate::progress::ProgressQueue;
use crate::repair::repair_history;
use crate::resume::{
    DecisionsUpdate, Resume, ResumeDecisionsKey, recorded_decisions, suspended_calls,
    validate_decisions,
};
use crate::runtime::{AgentRuntime, RunActivation, RunError, RunOutcome};
use crate::turns;

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
}

enum StepEnd {
    Continue,
    End(TerminationReason),
}

/// How one tool call came out.
enum CallOutcome {
    Closed(ToolResult, ToolCallState),
    Suspended(Box<awaken_event::SuspendTicket>),
}

struct Run<'a> {
    sink: &'a dyn EventSink,
    // Kept in the box the resolver made (not copied out of it).
    resolved: Box<ResolvedAgent>,
    engine: PhaseEngine,
    identity: Arc<RunIdentity>,
    cancel: CancellationToken,
    /// Shared with phase contexts and requests; appended in place once they are gone, so a
    /// step's cost does not grow with the thread.
    history: History,
    /// Boxed: most runs have none, and every run's future holds this.
    run_override: Option<Box<InferenceOverride>>,
    gates: Vec<(String, Arc<dyn ToolGateHook>)>,
    /// The agent's sections, shared by every phase context of the run.
    sections: Arc<awaken_spec::Sections>,
    lifecycle: LifecycleDispatcher,
    step: u32,
    /// The step count when this activation began (a resumed run continues its numbering).
    first_step: u32,
    response: Option<String>,
    durable: Durable,
    /// The current step's tool batch.
    batch: Option<ToolBatch>,
    /// How this activation continues an earlier one, if it does.
    /// (Boxed: most activations start afresh.)
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
    stats_at: KeyAt,
    /// Where the run's registry holds the compaction state (`None`: the agent has no context
    /// policy, so nothing to read).
    compaction_at: KeyAt,
    /// Where the run's registry holds the keys read every step or call: a plugin's stop
    /// request, the step's directives, an action's decision on a call (each found without a
    /// search by type).
    stop_at: KeyAt,
    directives_at: KeyAt,
    intercept_at: KeyAt,
    /// What collects an inference's stream, and the calls its model began (by stream index):
    /// lent to each inference, so their lists are allocated once per run.
    collector: ResponseCollector,
    stream_calls: Vec<(u32, ToolCallId)>,
    /// The wait for the run's cancellation its inferences' streams share (made at the first
    /// inference; dropped, with the waker it registered, when the run ends).
    inference_waiter: Option<awaken_event::CancelledOwned>,
    /// The state revision of the last checkpoint's look at the state, with the step count and
    /// usage it read then.
    last_look: Option<(u64, u32, awaken_event::TokenUsage)>,
    /// The calls opened by an event (`ToolCallStart`, `ToolCallResumed`) and not yet closed by
    /// one (`ToolCallDone`, `ToolCallSuspended`): a step that fails closes them before it ends.
    open_calls: Vec<ToolCallId>,
    /// How many leading messages of the history are known to hold no user message right after
    /// another (a request looks only past them; see [`Run::alternating`]).
    alternating: u32,
}

/// A key's place in the run's registry, if it is registered: four bytes, not an
/// `Option<usize>`'s sixteen (every run's future holds five). A read without a place looks
/// the key up by its type.
#[derive(Debug, Clone, Copy)]
struct KeyAt(u32);

impl KeyAt {
    const NONE: KeyAt = KeyAt(u32::MAX);

    fn of(at: Option<usize>) -> Self {
        at.and_then(|at| u32::try_from(at).ok())
            .filter(|&at| at != u32::MAX)
            .map_or(Self::NONE, KeyAt)
    }

    fn get(self) -> Option<usize> {
        (self.0 != u32::MAX).then_some(self.0 as usize)
    }
}

/// How an activation continues an earlier one.
enum Continue {
    /// A human's resume: the decisions recorded earlier, and this activation's.
    Decide(Vec<ToolCallResume>, Vec<ToolCallResume>),
    /// A recovery after a crash: a `Requested` call is gated again, an `Executing` one follows
    /// its tool's recovery policy.
    Recover,
}

/// Runs `act`.
pub(crate) fn run<'a>(
    rt: &'a AgentRuntime,
    act: RunActivation,
    sink: &'a dyn EventSink,
) -> impl Future<Output = Result<RunOutcome, RunError>> + Send + 'a {
    activate(rt, Start::Fresh(act), sink)
}

/// Starts an activation. Not an `async fn`: what it starts from is boxed before the future is
/// made, so the run's future (memory every in-flight run holds) keeps a pointer, not a couple
/// of hundred bytes at each level that passes it on, for the whole run. The span and the
/// active-run entry are made when the future is first polled, as an `async fn` would.
fn activate<'a>(
    rt: &'a AgentRuntime,
    start: Start,
    sink: &'a dyn EventSink,
) -> impl Future<Output = Result<RunOutcome, RunError>> + Send + 'a {
    let start = Box::new(start);
    async move {
        let span = start.span();
        let Some(_active) = rt.active.enter(start.cancel()) else {
            return Err(RunError::ShuttingDown);
        };
        run_activation(rt, start, sink).instrument(span).await
    }
}

/// An unfinished run to continue: claimed by `recover()` (with its lease) or found by a
/// delegate tool re-run after a crash (the parent's lease covers it).
pub(crate) struct Unfinished {
    pub(crate) thread_id: ThreadId,
    pub(crate) run_id: RunId,
    pub(crate) lease: Option<LeaseToken>,
}

impl From<ClaimedRun> for Unfinished {
    fn from(c: ClaimedRun) -> Self {
        Self {
            thread_id: c.thread_id,
            run_id: c.run.run_id,
            lease: Some(c.lease),
        }
    }
}

pub(crate) fn recover<'a>(
    rt: &'a AgentRuntime,
    claimed: Unfinished,
    cancel: CancellationToken,
    sink: &'a dyn EventSink,
) -> impl Future<Output = Result<RunOutcome, RunError>> + Send + 'a {
    activate(rt, Start::Recover(claimed, cancel), sink)
}

pub(crate) fn resume<'a>(
    rt: &'a AgentRuntime,
    resume: Resume,
    sink: &'a dyn EventSink,
) -> impl Future<Output = Result<RunOutcome, RunError>> + Send + 'a {
    activate(rt, Start::Resume(resume), sink)
}

/// What an activation starts from.
enum Start {
    /// A new run with new messages.
    Fresh(RunActivation),
    /// The waiting run of a thread, with decisions.
    Resume(Resume),
    /// An unfinished run claimed by `recover()` (its lease held by this runtime) or continued
    /// by a delegate tool, with the token that cancels it.
    Recover(Unfinished, CancellationToken),
}

impl Start {
    /// The activation's span (its run id recorded once known, unless it already is).
    fn span(&self) -> tracing::Span {
        match self {
            Start::Fresh(act) => tracing::info_span!(
                "run",
                thread_id = %act.thread_id,
                agent = %act.agent_id,
                run_id = tracing::field::Empty
            ),
            Start::Resume(resume) => tracing::info_span!(
                "resume",
                thread_id = %resume.thread_id,
                run_id = tracing::field::Empty
            ),
            Start::Recover(claimed, _) => tracing::info_span!(
                "recover",
                thread_id = %claimed.thread_id,
                run_id = %claimed.run_id
            ),
        }
    }

    /// The token that cancels the activation.
    fn cancel(&self) -> &CancellationToken {
        match self {
            Start::Fresh(act) => &act.cancel,
            Start::Resume(resume) => &resume.cancel,
            Start::Recover(_, cancel) => cancel,
        }
    }
}

/// The waiting run a resume continues.
/// (Boxed where it is made: most activations start afresh, and the preparation's future
/// holds it across its awaits.)
struct Resumed {
    record: RunRecord,
    batch: Option<ToolBatch>,
    run_state: PersistedState,
    /// Decisions recorded by earlier resumes, then this one's.
    recorded: Vec<ToolCallResume>,
    new: Vec<ToolCallResume>,
    /// A recovery (after a crash) rather than a human's resume.
    recovering: bool,
}

/// The stored tool batch of `thread_id`, decoded.
pub(crate) fn stored_batch(
    thread_id: &ThreadId,
    batch: Option<serde_json::Value>,
) -> Result<Option<ToolBatch>, RunError> {
    batch
        .map(serde_json::from_value::<ToolBatch>)
        .transpose()
        .map_err(|e| RunError::StoredBatch {
            thread_id: thread_id.clone(),
            message: e.to_string(),
        })
}

/// A run ready to drive: what `prepare_activation` hands to `run_activation`.
struct Ready<'a> {
    run: Run<'a>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
    lifecycle_run: RunLifecycle,
}

/// How an activation's preparation ended.
// Not boxed: the value is moved once, and boxing it would be one more allocation per run.
#[allow(clippy::large_enum_variant)]
enum Started<'a> {
    /// An endpoint-backed agent ran to its end on its backend.
    Done(RunOutcome),
    /// A local run, started (first commit in, `RunStart` dispatched).
    Ready(Ready<'a>),
}

async fn run_activation(
    rt: &AgentRuntime,
    start: Box<Start>,
    sink: &dyn EventSink,
) -> Result<RunOutcome, RunError> {
    // The preparation is held inline (see `prepare_activation`): its state is about the driven
    // run's, and a box of it would cost the run a slow allocation.
    let Ready {
        mut run,
        heartbeat,
        lifecycle_run,
    } = match prepare_activation(rt, start, sink).await? {
        Started::Done(outcome) => return Ok(outcome),
        Started::Ready(ready) => ready,
    };
    let termination = match run.drive().await {
        Ok(t) => t,
        Err(Failure::Cancelled) => TerminationReason::Cancelled,
        Err(Failure::Error(message)) => TerminationReason::Error { message },
    };
    let termination = run.finish(termination).await;
    match &termination {
        TerminationReason::Cancelled => {
            run.lifecycle
                .dispatch(
                    run.resolved.env.plugins(),
                    LifecycleEvent::RunCancel(&lifecycle_run),
                )
                .await;
        }
        TerminationReason::Error { message } => {
            run.lifecycle
                .dispatch(
                    run.resolved.env.plugins(),
                    LifecycleEvent::RunError(&lifecycle_run, message),
                )
                .await;
        }
        other => {
            run.lifecycle
                .dispatch(
                    run.resolved.env.plugins(),
                    LifecycleEvent::RunComplete(&lifecycle_run, other),
                )
                .await;
        }
    }
    release_lease(rt, &run, heartbeat).await;
    let usage = run.read_stats(|s| s.usage);
    Ok(RunOutcome {
        run_id: run.identity.run_id.clone(),
        termination,
        response: run.response,
        steps: run.step - run.first_step,
        usage,
    })
}

/// Everything before a run is driven: loads the thread, resolves the agent, builds the run,
/// makes its first commit, takes its lease, dispatches `RunStart`. In two parts, so that neither
/// part's locals are kept while the other awaits (an `async fn` keeps a slot for every local
/// that lives across any of its awaits): the whole is about the size of the driven run's state,
/// and the run's future holds it inline instead of boxing it (a box that large would come from
/// glibc's slow path on every run; see ADR 0025).
async fn prepare_activation<'a>(
    rt: &AgentRuntime,
    start: Box<Start>,
    sink: &'a dyn EventSink,
) -> Result<Started<'a>, RunError> {
    let built = match load_activation(rt, start, sink).await? {
        Loaded::Done(outcome) => return Ok(Started::Done(outcome)),
        Loaded::Local(built) => built,
    };
    Ok(Started::Ready(start_run(rt, built).await?))
}

/// What [`load_activation`] made: an endpoint-backed agent's finished activation, or the built
/// local run.
// Not boxed: moved once, out of a finished future.
#[allow(clippy::large_enum_variant)]
enum Loaded<'a> {
    Done(RunOutcome),
    Local(Built<'a>),
}

/// A built run and what [`start_run`] needs besides it.
struct Built<'a> {
    run: Run<'a>,
    notes: Vec<AgentEvent>,
    is_resume: bool,
    parent_run_id: Option<RunId>,
}

/// Loads the thread, resolves the agent (an endpoint-backed agent's activation runs here) and
/// builds the run, with its `RunStart` fact pending for the first commit. Everything after the
/// last await is plain stack data, not part of the future.
async fn load_activation<'a>(
    rt: &AgentRuntime,
    start: Box<Start>,
    sink: &'a dyn EventSink,
) -> Result<Loaded<'a>, RunError> {
    let thread_id = match &*start {
        Start::Fresh(a) => a.thread_id.clone(),
        Start::Resume(r) => r.thread_id.clone(),
        Start::Recover(c, _) => c.thread_id.clone(),
    };
    let checkpoint = (*rt.store)
        .load_checkpoint(&thread_id)
        .await
        .map_err(RunError::Store)?;
    let mut history = Vec::new();
    let mut persisted = 0;
    let mut thread_state = None;
    let mut waiting: Option<(RunRecord, ToolBatch, PersistedState)> = None;
    // The unfinished run a recovery continues: its record, batch (if any) and run state.
    let mut unfinished: Option<(RunRecord, Option<ToolBatch>, PersistedState)> = None;
    let mut last_run_id = None;
    if let Some(cp) = checkpoint {
        persisted = cp.message_count();
        last_run_id = cp.run.as_ref().map(|r| r.run_id.clone());
        if let Start::Recover(claimed, _) = &*start
            && let Some(record) = &cp.run
            && record.run_id == claimed.run_id
            && record.status == RunStatus::Running
        {
            let batch = stored_batch(&thread_id, cp.batch.clone())?;
            unfinished = Some((record.clone(), batch, cp.run_state.clone()));
        } else if let Some(record) = cp.run
            && record.status == RunStatus::Waiting
        {
            let batch =
                stored_batch(&thread_id, cp.batch)?.ok_or_else(|| RunError::StoredBatch {
                    thread_id: thread_id.clone(),
                    message: "the waiting run has no tool batch".into(),
                })?;
            waiting = Some((record, batch, cp.run_state));
        }
        history = cp.messages;
        thread_state = Some(cp.thread_state);
    }
    let mut notes = Vec::new();
    let mut lease = None;
    // A fresh run's requested id and parent (a delegate's child run), if any.
    let mut requested: (Option<RunId>, Option<RunId>) = (None, None);
    let (agent_id, profile_id, messages, cancel, inference, resumed) = match *start {
        Start::Recover(claimed, cancel) => {
            let Some((record, batch, run_state)) = unfinished else {
                return Err(RunError::NotRecoverable {
                    thread_id,
                    run_id: claimed.run_id,
                });
            };
            lease = claimed.lease;
            (
                record.agent_id.clone(),
                record.profile_id.clone(),
                Vec::new(),
                cancel,
                None,
                Some(Box::new(Resumed {
                    record,
                    batch,
                    run_state,
                    recorded: Vec::new(),
                    new: Vec::new(),
                    recovering: true,
                })),
            )
        }
        Start::Fresh(act) => {
            if let Some((record, batch)) = waiting.map(|(r, b, _)| (r, b)) {
                if !act.supersede {
                    return Err(RunError::ThreadWaiting {
                        thread_id,
                        run_id: record.run_id,
                        calls: suspended_calls(&batch)
                            .into_iter()
                            .map(|(id, _)| id)
                            .collect(),
                    });
                }
                // Boxed: a rare path, whose state need not be part of every preparation.
                let closed = Box::pin(supersede(rt, &thread_id, record, batch, persisted)).await?;
                persisted += closed.len() as u64;
                notes.push(AgentEvent::Warning {
                    kind: WarningKind::Other,
                    detail: format!(
                        "superseded the waiting calls {}",
                        closed
                            .iter()
                            .filter_map(|m| m.tool_call_id.as_ref().map(ToString::to_string))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
                history.extend(closed);
            }
            requested = (act.run_id, act.parent_run_id);
            (
                Arc::<str>::from(act.agent_id),
                act.profile_id,
                act.messages,
                act.cancel,
                // (Boxed from here on: most activations have none.)
                act.inference.map(Box::new),
                None,
            )
        }
        Start::Resume(resume) => {
            let Some((record, batch, run_state)) = waiting else {
                return Err(RunError::NotWaiting { thread_id });
            };
            let recorded = recorded_decisions(&run_state).map_err(|e| RunError::StoredBatch {
                thread_id: thread_id.clone(),
                message: format!("the recorded decisions do not decode: {e}"),
            })?;
            validate_decisions(&batch, &recorded, &resume.decisions).map_err(|source| {
                RunError::Decision {
                    thread_id: thread_id.clone(),
                    source,
                }
            })?;
            (
                record.agent_id.clone(),
                record.profile_id.clone(),
                Vec::new(),
                resume.cancel,
                None,
                Some(Box::new(Resumed {
                    record,
                    batch: Some(batch),
                    run_state,
                    recorded,
                    new: resume.decisions,
                    recovering: false,
                })),
            )
        }
    };
    let resolved = match rt.resolver.plan(&agent_id)? {
        ResolvedRunPlan::Local(agent) => agent,
        ResolvedRunPlan::Backend(b) if resumed.is_none() => {
            // An endpoint-backed agent: its backend runs the activation (and keeps its thread).
            let run_id = rt.ids.next_run_id();
            let request = BackendRequest {
                thread_id,
                run_id: run_id.clone(),
                messages,
                overrides: inference.map(|i| *i),
                cancel,
            };
            let outcome = b
                .backend
                .run(&b.spec, request, sink)
                .await
                .map_err(RunError::Backend)?;
            return Ok(Loaded::Done(RunOutcome {
                run_id,
                termination: outcome.termination,
                response: outcome.response,
                steps: 0,
                usage: outcome.usage,
            }));
        }
        ResolvedRunPlan::Backend(b) => {
            return Err(RunError::BackendPlan {
                agent_id: agent_id.to_string(),
                backend: b.backend.id().to_owned(),
            });
        }
    };
    let (requested_run_id, parent_run_id) = match &resumed {
        Some(r) => (
            Some(r.record.run_id.clone()),
            r.record.parent_run_id.clone(),
        ),
        None => requested,
    };
    let run_id = requested_run_id.unwrap_or_else(|| rt.ids.next_run_id());
    if resumed.is_none() && last_run_id.as_ref() == Some(&run_id) {
        // A new run must never be written into an earlier run's record.
        return Err(RunError::RunIdTaken { thread_id, run_id });
    }
    let identity = Arc::new(RunIdentity {
        thread_id: thread_id.clone(),
        run_id,
        agent_id: agent_id.clone(),
        profile_id: profile_id.clone(),
    });
    // A run with a profile journals its profile writes, to redo them after a conflict.
    let store = Arc::new(match &profile_id {
        Some(_) => StateStore::with_journal(resolved.env.shared_keys().clone(), KeyScope::Profile),
        None => StateStore::new(resolved.env.shared_keys().clone()),
    });
    let restore_error = |e| RunError::State {
        thread_id: thread_id.clone(),
        source: e,
    };
    if let Some(state) = &thread_state {
        store
            .restore(state, UnknownKeyPolicy::Skip)
            .map_err(restore_error)?;
    }
    if let Some(r) = &resumed {
        store
            .restore(&r.run_state, UnknownKeyPolicy::Skip)
            .map_err(restore_error)?;
    }
    // The profile's keys, as they are now, with the versions they were read at.
    let mut profile_versions = None;
    if let Some(profile) = &profile_id {
        let state = rt
            .store
            .load_profile(profile)
            .await
            .map_err(RunError::Store)?;
        store
            .restore(&state.to_persisted(), UnknownKeyPolicy::Skip)
            .map_err(restore_error)?;
        profile_versions = Some(
            state
                .keys
                .iter()
                .map(|(k, e)| (k.clone(), e.version))
                .collect(),
        );
    }
    // A history with unpaired calls or results never reaches a provider.
    // Calls still open in the batch are answered by this activation, not by the repair.
    let open: HashSet<ToolCallId> = resumed
        .as_ref()
        .and_then(|r| r.batch.as_ref())
        .map(|b| b.open_calls().map(|c| c.id().clone()).collect())
        .unwrap_or_default();
    for repair in repair_history(&mut history, &open) {
        notes.push(AgentEvent::Warning {
            kind: WarningKind::HistoryRepaired,
            detail: repair,
        });
    }
    let record = match &resumed {
        None => {
            let mut record = RunRecord::new(
                identity.run_id.clone(),
                agent_id.clone(),
                rt.ids.timestamp(),
            );
            record.profile_id = profile_id.clone();
            // The resolver's digest, shared by every run of the agent: the record is copied
            // into every commit, so its count passes between the worker threads a few times a
            // step, which costs less than a copy per run (an allocation, and 88 bytes more that
            // the memory store keeps for every finished run).
            record.spec_digest = Arc::clone(&resolved.spec_digest);
            record.parent_run_id = parent_run_id.clone();
            record
        }
        Some(r) => {
            let mut record = r.record.clone();
            if record.spec_digest != resolved.spec_digest {
                notes.push(AgentEvent::Warning {
                    kind: WarningKind::SpecChanged,
                    detail: format!(
                        "agent `{agent_id}` changed while the run waited (spec digest {} → {})",
                        record.spec_digest, resolved.spec_digest
                    ),
                });
                record.spec_digest = Arc::clone(&resolved.spec_digest);
            }
            record.status = RunStatus::Running;
            record.termination = None;
            record
        }
    };
    let mut durable = Durable::new(
        rt.store.clone(),
        rt.ids.clone(),
        thread_id.clone(),
        record,
        persisted,
        store.revision(),
    );
    durable.set_lease(lease);
    durable.profile = profile_versions.map(|v| Box::new(crate::durable::ProfileJournal::new(v)));
    let engine = PhaseEngine::new(store, resolved.env.phase_env().clone());
    if resumed.is_some() {
        // Actions queued before the wait whose handler the re-resolved agent no longer has.
        match engine
            .dead_letter_unhandled("its handler is gone: the agent changed while the run waited")
        {
            Ok(letters) => {
                notes.extend(letters.into_iter().map(|l| AgentEvent::ActionDeadLettered {
                    action: l.action.key,
                    phase: l.action.phase,
                    reason: l.reason,
                }))
            }
            Err(e) => notes.push(AgentEvent::Error {
                message: e.to_string(),
            }),
        }
    }
    let gates = resolved
        .env
        .gate_hooks()
        .iter()
        .map(|g| (format!("{}/{}", g.plugin_id, g.name), g.hook.clone()))
        .collect();
    let resolved_sections = resolved.spec.sections.clone();
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
    let is_resume = resumed.is_some();
    let (batch, resume_decisions) = match resumed.map(|r| *r) {
        Some(r) if r.recovering => (r.batch, Some(Continue::Recover)),
        Some(r) => (r.batch, Some(Continue::Decide(r.recorded, r.new))),
        None => (None, None),
    };
    // Room for the messages of a few steps: a short run's history never grows (with glibc,
    // every `realloc` takes its arena's lock, which the other worker threads contend for).
    history.reserve(HISTORY_ROOM);
    let progress: Arc<ProgressQueue> = Arc::default();
    let tool_scope = ToolCallScope::new(
        identity.thread_id.clone(),
        identity.run_id.clone(),
        cancel.clone(),
    )
    .with_progress(progress.clone());
    let mut run = Run {
        sink,
        resolved,
        engine,
        identity,
        cancel,
        history: history.into(),
        run_override: inference,
        gates,
        sections: Arc::new(resolved_sections),
        lifecycle: rt.lifecycle.clone(),
        step: 0,
        first_step: 0,
        response: None,
        durable,
        batch,
        resume: resume_decisions.map(Box::new),
        seen_fallbacks: 0,
        tools,
        request_strings,
        folded_result: None,
        progress,
        tool_scope,
        stats_at: KeyAt::NONE,
        compaction_at: KeyAt::NONE,
        stop_at: KeyAt::NONE,
        directives_at: KeyAt::NONE,
        intercept_at: KeyAt::NONE,
        collector: ResponseCollector::new(),
        stream_calls: Vec::new(),
        inference_waiter: None,
        last_look: None,
        open_calls: Vec::new(),
        alternating: 0,
    };
    let registry = run.engine.store().registry();
    run.stats_at = KeyAt::of(registry.position_of::<RunStatsKey>());
    run.compaction_at = KeyAt::of(registry.position_of::<awaken_context::CompactionKey>());
    run.stop_at = KeyAt::of(registry.position_of::<StopRequestKey>());
    run.directives_at = KeyAt::of(registry.position_of::<StepDirectivesKey>());
    run.intercept_at = KeyAt::of(registry.position_of::<CallInterceptKey>());
    (run.seen_fallbacks, run.step) = run.engine.store().read(|s| {
        (
            run.compaction_fallbacks_in(s).0,
            run.stats_in(s, |s| s.steps),
        )
    });
    run.first_step = run.step;
    tracing::Span::current().record("run_id", tracing::field::display(&run.identity.run_id));
    for message in messages {
        run.push_message(message);
    }
    run.durable.fact(AgentEvent::RunStart {
        thread_id: run.identity.thread_id.clone(),
        run_id: run.identity.run_id.clone(),
        agent_id: run.identity.agent_id.clone(),
        parent_run_id: parent_run_id.clone(),
        resumed: is_resume,
    });
    Ok(Loaded::Local(Built {
        run,
        notes,
        is_resume,
        parent_run_id,
    }))
}

/// Starts the built run: takes its lease, makes its first commit, dispatches `RunStart`.
/// Not an `async fn`: the block works on the run where it was moved in (an `async fn` would
/// keep its argument and a second copy of the run).
// The `async fn` clippy suggests is the copy this avoids.
#[allow(clippy::manual_async_fn)]
fn start_run<'a, 'r>(
    rt: &'r AgentRuntime,
    mut built: Built<'a>,
) -> impl Future<Output = Result<Ready<'a>, RunError>> + Send + 'r
where
    'a: 'r,
{
    async move {
        let run = &mut built.run;
        // A runtime with a worker identity holds the lease of every run it drives (a
        // recovery's lease comes with its claim): taken before a resume writes anything (so
        // two processes never continue one waiting run), and right after a new run's first
        // commit creates it.
        let claimed_already = run.durable.lease().is_some();
        let mut heartbeat = None;
        if built.is_resume && !claimed_already {
            heartbeat = hold_lease(rt, run).await?;
        }
        // The activation exists once this first commit is in: its record and the new
        // messages.
        if let Err(e) = run.commit_changes(BatchWrite::Keep).await {
            let e = RunError::Checkpoint {
                thread_id: run.identity.thread_id.clone(),
                message: e.to_string(),
            };
            release_lease(rt, run, heartbeat).await;
            return Err(e);
        }
        if !built.is_resume && !claimed_already {
            heartbeat = hold_lease(rt, run).await?;
        }
        for note in std::mem::take(&mut built.notes) {
            run.note(note);
        }
        let lifecycle_run = RunLifecycle {
            run: run.identity.clone(),
            resumed: built.is_resume,
            parent_run_id: built.parent_run_id.take(),
        };
        run.lifecycle
            .dispatch(
                run.resolved.env.plugins(),
                LifecycleEvent::RunStart(&lifecycle_run),
            )
            .await;
        for w in run.resolved.warnings.clone() {
            run.note(AgentEvent::Warning {
                kind: WarningKind::Resolution,
                detail: w.to_string(),
            });
        }
        Ok(Ready {
            run: built.run,
            heartbeat,
            lifecycle_run,
        })
    }
}

impl Run<'_> {
    /// An event emitted now (stored with the next commit when it is a lifecycle event).
    fn note(&mut self, event: AgentEvent) {
        self.durable.note(event, self.sink);
    }

    /// An event about a fact of the next commit, emitted after it.
    fn fact(&mut self, event: AgentEvent) {
        self.durable.fact(event);
    }

    /// A `ToolCallStart` or `ToolCallResumed` event for the call: it is open.
    fn opened(&mut self, call_id: &ToolCallId) {
        // Once, even when a model opens one id twice (it is closed once).
        if !self.open_calls.contains(call_id) {
            self.open_calls.push(call_id.clone());
        }
    }

    /// A `ToolCallDone` or `ToolCallSuspended` event for the call: it is closed.
    fn closed(&mut self, call_id: &ToolCallId) {
        if let Some(i) = self.open_calls.iter().position(|open| open == call_id) {
            self.open_calls.remove(i);
        }
    }

    /// Closes the calls still open when a step fails (announced, but the step ended before
    /// they had a result: a call that has one has its result event already), each with a
    /// cancelled result saying why, as the calls of a failed inference are closed.
    fn close_open_calls(&mut self, failure: &Failure) {
        let why = failure_reason(failure);
        for call_id in std::mem::take(&mut self.open_calls) {
            self.note(AgentEvent::ToolCallDone {
                call_id,
                result: ToolResult::error(why).into(),
                state: ToolCallState::Cancelled,
            });
        }
    }

    /// A message of the run: in the history at once, in the store with the next commit.
    fn push_message(&mut self, message: Message) {
        self.history.push(message.clone());
        self.durable.push_message(message);
    }

    /// Commits what happened since the last commit, then emits the events about it.
    async fn checkpoint(&mut self, batch: BatchWrite) -> Result<(), Failure> {
        self.commit_changes(batch)
            .await
            .map_err(|e| Failure::Error(e.to_string()))
    }

    /// [`checkpoint`](Self::checkpoint) with the store's own error (the activation's first
    /// commit reports it as the run's).
    async fn commit_changes(&mut self, batch: BatchWrite) -> Result<(), CheckpointError> {
        // A batch change whose commit failed is written by the next commit, which would keep
        // the store's older batch otherwise (a run's end would then find a call still open
        // there): the run's batch now, or none.
        let batch = match batch {
            BatchWrite::Keep if self.durable.batch_unwritten() => {
                self.batch.as_ref().map_or(BatchWrite::Clear, batch_set)
            }
            batch => batch,
        };
        // One look at the state for the record's counts and the commit's changed keys (no
        // snapshot is taken); none when the state has not moved since the last commit's look
        // (a state's revision advances with every change), which the last commit exported.
        let store = self.engine.store();
        let revision = store.revision();
        let (stats_at, durable) = (self.stats_at.get(), &mut self.durable);
        let (steps, usage, exported) = match self.last_look {
            Some((at, steps, usage))
                if at == revision && durable.committed_revision() == revision =>
            {
                (steps, usage, revision)
            }
            _ => store.read(|s| {
                let (steps, usage) = stats_at_in(s, stats_at, |s| (s.steps, s.usage));
                (steps, usage, durable.export(s))
            }),
        };
        self.last_look = Some((exported, steps, usage));
        self.durable
            .commit(
                self.engine.store(),
                exported,
                batch,
                steps,
                usage,
                self.sink,
            )
            .await
    }

    fn batch_write(&self) -> BatchWrite {
        self.batch.as_ref().map_or(BatchWrite::Keep, batch_set)
    }

    fn ctx(&self, phase: Phase) -> PhaseContext {
        // Built whole: `PhaseContext::new` would allocate defaults replaced at once.
        PhaseContext {
            phase,
            snapshot: self.engine.store().snapshot(),
            sections: self.sections.clone(),
            run: self.identity.clone(),
            step: self.step,
            messages: self.history.clone(),
            tool: None,
            response: None,
            cancel: self.cancel.clone(),
        }
    }

    fn report(&mut self, report: &PhaseReport) -> Result<(), Failure> {
        for letter in &report.dead_lettered {
            self.note(AgentEvent::ActionDeadLettered {
                action: letter.action.key.clone(),
                phase: letter.action.phase.clone(),
                reason: letter.reason.clone(),
            });
        }
        if !report.effects.failures.is_empty() {
            self.effects_failed(&report.effects.failures)?;
        }
        Ok(())
    }

    /// Reports effect handlers that failed; the run goes on. Each failure is a `HandlerFailed`
    /// warning naming the effect, the handler's plugin and the error, and all of them are
    /// counted in the run's statistics. Called only when some failed.
    #[cold]
    fn effects_failed(&mut self, failures: &[EffectFailure]) -> Result<(), Failure> {
        for failure in failures {
            self.note(AgentEvent::Warning {
                kind: WarningKind::HandlerFailed,
                detail: failure.to_string(),
            });
        }
        let count = u32::try_from(failures.len()).unwrap_or(u32::MAX);
        self.count(StatsUpdate::HandlersFailed { count })
    }

    /// Runs a phase; a cancellation while one of its hooks or actions is awaiting ends it at
    /// once (nothing of an unfinished GATHER is published; an action whose handler did not
    /// finish stays queued).
    async fn phase_with(&mut self, ctx: PhaseContext) -> Result<(), Failure> {
        let report = {
            let phase = std::pin::pin!(self.engine.run_phase(&ctx));
            let cancelled = std::pin::pin!(ctx.cancel.cancelled());
            match futures_util::future::select(phase, cancelled).await {
                futures_util::future::Either::Left((report, _)) => report?,
                futures_util::future::Either::Right(((), _)) => return Err(Failure::Cancelled),
            }
        };
        self.report(&report)
    }

    async fn phase(&mut self, phase: Phase) -> Result<(), Failure> {
        if self.skip_idle(phase)? {
            return Ok(());
        }
        self.phase_with(self.ctx(phase)).await
    }

    /// Whether `phase` has nothing to run (no hook, no queued action), so it is skipped and no
    /// context is built for it (nor the history shared); a cancelled run still stops here, as
    /// the engine would have stopped it.
    fn skip_idle(&self, phase: Phase) -> Result<bool, Failure> {
        if !self.engine.is_idle(phase) {
            return Ok(false);
        }
        self.check_cancelled()?;
        Ok(true)
    }

    /// `Cancelled` once the run's cancellation was requested.
    fn check_cancelled(&self) -> Result<(), Failure> {
        if self.cancel.is_cancelled() {
            Err(Failure::Cancelled)
        } else {
            Ok(())
        }
    }

    async fn submit(&mut self, cmd: StateCommand) -> Result<(), Failure> {
        // A command without effects (the run's statistics, every step) commits at once.
        let cmd = match self.engine.submit_command_now(cmd) {
            Ok(committed) => {
                committed?;
                return Ok(());
            }
            Err(cmd) => cmd,
        };
        // One with effects awaits their dispatch, boxed: the futures of the many places that
        // submit need not hold room for it.
        let report = Box::pin(self.engine.submit_command(cmd)).await?;
        if !report.effects.failures.is_empty() {
            self.effects_failed(&report.effects.failures)?;
        }
        Ok(())
    }

    /// Counts in the run's statistics: a typed commit of their key, no command built (it
    /// carries no actions or effects).
    fn count(&self, update: StatsUpdate) -> Result<(), Failure> {
        self.engine
            .update::<RunStatsKey>(self.stats_at.get(), update)
            .map_err(|e| Failure::from(PhaseError::from(e)))?;
        Ok(())
    }

    /// `f` of the statistics, read in place (no copy of their tool list, no snapshot taken).
    /// `f` must not read the store itself: it runs under the store's read lock.
    fn read_stats<T>(&self, f: impl FnOnce(&RunStats) -> T) -> T {
        self.engine.store().read(|s| self.stats_in(s, f))
    }

    /// The first stop condition that holds now, with the tools of the step in progress
    /// (`last_step`: of the step before, once a step was counted), read in one look at the
    /// state.
    fn stop_now(&self, last_step: bool) -> Option<TerminationReason> {
        self.engine.store().read(|s| {
            self.stats_in(s, |stats| {
                let tools = if last_step {
                    &stats.last_step_tools
                } else {
                    &stats.tools_in_step
                };
                self.stop_condition(s, stats, tools)
            })
        })
    }

    /// `f` of the statistics as `snapshot` holds them.
    fn stats_in<T>(&self, snapshot: &Snapshot, f: impl FnOnce(&RunStats) -> T) -> T {
        stats_at_in(snapshot, self.stats_at.get(), f)
    }

    async fn drive(&mut self) -> Result<TerminationReason, Failure> {
        // By place: submitting may report failed effects, which needs the run mutably.
        for at in 0..self.resolved.env.plugins().len() {
            let cmd = self.resolved.env.plugins()[at]
                .on_activate(&self.resolved.spec.sections)
                .map_err(|e| Failure::Error(e.to_string()))?;
            if let Some(cmd) = cmd {
                self.submit(cmd).await?;
            }
        }
        match self.resume.take().map(|r| *r) {
            // A new run: its `RunStart` phase. A resumed one started long ago.
            None => self.phase(Phase::RunStart).await?,
            Some(Continue::Recover) => {
                if self.batch.is_some() {
                    // A step was interrupted: its batch is still there.
                    if let StepEnd::End(t) = self.step(Some(Vec::new())).await? {
                        return Ok(t);
                    }
                } else if let Some(t) = self.ended_before_the_crash() {
                    // Only the run's last commit was lost: end it as it ended.
                    self.response = self
                        .history
                        .iter()
                        .rev()
                        .find(|m| m.role == awaken_event::Role::Assistant)
                        .map(Message::text)
                        .filter(|t| !t.is_empty());
                    return Ok(t);
                }
            }
            Some(Continue::Decide(recorded, new)) => {
                if !new.is_empty() {
                    self.submit(StateCommand::new().with_update::<ResumeDecisionsKey>(
                        DecisionsUpdate::Add {
                            decisions: new.clone(),
                        },
                    ))
                    .await?;
                }
                let mut decisions = recorded;
                decisions.extend(new);
                let undecided = self.batch.as_ref().is_some_and(|b| {
                    suspended_calls(b)
                        .iter()
                        .any(|(id, _)| !decisions.iter().any(|d| d.call_id == *id))
                });
                if undecided {
                    // The decisions are recorded; the run waits for the rest.
                    return Ok(TerminationReason::Suspended);
                }
                if let StepEnd::End(t) = self.step(Some(decisions)).await? {
                    return Ok(t);
                }
            }
        }
        loop {
            if let StepEnd::End(t) = self.step(None).await? {
                return Ok(t);
            }
        }
    }

    /// One step, committed at its end: a normal one, or (with decisions) the step that
    /// finishes the calls a resume decided on.
    async fn step(&mut self, decisions: Option<Vec<ToolCallResume>>) -> Result<StepEnd, Failure> {
        self.step += 1;
        let step = self.step;
        self.note(AgentEvent::StepStart { step });
        let outcome = match decisions {
            None => self.run_step().await,
            // Boxed: only the first step of a resumed or recovered run is one, and the run's
            // future need not hold room for it at every step.
            Some(d) => Box::pin(self.resume_step(d)).await,
        };
        match &outcome {
            Err(failure) => self.close_open_calls(failure),
            // Every call of a finished step was closed (or the grammar check reports it).
            Ok(_) => self.open_calls.clear(),
        }
        // `StepEnd` follows the step's facts, so it is one of them.
        self.fact(AgentEvent::StepEnd { step });
        match outcome {
            // The step's facts (messages, batch, state, events) in one commit, with the last
            // call's result when it was folded into it.
            Ok(o) => {
                let batch = self.step_end_batch();
                self.checkpoint(batch).await?;
                if let Some(call) = self.folded_result.take() {
                    crate::failpoint::hit("after_result", Some(call.as_str()));
                }
                Ok(o)
            }
            Err(e) => Err(e),
        }
    }

    /// The step of a resume: the batch's open calls in call order, each as its decision says
    /// (deny: closed cancelled; approve: replayed through the gates, which see the decision,
    /// or the decision used as the result, or handed to the tool, as the ticket's resume mode
    /// says), then `StepEnd` and the stop conditions as after any step.
    async fn resume_step(&mut self, decisions: Vec<ToolCallResume>) -> Result<StepEnd, Failure> {
        self.phase(Phase::StepStart).await?;
        self.submit(StateCommand::new().with_update::<ResumeDecisionsKey>(DecisionsUpdate::Clear))
            .await?;
        let open: Vec<(ToolCall, ToolCallState, Option<SuspendTicket>)> = self
            .batch
            .as_ref()
            .map(|b| {
                b.calls()
                    .iter()
                    .filter(|c| {
                        matches!(
                            c.state(),
                            ToolCallState::Suspended
                                | ToolCallState::Requested
                                | ToolCallState::Executing
                        )
                    })
                    .map(|c| (c.call().clone(), c.state(), c.ticket().cloned()))
                    .collect()
            })
            .unwrap_or_default();
        let calls: Vec<ToolCall> = open.iter().map(|(c, _, _)| c.clone()).collect();
        let mut suspended = false;
        for (i, (call, state, ticket)) in open.into_iter().enumerate() {
            self.stop_if_cancelled(&calls[i..]).await?;
            let decision = decisions.iter().find(|d| d.call_id == call.id).cloned();
            if decision.is_none() && state == ToolCallState::Suspended {
                // Not announced: it was not resumed, and stays suspended.
                suspended = true;
                continue;
            }
            self.opened(&call.id);
            match (&decision, state) {
                (Some(d), ToolCallState::Suspended) => self.note(AgentEvent::ToolCallResumed {
                    call_id: call.id.clone(),
                    decision: d.decision,
                }),
                _ => self.note(AgentEvent::ToolCallStart {
                    call_id: call.id.clone(),
                    name: self.shared_tool_name(&call.name),
                }),
            }
            self.announce_ready(&call);
            let mode = ticket.as_ref().map(|t| t.resume_mode).unwrap_or_default();
            let outcome = match decision {
                // Interrupted while executing: its recovery policy decides, never a silent
                // re-run.
                None if state == ToolCallState::Executing => self.recover_call(&call).await,
                Some(d)
                    if d.decision == ResumeDecision::Deny
                        && mode != ResumeMode::PassDecisionToTool =>
                {
                    let why = match &d.payload {
                        Some(serde_json::Value::String(reason)) => format!(": {reason}"),
                        _ => String::new(),
                    };
                    Ok(CallOutcome::Closed(
                        ToolResult::error(format!("denied by the user{why}")),
                        ToolCallState::Cancelled,
                    ))
                }
                Some(d) if mode == ResumeMode::UseDecisionAsResult => Ok(CallOutcome::Closed(
                    ToolResult::success(d.payload.unwrap_or(serde_json::Value::Null)),
                    ToolCallState::ShortCircuited,
                )),
                d => self.execute_call(&call, d.map(Box::new)).await,
            };
            let outcome = match outcome {
                Ok(o) => o,
                Err(failure) => {
                    self.close_all(&calls[i..], failure_reason(&failure))
                        .await?;
                    return Err(failure);
                }
            };
            let last = i + 1 == calls.len();
            suspended |= self.settle(&call, outcome, last).await?;
        }
        let stop = self.end_step().await?;
        if suspended {
            return Ok(StepEnd::End(TerminationReason::Suspended));
        }
        Ok(match stop {
            Some(t) => StepEnd::End(t),
            None => StepEnd::Continue,
        })
    }

    /// Whether a recovered run (between steps) had already ended: the model's last answer
    /// called no tool, or a stop condition holds. Recovery then ends it without asking the
    /// model again.
    fn ended_before_the_crash(&self) -> Option<TerminationReason> {
        let last = self.history.last()?;
        if last.role == awaken_event::Role::Assistant && last.tool_calls.is_empty() {
            return Some(TerminationReason::NaturalEnd);
        }
        // Between steps the step count has moved the last step's tools aside.
        self.stop_now(true)
    }

    /// After a step: a closed batch is cleared, a batch with suspended calls is kept.
    fn step_end_batch(&mut self) -> BatchWrite {
        match self.batch.take() {
            None => BatchWrite::Keep,
            Some(b) if b.is_closed() => BatchWrite::Clear,
            Some(b) => {
                let write = batch_set(&b);
                self.batch = Some(b);
                write
            }
        }
    }

    fn directives_in(&self, snapshot: &Snapshot) -> StepDirectives {
        match snapshot.get_at::<StepDirectivesKey>(self.directives_at.get()) {
            Ok(d) if d.step == self.step => d.clone(),
            _ => StepDirectives::default(),
        }
    }

    fn request(&self, directives: &StepDirectives) -> InferenceRequest {
        let spec = &self.resolved.spec;
        // The agent's tools are the same every step: shared, unless a directive narrows them.
        let tools: Arc<[ToolDescriptor]> =
            if directives.excluded_tools.is_empty() && directives.include_only.is_none() {
                self.tools.clone()
            } else {
                self.tools
                    .iter()
                    .filter(|d| !directives.excluded_tools.contains(&d.id))
                    .filter(|d| {
                        directives
                            .include_only
                            .as_ref()
                            .is_none_or(|only| only.contains(&d.id))
                    })
                    .cloned()
                    .collect()
            };
        let messages: History = if directives.context_messages.is_empty() {
            self.history.clone()
        } else {
            let mut messages = self.history.to_vec();
            messages.extend(
                directives
                    .context_messages
                    .iter()
                    .map(|t| Message::system(t.clone())),
            );
            messages.into()
        };
        let mut overrides = spec.inference.clone();
        if let Some(run) = self.run_override.as_deref() {
            overrides = overrides.merge(run);
        }
        overrides = overrides.merge(&directives.inference);
        let (model, system_prompt, routing_key) = &self.request_strings;
        // Built whole: `InferenceRequest::new` would take the process-wide empty tool slice
        // (`Arc::default()`, one count every worker thread changes) only to drop it again.
        InferenceRequest {
            upstream_model: model.clone(),
            messages,
            tools,
            system_prompt: system_prompt.clone(),
            overrides,
            routing_key: Some(routing_key.clone()),
        }
    }

    /// `request` as the model is sent it: each run of adjacent user messages merged into one
    /// (see [`crate::turns`]). Done after the transforms, which count and cut the thread's
    /// messages as they are stored (a compaction summary covers a number of them). A request
    /// holding the history itself is looked at only past the messages seen before; one whose
    /// messages a directive or transform rebuilt (a copy already) is looked at whole.
    fn alternating(&mut self, mut request: InferenceRequest) -> InferenceRequest {
        let first = if History::ptr_eq(&request.messages, &self.history) {
            let first = turns::first_adjacent_user(&self.history, self.alternating as usize);
            // Below the true count when it does not fit: only more is looked at again.
            self.alternating =
                u32::try_from(first.unwrap_or(self.history.len())).unwrap_or(u32::MAX);
            first
        } else {
            turns::first_adjacent_user(&request.messages, 0)
        };
        if let Some(first) = first {
            request.messages = turns::merge_adjacent_users(&request.messages, first).into();
        }
        request
    }

    async fn infer(
        &mut self,
        request: InferenceRequest,
    ) -> Result<awaken_event::InferenceResponse, Failure> {
        let model = request.effective_model_shared();
        let started = tokio::time::Instant::now();
        // The run's one wait for its cancellation, lent to each inference's stream: its waker
        // is registered with the token once per run, not once per inference.
        let waiter = self
            .inference_waiter
            .take()
            .unwrap_or_else(|| self.cancel.clone().into_cancelled());
        let mut stream =
            CancellableStream::with_waiter(self.resolved.executor.execute_stream(request), waiter);
        // The run's collector and list of begun calls (`stream_calls`: by stream index, a few,
        // searched, not hashed) are used in place: their lists keep their room from one
        // inference to the next, and the inference's future holds no second copy. Every way
        // out of this function empties them; emptied here too, so an inference abandoned
        // mid-stream could never leave its text or calls to the next.
        self.collector.clear();
        self.stream_calls.clear();
        let mut failure = None;
        while let Some(item) = stream.next().await {
            let event = match item {
                Ok(e) => e,
                Err(e) => {
                    failure = Some(Failure::from(e));
                    break;
                }
            };
            // A delta is lent to its event and taken back for the collector (no copy per
            // fragment).
            let event = match event {
                LlmStreamEvent::TextDelta(delta) if !delta.is_empty() => {
                    LlmStreamEvent::TextDelta(relay(self.sink, AgentEvent::TextDelta { delta }))
                }
                LlmStreamEvent::ReasoningDelta(delta) if !delta.is_empty() => {
                    LlmStreamEvent::ReasoningDelta(relay(
                        self.sink,
                        AgentEvent::ReasoningDelta { delta },
                    ))
                }
                LlmStreamEvent::ToolCallStart { index, id, name } => {
                    match self.stream_calls.iter_mut().find(|(i, _)| *i == index) {
                        Some((_, known)) => *known = id.clone(),
                        None => self.stream_calls.push((index, id.clone())),
                    }
                    self.opened(&id);
                    self.note(AgentEvent::ToolCallStart {
                        call_id: id.clone(),
                        name: self.shared_tool_name(&name),
                    });
                    LlmStreamEvent::ToolCallStart { index, id, name }
                }
                LlmStreamEvent::ToolCallArgsDelta { index, delta } => {
                    let delta = match self.stream_calls.iter().find(|(i, _)| *i == index) {
                        Some((_, id)) => relay(
                            self.sink,
                            AgentEvent::ToolCallArgsDelta {
                                call_id: id.clone(),
                                delta,
                            },
                        ),
                        None => delta,
                    };
                    LlmStreamEvent::ToolCallArgsDelta { index, delta }
                }
                other => other,
            };
            if let Err(e) = self.collector.push(event) {
                failure = Some(Failure::from(e));
                break;
            }
        }
        self.inference_waiter = Some(stream.into_waiter());
        let result = match failure {
            Some(Failure::Cancelled) => {
                // What the model had written is kept (it has been shown): the run's last commit
                // stores it, marked incomplete. Its reasoning and begun calls are not kept.
                if let Some(text) = self.written_so_far() {
                    self.push_message(Message::incomplete_assistant(text));
                }
                Err(Failure::Cancelled)
            }
            Some(f) => Err(f),
            None => self.collector.take().map_err(Failure::from),
        };
        self.collector.clear();
        let mut calls = std::mem::take(&mut self.stream_calls);
        if result.is_err() {
            // Calls the model began but never finished get their closing event.
            calls.sort_by_key(|(i, _)| *i);
            for (_, call_id) in calls.drain(..) {
                self.closed(&call_id);
                self.note(AgentEvent::ToolCallDone {
                    call_id,
                    result: ToolResult::error("not executed: the inference failed").into(),
                    state: ToolCallState::Cancelled,
                });
            }
        }
        calls.clear();
        self.stream_calls = calls;
        let response = result?;
        self.note(AgentEvent::InferenceComplete {
            model,
            usage: response.usage,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        });
        Ok(response)
    }

    /// The text the collector holds of an inference that did not finish, if any. The collector
    /// gives up a response only after a stop, so one is added for it (its calls, unfinished,
    /// are dropped with the rest).
    fn written_so_far(&mut self) -> Option<String> {
        // A stream that did stop refuses a second stop; its response is there all the same.
        let _ = self
            .collector
            .push(LlmStreamEvent::Stop(awaken_event::StopReason::Other));
        let text = self.collector.take().ok()?.message.text();
        (!text.is_empty()).then_some(text)
    }

    /// How many times compaction fell back to truncation on this thread, and the last error.
    fn compaction_fallbacks_in<'s>(&self, snapshot: &'s Snapshot) -> (u64, Option<&'s str>) {
        // An agent without a context policy has no compaction key.
        match self.compaction_at.get().and_then(|at| {
            snapshot
                .get_at::<awaken_context::CompactionKey>(Some(at))
                .ok()
        }) {
            Some(state) => (state.fallbacks, state.last_error.as_deref()),
            None => (0, None),
        }
    }

    async fn run_step(&mut self) -> Result<StepEnd, Failure> {
        self.phase(Phase::StepStart).await?;
        self.phase(Phase::BeforeInference).await?;
        // What the request needs of the state, in one look (no snapshot is taken: the commit
        // after the inference writes in place when none is held). A summary that failed in this
        // phase's compaction: the run goes on truncating.
        let (fell_back, directives, run_usage) = self.engine.store().read(|s| {
            let (fallbacks, error) = self.compaction_fallbacks_in(s);
            (
                (fallbacks > self.seen_fallbacks)
                    .then(|| (fallbacks, error.unwrap_or("no detail").to_owned())),
                self.directives_in(s),
                self.stats_in(s, |s| s.usage),
            )
        });
        if let Some((fallbacks, error)) = fell_back {
            self.seen_fallbacks = fallbacks;
            self.note(AgentEvent::Warning {
                kind: WarningKind::CompactionFellBack,
                detail: format!("compaction failed, the request is truncated instead: {error}"),
            });
        }
        let request = self.request(&directives);
        // The transforms' snapshot is let go before the inference: held on, it would keep this
        // version alive (and the commit after the inference would copy instead of writing in
        // place). Without transforms, none is taken.
        let request = if self.resolved.env.transforms().is_empty() {
            request
        } else {
            let snapshot = self.engine.store().snapshot();
            let tctx = TransformContext {
                snapshot: &snapshot,
                run: &self.identity,
                step: self.step,
                tokens: TokenCounts {
                    last_usage: None,
                    run_usage,
                },
            };
            apply_transforms(self.resolved.env.transforms(), request, &tctx)
                .map_err(|e| Failure::Error(e.to_string()))?
        };
        let request = self.alternating(request);
        let awaken_event::InferenceResponse {
            message,
            usage,
            stop_reason,
        } = self.infer(request).await?;
        self.count(StatsUpdate::Inference { usage })?;
        let text = message.text();
        if !text.is_empty() {
            self.response = Some(text);
        }
        let calls = message.tool_calls.clone();
        // Moved into the history; `AfterInference`'s hooks, when there are any, get the
        // response rebuilt around the history's copy.
        self.push_message(message);
        if !calls.is_empty() {
            crate::failpoint::hit("before_requested", None);
            // Every call durable as `Requested`, with the assistant message, before any gate.
            self.batch =
                Some(ToolBatch::of_shared(&calls).map_err(|e| Failure::Error(e.to_string()))?);
            {
                let batch = self.batch_write();
                self.checkpoint(batch).await?;
            }
            crate::failpoint::hit("after_requested", None);
        }
        if !self.skip_idle(Phase::AfterInference)? {
            let message = self.history.last().cloned().ok_or_else(|| {
                Failure::Error("the assistant message is missing from the history".into())
            })?;
            let response = Arc::new(awaken_event::InferenceResponse {
                message,
                usage,
                stop_reason,
            });
            self.phase_with(self.ctx(Phase::AfterInference).with_response(response))
                .await?;
        }

        if calls.is_empty() {
            self.end_step().await?;
            return Ok(StepEnd::End(TerminationReason::NaturalEnd));
        }
        let max_rounds = self.resolved.spec.max_rounds;
        if self.read_stats(|s| s.inferences) >= max_rounds {
            for call in calls.iter() {
                self.close(
                    call,
                    ToolResult::error("not executed: round limit"),
                    ToolCallState::Cancelled,
                )
                .await?;
            }
            self.end_step().await?;
            return Ok(StepEnd::End(TerminationReason::stopped(
                "max_rounds",
                format!("reached the limit of {max_rounds} inferences"),
            )));
        }
        let suspended = if self.resolved.spec.parallel_tools && calls.len() > 1 {
            // Boxed: its future is the larger, and most steps run their calls one by one (every
            // run's future would hold room for it).
            Box::pin(self.run_calls_concurrently(&calls)).await?
        } else {
            self.run_calls_sequentially(&calls).await?
        };
        let stop = self.end_step().await?;
        if suspended {
            return Ok(StepEnd::End(TerminationReason::Suspended));
        }
        Ok(match stop {
            Some(t) => StepEnd::End(t),
            None => StepEnd::Continue,
        })
    }

    /// Runs `StepEnd` and counts the step; returns what the stop conditions say about the
    /// statistics as the step left them (read before the count clears the step's tools).
    async fn end_step(&mut self) -> Result<Option<TerminationReason>, Failure> {
        self.phase(Phase::StepEnd).await?;
        let stop = self.stop_now(false);
        self.count(StatsUpdate::StepEnded)?;
        Ok(stop)
    }

    /// The first stop condition that holds for `stats`, with `step_tools` the tools of the step
    /// just ended.
    fn stop_condition(
        &self,
        snapshot: &Snapshot,
        stats: &RunStats,
        step_tools: &[Arc<str>],
    ) -> Option<TerminationReason> {
        if let Ok(Some(request)) = snapshot.get_at::<StopRequestKey>(self.stop_at.get()) {
            return Some(TerminationReason::stopped(
                request.code.clone(),
                request.detail.clone(),
            ));
        }
        let max_rounds = self.resolved.spec.max_rounds;
        if stats.inferences >= max_rounds {
            return Some(TerminationReason::stopped(
                "max_rounds",
                format!("reached the limit of {max_rounds} inferences"),
            ));
        }
        for condition in &self.resolved.spec.stop_conditions {
            match condition {
                StopConditionSpec::TokenBudget { max_total_tokens }
                    if stats.usage.total() >= *max_total_tokens =>
                {
                    return Some(TerminationReason::stopped(
                        "token_budget",
                        format!("used {} of {max_total_tokens} tokens", stats.usage.total()),
                    ));
                }
                StopConditionSpec::StopOnTool { tool }
                    if step_tools.iter().any(|t| **t == **tool) =>
                {
                    return Some(TerminationReason::stopped(
                        "stop_tool",
                        format!("tool `{tool}` ran"),
                    ));
                }
                StopConditionSpec::ConsecutiveErrors { max }
                    if stats.consecutive_errors >= *max =>
                {
                    return Some(TerminationReason::stopped(
                        "consecutive_errors",
                        format!("{} tool calls failed in a row", stats.consecutive_errors),
                    ));
                }
                _ => {}
            }
        }
        None
    }

    /// Closes a call: its result in the batch, its message, its event and statistics, committed.
    async fn close(
        &mut self,
        call: &ToolCall,
        result: ToolResult,
        state: ToolCallState,
    ) -> Result<(), Failure> {
        self.close_call(call, result, state, false).await
    }

    /// Closes the step's last call; its result is committed with the step's end (the one place
    /// a result's commit is folded into the next), unless it is a delegate's answer, whose return
    /// hooks frame a commit of its own.
    async fn close_folded(
        &mut self,
        call: &ToolCall,
        result: ToolResult,
        state: ToolCallState,
    ) -> Result<(), Failure> {
        self.close_call(call, result, state, true).await
    }

    async fn close_call(
        &mut self,
        call: &ToolCall,
        result: ToolResult,
        state: ToolCallState,
        fold: bool,
    ) -> Result<(), Failure> {
        let failed = !matches!(
            state,
            ToolCallState::Succeeded | ToolCallState::ShortCircuited
        );
        // One result, shared by the batch and the event (which commits copy).
        let result = Arc::new(result);
        if let Some(batch) = self.batch.as_mut() {
            let open = matches!(
                batch.state(&call.id),
                Some(
                    ToolCallState::Requested | ToolCallState::Executing | ToolCallState::Suspended
                )
            );
            if open {
                batch
                    .transition_shared(&call.id, state, Some(result.clone()))
                    .map_err(|e| Failure::Error(e.to_string()))?;
            }
        }
        self.push_message(Message::tool(call.id.clone(), &result));
        self.closed(&call.id);
        self.fact(AgentEvent::ToolCallDone {
            call_id: call.id.clone(),
            result,
            state,
        });
        let resolved_tool = self.tool_named(&call.name);
        let tool = resolved_tool.map_or_else(
            || Arc::from(call.name.as_str()),
            |t| t.tool.shared_id().clone(),
        );
        // A delegate's answer returning into this run: the return hooks frame its commit.
        let returning = match (resolved_tool, failed) {
            (Some(t), false) => delegate_call(&self.identity, t, call),
            _ => None,
        };
        self.count(StatsUpdate::ToolClosed { tool, failed })?;
        if fold && returning.is_none() {
            self.folded_result = Some(call.id.clone());
            return Ok(());
        }
        if let Some(d) = &returning {
            self.lifecycle
                .dispatch(
                    self.resolved.env.plugins(),
                    LifecycleEvent::DelegateReturnStart(d),
                )
                .await;
        }
        // The result is durable before anything relies on it.
        let batch = self.batch_write();
        let committed = self.checkpoint(batch).await;
        if let Some(d) = &returning {
            let event = match &committed {
                Ok(()) => LifecycleEvent::DelegateReturnComplete(d),
                Err(e) => LifecycleEvent::DelegateReturnError(d, e.message_ref()),
            };
            self.lifecycle
                .dispatch(self.resolved.env.plugins(), event)
                .await;
        }
        committed?;
        crate::failpoint::hit("after_result", Some(call.id.as_str()));
        Ok(())
    }

    /// The calls of a step one after another: each gated after the earlier ones committed.
    /// Returns whether a call was suspended.
    async fn run_calls_sequentially(&mut self, calls: &[ToolCall]) -> Result<bool, Failure> {
        let mut suspended = false;
        for (i, call) in calls.iter().enumerate() {
            self.begin_call(calls, i).await?;
            let outcome = match self.execute_call(call, None).await {
                Ok(o) => o,
                Err(failure) => {
                    // Every call the model made still gets exactly one closing result.
                    self.close_all(&calls[i..], failure_reason(&failure))
                        .await?;
                    return Err(failure);
                }
            };
            suspended |= self.settle(call, outcome, i + 1 == calls.len()).await?;
        }
        Ok(suspended)
    }

    /// The calls of a step concurrently (the agent's `parallel_tools`): each is prepared
    /// (checked, gated, `BeforeToolExecute`) in call order, the allowed ones are committed
    /// `Executing` together and run at once on the run's task, except that calls whose tools
    /// declare overlapping `writes()` run one after another in call order (each seeing the
    /// state the previous one left). Their commands are merged by the state merge rules as
    /// each finishes; then `AfterToolExecute` and the results follow in call order, so the
    /// committed history is the one a sequential run gives.
    async fn run_calls_concurrently(&mut self, calls: &[ToolCall]) -> Result<bool, Failure> {
        let mut prepared: Vec<Option<CallOutcome>> = Vec::with_capacity(calls.len());
        // (The call's index, its tool's place in the resolved tools.)
        let mut to_run: Vec<(usize, usize)> = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            self.begin_call(calls, i).await?;
            match self.prepare_call(call, None).await {
                Ok(Prepared::Done(outcome)) => prepared.push(Some(outcome)),
                Ok(Prepared::Run(at)) => {
                    prepared.push(None);
                    to_run.push((i, at));
                }
                Err(failure) => {
                    self.close_all(calls, failure_reason(&failure)).await?;
                    return Err(failure);
                }
            }
        }
        let started: Vec<&ToolCall> = to_run.iter().map(|(i, _)| &calls[*i]).collect();
        self.mark_executing(&started).await?;
        // Lanes: calls whose declared writes overlap (transitively) share a lane and run in
        // call order; lanes run concurrently.
        let tools = &self.resolved.tools;
        let lanes = write_lanes(&to_run, tools);
        let invocation = self.invocation();
        let engine = &self.engine;
        let ran: Vec<Vec<(usize, Ran)>> =
            futures_util::future::join_all(lanes.into_iter().map(|lane| {
                let invocation = &invocation;
                let to_run = &to_run;
                async move {
                    let mut out = Vec::with_capacity(lane.len());
                    for slot in lane {
                        let (i, at) = to_run[slot];
                        out.push((
                            i,
                            invocation
                                .run(&tools[at], &calls[i], None, engine, true)
                                .await,
                        ));
                    }
                    out
                }
            }))
            .await;
        let mut results: Vec<Option<Ran>> = (0..calls.len()).map(|_| None).collect();
        for (i, r) in ran.into_iter().flatten() {
            results[i] = Some(r);
        }
        let mut suspended = false;
        for (i, call) in calls.iter().enumerate() {
            let outcome = match (prepared[i].take(), results[i].take()) {
                (Some(outcome), _) => outcome,
                (None, Some(ran)) => match self.after_tool(call, ran, None).await {
                    Ok(o) => o,
                    Err(failure) => {
                        self.close_all(&calls[i..], failure_reason(&failure))
                            .await?;
                        return Err(failure);
                    }
                },
                (None, None) => {
                    return Err(Failure::Error(format!(
                        "tool call {} was neither prepared nor run",
                        call.id
                    )));
                }
            };
            suspended |= self.settle(call, outcome, i + 1 == calls.len()).await?;
        }
        self.check_cancelled()?;
        Ok(suspended)
    }

    /// Before call `i` is looked at: a cancelled run closes it and the rest; otherwise the
    /// call is announced ready.
    async fn begin_call(&mut self, calls: &[ToolCall], i: usize) -> Result<(), Failure> {
        self.stop_if_cancelled(&calls[i..]).await?;
        self.announce_ready(&calls[i]);
        Ok(())
    }

    /// A cancelled run closes `rest` (the calls not looked at yet) and stops.
    async fn stop_if_cancelled(&mut self, rest: &[ToolCall]) -> Result<(), Failure> {
        if self.cancel.is_cancelled() {
            self.close_all(rest, "not executed: the run was cancelled")
                .await?;
            return Err(Failure::Cancelled);
        }
        Ok(())
    }

    /// The resolved tool models call `name`, if any.
    fn tool_named(&self, name: &str) -> Option<&ResolvedTool> {
        self.tool_at(name).map(|at| &self.resolved.tools[at])
    }

    /// Where the resolved tool models call `name` is, if there is one.
    fn tool_at(&self, name: &str) -> Option<usize> {
        self.resolved
            .tools
            .iter()
            .position(|t| t.tool.descriptor().name == name)
    }

    /// `name` as a shared string for an event: the resolved tool's (no allocation per call),
    /// else a new one.
    fn shared_tool_name(&self, name: &str) -> Arc<str> {
        self.tool_named(name)
            .map_or_else(|| Arc::from(name), |t| t.tool.shared_name().clone())
    }

    fn announce_ready(&mut self, call: &ToolCall) {
        self.note(AgentEvent::ToolCallReady {
            call_id: call.id.clone(),
            name: self.shared_tool_name(&call.name),
            arguments: call.arguments.clone(),
        });
    }

    /// Closes every call in `calls` that is still open with `reason` (cancelled).
    async fn close_all(&mut self, calls: &[ToolCall], reason: &str) -> Result<(), Failure> {
        for call in calls {
            let open = self.batch.as_ref().is_none_or(|b| {
                matches!(
                    b.state(&call.id),
                    Some(
                        ToolCallState::Requested
                            | ToolCallState::Executing
                            | ToolCallState::Suspended
                    )
                )
            });
            if open {
                self.close(call, ToolResult::error(reason), ToolCallState::Cancelled)
                    .await?;
            }
        }
        Ok(())
    }

    /// Records how a call came out: closed (result committed) or suspended (parked,
    /// committed). Returns whether it was suspended.
    /// `last`: the step's last call, whose result commit may be folded into the step's end.
    async fn settle(
        &mut self,
        call: &ToolCall,
        outcome: CallOutcome,
        last: bool,
    ) -> Result<bool, Failure> {
        match outcome {
            CallOutcome::Closed(result, state) => {
                if last {
                    self.close_folded(call, result, state).await?;
                } else {
                    self.close(call, result, state).await?;
                }
                Ok(false)
            }
            CallOutcome::Suspended(ticket) => {
                if let Some(batch) = self.batch.as_mut() {
                    batch
                        .suspend(&call.id, (*ticket).clone())
                        .map_err(|e| Failure::Error(e.to_string()))?;
                }
                self.closed(&call.id);
                self.fact(AgentEvent::ToolCallSuspended {
                    call_id: call.id.clone(),
                    ticket,
                });
                let batch = self.batch_write();
                self.checkpoint(batch).await?;
                Ok(true)
            }
        }
    }

    /// A call found `Executing` after a crash: its tool's recovery policy re-runs it
    /// (`ReadOnly`/`Idempotent` only, with the same idempotency key), closes it as outcome
    /// unknown, or suspends it for a human. Never a silent re-run.
    async fn recover_call(&mut self, call: &ToolCall) -> Result<CallOutcome, Failure> {
        let tool = self.tool_named(&call.name).cloned();
        let action = tool
            .as_ref()
            .map_or(RecoveryAction::CloseOutcomeUnknown, |t| {
                t.tool.recovery_action(ToolCallState::Executing)
            });
        match (action, tool) {
            (RecoveryAction::Rerun, Some(tool)) => {
                self.mark_executing(&[call]).await?;
                let ran = self
                    .invocation()
                    .run(&tool, call, None, &self.engine, false)
                    .await;
                self.after_tool(call, ran, None).await
            }
            (RecoveryAction::SuspendForHuman, _) => {
                Ok(CallOutcome::Suspended(Box::new(SuspendTicket {
                    suspension_id: format!("recovery-{}", call.id),
                    call: pending_call(call),
                    message: format!(
                        "`{}` was interrupted while running and may or may not have taken effect. Run it again?",
                        call.name
                    ),
                    response_schema: None,
                    resume_mode: ResumeMode::Replay,
                })))
            }
            _ => Ok(CallOutcome::Closed(
                ToolResult::error(OUTCOME_UNKNOWN_MESSAGE),
                ToolCallState::OutcomeUnknown,
            )),
        }
    }

    /// One call from its gates to its `AfterToolExecute`; `resume` is a human's decision on
    /// it (gates, hooks and the tool see it).
    /// (`resume` is boxed: the future of every call holds it, and most calls have none.)
    async fn execute_call(
        &mut self,
        call: &ToolCall,
        resume: Option<Box<ToolCallResume>>,
    ) -> Result<CallOutcome, Failure> {
        let at = match self.prepare_call(call, resume.clone()).await? {
            Prepared::Done(outcome) => return Ok(outcome),
            Prepared::Run(at) => at,
        };
        self.mark_executing(&[call]).await?;
        // Boxed: a call's invocation (its context, timer, span and the tool's future) would
        // otherwise take the largest room in every run's future for the run's whole life,
        // while a run is in a tool call only for moments (an allocation per call instead).
        let ran = Box::pin(self.invocation().run(
            &self.resolved.tools[at],
            call,
            resume.as_deref(),
            &self.engine,
            true,
        ))
        .await;
        self.after_tool(call, ran, resume).await
    }

    /// Everything before a call may run: the runtime's own checks, the gates, and
    /// `BeforeToolExecute` with any decision an action there took.
    async fn prepare_call(
        &mut self,
        call: &ToolCall,
        resume: Option<Box<ToolCallResume>>,
    ) -> Result<Prepared, Failure> {
        let Some(at) = self.tool_at(&call.name) else {
            return Ok(Prepared::Done(CallOutcome::Closed(
                ToolResult::error(format!(
                    "unknown tool `{}`: it is not available to this agent",
                    call.name
                )),
                ToolCallState::Blocked,
            )));
        };
        if let Some(raw) = &call.invalid_arguments {
            return Ok(Prepared::Done(CallOutcome::Closed(
                ToolResult::error(format!(
                    "the arguments of `{}` are not valid JSON: {raw}",
                    call.name
                )),
                ToolCallState::Blocked,
            )));
        }
        // Arguments that break the schema never reach a gate or the tool.
        if let Err(e) = self.resolved.tools[at].tool.check_call(call) {
            return Ok(Prepared::Done(CallOutcome::Closed(
                e.to_result(),
                ToolCallState::Blocked,
            )));
        }
        // Gates are pure, so whether `BeforeToolExecute` has anything to run is known now.
        let hooks_idle = self.engine.is_idle(Phase::BeforeToolExecute);
        // One call description, shared by the gates' and the hooks' contexts (made only if
        // one of them runs).
        let info = (!self.gates.is_empty() || !hooks_idle).then(|| {
            Arc::new(ToolPhaseInfo {
                call: call.clone(),
                result: None,
                resume: resume.map(|r| *r),
            })
        });
        let resolution = if self.gates.is_empty() {
            GateResolution::default()
        } else {
            let mut gate_ctx = self.ctx(Phase::ToolGate);
            gate_ctx.tool = info.clone();
            evaluate_gates(&self.gates, &gate_ctx)
                .await
                .map_err(|e| Failure::Error(e.to_string()))?
        };
        for conflict in &resolution.conflicts {
            self.note(AgentEvent::Warning {
                kind: WarningKind::GateConflict,
                detail: format!(
                    "gate `{}` overruled `{}` on call {}",
                    conflict.winner, conflict.loser, call.id
                ),
            });
        }
        if let Some(decision) = resolution.decision {
            return Ok(Prepared::Done(intercepted(decision.payload)));
        }
        if hooks_idle {
            self.check_cancelled()?;
        } else {
            let mut before = self.ctx(Phase::BeforeToolExecute);
            before.tool = info;
            self.phase_with(before).await?;
        }
        // An action of `BeforeToolExecute` may still decide on the call.
        let decided = self.engine.store().read(|s| {
            match s.get_at::<CallInterceptKey>(self.intercept_at.get()) {
                Ok(Some(d)) if d.call_id == call.id => Some(d.payload.clone()),
                _ => None,
            }
        });
        if let Some(payload) = decided {
            return Ok(Prepared::Done(intercepted(payload)));
        }
        Ok(Prepared::Run(at))
    }

    /// Commits `calls` as `Executing`: durable before any of them can have an effect.
    async fn mark_executing(&mut self, calls: &[&ToolCall]) -> Result<(), Failure> {
        if calls.is_empty() {
            return Ok(());
        }
        if let Some(batch) = self.batch.as_mut() {
            for call in calls {
                batch
                    .start(&call.id)
                    .map_err(|e| Failure::Error(e.to_string()))?;
            }
        }
        let batch = self.batch_write();
        self.checkpoint(batch).await
    }

    /// What running a tool needs from the run, borrowed apart from the run itself.
    fn invocation(&self) -> Invocation<'_> {
        Invocation {
            identity: &self.identity,
            cancel: &self.cancel,
            keys: self.resolved.env.keys(),
            timeout: self.resolved.spec.tool_timeout.map(|t| t.get()),
            lifecycle: &self.lifecycle,
            plugins: self.resolved.env.plugins(),
            progress: &self.progress,
            tool_scope: &self.tool_scope,
            sink: self.sink,
        }
    }

    /// `AfterToolExecute` for a call that ran (not for one the run's cancellation ended).
    async fn after_tool(
        &mut self,
        call: &ToolCall,
        ran: Ran,
        resume: Option<Box<ToolCallResume>>,
    ) -> Result<CallOutcome, Failure> {
        let mut ran = ran;
        let (result, state) = loop {
            match ran {
                Ran::Finished(result, state) => break (result, state),
                // It waits for a decision; `AfterToolExecute` runs once it has finished.
                Ran::Suspended(ticket) => return Ok(CallOutcome::Suspended(Box::new(ticket))),
                Ran::Cancelled(result) => {
                    // The run is ending: the call closes as cancelled, without
                    // AfterToolExecute.
                    return Ok(CallOutcome::Closed(result, ToolCallState::Cancelled));
                }
                // Reported, then the call goes on as it ended.
                Ran::EffectsFailed(failed) => {
                    let (inner, failures) = *failed;
                    self.effects_failed(&failures)?;
                    ran = inner;
                }
            }
        };
        if !self.skip_idle(Phase::AfterToolExecute)? {
            let after = ToolPhaseInfo {
                call: call.clone(),
                result: Some(result.clone()),
                resume: resume.map(|r| *r),
            };
            self.phase_with(self.ctx(Phase::AfterToolExecute).with_tool(after))
                .await?;
        }
        Ok(CallOutcome::Closed(result, state))
    }

    /// The one exit path: `RunEnd` (unless suspended), leftover actions dead-lettered,
    /// `on_deactivate`, and the last commit, after which `RunFinish` is emitted.
    async fn finish(&mut self, termination: TerminationReason) -> TerminationReason {
        let mut termination = termination;
        if termination != TerminationReason::Suspended && !self.engine.is_idle(Phase::RunEnd) {
            // RunEnd runs even for a cancelled run: give it a fresh token.
            let ctx = self
                .ctx(Phase::RunEnd)
                .with_cancel(CancellationToken::new());
            match self.engine.run_phase(&ctx).await {
                Ok(report) => {
                    if let Err(failure) = self.report(&report) {
                        self.note(AgentEvent::Error {
                            message: failure.message(),
                        });
                    }
                }
                Err(e) => {
                    self.note(AgentEvent::Error {
                        message: e.to_string(),
                    });
                    if !matches!(termination, TerminationReason::Error { .. }) {
                        termination = TerminationReason::error(e.to_string());
                    }
                }
            }
            match self
                .engine
                .dead_letter_remaining("the run ended before its phase ran again")
            {
                Ok(letters) => {
                    for letter in letters {
                        self.note(AgentEvent::ActionDeadLettered {
                            action: letter.action.key,
                            phase: letter.action.phase,
                            reason: letter.reason,
                        });
                    }
                }
                Err(e) => self.note(AgentEvent::Error {
                    message: e.to_string(),
                }),
            }
        }
        if let TerminationReason::Error { message } = &termination {
            self.note(AgentEvent::Error {
                message: message.clone(),
            });
        }
        // By place (the list is not copied: its plugins are counted by every run).
        for at in 0..self.resolved.env.plugins().len() {
            let deactivated = self.resolved.env.plugins()[at].on_deactivate();
            match deactivated {
                Ok(Some(cmd)) => match self.engine.submit_command(cmd).await {
                    Ok(report) if !report.effects.failures.is_empty() => {
                        if let Err(failure) = self.effects_failed(&report.effects.failures) {
                            self.note(AgentEvent::Error {
                                message: failure.message(),
                            });
                        }
                    }
                    Ok(_) => {}
                    Err(e) => self.note(AgentEvent::Error {
                        message: e.to_string(),
                    }),
                },
                Ok(None) => {}
                Err(e) => self.note(AgentEvent::Error {
                    message: e.to_string(),
                }),
            }
        }
        // The last commit: the run's end (or wait), `RunFinish` emitted after it.
        self.durable.finish(&termination);
        let usage = self.read_stats(|s| s.usage);
        self.fact(AgentEvent::RunFinish {
            thread_id: self.identity.thread_id.clone(),
            run_id: self.identity.run_id.clone(),
            termination: Box::new(termination.clone()),
            response: self.response.clone(),
            usage: Box::new(usage),
        });
        let batch = match self.batch.take() {
            Some(mut b) if !b.is_closed() && termination != TerminationReason::Suspended => {
                // Calls the run will never finish are closed: a finished run holds none open.
                b.close("the run ended");
                batch_set(&b)
            }
            Some(b) => batch_set(&b),
            None => BatchWrite::Keep,
        };
        if let Err(e) = self.checkpoint(batch).await {
            tracing::error!(error = %e.message(), "the run's last commit failed");
            self.durable.flush_uncommitted(self.sink);
        }
        termination
    }
}

/// `f` of the run statistics in `snapshot`, read in place at registry position `at` (the
/// defaults when absent).
fn stats_at_in<T>(snapshot: &Snapshot, at: Option<usize>, f: impl FnOnce(&RunStats) -> T) -> T {
    match snapshot.get_at::<RunStatsKey>(at) {
        Ok(stats) => f(stats),
        Err(_) => f(&RunStats::default()),
    }
}

/// How many more messages a run's history has room for when the run starts.
const HISTORY_ROOM: usize = 16;

/// What preparing a call decided.
enum Prepared {
    /// Closed or suspended without running the tool.
    Done(CallOutcome),
    /// Allowed: the tool to run, by its place in the resolved tools (borrowed there, not
    /// copied: the resolver's tools are shared by every run, and copying one changes counts the
    /// other worker threads change too).
    Run(usize),
}

/// How a tool's invocation ended.
enum Ran {
    /// It ran (successfully or not); `AfterToolExecute` follows.
    Finished(ToolResult, ToolCallState),
    /// The run's cancellation ended it.
    Cancelled(ToolResult),
    /// The tool suspended the call (a delegate whose child run waits for a decision).
    Suspended(SuspendTicket),
    /// How it ended, after effect handlers of its state change failed (reported by the run).
    EffectsFailed(Box<(Ran, Vec<EffectFailure>)>),
}

fn failure_reason(failure: &Failure) -> &'static str {
    match failure {
        Failure::Cancelled => "not executed: the run was cancelled",
        Failure::Error(_) => "not finished: the run failed",
    }
}

fn intercepted(payload: ToolInterceptPayload) -> CallOutcome {
    match payload {
        ToolInterceptPayload::Block { reason } => {
            CallOutcome::Closed(ToolResult::error(reason), ToolCallState::Blocked)
        }
        ToolInterceptPayload::SetResult(result) => {
            CallOutcome::Closed(result, ToolCallState::ShortCircuited)
        }
        ToolInterceptPayload::Suspend(ticket) => CallOutcome::Suspended(Box::new(ticket)),
    }
}

/// Groups the calls to run into lanes: calls whose tools' declared `writes()` overlap, even
/// through a third call, share a lane (in call order); a call that declares none has its own.
fn write_lanes(to_run: &[(usize, usize)], tools: &[ResolvedTool]) -> Vec<Vec<usize>> {
    let mut lane_of: Vec<usize> = (0..to_run.len()).collect();
    fn root(lane_of: &mut [usize], mut i: usize) -> usize {
        while lane_of[i] != i {
            lane_of[i] = lane_of[lane_of[i]];
            i = lane_of[i];
        }
        i
    }
    for a in 0..to_run.len() {
        for b in (a + 1)..to_run.len() {
            let wa = tools[to_run[a].1].tool.writes();
            let wb = tools[to_run[b].1].tool.writes();
            if wa.iter().any(|k| wb.contains(k)) {
                let (ra, rb) = (root(&mut lane_of, a), root(&mut lane_of, b));
                if ra != rb {
                    lane_of[ra.max(rb)] = ra.min(rb);
                }
            }
        }
    }
    let mut lanes: Vec<Vec<usize>> = Vec::new();
    let mut index: HashMap<usize, usize> = HashMap::new();
    for slot in 0..to_run.len() {
        let r = root(&mut lane_of, slot);
        let lane = *index.entry(r).or_insert_with(|| {
            lanes.push(Vec::new());
            lanes.len() - 1
        });
        lanes[lane].push(slot);
    }
    lanes
}

/// What running one tool needs: borrowed from the run so that several can run at once.
struct Invocation<'a> {
    identity: &'a Arc<RunIdentity>,
    cancel: &'a CancellationToken,
    keys: &'a awaken_state::KeyRegistry,
    timeout: Option<std::time::Duration>,
    /// For the delegate-call lifecycle hooks of the run's plugins.
    lifecycle: &'a LifecycleDispatcher,
    plugins: &'a [Arc<dyn awaken_plugin::Plugin>],
    /// Where the call's progress reports wait to be emitted to `sink`.
    progress: &'a Arc<ProgressQueue>,
    /// What the call's context shares with the run's other calls.
    tool_scope: &'a ToolCallScope,
    sink: &'a dyn EventSink,
}

impl Invocation<'_> {
    /// Runs the call's tool (its arguments validated here only for a recovery's re-run:
    /// `prepare_call` checked the others), with the agent's timeout, cancellation and panic
    /// capture, then commits the tool's state change (on the state as it is now).
    ///
    /// What only some calls need is boxed when they need it (the timer of a tool that waits,
    /// a delegate's lifecycle events, a tool's state change): every run's future holds room
    /// for a call's invocation for its whole life, and most calls need none of it.
    /// `checked`: the call's arguments passed `RegisteredTool::check_call` in this activation
    /// (`prepare_call`); otherwise (a recovery's re-run) they are validated here.
    async fn run(
        &self,
        tool: &ResolvedTool,
        call: &ToolCall,
        resume: Option<&ToolCallResume>,
        engine: &PhaseEngine,
        checked: bool,
    ) -> Ran {
        // The tool's view of the state: taken before anything is awaited, as the call starts.
        let snapshot = engine.store().snapshot();
        let delegate = delegate_call(self.identity, tool, call);
        if let Some(d) = &delegate {
            Box::pin(
                self.lifecycle
                    .dispatch(self.plugins, LifecycleEvent::DelegateCallStart(d)),
            )
            .await;
        }
        // The call's context, timer and guards live in this block only: what the compiler
        // keeps across the awaits after it is then only the output (see `settle`).
        let (invoked, waits) = {
            let mut tool_ctx = self.tool_scope.context(call.id.clone(), snapshot);
            if let Some(resume) = resume {
                tool_ctx = tool_ctx.with_resume(resume.clone());
            }
            let timeout = self.timeout;
            // Polled only once the tool waits (a tool that answers at once makes no timer).
            let timer = async move {
                match timeout {
                    Some(t) => Box::pin(tokio::time::sleep(t)).await,
                    None => std::future::pending::<()>().await,
                }
            };
            let span = tracing::debug_span!("tool", call_id = %call.id, tool = %tool.tool.id());
            let invoked = async {
                // Arguments `prepare_call` checked are not validated twice.
                if !checked {
                    tool.tool.validate(&call.arguments)?;
                }
                tool.tool
                    .invoke_checked_with_timeout(&call.arguments, &tool_ctx, self.keys, timer)
                    .await
            }
            .instrument(span);
            let invoked = self
                .progress
                .forward(&call.id, std::pin::pin!(invoked), self.sink)
                .await;
            let waits = delegate.is_some() || invoked.as_ref().is_ok_and(|o| o.command.is_some());
            (invoked, waits)
        };
        crate::failpoint::hit("after_executing", Some(call.id.as_str()));
        if !waits {
            return self.ran(invoked);
        }
        // A delegate's end or a tool's state change is awaited in a box (most calls have
        // neither, and the run's future need not keep the output across those awaits).
        Box::pin(self.settle(invoked, delegate, engine)).await
    }

    /// After a delegate call or a tool that returned a state change: the delegate's end is
    /// dispatched, the change submitted (a rejected change fails the call).
    async fn settle(
        &self,
        mut invoked: Result<ToolOutput, awaken_tool::ToolError>,
        delegate: Option<awaken_plugin::DelegateCall>,
        engine: &PhaseEngine,
    ) -> Ran {
        if let Some(d) = &delegate {
            let event = match &invoked {
                Ok(o) if o.suspend.is_some() => None,
                Ok(o) if !o.result.is_error() => Some(LifecycleEvent::DelegateCallComplete(
                    d,
                    o.result.content.as_str().unwrap_or_default(),
                )),
                Ok(o) => Some(LifecycleEvent::DelegateCallError(
                    d,
                    o.result.content.as_str().unwrap_or("the delegate failed"),
                )),
                Err(_) => Some(LifecycleEvent::DelegateCallError(
                    d,
                    "the delegate call failed",
                )),
            };
            if let Some(event) = event {
                self.lifecycle.dispatch(self.plugins, event).await;
            }
        }
        let command = invoked.as_mut().ok().and_then(|o| o.command.take());
        if let Some(cmd) = command {
            match engine.submit_command(cmd).await {
                Ok(report) if !report.effects.failures.is_empty() => {
                    let ran = self.ran(invoked);
                    return Ran::EffectsFailed(Box::new((ran, report.effects.failures)));
                }
                Ok(_) => {}
                Err(e) => {
                    return Ran::Finished(
                        ToolResult::error(format!("the tool's state change was rejected: {e}")),
                        ToolCallState::Failed,
                    );
                }
            }
        }
        self.ran(invoked)
    }

    /// How the call ended, from the tool's output (its state change already submitted).
    fn ran(&self, invoked: Result<ToolOutput, awaken_tool::ToolError>) -> Ran {
        match invoked {
            Ok(ToolOutput {
                suspend: Some(ticket),
                ..
            }) => Ran::Suspended(ticket),
            Ok(output) => {
                let state = if output.result.is_error() {
                    ToolCallState::Failed
                } else {
                    ToolCallState::Succeeded
                };
                Ran::Finished(output.result, state)
            }
            Err(e) if self.cancel.is_cancelled() => Ran::Cancelled(e.to_result()),
            Err(e) => Ran::Finished(e.to_result(), e.closing_state()),
        }
    }
}

/// Closes the suspended calls of a waiting run as cancelled ("superseded") and ends that run,
/// in one commit; returns the closing messages (now in the store).
async fn supersede(
    rt: &AgentRuntime,
    thread_id: &ThreadId,
    mut record: RunRecord,
    mut batch: ToolBatch,
    persisted: u64,
) -> Result<Vec<Message>, RunError> {
    let closed = batch.close("superseded by a new message");
    let mut messages = Vec::with_capacity(closed.len());
    let mut events = Vec::with_capacity(closed.len());
    for id in closed {
        let Some(call) = batch.get(&id) else { continue };
        let result = call
            .result()
            .cloned()
            .unwrap_or_else(|| ToolResult::error("not executed: superseded by a new message"));
        messages.push(Message::tool(id.clone(), &result));
        events.push(AgentEvent::ToolCallDone {
            call_id: id,
            result: result.into(),
            state: call.state(),
        });
    }
    record.status = RunStatus::Done;
    record.termination = Some(TerminationReason::Cancelled);
    record.updated_at = rt.ids.timestamp();
    let mut commit = awaken_store::ThreadCommit::new(thread_id.clone(), record, persisted)
        .with_messages(messages.iter().cloned())
        .with_events(events);
    commit.batch = BatchWrite::Clear;
    rt.store
        .commit(commit)
        .await
        .map_err(|e| RunError::Checkpoint {
            thread_id: thread_id.clone(),
            message: format!("closing the superseded calls failed: {e}"),
        })?;
    Ok(messages)
}

/// Claims the run's lease for the runtime's worker (when it has one) and keeps it with a
/// heartbeat; another worker holding it is `RunError::TakenOver`.
async fn hold_lease(
    rt: &AgentRuntime,
    run: &mut Run<'_>,
) -> Result<Option<tokio::task::JoinHandle<()>>, RunError> {
    let Some(worker) = &rt.worker else {
        return Ok(None);
    };
    let claimed = rt
        .store
        .claim_run(
            &run.identity.run_id,
            &worker.id,
            worker.lease_duration,
            rt.ids.timestamp(),
        )
        .await
        .map_err(RunError::Store)?;
    let Some(claimed) = claimed else {
        return Err(RunError::TakenOver {
            thread_id: run.identity.thread_id.clone(),
            run_id: run.identity.run_id.clone(),
        });
    };
    run.durable.set_lease(Some(claimed.lease.clone()));
    Ok(Some(rt.spawn_heartbeat(
        claimed.lease,
        worker.lease_duration,
        run.cancel.clone(),
    )))
}

/// Stops the heartbeat and gives the lease up (a finished run's last commit already did).
async fn release_lease(
    rt: &AgentRuntime,
    run: &Run<'_>,
    heartbeat: Option<tokio::task::JoinHandle<()>>,
) {
    if let Some(h) = heartbeat {
        h.abort();
        if let Some(lease) = run.durable.lease() {
            rt.release(lease).await;
        }
    }
}

/// Emits a delta event to `sink` and hands its text back.
fn relay(sink: &dyn EventSink, event: AgentEvent) -> String {
    sink.emit(&event);
    match event {
        AgentEvent::TextDelta { delta }
        | AgentEvent::ReasoningDelta { delta }
        | AgentEvent::ToolCallArgsDelta { delta, .. } => delta,
        _ => unreachable!("only delta events are relayed"),
    }
}

/// The delegate call a call of `tool` is, if `tool` is a delegate tool.
/// (The call's idempotency key, a hash, is derived only for a delegate's call.)
fn delegate_call(
    identity: &Arc<RunIdentity>,
    tool: &ResolvedTool,
    call: &ToolCall,
) -> Option<awaken_plugin::DelegateCall> {
    let awaken_resolver::ToolSource::Delegate(agent_id) = &tool.source else {
        return None;
    };
    let key = awaken_tool::IdempotencyKey::derive(&identity.thread_id, &identity.run_id, &call.id);
    Some(awaken_plugin::DelegateCall {
        parent: identity.clone(),
        call_id: call.id.clone(),
        agent_id: agent_id.clone(),
        child_run_id: crate::delegate::child_run_id(key.as_str()).ok()?,
    })
}
