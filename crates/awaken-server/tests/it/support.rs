//! What every server test uses: a model whose stream the test holds and releases, tools and an
//! approval gate, a runtime over a store, a server on a loopback port with a client, and an
//! SSE reader that turns a response body into frames and events.

use std::collections::VecDeque;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use awaken_event::{
    AgentEvent, EventSink, ResumeMode, StopReason, SuspendTicket, TerminationReason, ThreadId,
    ToolCallId, ToolDescriptor, check_activation,
};
use awaken_llm::{InferenceRequest, LlmEventStream, LlmExecutor, LlmStreamEvent};
use awaken_phase::PhaseContext;
use awaken_plugin::{FnGate, Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_runtime::{AgentRuntime, IdSource, SequentialIds, SystemIds};
use awaken_server::{AgentServer, EventId, QueueConfig, ServeError, ServerConfig, serve};
use awaken_spec::{AgentSpec, InferenceOverride, ModelSpec};
use awaken_store::{
    ClaimedRun, CommitError, CommitReceipt, LeaseError, LeaseToken, MemoryStore, ProfileState,
    RunQueue, RunRecord, RunStatus, SqliteConfig, SqliteStore, StoreError, StoredEvent,
    ThreadCommit, ThreadStore, ThreadSummary, Timestamp,
};
use awaken_tool::{
    Tool, ToolCallContext, ToolError, ToolInterceptPayload, ToolOutput, pending_call,
};
use futures_util::{Stream, StreamExt};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, oneshot, watch};

/// How long any single wait of a test may take before the test fails (a guard against a hang,
/// never a synchronisation).
pub const GUARD: Duration = Duration::from_secs(30);

/// The lease of a worker's runs: long enough that none expires within a test.
pub const LEASE: Duration = Duration::from_secs(60);

