//! Tool batches: concurrent calls against the sequential run, declared writes serializing
//! calls, an action in `BeforeToolExecute` deciding on the call, cancellation while a hook
//! awaits.

use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{
    CancellationToken, ResumeMode, SuspendTicket, TerminationReason, ThreadId, ToolDescriptor,
};
use awaken_llm::{ScriptToolCall, ScriptTurn};
use awaken_phase::{
    ActionHandler, CommandExt, FnHook, HookError, Phase, PhaseContext, PhaseHook,
    ScheduledActionSpec,
};
use awaken_plugin::{Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_runtime::InterceptToolCall;
use awaken_state::{KeyOptions, KeyScope, MergeStrategy, StateCommand, StateError, StateKey};
use awaken_tool::{
    Tool, ToolCallContext, ToolError, ToolInterceptPayload, ToolOutput, pending_call,
};
use serde_json::{Value, json};

use crate::support::*;

/// How many calls ran (commutative: concurrent calls add up).
struct CallsRun;

impl StateKey for CallsRun {
    const KEY: &'static str = "test.calls_run";
    type Value = u64;
    type Update = u64;
    fn apply(value: &mut u64, update: u64) -> Result<(), StateError> {
        *value += update;
        Ok(())
    }
}

/// The last writer (exclusive: calls that write it are declared and serialized).
struct LastWriter;

impl StateKey for LastWriter {
    const KEY: &'static str = "test.last_writer";
    type Value = String;
    type Update = String;
    fn apply(value: &mut String, update: String) -> Result<(), StateError> {
        *value = update;
        Ok(())
    }
}

struct KeysPlugin(PluginManifest);

impl Plugin for KeysPlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_key::<CallsRun>(
            KeyOptions::new()
                .with_scope(KeyScope::Thread)
                .with_merge(MergeStrategy::Commutative),
        )?;
        r.register_key::<LastWriter>(KeyOptions::new().with_scope(KeyScope::Thread))
    }
}

fn keys() -> Arc<dyn Plugin> {
    Arc::new(KeysPlugin(PluginManifest::new("keys")))
}

/// `meet {"who": string}`: waits on a barrier shared by its calls (with two parties, two
/// calls pass only if they run at the same time), then counts itself.
struct Meet(Arc<tokio::sync::Barrier>);

#[async_trait]
impl Tool for Meet {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("meet", "Meets the other calls").with_parameters(json!({
            "type": "object",
            "properties": {"who": {"type": "string"}},
            "required": ["who"]
        }))
    }
    async fn execute(&self, args: &Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        self.0.wait().await;
        Ok(ToolOutput::success(json!({"met": args["who"]}))
            .with_command(StateCommand::new().with_update::<CallsRun>(1)))
    }
}

fn two_meetings() -> Vec<ScriptTurn> {
    vec![
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("meet", json!({"who": "ann"})).with_id("c1"))
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": "between"})).with_id("c2"))
            .with_tool_call(ScriptToolCall::new("meet", json!({"who": "bob"})).with_id("c3")),
        ScriptTurn::text("done"),
    ]
}

