//! Runs cancelled while a call waits for a decision, while a resumed call runs, and while the
//! model streams: every call keeps one result, the thread's next request is one the strictest
//! providers accept (its results in call order), and every activation's events keep the grammar.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use awaken_event::{
    AgentEvent, CancellationToken, ResumeMode, SuspendTicket, TerminationReason, ThreadId,
    ToolCallResume, ToolDescriptor, check_activation, check_events,
};
use awaken_llm::{ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken_phase::PhaseContext;
use awaken_plugin::{FnGate, Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_runtime::{AgentRuntime, Resume, RunActivation, SequentialIds};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_tool::{
    Tool, ToolCallContext, ToolError, ToolInterceptPayload, ToolOutput, pending_call,
};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::interrupted::{render_messages, strictly_alternating};
use crate::support::{Echo, render};

fn thread() -> ThreadId {
    ThreadId::new("thread").expect("id")
}

/// `wait`: signals it started, then waits until its run is cancelled.
struct Waits(Arc<Notify>);

#[async_trait]
impl Tool for Waits {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("wait", "Waits until cancelled")
    }
    async fn execute(&self, _args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        self.0.notify_one();
        ctx.cancel_token().cancelled().await;
        Err(ToolError::Cancelled {
            tool_id: "wait".into(),
        })
    }
}

/// Asks a human before every call of the named tools, unless the call carries a decision.
struct Ask {
    manifest: PluginManifest,
    tools: &'static [&'static str],
}

impl Plugin for Ask {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        let tools = self.tools;
        r.register_tool_gate_hook(
            "ask",
            Arc::new(FnGate(move |ctx: &PhaseContext| {
                let tool = ctx.tool.as_ref().expect("a tool phase");
                if !tools.contains(&tool.call.name.as_str()) || tool.resume.is_some() {
                    return Ok(None);
                }
                Ok(Some(ToolInterceptPayload::Suspend(SuspendTicket {
                    suspension_id: format!("ask-{}", tool.call.id),
                    call: pending_call(&tool.call),
                    message: format!("Run {}?", tool.call.name),
                    response_schema: None,
                    resume_mode: ResumeMode::Replay,
                })))
            })),
        )
    }
}

/// When an activation is cancelled.
#[derive(Clone, Copy)]
enum CancelAt {
    Never,
    /// Once the `wait` tool runs.
    ToolRunning,
    /// Once the run emits an event this accepts.
    Event(fn(&AgentEvent) -> bool),
}

/// A runtime on the memory store whose model records every request, with `echo` and `wait`,
/// asking before the calls of `ask`; every activation's events are kept.
struct Rig {
    runtime: AgentRuntime,
    executor: Arc<ScriptedExecutor>,
    started: Arc<Notify>,
    activations: Mutex<Vec<Vec<AgentEvent>>>,
}

enum Start {
    Message(&'static str),
    Resume(Vec<ToolCallResume>),
}

impl Rig {
    fn new(ask: &'static [&'static str], parallel: bool, turns: Vec<ScriptTurn>) -> Self {
        let executor = Arc::new(ScriptedExecutor::from_turns(turns).expect("script"));
        let started = Arc::new(Notify::new());
        let runtime = AgentRuntime::builder()
            .with_ids(Arc::new(SequentialIds::default()))
            .with_model(ModelSpec::new("model", "scripted", "upstream"))
            .with_provider("scripted", executor.clone())
            .with_tool(Arc::new(Echo))
            .with_tool(Arc::new(Waits(started.clone())))
            .with_plugin(Arc::new(Ask {
                manifest: PluginManifest::new("ask"),
                tools: ask,
            }))
            .with_agent_spec(
                AgentSpec::new("agent", "model")
                    .with_plugin("ask")
                    .with_parallel_tools(parallel),
            )
            .build()
            .expect("runtime");
        Self {
            runtime,
            executor,
            started,
            activations: Mutex::default(),
        }
    }