/// Awaits `f`, failing the test with `what` if it takes longer than [`GUARD`].
pub async fn guarded<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(GUARD, f).await {
        Ok(out) => out,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

// ---- the model ----

/// One piece of a scripted model answer: an event, or a point where the stream waits until the
/// test releases it.
pub enum Piece {
    Event(LlmStreamEvent),
    Hold,
}

/// A text delta.
pub fn text(s: &str) -> Piece {
    Piece::Event(LlmStreamEvent::TextDelta(s.into()))
}

/// The end of an answer.
pub fn stop(reason: StopReason) -> Piece {
    Piece::Event(LlmStreamEvent::Stop(reason))
}

/// An answer made of `parts` of text.
pub fn text_turn(parts: &[&str]) -> Vec<Piece> {
    let mut turn: Vec<Piece> = parts.iter().map(|p| text(p)).collect();
    turn.push(stop(StopReason::EndTurn));
    turn
}

/// How the run of `frames` ended: the termination of the `run_finish` that ends them.
pub fn termination(frames: &[Frame]) -> TerminationReason {
    match frames.last().map(Frame::agent_event) {
        Some((_, AgentEvent::RunFinish { termination, .. })) => *termination,
        _ => panic!("the stream ends with run_finish: {frames:#?}"),
    }
}

/// An answer held after its first delta (`Hel`, then `lo` once released).
pub fn held() -> Vec<Piece> {
    vec![
        text("Hel"),
        Piece::Hold,
        text("lo"),
        stop(StopReason::EndTurn),
    ]
}

/// The pieces of a call of `name` with `args` as call `id` (no `Stop`).
pub fn call(id: &str, name: &str, args: Value) -> Vec<Piece> {
    vec![
        Piece::Event(LlmStreamEvent::ToolCallStart {
            index: 0,
            id: ToolCallId::new(id).expect("id"),
            name: name.into(),
        }),
        Piece::Event(LlmStreamEvent::ToolCallArgsDelta {
            index: 0,
            delta: args.to_string(),
        }),
    ]
}

/// An answer that only calls `name` with `args` as call `id`.
pub fn call_turn(id: &str, name: &str, args: Value) -> Vec<Piece> {
    let mut turn = call(id, name, args);
    turn.push(stop(StopReason::ToolCalls));
    turn
}

/// A model that answers each inference with the next scripted turn and, at each
/// [`Piece::Hold`], waits for a permit the test hands out with [`Held::release`].
pub struct Held {
    turns: Mutex<VecDeque<Vec<Piece>>>,
    /// The inference overrides of each request, in order.
    overrides: Mutex<Vec<InferenceOverride>>,
    gate: Arc<Semaphore>,
    requests: Arc<watch::Sender<usize>>,
    holds: Arc<watch::Sender<usize>>,
}

impl Held {
    pub fn new(turns: Vec<Vec<Piece>>) -> Arc<Self> {
        Arc::new(Self {
            turns: Mutex::new(turns.into()),
            overrides: Mutex::new(Vec::new()),
            gate: Arc::new(Semaphore::new(0)),
            requests: Arc::new(watch::channel(0).0),
            holds: Arc::new(watch::channel(0).0),
        })
    }

    /// Lets `n` held streams go on past their hold.
    pub fn release(&self, n: usize) {
        self.gate.add_permits(n);
    }

    /// The inference overrides each request so far carried.
    pub fn overrides(&self) -> Vec<InferenceOverride> {
        self.overrides.lock().expect("overrides").clone()
    }

    /// Inferences asked for so far.
    pub fn requests(&self) -> usize {
        *self.requests.borrow()
    }

    /// Waits until the streams reached a hold `n` times.
    pub async fn wait_holds(&self, n: usize) {
        let mut rx = self.holds.subscribe();
        guarded("the model to hold", rx.wait_for(|h| *h >= n))
            .await
            .expect("the model lives");
    }
}

impl LlmExecutor for Held {
    fn name(&self) -> &str {
        "held"
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        self.overrides
            .lock()
            .expect("overrides")
            .push(request.overrides);
        let pieces = self
            .turns
            .lock()
            .expect("turns")
            .pop_front()
            .unwrap_or_else(|| text_turn(&["(the script has no turn left)"]));
        self.requests.send_modify(|n| *n += 1);
        let state = (pieces.into_iter(), self.gate.clone(), self.holds.clone());
        Box::pin(futures_util::stream::unfold(
            state,
            |(mut pieces, gate, holds)| async move {
                loop {
                    match pieces.next()? {
                        Piece::Hold => {
                            holds.send_modify(|n| *n += 1);
                            gate.acquire().await.ok()?.forget();
                        }
                        Piece::Event(e) => return Some((Ok(e), (pieces, gate, holds))),
                    }
                }
            },
        ))
    }
}

// ---- tools and the approval gate ----

/// `echo {"text": string}` → `{"echoed": text}`; registered as `echo` and, behind the approval
/// gate, as `guarded`.
pub struct Echo(&'static str);

#[async_trait]
impl Tool for Echo {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(self.0, "Echo text").with_parameters(json!({
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

/// `count {}` → how many times it ran, counted in a number the test shares across runtimes.
pub struct Count(pub Arc<AtomicUsize>);

#[async_trait]
impl Tool for Count {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("count", "Counts its executions").with_parameters(json!({
            "type": "object",
            "properties": {}
        }))
    }
    async fn execute(
        &self,
        _args: &Value,
        _ctx: &ToolCallContext,
    ) -> Result<ToolOutput, ToolError> {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(ToolOutput::success(json!({"count": n})))
    }
}

/// Suspends every `guarded` call that carries no decision yet.
struct Approval(PluginManifest);

impl Plugin for Approval {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_tool_gate_hook(
            "ask",
            Arc::new(FnGate(|ctx: &PhaseContext| {
                let Some(tool) = ctx.tool.as_ref() else {
                    return Ok(None);
                };
                if tool.call.name != "guarded" || tool.resume.is_some() {
                    return Ok(None);
                }
                Ok(Some(ToolInterceptPayload::Suspend(SuspendTicket {
                    suspension_id: format!("ask-{}", tool.call.id),
                    call: pending_call(&tool.call),
                    message: format!("Run guarded with {}?", tool.call.arguments),
                    response_schema: None,
                    resume_mode: ResumeMode::Replay,
                })))
            })),
        )
    }
}

// ---- runtimes and stores ----

/// Which ids a runtime hands out: sequential ones compare across runtimes; system ones never
/// repeat across runtimes on one store and carry the real clock (leases expire in real time).
#[derive(Clone, Copy)]
pub enum Ids {
    Sequential,
    System,
}

/// What a runtime of the tests is built from.
pub struct Rig {
    pub store: Arc<Watched>,
    pub model: Arc<Held>,
    pub counted: Arc<AtomicUsize>,
    pub ids: Ids,
    /// The worker id the runtime's runs hold leases under, if any.
    pub worker: Option<String>,
    /// The duration of those leases.
    pub lease: Duration,
    /// The id of the runtime's agent.
    pub agent: String,
}

impl Rig {
    /// A rig on a fresh memory store.
    pub fn memory(turns: Vec<Vec<Piece>>) -> Self {
        Self::on(Arc::new(MemoryStore::new()), turns)
    }

    /// A rig on `store`, with system ids.
    pub fn on(store: Arc<dyn ThreadStore>, turns: Vec<Vec<Piece>>) -> Self {
        Self {
            store: Arc::new(Watched::new(store)),
            model: Held::new(turns),
            counted: Arc::new(AtomicUsize::new(0)),
            ids: Ids::System,
            worker: None,
            lease: LEASE,
            agent: "agent".into(),
        }
    }

    /// Gives the runtime the worker identity `id`: its runs hold leases.
    pub fn with_worker(mut self, id: &str) -> Self {
        self.worker = Some(id.into());
        self
    }

    /// Makes the leases of the worker's runs last `lease` (instead of [`LEASE`]).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Names the runtime's agent `agent` (instead of `agent`).
    pub fn with_agent(mut self, agent: &str) -> Self {
        self.agent = agent.into();
        self
    }

    pub fn with_ids(mut self, ids: Ids) -> Self {
        self.ids = ids;
        self
    }

    /// Counts `count` executions in `counted` (shared with another rig).
    pub fn counting(mut self, counted: &Arc<AtomicUsize>) -> Self {
        self.counted = counted.clone();
        self
    }

    /// The runtime: its agent (`agent` unless renamed) on the held model, with `echo`,
    /// `guarded` (behind the approval gate) and `count`.
    pub fn runtime(&self) -> AgentRuntime {
        let ids: Arc<dyn IdSource> = match self.ids {
            Ids::Sequential => Arc::new(SequentialIds::default()),
            Ids::System => Arc::new(SystemIds::default()),
        };
        let mut builder = AgentRuntime::builder();
        if let Some(worker) = &self.worker {
            builder = builder.with_worker(worker.clone(), self.lease);
        }
        builder
            .with_ids(ids)
            .with_store(self.store.clone())
            .with_model(ModelSpec::new("model", "held", "upstream"))
            .with_provider("held", self.model.clone())
            .with_tool(Arc::new(Echo("echo")))
            .with_tool(Arc::new(Echo("guarded")))
            .with_tool(Arc::new(Count(self.counted.clone())))
            .with_plugin(Arc::new(Approval(PluginManifest::new("approval"))))
            .with_agent_spec(
                AgentSpec::new(self.agent.as_str(), "model")
                    .with_description("The test agent")
                    .with_plugin("approval"),
            )
            .build()
            .expect("runtime")
    }
}

/// A SQLite store in `dir`'s `threads.db`.
pub async fn sqlite(dir: &Path) -> Arc<dyn ThreadStore> {
    Arc::new(
        SqliteStore::open(SqliteConfig::file(dir.join("threads.db")))
            .await
            .expect("sqlite"),
    )
}

/// A store that counts the claims of unfinished runs (recovery's scans), can hold claims and
/// commits back, and otherwise hands everything to the store inside.
pub struct Watched {
    inner: Arc<dyn ThreadStore>,
    scans: watch::Sender<usize>,
    /// Whether recovery's claims go through now (closed: they wait).
    claims_open: watch::Sender<bool>,
    /// Whether commits go through now (closed: they wait).
    commits_open: watch::Sender<bool>,
    /// How many commits waited for the gate so far.
    held_commits: watch::Sender<usize>,
    /// The run records `list_runs` answers instead of the store's (a reader that lags behind).
    frozen_runs: Mutex<Option<Vec<RunRecord>>>,
    /// Whether a commit ending its run fails (the database went away at the run's end).
    failing_ends: std::sync::atomic::AtomicBool,
    /// Whether lease releases go through now (closed: they wait).
    releases_open: watch::Sender<bool>,
}

impl Watched {
    fn new(inner: Arc<dyn ThreadStore>) -> Self {
        Self {
            inner,
            scans: watch::channel(0).0,
            claims_open: watch::channel(true).0,
            commits_open: watch::channel(true).0,
            held_commits: watch::channel(0).0,
            frozen_runs: Mutex::new(None),
            failing_ends: std::sync::atomic::AtomicBool::new(false),
            releases_open: watch::channel(true).0,
        }
    }

    /// Makes lease releases wait (a run that sent its `run_finish` has not closed yet).
    pub fn close_releases(&self) {
        self.releases_open.send_replace(false);
    }

    /// Lets lease releases go through.
    pub fn open_releases(&self) {
        self.releases_open.send_replace(true);
    }

    /// Makes every commit that ends its run fail (`true`), writing nothing, or go through.
    pub fn fail_ends(&self, fail: bool) {
        self.failing_ends.store(fail, Ordering::SeqCst);
    }

    /// The refusal of `commit` when it ends its run while ends fail.
    fn failed_end(&self, commit: &ThreadCommit) -> Option<CommitError> {
        (self.failing_ends.load(Ordering::SeqCst) && commit.run.status != RunStatus::Running).then(
            || {
                StoreError::Task {
                    detail: "the database went away".into(),
                }
                .into()
            },
        )
    }

    /// Makes `list_runs` answer the thread's run records as they are now, whatever is
    /// committed later: a read that lags behind the commits.
    pub async fn freeze_runs(&self, thread: &str) {
        let runs = self.inner.list_runs(&tid(thread)).await.expect("runs");
        *self.frozen_runs.lock().expect("frozen runs") = Some(runs);
    }

    /// Makes commits wait (a store that does not answer).
    pub fn close_commits(&self) {
        self.commits_open.send_replace(false);
    }

    /// Lets commits go through.
    pub fn open_commits(&self) {
        self.commits_open.send_replace(true);
    }

    /// Waits until `n` commits in all waited for the closed gate.
    pub async fn wait_held_commits(&self, n: usize) {
        let mut rx = self.held_commits.subscribe();
        guarded("a commit to wait", rx.wait_for(|h| *h >= n))
            .await
            .expect("the store lives");
    }

    /// Makes recovery's claims wait until [`Watched::open_claims`] (a slow store).
    pub fn close_claims(&self) {
        self.claims_open.send_replace(false);
    }

    /// Lets recovery's claims go through.
    pub fn open_claims(&self) {
        self.claims_open.send_replace(true);
    }

    /// How many times recovery looked for unfinished runs so far.
    pub fn scans(&self) -> usize {
        *self.scans.borrow()
    }

    /// Waits until recovery looked for unfinished runs `n` times in all.
    pub async fn wait_scans(&self, n: usize) {
        let mut rx = self.scans.subscribe();
        guarded("recovery scans", rx.wait_for(|s| *s >= n))
            .await
            .expect("the store lives");
    }

    /// The thread's latest run record.
    pub async fn last_run(&self, thread: &str) -> RunRecord {
        self.inner
            .list_runs(&tid(thread))
            .await
            .expect("runs")
            .pop()
            .expect("a run")
    }

    /// The thread's stored events as `(id, event)`.
    pub async fn stored(&self, thread: &str) -> Vec<(EventId, AgentEvent)> {
        self.inner
            .load_events(&tid(thread), 0)
            .await
            .expect("events")
            .into_iter()
            .map(|e| (EventId::stored(e.seq), e.event))
            .collect()
    }
}

#[async_trait]
impl ThreadStore for Watched {
    async fn commit(&self, commit: &ThreadCommit) -> Result<CommitReceipt, CommitError> {
        if let Some(e) = self.failed_end(commit) {
            return Err(e);
        }
        if !*self.commits_open.borrow() {
            self.held_commits.send_modify(|n| *n += 1);
            let mut open = self.commits_open.subscribe();
            let _ = open.wait_for(|open| *open).await;
        }
        self.inner.commit(commit).await
    }
    fn commit_now(&self, commit: &ThreadCommit) -> Option<Result<CommitReceipt, CommitError>> {
        // A closed gate sends the commit to `commit`, where it waits (or fails).
        if !*self.commits_open.borrow() || self.failed_end(commit).is_some() {
            return None;
        }
        self.inner.commit_now(commit)
    }
    async fn load_checkpoint(
        &self,
        t: &ThreadId,
    ) -> Result<Option<awaken_store::Checkpoint>, StoreError> {
        self.inner.load_checkpoint(t).await
    }
    async fn load_profile(&self, p: &awaken_event::ProfileId) -> Result<ProfileState, StoreError> {
        self.inner.load_profile(p).await
    }
    async fn list_threads(&self) -> Result<Vec<ThreadSummary>, StoreError> {
        self.inner.list_threads().await
    }
    async fn list_runs(&self, t: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        let frozen = self.frozen_runs.lock().expect("frozen runs").clone();
        match frozen {
            Some(runs) => Ok(runs),
            None => self.inner.list_runs(t).await,
        }
    }
    async fn load_events(&self, t: &ThreadId, since: u64) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.load_events(t, since).await
    }
    async fn delete_thread(&self, t: &ThreadId) -> Result<bool, StoreError> {
        self.inner.delete_thread(t).await
    }
    async fn claim_runnable(
        &self,
        worker: &str,
        lease: Duration,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<ClaimedRun>, StoreError> {
        let mut open = self.claims_open.subscribe();
        let _ = open.wait_for(|open| *open).await;
        let claimed = self.inner.claim_runnable(worker, lease, now, limit).await;
        self.scans.send_modify(|n| *n += 1);
        claimed
    }
    async fn claim_run(
        &self,
        run_id: &awaken_event::RunId,
        worker: &str,
        lease: Duration,
        now: Timestamp,
    ) -> Result<Option<ClaimedRun>, StoreError> {
        self.inner.claim_run(run_id, worker, lease, now).await
    }
    async fn heartbeat(
        &self,
        lease: &LeaseToken,
        duration: Duration,
        now: Timestamp,
    ) -> Result<Timestamp, LeaseError> {
        self.inner.heartbeat(lease, duration, now).await
    }
    async fn release(&self, lease: &LeaseToken) -> Result<bool, StoreError> {
        let mut open = self.releases_open.subscribe();
        let _ = open.wait_for(|open| *open).await;
        self.inner.release(lease).await
    }
}

pub fn tid(s: &str) -> ThreadId {
    ThreadId::new(s).expect("thread id")
}

// ---- the server ----

/// The configuration of the tests: recovery looks often, shutdown is quick.
pub fn config() -> ServerConfig {
    ServerConfig {
        recover_interval: Duration::from_millis(20),
        shutdown_grace: Duration::from_millis(100),
        cancel_wait: GUARD,
        ..ServerConfig::default()
    }
}

/// A server on a loopback port, a client for it, and the means to shut it down.
pub struct TestServer {
    pub base: String,
    pub server: AgentServer,
    pub client: reqwest::Client,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), ServeError>>>,
}

impl TestServer {
    /// Serves `runtime` with `config` on 127.0.0.1.
    pub async fn start(runtime: AgentRuntime, config: ServerConfig) -> Self {
        Self::serving(AgentServer::new(runtime, config)).await
    }

    /// Serves a front end of a fleet on 127.0.0.1: its runs are queued in `queue`.
    pub async fn queued(
        runtime: AgentRuntime,
        config: ServerConfig,
        queue: RunQueue,
        queue_config: QueueConfig,
    ) -> Self {
        Self::serving(AgentServer::queued(runtime, config, queue, queue_config)).await
    }

    /// Serves `server` on 127.0.0.1.
    pub async fn serving(server: AgentServer) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let (shutdown, signal) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(server.clone(), listener, async move {
            let _ = signal.await;
        }));
        Self {
            base: format!("http://{addr}"),
            server,
            client: reqwest::Client::new(),
            shutdown: Some(shutdown),
            task: Some(task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        guarded(path, self.client.get(self.url(path)).send())
            .await
            .expect("request")
    }

    pub async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        guarded(path, self.client.post(self.url(path)).json(&body).send())
            .await
            .expect("request")
    }

    /// Posts `body` to `path` on a task of its own, for an answer that comes later.
    pub fn post_later(
        &self,
        path: &str,
        body: Value,
    ) -> tokio::task::JoinHandle<reqwest::Response> {
        let request = self.client.post(self.url(path)).json(&body);
        tokio::spawn(async move { request.send().await.expect("request") })
    }

    /// Starts a run of `message` on `thread` and returns its stream.
    pub async fn start_run(&self, thread: &str, message: &str) -> Sse {
        let response = self
            .post(
                &format!("/v1/threads/{thread}/runs"),
                json!({"message": message}),
            )
            .await;
        Sse::new(response).await
    }

    /// The thread's event stream after `after` (as `?after=`).
    pub async fn events_after(&self, thread: &str, after: &str) -> Sse {
        let response = self
            .get(&format!("/v1/threads/{thread}/events?after={after}"))
            .await;
        Sse::new(response).await
    }

    /// The thread's event stream after `last` (as `Last-Event-ID`).
    pub async fn reconnect(&self, thread: &str, last: &str) -> Sse {
        self.reconnect_to(&format!("/v1/threads/{thread}/events"), last)
            .await
    }

    /// `GET path` with `Last-Event-ID: last`, as a browser's `EventSource` reconnects.
    pub async fn reconnect_to(&self, path: &str, last: &str) -> Sse {
        let response = guarded(
            "a reconnect",
            self.client
                .get(self.url(path))
                .header("Last-Event-ID", last)
                .send(),
        )
        .await
        .expect("request");
        Sse::new(response).await
    }

    /// Fires the shutdown future.
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Waits until `serve` returned; what it returned.
    pub async fn stopped(&mut self) -> Result<(), ServeError> {
        let task = self.task.take().expect("serving");
        guarded("serve to return", task).await.expect("serve ran")
    }

    /// Shuts the server down and waits until `serve` returned.
    pub async fn stop(mut self) {
        self.begin_shutdown();
        self.stopped().await.expect("served");
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.begin_shutdown();
    }
}

// ---- errors ----

/// `GET /v1/threads/{thread}`'s answer.
pub async fn shown(server: &TestServer, thread: &str) -> Value {
    server
        .get(&format!("/v1/threads/{thread}"))
        .await
        .json()
        .await
        .expect("JSON")
}

/// The thread's stored messages, as (role, text).
pub async fn messages(server: &TestServer, thread: &str) -> Vec<(String, String)> {
    shown(server, thread).await["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            let text: String = m["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["text"].as_str())
                .collect();
            (m["role"].as_str().unwrap_or_default().to_owned(), text)
        })
        .collect()
}

