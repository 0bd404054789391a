//! Plugin code that panics: at every entry point this crate calls, the panic comes back as the
//! entry point's typed error naming the plugin, the entry point and the panic message.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use awaken_event::{RunId, TerminationReason, ThreadId, ToolCall, ToolCallId};
use awaken_llm::InferenceRequest;
use awaken_phase::{HookError, Phase, PhaseContext, RunIdentity, ToolPhaseInfo};
use awaken_plugin::*;
use awaken_state::{KeyRegistry, StateCommand, StateStore};
use awaken_tool::{PolicyDecision, ToolInterceptPayload};
use serde_json::{Value, json};

use crate::support::*;

/// A plugin that panics in the method named `at` (after a yield, for the async ones: the
/// panic comes from a later poll than the first), with the message `<at> blew up`.
struct Exploding {
    manifest: PluginManifest,
    at: &'static str,
}

impl Exploding {
    fn arc(id: &str, at: &'static str) -> Arc<dyn Plugin> {
        Arc::new(Self {
            manifest: PluginManifest::new(id),
            at,
        })
    }

    fn check(&self, here: &str) {
        if self.at == here {
            panic!("{here} blew up");
        }
    }

    async fn check_later(&self, here: &str) -> Result<(), PluginError> {
        tokio::task::yield_now().await;
        self.check(here);
        Ok(())
    }
}

#[async_trait]
impl Plugin for Exploding {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }
    fn register(&self, _r: &mut PluginRegistrar) -> Result<(), PluginError> {
        self.check("register");
        Ok(())
    }
    fn config_schemas(&self) -> Vec<ConfigSchema> {
        self.check("config_schemas");
        Vec::new()
    }
    fn agent_definitions(
        &self,
        _ctx: &mut AgentBuildContext,
    ) -> Result<Vec<AgentDefinition>, PluginError> {
        self.check("agent_definitions");
        Ok(Vec::new())
    }
    fn lifecycle_hooks(&self) -> LifecycleHooks {
        self.check("lifecycle_hooks");
        LifecycleHooks::ALL
    }
    async fn on_runtime_start(&self) -> Result<(), PluginError> {
        self.check_later("on_runtime_start").await
    }
    async fn on_runtime_shutdown(&self) -> Result<(), PluginError> {
        self.check_later("on_runtime_shutdown").await
    }
    async fn on_run_start(&self, _run: &RunLifecycle) -> Result<(), PluginError> {
        self.check_later("on_run_start").await
    }
    async fn on_run_complete(
        &self,
        _run: &RunLifecycle,
        _termination: &TerminationReason,
    ) -> Result<(), PluginError> {
        self.check_later("on_run_complete").await
    }
    async fn on_run_error(&self, _run: &RunLifecycle, _error: &str) -> Result<(), PluginError> {
        self.check_later("on_run_error").await
    }
    async fn on_run_cancel(&self, _run: &RunLifecycle) -> Result<(), PluginError> {
        self.check_later("on_run_cancel").await
    }
    async fn on_delegate_call_start(&self, _call: &DelegateCall) -> Result<(), PluginError> {
        self.check_later("on_delegate_call_start").await
    }
    async fn on_delegate_call_complete(
        &self,
        _call: &DelegateCall,
        _response: &str,
    ) -> Result<(), PluginError> {
        self.check_later("on_delegate_call_complete").await
    }
    async fn on_delegate_call_error(
        &self,
        _call: &DelegateCall,
        _error: &str,
    ) -> Result<(), PluginError> {
        self.check_later("on_delegate_call_error").await
    }
    async fn on_delegate_return_start(&self, _call: &DelegateCall) -> Result<(), PluginError> {
        self.check_later("on_delegate_return_start").await
    }
    async fn on_delegate_return_complete(&self, _call: &DelegateCall) -> Result<(), PluginError> {
        self.check_later("on_delegate_return_complete").await
    }
    async fn on_delegate_return_error(
        &self,
        _call: &DelegateCall,
        _error: &str,
    ) -> Result<(), PluginError> {
        self.check_later("on_delegate_return_error").await
    }
    async fn on_reload(&self, _reload_id: &str) -> Result<(), PluginError> {
        self.check_later("on_reload").await
    }
}

