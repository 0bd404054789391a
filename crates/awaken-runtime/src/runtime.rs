//! `AgentRuntimeBuilder`, `AgentRuntime`, run requests and outcomes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use awaken_event::{
    CancellationToken, EventSink, Message, NullSink, ProfileId, RunId, SuspendTicket,
    TerminationReason, ThreadId, TokenUsage,
};
use awaken_llm::LlmExecutor;
use std::collections::BTreeMap;

use awaken_plugin::{
    HookStats, LifecycleDispatcher, LifecycleEvent, LifecycleHook, Plugin, PluginRegistry,
    RegistryError, ReloadOutcome,
};
use awaken_resolver::{
    ExecutionBackend, RegistrationError, Registries, ResolveError, Resolver, ValidationFailed,
};
use awaken_spec::{AgentSpec, InferenceOverride, ModelSpec};
use awaken_state::StateError;
use awaken_store::{LeaseToken, MemoryStore, RunStatus, StoreError, ThreadStore, Timestamp};
use awaken_tool::Tool;

use crate::active::{ActiveRuns, ShutdownMode};
use crate::builtins::RuntimeBuiltins;
use crate::resume::Resume;

/// Where run ids and times come from; tests make both deterministic.
pub trait IdSource: Send + Sync {
    /// A new, unique run id.
    fn next_run_id(&self) -> RunId;
    /// Milliseconds since the Unix epoch (or any monotonic origin the caller chooses).
    fn now_ms(&self) -> u64;

    /// [`now_ms`](Self::now_ms) as a store timestamp.
    fn timestamp(&self) -> Timestamp {
        Timestamp::from_unix_millis(i64::try_from(self.now_ms()).unwrap_or(i64::MAX))
    }
}

/// Run ids `run-1`, `run-2`, ... and a clock that advances 1 ms per reading.
#[derive(Debug, Default)]
pub struct SequentialIds {
    runs: AtomicU64,
    clock: AtomicU64,
}

impl IdSource for SequentialIds {
    fn next_run_id(&self) -> RunId {
        let n = self.runs.fetch_add(1, Ordering::Relaxed) + 1;
        RunId::new(format!("run-{n}"))
            .unwrap_or_else(|e| unreachable!("generated ids are valid: {e}"))
    }
    fn now_ms(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }
}

/// Run ids from the wall clock and a counter; the system clock.
#[derive(Debug, Default)]
pub struct SystemIds {
    counter: AtomicU64,
}

impl IdSource for SystemIds {
    fn next_run_id(&self) -> RunId {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        // `run-{nanos}-{n}` in base 32, written on the stack: `format!` grew a string through
        // three allocations, then the id copied it. (Base 32, not 16: the nanoseconds take 13
        // digits, not 16, and the first 2^30 runs of a process 6 at most, so a run's id of 24
        // bytes or fewer takes a 48-byte block where 25 took 64: every finished run kept in
        // memory keeps its id.)
        let mut id = [0u8; 4 + 26 + 1 + 32];
        id[..4].copy_from_slice(b"run-");
        let mut len = 4;
        len += push_digits(&mut id[len..], nanos, BASE32);
        id[len] = b'-';
        len += 1;
        len += push_digits(&mut id[len..], u128::from(n), BASE32);
        let id = std::str::from_utf8(&id[..len])
            .unwrap_or_else(|e| unreachable!("the digits are ASCII: {e}"));
        RunId::new(id).unwrap_or_else(|e| unreachable!("generated ids are valid: {e}"))
    }
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// Crockford's base-32 digits, lowercase (no `i`, `l`, `o`, `u`): ids stay ordered by time.
const BASE32: &[u8] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// Writes `n` in `digits` (16 or 32 of them: a digit is 4 or 5 bits) at the start of `out`,
/// the most significant first (in lowercase hex digits, as `{n:x}` formats it); returns the
/// digits' count. `out` has room for 32.
fn push_digits(out: &mut [u8], n: u128, digits: &[u8]) -> usize {
    let bits = digits.len().trailing_zeros();
    let count = (128 - n.leading_zeros()).div_ceil(bits).max(1) as usize;
    let mask = (1u128 << bits) - 1;
    for (i, d) in out[..count].iter_mut().enumerate() {
        let digit = (n >> (bits as usize * (count - 1 - i))) & mask;
        *d = digits[digit as usize];
    }
    count
}

/// A request to run an agent on a thread.
#[derive(Debug, Clone)]
pub struct RunActivation {
    /// The thread.
    pub thread_id: ThreadId,
    /// The agent.
    pub agent_id: String,
    /// New messages (usually one user message).
    pub messages: Vec<Message>,
    /// The profile whose profile-scoped state the run sees.
    pub profile_id: Option<ProfileId>,
    /// A run-level inference override (between the agent's default and step overrides).
    pub inference: Option<InferenceOverride>,
    /// Cancels the run when cancelled.
    pub cancel: CancellationToken,
    /// On a thread waiting for decisions: close its suspended calls as cancelled and start
    /// this run instead of refusing it.
    pub supersede: bool,
    /// The run's id, when the caller derives it (a delegate's child run); else the id source's.
    pub(crate) run_id: Option<RunId>,
    /// The parent run of a delegate's child run.
    pub(crate) parent_run_id: Option<RunId>,
}

impl RunActivation {
    /// A run of `agent_id` on `thread_id` with no new messages.
    pub fn new(thread_id: ThreadId, agent_id: impl Into<String>) -> Self {
        Self {
            thread_id,
            agent_id: agent_id.into(),
            messages: Vec::new(),
            profile_id: None,
            inference: None,
            cancel: CancellationToken::new(),
            supersede: false,
            run_id: None,
            parent_run_id: None,
        }
    }

