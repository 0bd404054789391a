//! A plugin that panics at an entry point the runtime calls: the panic comes back as the entry
//! point's typed error naming the plugin and the entry point, the run ends through its one exit
//! path with one `RunFinish` (or goes on, where that entry point's failures are isolated), and
//! the same runtime then runs again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use async_trait::async_trait;
use awaken_event::{
    AgentEvent, TerminationReason, ThreadId, ToolDescriptor, VecSink, check_activation,
};
use awaken_llm::{InferenceRequest, ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken_phase::{
    ActionHandler, CommandExt, EffectContext, EffectHandler, EffectSpec, FnHook, HookError, Phase,
    PhaseContext, ScheduledActionSpec,
};
use awaken_plugin::{
    ConfigSchema, EnvError, FnGate, InferenceRequestTransform, LifecycleHook, Plugin, PluginError,
    PluginManifest, PluginRegistrar, PluginRegistry, RegistryError, RunLifecycle, TransformContext,
    TransformError,
};
use awaken_resolver::ResolveError;
use awaken_runtime::{AgentRuntime, RunActivation, RunError, RunOutcome, SequentialIds};
use awaken_spec::{AgentSpec, ModelSpec, Sections};
use awaken_state::StateCommand;
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use crate::support::*;

/// The entry point where the plugin panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    Register,
    ConfigSchemas,
    OnActivate,
    Hook(Phase),
    Transform,
    Gate,
    Tool,
    Normalize,
    Action,
    Effect,
    Lifecycle(LifecycleHook),
    OnDeactivate,
}

/// Panics with `boom` the first time the plugin's code reaches `at`; harmless after that, so
/// the run after the panicking one goes through the same plugin.
#[derive(Clone)]
struct Trap {
    at: At,
    armed: Arc<AtomicBool>,
}

impl Trap {
    fn spring(&self, here: At) {
        if self.at == here && self.armed.swap(false, Ordering::SeqCst) {
            panic!("boom");
        }
    }
}

/// A scheduled action of `StepEnd`.
struct Chore;

impl ScheduledActionSpec for Chore {
    const KEY: &'static str = "test.chore";
    const PHASE: Phase = Phase::StepEnd;
    type Payload = String;
}

/// An effect.
struct Ping;

impl EffectSpec for Ping {
    const KEY: &'static str = "test.ping";
    type Payload = String;
}

struct Handles(Trap);

#[async_trait]
impl ActionHandler<Chore> for Handles {
    async fn handle(
        &self,
        _ctx: &PhaseContext,
        _payload: String,
    ) -> Result<StateCommand, HookError> {
        tokio::task::yield_now().await;
        self.0.spring(At::Action);
        Ok(StateCommand::new())
    }
}

#[async_trait]
impl EffectHandler<Ping> for Handles {
    async fn handle(&self, _ctx: &EffectContext, _payload: String) -> Result<(), HookError> {
        tokio::task::yield_now().await;
        self.0.spring(At::Effect);
        Ok(())
    }
}

impl InferenceRequestTransform for Handles {
    fn name(&self) -> &str {
        "transform"
    }
    fn transform(
        &self,
        request: InferenceRequest,
        _ctx: &TransformContext<'_>,
    ) -> Result<InferenceRequest, TransformError> {
        self.0.spring(At::Transform);
        Ok(request)
    }
}

#[async_trait]
impl Tool for Handles {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("fragile", "Panics once")
    }
    fn normalize_arguments(&self, _args: &Value) -> Result<Option<Value>, ToolError> {
        self.0.spring(At::Normalize);
        Ok(None)
    }
    async fn execute(
        &self,
        _args: &Value,
        _ctx: &ToolCallContext,
    ) -> Result<ToolOutput, ToolError> {
        tokio::task::yield_now().await;
        self.0.spring(At::Tool);
        Ok(ToolOutput::success(json!("fine")))
    }
}