async fn committed(out: &Outcome) -> String {
    let thread = ThreadId::new("thread").expect("id");
    let checkpoint = out
        .runtime
        .store()
        .load_checkpoint(&thread)
        .await
        .expect("loads")
        .expect("stored");
    let mut text = String::new();
    for m in &checkpoint.messages {
        text.push_str(&serde_json::to_string(m).expect("json"));
        text.push('\n');
    }
    text.push_str(&format!("{:?}\n", checkpoint.thread_state.values));
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_really_overlap_and_commit_the_sequential_history() {
    // Parallel: the two `meet` calls only get past a two-party barrier together.
    let mut parallel = Scenario::new(two_meetings())
        .spec(|s| s.with_parallel_tools(true))
        .plugin(keys());
    parallel
        .tools
        .push(Arc::new(Meet(Arc::new(tokio::sync::Barrier::new(2)))));
    let parallel = tokio::time::timeout(std::time::Duration::from_secs(60), parallel.run())
        .await
        .expect("the calls met: they ran at the same time");
    // Sequential: the same calls one after another (a one-party barrier never waits).
    let mut sequential = Scenario::new(two_meetings()).plugin(keys());
    sequential
        .tools
        .push(Arc::new(Meet(Arc::new(tokio::sync::Barrier::new(1)))));
    let sequential = sequential.run().await;

    assert_eq!(parallel.outcome.termination, TerminationReason::NaturalEnd);
    assert_eq!(committed(&parallel).await, committed(&sequential).await);
    expect_test::expect![[r#"
        {"role":"user","content":[{"type":"text","text":"hi"}]}
        {"role":"assistant","tool_calls":[{"id":"c1","name":"meet","arguments":{"who":"ann"}},{"id":"c2","name":"echo","arguments":{"text":"between"}},{"id":"c3","name":"meet","arguments":{"who":"bob"}}]}
        {"role":"tool","content":[{"type":"json","value":{"met":"ann"}}],"tool_call_id":"c1"}
        {"role":"tool","content":[{"type":"json","value":{"echoed":"between"}}],"tool_call_id":"c2"}
        {"role":"tool","content":[{"type":"json","value":{"met":"bob"}}],"tool_call_id":"c3"}
        {"role":"assistant","content":[{"type":"text","text":"done"}]}
        {"test.calls_run": Number(2)}
    "#]]
    .assert_eq(&committed(&parallel).await);
}

/// `write_a` / `write_b` both declare `test.last_writer`; `free` declares nothing. Each logs
/// its start and end with yields in between, so calls that may overlap do.
struct Writer {
    name: &'static str,
    declares: &'static [&'static str],
    log: Log,
}

#[async_trait]
impl Tool for Writer {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(self.name, "Writes")
    }
    fn writes(&self) -> &[&'static str] {
        self.declares
    }
    async fn execute(
        &self,
        _args: &Value,
        _ctx: &ToolCallContext,
    ) -> Result<ToolOutput, ToolError> {
        self.log.push(format!("start {}", self.name));
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        self.log.push(format!("end {}", self.name));
        let cmd = if self.declares.is_empty() {
            StateCommand::new().with_update::<CallsRun>(1)
        } else {
            StateCommand::new().with_update::<LastWriter>(self.name.to_owned())
        };
        Ok(ToolOutput::success(json!({"wrote": self.name})).with_command(cmd))
    }
}

#[tokio::test]
async fn calls_with_overlapping_writes_never_overlap() {
    let log = Log::default();
    let mut scenario = Scenario::new(vec![
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("write_a", json!({})).with_id("c1"))
            .with_tool_call(ScriptToolCall::new("free", json!({})).with_id("c2"))
            .with_tool_call(ScriptToolCall::new("write_b", json!({})).with_id("c3")),
        ScriptTurn::text("done"),
    ])
    .spec(|s| s.with_parallel_tools(true))
    .plugin(keys());
    for (name, declares) in [
        ("write_a", &["test.last_writer"][..]),
        ("free", &[][..]),
        ("write_b", &["test.last_writer"][..]),
    ] {
        scenario.tools.push(Arc::new(Writer {
            name,
            declares,
            log: log.clone(),
        }));
    }
    let out = scenario.run().await;
    assert_eq!(out.outcome.termination, TerminationReason::NaturalEnd);
    let lines = log.lines();
    let at = |s: &str| lines.iter().position(|l| l == s).expect(s);
    // The free call ran alongside the first writer ...
    assert!(at("start free") < at("end write_a"), "{lines:?}");
    // ... and the writers one after another, in call order.
    assert!(at("end write_a") < at("start write_b"), "{lines:?}");
    let state = committed(&out).await;
    assert!(
        state.ends_with(
            "{\"test.calls_run\": Number(1), \"test.last_writer\": String(\"write_b\")}\n"
        ),
        "{state}"
    );
}

/// A permission check scheduled by a `BeforeToolExecute` hook; its handler suspends the call
/// through the built-in `InterceptToolCall` action, in the same phase.
struct PermissionCheck;

impl ScheduledActionSpec for PermissionCheck {
    const KEY: &'static str = "test.permission_check";
    const PHASE: Phase = Phase::BeforeToolExecute;
    type Payload = String;
}

struct PermissionHandler;

#[async_trait]
impl ActionHandler<PermissionCheck> for PermissionHandler {
    async fn handle(&self, ctx: &PhaseContext, tool: String) -> Result<StateCommand, HookError> {
        let call = &ctx.tool.as_ref().expect("a tool phase").call;
        let mut cmd = StateCommand::new();
        if tool == "echo" {
            cmd.schedule_action::<InterceptToolCall>(ToolInterceptPayload::Suspend(
                SuspendTicket {
                    suspension_id: "perm-1".into(),
                    call: pending_call(call),
                    message: "echo needs approval".into(),
                    response_schema: None,
                    resume_mode: ResumeMode::Replay,
                },
            ))?;
        }
        Ok(cmd)
    }
}

struct Permissions(PluginManifest);