    /// Adds a user message.
    pub fn with_user_message(mut self, text: impl Into<String>) -> Self {
        self.messages.push(Message::user(text));
        self
    }

    /// Adds a message.
    pub fn with_message(mut self, message: Message) -> Self {
        self.messages.push(message);
        self
    }

    /// Sets the profile.
    pub fn with_profile(mut self, profile_id: ProfileId) -> Self {
        self.profile_id = Some(profile_id);
        self
    }

    /// Sets the run-level inference override.
    pub fn with_inference(mut self, inference: InferenceOverride) -> Self {
        self.inference = Some(inference);
        self
    }

    /// Supersedes the suspended calls of a waiting thread (they are closed as cancelled).
    pub fn with_supersede(mut self) -> Self {
        self.supersede = true;
        self
    }

    /// A handle that cancels this run.
    pub fn handle(&self) -> RunHandle {
        RunHandle::new(self.cancel.clone())
    }
}

/// Cancels a run from anywhere.
#[derive(Debug, Clone)]
pub struct RunHandle {
    cancel: CancellationToken,
}

impl RunHandle {
    pub(crate) fn new(cancel: CancellationToken) -> Self {
        Self { cancel }
    }

    /// Cancels the run: it ends as `Cancelled` at its next await point.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Whether the run was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    /// The run.
    pub run_id: RunId,
    /// Why it ended.
    pub termination: TerminationReason,
    /// The last assistant text, if any.
    pub response: Option<String>,
    /// Steps taken in this activation.
    pub steps: u32,
    /// Token usage of the run.
    pub usage: TokenUsage,
}

/// Why a run could not start (or could not write its first commit).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The agent did not resolve.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// A resume or recovery of an endpoint-backed agent's run: its backend owns that run.
    #[error(
        "agent `{agent_id}` runs on execution backend `{backend}`, which owns its runs: resume or recover them there"
    )]
    BackendPlan {
        /// The agent.
        agent_id: String,
        /// The backend.
        backend: String,
    },
    /// The execution backend of an endpoint-backed agent failed.
    #[error(transparent)]
    Backend(awaken_resolver::BackendError),
    /// The thread's last run waits for decisions on suspended tool calls (resume it, or
    /// supersede the calls).
    #[error(
        "thread `{thread_id}` is waiting: run `{run_id}` has suspended tool calls that need a decision: {}",
        calls.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    ThreadWaiting {
        /// The thread.
        thread_id: ThreadId,
        /// The waiting run.
        run_id: RunId,
        /// The calls waiting for a decision.
        calls: Vec<awaken_event::ToolCallId>,
    },
    /// The stored tool batch (or recorded decisions) of the thread do not decode.
    #[error("the stored tool batch of thread `{thread_id}` cannot be used: {message}")]
    StoredBatch {
        /// The thread.
        thread_id: ThreadId,
        /// Why.
        message: String,
    },
    /// `recover()` claimed a run the thread no longer holds as its unfinished run.
    #[error("run `{run_id}` of thread `{thread_id}` is not an unfinished run of the thread")]
    NotRecoverable {
        /// The thread.
        thread_id: ThreadId,
        /// The claimed run.
        run_id: RunId,
    },
    /// The runtime is shutting down and starts no activation.
    #[error("the runtime is shutting down")]
    ShuttingDown,
    /// Another worker holds the run's lease (it resumes or recovers the run).
    #[error("run `{run_id}` of thread `{thread_id}` is held by another worker")]
    TakenOver {
        /// The thread.
        thread_id: ThreadId,
        /// The run.
        run_id: RunId,
    },
    /// A new run was given the id of the thread's latest run (ids must be unique).
    #[error("thread `{thread_id}` already has a run `{run_id}`; a new run needs a new id")]
    RunIdTaken {
        /// The thread.
        thread_id: ThreadId,
        /// The id.
        run_id: RunId,
    },
    /// `resume` on a thread that is not waiting for decisions.
    #[error("thread `{thread_id}` has no run waiting for decisions")]
    NotWaiting {
        /// The thread.
        thread_id: ThreadId,
    },
    /// A decision was refused; none was applied.
    #[error("the decisions for thread `{thread_id}` were refused: {source}")]
    Decision {
        /// The thread.
        thread_id: ThreadId,
        /// Why.
        #[source]
        source: crate::resume::DecisionError,
    },
    /// The store could not be read.
    #[error("the thread store failed: {0}")]
    Store(#[source] StoreError),
    /// The stored thread state does not fit the agent's keys.
    #[error("the stored state of thread `{thread_id}` cannot be restored: {source}")]
    State {
        /// The thread.
        thread_id: ThreadId,
        /// Why.
        #[source]
        source: StateError,
    },
    /// The run's first commit failed; nothing of the run was written.
    #[error("the first commit of a run on thread `{thread_id}` failed: {message}")]
    Checkpoint {
        /// The thread.
        thread_id: ThreadId,
        /// Why.
        message: String,
    },
}