/// The plugin `panicky`: contributes what its trap's entry point needs.
struct Panicky {
    manifest: PluginManifest,
    trap: Trap,
}

#[async_trait]
impl Plugin for Panicky {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        self.trap.spring(At::Register);
        let trap = self.trap.clone();
        match trap.at {
            At::Hook(phase) => r.register_phase_hook(
                phase,
                "hook",
                Arc::new(FnHook(move |_: &PhaseContext| {
                    trap.spring(At::Hook(phase));
                    Ok(StateCommand::new())
                })),
            )?,
            At::Transform => r.register_request_transform(Arc::new(Handles(trap))),
            At::Gate => r.register_tool_gate_hook(
                "gate",
                Arc::new(FnGate(move |_: &PhaseContext| {
                    trap.spring(At::Gate);
                    Ok(None)
                })),
            )?,
            At::Tool | At::Normalize => r.register_tool(Arc::new(Handles(trap)))?,
            At::Action => {
                r.register_scheduled_action::<Chore, _>(Handles(trap))?;
                r.register_phase_hook(
                    Phase::StepEnd,
                    "schedule",
                    Arc::new(FnHook(|_: &PhaseContext| {
                        let mut cmd = StateCommand::new();
                        cmd.schedule_action::<Chore>("sweep".into())?;
                        Ok(cmd)
                    })),
                )?;
            }
            At::Effect => {
                r.register_effect::<Ping, _>(Handles(trap))?;
                r.register_phase_hook(
                    Phase::StepEnd,
                    "emit",
                    Arc::new(FnHook(|_: &PhaseContext| {
                        let mut cmd = StateCommand::new();
                        cmd.emit::<Ping>("ping".into())?;
                        Ok(cmd)
                    })),
                )?;
            }
            _ => {}
        }
        Ok(())
    }
    fn config_schemas(&self) -> Vec<ConfigSchema> {
        self.trap.spring(At::ConfigSchemas);
        Vec::new()
    }
    fn on_activate(&self, _sections: &Sections) -> Result<Option<StateCommand>, PluginError> {
        self.trap.spring(At::OnActivate);
        Ok(None)
    }
    fn on_deactivate(&self) -> Result<Option<StateCommand>, PluginError> {
        self.trap.spring(At::OnDeactivate);
        Ok(None)
    }
    async fn on_run_start(&self, _run: &RunLifecycle) -> Result<(), PluginError> {
        tokio::task::yield_now().await;
        self.trap.spring(At::Lifecycle(LifecycleHook::RunStart));
        Ok(())
    }
    async fn on_run_complete(
        &self,
        _run: &RunLifecycle,
        _termination: &TerminationReason,
    ) -> Result<(), PluginError> {
        tokio::task::yield_now().await;
        self.trap.spring(At::Lifecycle(LifecycleHook::RunComplete));
        Ok(())
    }
}

/// A runtime whose agent uses `panicky`, and its model: the first run's `first` turns (a call,
/// then an answer), then the second run's answer. The trap is armed once the runtime is built
/// (building resolves the agent, which calls `register` and `config_schemas`).
fn runtime(at: At, first: usize) -> (AgentRuntime, Arc<ScriptedExecutor>) {
    let tool = if matches!(at, At::Tool | At::Normalize) {
        "fragile"
    } else {
        "echo"
    };
    let mut turns = vec![
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new(tool, json!({"text": "a"})).with_id("c1")),
        ScriptTurn::text("first"),
    ];
    turns.truncate(first);
    turns.push(ScriptTurn::text("second"));
    let executor = Arc::new(ScriptedExecutor::from_turns(turns).expect("script"));
    let armed = Arc::new(AtomicBool::new(false));
    let plugin = Panicky {
        manifest: PluginManifest::new("panicky"),
        trap: Trap {
            at,
            armed: armed.clone(),
        },
    };
    let rt = AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "scripted", "upstream-model"))
        .with_provider("scripted", executor.clone())
        .with_tool(Arc::new(Echo))
        .with_plugin(Arc::new(plugin))
        .with_agent_spec(AgentSpec::new("agent", "model").with_plugin("panicky"))
        .build()
        .expect("runtime");
    armed.store(true, Ordering::SeqCst);
    (rt, executor)
}

