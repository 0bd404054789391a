//! Delegation: a delegate agent as a tool running a child run; its failure, its suspension
//! forwarded both ways, cancellation, lifecycle hooks, and recovery of a parent whose delegate
//! call was interrupted.

use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{
    CancellationToken, TerminationReason, ThreadId, ToolCallResume, ToolDescriptor,
};
use awaken_llm::{ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken_plugin::{DelegateCall, Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_runtime::{
    AgentRuntime, PERMISSION_PLUGIN, RecoverConfig, Resume, RunActivation, SequentialIds,
    delegate_tool_id,
};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_store::{MemoryStore, RunStatus, ThreadStore};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use crate::support::*;

/// Records the delegate lifecycle hooks.
struct Watcher(PluginManifest, Log);

#[async_trait]
impl Plugin for Watcher {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, _r: &mut PluginRegistrar) -> Result<(), PluginError> {
        Ok(())
    }
    async fn on_delegate_call_start(&self, c: &DelegateCall) -> Result<(), PluginError> {
        self.1
            .push(format!("call_start {} {}", c.agent_id, c.call_id));
        Ok(())
    }
    async fn on_delegate_call_complete(
        &self,
        c: &DelegateCall,
        _response: &str,
    ) -> Result<(), PluginError> {
        self.1.push(format!("call_complete {}", c.agent_id));
        Ok(())
    }
    async fn on_delegate_call_error(&self, c: &DelegateCall, e: &str) -> Result<(), PluginError> {
        self.1.push(format!("call_error {} {e}", c.agent_id));
        Ok(())
    }
    async fn on_delegate_return_start(&self, c: &DelegateCall) -> Result<(), PluginError> {
        self.1.push(format!("return_start {}", c.agent_id));
        Ok(())
    }
    async fn on_delegate_return_complete(&self, c: &DelegateCall) -> Result<(), PluginError> {
        self.1.push(format!("return_complete {}", c.agent_id));
        Ok(())
    }
}

/// Signals it started, then waits until its run is cancelled.
struct WaitsForCancel(Arc<tokio::sync::Notify>);

#[async_trait]
impl Tool for WaitsForCancel {
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

struct Setup {
    boss: Vec<ScriptTurn>,
    helper: Vec<ScriptTurn>,
    helper_asks: bool,
    store: Arc<dyn ThreadStore>,
    log: Log,
    started: Arc<tokio::sync::Notify>,
    /// Real time and random ids (a second runtime on a store must not reuse the first's).
    system_ids: bool,
}

impl Setup {
    fn new(boss: Vec<ScriptTurn>, helper: Vec<ScriptTurn>) -> Self {
        Self {
            boss,
            helper,
            helper_asks: false,
            store: Arc::new(MemoryStore::new()),
            log: Log::default(),
            started: Arc::new(tokio::sync::Notify::new()),
            system_ids: false,
        }
    }

    fn runtime(&self) -> AgentRuntime {
        self.runtime_with_boss(
            AgentSpec::new("boss", "boss-model")
                .with_delegate("helper")
                .with_plugin("watcher"),
        )
    }

    fn runtime_with_boss(&self, boss: AgentSpec) -> AgentRuntime {
        let mut helper = AgentSpec::new("helper", "helper-model").with_description("Knows things");
        if self.helper_asks {
            helper = helper
                .with_plugin(PERMISSION_PLUGIN)
                .with_section("permission", json!({"default": "ask"}));
        }
        let ids: Arc<dyn awaken_runtime::IdSource> = if self.system_ids {
            Arc::new(awaken_runtime::SystemIds::default())
        } else {
            Arc::new(SequentialIds::default())
        };
        AgentRuntime::builder()
            .with_ids(ids)
            .with_store(self.store.clone())
            .with_model(ModelSpec::new("boss-model", "boss", "boss-up"))
            .with_model(ModelSpec::new("helper-model", "helper", "helper-up"))
            .with_provider(
                "boss",
                Arc::new(ScriptedExecutor::from_turns(self.boss.clone()).expect("script")),
            )
            .with_provider(
                "helper",
                Arc::new(ScriptedExecutor::from_turns(self.helper.clone()).expect("script")),
            )
            .with_tool(Arc::new(Echo))
            .with_tool(Arc::new(WaitsForCancel(self.started.clone())))
            .with_plugin(Arc::new(Watcher(
                PluginManifest::new("watcher"),
                self.log.clone(),
            )))
            .with_agent_spec(boss)
            .with_agent_spec(helper)
            .build()
            .expect("runtime")
    }
}

fn thread() -> ThreadId {
    ThreadId::new("t").expect("id")
}

fn delegate(task: &str) -> ScriptTurn {
    ScriptTurn::text("").with_tool_call(
        ScriptToolCall::new(delegate_tool_id("helper"), json!({"task": task})).with_id("d1"),
    )
}

/// The child thread of the boss's call `d1`.
fn child_thread() -> ThreadId {
    ThreadId::new("t/d1").expect("id")
}

#[tokio::test]
async fn a_delegate_runs_as_a_child_run_and_its_answer_is_the_result() {
    let setup = Setup::new(
        vec![delegate("what is 2+2?"), ScriptTurn::text("it is 4")],
        vec![ScriptTurn::text("4")],
    );
    let rt = setup.runtime();
    let out = rt
        .run_to_completion(RunActivation::new(thread(), "boss").with_user_message("ask"))
        .await
        .expect("run");
    assert_eq!(out.response.as_deref(), Some("it is 4"));
    let history = rt.history(&thread()).await.expect("history");
    assert_eq!(
        serde_json::to_value(&history[2].content).expect("json"),
        json!([{"type": "json", "value": {"agent": "helper", "answer": "4"}}])
    );
    // The child: its own thread and run, naming the parent.
    let runs = setup.store.list_runs(&child_thread()).await.expect("runs");
    assert_eq!(runs.len(), 1);
    assert!(
        runs[0].run_id.as_str().starts_with("child-awk1-"),
        "{:?}",
        runs[0].run_id
    );
    assert_eq!(
        runs[0].parent_run_id.as_ref().map(|r| r.as_str()),
        Some("run-1")
    );
    assert_eq!(&*runs[0].agent_id, "helper");
    let child = rt.history(&child_thread()).await.expect("child");
    assert_eq!(child[0].text(), "what is 2+2?");
    assert_eq!(
        setup.log.lines(),
        [
            "call_start helper d1",
            "call_complete helper",
            "return_start helper",
            "return_complete helper"
        ]
    );
}

#[tokio::test]
async fn a_failing_child_is_an_error_result_for_the_parent() {
    let setup = Setup::new(
        vec![delegate("fail"), ScriptTurn::text("it failed")],
        vec![ScriptTurn::error(awaken_llm::ScriptedError::new(
            awaken_llm::ScriptedErrorKind::InvalidRequest,
        ))],
    );
    let rt = setup.runtime();
    let out = rt
        .run_to_completion(RunActivation::new(thread(), "boss").with_user_message("ask"))
        .await
        .expect("run");
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
    let history = rt.history(&thread()).await.expect("history");
    assert!(
        history[2]
            .text()
            .starts_with("error: the delegate `helper` failed: inference failed"),
        "{}",
        history[2].text()
    );
    assert!(
        setup.log.lines()[1].starts_with("call_error helper"),
        "{:?}",
        setup.log.lines()
    );
}

#[tokio::test]
async fn a_child_suspension_suspends_the_parent_and_the_decision_is_forwarded() {
    let mut setup = Setup::new(
        vec![delegate("echo it"), ScriptTurn::text("boss done")],
        vec![
            ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("echo", json!({"text": "x"})).with_id("e1")),
            ScriptTurn::text("helper done"),
        ],
    );
    setup.helper_asks = true;
    let rt = setup.runtime();
    let out = rt
        .run_to_completion(RunActivation::new(thread(), "boss").with_user_message("ask"))
        .await
        .expect("run");
    assert_eq!(out.termination, TerminationReason::Suspended);
    // The parent's call waits with the child's question, shown as the child's call.
    let tickets = rt.waiting_calls(&thread()).await.expect("read");
    assert_eq!(tickets.len(), 1);
    assert_eq!(tickets[0].call.call_id.as_str(), "d1");
    assert_eq!(tickets[0].call.tool_name, "echo");
    assert!(
        tickets[0].message.starts_with("[helper] Allow `echo`"),
        "{}",
        tickets[0].message
    );
    let child_runs = setup.store.list_runs(&child_thread()).await.expect("runs");
    assert_eq!(child_runs[0].status, RunStatus::Waiting);
    // Approving the parent's call approves the child's: both finish.
    let done = rt
        .resume_to_completion(
            Resume::new(thread()).with_decision(ToolCallResume::approve(&tickets[0].call)),
        )
        .await
        .expect("resumed");
    assert_eq!(done.termination, TerminationReason::NaturalEnd);
    assert_eq!(done.response.as_deref(), Some("boss done"));
    let child = rt.history(&child_thread()).await.expect("child");
    assert_eq!(
        serde_json::to_value(&child[2].content).expect("json"),
        json!([{"type": "json", "value": {"echoed": "x"}}])
    );
    let history = rt.history(&thread()).await.expect("history");
    assert_eq!(
        serde_json::to_value(&history[2].content).expect("json"),
        json!([{"type": "json", "value": {"agent": "helper", "answer": "helper done"}}])
    );
    assert_eq!(
        setup.store.list_runs(&child_thread()).await.expect("runs")[0].status,
        RunStatus::Done
    );
}

#[tokio::test]
async fn cancelling_the_parent_cancels_the_child() {
    let setup = Setup::new(
        vec![delegate("wait"), ScriptTurn::text("never")],
        vec![
            ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("wait", json!({})).with_id("w1")),
        ],
    );
    let rt = setup.runtime();
    let cancel = CancellationToken::new();
    let run = {
        let rt = rt.clone();
        let mut activation = RunActivation::new(thread(), "boss").with_user_message("ask");
        activation.cancel = cancel.clone();
        tokio::spawn(async move { rt.run_to_completion(activation).await })
    };
    setup.started.notified().await;
    cancel.cancel();
    let out = run.await.expect("joined").expect("run");
    assert_eq!(out.termination, TerminationReason::Cancelled);
    let child = setup.store.list_runs(&child_thread()).await.expect("runs");
    assert_eq!(child[0].termination, Some(TerminationReason::Cancelled));
}

