//! A run interrupted at each of its commits (the store stops accepting writes there, as if
//! the process had died) and recovered by a fresh runtime (`recover`, or `take_over` of its
//! thread once the dead worker's lease expired) ends in the history and statistics of an
//! uninterrupted run — on the memory store and on SQLite.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use awaken_event::{Message, Role, TerminationReason, ThreadId, VecSink, check_activation};
use awaken_llm::{InferenceRequest, LlmEventStream, LlmExecutor};
use awaken_runtime::{
    AgentRuntime, RecoverConfig, RunActivation, RunOutcome, RunStatsKey, SequentialIds, Takeover,
};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_state::StateKey;
use awaken_store::{MemoryStore, RunRecord, SqliteConfig, SqliteStore, ThreadStore, Timestamp};

use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};

use crate::support::{Intercepted, call_answer, text_answer};

/// `echo`, declared `ReadOnly`: a call interrupted while executing is re-run, so the
/// recovered history equals the uninterrupted one at every boundary (a side-effecting call
/// is closed as outcome unknown instead: `crash.rs`).
struct Echo;

#[async_trait]
impl Tool for Echo {
    fn descriptor(&self) -> awaken_event::ToolDescriptor {
        awaken_event::ToolDescriptor::new("echo", "Echo text")
            .with_effect(awaken_event::EffectClass::ReadOnly)
    }
    async fn execute(
        &self,
        args: &serde_json::Value,
        _ctx: &ToolCallContext,
    ) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::success(
            serde_json::json!({"echoed": args["text"]}),
        ))
    }
}

/// Answers from the history alone (so a repeated inference gives the same answer): an `echo`
/// call until two results are in, then a text.
struct HistoryModel;

impl LlmExecutor for HistoryModel {
    fn name(&self) -> &str {
        "history-model"
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let results = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .count();
        if results < 2 {
            call_answer(
                &format!("c{results}"),
                "echo",
                format!("{{\"text\":\"n{results}\"}}"),
            )
        } else {
            text_answer("done")
        }
    }
}

pub(crate) fn runtime(store: Arc<dyn ThreadStore>) -> AgentRuntime {
    runtime_with(store, Arc::new(Echo))
}

fn runtime_with(store: Arc<dyn ThreadStore>, echo: Arc<dyn Tool>) -> AgentRuntime {
    AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_store(store)
        .with_model(ModelSpec::new("model", "history", "upstream"))
        .with_provider("history", Arc::new(HistoryModel))
        .with_tool(echo)
        .with_agent_spec(AgentSpec::new("agent", "model"))
        .build()
        .expect("runtime")
}

/// `echo` after an upgrade: its arguments now need a `count`.
struct StricterEcho;

#[async_trait]
impl Tool for StricterEcho {
    fn descriptor(&self) -> awaken_event::ToolDescriptor {
        Echo.descriptor().with_parameters(serde_json::json!({
            "type": "object",
            "properties": {"text": {"type": "string"}, "count": {"type": "integer"}},
            "required": ["text", "count"]
        }))
    }
    async fn execute(
        &self,
        _args: &serde_json::Value,
        _ctx: &ToolCallContext,
    ) -> Result<ToolOutput, ToolError> {
        panic!("never called with arguments its schema refuses")
    }
}

#[tokio::test]
async fn a_recovered_re_run_validates_its_arguments_against_the_tools_schema_of_now() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    // The first process stores `c0` as executing (start, requested, executing), then dies.
    let dying = Arc::new(Intercepted::dies_after(store.clone(), 3));
    crate::support::unwritten_end(
        runtime(dying)
            .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("go"))
            .await,
    );
    let recovered = runtime_with(store.clone(), Arc::new(StricterEcho))
        .recover(&RecoverConfig::new("w2"), &awaken_event::NullSink)
        .await
        .expect("recover");
    assert_eq!(recovered.len(), 1);
    let rendered = render(store.as_ref()).await;
    let c0 = rendered
        .lines()
        .find(|l| l.starts_with("tool c0"))
        .unwrap_or_else(|| panic!("c0 closed:\n{rendered}"));
    assert!(
        c0.contains("count"),
        "the re-run was refused by the schema: {c0}"
    );
}

