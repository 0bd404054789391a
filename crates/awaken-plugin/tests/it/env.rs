//! Registrar methods, activation, order and capability bounds.

use std::sync::Arc;

use awaken_event::{RunId, ThreadId};
use awaken_phase::{CommandExt, FnHook, Phase, PhaseContext, PhaseEngine, RunIdentity};
use awaken_plugin::*;
use awaken_state::{KeyOptions, StateCommand, StateStore};

use crate::support::*;

fn hook_writing_a() -> Arc<dyn awaken_phase::PhaseHook> {
    Arc::new(FnHook(|_: &PhaseContext| {
        Ok(StateCommand::new().with_update::<KeyA>(1))
    }))
}

fn ids(env: &ExecutionEnv) -> String {
    env.plugin_ids().join(",")
}

#[test]
fn every_registrar_method_reports_its_duplicate() {
    let cases: Vec<(
        &str,
        Box<dyn Fn(&mut PluginRegistrar) -> Result<(), PluginError>>,
    )> = vec![
        (
            "plugin `p`: state key `t.a` is already registered",
            Box::new(|r| {
                r.register_key::<KeyA>(KeyOptions::new())?;
                r.register_key::<KeyA>(KeyOptions::new())
            }),
        ),
        (
            "plugin `p`: state key `t.a` is already registered",
            Box::new(|r| {
                r.register_key::<KeyA>(KeyOptions::new())?;
                r.register_profile_key::<KeyA>()
            }),
        ),
        (
            "plugin `p` registers effect `t.ping` twice",
            Box::new(|r| {
                r.register_effect::<Ping, _>(RecordPing(Log::default()))?;
                r.register_effect::<Ping, _>(RecordPing(Log::default()))
            }),
        ),
        (
            "plugin `p` registers phase hook `step_start/h` twice",
            Box::new(|r| {
                r.register_phase_hook(Phase::StepStart, "h", hook_writing_a())?;
                r.register_phase_hook(Phase::StepStart, "h", hook_writing_a())
            }),
        ),
        (
            "plugin `p` registers phase hook `g` for tool_gate; use register_tool_gate_hook",
            Box::new(|r| r.register_phase_hook(Phase::ToolGate, "g", hook_writing_a())),
        ),
    ];
    for (expected, register) in cases {
        let mut r = PluginRegistrar::new("p");
        let err = register(&mut r).expect_err(expected);
        assert!(err.to_string().starts_with(expected), "{err} vs {expected}");
    }
    // The same hook name in two phases is fine.
    let mut r = PluginRegistrar::new("p");
    r.register_phase_hook(Phase::StepStart, "h", hook_writing_a())
        .expect("first");
    r.register_phase_hook(Phase::StepEnd, "h", hook_writing_a())
        .expect("other phase");
}

fn keyed(id: &str, key_a: bool) -> Arc<dyn Plugin> {
    TestPlugin::new(id)
        .registering(move |r| {
            if key_a {
                r.register_key::<KeyA>(KeyOptions::new())?;
            }
            r.register_phase_hook(Phase::StepStart, "write", hook_writing_a())
        })
        .arc()
}