/// How [`AgentRuntime::recover`] claims runs.
#[derive(Debug, Clone)]
pub struct RecoverConfig {
    /// This worker's id (names the lease holder).
    pub worker_id: String,
    /// How long a claim lasts without a heartbeat (default 30 s).
    pub lease_duration: std::time::Duration,
    /// At most this many runs per call (default 64).
    pub limit: usize,
    /// Only runs of these agents (none: every agent); another agent's run is released at
    /// once, for a worker that has it.
    pub agents: Option<Vec<String>>,
    /// Cancels the recovered runs (each ends `Cancelled` with its checkpoint) and stops
    /// claiming more.
    pub cancel: CancellationToken,
}

impl RecoverConfig {
    /// Defaults for `worker_id`.
    pub fn new(worker_id: impl Into<String>) -> Self {
        Self {
            worker_id: worker_id.into(),
            lease_duration: std::time::Duration::from_secs(30),
            limit: 64,
            agents: None,
            cancel: CancellationToken::new(),
        }
    }

    /// Recovers only runs of these agents.
    pub fn with_agents(mut self, agents: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.agents = Some(agents.into_iter().map(Into::into).collect());
        self
    }

    /// Sets the token that cancels the recovery.
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }

    /// Sets the lease duration.
    pub fn with_lease_duration(mut self, duration: std::time::Duration) -> Self {
        self.lease_duration = duration;
        self
    }

    /// Sets the number of runs claimed per call.
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
}

/// A run [`AgentRuntime::recover`] took over, and how its continuation ended.
#[derive(Debug)]
pub struct RecoveredRun {
    /// Its thread.
    pub thread_id: ThreadId,
    /// The run.
    pub run_id: RunId,
    /// The continued activation's outcome.
    pub outcome: Result<RunOutcome, RunError>,
}

/// Why `build` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Duplicate ids or invalid registrations, from `build_unchecked` (`build` reports them
    /// with every other problem, as `ValidationFailed`).
    #[error("registration failed: {}", errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Registration {
        /// Every recorded error.
        errors: Vec<RegistrationError>,
    },
    /// Every problem `build` found: registration errors and agents that fail their dry
    /// resolution, all of them.
    #[error(transparent)]
    ValidationFailed(#[from] ValidationFailed),
}