#[tokio::test]
async fn recovery_of_an_interrupted_delegate_call_continues_the_same_child() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    // Commits: boss start, requested, executing; the child's start; then the process dies.
    let mut dying = Setup::new(vec![delegate("think")], vec![ScriptTurn::text("thought")]);
    dying.store = Arc::new(crate::support::Intercepted::dies_after(store.clone(), 4));
    dying.system_ids = true;
    let first = crate::support::unwritten_end(
        dying
            .runtime()
            .run_to_completion(RunActivation::new(thread(), "boss").with_user_message("ask"))
            .await,
    );
    assert!(
        matches!(first, TerminationReason::Error { .. }),
        "{first:?}"
    );
    let child_before = store.list_runs(&child_thread()).await.expect("runs");
    assert_eq!(child_before.len(), 1);
    assert_eq!(child_before[0].status, RunStatus::Running);

    let mut fresh = Setup::new(
        vec![ScriptTurn::text("done")],
        vec![ScriptTurn::text("thought")],
    );
    fresh.store = store.clone();
    fresh.system_ids = true;
    let recovered = fresh
        .runtime()
        .recover(&RecoverConfig::new("w"), &awaken_event::NullSink)
        .await
        .expect("recover");
    assert_eq!(
        recovered.len(),
        1,
        "the parent; its child is continued through it"
    );
    let out = recovered
        .into_iter()
        .next()
        .expect("one")
        .outcome
        .expect("ok");
    assert_eq!(out.response.as_deref(), Some("done"));
    let child_after = store.list_runs(&child_thread()).await.expect("runs");
    assert_eq!(child_after.len(), 1, "the same child, not another");
    assert_eq!(child_after[0].run_id, child_before[0].run_id);
    assert_eq!(child_after[0].status, RunStatus::Done);
    let history = fresh.runtime().history(&thread()).await.expect("history");
    assert_eq!(
        serde_json::to_value(&history[2].content).expect("json"),
        json!([{"type": "json", "value": {"agent": "helper", "answer": "thought"}}])
    );
}