pub(crate) fn thread() -> ThreadId {
    ThreadId::new("t").expect("id")
}

/// The thread as text: messages, the last run's status and steps, and its run statistics.
async fn render(store: &dyn ThreadStore) -> String {
    let cp = store
        .load_checkpoint(&thread())
        .await
        .expect("load")
        .expect("stored");
    let mut out: Vec<String> = cp.messages.iter().map(message).collect();
    let run = cp.run.expect("a run");
    out.push(format!(
        "run {} {:?} steps={} termination={:?}",
        run.run_id, run.status, run.steps, run.termination
    ));
    out.push(format!(
        "stats {}",
        cp.run_state.values[<RunStatsKey as StateKey>::KEY]
    ));
    out.join("\n")
}

fn message(m: &Message) -> String {
    match m.role {
        Role::Tool => format!(
            "tool {} {}",
            m.tool_call_id.as_ref().map_or("-", |c| c.as_str()),
            serde_json::to_string(&m.content).expect("json")
        ),
        Role::Assistant if !m.tool_calls.is_empty() => {
            format!("assistant calls {}", m.tool_calls[0].id)
        }
        _ => format!("{:?} {}", m.role, m.text()),
    }
}

/// `store`, counting the commits made through it.
fn counting(store: Arc<dyn ThreadStore>) -> (Arc<Intercepted>, Arc<AtomicUsize>) {
    let commits = Arc::new(AtomicUsize::new(0));
    let count = commits.clone();
    let counting = Intercepted::new(store, move |_| {
        count.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    (Arc::new(counting), commits)
}

/// How a fresh runtime continues the run a dead process left unfinished.
#[derive(Clone, Copy)]
enum Continuation {
    /// `recover`, claiming every unfinished run.
    Recover,
    /// `take_over` of the run's thread, once the dead process's lease on the run expired.
    TakeOver,
}

/// Continues the one unfinished run of `store` through a fresh runtime, `via` either way, and
/// returns its outcome; `at` names the interruption in failure messages.
async fn continue_run(store: &Arc<dyn ThreadStore>, via: Continuation, at: &str) -> RunOutcome {
    let rt = runtime(store.clone());
    match via {
        Continuation::Recover => {
            let recovered = rt
                .recover(&RecoverConfig::new("w2"), &awaken_event::NullSink)
                .await
                .expect("recover");
            assert_eq!(recovered.len(), 1, "{at}");
            let run = recovered.into_iter().next().expect("one");
            run.outcome.expect("recovered")
        }
        Continuation::TakeOver => {
            let run = dead_lease_expired(store.as_ref()).await;
            let sink = VecSink::new();
            let taken = rt
                .take_over(&thread(), &RecoverConfig::new("w2"), &sink)
                .await
                .expect("take over");
            let Takeover::Recovered(recovered) = taken else {
                panic!("{at}: not taken over: {taken:?}");
            };
            assert_eq!(recovered.run_id, run.run_id, "{at}");
            if let Err(v) = check_activation(&sink.events()) {
                panic!("{at}: the continuation's events: {v}");
            }
            recovered.outcome.expect("taken over")
        }
    }
}

/// The thread's unfinished run, once a dead process's lease on it (claimed before the
/// runtime's clock began) has expired.
pub(crate) async fn dead_lease_expired(store: &dyn ThreadStore) -> RunRecord {
    let run = store
        .load_checkpoint(&thread())
        .await
        .expect("load")
        .and_then(|c| c.run)
        .expect("the run");
    store
        .claim_run(
            &run.run_id,
            "dead",
            std::time::Duration::from_secs(30),
            Timestamp::from_unix_millis(-60_000),
        )
        .await
        .expect("claim")
        .expect("the dead process's lease");
    run
}

/// `immediate`: the dying store writes through the runtime's immediate path (`commit_now`), not
/// the awaited one. `via`: how the fresh runtime continues the run.
async fn matrix(fresh: impl AsyncFn() -> Arc<dyn ThreadStore>, immediate: bool, via: Continuation) {
    // The uninterrupted run, and how many commits it makes.
    let store = fresh().await;
    let (counting, commits) = counting(store.clone());
    let out = runtime(counting.clone())
        .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("go"))
        .await
        .expect("run");
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
    let expected = render(store.as_ref()).await;
    let commits = commits.load(Ordering::SeqCst);
    assert!(
        commits >= 8,
        "start, 2 × (requested, executing, result, step end), last step, end: {commits}"
    );

    for alive in 1..commits {
        let store = fresh().await;
        let dying = Intercepted::dies_after(store.clone(), alive);
        let dying = Arc::new(if immediate { dying.immediate() } else { dying });
        // The first process: its writes stop after `alive` commits. Its events still make
        // one well-formed activation (the events held back for a failed commit are emitted).
        let sink = VecSink::new();
        let first = crate::support::unwritten_end(
            runtime(dying)
                .run(
                    RunActivation::new(thread(), "agent").with_user_message("go"),
                    &sink,
                )
                .await,
        );
        if let Err(v) = check_activation(&sink.events()) {
            panic!("after {alive} commits: {v}");
        }
        // It fails where its next commit fails; when only the last commit is lost it has
        // already decided how it ends. Either way it says its end was not written, and the
        // store still holds it running.
        let expected_end = if alive + 1 < commits {
            matches!(first, TerminationReason::Error { .. })
        } else {
            first == TerminationReason::NaturalEnd
        };
        assert!(expected_end, "after {alive} commits: {first:?}");
        // A fresh runtime continues the run.
        let outcome = continue_run(&store, via, &format!("after {alive} commits")).await;
        assert_eq!(
            outcome.termination,
            TerminationReason::NaturalEnd,
            "after {alive} commits"
        );
        assert_eq!(
            outcome.response.as_deref(),
            Some("done"),
            "after {alive} commits"
        );
        assert_eq!(
            render(store.as_ref()).await,
            expected,
            "interrupted after {alive} of {commits} commits"
        );
    }
}

#[tokio::test]
async fn recovery_from_each_commit_matches_the_uninterrupted_run_on_memory() {
    // Through the awaited path, then the immediate one (`commit_now`).
    for immediate in [false, true] {
        matrix(
            async || Arc::new(MemoryStore::new()) as Arc<dyn ThreadStore>,
            immediate,
            Continuation::Recover,
        )
        .await;
    }
}

#[tokio::test]
async fn take_over_from_each_commit_matches_the_uninterrupted_run_on_memory() {
    matrix(
        async || Arc::new(MemoryStore::new()) as Arc<dyn ThreadStore>,
        false,
        Continuation::TakeOver,
    )
    .await;
}

/// [`matrix`] on a fresh SQLite database file for each run, in a directory named `name`.
async fn sqlite_matrix(name: &str, via: Continuation) {
    let dir = crate::support::fresh_dir(name);
    let n = AtomicUsize::new(0);
    matrix(
        async || {
            let path = dir.join(format!("r{}.db", n.fetch_add(1, Ordering::SeqCst)));
            let _ = std::fs::remove_file(&path);
            Arc::new(
                SqliteStore::open(SqliteConfig::file(&path))
                    .await
                    .expect("sqlite"),
            ) as Arc<dyn ThreadStore>
        },
        false,
        via,
    )
    .await;
}

#[tokio::test]
async fn recovery_from_each_commit_matches_the_uninterrupted_run_on_sqlite() {
    sqlite_matrix("recovery-matrix", Continuation::Recover).await;
}

#[tokio::test]
async fn take_over_from_each_commit_matches_the_uninterrupted_run_on_sqlite() {
    sqlite_matrix("take-over-matrix", Continuation::TakeOver).await;
}

#[tokio::test]
async fn recovery_leaves_other_agents_runs_and_starts_nothing_once_cancelled() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    let dying: Arc<dyn ThreadStore> = Arc::new(Intercepted::dies_after(store.clone(), 1));
    crate::support::unwritten_end(
        runtime(dying)
            .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("go"))
            .await,
    );
    let rt = runtime(store.clone());
    let other = rt
        .recover(
            &RecoverConfig::new("w").with_agents(["someone-else"]),
            &awaken_event::NullSink,
        )
        .await
        .expect("recover");
    assert!(other.is_empty(), "not this worker's agent");
    let cancelled = awaken_event::CancellationToken::new();
    cancelled.cancel();
    let none = rt
        .recover(
            &RecoverConfig::new("w").with_cancel(cancelled),
            &awaken_event::NullSink,
        )
        .await
        .expect("recover");
    assert!(none.is_empty(), "a cancelled recovery starts nothing");
    // Both released the lease at once: the run is still there to recover.
    let done = rt
        .recover(
            &RecoverConfig::new("w").with_agents(["agent"]),
            &awaken_event::NullSink,
        )
        .await
        .expect("recover");
    assert_eq!(done.len(), 1);
    assert_eq!(
        done.into_iter()
            .next()
            .expect("one")
            .outcome
            .expect("ok")
            .termination,
        TerminationReason::NaturalEnd
    );
}