/// Runs on `thread`; checks the events against the grammar and that a run that started ended
/// with exactly one `RunFinish` (and a refused one emitted nothing).
async fn run(rt: &AgentRuntime, thread: &str) -> (Result<RunOutcome, RunError>, Vec<AgentEvent>) {
    let sink = VecSink::new();
    let activation =
        RunActivation::new(ThreadId::new(thread).expect("id"), "agent").with_user_message("hi");
    let result = rt.run(activation, &sink).await;
    let events = sink.events();
    if result.is_err() {
        assert!(events.is_empty(), "a refused run emits nothing");
        return (result, events);
    }
    if let Err(v) = check_activation(&events) {
        panic!("event grammar violated: {v}\n{}", render(&events));
    }
    let finishes = events
        .iter()
        .filter(|e| matches!(e, AgentEvent::RunFinish { .. }))
        .count();
    assert_eq!(finishes, 1, "one RunFinish\n{}", render(&events));
    (result, events)
}

/// The first run's outcome: how it ended and what it reported (errors, warnings, dead
/// letters, closed calls), or why it was refused.
fn summary(result: &Result<RunOutcome, RunError>, events: &[AgentEvent]) -> String {
    match result {
        Err(e) => format!("refused: {e}"),
        Ok(outcome) => {
            let mut out = format!("ended: {}", outcome.termination);
            for line in render(events).lines() {
                if ["error ", "warning ", "dead_letter ", "call_done "]
                    .iter()
                    .any(|p| line.starts_with(p))
                {
                    out.push('\n');
                    out.push_str(line);
                }
            }
            out
        }
    }
}