/// Waits until the thread's run in flight has `n` messages waiting for its next step.
pub async fn waiting(server: &TestServer, thread: &str, n: u64) {
    guarded("the message to wait for the run", async {
        loop {
            if shown(server, thread).await["messages_waiting"] == n {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Posts `message` to thread `t`'s run while its model holds, waits until it waits for the
/// run, releases the model, and returns the answer (200).
pub async fn steered_while_held(server: &TestServer, rig: &Rig, message: &str) -> Value {
    let steered = server.post_later("/v1/threads/t/messages", json!({"message": message}));
    waiting(server, "t", 1).await;
    rig.model.release(1);
    let response = guarded("the steering answer", steered)
        .await
        .expect("posted");
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.expect("JSON")
}

/// A refusal as `(status, code, field)`, after checking the body's shape.
pub async fn refusal(response: reqwest::Response) -> (StatusCode, String, Option<String>) {
    let status = response.status();
    let body: Value = guarded("an error body", response.json())
        .await
        .expect("a JSON body");
    let error = body
        .get("error")
        .and_then(Value::as_object)
        .unwrap_or_else(|| panic!("an error object: {body}"));
    assert!(
        error
            .get("message")
            .and_then(Value::as_str)
            .is_some_and(|m| !m.is_empty()),
        "the error says what went wrong: {body}"
    );
    let code = error["code"].as_str().expect("a code").to_owned();
    let field = error
        .get("field")
        .map(|f| f.as_str().expect("a field name").to_owned());
    (status, code, field)
}

// ---- SSE ----

/// One SSE event as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
}

impl Frame {
    /// The frame as an agent event with its id as sent: `SEQ` or `SEQ.N`, with `@START` for an
    /// event sent before its commit (or a delta after one); the event name is the data's type.
    pub fn agent_event(&self) -> (EventId, AgentEvent) {
        let id = self
            .id
            .as_deref()
            .unwrap_or_else(|| panic!("an id: {self:?}"));
        let id = EventId::parse(id).unwrap_or_else(|| panic!("an event id: {self:?}"));
        assert_eq!(
            id.to_string(),
            self.id.as_deref().unwrap_or_default(),
            "canonical id"
        );
        let event: AgentEvent = serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("an agent event ({e}): {self:?}"));
        assert_eq!(self.event.as_deref(), Some(event.type_name()), "{self:?}");
        (id, event)
    }

    /// The frame as a replay from the store sends it: its id without the `@START` of an event
    /// sent before its commit.
    pub fn untagged(&self) -> Frame {
        Frame {
            id: self.id.as_deref().map(|id| {
                id.split_once('@')
                    .map_or(id, |(position, _)| position)
                    .to_owned()
            }),
            ..self.clone()
        }
    }

    /// Whether this is the event of `type_name`.
    pub fn is(&self, type_name: &str) -> bool {
        self.event.as_deref() == Some(type_name)
    }

    /// Whether this is a text delta of `text`.
    pub fn is_text(&self, text: &str) -> bool {
        self.is("text_delta")
            && matches!(self.agent_event().1, AgentEvent::TextDelta { delta } if delta == text)
    }
}

/// A response body's chunks (`axum::body::Bytes` is the `bytes` crate's type reqwest uses).
type Body = Pin<Box<dyn Stream<Item = reqwest::Result<axum::body::Bytes>> + Send>>;

/// Reads a `text/event-stream` response frame by frame.
pub struct Sse {
    pub headers: HeaderMap,
    body: Body,
    buf: Vec<u8>,
    ended: bool,
}

impl Sse {
    /// The stream of `response`, which must be a 200 event stream.
    pub async fn new(response: reqwest::Response) -> Self {
        let status = response.status();
        if status != StatusCode::OK {
            let body = response.text().await.unwrap_or_default();
            panic!("expected an event stream, got {status}: {body}");
        }
        let headers = response.headers().clone();
        assert_eq!(
            headers.get("content-type").and_then(|v| v.to_str().ok()),
            Some("text/event-stream"),
            "{headers:?}"
        );
        Self {
            headers,
            body: Box::pin(response.bytes_stream()),
            buf: Vec::new(),
            ended: false,
        }
    }

    /// The next frame (keep-alive comments skipped); `None` when the stream ended. Fails the
    /// test when neither comes within [`GUARD`], keep-alives or not.
    pub async fn next(&mut self) -> Option<Frame> {
        guarded("the next SSE frame", self.next_frame()).await
    }

    async fn next_frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                let block = String::from_utf8(block).expect("UTF-8 frames");
                if let Some(frame) = parse_block(&block) {
                    return Some(frame);
                }
                continue;
            }
            if self.ended {
                assert!(
                    self.buf.is_empty(),
                    "the stream ended inside a frame: {:?}",
                    String::from_utf8_lossy(&self.buf)
                );
                return None;
            }
            match self.body.next().await {
                Some(chunk) => self.buf.extend_from_slice(chunk.expect("body").as_ref()),
                None => self.ended = true,
            }
        }
    }

    /// Every frame up to the end of the stream.
    pub async fn rest(mut self) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(f) = self.next().await {
            frames.push(f);
        }
        frames
    }

    /// The frames up to and including the first that `last` accepts.
    pub async fn until(&mut self, last: impl Fn(&Frame) -> bool) -> Vec<Frame> {
        let mut frames = Vec::new();
        loop {
            let f = self.next().await.unwrap_or_else(|| {
                panic!("the stream ended before the frame awaited: {frames:#?}")
            });
            let done = last(&f);
            frames.push(f);
            if done {
                return frames;
            }
        }
    }
}