/// [`HistoryModel`], counting the requests it gets.
struct CountingModel(Arc<AtomicUsize>);

impl LlmExecutor for CountingModel {
    fn name(&self) -> &str {
        "counting-model"
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        self.0.fetch_add(1, Ordering::SeqCst);
        HistoryModel.execute_stream(request)
    }
}

fn stop_on_echo(store: Arc<dyn ThreadStore>, requests: Arc<AtomicUsize>) -> AgentRuntime {
    AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_store(store)
        .with_model(ModelSpec::new("model", "history", "upstream"))
        .with_provider("history", Arc::new(CountingModel(requests)))
        .with_tool(Arc::new(Echo))
        .with_agent_spec(AgentSpec::new("agent", "model").with_stop_condition(
            awaken_spec::StopConditionSpec::StopOnTool {
                tool: "echo".into(),
            },
        ))
        .build()
        .expect("runtime")
}

/// A run that stopped on a tool and lost only its last commit (its end) is ended the same way
/// by recovery, without asking the model again: the step count keeps the ended step's tools.
#[tokio::test]
async fn a_run_stopped_on_a_tool_is_still_stopped_after_losing_its_last_commit() {
    let stopped = TerminationReason::stopped("stop_tool", "tool `echo` ran");
    // Uninterrupted: one step, then the stop; count its commits.
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    let (counting, commits) = counting(store.clone());
    let requests = Arc::new(AtomicUsize::new(0));
    let out = stop_on_echo(counting, requests.clone())
        .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("go"))
        .await
        .expect("run");
    assert_eq!(out.termination, stopped);
    assert_eq!(requests.load(Ordering::SeqCst), 1);
    let expected = render(store.as_ref()).await;
    let commits = commits.load(Ordering::SeqCst);

    // The same run, its last commit lost.
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    let dying = Arc::new(Intercepted::dies_after(store.clone(), commits - 1));
    let requests = Arc::new(AtomicUsize::new(0));
    let ended = crate::support::unwritten_end(
        stop_on_echo(dying, requests.clone())
            .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("go"))
            .await,
    );
    assert_eq!(ended, stopped, "it says how it ended");
    let recovered = stop_on_echo(store.clone(), requests.clone())
        .recover(&RecoverConfig::new("w2"), &awaken_event::NullSink)
        .await
        .expect("recover");
    let outcome = recovered
        .into_iter()
        .next()
        .expect("one recovered run")
        .outcome
        .expect("recovered");
    assert_eq!(outcome.termination, stopped);
    assert_eq!(
        requests.load(Ordering::SeqCst),
        1,
        "the model is not asked again"
    );
    assert_eq!(render(store.as_ref()).await, expected);
}