#[tokio::test]
async fn a_panic_at_any_entry_point_is_a_typed_error_and_the_runtime_runs_again() {
    // (where, inferences of the first run, its outcome)
    let rows: Vec<(At, usize, &str)> = vec![
        (
            At::Register,
            0,
            "refused: agent `agent`: plugin `panicky`: register panicked: boom",
        ),
        (
            At::ConfigSchemas,
            0,
            "refused: agent `agent`: plugin `panicky`: config_schemas panicked: boom",
        ),
        (
            At::OnActivate,
            0,
            "ended: error: plugin `panicky`: on_activate panicked: boom\n\
             error plugin `panicky`: on_activate panicked: boom",
        ),
        (
            At::Hook(Phase::RunStart),
            0,
            "ended: error: hook `hook` of plugin `panicky` panicked in run_start: boom\n\
             error hook `hook` of plugin `panicky` panicked in run_start: boom",
        ),
        (
            At::Hook(Phase::BeforeInference),
            0,
            "ended: error: hook `hook` of plugin `panicky` panicked in before_inference: boom\n\
             error hook `hook` of plugin `panicky` panicked in before_inference: boom",
        ),
        (
            At::Hook(Phase::RunEnd),
            2,
            "ended: error: hook `hook` of plugin `panicky` panicked in run_end: boom\n\
             call_done c1 succeeded {\"echoed\":\"a\"}\n\
             error hook `hook` of plugin `panicky` panicked in run_end: boom\n\
             error hook `hook` of plugin `panicky` panicked in run_end: boom",
        ),
        (
            At::Transform,
            0,
            "ended: error: request transform `transform` of plugin `panicky` failed: panicked: boom\n\
             error request transform `transform` of plugin `panicky` failed: panicked: boom",
        ),
        (
            At::Gate,
            1,
            "ended: error: tool gate of `panicky/gate` panicked on call `c1`: boom\n\
             call_done c1 cancelled \"not finished: the run failed\"\n\
             error tool gate of `panicky/gate` panicked on call `c1`: boom",
        ),
        (
            At::Tool,
            2,
            "ended: natural_end\n\
             call_done c1 failed \"tool `fragile` panicked: boom\"",
        ),
        // Before any gate, as an argument without a canonical form: the tool never runs.
        (
            At::Normalize,
            2,
            "ended: natural_end\n\
             call_done c1 blocked \"tool `fragile` panicked: boom\"",
        ),
        (
            At::Action,
            2,
            "ended: natural_end\n\
             dead_letter test.chore: plugin `panicky`: handler of `test.chore` panicked: boom\n\
             call_done c1 succeeded {\"echoed\":\"a\"}",
        ),
        (
            At::Effect,
            2,
            "ended: natural_end\n\
             warning HandlerFailed: the handler of effect `test.ping` (plugin `panicky`) failed: panicked: boom\n\
             call_done c1 succeeded {\"echoed\":\"a\"}",
        ),
        (
            At::Lifecycle(LifecycleHook::RunStart),
            2,
            "ended: natural_end\n\
             call_done c1 succeeded {\"echoed\":\"a\"}",
        ),
        (
            At::Lifecycle(LifecycleHook::RunComplete),
            2,
            "ended: natural_end\n\
             call_done c1 succeeded {\"echoed\":\"a\"}",
        ),
        (
            At::OnDeactivate,
            2,
            "ended: natural_end\n\
             call_done c1 succeeded {\"echoed\":\"a\"}\n\
             error plugin `panicky`: on_deactivate panicked: boom",
        ),
    ];
    for (at, inferences, expected) in rows {
        let (rt, executor) = runtime(at, inferences);
        let (result, events) = run(&rt, "first").await;
        assert_eq!(summary(&result, &events), expected, "{at:?}");
        assert_eq!(
            executor.remaining(),
            1,
            "{at:?}: the first run inferred {inferences} times"
        );
        match at {
            // Refused before the run began: the environment build's typed error.
            At::Register | At::ConfigSchemas => {
                let entry = if at == At::Register {
                    "register"
                } else {
                    "config_schemas"
                };
                assert!(
                    matches!(
                        &result,
                        Err(RunError::Resolve(ResolveError::Env {
                            source: EnvError::Plugin(PluginError::Panicked { plugin_id, entry_point, message }),
                            ..
                        })) if plugin_id == "panicky" && entry_point == entry && message == "boom"
                    ),
                    "{result:?}"
                );
            }
            // Observational: counted and kept as the hook's typed failure; the run went on.
            At::Lifecycle(hook) => {
                assert_eq!(
                    rt.lifecycle_stats()[&("panicky".to_owned(), hook)].failures,
                    1
                );
                let failure = rt.lifecycle_failure("panicky", hook).expect("kept");
                assert!(
                    matches!(
                        &*failure,
                        PluginError::Panicked { plugin_id, entry_point, message }
                            if plugin_id == "panicky" && entry_point == hook.as_str() && message == "boom"
                    ),
                    "{failure:?}"
                );
            }
            _ => {}
        }
        // The same runtime, and the same plugin, run again.
        let (second, _) = run(&rt, "second").await;
        let second = second.unwrap_or_else(|e| panic!("{at:?}: the second run starts: {e}"));
        assert_eq!(second.termination, TerminationReason::NaturalEnd, "{at:?}");
        assert_eq!(second.response.as_deref(), Some("second"), "{at:?}");
        assert_eq!(executor.remaining(), 0, "{at:?}");
    }
}

/// The plugin `reloading` of registry generation `generation`: stamps the generation on every
/// request's system prompt; its `on_reload` panics when `explode` is set.
struct Reloading {
    manifest: PluginManifest,
    generation: u32,
    explode: Arc<AtomicBool>,
}

struct Stamp(u32);

