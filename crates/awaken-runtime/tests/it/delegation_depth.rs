//! The delegation depth limit: two agents that delegate to each other, with a model that
//! delegates every task it is given, nest child runs down to the limit and no further; the
//! deepest run's call gets the limit as its error result and every level ends. The depth a
//! child run holds survives a crash and recovery, and a resume, of the nested child.

use std::sync::Arc;

use awaken_event::{AgentEvent, NullSink, Role, TerminationReason, ThreadId, ToolCallResume};
use awaken_event::{VecSink, check_activation};
use awaken_llm::{InferenceRequest, LlmEventStream, LlmExecutor};
use awaken_runtime::{
    AgentRuntime, AgentRuntimeBuilder, DEFAULT_MAX_DELEGATION_DEPTH, DelegationDepthKey,
    PERMISSION_PLUGIN, RecoverConfig, Resume, RunActivation, SequentialIds, SystemIds,
};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_state::StateKey;
use awaken_store::{MemoryStore, ThreadStore};
use serde_json::json;

use crate::support::{Intercepted, call_answer, text_answer};

/// A model that hands every task it is given to the first delegate it is offered, and answers
/// once that call's result is in. Decided from the request alone, so an inference repeated
/// after a crash gives the same answer.
struct AlwaysDelegates;

impl LlmExecutor for AlwaysDelegates {
    fn name(&self) -> &str {
        "always-delegates"
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let answered = request
            .messages
            .iter()
            .last()
            .is_some_and(|m| m.role == Role::Tool);
        let delegate = request.tools.iter().find(|t| t.id.starts_with("delegate_"));
        match delegate {
            Some(tool) if !answered => {
                call_answer("d", &tool.id, json!({"task": "take this on"}).to_string())
            }
            _ => text_answer("done"),
        }
    }
}

/// Agents `a` and `b`, each delegating to the other, on `store`; `a` asks before each
/// delegate call when `a_asks`.
fn builder(store: Arc<dyn ThreadStore>, a_asks: bool) -> AgentRuntimeBuilder {
    let mut a = AgentSpec::new("a", "model").with_delegate("b");
    if a_asks {
        a = a
            .with_plugin(PERMISSION_PLUGIN)
            .with_section("permission", json!({"default": "ask"}));
    }
    AgentRuntime::builder()
        .with_store(store)
        .with_model(ModelSpec::new("model", "always", "upstream"))
        .with_provider("always", Arc::new(AlwaysDelegates))
        .with_agent_spec(a)
        .with_agent_spec(AgentSpec::new("b", "model").with_delegate("a"))
}

fn root() -> ThreadId {
    ThreadId::new("t").expect("id")
}

/// One level of the chain of child runs under the root thread `t`: `t`, `t/d`, `t/d/d`, ...
struct Level {
    thread: ThreadId,
    line: String,
    events: Vec<AgentEvent>,
    /// The result of the level's delegate call, as its model saw it (`none` before it has one).
    result: String,
}

/// Every level of the chain, from the root down to the first thread that does not exist; each
/// level must hold one run, whose parent is the level above's run.
async fn chain(store: &dyn ThreadStore) -> Vec<Level> {
    let mut levels: Vec<Level> = Vec::new();
    let mut thread = root();
    let mut parent = None;
    while let Some(checkpoint) = store.load_checkpoint(&thread).await.expect("read") {
        let runs = store.list_runs(&thread).await.expect("runs");
        assert_eq!(runs.len(), 1, "one run on {thread}");
        let run = &runs[0];
        assert_eq!(run.parent_run_id, parent, "the parent of {thread}'s run");
        let depth = checkpoint
            .run_state
            .values
            .get(DelegationDepthKey::KEY)
            .map_or_else(|| "-".to_owned(), ToString::to_string);
        let termination = run
            .termination
            .as_ref()
            .map_or_else(|| "-".to_owned(), ToString::to_string);
        let events: Vec<AgentEvent> = store
            .load_events(&thread, 0)
            .await
            .expect("events")
            .into_iter()
            .map(|e| e.event)
            .collect();
        let result = checkpoint
            .messages
            .iter()
            .find(|m| m.role == Role::Tool)
            .map_or_else(|| "none".to_owned(), result_text);
        levels.push(Level {
            line: format!(
                "{thread}: agent {} {} {termination}, stored depth {depth}",
                run.agent_id, run.status
            ),
            thread: thread.clone(),
            events,
            result,
        });
        parent = Some(run.run_id.clone());
        thread = ThreadId::new(format!("{thread}/d")).expect("id");
    }
    levels
}