#[test]
fn filtered_out_plugins_keep_structure_and_lose_behaviour() {
    let log = Log::default();
    let l = log.clone();
    let listener = TestPlugin::new("listener")
        .registering(move |r| {
            r.register_key::<KeyB>(KeyOptions::new())?;
            r.register_effect::<Ping, _>(RecordPing(l.clone()))?;
            r.register_phase_hook(Phase::StepEnd, "never", hook_writing_a())
        })
        .arc();
    let emitter = TestPlugin::new("emitter")
        .registering(|r| {
            r.register_key::<KeyA>(KeyOptions::new())?;
            r.register_phase_hook(
                Phase::StepStart,
                "emit",
                Arc::new(FnHook(|_: &PhaseContext| {
                    let mut cmd = StateCommand::new().with_update::<KeyA>(5);
                    cmd.emit::<Ping>("from emitter".into())?;
                    Ok(cmd)
                })),
            )
        })
        .arc();
    let builtin = TestPlugin::new("builtin")
        .registering(|r| {
            r.register_phase_hook(
                Phase::StepStart,
                "always",
                Arc::new(FnHook(|_: &PhaseContext| Ok(StateCommand::new()))),
            )
        })
        .arc();
    let env = ExecutionEnv::from_plugins(&[listener, emitter], &[builtin], &["emitter".to_owned()])
        .expect("env");
    assert_eq!(ids(&env), "listener,emitter,builtin");
    assert!(!env.is_active("listener") && env.is_active("emitter") && env.is_active("builtin"));
    assert!(
        env.keys().contains("t.b"),
        "structural key of the filtered-out plugin is installed"
    );
    assert!(
        env.phase_env().effect("t.ping").is_some(),
        "its effect handler too"
    );
    assert!(
        env.phase_env().hooks(Phase::StepEnd).is_empty(),
        "its hook is not"
    );
    let hooks: Vec<String> = env
        .phase_env()
        .hooks(Phase::StepStart)
        .iter()
        .map(|h| format!("{}/{}", h.plugin_id, h.name))
        .collect();
    assert_eq!(
        hooks,
        vec!["emitter/emit", "builtin/always"],
        "built-ins ignore the filter"
    );

    // End to end: the listed plugin's effect reaches the unlisted plugin's handler.
    let store = Arc::new(StateStore::new(env.keys().clone()));
    let engine = PhaseEngine::new(store, env.phase_env().clone());
    let run = Arc::new(RunIdentity {
        thread_id: ThreadId::new("t").expect("id"),
        run_id: RunId::new("r").expect("id"),
        agent_id: "a".into(),
        profile_id: None,
    });
    let ctx = PhaseContext::new(Phase::StepStart, engine.store().snapshot(), run);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("rt");
    rt.block_on(engine.run_phase(&ctx)).expect("phase");
    assert_eq!(log.lines(), vec!["ping from emitter"]);
}

#[test]
fn an_empty_filter_activates_everyone_and_a_filter_never_reaches_builtins() {
    let env = ExecutionEnv::from_plugins(
        &[keyed("a", true), keyed("b", false)],
        &[keyed("builtin", false)],
        &[],
    )
    .expect("env");
    assert_eq!(env.phase_env().hooks(Phase::StepStart).len(), 3);
    let env = ExecutionEnv::from_plugins(
        &[keyed("a", true)],
        &[keyed("builtin", false)],
        &["nobody".into()],
    )
    .expect("env");
    let hooks: Vec<&str> = env
        .phase_env()
        .hooks(Phase::StepStart)
        .iter()
        .map(|h| &*h.plugin_id)
        .collect();
    assert_eq!(hooks, vec!["builtin"]);
}

fn plain(id: &str, priority: i32, deps: &[&str]) -> Arc<dyn Plugin> {
    let deps: Vec<String> = deps.iter().map(|d| (*d).to_owned()).collect();
    TestPlugin::new(id)
        .with_manifest(move |m| {
            let mut m = m.with_priority(priority);
            m.depends_on = deps;
            m
        })
        .arc()
}

#[test]
fn order_follows_dependencies_then_priority_then_list_position() {
    let order = |user: Vec<Arc<dyn Plugin>>, builtins: Vec<Arc<dyn Plugin>>| {
        ids(&ExecutionEnv::from_plugins(&user, &builtins, &[]).expect("env"))
    };
    // List order when nothing else decides.
    assert_eq!(
        order(
            vec![plain("a", 0, &[]), plain("b", 0, &[]), plain("c", 0, &[])],
            vec![]
        ),
        "a,b,c"
    );
    // Higher priority first among ready plugins.
    assert_eq!(
        order(
            vec![plain("a", 0, &[]), plain("b", 5, &[]), plain("c", 1, &[])],
            vec![]
        ),
        "b,c,a"
    );
    // A dependency comes first even with lower priority; built-ins follow the user's list.
    assert_eq!(
        order(
            vec![plain("a", 9, &["z"]), plain("b", 0, &[])],
            vec![plain("z", -1, &[]), plain("y", 0, &[])]
        ),
        "b,y,z,a"
    );
    // Disabled plugins are skipped.
    let off = TestPlugin::new("off")
        .with_manifest(|m| m.with_enabled(false))
        .arc();
    assert_eq!(order(vec![plain("a", 0, &[]), off], vec![]), "a");
}

/// The order by its definition: repeatedly the ready plugin (every dependency
/// placed) with the highest priority, ties in list order; `None` on a cycle.
fn reference_order(plugins: &[(i32, Vec<usize>)]) -> Option<Vec<usize>> {
    let mut placed = vec![false; plugins.len()];
    let mut order = Vec::new();
    while order.len() < plugins.len() {
        let next = (0..plugins.len())
            .filter(|&i| !placed[i] && plugins[i].1.iter().all(|&d| placed[d]))
            .min_by_key(|&i| (std::cmp::Reverse(plugins[i].0), i))?;
        placed[next] = true;
        order.push(next);
    }
    Some(order)
}