impl InferenceRequestTransform for Stamp {
    fn name(&self) -> &str {
        "stamp"
    }
    fn transform(
        &self,
        mut request: InferenceRequest,
        _ctx: &TransformContext<'_>,
    ) -> Result<InferenceRequest, TransformError> {
        request.system_prompt = Some(format!("generation {}", self.0).into());
        Ok(request)
    }
}

#[async_trait]
impl Plugin for Reloading {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_request_transform(Arc::new(Stamp(self.generation)));
        Ok(())
    }
    async fn on_reload(&self, _reload_id: &str) -> Result<(), PluginError> {
        tokio::task::yield_now().await;
        if self.explode.load(Ordering::SeqCst) {
            panic!("reload boom");
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_panicking_on_reload_fails_the_reload_and_the_old_plugins_stay_active() {
    let generation = Arc::new(AtomicU32::new(1));
    let explode = Arc::new(AtomicBool::new(false));
    let (g, e) = (generation.clone(), explode.clone());
    let registry = Arc::new(
        PluginRegistry::from_configurator(move |set| {
            set.register_bundle(Arc::new(Reloading {
                manifest: PluginManifest::new("reloading"),
                generation: g.load(Ordering::SeqCst),
                explode: e.clone(),
            }));
            Ok(())
        })
        .expect("registry"),
    );
    let executor = Arc::new(
        ScriptedExecutor::from_turns(vec![ScriptTurn::text("one"), ScriptTurn::text("two")])
            .expect("script"),
    );
    let rt = AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "scripted", "upstream-model"))
        .with_provider("scripted", executor.clone())
        .with_plugin_registry(registry.clone())
        .with_agent_spec(AgentSpec::new("agent", "model").with_plugin("reloading"))
        .build()
        .expect("runtime");
    generation.store(2, Ordering::SeqCst);
    explode.store(true, Ordering::SeqCst);
    let err = rt.reload("r1").await.expect_err("the plugin panics");
    let RegistryError::ReloadFailed {
        reload_id,
        failures,
    } = &err
    else {
        panic!("not a reload failure: {err:?}");
    };
    assert_eq!(reload_id, "r1");
    assert!(
        matches!(
            failures.as_slice(),
            [PluginError::Panicked { plugin_id, entry_point, message }]
                if plugin_id == "reloading" && entry_point == "on_reload" && message == "reload boom"
        ),
        "{failures:?}"
    );
    assert_eq!(
        err.to_string(),
        "reload `r1` failed, the previous plugins stay active: plugin `reloading`: on_reload panicked: reload boom"
    );
    assert_eq!(registry.snapshot().version, 1, "the old snapshot stays");
    let (first, _) = run(&rt, "after-failed-reload").await;
    assert_eq!(
        first.expect("runs").termination,
        TerminationReason::NaturalEnd
    );

    // The reload goes through once nothing panics.
    explode.store(false, Ordering::SeqCst);
    rt.reload("r1").await.expect("reloads");
    let (second, _) = run(&rt, "after-reload").await;
    assert_eq!(second.expect("runs").response.as_deref(), Some("two"));
    let prompts: Vec<String> = executor
        .requests()
        .iter()
        .map(|r| r.system_prompt.as_deref().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        prompts,
        ["generation 1", "generation 2"],
        "the failed reload kept generation 1 active"
    );
}