/// A tool result as the model reads it: its text, or its JSON value.
fn result_text(message: &awaken_event::Message) -> String {
    let text = message.text();
    if !text.is_empty() {
        return text;
    }
    serde_json::to_value(&message.content).expect("json")[0]["value"].to_string()
}

/// The chain as text: a line per level, then the deepest level's result.
fn render(levels: &[Level]) -> String {
    let mut out: Vec<String> = levels.iter().map(|l| l.line.clone()).collect();
    if let Some(deepest) = levels.last() {
        out.push(format!("deepest result: {}", deepest.result));
    }
    out.join("\n")
}

/// Runs `a` on `t` to its end with events checked, and the chain it left: every level's stored
/// events are one well-formed activation with one `RunFinish`, and every level above the
/// deepest got its child's answer.
async fn run_chain(limit: Option<u32>) -> Vec<Level> {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    let mut builder = builder(store.clone(), false).with_ids(Arc::new(SequentialIds::default()));
    if let Some(limit) = limit {
        builder = builder.with_max_delegation_depth(limit);
    }
    let rt = builder.build().expect("a cycle is a warning, not an error");
    let sink = VecSink::new();
    let out = rt
        .run(
            RunActivation::new(root(), "a").with_user_message("start"),
            &sink,
        )
        .await
        .expect("run");
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
    assert_eq!(out.response.as_deref(), Some("done"));
    let streamed = sink.events();
    check_activation(&streamed).expect("the root's stream follows the event grammar");
    let levels = chain(&*store).await;
    for (depth, level) in levels.iter().enumerate() {
        check_activation(&level.events)
            .unwrap_or_else(|v| panic!("{}: event grammar violated: {v}", level.thread));
        let finishes = level
            .events
            .iter()
            .filter(|e| matches!(e, AgentEvent::RunFinish { .. }))
            .count();
        assert_eq!(finishes, 1, "{}", level.thread);
        if depth + 1 < levels.len() {
            let child = if depth % 2 == 0 { "b" } else { "a" };
            assert_eq!(
                level.result,
                json!({"agent": child, "answer": "done"}).to_string(),
                "{}",
                level.thread
            );
        }
    }
    levels
}

