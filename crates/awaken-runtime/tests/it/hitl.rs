//! HITL: suspend, then resume in a fresh runtime on the same store; partial decisions,
//! refused decisions, deny, approval asked once, supersede, history repair.

use std::sync::Arc;

use awaken_event::{
    Message, ResumeMode, Role, SuspendTicket, TerminationReason, ThreadId, ToolCallResume, VecSink,
    check_activation,
};
use awaken_llm::{ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken_phase::PhaseContext;
use awaken_plugin::{FnGate, Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_runtime::{
    AgentRuntime, DecisionError, Resume, RunActivation, RunError, RunOutcome, SequentialIds,
};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_store::{SqliteConfig, SqliteStore, ThreadStore};
use awaken_tool::{ToolInterceptPayload, pending_call};
use serde_json::json;

use crate::support::*;

/// Asks a human before every `echo` call, unless the call carries an approval: counts how
/// often it asked.
struct Approval {
    manifest: PluginManifest,
    asked: Log,
}

impl Plugin for Approval {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        let asked = self.asked.clone();
        r.register_tool_gate_hook(
            "ask",
            Arc::new(FnGate(move |ctx: &PhaseContext| {
                let tool = ctx.tool.as_ref().expect("a tool phase");
                if tool.call.name != "echo" || tool.resume.is_some() {
                    return Ok(None);
                }
                asked.push(tool.call.id.to_string());
                Ok(Some(ToolInterceptPayload::Suspend(SuspendTicket {
                    suspension_id: format!("ask-{}", tool.call.id),
                    call: pending_call(&tool.call),
                    message: format!("Run echo with {}?", tool.call.arguments),
                    response_schema: None,
                    resume_mode: ResumeMode::Replay,
                })))
            })),
        )
    }
}

struct Process {
    runtime: AgentRuntime,
    executor: Arc<ScriptedExecutor>,
    asked: Log,
}

/// One "process": a fresh runtime over `store` with its own script.
fn process(store: Arc<dyn ThreadStore>, turns: Vec<ScriptTurn>, max_rounds: u32) -> Process {
    let executor = Arc::new(ScriptedExecutor::from_turns(turns).expect("script"));
    let asked = Log::default();
    let runtime = AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_store(store)
        .with_model(ModelSpec::new("model", "scripted", "upstream"))
        .with_provider("scripted", executor.clone())
        .with_tool(Arc::new(Echo))
        .with_plugin(Arc::new(Approval {
            manifest: PluginManifest::new("approval"),
            asked: asked.clone(),
        }))
        .with_agent_spec(
            AgentSpec::new("agent", "model")
                .with_plugin("approval")
                .with_max_rounds(max_rounds),
        )
        .build()
        .expect("runtime");
    Process {
        runtime,
        executor,
        asked,
    }
}

/// A SQLite store in a fresh folder of its own, removed when the returned guard is dropped
/// (bound first, it is dropped after the store).
async fn sqlite(name: &str) -> (TestDir, Arc<dyn ThreadStore>) {
    let dir = fresh_dir(&format!("hitl-{name}"));
    let store = Arc::new(
        SqliteStore::open(SqliteConfig::file(dir.join("threads.db")))
            .await
            .expect("sqlite"),
    );
    (dir, store)
}

fn thread() -> ThreadId {
    ThreadId::new("t").expect("id")
}

fn two_echoes() -> ScriptTurn {
    ScriptTurn::text("")
        .with_tool_call(ScriptToolCall::new("echo", json!({"text": "a"})).with_id("c1"))
        .with_tool_call(ScriptToolCall::new("echo", json!({"text": "b"})).with_id("c2"))
}

async fn resume(
    p: &Process,
    decisions: Vec<ToolCallResume>,
) -> (Result<RunOutcome, RunError>, String) {
    let mut request = Resume::new(thread());
    for d in decisions {
        request = request.with_decision(d);
    }
    let sink = VecSink::new();
    let outcome = p.runtime.resume(request, &sink).await;
    let events = sink.events();
    if outcome.is_ok()
        && let Err(v) = check_activation(&events)
    {
        panic!("event grammar violated: {v}\n{}", render(&events));
    }
    (outcome, render(&events))
}

async fn start(p: &Process) -> RunOutcome {
    p.runtime
        .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("hi"))
        .await
        .expect("run")
}