#[tokio::test]
async fn a_panicking_runtime_hook_is_counted_and_start_and_shutdown_return() {
    struct Starting(PluginManifest);

    #[async_trait]
    impl Plugin for Starting {
        fn manifest(&self) -> &PluginManifest {
            &self.0
        }
        fn register(&self, _r: &mut PluginRegistrar) -> Result<(), PluginError> {
            Ok(())
        }
        async fn on_runtime_start(&self) -> Result<(), PluginError> {
            panic!("start boom")
        }
        async fn on_runtime_shutdown(&self) -> Result<(), PluginError> {
            tokio::task::yield_now().await;
            panic!("shutdown boom")
        }
    }

    let executor =
        Arc::new(ScriptedExecutor::from_turns(vec![ScriptTurn::text("ran")]).expect("script"));
    let rt = AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "scripted", "upstream-model"))
        .with_provider("scripted", executor)
        .with_plugin(Arc::new(Starting(PluginManifest::new("starting"))))
        .with_agent_spec(AgentSpec::new("agent", "model").with_plugin("starting"))
        .build()
        .expect("runtime");
    rt.start().await;
    let (ran, _) = run(&rt, "t").await;
    assert_eq!(ran.expect("runs").response.as_deref(), Some("ran"));
    rt.shutdown(awaken_runtime::ShutdownMode::Wait).await;
    for (hook, message) in [
        (LifecycleHook::RuntimeStart, "start boom"),
        (LifecycleHook::RuntimeShutdown, "shutdown boom"),
    ] {
        assert_eq!(
            rt.lifecycle_stats()[&("starting".to_owned(), hook)].failures,
            1
        );
        assert_eq!(
            rt.lifecycle_failure("starting", hook)
                .map(|e| e.to_string()),
            Some(format!(
                "plugin `starting`: {} panicked: {message}",
                hook.as_str()
            ))
        );
    }
}

#[tokio::test]
async fn a_plugin_panicking_while_the_runtime_is_built_fails_the_build_typed() {
    for (at, entry) in [
        (At::Register, "register"),
        (At::ConfigSchemas, "config_schemas"),
    ] {
        let panicky = || Panicky {
            manifest: PluginManifest::new("panicky"),
            trap: Trap {
                at,
                armed: Arc::new(AtomicBool::new(true)),
            },
        };
        let builder = |plugin: Panicky| {
            AgentRuntime::builder()
                .with_model(ModelSpec::new("model", "scripted", "upstream-model"))
                .with_provider(
                    "scripted",
                    Arc::new(
                        ScriptedExecutor::from_turns(vec![ScriptTurn::text("ran")])
                            .expect("script"),
                    ),
                )
                .with_plugin(Arc::new(plugin))
                .with_agent_spec(AgentSpec::new("agent", "model").with_plugin("panicky"))
        };
        let err = builder(panicky()).build().expect_err(entry);
        assert!(
            err.to_string().contains(&format!(
                "agent `agent`: plugin `panicky`: {entry} panicked: boom"
            )),
            "{err}"
        );
        // The same setup builds and runs when the plugin does not panic.
        let calm = panicky();
        calm.trap.armed.store(false, Ordering::SeqCst);
        let rt = builder(calm).build().expect("builds");
        let (ran, _) = run(&rt, "t").await;
        assert_eq!(ran.expect("runs").response.as_deref(), Some("ran"));
    }
}

/// Panics when dropped.
struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("cleanup blew up");
    }
}

/// A `BeforeInference` hook that cancels its run, then waits for ever holding a value whose
/// drop panics: the cancelled run abandons it.
struct Stalls;

#[async_trait]
impl awaken_phase::PhaseHook for Stalls {
    async fn run(&self, ctx: &PhaseContext) -> Result<StateCommand, HookError> {
        let _held = PanicsOnDrop;
        ctx.cancel.cancel();
        std::future::pending::<()>().await;
        Ok(StateCommand::new())
    }
}

struct Staller(PluginManifest);

impl Plugin for Staller {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_phase_hook(Phase::BeforeInference, "stall", Arc::new(Stalls))
    }
}

#[tokio::test]
async fn a_hook_whose_cleanup_panics_when_its_cancelled_run_abandons_it_stays_inside() {
    let out = Scenario::new(vec![ScriptTurn::text("never")])
        .plugin(Arc::new(Staller(PluginManifest::new("staller"))))
        .run()
        .await;
    assert_eq!(out.outcome.termination, TerminationReason::Cancelled);
    let finishes = out
        .events
        .iter()
        .filter(|e| matches!(e, AgentEvent::RunFinish { .. }))
        .count();
    assert_eq!(finishes, 1);
}