impl Plugin for Permissions {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_scheduled_action::<PermissionCheck, _>(PermissionHandler)?;
        r.register_phase_hook(
            Phase::BeforeToolExecute,
            "check",
            Arc::new(FnHook(|ctx: &PhaseContext| {
                let call = &ctx.tool.as_ref().expect("a tool phase").call;
                let mut cmd = StateCommand::new();
                cmd.schedule_action::<PermissionCheck>(call.name.clone())?;
                Ok(cmd)
            })),
        )
    }
}

#[tokio::test]
async fn an_action_in_before_tool_execute_can_still_suspend_the_call() {
    let log = Log::default();
    let mut scenario = Scenario::new(vec![
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("free", json!({})).with_id("c1"))
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": "x"})).with_id("c2")),
        ScriptTurn::text("never"),
    ])
    .plugin(keys())
    .plugin(Arc::new(Permissions(PluginManifest::new("permissions"))));
    scenario.tools.push(Arc::new(Writer {
        name: "free",
        declares: &[],
        log: log.clone(),
    }));
    let out = scenario.run().await;
    assert_eq!(out.outcome.termination, TerminationReason::Suspended);
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        step_start 1
        call_start c1 free
        call_start c2 echo
        inference upstream-model
        call_ready c1 {}
        call_done c1 succeeded {"wrote":"free"}
        call_ready c2 {"text":"x"}
        call_suspended c2 "echo needs approval"
        step_end 1
        run_finish suspended response=None tokens=0
    "#]]
    .assert_eq(&render(&out.events));
    assert_eq!(
        log.lines(),
        ["start free", "end free"],
        "only the allowed call ran"
    );
}

/// A `BeforeInference` hook that awaits something that never comes (a slow lookup), after
/// telling the test it got there.
struct Stuck(Arc<tokio::sync::Notify>);

#[async_trait]
impl PhaseHook for Stuck {
    async fn run(&self, _ctx: &PhaseContext) -> Result<StateCommand, HookError> {
        self.0.notify_one();
        std::future::pending::<()>().await;
        Ok(StateCommand::new())
    }
}

struct StuckPlugin(PluginManifest, Arc<tokio::sync::Notify>);

impl Plugin for StuckPlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_phase_hook(
            Phase::BeforeInference,
            "lookup",
            Arc::new(Stuck(self.1.clone())),
        )
    }
}

#[tokio::test]
async fn cancellation_while_a_hook_awaits_ends_the_run_cancelled() {
    let entered = Arc::new(tokio::sync::Notify::new());
    let token = CancellationToken::new();
    let t = token.clone();
    let scenario = Scenario::new(vec![ScriptTurn::text("never")])
        .plugin(Arc::new(StuckPlugin(
            PluginManifest::new("stuck"),
            entered.clone(),
        )))
        .activation(move |mut a| {
            a.cancel = t;
            a
        });
    let run = tokio::spawn(scenario.run());
    entered.notified().await;
    token.cancel();
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), run)
        .await
        .expect("the run ended when cancelled")
        .expect("joined");
    assert_eq!(out.outcome.termination, TerminationReason::Cancelled);
    assert!(out.executor.requests().is_empty(), "no inference was made");
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        step_start 1
        step_end 1
        run_finish cancelled response=None tokens=0
    "#]]
    .assert_eq(&render(&out.events));
}

/// An effect emitted by an `AfterToolExecute` hook.
struct Announce;

impl awaken_phase::EffectSpec for Announce {
    const KEY: &'static str = "test.announce";
    type Payload = String;
}

/// Logs what it saw (the state of the emitting commit) and submits a command of its own.
struct AnnounceHandler(Log);

#[async_trait]
impl awaken_phase::EffectHandler<Announce> for AnnounceHandler {
    async fn handle(
        &self,
        ctx: &awaken_phase::EffectContext,
        call: String,
    ) -> Result<(), HookError> {
        let seen = ctx.snapshot.get::<CallsRun>().copied().unwrap_or(0);
        self.0.push(format!("{call} after {seen} counted"));
        ctx.engine
            .submit_command(StateCommand::new().with_update::<CallsRun>(10))
            .await
            .map_err(|e| HookError::failed(e.to_string()))?;
        Ok(())
    }
}

struct Announcer(PluginManifest, Log);

impl Plugin for Announcer {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_effect::<Announce, _>(AnnounceHandler(self.1.clone()))?;
        r.register_phase_hook(
            Phase::AfterToolExecute,
            "announce",
            Arc::new(FnHook(|ctx: &PhaseContext| {
                let call = &ctx.tool.as_ref().expect("a tool phase").call;
                let mut cmd = StateCommand::new().with_update::<CallsRun>(1);
                cmd.emit::<Announce>(call.id.to_string())?;
                Ok(cmd)
            })),
        )
    }
}