#[test]
fn execution_order_matches_its_definition_on_random_graphs() {
    // A fixed-seed generator: the same 2,000 graphs on every run.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |bound: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % bound
    };
    let (mut ordered, mut cyclic) = (0, 0);
    for _ in 0..2000 {
        let n = 1 + next(9) as usize;
        let graph: Vec<(i32, Vec<usize>)> = (0..n)
            .map(|i| {
                let priority = next(5) as i32 - 2;
                // Mostly earlier plugins (acyclic), sometimes any other (cycles).
                let deps = (0..next(3))
                    .filter_map(|_| {
                        let d = if i > 0 && next(8) != 0 {
                            next(i as u64) as usize
                        } else {
                            next(n as u64) as usize
                        };
                        (d != i).then_some(d)
                    })
                    .collect();
                (priority, deps)
            })
            .collect();
        let names: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
        let plugins: Vec<Arc<dyn Plugin>> = graph
            .iter()
            .enumerate()
            .map(|(i, (priority, deps))| {
                let deps: Vec<&str> = deps.iter().map(|&d| names[d].as_str()).collect();
                plain(&names[i], *priority, &deps)
            })
            .collect();
        let got = ExecutionEnv::from_plugins(&plugins, &[], &[]);
        match reference_order(&graph) {
            Some(expected) => {
                ordered += 1;
                let expected: Vec<&str> = expected.iter().map(|&i| names[i].as_str()).collect();
                assert_eq!(
                    ids(&got.expect("acyclic graph orders")),
                    expected.join(","),
                    "{graph:?}"
                );
            }
            None => {
                cyclic += 1;
                assert!(
                    matches!(got, Err(EnvError::DependencyCycle { .. })),
                    "{graph:?}"
                );
            }
        }
    }
    assert!(
        ordered > 500 && cyclic > 100,
        "{ordered} ordered, {cyclic} cyclic"
    );
}

#[test]
fn missing_dependency_and_cycles_are_named() {
    let err =
        ExecutionEnv::from_plugins(&[plain("a", 0, &["ghost"])], &[], &[]).expect_err("missing");
    assert_eq!(
        err.to_string(),
        "plugin `a` depends on `ghost`, which is not loaded or is disabled"
    );
    let off = TestPlugin::new("off")
        .with_manifest(|m| m.with_enabled(false))
        .arc();
    let err = ExecutionEnv::from_plugins(&[plain("a", 0, &["off"]), off], &[], &[])
        .expect_err("disabled dep");
    assert!(matches!(err, EnvError::MissingDependency { .. }));
    let err = ExecutionEnv::from_plugins(
        &[
            plain("x", 0, &[]),
            plain("a", 0, &["b"]),
            plain("b", 0, &["c"]),
            plain("c", 0, &["a"]),
        ],
        &[],
        &[],
    )
    .expect_err("cycle");
    assert_eq!(
        err.to_string(),
        "plugins depend on each other in a cycle: a -> b -> c -> a"
    );
    let err = ExecutionEnv::from_plugins(&[plain("a", 0, &[]), plain("a", 0, &[])], &[], &[])
        .expect_err("dup");
    assert!(matches!(err, EnvError::DuplicatePlugin { .. }));
}

#[test]
fn duplicates_across_plugins_name_both() {
    let err = ExecutionEnv::from_plugins(&[keyed("first", true), keyed("second", true)], &[], &[])
        .expect_err("dup key");
    assert_eq!(
        err.to_string(),
        "state key `t.a` is contributed by both `first` and `second`"
    );
    let effect = |id: &str| {
        TestPlugin::new(id)
            .registering(|r| r.register_effect::<Ping, _>(RecordPing(Log::default())))
            .arc()
    };
    let err = ExecutionEnv::from_plugins(&[effect("one"), effect("two")], &[], &[])
        .expect_err("dup effect");
    assert_eq!(
        err.to_string(),
        "effect `t.ping` is contributed by both `one` and `two`"
    );
    // A plugin may not take the engine's own keys.
    let thief = TestPlugin::new("thief")
        .registering(|r| r.register_key::<awaken_phase::ActionQueueKey>(KeyOptions::new()))
        .arc();
    let err = ExecutionEnv::from_plugins(&[thief], &[], &[]).expect_err("engine key");
    assert_eq!(
        err.to_string(),
        "state key `awaken.phase.action_queue` is contributed by both `awaken-phase` and `thief`"
    );
}

