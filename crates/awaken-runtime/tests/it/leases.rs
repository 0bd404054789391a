//! Leases across processes on one PostgreSQL database: 20 unfinished runs; a worker process
//! (this test binary re-run on `lease_worker`) kills itself (SIGKILL, failpoint) while it
//! holds a run's lease, after writing a marker; then two worker processes recover the runs at
//! once, racing for every claim, and one of them takes the dead worker's run over once its
//! lease expired. Every run finishes exactly once and no tool call runs twice.
//!
//! Needs `AWAKEN_TEST_POSTGRES_URL` (CI starts a server and sets `AWAKEN_REQUIRE_POSTGRES=1`);
//! without it the test says it was skipped and passes.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use awaken_event::{EffectClass, Role, TerminationReason, ThreadId, ToolDescriptor};
use awaken_llm::{ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken_runtime::{AgentRuntime, RecoverConfig, RunActivation, SystemIds};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_store::{PostgresConfig, PostgresStore, RunStatus, ThreadStore};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};

const RUNS: usize = 20;

pub fn postgres_url() -> Option<String> {
    match std::env::var("AWAKEN_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("AWAKEN_REQUIRE_POSTGRES").map_or(true, |v| v != "1"),
                "AWAKEN_REQUIRE_POSTGRES=1 but AWAKEN_TEST_POSTGRES_URL is not set"
            );
            None
        }
    }
}

/// The test server's URL and a schema of `test`'s own (new at each run), or `None` when no
/// server is configured (the test is skipped, with a note).
pub fn postgres_schema(test: &str) -> Option<(String, String)> {
    let Some(url) = postgres_url() else {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "awaken-runtime: the PostgreSQL {test} test was SKIPPED (AWAKEN_TEST_POSTGRES_URL is not set)"
        );
        return None;
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    Some((url, format!("awaken_{test}_{}_{nanos}", std::process::id())))
}

async fn store(url: &str, schema: &str) -> Arc<dyn ThreadStore> {
    Arc::new(
        PostgresStore::connect(
            PostgresConfig::new(url)
                .with_schema(schema)
                .with_max_connections(2),
        )
        .await
        .expect("postgres"),
    )
}

/// Appends `<thread> <call>` to `<dir>/calls.log` (side-effecting: never re-run).
struct Book(std::path::PathBuf);

#[async_trait]
impl Tool for Book {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("book", "Books").with_effect(EffectClass::SideEffecting)
    }
    async fn execute(&self, _args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.0.join("calls.log"))
            .map_err(|e| ToolError::Execution {
                message: e.to_string(),
            })?;
        // One write of the whole line: two workers append at once, and `writeln!` on a file
        // writes each piece on its own (their lines interleaved).
        let line = format!("{} {}\n", ctx.thread_id(), ctx.call_id());
        f.write_all(line.as_bytes())
            .map_err(|e| ToolError::Execution {
                message: e.to_string(),
            })?;
        Ok(ToolOutput::success(json!("booked")))
    }
}

/// Each run: one `book` call, then a text (the scripted executor is stateless per request
/// here: it answers from the history, so any worker can continue any run).
struct Model;

impl awaken_llm::LlmExecutor for Model {
    fn name(&self) -> &str {
        "model"
    }
    fn execute_stream(&self, request: awaken_llm::InferenceRequest) -> awaken_llm::LlmEventStream {
        let booked = request.messages.iter().any(|m| m.role == Role::Tool);
        let turn = if booked {
            ScriptTurn::text("done")
        } else {
            ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("book", json!({})).with_id("c1"))
        };
        match ScriptedExecutor::from_turns(vec![turn]) {
            Ok(e) => e.execute_stream(request),
            Err(e) => unreachable!("a one-turn script is valid: {e}"),
        }
    }
}