    /// One activation, cancelled at `at`; its events pass the grammar check. Returns how it
    /// ended and its events rendered.
    async fn activate(&self, start: Start, at: CancelAt) -> (TerminationReason, String) {
        let cancel = CancellationToken::new();
        let events: Mutex<Vec<AgentEvent>> = Mutex::default();
        let sink = |event: &AgentEvent| {
            events.lock().expect("events").push(event.clone());
            if let CancelAt::Event(when) = at
                && when(event)
            {
                cancel.cancel();
            }
        };
        let run = async {
            match start {
                Start::Message(text) => {
                    let mut activation =
                        RunActivation::new(thread(), "agent").with_user_message(text);
                    activation.cancel = cancel.clone();
                    self.runtime.run(activation, &sink).await
                }
                Start::Resume(decisions) => {
                    let mut resume = Resume::new(thread());
                    resume.cancel = cancel.clone();
                    for d in decisions {
                        resume = resume.with_decision(d);
                    }
                    self.runtime.resume(resume, &sink).await
                }
            }
        };
        let cancel_when_running = async {
            if let CancelAt::ToolRunning = at {
                self.started.notified().await;
                cancel.cancel();
            }
        };
        let (outcome, ()) = tokio::join!(run, cancel_when_running);
        let outcome = outcome.expect("the activation starts");
        let events = events.into_inner().expect("events");
        if let Err(v) = check_activation(&events) {
            panic!("event grammar violated: {v}\n{}", render(&events));
        }
        let rendered = render(&events);
        self.activations.lock().expect("activations").push(events);
        (outcome.termination, rendered)
    }

    /// A new user message on the thread, run to its end; returns the messages of the request
    /// it sent, rendered, after checking the strictest providers' rules on them.
    async fn next_request(&self) -> String {
        let (termination, _) = self
            .activate(Start::Message("go on"), CancelAt::Never)
            .await;
        assert_eq!(termination, TerminationReason::NaturalEnd);
        let request = self.executor.requests().pop().expect("a request");
        if let Err(why) = strictly_alternating(&request.messages) {
            panic!("{why}\n{}", render_messages(&request.messages));
        }
        render_messages(&request.messages)
    }

    /// Every activation's events, emitted and stored, read as one stream: each activation is
    /// well formed, and a resumed call is one an earlier activation suspended.
    async fn check_every_activation(&self) {
        let emitted: Vec<AgentEvent> = self.activations.lock().expect("activations").concat();
        if let Err(v) = check_events(&emitted) {
            panic!(
                "emitted events violate the grammar: {v}\n{}",
                render(&emitted)
            );
        }
        let stored = crate::support::stored_events(&self.runtime, &thread()).await;
        if let Err(v) = check_events(&stored) {
            panic!(
                "stored events violate the grammar: {v}\n{}",
                render(&stored)
            );
        }
    }
}

fn call(id: &str, tool: &str, arguments: Value) -> ScriptToolCall {
    ScriptToolCall::new(tool, arguments).with_id(id)
}

/// What a case leaves, rendered: the stored history and the thread's next request.
fn report(history: &str, next: &str) -> String {
    format!("--- history\n{history}\n--- next request\n{next}\n")
}

/// c1 waits for a decision; c2 runs and is cancelled while it runs. Returns the activation's
/// events and what it leaves.
async fn cancelled_while_a_call_waits(parallel: bool) -> (String, String) {
    let rig = Rig::new(
        &["echo"],
        parallel,
        vec![
            ScriptTurn::text("")
                .with_tool_call(call("c1", "echo", json!({"text": "a"})))
                .with_tool_call(call("c2", "wait", json!({}))),
            ScriptTurn::text("ok"),
        ],
    );
    let (termination, events) = rig
        .activate(Start::Message("hi"), CancelAt::ToolRunning)
        .await;
    assert_eq!(termination, TerminationReason::Cancelled, "{events}");
    let history = rig.runtime.history(&thread()).await.expect("history");
    assert!(
        rig.runtime
            .waiting_calls(&thread())
            .await
            .expect("read")
            .is_empty(),
        "a cancelled run waits for nothing"
    );
    let next = rig.next_request().await;
    rig.check_every_activation().await;
    (events, report(&render_messages(&history), &next))
}