/// Reads one SSE block; `None` for a block of comments only.
fn parse_block(block: &str) -> Option<Frame> {
    let mut frame = Frame {
        id: None,
        event: None,
        data: String::new(),
    };
    let mut fields = false;
    let mut data_lines = 0;
    for line in block.lines() {
        if line.is_empty() || line.starts_with(':') {
            continue;
        }
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        fields = true;
        match name {
            "id" => frame.id = Some(value.to_owned()),
            "event" => frame.event = Some(value.to_owned()),
            "data" => {
                if data_lines > 0 {
                    frame.data.push('\n');
                }
                frame.data.push_str(value);
                data_lines += 1;
            }
            other => panic!("an unknown SSE field `{other}` in {block:?}"),
        }
    }
    fields.then_some(frame)
}

/// The frames as `(id, event)`, every one of them an agent event.
pub fn agent_events(frames: &[Frame]) -> Vec<(EventId, AgentEvent)> {
    frames.iter().map(Frame::agent_event).collect()
}

/// The frames as a replay from the store sends them (see [`Frame::untagged`]).
pub fn untagged(frames: &[Frame]) -> Vec<Frame> {
    frames.iter().map(Frame::untagged).collect()
}

/// The frames of stored events (a `SEQ` id), as a replay from the store sends them.
pub fn stored_frames(frames: &[Frame]) -> Vec<Frame> {
    frames
        .iter()
        .map(Frame::untagged)
        .filter(|f| f.id.as_deref().is_some_and(|id| !id.contains('.')))
        .collect()
}

