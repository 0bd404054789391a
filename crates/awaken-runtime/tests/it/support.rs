//! The scenario helper: a scripted model, tools and plugins in; the run's events rendered as
//! text out (and checked against the event grammar).

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use awaken_event::{
    AgentEvent, EventSink, NullSink, StopReason, TerminationReason, ThreadId, ToolCallId,
    ToolDescriptor, VecSink, check_activation,
};
use awaken_llm::{LlmEventStream, LlmStreamEvent, ScriptTurn, ScriptedExecutor};
use awaken_plugin::Plugin;
use awaken_runtime::{
    AgentRuntime, RecoverConfig, RunActivation, RunError, RunOutcome, SequentialIds,
};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use futures_util::StreamExt;
use serde_json::{Value, json};

/// `echo {"text": string}` → `{"echoed": text}`.
pub struct Echo;

#[async_trait]
impl Tool for Echo {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("echo", "Echo text").with_parameters(json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": false
        }))
    }
    async fn execute(&self, args: &Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::success(json!({"echoed": args["text"]})))
    }
}

/// A tool that always fails.
pub struct Broken;

#[async_trait]
impl Tool for Broken {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("broken", "Always fails")
    }
    async fn execute(
        &self,
        _args: &Value,
        _ctx: &ToolCallContext,
    ) -> Result<ToolOutput, ToolError> {
        Err(ToolError::Execution {
            message: "disk on fire".into(),
        })
    }
}

/// A shared log.
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn push(&self, s: impl Into<String>) {
        self.0.lock().expect("log").push(s.into());
    }
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().expect("log").clone()
    }
}

pub struct Scenario {
    pub spec: AgentSpec,
    pub turns: Vec<ScriptTurn>,
    pub tools: Vec<Arc<dyn Tool>>,
    pub plugins: Vec<Arc<dyn Plugin>>,
    pub activation: Option<Box<dyn FnOnce(RunActivation) -> RunActivation + Send>>,
    /// Cancels the run when it emits an event this accepts.
    pub cancel_when: Option<Box<dyn Fn(&AgentEvent) -> bool + Send + Sync>>,
    /// The store (the runtime's default, in memory, without one).
    pub store: Option<Arc<dyn awaken_store::ThreadStore>>,
}

pub struct Outcome {
    pub outcome: RunOutcome,
    pub events: Vec<AgentEvent>,
    pub executor: Arc<ScriptedExecutor>,
    pub runtime: AgentRuntime,
}

impl Scenario {
    pub fn new(turns: Vec<ScriptTurn>) -> Self {
        Self {
            spec: AgentSpec::new("agent", "model").with_system_prompt("Be brief."),
            turns,
            tools: vec![Arc::new(Echo), Arc::new(Broken)],
            plugins: Vec::new(),
            activation: None,
            cancel_when: None,
            store: None,
        }
    }

    pub fn store(mut self, store: Arc<dyn awaken_store::ThreadStore>) -> Self {
        self.store = Some(store);
        self
    }

    pub fn spec(mut self, f: impl FnOnce(AgentSpec) -> AgentSpec) -> Self {
        self.spec = f(self.spec);
        self
    }

    pub fn plugin(mut self, p: Arc<dyn Plugin>) -> Self {
        self.spec = self.spec.with_plugin(p.manifest().id.clone());
        self.plugins.push(p);
        self
    }

    pub fn activation(
        mut self,
        f: impl FnOnce(RunActivation) -> RunActivation + Send + 'static,
    ) -> Self {
        self.activation = Some(Box::new(f));
        self
    }

    /// Cancels the run (its activation's token) as soon as it emits an event `when` accepts:
    /// the run's own events are the signal, so the cancellation lands at a known point.
    pub fn cancel_when(
        mut self,
        when: impl Fn(&AgentEvent) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.cancel_when = Some(Box::new(when));
        self
    }

    pub async fn run(self) -> Outcome {
        let (outcome, events, executor, runtime) = self.attempt().await;
        let outcome = outcome.expect("the run starts");
        if let Err(v) = check_activation(&events) {
            panic!("event grammar violated: {v}\n{}", render(&events));
        }
        Outcome {
            outcome,
            events,
            executor,
            runtime,
        }
    }