fn roles(messages: &[Message]) -> String {
    messages
        .iter()
        .map(|m| match m.role {
            Role::Tool if m.text().is_empty() => {
                format!("tool {}", serde_json::to_string(&m.content).expect("json"))
            }
            Role::Tool => format!("tool {}", m.text()),
            other => format!("{other:?}").to_lowercase(),
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

#[tokio::test]
async fn resume_in_a_fresh_runtime_on_the_same_sqlite_store() {
    let (_dir, store) = sqlite("fresh").await;
    let first = process(store.clone(), vec![two_echoes()], 25);
    let out = start(&first).await;
    assert_eq!(out.termination, TerminationReason::Suspended);
    assert_eq!(first.asked.lines(), ["c1", "c2"]);
    let tickets = first.runtime.waiting_calls(&thread()).await.expect("read");
    assert_eq!(tickets.len(), 2);

    // Another process: approve the first call only. The run keeps waiting for the second.
    let second = process(store.clone(), vec![ScriptTurn::text("both done")], 25);
    let (partial, events) = resume(&second, vec![ToolCallResume::approve(&tickets[0].call)]).await;
    let partial = partial.expect("accepted");
    assert_eq!(partial.termination, TerminationReason::Suspended);
    expect_test::expect![[r#"
        run_start run-1 resumed=true
        run_finish suspended response=None tokens=0
    "#]]
    .assert_eq(&events);
    assert!(second.executor.requests().is_empty());
    // Only the undecided call still waits.
    let still = second.runtime.waiting_calls(&thread()).await.expect("read");
    assert_eq!(still, [tickets[1].clone()]);

    // A third process: deny the second. Both calls are processed, the run goes on and ends.
    let third = process(store.clone(), vec![ScriptTurn::text("both done")], 25);
    let (done, events) = resume(
        &third,
        vec![ToolCallResume::deny(&tickets[1].call).with_payload(json!("not b"))],
    )
    .await;
    let done = done.expect("resumed");
    assert_eq!(done.termination, TerminationReason::NaturalEnd);
    expect_test::expect![[r#"
        run_start run-1 resumed=true
        step_start 2
        tool_call_resumed
        call_ready c1 {"text":"a"}
        call_done c1 succeeded {"echoed":"a"}
        tool_call_resumed
        call_ready c2 {"text":"b"}
        call_done c2 cancelled "denied by the user: not b"
        step_end 2
        step_start 3
        text "both done"
        inference upstream
        step_end 3
        run_finish natural_end response=Some("both done") tokens=0
    "#]]
    .assert_eq(&events);
    // The approved call was not asked again; the model saw both outcomes, paired.
    assert!(third.asked.lines().is_empty());
    let requests = third.executor.requests();
    assert_eq!(requests.len(), 1);
    expect_test::expect![[r#"user | assistant | tool [{"type":"json","value":{"echoed":"a"}}] | tool error: denied by the user: not b"#]]
        .assert_eq(&roles(&requests[0].messages));
    // The thread is no longer waiting: a new run is accepted.
    assert!(
        third
            .runtime
            .waiting_calls(&thread())
            .await
            .expect("read")
            .is_empty()
    );
}

#[tokio::test]
async fn refused_decisions_apply_nothing() {
    let (_dir, store) = sqlite("refused").await;
    let p = process(
        store.clone(),
        vec![two_echoes(), ScriptTurn::text("ok")],
        25,
    );
    start(&p).await;
    let tickets = p.runtime.waiting_calls(&thread()).await.expect("read");
    // Approved on other arguments than the ones shown.
    let mut other = pending_call(&awaken_event::ToolCall::new(
        tickets[0].call.call_id.clone(),
        "echo",
        json!({"text": "rm -rf"}),
    ));
    other.call_id = tickets[0].call.call_id.clone();
    let (refused, _) = resume(
        &p,
        vec![
            ToolCallResume::approve(&tickets[1].call),
            ToolCallResume::approve(&other),
        ],
    )
    .await;
    let Err(RunError::Decision { source, .. }) = refused else {
        panic!("refused: {refused:?}")
    };
    assert!(
        matches!(source, DecisionError::ArgumentsDiffer { .. }),
        "{source}"
    );
    // An unknown call.
    let mut unknown = tickets[0].call.clone();
    unknown.call_id = awaken_event::ToolCallId::new("nope").expect("id");
    let (refused, _) = resume(&p, vec![ToolCallResume::approve(&unknown)]).await;
    let Err(RunError::Decision { source, .. }) = refused else {
        panic!("refused: {refused:?}")
    };
    assert_eq!(
        source.to_string(),
        "call nope is not waiting for a decision (waiting: [ToolCallId(\"c1\"), ToolCallId(\"c2\")])"
    );
    // Twice the same call in one request.
    let (refused, _) = resume(
        &p,
        vec![
            ToolCallResume::approve(&tickets[0].call),
            ToolCallResume::deny(&tickets[0].call),
        ],
    )
    .await;
    assert!(matches!(
        refused,
        Err(RunError::Decision {
            source: DecisionError::Duplicate { .. },
            ..
        })
    ));
    // Nothing of the refused requests was applied: both calls still wait, and the valid
    // decisions then finish the run.
    assert_eq!(
        p.runtime
            .waiting_calls(&thread())
            .await
            .expect("read")
            .len(),
        2
    );
    let (done, _) = resume(
        &p,
        vec![
            ToolCallResume::approve(&tickets[0].call),
            ToolCallResume::approve(&tickets[1].call),
        ],
    )
    .await;
    assert_eq!(
        done.expect("resumed").termination,
        TerminationReason::NaturalEnd
    );
    // Resuming a thread that waits for nothing is refused.
    let (again, _) = resume(&p, Vec::new()).await;
    assert!(
        matches!(again, Err(RunError::NotWaiting { .. })),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_new_message_on_a_waiting_thread_is_refused_unless_it_supersedes() {
    let (_dir, store) = sqlite("supersede").await;
    let p = process(
        store.clone(),
        vec![two_echoes(), ScriptTurn::text("fresh start")],
        25,
    );
    start(&p).await;
    let refused = p
        .runtime
        .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("other"))
        .await
        .expect_err("waiting");
    assert_eq!(
        refused.to_string(),
        "thread `t` is waiting: run `run-1` has suspended tool calls that need a decision: c1, c2"
    );
    let sink = VecSink::new();
    let out = p
        .runtime
        .run(
            RunActivation::new(thread(), "agent")
                .with_user_message("other")
                .with_supersede(),
            &sink,
        )
        .await
        .expect("superseded");
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
    assert!(render(&sink.events()).contains("warning Other: superseded the waiting calls c1, c2"));
    let history = p.runtime.history(&thread()).await.expect("history");
    expect_test::expect![[r#"user | assistant | tool error: not executed: superseded by a new message | tool error: not executed: superseded by a new message | user | assistant"#]]
        .assert_eq(&roles(&history));
    // The superseded run is finished, cancelled.
    let runs = store.list_runs(&thread()).await.expect("runs");
    let first = runs
        .iter()
        .find(|r| r.run_id.as_str() == "run-1")
        .expect("run-1");
    assert_eq!(first.termination, Some(TerminationReason::Cancelled));
}

#[tokio::test]
async fn stop_statistics_and_step_numbers_carry_over_a_resume() {
    let (_dir, store) = sqlite("carry").await;
    // max_rounds 2: one inference before the wait, one after.
    let first = process(
        store.clone(),
        vec![
            ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("echo", json!({"text": "a"})).with_id("c1")),
        ],
        2,
    );
    start(&first).await;
    let tickets = first.runtime.waiting_calls(&thread()).await.expect("read");
    let second = process(
        store.clone(),
        vec![
            ScriptTurn::text("").with_tool_call(
                ScriptToolCall::new("echo", json!({"text": "again"})).with_id("c2"),
            ),
            ScriptTurn::text("never"),
        ],
        2,
    );
    let (out, events) = resume(&second, vec![ToolCallResume::approve(&tickets[0].call)]).await;
    let out = out.expect("resumed");
    // The second inference is the run's last (the count survived the other process).
    assert_eq!(
        out.termination,
        TerminationReason::stopped("max_rounds", "reached the limit of 2 inferences")
    );
    assert_eq!(second.executor.requests().len(), 1);
    assert!(events.contains("step_start 3"), "{events}");
    assert_eq!(out.steps, 2, "steps of this activation");
}

#[tokio::test]
async fn an_unpaired_stored_history_is_repaired_before_the_provider_sees_it() {
    let store: Arc<dyn ThreadStore> = Arc::new(awaken_store::MemoryStore::new());
    // A crash left a call without its result, and a stray result.
    let mut calls = Message::assistant("");
    calls.tool_calls = Arc::new([awaken_event::ToolCall::new(
        awaken_event::ToolCallId::new("lost").expect("id"),
        "echo",
        json!({"text": "x"}),
    )]);
    let record = awaken_store::RunRecord {
        status: awaken_store::RunStatus::Done,
        termination: Some(TerminationReason::NaturalEnd),
        ..awaken_store::RunRecord::new(
            awaken_event::RunId::new("old").expect("id"),
            "agent",
            awaken_store::Timestamp::from_unix_millis(0),
        )
    };
    store
        .commit(
            &awaken_store::ThreadCommit::new(thread(), record, 0).with_messages([
                Message::user("hi"),
                calls,
                Message::tool(
                    awaken_event::ToolCallId::new("stray").expect("id"),
                    &awaken_event::ToolResult::success(json!("?")),
                ),
            ]),
        )
        .await
        .expect("stored");
    let p = process(store.clone(), vec![ScriptTurn::text("ok")], 25);
    let sink = VecSink::new();
    p.runtime
        .run(
            RunActivation::new(thread(), "agent").with_user_message("again"),
            &sink,
        )
        .await
        .expect("run");
    let events = render(&sink.events());
    assert!(
        events.contains(
            "warning HistoryRepaired: call lost had no result: closed as outcome unknown"
        ),
        "{events}"
    );
    assert!(
        events.contains("warning HistoryRepaired: dropped a result for call stray"),
        "{events}"
    );
    let request = &p.executor.requests()[0];
    expect_test::expect![[r#"user | assistant | tool error: outcome unknown: the call's result was never recorded (the run was interrupted) | user"#]]
        .assert_eq(&roles(&request.messages));
    // The store keeps what was written; the repair is applied on every load.
    assert_eq!(p.runtime.history(&thread()).await.expect("h").len(), 5);
}

#[tokio::test]
async fn a_new_run_never_reuses_the_latest_runs_id() {
    let store: Arc<dyn ThreadStore> = Arc::new(awaken_store::MemoryStore::new());
    let first = process(store.clone(), vec![ScriptTurn::text("one")], 25);
    start(&first).await;
    // A second process whose id source starts over would hand out `run-1` again.
    let second = process(store.clone(), vec![ScriptTurn::text("two")], 25);
    let refused = second
        .runtime
        .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("again"))
        .await;
    assert!(
        matches!(refused, Err(RunError::RunIdTaken { .. })),
        "{refused:?}"
    );
    assert_eq!(
        second.runtime.history(&thread()).await.expect("h").len(),
        2,
        "nothing written"
    );
}

/// Schedules an action for `RunEnd` at every step start (queued while the run waits).
struct Later(PluginManifest);

struct LaterAction;

impl awaken_phase::ScheduledActionSpec for LaterAction {
    const KEY: &'static str = "later.at_run_end";
    const PHASE: awaken_phase::Phase = awaken_phase::Phase::RunEnd;
    type Payload = String;
}

struct LaterHandler;

#[async_trait::async_trait]
impl awaken_phase::ActionHandler<LaterAction> for LaterHandler {
    async fn handle(
        &self,
        _ctx: &PhaseContext,
        _payload: String,
    ) -> Result<awaken_state::StateCommand, awaken_phase::HookError> {
        Ok(awaken_state::StateCommand::new())
    }
}

impl Plugin for Later {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_scheduled_action::<LaterAction, _>(LaterHandler)?;
        r.register_phase_hook(
            awaken_phase::Phase::StepStart,
            "schedule",
            Arc::new(awaken_phase::FnHook(|_: &PhaseContext| {
                let mut cmd = awaken_state::StateCommand::new();
                awaken_phase::CommandExt::schedule_action::<LaterAction>(&mut cmd, "x".into())?;
                Ok(cmd)
            })),
        )
    }
}

#[tokio::test]
async fn a_resume_after_the_agent_changed_warns_and_dead_letters_orphaned_actions() {
    let (_dir, store) = sqlite("changed").await;
    let build = |with_later: bool, turns: Vec<ScriptTurn>| {
        let executor = Arc::new(ScriptedExecutor::from_turns(turns).expect("script"));
        let mut spec = AgentSpec::new("agent", "model")
            .with_plugin(awaken_runtime::PERMISSION_PLUGIN)
            .with_section("permission", json!({"default": "ask"}));
        let mut builder = AgentRuntime::builder()
            .with_ids(Arc::new(awaken_runtime::SystemIds::default()))
            .with_store(store.clone())
            .with_model(ModelSpec::new("model", "scripted", "upstream"))
            .with_provider("scripted", executor)
            .with_tool(Arc::new(Echo));
        if with_later {
            spec = spec.with_plugin("later");
            builder = builder.with_plugin(Arc::new(Later(PluginManifest::new("later"))));
        }
        builder.with_agent_spec(spec).build().expect("runtime")
    };
    let first = build(
        true,
        vec![
            ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("echo", json!({"text": "a"})).with_id("c1")),
        ],
    );
    let out = start(&Process {
        runtime: first.clone(),
        executor: Arc::new(ScriptedExecutor::from_turns(Vec::new()).expect("script")),
        asked: Log::default(),
    })
    .await;
    assert_eq!(out.termination, TerminationReason::Suspended);
    let ticket = first
        .waiting_calls(&thread())
        .await
        .expect("read")
        .remove(0);
    // The agent lost its `later` plugin while the run waited.
    let second = build(false, vec![ScriptTurn::text("done")]);
    let sink = VecSink::new();
    second
        .resume(
            Resume::new(thread()).with_decision(ToolCallResume::approve(&ticket.call)),
            &sink,
        )
        .await
        .expect("resumed");
    let events = render(&sink.events());
    assert!(
        events.contains("warning SpecChanged: agent `agent` changed while the run waited"),
        "{events}"
    );
    assert!(
        events.contains("dead_letter later.at_run_end: its handler is gone: the agent changed while the run waited"),
        "{events}"
    );
}

#[tokio::test]
async fn a_ticket_may_take_the_decision_as_the_calls_result() {
    // A gate that asks for the answer itself: the tool never runs.
    let asks = Arc::new(ApprovalAnswer(PluginManifest::new("answer")));
    let executor = Arc::new(
        ScriptedExecutor::from_turns(vec![
            ScriptTurn::text("").with_tool_call(
                ScriptToolCall::new("echo", json!({"text": "which color?"})).with_id("c1"),
            ),
            ScriptTurn::text("thanks"),
        ])
        .expect("script"),
    );
    let rt = AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "scripted", "upstream"))
        .with_provider("scripted", executor.clone())
        .with_tool(Arc::new(Echo))
        .with_plugin(asks)
        .with_agent_spec(AgentSpec::new("agent", "model").with_plugin("answer"))
        .build()
        .expect("runtime");
    let out = rt
        .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("hi"))
        .await
        .expect("run");
    assert_eq!(out.termination, TerminationReason::Suspended);
    let ticket = rt.waiting_calls(&thread()).await.expect("read").remove(0);
    // An answer that breaks the ticket's schema is refused.
    let refused = rt
        .resume_to_completion(
            Resume::new(thread())
                .with_decision(ToolCallResume::approve(&ticket.call).with_payload(json!(42))),
        )
        .await;
    assert!(
        matches!(
            refused,
            Err(RunError::Decision {
                source: DecisionError::InvalidAnswer { .. },
                ..
            })
        ),
        "{refused:?}"
    );
    let done = rt
        .resume_to_completion(
            Resume::new(thread())
                .with_decision(ToolCallResume::approve(&ticket.call).with_payload(json!("blue"))),
        )
        .await
        .expect("resumed");
    assert_eq!(done.termination, TerminationReason::NaturalEnd);
    let history = rt.history(&thread()).await.expect("history");
    assert_eq!(
        history[2].text(),
        "blue",
        "the answer is the result; echo never ran"
    );
}

/// Suspends every call with a question whose answer (a string) becomes the result.
struct ApprovalAnswer(PluginManifest);

impl Plugin for ApprovalAnswer {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_tool_gate_hook(
            "ask",
            Arc::new(FnGate(|ctx: &PhaseContext| {
                let tool = ctx.tool.as_ref().expect("a tool phase");
                if tool.resume.is_some() {
                    return Ok(None);
                }
                Ok(Some(ToolInterceptPayload::Suspend(SuspendTicket {
                    suspension_id: "q".into(),
                    call: pending_call(&tool.call),
                    message: "Answer for the tool".into(),
                    response_schema: Some(json!({"type": "string"})),
                    resume_mode: ResumeMode::UseDecisionAsResult,
                })))
            })),
        )
    }
}

/// A message the run took before it suspended, sent again with its receipt to the resumed run
/// (a fleet worker that took the job over hands over what its predecessor had not answered):
/// answered as taken at its step, not taken twice.
#[tokio::test]
async fn a_message_taken_before_a_suspension_is_not_taken_again_by_the_resume() {
    let (_dir, store) = sqlite("steered-receipt").await;
    let first = process(store.clone(), vec![two_echoes()], 25);
    let inbox = awaken_runtime::Steering::new();
    let taken = inbox.send_with_receipt(Message::user("and tea"), "41");
    let out = first
        .runtime
        .run_to_completion(
            RunActivation::new(thread(), "agent")
                .with_user_message("hi")
                .with_steering(inbox),
        )
        .await
        .expect("run");
    assert_eq!(out.termination, TerminationReason::Suspended);
    assert_eq!(taken.await, Ok(awaken_runtime::Taken { step: 1 }));
    let tickets = first.runtime.waiting_calls(&thread()).await.expect("read");

    let second = process(store.clone(), vec![ScriptTurn::text("done")], 25);
    let again = awaken_runtime::Steering::new();
    let resent = again.send_with_receipt(Message::user("and tea"), "41");
    let new = again.send_with_receipt(Message::user("and milk"), "42");
    let mut request = Resume::new(thread()).with_steering(again);
    for t in &tickets {
        request = request.with_decision(ToolCallResume::approve(&t.call));
    }
    let done = second
        .runtime
        .resume(request, &VecSink::new())
        .await
        .expect("resumed");
    assert_eq!(done.termination, TerminationReason::NaturalEnd);
    assert_eq!(resent.await, Ok(awaken_runtime::Taken { step: 1 }));
    assert_eq!(new.await, Ok(awaken_runtime::Taken { step: 3 }));
    let history = second.runtime.history(&thread()).await.expect("history");
    expect_test::expect![[r#"user | user | assistant | tool [{"type":"json","value":{"echoed":"a"}}] | tool [{"type":"json","value":{"echoed":"b"}}] | user | assistant"#]]
        .assert_eq(&roles(&history));
    let texts: Vec<String> = history
        .iter()
        .filter(|m| m.role == Role::User)
        .map(Message::text)
        .collect();
    assert_eq!(texts, ["hi", "and tea", "and milk"]);
}