#[tokio::test]
async fn effects_run_after_their_commit_and_may_submit_commands() {
    let log = Log::default();
    let out = Scenario::new(vec![
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": "a"})).with_id("c1"))
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": "b"})).with_id("c2")),
        ScriptTurn::text("done"),
    ])
    .plugin(keys())
    .plugin(Arc::new(Announcer(
        PluginManifest::new("announcer"),
        log.clone(),
    )))
    .run()
    .await;
    assert_eq!(out.outcome.termination, TerminationReason::NaturalEnd);
    // Each effect saw its own hook's write; the handler's own command (+10) was committed
    // before the next call's hook ran.
    assert_eq!(log.lines(), ["c1 after 1 counted", "c2 after 12 counted"]);
    let state = committed(&out).await;
    assert!(
        state.ends_with("{\"test.calls_run\": Number(22)}\n"),
        "{state}"
    );
}

/// Reports its progress twice, yielding in between (as a tool waiting on I/O would).
struct Stages;

#[async_trait]
impl Tool for Stages {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("stages", "Reports its progress").with_parameters(json!({
            "type": "object",
            "properties": {}
        }))
    }
    async fn execute(&self, _args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        ctx.report_progress(json!({"stage": 1}));
        tokio::task::yield_now().await;
        ctx.report_progress(json!({"stage": 2}));
        Ok(ToolOutput::success(json!("staged")))
    }
}

#[tokio::test]
async fn a_tools_progress_reports_are_events_between_its_ready_and_its_result() {
    let mut scenario = Scenario::new(vec![
        ScriptTurn::text("").with_tool_call(ScriptToolCall::new("stages", json!({})).with_id("c1")),
        ScriptTurn::text("done"),
    ]);
    scenario.tools.push(Arc::new(Stages));
    let out = scenario.run().await;
    assert_eq!(out.outcome.termination, TerminationReason::NaturalEnd);
    let lines: Vec<String> = out
        .events
        .iter()
        .filter_map(|e| match e {
            awaken_event::AgentEvent::ToolCallReady { call_id, .. } => {
                Some(format!("ready {call_id}"))
            }
            awaken_event::AgentEvent::ToolCallProgress { call_id, progress } => {
                Some(format!("progress {call_id} {progress}"))
            }
            awaken_event::AgentEvent::ToolCallDone { call_id, .. } => {
                Some(format!("done {call_id}"))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        lines,
        [
            "ready c1",
            r#"progress c1 {"stage":1}"#,
            r#"progress c1 {"stage":2}"#,
            "done c1"
        ]
    );
}

/// Leaves a task behind holding its context; the task reports once `go` is notified.
struct Late(Arc<tokio::sync::Notify>);

#[async_trait]
impl Tool for Late {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("late", "Reports after it returned")
    }
    async fn execute(&self, _args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        let (ctx, go) = (ctx.clone(), self.0.clone());
        tokio::spawn(async move {
            go.notified().await;
            ctx.report_progress(json!("too late"));
        });
        Ok(ToolOutput::success(json!("returned")))
    }
}

/// Lets the task `Late` left behind report, while this call runs.
struct Trigger(Arc<tokio::sync::Notify>);

#[async_trait]
impl Tool for Trigger {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("trigger", "Wakes the late reporter")
    }
    async fn execute(
        &self,
        _args: &Value,
        _ctx: &ToolCallContext,
    ) -> Result<ToolOutput, ToolError> {
        self.0.notify_one();
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        Ok(ToolOutput::success(json!("triggered")))
    }
}

#[tokio::test]
async fn a_report_of_a_call_that_already_returned_is_dropped() {
    let go = Arc::new(tokio::sync::Notify::new());
    let mut scenario = Scenario::new(vec![
        ScriptTurn::text("").with_tool_call(ScriptToolCall::new("late", json!({})).with_id("c1")),
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("trigger", json!({})).with_id("c2")),
        ScriptTurn::text("done"),
    ]);
    scenario.tools.push(Arc::new(Late(go.clone())));
    scenario.tools.push(Arc::new(Trigger(go)));
    // The scenario checks the event grammar: a progress event of `c1` after its result fails it.
    let out = scenario.run().await;
    assert_eq!(out.outcome.termination, TerminationReason::NaturalEnd);
    assert!(
        !out.events
            .iter()
            .any(|e| matches!(e, awaken_event::AgentEvent::ToolCallProgress { .. })),
        "{}",
        render(&out.events)
    );
}