/// Collects registries and settings, then builds an [`AgentRuntime`].
pub struct AgentRuntimeBuilder {
    registries: Registries,
    ids: Arc<dyn IdSource>,
    store: Arc<dyn ThreadStore>,
    /// The context plugins' token estimator (`None`: the default estimator).
    estimator: Option<Arc<dyn awaken_context::TokenEstimator>>,
    /// Execution backends for endpoint-backed agents.
    backends: Vec<Arc<dyn ExecutionBackend>>,
    worker: Option<Worker>,
}

impl Default for AgentRuntimeBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentRuntimeBuilder {
    /// An empty builder with system ids.
    pub fn new() -> Self {
        let mut registries = Registries::new();
        // The standard permission plugin is in every runtime's plugin source; agents turn it
        // on by listing it.
        registries.add_plugin(Arc::new(crate::permission::PermissionPlugin::default()));
        Self {
            registries,
            ids: Arc::new(SystemIds::default()),
            store: Arc::new(MemoryStore::new()),
            estimator: None,
            backends: Vec::new(),
            worker: None,
        }
    }

    /// Adds an agent spec.
    pub fn with_agent_spec(mut self, spec: AgentSpec) -> Self {
        self.registries.add_agent_spec(spec);
        self
    }

    /// Adds agent specs.
    pub fn with_agent_specs(mut self, specs: impl IntoIterator<Item = AgentSpec>) -> Self {
        for s in specs {
            self.registries.add_agent_spec(s);
        }
        self
    }

    /// Adds a global tool.
    pub fn with_tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.registries.add_tool(tool);
        self
    }

    /// Adds a model.
    pub fn with_model(mut self, model: ModelSpec) -> Self {
        self.registries.add_model(model);
        self
    }

    /// Adds a provider executor.
    pub fn with_provider(mut self, id: impl Into<String>, executor: Arc<dyn LlmExecutor>) -> Self {
        self.registries.add_provider(id, executor);
        self
    }

    /// Adds a plugin to the plugin source.
    pub fn with_plugin(mut self, plugin: Arc<dyn Plugin>) -> Self {
        self.registries.add_plugin(plugin);
        self
    }

    /// Adds a plugin registry (plugins and agent definitions).
    pub fn with_plugin_registry(mut self, registry: Arc<PluginRegistry>) -> Self {
        self.registries.add_plugin_registry(registry);
        self
    }

    /// Adds an execution backend: agents whose endpoint it claims run through it.
    pub fn with_backend(mut self, backend: Arc<dyn ExecutionBackend>) -> Self {
        self.backends.push(backend);
        self
    }

    /// Gives the runtime a worker identity: every run it starts or resumes then holds a lease
    /// on the store (renewed every third of `lease_duration`, released at the end), so that a
    /// `recover` in another process never takes a live run over and two processes never
    /// resume one waiting run. Use it whenever several processes share a store.
    pub fn with_worker(
        mut self,
        worker_id: impl Into<String>,
        lease_duration: std::time::Duration,
    ) -> Self {
        self.worker = Some(Worker {
            id: worker_id.into(),
            lease_duration,
        });
        self
    }

    /// Sets the thread store (default: a [`MemoryStore`]).
    pub fn with_store(mut self, store: Arc<dyn ThreadStore>) -> Self {
        self.store = store;
        self
    }

    /// Sets the id and clock source.
    pub fn with_ids(mut self, ids: Arc<dyn IdSource>) -> Self {
        self.ids = ids;
        self
    }

    /// Sets the token estimator of the context plugins, used by agents with a
    /// `context_policy` (default: `awaken_context::DefaultEstimator`).
    pub fn with_token_estimator(
        mut self,
        estimator: Arc<dyn awaken_context::TokenEstimator>,
    ) -> Self {
        self.estimator = Some(estimator);
        self
    }

    /// Builds the runtime and dry-resolves every agent; every problem is reported at once
    /// ([`BuildError::ValidationFailed`]: the recorded registration errors, such as duplicate
    /// ids, and every agent's resolution failures).
    pub fn build(self) -> Result<AgentRuntime, BuildError> {
        let runtime = self.assemble();
        runtime.resolver.validate()?;
        Ok(runtime)
    }

    /// Builds without the dry resolution; duplicate ids are still reported
    /// ([`BuildError::Registration`]).
    pub fn build_unchecked(self) -> Result<AgentRuntime, BuildError> {
        if !self.registries.errors().is_empty() {
            return Err(BuildError::Registration {
                errors: self.registries.errors().to_vec(),
            });
        }
        Ok(self.assemble())
    }

    /// The runtime over the registries as they are (their recorded errors not looked at).
    fn assemble(self) -> AgentRuntime {
        let registries = Arc::new(self.registries);
        let mut builtins = RuntimeBuiltins::new(registries.clone());
        if let Some(estimator) = self.estimator {
            builtins = builtins.with_estimator(estimator);
        }
        let delegates = crate::delegate::DelegateFactory::default();
        let mut resolver = Resolver::new(registries, Arc::new(builtins))
            .with_delegate_factory(Arc::new(delegates.clone()));
        for backend in self.backends {
            resolver = resolver.with_backend(backend);
        }
        let inner = Arc::new(RuntimeInner {
            resolver,
            ids: self.ids,
            store: self.store,
            lifecycle: LifecycleDispatcher::default(),
            active: Arc::default(),
            worker: self.worker,
        });
        delegates.bind(&inner);
        AgentRuntime { inner }
    }
}