#[tokio::test]
async fn a_run_cancelled_while_a_call_waits_closes_it_not_executed_in_call_order() {
    let (events, sequential) = cancelled_while_a_call_waits(false).await;
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        step_start 1
        call_start c1 echo
        call_start c2 wait
        inference upstream
        call_ready c1 {"text":"a"}
        call_suspended c1 "Run echo?"
        call_ready c2 {}
        call_done c2 cancelled "tool `wait` was cancelled"
        step_end 1
        run_finish cancelled response=None tokens=0
        --- history
        user "hi"
        assistant "" calls c1 calls c2
        tool "error: tool `wait` was cancelled" answers c2
        tool "error: not executed: the run was cancelled" answers c1
        --- next request
        user "hi"
        assistant "" calls c1 calls c2
        tool "error: not executed: the run was cancelled" answers c1
        tool "error: tool `wait` was cancelled" answers c2
        user "go on"
    "#]]
    .assert_eq(&format!("{events}{sequential}"));
    // Concurrent calls: their events in another order, the same calls closed the same way.
    let (_, parallel) = cancelled_while_a_call_waits(true).await;
    assert_eq!(parallel, sequential);
}

/// c1 runs; c2 waits for a decision, and the run is cancelled as it starts waiting. Returns
/// the activation's events and what it leaves.
async fn cancelled_as_a_later_call_starts_waiting(parallel: bool) -> (String, String) {
    let rig = Rig::new(
        &["wait"],
        parallel,
        vec![
            ScriptTurn::text("")
                .with_tool_call(call("c1", "echo", json!({"text": "a"})))
                .with_tool_call(call("c2", "wait", json!({}))),
            ScriptTurn::text("ok"),
        ],
    );
    let (termination, events) = rig
        .activate(
            Start::Message("hi"),
            CancelAt::Event(|e| matches!(e, AgentEvent::ToolCallSuspended { .. })),
        )
        .await;
    assert_eq!(termination, TerminationReason::Cancelled, "{events}");
    let history = rig.runtime.history(&thread()).await.expect("history");
    let next = rig.next_request().await;
    rig.check_every_activation().await;
    (events, report(&render_messages(&history), &next))
}

#[tokio::test]
async fn a_run_cancelled_as_a_call_starts_waiting_closes_it_not_executed() {
    let (events, sequential) = cancelled_as_a_later_call_starts_waiting(false).await;
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        step_start 1
        call_start c1 echo
        call_start c2 wait
        inference upstream
        call_ready c1 {"text":"a"}
        call_done c1 succeeded {"echoed":"a"}
        call_ready c2 {}
        call_suspended c2 "Run wait?"
        step_end 1
        run_finish cancelled response=None tokens=0
        --- history
        user "hi"
        assistant "" calls c1 calls c2
        tool "{\"echoed\":\"a\"}" answers c1
        tool "error: not executed: the run was cancelled" answers c2
        --- next request
        user "hi"
        assistant "" calls c1 calls c2
        tool "{\"echoed\":\"a\"}" answers c1
        tool "error: not executed: the run was cancelled" answers c2
        user "go on"
    "#]]
    .assert_eq(&format!("{events}{sequential}"));
    let (_, parallel) = cancelled_as_a_later_call_starts_waiting(true).await;
    assert_eq!(parallel, sequential);
}