#[tokio::test]
async fn a_cycle_of_always_delegating_agents_ends_at_the_configured_limit() {
    let levels = run_chain(Some(2)).await;
    expect_test::expect![[r#"
        t: agent a done natural_end, stored depth -
        t/d: agent b done natural_end, stored depth 1
        t/d/d: agent a done natural_end, stored depth 2
        deepest result: error: delegation depth limit 2 reached: this run is at depth 2 (its root run is at depth 0), so `b` was not started; do the task without delegating"#]]
    .assert_eq(&render(&levels));
    // The events of one level, as stored with its thread.
    let names: Vec<&str> = levels[2].events.iter().map(AgentEvent::type_name).collect();
    expect_test::expect![[r#"
        run_start step_start tool_call_start inference_complete tool_call_ready tool_call_done step_end step_start inference_complete step_end run_finish"#]]
    .assert_eq(&names.join(" "));
}

#[tokio::test]
async fn the_default_limit_nests_four_child_runs() {
    assert_eq!(DEFAULT_MAX_DELEGATION_DEPTH, 4);
    let levels = run_chain(None).await;
    expect_test::expect![[r#"
        t: agent a done natural_end, stored depth -
        t/d: agent b done natural_end, stored depth 1
        t/d/d: agent a done natural_end, stored depth 2
        t/d/d/d: agent b done natural_end, stored depth 3
        t/d/d/d/d: agent a done natural_end, stored depth 4
        deepest result: error: delegation depth limit 4 reached: this run is at depth 4 (its root run is at depth 0), so `b` was not started; do the task without delegating"#]]
    .assert_eq(&render(&levels));
}

#[tokio::test]
async fn a_limit_of_zero_starts_no_child_at_all() {
    let levels = run_chain(Some(0)).await;
    expect_test::expect![[r#"
        t: agent a done natural_end, stored depth -
        deepest result: error: delegation depth limit 0 reached: this run is at depth 0 (its root run is at depth 0), so `b` was not started; do the task without delegating"#]]
    .assert_eq(&render(&levels));
}

#[tokio::test]
async fn a_nested_child_recovered_after_a_crash_keeps_its_depth() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    // Commits: the root's start, its call requested and executing (3), the same for the first
    // child (6), the second child's start and its call requested (8); then the process dies.
    let dying = builder(Arc::new(Intercepted::dies_after(store.clone(), 8)), false)
        .with_ids(Arc::new(SystemIds::default()))
        .with_max_delegation_depth(2)
        .build()
        .expect("runtime");
    let first = crate::support::unwritten_end(
        dying
            .run_to_completion(RunActivation::new(root(), "a").with_user_message("start"))
            .await,
    );
    assert!(
        matches!(first, TerminationReason::Error { .. }),
        "{first:?}"
    );
    expect_test::expect![[r#"
        t: agent a running -, stored depth -
        t/d: agent b running -, stored depth 1
        t/d/d: agent a running -, stored depth 2
        deepest result: none"#]]
    .assert_eq(&render(&chain(&*store).await));

    let fresh = builder(store.clone(), false)
        .with_ids(Arc::new(SystemIds::default()))
        .with_max_delegation_depth(2)
        .build()
        .expect("runtime");
    let recovered = fresh
        .recover(&RecoverConfig::new("w"), &NullSink)
        .await
        .expect("recover");
    assert_eq!(
        recovered.len(),
        1,
        "the root; its children go on through it"
    );
    let out = recovered
        .into_iter()
        .next()
        .and_then(|r| r.outcome.ok())
        .expect("recovered");
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
    // The second child read its depth back from its stored state: its call is refused, and
    // no third child is started.
    expect_test::expect![[r#"
        t: agent a done natural_end, stored depth -
        t/d: agent b done natural_end, stored depth 1
        t/d/d: agent a done natural_end, stored depth 2
        deepest result: error: delegation depth limit 2 reached: this run is at depth 2 (its root run is at depth 0), so `b` was not started; do the task without delegating"#]]
    .assert_eq(&render(&chain(&*store).await));
}

#[tokio::test]
async fn a_nested_child_resumed_after_a_decision_keeps_its_depth() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    let rt = builder(store.clone(), true)
        .with_ids(Arc::new(SequentialIds::default()))
        .with_max_delegation_depth(2)
        .build()
        .expect("runtime");
    let asked = rt
        .run_to_completion(RunActivation::new(root(), "a").with_user_message("start"))
        .await
        .expect("run");
    assert_eq!(asked.termination, TerminationReason::Suspended);
    // The root's own call asks first; approved, the child `b` delegates to `a` at depth 2,
    // whose call asks in turn, through its parents.
    let approve = |rt: AgentRuntime| async move {
        let tickets = rt.waiting_calls(&root()).await.expect("read");
        assert_eq!(tickets.len(), 1);
        rt.resume_to_completion(
            Resume::new(root()).with_decision(ToolCallResume::approve(&tickets[0].call)),
        )
        .await
        .expect("resumed")
    };
    let nested = approve(rt.clone()).await;
    assert_eq!(nested.termination, TerminationReason::Suspended);
    expect_test::expect![[r#"
        t: agent a waiting suspended, stored depth -
        t/d: agent b waiting suspended, stored depth 1
        t/d/d: agent a waiting suspended, stored depth 2
        deepest result: none"#]]
    .assert_eq(&render(&chain(&*store).await));
    // The decision reaches the run at depth 2, resumed from its stored state: its call is past
    // the limit.
    let done = approve(rt.clone()).await;
    assert_eq!(done.termination, TerminationReason::NaturalEnd);
    expect_test::expect![[r#"
        t: agent a done natural_end, stored depth -
        t/d: agent b done natural_end, stored depth 1
        t/d/d: agent a done natural_end, stored depth 2
        deepest result: error: delegation depth limit 2 reached: this run is at depth 2 (its root run is at depth 0), so `b` was not started; do the task without delegating"#]]
    .assert_eq(&render(&chain(&*store).await));
}