/// Runs agents. Cheap to clone (clones share everything).
#[derive(Clone)]
pub struct AgentRuntime {
    inner: Arc<RuntimeInner>,
}

impl AgentRuntime {
    pub(crate) fn from_inner(inner: Arc<RuntimeInner>) -> Self {
        Self { inner }
    }
}

impl std::ops::Deref for AgentRuntime {
    type Target = RuntimeInner;
    fn deref(&self) -> &RuntimeInner {
        &self.inner
    }
}

/// What an [`AgentRuntime`] shares between its clones (reached through `Deref`; its parts
/// are the runtime's own).
pub struct RuntimeInner {
    pub(crate) resolver: Resolver,
    pub(crate) ids: Arc<dyn IdSource>,
    /// Where threads are kept.
    pub(crate) store: Arc<dyn ThreadStore>,
    /// Lifecycle hooks of every run and of the runtime, with their statistics.
    pub(crate) lifecycle: LifecycleDispatcher,
    /// The active activations (for `shutdown`).
    pub(crate) active: Arc<ActiveRuns>,
    /// This runtime's worker identity: set, every run it drives holds a lease.
    pub(crate) worker: Option<Worker>,
}

/// A worker identity for leases.
#[derive(Debug, Clone)]
pub(crate) struct Worker {
    pub(crate) id: String,
    pub(crate) lease_duration: std::time::Duration,
}

impl std::fmt::Debug for AgentRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRuntime").finish_non_exhaustive()
    }
}

impl AgentRuntime {
    /// A builder.
    pub fn builder() -> AgentRuntimeBuilder {
        AgentRuntimeBuilder::new()
    }

    /// The resolver (every run resolves its agent afresh through it).
    pub fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    /// The thread store.
    pub fn store(&self) -> &Arc<dyn ThreadStore> {
        &self.store
    }

    /// Fires `on_runtime_start` of every plugin that implements it (`Plugin::lifecycle_hooks`;
    /// in the plugin source: plugins added directly, then those of the plugin registries), each
    /// within the lifecycle timeout; a failing
    /// hook is counted in [`AgentRuntime::lifecycle_stats`], not fatal.
    pub async fn start(&self) {
        let plugins = self.resolver.registries().plugins();
        self.lifecycle
            .dispatch(&plugins, LifecycleEvent::RuntimeStart)
            .await;
    }

    /// Shuts the runtime down: refuses new activations (`RunError::ShuttingDown`), waits for
    /// the active ones or cancels them first (`mode`), then fires `on_runtime_shutdown` of every
    /// plugin that implements it.
    pub async fn shutdown(&self, mode: ShutdownMode) {
        self.active.close(mode);
        self.active.idle().await;
        let plugins = self.resolver.registries().plugins();
        self.lifecycle
            .dispatch(&plugins, LifecycleEvent::RuntimeShutdown)
            .await;
    }

    /// How many activations are running now.
    pub fn active_runs(&self) -> usize {
        self.active.count()
    }