fn runtime(store: Arc<dyn ThreadStore>, dir: &Path) -> AgentRuntime {
    AgentRuntime::builder()
        .with_ids(Arc::new(SystemIds::default()))
        .with_store(store)
        .with_model(ModelSpec::new("model", "p", "upstream"))
        .with_provider("p", Arc::new(Model))
        .with_tool(Arc::new(Book(dir.to_owned())))
        .with_agent_spec(AgentSpec::new("agent", "model"))
        .build()
        .expect("runtime")
}

/// A worker process: recovers runs (one claim at a time, short leases) until none is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_worker() {
    let (Ok(url), Ok(schema), Ok(dir), Ok(worker)) = (
        std::env::var("AWAKEN_TEST_POSTGRES_URL"),
        std::env::var("AWAKEN_LEASE_SCHEMA"),
        std::env::var("AWAKEN_LEASE_DIR"),
        std::env::var("AWAKEN_LEASE_WORKER"),
    ) else {
        return;
    };
    let store = store(&url, &schema).await;
    let rt = runtime(store.clone(), Path::new(&dir));
    let config = RecoverConfig::new(worker)
        .with_lease_duration(Duration::from_millis(1500))
        .with_limit(1);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !all_done(store.as_ref()).await {
        assert!(
            std::time::Instant::now() < deadline,
            "the runs did not all finish"
        );
        let recovered = rt
            .recover(&config, &awaken_event::NullSink)
            .await
            .expect("recover");
        for r in recovered {
            r.outcome.expect("recovered run");
        }
        // Nothing claimable right now: another worker holds the rest, or a dead worker's
        // lease has not expired yet. Poll again shortly.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn all_done(store: &dyn ThreadStore) -> bool {
    let threads = store.list_threads().await.expect("threads");
    if threads.len() < RUNS {
        return false;
    }
    for t in threads {
        let runs = store.list_runs(&t.thread_id).await.expect("runs");
        if runs.iter().any(|r| r.status != RunStatus::Done) {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_twenty_runs_and_one_takes_over_a_dead_workers_lease() {
    let Some((url, schema)) = postgres_schema("leases") else {
        return;
    };
    let dir = crate::support::fresh_dir(&schema);
    let marker = dir.join("marker");

    // Twenty unfinished runs: each committed its start (and user message), then its process
    // went away.
    let store = store(&url, &schema).await;
    for i in 0..RUNS {
        let thread = ThreadId::new(format!("t{i:02}")).expect("id");
        let dying: Arc<dyn ThreadStore> =
            Arc::new(crate::support::Intercepted::dies_after(store.clone(), 1));
        let out = crate::support::unwritten_end(
            runtime(dying, &dir)
                .run_to_completion(RunActivation::new(thread, "agent").with_user_message("book"))
                .await,
        );
        assert!(matches!(out, TerminationReason::Error { .. }));
    }

    let spawn = |worker: &str, crash: bool| {
        let mut cmd = std::process::Command::new(std::env::current_exe().expect("test binary"));
        cmd.args([
            "leases::lease_worker",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("AWAKEN_TEST_POSTGRES_URL", &url)
        .env("AWAKEN_LEASE_SCHEMA", &schema)
        .env("AWAKEN_LEASE_DIR", &dir)
        .env("AWAKEN_LEASE_WORKER", worker)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        if crash {
            // Dies after its first tool ran, before that result is committed: it holds the
            // run's lease, and the call is `Executing`.
            cmd.env("AWAKEN_CRASH_AT", "after_executing")
                .env("AWAKEN_CRASH_MARKER", &marker);
        }
        cmd.spawn().expect("worker started")
    };
    // The doomed worker claims a run and dies holding its lease, its call `Executing`.
    let doomed = spawn("doomed", true).wait().expect("doomed ended");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(doomed.signal(), Some(9), "the doomed worker was killed");
    assert_eq!(
        std::fs::read_to_string(&marker).expect("marker").trim(),
        "after_executing",
        "it died holding a run"
    );
    // Two workers then share the runs, racing for every claim; one of them takes the dead
    // worker's run over once its lease expired.
    let mut a = spawn("worker-a", false);
    let mut b = spawn("worker-b", false);
    let (a, b) = (a.wait().expect("a ended"), b.wait().expect("b ended"));
    assert!(
        a.success() && b.success(),
        "the workers finished: {a:?} {b:?}"
    );

    // Every run finished exactly once: one closing answer each, one run record, done.
    let mut outcome_unknown = 0;
    for i in 0..RUNS {
        let thread = ThreadId::new(format!("t{i:02}")).expect("id");
        let cp = store
            .load_checkpoint(&thread)
            .await
            .expect("load")
            .expect("thread");
        let runs = store.list_runs(&thread).await.expect("runs");
        assert_eq!(runs.len(), 1, "{thread}");
        assert_eq!(runs[0].status, RunStatus::Done, "{thread}");
        assert_eq!(
            runs[0].termination,
            Some(TerminationReason::NaturalEnd),
            "{thread}"
        );
        let roles: Vec<Role> = cp.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [Role::User, Role::Assistant, Role::Tool, Role::Assistant],
            "{thread}"
        );
        if cp.messages[2].text().contains("outcome unknown") {
            outcome_unknown += 1;
        }
    }
    // The dead worker's call ran once and was closed as outcome unknown, not re-run.
    assert_eq!(outcome_unknown, 1);
    let calls = std::fs::read_to_string(dir.join("calls.log")).expect("calls");
    let mut lines: Vec<&str> = calls.lines().collect();
    lines.sort_unstable();
    let before = lines.len();
    lines.dedup();
    assert_eq!(before, lines.len(), "no call ran twice: {calls}");
    assert_eq!(lines.len(), RUNS, "every run booked once: {calls}");
}

/// A runtime with a worker identity over `store`, whose agent asks for approval of `gate`
/// calls when `approval` is set.
pub(crate) fn worker_runtime(
    store: Arc<dyn ThreadStore>,
    worker: &str,
    gate: crate::lifecycle::Gate,
    approval: bool,
) -> AgentRuntime {
    let mut spec = AgentSpec::new("agent", "model");
    if approval {
        spec = spec
            .with_plugin(awaken_runtime::PERMISSION_PLUGIN)
            .with_section("permission", json!({"default": "ask"}));
    }
    AgentRuntime::builder()
        .with_ids(Arc::new(SystemIds::default()))
        .with_worker(worker, Duration::from_secs(30))
        .with_store(store)
        .with_model(ModelSpec::new("model", "p", "upstream"))
        .with_provider("p", Arc::new(GateModel))
        .with_tool(Arc::new(gate))
        .with_agent_spec(spec)
        .build()
        .expect("runtime")
}

/// One `gate` call, then a text.
struct GateModel;

impl awaken_llm::LlmExecutor for GateModel {
    fn name(&self) -> &str {
        "gate-model"
    }
    fn execute_stream(&self, request: awaken_llm::InferenceRequest) -> awaken_llm::LlmEventStream {
        let done = request.messages.iter().any(|m| m.role == Role::Tool);
        let turn = if done {
            ScriptTurn::text("done")
        } else {
            ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("gate", json!({})).with_id("c1"))
        };
        match ScriptedExecutor::from_turns(vec![turn]) {
            Ok(e) => e.execute_stream(request),
            Err(e) => unreachable!("a one-turn script is valid: {e}"),
        }
    }
}

pub(crate) fn notifies() -> (Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
    (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    )
}

/// A run of worker `live` on `store`, on thread `t`, held at its gate once this returns; the
/// gate's release and the run's task.
async fn held_at_its_gate(
    store: &Arc<dyn ThreadStore>,
) -> (
    Arc<tokio::sync::Notify>,
    tokio::task::JoinHandle<Result<awaken_runtime::RunOutcome, awaken_runtime::RunError>>,
) {
    let (entered, release) = notifies();
    let live = worker_runtime(
        store.clone(),
        "live",
        crate::lifecycle::Gate(entered.clone(), release.clone()),
        false,
    );
    let run = tokio::spawn(async move {
        live.run_to_completion(
            RunActivation::new(ThreadId::new("t").expect("id"), "agent").with_user_message("go"),
        )
        .await
    });
    entered.notified().await;
    (release, run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_run_holds_its_lease_so_recovery_elsewhere_leaves_it_alone() {
    let store: Arc<dyn ThreadStore> = Arc::new(awaken_store::MemoryStore::new());
    let (release, run) = held_at_its_gate(&store).await;
    let (e2, r2) = notifies();
    let other = worker_runtime(
        store.clone(),
        "other",
        crate::lifecycle::Gate(e2, r2),
        false,
    );
    let claimed = other
        .recover(&RecoverConfig::new("other"), &awaken_event::NullSink)
        .await
        .expect("recover");
    assert!(claimed.is_empty(), "the live run's lease is held");
    release.notify_one();
    let out = run.await.expect("joined").expect("run");
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
    assert!(
        other
            .recover(&RecoverConfig::new("other"), &awaken_event::NullSink)
            .await
            .expect("recover")
            .is_empty(),
        "a finished run is not recovered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_run_is_leased_from_its_first_commit() {
    // Another worker's recovery looks for runs right after each of the run's commits is
    // written, before the runtime goes on: it must never find the live run, the first commit
    // included (the run used to be created unleased and claimed just after).
    let memory: Arc<dyn ThreadStore> = Arc::new(awaken_store::MemoryStore::new());
    let found = Arc::new(std::sync::Mutex::new(Vec::new()));
    let store: Arc<dyn ThreadStore> = Arc::new(
        crate::support::Intercepted::new(memory.clone(), |_| Ok(())).after_commit({
            let (memory, found) = (memory.clone(), found.clone());
            move |commit| {
                let claimed = tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(memory.claim_runnable(
                        "other",
                        Duration::from_secs(30),
                        commit.run.updated_at,
                        10,
                    ))
                })
                .expect("claim");
                found
                    .lock()
                    .expect("lock")
                    .extend(claimed.into_iter().map(|c| c.run.run_id));
                Ok(())
            }
        }),
    );
    let out = open_gate_run(store).await.expect("run");
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
    assert_eq!(*found.lock().expect("lock"), []);
}

/// A run of worker `live` on `store`, on thread `t`, whose gate is open.
async fn open_gate_run(
    store: Arc<dyn ThreadStore>,
) -> Result<awaken_runtime::RunOutcome, awaken_runtime::RunError> {
    let (entered, release) = notifies();
    release.notify_one();
    worker_runtime(
        store,
        "live",
        crate::lifecycle::Gate(entered, release),
        false,
    )
    .run_to_completion(
        RunActivation::new(ThreadId::new("t").expect("id"), "agent").with_user_message("go"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_commit_written_but_answered_as_failed_gives_its_lease_up() {
    let memory: Arc<dyn ThreadStore> = Arc::new(awaken_store::MemoryStore::new());
    let store: Arc<dyn ThreadStore> = Arc::new(
        crate::support::Intercepted::new(memory.clone(), |_| Ok(())).after_commit(|_| {
            Err(awaken_store::StoreError::Task {
                detail: "the answer was lost".into(),
            }
            .into())
        }),
    );
    let out = open_gate_run(store).await;
    assert!(
        matches!(out, Err(awaken_runtime::RunError::Commit { .. })),
        "{out:?}"
    );
    // The run was written, leased: its lease was given up, so a recovery takes it at once.
    let now = awaken_store::Timestamp::now();
    let claimed = memory
        .claim_runnable("other", Duration::from_secs(30), now, 10)
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1, "{claimed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_lease_was_taken_over_says_so_at_its_end() {
    let store: Arc<dyn ThreadStore> = Arc::new(awaken_store::MemoryStore::new());
    let (release, run) = held_at_its_gate(&store).await;
    let thread = ThreadId::new("t").expect("id");
    // While its tool runs, another worker takes the run's lease over.
    let run_id = store.list_runs(&thread).await.expect("runs")[0]
        .run_id
        .clone();
    let token = awaken_store::LeaseToken {
        run_id: run_id.clone(),
        worker_id: "live".into(),
        epoch: 1,
    };
    assert!(store.release(&token).await.expect("release"));
    let now = awaken_store::Timestamp::now();
    let taken = store
        .claim_run(&run_id, "other", Duration::from_secs(30), now)
        .await
        .expect("claim");
    assert!(taken.is_some());
    release.notify_one();
    let out = run.await.expect("joined");
    assert!(
        matches!(&out, Err(awaken_runtime::RunError::TakenOver { run_id: r, .. }) if *r == run_id),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_never_resume_one_waiting_run() {
    let store: Arc<dyn ThreadStore> = Arc::new(awaken_store::MemoryStore::new());
    let thread = ThreadId::new("t").expect("id");
    let (entered, release) = notifies();
    let first = worker_runtime(
        store.clone(),
        "first",
        crate::lifecycle::Gate(entered.clone(), release.clone()),
        true,
    );
    let out = first
        .run_to_completion(RunActivation::new(thread.clone(), "agent").with_user_message("go"))
        .await
        .expect("run");
    assert_eq!(out.termination, TerminationReason::Suspended);
    let ticket = first.waiting_calls(&thread).await.expect("read").remove(0);
    let approve = || {
        awaken_runtime::Resume::new(thread.clone())
            .with_decision(awaken_event::ToolCallResume::approve(&ticket.call))
    };
    let resumed = {
        let first = first.clone();
        let request = approve();
        tokio::spawn(async move { first.resume_to_completion(request).await })
    };
    // The first resume is inside the approved tool, holding the run's lease.
    entered.notified().await;
    let (e2, r2) = notifies();
    let second = worker_runtime(
        store.clone(),
        "second",
        crate::lifecycle::Gate(e2, r2),
        true,
    );
    // Refused: the run is no longer waiting (or, had both read it waiting, its lease is held).
    let refused = second.resume_to_completion(approve()).await;
    assert!(
        matches!(
            refused,
            Err(awaken_runtime::RunError::TakenOver { .. }
                | awaken_runtime::RunError::NotWaiting { .. })
        ),
        "{refused:?}"
    );
    release.notify_one();
    let done = resumed.await.expect("joined").expect("resumed");
    assert_eq!(done.termination, TerminationReason::NaturalEnd);
}

#[tokio::test]
async fn a_resume_takes_the_lease_before_it_writes_anything() {
    let store: Arc<dyn ThreadStore> = Arc::new(awaken_store::MemoryStore::new());
    let thread = ThreadId::new("t").expect("id");
    let (entered, release) = notifies();
    let rt = worker_runtime(
        store.clone(),
        "w",
        crate::lifecycle::Gate(entered, release),
        true,
    );
    let out = rt
        .run_to_completion(RunActivation::new(thread.clone(), "agent").with_user_message("go"))
        .await
        .expect("run");
    assert_eq!(out.termination, TerminationReason::Suspended);
    let ticket = rt.waiting_calls(&thread).await.expect("read").remove(0);
    // Another process holds the waiting run's lease (it is resuming it).
    let squatter = store
        .claim_run(
            &out.run_id,
            "squatter",
            Duration::from_secs(60),
            awaken_store::Timestamp::from_unix_millis(i64::MAX / 2),
        )
        .await
        .expect("claim")
        .expect("free");
    let refused = rt
        .resume_to_completion(
            awaken_runtime::Resume::new(thread.clone())
                .with_decision(awaken_event::ToolCallResume::approve(&ticket.call)),
        )
        .await;
    assert!(
        matches!(refused, Err(awaken_runtime::RunError::TakenOver { .. })),
        "{refused:?}"
    );
    // Nothing was written: the run still waits on the same call.
    assert_eq!(rt.waiting_calls(&thread).await.expect("read"), [ticket]);
    assert!(store.release(&squatter.lease).await.expect("release"));
}