#[tokio::test]
async fn a_denial_on_the_parent_reaches_the_child() {
    let mut setup = Setup::new(
        vec![delegate("echo it"), ScriptTurn::text("boss done")],
        vec![
            ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("echo", json!({"text": "x"})).with_id("e1")),
            ScriptTurn::text("helper gave up"),
        ],
    );
    setup.helper_asks = true;
    let rt = setup.runtime();
    rt.run_to_completion(RunActivation::new(thread(), "boss").with_user_message("ask"))
        .await
        .expect("run");
    let tickets = rt.waiting_calls(&thread()).await.expect("read");
    let done = rt
        .resume_to_completion(
            Resume::new(thread())
                .with_decision(ToolCallResume::deny(&tickets[0].call).with_payload(json!("no"))),
        )
        .await
        .expect("resumed");
    assert_eq!(done.termination, TerminationReason::NaturalEnd);
    // The child's model saw the denial and answered; that answer is the parent's result.
    let child = rt.history(&child_thread()).await.expect("child");
    assert_eq!(child[2].text(), "error: denied by the user: no");
    let history = rt.history(&thread()).await.expect("history");
    assert_eq!(
        serde_json::to_value(&history[2].content).expect("json"),
        json!([{"type": "json", "value": {"agent": "helper", "answer": "helper gave up"}}])
    );
}