    /// Calls, failures and timeouts of every plugin's lifecycle hooks so far.
    pub fn lifecycle_stats(&self) -> BTreeMap<(String, LifecycleHook), HookStats> {
        self.lifecycle.all_stats()
    }

    /// Rebuilds every plugin registry of the runtime from its sources: the next run sees the
    /// new plugins and agent definitions; runs in progress keep the resolution they started
    /// with. A repeated `reload_id` is a no-op.
    pub async fn reload(&self, reload_id: &str) -> Result<Vec<ReloadOutcome>, RegistryError> {
        let mut outcomes = Vec::new();
        for registry in self.resolver.registries().plugin_registries() {
            outcomes.push(registry.reload(reload_id).await?);
        }
        Ok(outcomes)
    }

    /// The thread's stored history (empty for an unknown thread).
    pub async fn history(&self, thread_id: &ThreadId) -> Result<Vec<Message>, StoreError> {
        Ok(self
            .store
            .load_checkpoint(thread_id)
            .await?
            .map(|c| c.messages)
            .unwrap_or_default())
    }

    /// Runs `activation` to its end, streaming events to `sink`.
    ///
    /// (Not an `async fn`, and the same to await: the activation is boxed when the future is
    /// made, so an in-flight run's future does not carry it by value for its whole life.)
    pub fn run<'a>(
        &'a self,
        activation: RunActivation,
        sink: &'a dyn EventSink,
    ) -> impl Future<Output = Result<RunOutcome, RunError>> + Send + 'a {
        crate::run::run(self, activation, sink)
    }

    /// Runs `activation` to its end without streaming.
    pub fn run_to_completion(
        &self,
        activation: RunActivation,
    ) -> impl Future<Output = Result<RunOutcome, RunError>> + Send + '_ {
        self.run(activation, &NullSink)
    }

    /// Continues the run waiting on `resume.thread_id` with decisions on its suspended calls,
    /// streaming the new activation's events to `sink`. Every decision is checked before any
    /// is applied; while some suspended call has no decision the run keeps waiting (the
    /// decisions given are recorded) and the activation ends `Suspended` again.
    pub async fn resume(
        &self,
        resume: Resume,
        sink: &dyn EventSink,
    ) -> Result<RunOutcome, RunError> {
        crate::run::resume(self, resume, sink).await
    }

    /// [`AgentRuntime::resume`] without streaming.
    pub async fn resume_to_completion(&self, resume: Resume) -> Result<RunOutcome, RunError> {
        self.resume(resume, &NullSink).await
    }

    /// Continues unfinished runs after a crash: claims up to `config.limit` runs whose lease is
    /// free or expired (a run still written by a live worker holds its lease), keeps each lease
    /// with a heartbeat while the run is driven, and releases it at the end. A `Requested` call
    /// is gated again; an `Executing` call with no result follows its tool's recovery policy
    /// and is never silently re-run. Runs waiting for a human are left waiting. Each recovered
    /// run streams its activation to `sink`, one after another.
    pub async fn recover(
        &self,
        config: &RecoverConfig,
        sink: &dyn EventSink,
    ) -> Result<Vec<RecoveredRun>, RunError> {
        let now = self.ids.timestamp();
        let claims = self
            .store
            .claim_runnable(&config.worker_id, config.lease_duration, now, config.limit)
            .await
            .map_err(RunError::Store)?;
        let mut recovered = Vec::with_capacity(claims.len());
        for claimed in claims {
            let lease = claimed.lease.clone();
            let foreign = config
                .agents
                .as_ref()
                .is_some_and(|a| !a.iter().any(|id| **id == *claimed.run.agent_id));
            // A human's decision resumes a waiting run, not a recovery; another worker serves
            // a foreign agent; a delegate's child run is continued by its parent's call (the
            // delegate tool re-run with the same key); a cancelled recovery starts nothing.
            if claimed.run.status == RunStatus::Waiting
                || foreign
                || claimed.run.parent_run_id.is_some()
                || config.cancel.is_cancelled()
            {
                self.release(&lease).await;
                continue;
            }
            let thread_id = claimed.thread_id.clone();
            let run_id = claimed.run.run_id.clone();
            let cancel = config.cancel.child_token();
            let heartbeat =
                self.spawn_heartbeat(lease.clone(), config.lease_duration, cancel.clone());
            let outcome = crate::run::recover(self, claimed.into(), cancel, sink).await;
            heartbeat.abort();
            // A finished run's last commit released the lease; a waiting or failed one did not.
            self.release(&lease).await;
            recovered.push(RecoveredRun {
                thread_id,
                run_id,
                outcome,
            });
        }
        Ok(recovered)
    }

    pub(crate) async fn release(&self, lease: &LeaseToken) {
        if let Err(e) = self.store.release(lease).await {
            tracing::warn!(run_id = %lease.run_id, error = %e, "releasing a run's lease failed");
        }
    }

    /// Renews `lease` every third of its duration until aborted; a lost lease cancels the run
    /// (another worker owns it now: this one must stop writing).
    pub(crate) fn spawn_heartbeat(
        &self,
        lease: LeaseToken,
        duration: std::time::Duration,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let store = self.store.clone();
        let ids = self.ids.clone();
        tokio::spawn(async move {
            let every = (duration / 3).max(std::time::Duration::from_millis(1));
            loop {
                tokio::time::sleep(every).await;
                let now = ids.timestamp();
                match store.heartbeat(&lease, duration, now).await {
                    Ok(_) => {}
                    Err(StoreError::LeaseLost { .. }) => {
                        tracing::warn!(run_id = %lease.run_id, "lease lost: cancelling the run");
                        cancel.cancel();
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(run_id = %lease.run_id, error = %e, "heartbeat failed")
                    }
                }
            }
        })
    }

    /// The tickets of the calls the thread's run still waits on: suspended and not decided by
    /// an earlier partial resume (empty when it waits on nothing).
    pub async fn waiting_calls(
        &self,
        thread_id: &ThreadId,
    ) -> Result<Vec<SuspendTicket>, RunError> {
        let Some(cp) = self
            .store
            .load_checkpoint(thread_id)
            .await
            .map_err(RunError::Store)?
        else {
            return Ok(Vec::new());
        };
        if cp
            .run
            .as_ref()
            .is_none_or(|r| r.status != RunStatus::Waiting)
        {
            return Ok(Vec::new());
        }
        let batch = crate::run::stored_batch(thread_id, cp.batch)?;
        // Calls an earlier (partial) resume already decided do not wait any more.
        let decided = crate::resume::recorded_decisions(&cp.run_state).unwrap_or_default();
        Ok(batch
            .map(|b| {
                crate::resume::suspended_calls(&b)
                    .into_iter()
                    .filter(|(id, _)| !decided.iter().any(|d| d.call_id == *id))
                    .map(|(_, t)| t)
                    .collect()
            })
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &[u8] = b"0123456789abcdef";

    #[test]
    fn digits_are_written_as_formatted() {
        for n in [
            0u128,
            1,
            0xf,
            0x10,
            0xdead_beef,
            u128::from(u64::MAX),
            u128::MAX,
        ] {
            let mut out = [0u8; 32];
            let len = push_digits(&mut out, n, HEX);
            assert_eq!(
                std::str::from_utf8(&out[..len]),
                Ok(format!("{n:x}").as_str())
            );
            // Base 32: read back digit by digit.
            let len = push_digits(&mut out, n, BASE32);
            let back = out[..len].iter().fold(0u128, |v, d| {
                let digit = BASE32.iter().position(|b| b == d).expect("a base-32 digit");
                v.wrapping_shl(5) | digit as u128
            });
            assert_eq!(back, n, "{n}");
        }
    }

    #[test]
    fn system_run_ids_are_distinct_and_shaped() {
        let ids = SystemIds::default();
        let (a, b) = (ids.next_run_id(), ids.next_run_id());
        assert_ne!(a, b);
        for id in [a.as_str(), b.as_str()] {
            let mut parts = id.splitn(3, '-');
            assert_eq!(parts.next(), Some("run"));
            let time = parts.next().unwrap_or_default();
            assert!(
                time.len() == 13 && time.bytes().all(|c| BASE32.contains(&c)),
                "{id}"
            );
            let n = parts.next().unwrap_or_default();
            assert!(
                !n.is_empty() && n.bytes().all(|c| BASE32.contains(&c)),
                "{id}"
            );
            // Short enough to take a 48-byte block as a shared string.
            assert!(id.len() <= 24, "{id}");
        }
        assert!(b.as_str().ends_with("-1"), "{b}");
    }
}