/// Both calls wait; the resume approves both, and is cancelled while the first runs: the
/// second was never announced by the resumed activation.
#[tokio::test]
async fn a_resumed_run_cancelled_in_a_tool_announces_only_the_calls_it_resumed() {
    let rig = Rig::new(
        &["echo", "wait"],
        false,
        vec![
            ScriptTurn::text("")
                .with_tool_call(call("c1", "wait", json!({})))
                .with_tool_call(call("c2", "echo", json!({"text": "b"}))),
            ScriptTurn::text("ok"),
        ],
    );
    let (termination, _) = rig.activate(Start::Message("hi"), CancelAt::Never).await;
    assert_eq!(termination, TerminationReason::Suspended);
    let tickets = rig.runtime.waiting_calls(&thread()).await.expect("read");
    let decisions = tickets
        .iter()
        .map(|t| ToolCallResume::approve(&t.call))
        .collect();
    let (termination, events) = rig
        .activate(Start::Resume(decisions), CancelAt::ToolRunning)
        .await;
    assert_eq!(termination, TerminationReason::Cancelled, "{events}");
    let history = rig.runtime.history(&thread()).await.expect("history");
    assert!(
        rig.runtime
            .waiting_calls(&thread())
            .await
            .expect("read")
            .is_empty(),
        "a cancelled run waits for nothing"
    );
    let next = rig.next_request().await;
    rig.check_every_activation().await;
    expect_test::expect![[r#"
        run_start run-1 resumed=true
        step_start 2
        tool_call_resumed
        call_ready c1 {}
        call_done c1 cancelled "tool `wait` was cancelled"
        step_end 2
        run_finish cancelled response=None tokens=0
        --- history
        user "hi"
        assistant "" calls c1 calls c2
        tool "error: tool `wait` was cancelled" answers c1
        tool "error: not executed: the run was cancelled" answers c2
        --- next request
        user "hi"
        assistant "" calls c1 calls c2
        tool "error: tool `wait` was cancelled" answers c1
        tool "error: not executed: the run was cancelled" answers c2
        user "go on"
    "#]]
    .assert_eq(&format!(
        "{events}{}",
        report(&render_messages(&history), &next)
    ));
}

/// The model is cut off before it wrote anything, or after it wrote some text; the thread's
/// next run adds its message.
#[tokio::test]
async fn a_run_cancelled_while_the_model_streams_leaves_a_next_request_that_alternates() {
    let mut cases = Vec::new();
    // Cut off at its reasoning, before any text; and at the last piece of its text.
    let cases_at: [(&[&str], fn(&AgentEvent) -> bool); 2] = [
        (&[], |e| matches!(e, AgentEvent::ReasoningDelta { .. })),
        (
            &["Once upon", " a time"],
            |e| matches!(e, AgentEvent::TextDelta { delta } if delta == " a time"),
        ),
    ];
    for (written, at) in cases_at {
        let cut_off = ScriptTurn {
            wait_for_cancel: true,
            ..ScriptTurn::deltas(written.iter().copied())
        }
        .with_reasoning("thinking");
        let rig = Rig::new(&[], false, vec![cut_off, ScriptTurn::text("ok")]);
        let (termination, events) = rig
            .activate(Start::Message("hi"), CancelAt::Event(at))
            .await;
        assert_eq!(termination, TerminationReason::Cancelled, "{events}");
        let history = rig.runtime.history(&thread()).await.expect("history");
        let next = rig.next_request().await;
        rig.check_every_activation().await;
        cases.push(format!(
            "{events}{}",
            report(&render_messages(&history), &next)
        ));
    }
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        step_start 1
        reasoning_delta
        step_end 1
        run_finish cancelled response=None tokens=0
        --- history
        user "hi"
        --- next request
        user "hi\n\ngo on"
        ===
        run_start run-1 resumed=false
        step_start 1
        reasoning_delta
        text "Once upon"
        text " a time"
        step_end 1
        run_finish cancelled response=None tokens=0
        --- history
        user "hi"
        assistant (incomplete) "Once upon a time"
        --- next request
        user "hi"
        assistant (incomplete) "Once upon a time"
        user "go on"
    "#]]
    .assert_eq(&cases.join("===\n"));
}