/// Checks that `frames` are one activation's events, well formed, with ids that strictly
/// increase and tags as [`assert_tags`] wants them; returns them as `(id, event)`.
pub fn checked_activation(frames: &[Frame]) -> Vec<(EventId, AgentEvent)> {
    let events = agent_events(frames);
    let plain: Vec<AgentEvent> = events.iter().map(|(_, e)| e.clone()).collect();
    if let Err(v) = check_activation(&plain) {
        panic!("event grammar violated: {v}\n{frames:#?}");
    }
    assert_ids_increase(&events);
    // Lifecycle events, and only they, carry a stored id.
    for (id, event) in &events {
        assert_eq!(
            id.sub == 0,
            event.is_lifecycle(),
            "{} has id {id}",
            event.type_name()
        );
    }
    assert_tags(&events);
    events
}

/// [`checked_activation`] for frames the server sent while the activation ran (live or from
/// its buffer, not from the store): every stored event the runtime emits before its commit
/// (all but those of [`emitted_after_commit`]) names the activation.
pub fn checked_live(frames: &[Frame]) -> Vec<(EventId, AgentEvent)> {
    let events = checked_activation(frames);
    for (id, event) in &events {
        if event.is_lifecycle() && !emitted_after_commit(event) {
            assert!(
                id.activation.is_some(),
                "{} was sent before its commit, yet has the plain id {id}",
                event.type_name()
            );
        }
    }
    events
}