fn identity() -> Arc<RunIdentity> {
    Arc::new(RunIdentity {
        thread_id: ThreadId::new("t").expect("id"),
        run_id: RunId::new("r").expect("id"),
        agent_id: "a".into(),
        profile_id: None,
    })
}

#[tokio::test]
async fn a_panicking_lifecycle_hook_is_a_counted_failure_and_the_next_plugin_still_runs() {
    let run = RunLifecycle {
        run: identity(),
        resumed: false,
        parent_run_id: None,
    };
    let call = DelegateCall {
        parent: identity(),
        call_id: ToolCallId::new("c1").expect("id"),
        agent_id: "helper".into(),
        child_run_id: RunId::new("child").expect("id"),
    };
    let ended = TerminationReason::NaturalEnd;
    for hook in LifecycleHook::ALL {
        let event = match hook {
            LifecycleHook::RuntimeStart => LifecycleEvent::RuntimeStart,
            LifecycleHook::RuntimeShutdown => LifecycleEvent::RuntimeShutdown,
            LifecycleHook::RunStart => LifecycleEvent::RunStart(&run),
            LifecycleHook::RunComplete => LifecycleEvent::RunComplete(&run, &ended),
            LifecycleHook::RunError => LifecycleEvent::RunError(&run, "failed"),
            LifecycleHook::RunCancel => LifecycleEvent::RunCancel(&run),
            LifecycleHook::DelegateCallStart => LifecycleEvent::DelegateCallStart(&call),
            LifecycleHook::DelegateCallComplete => {
                LifecycleEvent::DelegateCallComplete(&call, "done")
            }
            LifecycleHook::DelegateCallError => LifecycleEvent::DelegateCallError(&call, "failed"),
            LifecycleHook::DelegateReturnStart => LifecycleEvent::DelegateReturnStart(&call),
            LifecycleHook::DelegateReturnComplete => LifecycleEvent::DelegateReturnComplete(&call),
            LifecycleHook::DelegateReturnError => {
                LifecycleEvent::DelegateReturnError(&call, "failed")
            }
        };
        let name = hook.as_str();
        let plugins = vec![
            Exploding::arc("exploding", name),
            TestPlugin::new("after").arc(),
        ];
        let dispatcher = LifecycleDispatcher::default();
        dispatcher.dispatch(&plugins, event).await;
        let s = dispatcher.stats("exploding", hook);
        assert_eq!((s.calls, s.failures, s.timeouts), (1, 1, 0), "{name}");
        assert_eq!(
            dispatcher
                .last_failure("exploding", hook)
                .map(|e| e.to_string()),
            Some(format!(
                "plugin `exploding`: {name} panicked: {name} blew up"
            )),
        );
        let after = dispatcher.stats("after", hook);
        assert_eq!(
            (after.calls, after.failures),
            (1, 0),
            "{name}: the next plugin ran"
        );
        assert!(dispatcher.last_failure("after", hook).is_none());
    }
}

#[tokio::test]
async fn a_panicking_hook_set_counts_as_a_failed_call_of_the_dispatched_hook() {
    let plugins = vec![
        Exploding::arc("exploding", "lifecycle_hooks"),
        TestPlugin::new("after").arc(),
    ];
    let dispatcher = LifecycleDispatcher::default();
    dispatcher
        .dispatch(&plugins, LifecycleEvent::RuntimeStart)
        .await;
    let s = dispatcher.stats("exploding", LifecycleHook::RuntimeStart);
    assert_eq!((s.calls, s.failures), (1, 1));
    let failure = dispatcher
        .last_failure("exploding", LifecycleHook::RuntimeStart)
        .expect("kept");
    assert!(
        matches!(
            &*failure,
            PluginError::Panicked { plugin_id, entry_point, message }
                if plugin_id == "exploding"
                    && entry_point == "lifecycle_hooks"
                    && message == "lifecycle_hooks blew up"
        ),
        "{failure}"
    );
    assert_eq!(
        dispatcher.stats("after", LifecycleHook::RuntimeStart).calls,
        1
    );
}