    /// Runs the activation; what `run` returns, its result unchecked.
    pub async fn attempt(
        self,
    ) -> (
        Result<RunOutcome, RunError>,
        Vec<AgentEvent>,
        Arc<ScriptedExecutor>,
        AgentRuntime,
    ) {
        let executor = Arc::new(ScriptedExecutor::from_turns(self.turns).expect("valid script"));
        let mut builder = AgentRuntime::builder()
            .with_ids(Arc::new(SequentialIds::default()))
            .with_model(ModelSpec::new("model", "scripted", "upstream-model"))
            .with_provider("scripted", executor.clone())
            .with_agent_spec(self.spec);
        for t in self.tools {
            builder = builder.with_tool(t);
        }
        for p in self.plugins {
            builder = builder.with_plugin(p);
        }
        if let Some(store) = self.store {
            builder = builder.with_store(store);
        }
        let runtime = builder.build().expect("valid runtime");
        let mut activation = RunActivation::new(ThreadId::new("thread").expect("id"), "agent")
            .with_user_message("hi");
        if let Some(f) = self.activation {
            activation = f(activation);
        }
        let sink = VecSink::new();
        let cancel = activation.cancel.clone();
        let cancel_when = self.cancel_when;
        let watched = |event: &AgentEvent| {
            sink.emit(event);
            if cancel_when.as_ref().is_some_and(|when| when(event)) {
                cancel.cancel();
            }
        };
        let outcome = runtime.run(activation, &watched).await;
        (outcome, sink.events(), executor, runtime)
    }
}

/// The thread's stored events, in order.
pub async fn stored_events(runtime: &AgentRuntime, thread: &ThreadId) -> Vec<AgentEvent> {
    runtime
        .store()
        .load_events(thread, 0)
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.event)
        .collect()
}