/// Whether the runtime emits `event` only once its commit stored it: the events about a
/// commit's facts. (A call closed because its step failed is closed by a note instead; no run
/// of these tests fails a step with a call open.)
pub fn emitted_after_commit(event: &AgentEvent) -> bool {
    matches!(
        event,
        AgentEvent::RunStart { .. }
            | AgentEvent::ToolCallDone { .. }
            | AgentEvent::ToolCallSuspended { .. }
            | AgentEvent::StepEnd { .. }
            | AgentEvent::MessageAdded { .. }
            | AgentEvent::RunFinish { .. }
    )
}

/// Checks the `@START` tags of one activation's events: an event emitted after its commit has
/// a plain id, a delta has the tag of the event before it, and every tag names the
/// activation's first event (its `RunStart`, when the events include it).
pub fn assert_tags(events: &[(EventId, AgentEvent)]) {
    let start = events.iter().find_map(|(id, e)| match e {
        AgentEvent::RunStart { .. } => Some(id.seq),
        _ => None,
    });
    let mut tags = events.iter().filter_map(|(id, _)| id.activation);
    if let Some(first) = tags.next() {
        assert!(
            tags.all(|t| t == first) && start.is_none_or(|s| s == first),
            "the tags name one activation, started at {start:?}: {events:#?}"
        );
    }
    for (id, event) in events {
        if emitted_after_commit(event) {
            assert_eq!(
                id.activation,
                None,
                "{} is emitted once stored, yet has the id {id}",
                event.type_name()
            );
        }
    }
    for pair in events.windows(2) {
        let ((before, _), (id, event)) = (&pair[0], &pair[1]);
        if !event.is_lifecycle() {
            assert_eq!(
                id.activation,
                before.activation,
                "{} {id} after {before}",
                event.type_name()
            );
        }
    }
}

