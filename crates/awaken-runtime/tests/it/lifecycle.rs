//! Runtime lifecycle: start and shutdown hooks, their order with the run hooks, statistics;
//! shutdown waiting for or cancelling active runs; reload in the middle of a run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use awaken_event::{TerminationReason, ThreadId, ToolDescriptor};
use awaken_llm::{ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken_phase::{CommandExt, FnHook, Phase, PhaseContext};
use awaken_plugin::{
    LifecycleHook, Plugin, PluginError, PluginManifest, PluginRegistrar, PluginRegistry,
    RunLifecycle,
};
use awaken_runtime::{
    AddContextMessage, AgentRuntime, RunActivation, RunError, SequentialIds, ShutdownMode,
};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_state::StateCommand;
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use crate::support::*;

/// Logs every lifecycle hook it gets.
struct Recorder(PluginManifest, Log);

#[async_trait]
impl Plugin for Recorder {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, _r: &mut PluginRegistrar) -> Result<(), PluginError> {
        Ok(())
    }
    async fn on_runtime_start(&self) -> Result<(), PluginError> {
        self.1.push("runtime_start");
        Ok(())
    }
    async fn on_runtime_shutdown(&self) -> Result<(), PluginError> {
        self.1.push("runtime_shutdown");
        Ok(())
    }
    async fn on_run_start(&self, run: &RunLifecycle) -> Result<(), PluginError> {
        self.1.push(format!("run_start {}", run.run.thread_id));
        Ok(())
    }
    async fn on_run_complete(
        &self,
        run: &RunLifecycle,
        termination: &TerminationReason,
    ) -> Result<(), PluginError> {
        self.1
            .push(format!("run_complete {} {termination}", run.run.thread_id));
        Ok(())
    }
    async fn on_run_cancel(&self, run: &RunLifecycle) -> Result<(), PluginError> {
        self.1.push(format!("run_cancel {}", run.run.thread_id));
        Ok(())
    }
    async fn on_run_error(&self, run: &RunLifecycle, error: &str) -> Result<(), PluginError> {
        self.1
            .push(format!("run_error {} {error}", run.run.thread_id));
        Err(PluginError::Hook {
            plugin_id: "recorder".into(),
            hook: "on_run_error".into(),
            message: "counted as a failure".into(),
        })
    }
}

/// A tool that says it started (first notify), then waits until the test lets it go (second).
pub struct Gate(pub Arc<tokio::sync::Notify>, pub Arc<tokio::sync::Notify>);

#[async_trait]
impl Tool for Gate {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("gate", "Waits for the test")
    }
    async fn execute(
        &self,
        _args: &Value,
        _ctx: &ToolCallContext,
    ) -> Result<ToolOutput, ToolError> {
        self.0.notify_one();
        self.1.notified().await;
        Ok(ToolOutput::success(json!("through")))
    }
}

fn thread(name: &str) -> ThreadId {
    ThreadId::new(name).expect("id")
}

#[tokio::test]
async fn start_and_shutdown_hooks_frame_the_run_hooks_and_are_counted() {
    let log = Log::default();
    let executor = Arc::new(
        ScriptedExecutor::from_turns(vec![
            ScriptTurn::text("one"),
            // (run b is cancelled before it infers: no turn of its own)
            ScriptTurn::error(awaken_llm::ScriptedError::new(
                awaken_llm::ScriptedErrorKind::InvalidRequest,
            )),
        ])
        .expect("script"),
    );
    let rt = AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "scripted", "up"))
        .with_provider("scripted", executor)
        .with_plugin(Arc::new(Recorder(
            PluginManifest::new("recorder"),
            log.clone(),
        )))
        .with_agent_spec(AgentSpec::new("agent", "model").with_plugin("recorder"))
        .build()
        .expect("runtime");
    rt.start().await;
    rt.run_to_completion(RunActivation::new(thread("a"), "agent").with_user_message("hi"))
        .await
        .expect("run");
    let cancelled = RunActivation::new(thread("b"), "agent").with_user_message("hi");
    cancelled.handle().cancel();
    rt.run_to_completion(cancelled).await.expect("run");
    rt.run_to_completion(RunActivation::new(thread("c"), "agent").with_user_message("hi"))
        .await
        .expect("run");
    rt.shutdown(ShutdownMode::Wait).await;
    let lines = log.lines();
    assert_eq!(lines.first().map(String::as_str), Some("runtime_start"));
    assert_eq!(lines.last().map(String::as_str), Some("runtime_shutdown"));
    assert_eq!(
        lines[1..4],
        ["run_start a", "run_complete a natural_end", "run_start b"]
    );
    assert_eq!(lines[4], "run_cancel b");
    assert!(lines[6].starts_with("run_error c"), "{lines:?}");
    let stats = rt.lifecycle_stats();
    let of = |hook| stats[&("recorder".to_owned(), hook)];
    assert_eq!(of(LifecycleHook::RunStart).calls, 3);
    assert_eq!(of(LifecycleHook::RunError).failures, 1);
    assert_eq!(of(LifecycleHook::RuntimeShutdown).calls, 1);
}