#[test]
fn each_kind_of_bound_violation_is_rejected() {
    let bounded =
        |bound: CapabilityBound, register: fn(&mut PluginRegistrar) -> Result<(), PluginError>| {
            TestPlugin::new("b")
                .with_manifest(|m| m.with_bound(bound))
                .registering(register)
                .arc()
        };
    let cases: Vec<(
        CapabilityBound,
        fn(&mut PluginRegistrar) -> Result<(), PluginError>,
        &str,
    )> = vec![
        (
            CapabilityBound::nothing(),
            |r| r.register_key::<KeyA>(KeyOptions::new()),
            "state key `t.a`",
        ),
        (
            CapabilityBound::nothing(),
            |r| r.register_profile_key::<KeyA>(),
            "profile key `t.a`",
        ),
        (
            CapabilityBound::nothing(),
            |r| r.register_effect::<Ping, _>(RecordPing(Log::default())),
            "effect `t.ping`",
        ),
        (
            CapabilityBound::nothing().with_phase_hooks([Phase::StepEnd]),
            |r| r.register_phase_hook(Phase::StepStart, "h", hook_writing_a()),
            "phase hook `step_start/h`",
        ),
        (
            CapabilityBound::nothing().with_state_keys(["t.b"]),
            |r| r.register_key::<KeyA>(KeyOptions::new()),
            "state key `t.a`",
        ),
    ];
    for (bound, register, what) in cases {
        let err =
            ExecutionEnv::from_plugins(&[bounded(bound, register)], &[], &[]).expect_err(what);
        assert_eq!(
            err.to_string(),
            format!("plugin `b` contributes {what}, outside its capability bound")
        );
    }
    // Within the bound: accepted.
    let ok = bounded(CapabilityBound::nothing().with_state_keys(["t.a"]), |r| {
        r.register_key::<KeyA>(KeyOptions::new())
    });
    assert!(ExecutionEnv::from_plugins(&[ok], &[], &[]).is_ok());
}

#[test]
fn manifest_versions_are_semver() {
    assert!(PluginManifest::new("p").with_version("1.2.3").is_ok());
    let err = PluginManifest::new("p")
        .with_version("one")
        .expect_err("not semver");
    assert!(
        err.to_string().contains("invalid manifest field `version`"),
        "{err}"
    );
    let bad = TestPlugin::new("bad id").arc();
    assert!(ExecutionEnv::from_plugins(&[bad], &[], &[]).is_err());
}

#[test]
fn manifest_ids_are_non_empty_without_whitespace_or_control_characters() {
    for (id, valid) in [
        ("p", true),
        ("awaken.loop_actions", true),
        ("ünï-code", true),
        ("", false),
        (" ", false),
        ("a b", false),
        ("a\tb", false),
        ("a\u{7f}", false),
        ("\u{2003}", false),
        ("é x", false),
        ("é\u{2003}x", false),
    ] {
        assert_eq!(PluginManifest::new(id).validate().is_ok(), valid, "{id:?}");
    }
}