/// Checks that the ids strictly increase.
pub fn assert_ids_increase(events: &[(EventId, AgentEvent)]) {
    for pair in events.windows(2) {
        assert!(
            pair[0].0.key() < pair[1].0.key(),
            "ids go {} then {} ({} then {})",
            pair[0].0,
            pair[1].0,
            pair[0].1.type_name(),
            pair[1].1.type_name()
        );
    }
}

/// The stored events among `events` (those with a `SEQ` id), under the ids the store gives
/// them (without the `@START` of an event sent before its commit).
pub fn stored_only(events: &[(EventId, AgentEvent)]) -> Vec<(EventId, AgentEvent)> {
    events
        .iter()
        .filter(|(id, _)| id.sub == 0)
        .map(|(id, e)| (EventId::stored(id.seq), e.clone()))
        .collect()
}

/// The events with what differs between two equal runs (inference timings) set to zero.
pub fn normalised(events: &[(EventId, AgentEvent)]) -> Vec<(EventId, AgentEvent)> {
    events
        .iter()
        .map(|(id, e)| {
            let mut e = e.clone();
            if let AgentEvent::InferenceComplete { duration_ms, .. } = &mut e {
                *duration_ms = 0;
            }
            (*id, e)
        })
        .collect()
}

/// One line per event with its id (`id type detail`), for expected blocks.
pub fn render(events: &[(EventId, AgentEvent)]) -> String {
    let mut out = String::new();
    for (id, e) in events {
        let detail = match e {
            AgentEvent::RunStart {
                run_id: _, resumed, ..
            } => format!("resumed={resumed}"),
            AgentEvent::RunFinish {
                termination,
                response,
                ..
            } => format!("{termination} response={response:?}"),
            AgentEvent::StepStart { step } | AgentEvent::StepEnd { step } => step.to_string(),
            AgentEvent::TextDelta { delta } => format!("{delta:?}"),
            AgentEvent::ToolCallStart { call_id, name } => format!("{call_id} {name}"),
            AgentEvent::ToolCallArgsDelta { call_id, delta } => format!("{call_id} {delta}"),
            AgentEvent::ToolCallReady {
                call_id, arguments, ..
            } => format!("{call_id} {arguments}"),
            AgentEvent::ToolCallDone {
                call_id,
                result,
                state,
            } => format!("{call_id} {state} {}", result.content),
            AgentEvent::ToolCallSuspended { call_id, .. } => call_id.to_string(),
            AgentEvent::ToolCallResumed { call_id, decision } => format!("{call_id} {decision:?}"),
            _ => String::new(),
        };
        out.push_str(format!("{id} {} {detail}", e.type_name()).trim_end());
        out.push('\n');
    }
    out
}