#[test]
fn a_panicking_register_or_config_schemas_fails_the_environment_build() {
    for at in ["register", "config_schemas"] {
        let plugins = vec![
            TestPlugin::new("before").arc(),
            Exploding::arc("exploding", at),
        ];
        let err = ExecutionEnv::from_plugins(&plugins, &[], &[]).expect_err(at);
        assert!(
            matches!(
                &err,
                EnvError::Plugin(PluginError::Panicked { plugin_id, entry_point, .. })
                    if plugin_id == "exploding" && entry_point == at
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("plugin `exploding`: {at} panicked: {at} blew up")
        );
        // The same plugins build once the plugin no longer panics.
        let calm = vec![
            TestPlugin::new("before").arc(),
            Exploding::arc("exploding", "nowhere"),
        ];
        assert!(ExecutionEnv::from_plugins(&calm, &[], &[]).is_ok());
    }
}

#[test]
fn panicking_agent_definitions_refuse_that_plugins_batch_only() {
    let good = TestPlugin::new("good")
        .defining(|_| Ok(vec![AgentDefinition::new(agent("helper", "Helps."))]))
        .arc();
    let registry =
        PluginRegistry::from_plugins(vec![good, Exploding::arc("exploding", "agent_definitions")])
            .expect("registry");
    let configs = registry.build_agent_configs();
    assert_eq!(
        configs.agents.keys().cloned().collect::<Vec<_>>(),
        ["helper"]
    );
    let rejected: Vec<String> = configs.rejected.iter().map(|e| e.to_string()).collect();
    assert_eq!(
        rejected,
        ["plugin `exploding`: agent_definitions panicked: agent_definitions blew up"]
    );
}

#[tokio::test]
async fn a_panicking_on_reload_fails_the_reload_and_keeps_the_old_plugins() {
    let generation = Arc::new(AtomicUsize::new(0));
    let explode = Arc::new(AtomicBool::new(false));
    let (g, e) = (generation.clone(), explode.clone());
    let registry = PluginRegistry::from_configurator(move |set| {
        let n = g.fetch_add(1, Ordering::SeqCst);
        let spec = agent("assistant", &format!("generation {n}"));
        set.register_bundle(
            TestPlugin::new("versioned")
                .defining(move |_| Ok(vec![AgentDefinition::new(spec.clone())]))
                .arc(),
        );
        let at = if e.load(Ordering::SeqCst) {
            "on_reload"
        } else {
            "nowhere"
        };
        set.register_bundle(Exploding::arc("exploding", at));
        Ok(())
    })
    .expect("registry");
    let prompt = |registry: &PluginRegistry| {
        registry.build_agent_configs().agents["assistant"]
            .spec
            .system_prompt
            .clone()
    };
    assert_eq!(prompt(&registry), "generation 0");

    explode.store(true, Ordering::SeqCst);
    let err = registry.reload("r1").await.expect_err("a plugin panics");
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
                if plugin_id == "exploding"
                    && entry_point == "on_reload"
                    && message == "on_reload blew up"
        ),
        "{failures:?}"
    );
    assert_eq!(prompt(&registry), "generation 0", "the old plugins stay");
    assert_eq!(registry.snapshot().version, 1);

    // The same reload id is tried again (it was never applied), and succeeds once nothing panics.
    explode.store(false, Ordering::SeqCst);
    assert_eq!(
        registry.reload("r1").await.expect("reloads"),
        ReloadOutcome::Applied { version: 2 }
    );
    assert_eq!(prompt(&registry), "generation 2");
}

/// A transform that panics.
struct Explodes;

impl InferenceRequestTransform for Explodes {
    fn name(&self) -> &str {
        "explodes"
    }
    fn transform(
        &self,
        _request: InferenceRequest,
        _ctx: &TransformContext<'_>,
    ) -> Result<InferenceRequest, TransformError> {
        panic!("the transform blew up")
    }
}

/// A transform that counts its calls.
struct Counts(Arc<AtomicUsize>);