/// One line per event, ids kept, noise (inference timings) left out.
pub fn render(events: &[AgentEvent]) -> String {
    let mut out = String::new();
    for e in events {
        let line = match e {
            AgentEvent::RunStart {
                run_id, resumed, ..
            } => format!("run_start {run_id} resumed={resumed}"),
            AgentEvent::RunFinish {
                termination,
                response,
                usage,
                ..
            } => {
                format!(
                    "run_finish {termination} response={response:?} tokens={}",
                    usage.total()
                )
            }
            AgentEvent::StepStart { step } => format!("step_start {step}"),
            AgentEvent::StepEnd { step } => format!("step_end {step}"),
            AgentEvent::TextDelta { delta } => format!("text {delta:?}"),
            AgentEvent::ToolCallStart { call_id, name } => format!("call_start {call_id} {name}"),
            AgentEvent::ToolCallArgsDelta { .. } => continue,
            AgentEvent::ToolCallReady {
                call_id, arguments, ..
            } => format!("call_ready {call_id} {arguments}"),
            AgentEvent::ToolCallDone {
                call_id,
                result,
                state,
            } => {
                format!("call_done {call_id} {state} {}", result.content)
            }
            AgentEvent::ToolCallSuspended { call_id, ticket } => {
                format!("call_suspended {call_id} {:?}", ticket.message)
            }
            AgentEvent::InferenceComplete { model, .. } => format!("inference {model}"),
            AgentEvent::ActionDeadLettered { action, reason, .. } => {
                format!("dead_letter {action}: {reason}")
            }
            AgentEvent::Warning { kind, detail } => format!("warning {kind:?}: {detail}"),
            AgentEvent::Error { message } => format!("error {message}"),
            other => other.type_name().to_owned(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// A model's answer that calls `name` with `arguments` (JSON text) as call `id`.
pub fn call_answer(id: &str, name: &str, arguments: String) -> LlmEventStream {
    answer(vec![
        LlmStreamEvent::ToolCallStart {
            index: 0,
            id: ToolCallId::new(id).expect("id"),
            name: name.into(),
        },
        LlmStreamEvent::ToolCallArgsDelta {
            index: 0,
            delta: arguments,
        },
        LlmStreamEvent::Stop(StopReason::ToolCalls),
    ])
}

/// A model's answer that is `text`.
pub fn text_answer(text: impl Into<String>) -> LlmEventStream {
    answer(vec![
        LlmStreamEvent::TextDelta(text.into()),
        LlmStreamEvent::Stop(StopReason::EndTurn),
    ])
}

fn answer(events: Vec<LlmStreamEvent>) -> LlmEventStream {
    Box::pin(futures_util::stream::iter(events.into_iter().map(Ok)).boxed())
}

/// A folder of one test, removed with everything in it when dropped (also when the test
/// fails), so test runs leave nothing behind in the system's temporary folder.
#[derive(Debug)]
pub struct TestDir(PathBuf);

impl std::ops::Deref for TestDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TestDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An empty folder for one test: `awaken-<pid>-<name>` under the system's temporary folder,
/// removed when the returned guard is dropped.
pub fn fresh_dir(name: &str) -> TestDir {
    let dir = std::env::temp_dir().join(format!("awaken-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    TestDir(dir)
}

/// Recovers the one unfinished run of `rt`'s store to its natural end, and checks that
/// nothing is left to recover.
pub async fn recover_the_run(rt: &AgentRuntime) {
    let recovered = rt
        .recover(&RecoverConfig::new("recoverer"), &NullSink)
        .await
        .expect("claimed");
    assert_eq!(recovered.len(), 1, "one unfinished run");
    let outcome = recovered
        .into_iter()
        .next()
        .map(|r| r.outcome.expect("recovered"))
        .expect("one");
    assert_eq!(outcome.termination, TerminationReason::NaturalEnd);
    assert!(
        rt.recover(&RecoverConfig::new("again"), &NullSink)
            .await
            .expect("claimed")
            .is_empty(),
        "nothing is left to recover"
    );
}

/// Appends `line` to the file at `path`, synced (so it survives the process being killed).
pub fn append_line(path: &Path, line: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open");
    // One write of the whole line (`writeln!` writes each piece on its own, and processes may
    // append at once).
    f.write_all(format!("{line}\n").as_bytes()).expect("write");
    f.sync_all().expect("sync");
}

/// The lines of the file at `path` (none when there is no file).
pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Re-runs this test binary on the one test `test` (`module::name`), with `dir_var` naming
/// `dir`, `AWAKEN_CRASH_AT=at` and the marker `dir/marker`; asserts the child was killed
/// with SIGKILL after writing `at` to the marker (the failpoint it reached).
pub fn kill_child_at(test: &str, dir_var: &str, dir: &Path, at: &str) {
    let marker = dir.join("marker");
    let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(dir_var, dir)
        .env("AWAKEN_CRASH_AT", at)
        .env("AWAKEN_CRASH_MARKER", &marker)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("child ran");
    assert_eq!(
        status.signal(),
        Some(9),
        "the child was killed at {at}: {status:?}"
    );
    assert_eq!(lines(&marker), [at], "the child reached {at}");
}

/// How a run whose last commit failed ended: its result must be
/// `RunError::EndNotWritten`.
pub fn unwritten_end(result: Result<RunOutcome, RunError>) -> TerminationReason {
    match result {
        Err(RunError::EndNotWritten { outcome, .. }) => outcome.termination,
        other => panic!("the run's end should be unwritten: {other:?}"),
    }
}

/// A store that shows every commit to `on_commit` first — which may refuse it (nothing is
/// written) — and otherwise hands everything to `inner`; `after_commit` sees each commit
/// written.
pub struct Intercepted {
    inner: Arc<dyn awaken_store::ThreadStore>,
    on_commit: Box<
        dyn Fn(&awaken_store::ThreadCommit) -> Result<(), awaken_store::CommitError> + Send + Sync,
    >,
    after_commit: Option<AfterCommit>,
    /// Whether `commit_now` is forwarded (the runtime's immediate path) or every commit is
    /// awaited (`commit`).
    immediate: bool,
}

/// What sees a written commit; an error is answered instead of the commit's receipt.
type AfterCommit =
    Box<dyn Fn(&awaken_store::ThreadCommit) -> Result<(), awaken_store::CommitError> + Send + Sync>;

impl Intercepted {
    pub fn new(
        inner: Arc<dyn awaken_store::ThreadStore>,
        on_commit: impl Fn(&awaken_store::ThreadCommit) -> Result<(), awaken_store::CommitError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self {
            inner,
            on_commit: Box::new(on_commit),
            after_commit: None,
            immediate: false,
        }
    }

    /// Shows every written commit to `after`, before the writer hears it was written; an error
    /// from `after` is answered instead (a commit written whose answer was lost).
    pub fn after_commit(
        mut self,
        after: impl Fn(&awaken_store::ThreadCommit) -> Result<(), awaken_store::CommitError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.after_commit = Some(Box::new(after));
        self
    }

    fn written(
        &self,
        commit: &awaken_store::ThreadCommit,
        result: Result<awaken_store::CommitReceipt, awaken_store::CommitError>,
    ) -> Result<awaken_store::CommitReceipt, awaken_store::CommitError> {
        match (&result, &self.after_commit) {
            (Ok(_), Some(after)) => after(commit).and(result),
            _ => result,
        }
    }

    /// Forwards `commit_now` too, for an inner store that writes every commit at once (the
    /// memory store): the runtime takes its immediate path.
    pub fn immediate(mut self) -> Self {
        self.immediate = true;
        self
    }

    /// A store that dies after `alive` commits: every later commit fails, writing nothing.
    pub fn dies_after(inner: Arc<dyn awaken_store::ThreadStore>, alive: usize) -> Self {
        let commits = std::sync::atomic::AtomicUsize::new(0);
        Self::new(inner, move |_| {
            if commits.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= alive {
                return Err(awaken_store::StoreError::Task {
                    detail: "the process died".into(),
                }
                .into());
            }
            Ok(())
        })
    }
}

#[async_trait]
impl awaken_store::ThreadStore for Intercepted {
    async fn commit(
        &self,
        commit: &awaken_store::ThreadCommit,
    ) -> Result<awaken_store::CommitReceipt, awaken_store::CommitError> {
        (self.on_commit)(commit)?;
        let result = self.inner.commit(commit).await;
        self.written(commit, result)
    }
    fn commit_now(
        &self,
        commit: &awaken_store::ThreadCommit,
    ) -> Option<Result<awaken_store::CommitReceipt, awaken_store::CommitError>> {
        if !self.immediate {
            return None;
        }
        if let Err(e) = (self.on_commit)(commit) {
            return Some(Err(e));
        }
        match self.inner.commit_now(commit) {
            Some(written) => Some(self.written(commit, written)),
            // `on_commit` saw it already: writing it through `commit` would show it twice.
            None => panic!("`immediate` needs a store that writes every commit at once"),
        }
    }
    async fn load_checkpoint(
        &self,
        t: &awaken_event::ThreadId,
    ) -> Result<Option<awaken_store::Checkpoint>, awaken_store::StoreError> {
        self.inner.load_checkpoint(t).await
    }
    async fn load_profile(
        &self,
        p: &awaken_event::ProfileId,
    ) -> Result<awaken_store::ProfileState, awaken_store::StoreError> {
        self.inner.load_profile(p).await
    }
    async fn list_threads(
        &self,
    ) -> Result<Vec<awaken_store::ThreadSummary>, awaken_store::StoreError> {
        self.inner.list_threads().await
    }
    async fn list_runs(
        &self,
        t: &awaken_event::ThreadId,
    ) -> Result<Vec<awaken_store::RunRecord>, awaken_store::StoreError> {
        self.inner.list_runs(t).await
    }
    async fn load_events(
        &self,
        t: &awaken_event::ThreadId,
        since: u64,
    ) -> Result<Vec<awaken_store::StoredEvent>, awaken_store::StoreError> {
        self.inner.load_events(t, since).await
    }
    async fn delete_thread(
        &self,
        t: &awaken_event::ThreadId,
    ) -> Result<bool, awaken_store::StoreError> {
        self.inner.delete_thread(t).await
    }
    async fn claim_runnable(
        &self,
        worker: &str,
        lease: std::time::Duration,
        now: awaken_store::Timestamp,
        limit: usize,
    ) -> Result<Vec<awaken_store::ClaimedRun>, awaken_store::StoreError> {
        self.inner.claim_runnable(worker, lease, now, limit).await
    }
    async fn claim_run(
        &self,
        run_id: &awaken_event::RunId,
        worker: &str,
        lease: std::time::Duration,
        now: awaken_store::Timestamp,
    ) -> Result<Option<awaken_store::ClaimedRun>, awaken_store::StoreError> {
        self.inner.claim_run(run_id, worker, lease, now).await
    }
    async fn heartbeat(
        &self,
        lease: &awaken_store::LeaseToken,
        duration: std::time::Duration,
        now: awaken_store::Timestamp,
    ) -> Result<awaken_store::Timestamp, awaken_store::LeaseError> {
        self.inner.heartbeat(lease, duration, now).await
    }
    async fn release(
        &self,
        lease: &awaken_store::LeaseToken,
    ) -> Result<bool, awaken_store::StoreError> {
        self.inner.release(lease).await
    }
}