/// What the runtime handed a [`Recording`].
enum Recorded {
    /// `emit_stored` (with the number) or `emit`.
    Event(Option<u64>, AgentEvent),
    /// `committed`.
    Committed(u64),
}

/// A sink that records what the runtime handed it, in order; [`Recording::ids`] numbers the
/// events the way the server does.
#[derive(Default)]
pub struct Recording(Mutex<Vec<Recorded>>);

impl EventSink for Recording {
    fn emit(&self, event: &AgentEvent) {
        self.push(Recorded::Event(None, event.clone()));
    }
    fn emit_stored(&self, event: &AgentEvent, seq: u64) {
        self.push(Recorded::Event(Some(seq), event.clone()));
    }
    fn committed(&self, last_seq: u64) {
        self.push(Recorded::Committed(last_seq));
    }
}

impl Recording {
    fn push(&self, recorded: Recorded) {
        self.0.lock().expect("recording").push(recorded);
    }

    /// The events recorded since the last call (one activation) with the id each gets on the
    /// wire: a stored event its number, a delta the number of the last stored event and its
    /// count since; and `@START` (the activation's first stored event) on each whose number
    /// no commit had stored when it was emitted.
    pub fn ids(&self) -> Vec<(EventId, AgentEvent)> {
        let recorded = std::mem::take(&mut *self.0.lock().expect("recording"));
        let (mut last, mut start, mut durable) = (EventId::default(), None, 0);
        let mut events = Vec::new();
        for r in recorded {
            let (seq, event) = match r {
                Recorded::Committed(seq) => {
                    durable = durable.max(seq);
                    continue;
                }
                Recorded::Event(seq, event) => (seq, event),
            };
            let mut id = match seq {
                Some(seq) => EventId::stored(seq),
                None => EventId {
                    seq: last.seq,
                    sub: last.sub + 1,
                    activation: None,
                },
            };
            if let Some(seq) = seq {
                start.get_or_insert(seq);
            }
            if id.seq > durable {
                id.activation = Some(start.unwrap_or(id.seq));
            }
            last = id;
            events.push((id, event));
        }
        events
    }
}