impl InferenceRequestTransform for Counts {
    fn name(&self) -> &str {
        "counts"
    }
    fn transform(
        &self,
        request: InferenceRequest,
        _ctx: &TransformContext<'_>,
    ) -> Result<InferenceRequest, TransformError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(request)
    }
}

#[test]
fn a_panicking_transform_fails_typed_and_the_later_ones_do_not_run() {
    let later = Arc::new(AtomicUsize::new(0));
    let counter = later.clone();
    let plugins = vec![
        TestPlugin::new("guard")
            .registering(|r| {
                r.register_request_transform(Arc::new(Explodes));
                Ok(())
            })
            .arc(),
        TestPlugin::new("after")
            .registering(move |r| {
                r.register_request_transform(Arc::new(Counts(counter.clone())));
                Ok(())
            })
            .arc(),
    ];
    let env = ExecutionEnv::from_plugins(&plugins, &[], &[]).expect("env");
    let snapshot = StateStore::new(KeyRegistry::new()).snapshot();
    let run = identity();
    let ctx = TransformContext {
        snapshot: &snapshot,
        run: &run,
        step: 1,
        tokens: TokenCounts::default(),
    };
    let err = apply_transforms(
        env.transforms(),
        InferenceRequest::new("m", Vec::new()),
        &ctx,
    )
    .expect_err("panicked");
    assert_eq!(
        (err.plugin_id.as_str(), err.transform.as_str()),
        ("guard", "explodes")
    );
    assert!(
        matches!(&err.source, TransformError::Panicked { message } if message == "the transform blew up")
    );
    assert_eq!(
        err.to_string(),
        "request transform `explodes` of plugin `guard` failed: panicked: the transform blew up"
    );
    assert_eq!(later.load(Ordering::SeqCst), 0);
    // The environment is not spoiled: the next request goes through both (the first one
    // panics again, so it is left out here).
    let filtered = ExecutionEnv::from_plugins(&plugins, &[], &["after".into()]).expect("env");
    apply_transforms(
        filtered.transforms(),
        InferenceRequest::new("m", Vec::new()),
        &ctx,
    )
    .expect("no panic");
    assert_eq!(later.load(Ordering::SeqCst), 1);
}

/// A gate that panics after a yield (from a later poll than its first).
struct PanicsLater;

#[async_trait]
impl ToolGateHook for PanicsLater {
    async fn decide(&self, _ctx: &PhaseContext) -> Result<Option<ToolInterceptPayload>, HookError> {
        tokio::task::yield_now().await;
        panic!("the gate blew up later")
    }
}

/// A gate that panics while making its future (written out without `#[async_trait]`).
struct PanicsEarly;

impl ToolGateHook for PanicsEarly {
    fn decide<'life0, 'life1, 'async_trait>(
        &'life0 self,
        _ctx: &'life1 PhaseContext,
    ) -> Pin<
        Box<
            dyn Future<Output = Result<Option<ToolInterceptPayload>, HookError>>
                + Send
                + 'async_trait,
        >,
    >
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        panic!("the gate blew up early")
    }
}

/// A policy whose `applies_to` panics.
struct PanickyPolicy;

impl ToolPolicyHook for PanickyPolicy {
    type Args = Value;
    fn applies_to(&self, _tool_name: &str) -> bool {
        panic!("the policy blew up")
    }
    fn decide(
        &self,
        _call: &ToolCall,
        _args: Value,
        _ctx: &PhaseContext,
    ) -> Result<PolicyDecision, HookError> {
        Ok(PolicyDecision::Allow)
    }
}