/// The boss asks before it delegates and the helper before its tool: approving the boss's
/// question starts the child, whose question then comes up on the boss's call; approving that
/// one reaches the child (the boss's gate let the call run before, and does not take the
/// child's question for its own), and both runs finish.
#[tokio::test]
async fn a_parent_that_asks_before_delegating_passes_its_childs_question_on() {
    let mut setup = Setup::new(
        vec![delegate("echo it"), ScriptTurn::text("boss done")],
        vec![
            ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("echo", json!({"text": "x"})).with_id("e1")),
            ScriptTurn::text("helper done"),
        ],
    );
    setup.helper_asks = true;
    let rt = setup.runtime_with_boss(
        AgentSpec::new("boss", "boss-model")
            .with_delegate("helper")
            .with_plugin("watcher")
            .with_plugin(PERMISSION_PLUGIN)
            .with_section("permission", json!({"default": "ask"})),
    );
    let first = rt
        .run_to_completion(RunActivation::new(thread(), "boss").with_user_message("ask"))
        .await
        .expect("run");
    assert_eq!(first.termination, TerminationReason::Suspended);
    let tickets = rt.waiting_calls(&thread()).await.expect("read");
    assert_eq!(tickets.len(), 1);
    assert_eq!(tickets[0].call.tool_name, delegate_tool_id("helper"));
    let second = rt
        .resume_to_completion(
            Resume::new(thread()).with_decision(ToolCallResume::approve(&tickets[0].call)),
        )
        .await
        .expect("resumed");
    assert_eq!(second.termination, TerminationReason::Suspended);
    let tickets = rt.waiting_calls(&thread()).await.expect("read");
    assert_eq!(tickets.len(), 1);
    assert_eq!(tickets[0].call.tool_name, "echo", "the child's question");
    let done = rt
        .resume_to_completion(
            Resume::new(thread()).with_decision(ToolCallResume::approve(&tickets[0].call)),
        )
        .await
        .expect("resumed");
    assert_eq!(done.termination, TerminationReason::NaturalEnd);
    assert_eq!(done.response.as_deref(), Some("boss done"));
    let child = rt.history(&child_thread()).await.expect("child");
    assert_eq!(
        serde_json::to_value(&child[2].content).expect("json"),
        json!([{"type": "json", "value": {"echoed": "x"}}])
    );
    assert_eq!(
        setup.store.list_runs(&child_thread()).await.expect("runs")[0].status,
        RunStatus::Done
    );
}