struct Echo(&'static str);

#[async_trait::async_trait]
impl awaken_tool::Tool for Echo {
    fn descriptor(&self) -> awaken_event::ToolDescriptor {
        awaken_event::ToolDescriptor::new(self.0, "echo")
    }
    async fn execute(
        &self,
        args: &serde_json::Value,
        _ctx: &awaken_tool::ToolCallContext,
    ) -> Result<awaken_tool::ToolOutput, awaken_tool::ToolError> {
        Ok(awaken_tool::ToolOutput::success(args.clone()))
    }
}

fn allow_all_gate() -> Arc<dyn ToolGateHook> {
    Arc::new(FnGate(|_: &PhaseContext| Ok(None)))
}

struct Noop;
impl awaken_phase::ScheduledActionSpec for Noop {
    const KEY: &'static str = "t.noop";
    const PHASE: Phase = Phase::StepEnd;
    type Payload = ();
}
struct NoopHandler;
#[async_trait::async_trait]
impl awaken_phase::ActionHandler<Noop> for NoopHandler {
    async fn handle(
        &self,
        _ctx: &PhaseContext,
        _p: (),
    ) -> Result<StateCommand, awaken_phase::HookError> {
        Ok(StateCommand::new())
    }
}

#[test]
fn behavioural_registrar_methods_report_their_duplicates() {
    let cases: Vec<(
        &str,
        Box<dyn Fn(&mut PluginRegistrar) -> Result<(), PluginError>>,
    )> = vec![
        (
            "plugin `p` registers scheduled action `t.noop` twice",
            Box::new(|r| {
                r.register_scheduled_action::<Noop, _>(NoopHandler)?;
                r.register_scheduled_action::<Noop, _>(NoopHandler)
            }),
        ),
        (
            "plugin `p` registers tool-gate hook `g` twice",
            Box::new(|r| {
                r.register_tool_gate_hook("g", allow_all_gate())?;
                r.register_tool_gate_hook("g", allow_all_gate())
            }),
        ),
        (
            "plugin `p` registers tool `echo` twice",
            Box::new(|r| {
                r.register_tool(Arc::new(Echo("echo")))?;
                r.register_tool(Arc::new(Echo("echo")))
            }),
        ),
    ];
    for (expected, register) in cases {
        let mut r = PluginRegistrar::new("p");
        let err = register(&mut r).expect_err(expected);
        assert_eq!(err.to_string(), expected);
    }
}

#[test]
fn tools_gates_and_actions_are_installed_bounded_and_unique_across_plugins() {
    let full = TestPlugin::new("full")
        .registering(|r| {
            r.register_scheduled_action::<Noop, _>(NoopHandler)?;
            r.register_tool_gate_hook("gate", allow_all_gate())?;
            r.register_tool(Arc::new(Echo("echo")))
        })
        .arc();
    let env = ExecutionEnv::from_plugins(std::slice::from_ref(&full), &[], &[]).expect("env");
    assert_eq!(env.tools().len(), 1);
    assert_eq!(&*env.gate_hooks()[0].name, "gate");
    assert!(env.phase_env().action("t.noop").is_some());
    // Filtered out: the action handler stays, the tool and the gate go.
    let env = ExecutionEnv::from_plugins(std::slice::from_ref(&full), &[], &["other".into()])
        .expect("env");
    assert!(env.tools().is_empty() && env.gate_hooks().is_empty());
    assert!(env.phase_env().action("t.noop").is_some());

    let tool = |id: &str| {
        TestPlugin::new(id)
            .registering(|r| r.register_tool(Arc::new(Echo("echo"))))
            .arc()
    };
    let err =
        ExecutionEnv::from_plugins(&[tool("one"), tool("two")], &[], &[]).expect_err("dup tool");
    assert_eq!(
        err.to_string(),
        "tool `echo` is contributed by both `one` and `two`"
    );
    let action = |id: &str| {
        TestPlugin::new(id)
            .registering(|r| r.register_scheduled_action::<Noop, _>(NoopHandler))
            .arc()
    };
    let err = ExecutionEnv::from_plugins(&[action("one"), action("two")], &[], &[])
        .expect_err("dup action");
    assert_eq!(
        err.to_string(),
        "scheduled action `t.noop` is contributed by both `one` and `two`"
    );

    let bounded =
        |bound: CapabilityBound| TestPlugin::new("b").with_manifest(|m| m.with_bound(bound));
    let cases: Vec<(TestPlugin, &str)> = vec![
        (
            bounded(CapabilityBound::nothing())
                .registering(|r| r.register_tool(Arc::new(Echo("echo")))),
            "tool `echo`",
        ),
        (
            bounded(CapabilityBound::nothing())
                .registering(|r| r.register_tool_gate_hook("gate", allow_all_gate())),
            "tool-gate hook `gate`",
        ),
        (
            bounded(CapabilityBound::nothing())
                .registering(|r| r.register_scheduled_action::<Noop, _>(NoopHandler)),
            "scheduled action `t.noop`",
        ),
        (
            bounded(CapabilityBound::nothing()).registering(|r| {
                r.register_request_transform(Arc::new(NamedTransform));
                Ok(())
            }),
            "request transform `named`",
        ),
    ];
    for (plugin, what) in cases {
        let err = ExecutionEnv::from_plugins(&[plugin.arc()], &[], &[]).expect_err(what);
        assert_eq!(
            err.to_string(),
            format!("plugin `b` contributes {what}, outside its capability bound")
        );
    }
}

struct NamedTransform;
impl InferenceRequestTransform for NamedTransform {
    fn name(&self) -> &str {
        "named"
    }
    fn transform(
        &self,
        request: awaken_llm::InferenceRequest,
        _ctx: &TransformContext<'_>,
    ) -> Result<awaken_llm::InferenceRequest, TransformError> {
        Ok(request)
    }
}