#[tokio::test]
async fn a_panicking_gate_fails_the_evaluation_naming_the_gate_and_the_call() {
    let call = ToolCall::new(ToolCallId::new("c1").expect("id"), "rm", json!({}));
    let ctx = PhaseContext::new(
        Phase::ToolGate,
        StateStore::new(KeyRegistry::new()).snapshot(),
        identity(),
    )
    .with_tool(ToolPhaseInfo {
        call,
        result: None,
        resume: None,
        asked_while_running: false,
    });
    let gates: Vec<(&str, Arc<dyn ToolGateHook>, &str)> = vec![
        (
            "p/sync",
            Arc::new(FnGate(|_: &PhaseContext| -> Result<_, HookError> {
                panic!("the gate blew up at once")
            })),
            "the gate blew up at once",
        ),
        ("p/later", Arc::new(PanicsLater), "the gate blew up later"),
        ("p/early", Arc::new(PanicsEarly), "the gate blew up early"),
        (
            "p/policy",
            Arc::new(PolicyGate(PanickyPolicy)),
            "the policy blew up",
        ),
    ];
    for (source, gate, expected) in gates {
        let hooks: Vec<(String, Arc<dyn ToolGateHook>)> = vec![
            (
                "p/allow".into(),
                Arc::new(FnGate(|_: &PhaseContext| Ok(None))),
            ),
            (source.into(), gate),
        ];
        let err = evaluate_gates(&hooks, &ctx).await.expect_err(source);
        assert!(
            matches!(
                &err,
                GateError::Panicked { source_id, call_id, message }
                    if source_id == source && call_id.as_str() == "c1" && message == expected
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("tool gate of `{source}` panicked on call `c1`: {expected}")
        );
    }
}

#[test]
fn isolate_names_the_plugin_and_entry_point_and_passes_values_through() {
    assert_eq!(isolate("p", "on_activate", || 7).expect("no panic"), 7);
    let err = isolate("p", "on_activate", || -> Option<StateCommand> {
        panic!("activation blew up {}", 42)
    })
    .expect_err("panicked");
    assert_eq!(
        err.to_string(),
        "plugin `p`: on_activate panicked: activation blew up 42"
    );
}

#[tokio::test]
async fn isolate_async_covers_every_poll_of_the_future() {
    let done = isolate_async("p", "on_reload", async { 7 }).await;
    assert_eq!(done.expect("no panic"), 7);
    let err = isolate_async("p", "on_reload", async {
        tokio::task::yield_now().await;
        panic!("blew up on the second poll")
    })
    .await
    .expect_err("panicked");
    assert!(
        matches!(
            &err,
            PluginError::Panicked { plugin_id, entry_point, message }
                if plugin_id == "p" && entry_point == "on_reload" && message == "blew up on the second poll"
        ),
        "{err:?}"
    );
}

/// Panics when dropped: stands for a plugin's cleanup code that panics.
struct PanicsWhenDropped;

impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        panic!("cleanup failed");
    }
}

/// A plugin whose `on_run_start` never ends and panics when it is abandoned.
struct Messy(PluginManifest);

#[async_trait]
impl Plugin for Messy {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, _r: &mut PluginRegistrar) -> Result<(), PluginError> {
        Ok(())
    }
    async fn on_run_start(&self, _run: &RunLifecycle) -> Result<(), PluginError> {
        let _guard = PanicsWhenDropped;
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_lifecycle_hook_panicking_when_abandoned_at_its_timeout_is_a_counted_failure() {
    let run = RunLifecycle {
        run: identity(),
        resumed: false,
        parent_run_id: None,
    };
    let plugins: Vec<Arc<dyn Plugin>> = vec![
        Arc::new(Messy(PluginManifest::new("messy"))),
        TestPlugin::new("after").arc(),
    ];
    let dispatcher = LifecycleDispatcher::new(std::time::Duration::from_secs(1));
    dispatcher
        .dispatch(&plugins, LifecycleEvent::RunStart(&run))
        .await;
    let s = dispatcher.stats("messy", LifecycleHook::RunStart);
    assert_eq!((s.calls, s.failures, s.timeouts), (1, 1, 1));
    assert_eq!(
        dispatcher
            .last_failure("messy", LifecycleHook::RunStart)
            .map(|e| e.to_string()),
        Some("plugin `messy`: on_run_start panicked: cleanup failed".to_owned())
    );
    let after = dispatcher.stats("after", LifecycleHook::RunStart);
    assert_eq!((after.calls, after.failures), (1, 0), "the next plugin ran");
}