fn gated_runtime(
    entered: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
) -> AgentRuntime {
    let executor = Arc::new(
        ScriptedExecutor::from_turns(vec![
            ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("gate", json!({})).with_id("c1")),
            ScriptTurn::text("done"),
        ])
        .expect("script"),
    );
    AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "scripted", "up"))
        .with_provider("scripted", executor)
        .with_tool(Arc::new(Gate(entered, release)))
        .with_agent_spec(AgentSpec::new("agent", "model"))
        .build()
        .expect("runtime")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_active_runs_and_refuses_new_ones() {
    let (entered, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let rt = gated_runtime(entered.clone(), release.clone());
    let run = {
        let rt = rt.clone();
        tokio::spawn(async move {
            rt.run_to_completion(RunActivation::new(thread("a"), "agent").with_user_message("hi"))
                .await
        })
    };
    entered.notified().await;
    assert_eq!(rt.active_runs(), 1);
    // Shutdown begins at its first poll (new runs are refused from then on) and waits.
    let mut shutdown = std::pin::pin!(rt.shutdown(ShutdownMode::Wait));
    let first = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::future::Future::poll(shutdown.as_mut(), cx))
    })
    .await;
    assert!(first.is_pending(), "a run is active");
    let refused = rt
        .run_to_completion(RunActivation::new(thread("b"), "agent").with_user_message("hi"))
        .await;
    assert!(
        matches!(refused, Err(RunError::ShuttingDown)),
        "{refused:?}"
    );
    release.notify_one();
    let out = run.await.expect("joined").expect("run");
    assert_eq!(
        out.termination,
        TerminationReason::NaturalEnd,
        "it was waited for"
    );
    shutdown.await;
    assert_eq!(rt.active_runs(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_can_cancel_active_runs() {
    let (entered, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let rt = gated_runtime(entered.clone(), release);
    let run = {
        let rt = rt.clone();
        tokio::spawn(async move {
            rt.run_to_completion(RunActivation::new(thread("a"), "agent").with_user_message("hi"))
                .await
        })
    };
    entered.notified().await;
    rt.shutdown(ShutdownMode::Cancel).await;
    let out = run.await.expect("joined").expect("run");
    assert_eq!(out.termination, TerminationReason::Cancelled);
}

/// Adds the context message `v<version>` to every request; the version is the registry's
/// generation when the plugin was built.
struct Versioned(PluginManifest, u32);

impl Plugin for Versioned {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        let version = self.1;
        r.register_phase_hook(
            Phase::BeforeInference,
            "tag",
            Arc::new(FnHook(move |_: &PhaseContext| {
                let mut cmd = StateCommand::new();
                cmd.schedule_action::<AddContextMessage>(format!("v{version}"))?;
                Ok(cmd)
            })),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_mid_run_changes_the_next_run_not_the_running_one() {
    let generation = Arc::new(AtomicU32::new(1));
    let g = generation.clone();
    let registry = Arc::new(
        PluginRegistry::from_configurator(move |set| {
            set.register_bundle(Arc::new(Versioned(
                PluginManifest::new("versioned"),
                g.load(Ordering::SeqCst),
            )));
            Ok(())
        })
        .expect("registry"),
    );
    let (entered, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let executor = Arc::new(
        ScriptedExecutor::from_turns(vec![
            // Run A, first step.
            ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("gate", json!({})).with_id("c1")),
            // Run B, while A is parked in its tool.
            ScriptTurn::text("b done"),
            // Run A, second step.
            ScriptTurn::text("a done"),
        ])
        .expect("script"),
    );
    let rt = AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "scripted", "up"))
        .with_provider("scripted", executor.clone())
        .with_tool(Arc::new(Gate(entered.clone(), release.clone())))
        .with_plugin_registry(registry)
        .with_agent_spec(AgentSpec::new("agent", "model").with_plugin("versioned"))
        .build()
        .expect("runtime");
    let a = {
        let rt = rt.clone();
        tokio::spawn(async move {
            rt.run_to_completion(RunActivation::new(thread("a"), "agent").with_user_message("hi"))
                .await
        })
    };
    entered.notified().await;
    generation.store(2, Ordering::SeqCst);
    rt.reload("r1").await.expect("reloaded");
    let b = rt
        .run_to_completion(RunActivation::new(thread("b"), "agent").with_user_message("hi"))
        .await
        .expect("run b");
    assert_eq!(b.response.as_deref(), Some("b done"));
    release.notify_one();
    let a = a.await.expect("joined").expect("run a");
    assert_eq!(a.response.as_deref(), Some("a done"));
    let tags: Vec<String> = executor
        .requests()
        .iter()
        .map(|r| r.messages.last().map(|m| m.text()).unwrap_or_default())
        .collect();
    assert_eq!(
        tags,
        ["v1", "v2", "v1"],
        "A kept its resolution; B saw the reload"
    );
}
