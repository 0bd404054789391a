//! Resolution: the happy path, every error and warning, order, conditional plugins, retry.

use std::sync::Arc;

use awaken_event::{Message, RunId, ThreadId, VecSink};
use awaken_llm::{InferenceRequest, LlmExecutor, ScriptTurn, ScriptedError, ScriptedErrorKind};
use awaken_plugin::{
    ConfigSchema, DeclarativePlugin, LifecycleDispatcher, LifecycleEvent, PluginManifest,
    PluginRegistry,
};
use awaken_resolver::*;
use awaken_spec::{AgentSpec, ContextPolicy, EndpointSpec, Glob};
use serde_json::json;

use crate::support::*;

fn glob(p: &str) -> Glob {
    Glob::new(p).expect("glob")
}

/// The resolved agent as text.
fn render(a: &ResolvedAgent) -> String {
    let tools: Vec<String> = a
        .tools
        .iter()
        .map(|t| format!("{} ({})", t.tool.id(), t.source))
        .collect();
    format!(
        "agent={} model={} executor={}\nplugins={}\ntools={}\nwarnings={:?}",
        a.spec.id,
        a.model.id,
        a.executor.name(),
        a.env.plugin_ids().join(","),
        tools.join(", "),
        a.warnings
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    )
}

#[test]
fn the_happy_path_runs_every_stage() {
    let registries = base()
        .with_tool(echo("search"))
        .with_tool(echo("fs_read"))
        .with_plugin(plugin("notes", &["note_add"]).arc())
        .with_agent_spec(AgentSpec::new("helper", "m"))
        .with_agent_spec(
            AgentSpec::new("assistant", "m")
                .with_plugin("notes")
                .with_delegate("helper")
                .with_excluded_tool("search"),
        );
    let resolved = resolver(registries).resolve("assistant").expect("resolves");
    expect_test::expect![[r#"
        agent=assistant model=m executor=scripted
        plugins=notes,loop_actions,stop_conditions
        tools=fs_read (global), delegate_helper (delegate:helper), note_add (plugin:notes)
        warnings=[]"#]]
    .assert_eq(&render(&resolved));
    assert!(resolved.spec_digest.starts_with("sha256:"));
    let again = resolver(
        base()
            .with_tool(echo("search"))
            .with_tool(echo("fs_read"))
            .with_plugin(plugin("notes", &["note_add"]).arc())
            .with_agent_spec(AgentSpec::new("helper", "m"))
            .with_agent_spec(
                AgentSpec::new("assistant", "m")
                    .with_plugin("notes")
                    .with_delegate("helper")
                    .with_excluded_tool("search"),
            ),
    )
    .resolve("assistant")
    .expect("resolves");
    assert_eq!(
        resolved.spec_digest, again.spec_digest,
        "the digest is stable across resolutions"
    );
}

#[test]
fn each_resolution_is_fresh() {
    let r = resolver(base().with_agent_spec(AgentSpec::new("a", "m")));
    let one = r.resolve("a").expect("resolves");
    let two = r.resolve("a").expect("resolves");
    // The environment is built anew; the spec is the registry's (shared, immutable), read again.
    assert!(!Arc::ptr_eq(one.env.phase_env(), two.env.phase_env()));
    assert_eq!(one.spec, two.spec);
}

#[test]
fn plugin_order_is_plugin_ids_then_builtins_adjusted_by_dependencies_and_priority() {
    let mut late = plugin("late", &[]);
    late.manifest = PluginManifest::new("late").with_dependency("loop_actions");
    let mut urgent = plugin("urgent", &[]);
    urgent.manifest = PluginManifest::new("urgent").with_priority(10);
    let registries = base()
        .with_plugin(late.arc())
        .with_plugin(plugin("b", &[]).arc())
        .with_plugin(urgent.arc())
        .with_agent_spec(
            AgentSpec::new("a", "m")
                .with_plugin("late")
                .with_plugin("b")
                .with_plugin("urgent"),
        );
    let resolved = resolver(registries).resolve("a").expect("resolves");
    assert_eq!(
        resolved.env.plugin_ids().join(","),
        "urgent,b,loop_actions,late,stop_conditions"
    );
}

#[test]
fn context_plugins_only_with_a_context_policy() {
    let registries = base()
        .with_agent_spec(AgentSpec::new("plain", "m"))
        .with_agent_spec(
            AgentSpec::new("managed", "m").with_context_policy(ContextPolicy::default()),
        );
    let r = resolver(registries);
    assert_eq!(
        r.resolve("plain")
            .expect("plain")
            .env
            .plugin_ids()
            .join(","),
        "loop_actions,stop_conditions"
    );
    assert_eq!(
        r.resolve("managed")
            .expect("managed")
            .env
            .plugin_ids()
            .join(","),
        "loop_actions,stop_conditions,context_transform,compaction"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_wraps_the_executor_only_when_asked() {
    let five_xx = || ScriptTurn::error(ScriptedError::new(ScriptedErrorKind::ServerError));
    let registries = |retries: u32| {
        let executor = scripted(vec![
            five_xx(),
            five_xx(),
            ScriptTurn::text("third time lucky"),
        ]);
        let spec = AgentSpec::new("a", "m").with_section(
            "retry",
            json!({"max_retries": retries, "initial_backoff": "10ms"}),
        );
        (base().with_agent_spec(spec), executor)
    };
    let (r0, _) = registries(0);
    assert_eq!(
        resolver(r0).resolve("a").expect("resolves").executor.name(),
        "scripted"
    );

    let (mut r2, executor) = registries(2);
    r2 = Registries::new()
        .with_model(awaken_spec::ModelSpec::new("m", "p", "upstream-m"))
        .with_provider("p", executor.clone())
        .with_agent_specs(r2.agent("a").map(|s| (*s).clone()));
    let resolved = resolver(r2).resolve("a").expect("resolves");
    let response = resolved
        .executor
        .execute(InferenceRequest::new(
            "upstream-m",
            vec![Message::user("hi")],
        ))
        .await
        .expect("two retries of a 5xx, then success");
    assert_eq!(response.message.text(), "third time lucky");
    assert_eq!(executor.requests().len(), 3, "one attempt and two retries");
}

fn err(registries: Registries, agent: &str) -> String {
    resolver(registries)
        .resolve(agent)
        .expect_err("fails")
        .to_string()
}

#[test]
fn every_resolve_error_variant() {
    let with_schema = {
        let mut p = plugin("audit", &[]);
        p.schema = Some(
            ConfigSchema::new(
                "audit",
                json!({"type": "object", "properties": {"level": {"type": "string"}}}),
            )
            .expect("schema"),
        );
        p.arc()
    };
    let cases: Vec<(Registries, &str, &str)> = vec![
        (base(), "ghost", "agent `ghost` is not registered"),
        (
            base().with_agent_spec(AgentSpec::new("a", "m").with_max_rounds(0)),
            "a",
            "agent `a` has an invalid spec: invalid `agent.max_rounds`: must be at least 1",
        ),
        (
            base().with_agent_spec(AgentSpec::new("remote", "").with_endpoint(EndpointSpec {
                url: "echo://x".into(),
                protocol: None,
                bearer_token_env: None,
            })),
            "remote",
            "agent `remote` is served by endpoint `echo://x` and cannot be resolved for the local loop",
        ),
        (
            base().with_agent_spec(AgentSpec::new("a", "nope")),
            "a",
            "agent `a` uses model `nope`, which is not registered",
        ),
        (
            base()
                .with_model(awaken_spec::ModelSpec::new("m2", "nobody", "x"))
                .with_agent_spec(AgentSpec::new("a", "m2")),
            "a",
            "model `m2` of agent `a` is served by provider `nobody`, which is not registered",
        ),
        (
            base().with_agent_spec(AgentSpec::new("a", "m").with_plugin("missing")),
            "a",
            "agent `a` lists plugin `missing`, which is not registered",
        ),
        (
            base().with_plugin(with_schema).with_agent_spec(
                AgentSpec::new("a", "m")
                    .with_plugin("audit")
                    .with_section("audit", json!({"level": 3})),
            ),
            "a",
            "agent `a`: config section `audit` (claimed by `audit`) is invalid: /level: 3 is not of type \"string\"",
        ),
        (
            base().with_agent_spec(
                AgentSpec::new("a", "m").with_section("retry", json!({"max_retries": -1})),
            ),
            "a",
            "agent `a` has an invalid spec: invalid section `retry`: invalid value: integer `-1`, expected u32",
        ),
        (
            base().with_agent_spec(AgentSpec::new("no-builtins", "m")),
            "no-builtins",
            "agent `no-builtins`: built-in plugins: this agent cannot have built-ins",
        ),
        (
            base()
                .with_plugin(plugin("loop_actions", &[]).arc())
                .with_agent_spec(AgentSpec::new("a", "m").with_plugin("loop_actions")),
            "a",
            "agent `a`: plugin id `loop_actions` is used twice",
        ),
        (
            base().with_agent_spec(AgentSpec::new("a", "m").with_delegate("nobody")),
            "a",
            "agent `a` delegates to `nobody`, which is not registered",
        ),
        (
            base()
                .with_agent_spec(AgentSpec::new("bad-helper", "m"))
                .with_agent_spec(AgentSpec::new("a", "m").with_delegate("bad-helper")),
            "a",
            "agent `a`: delegate tool for `bad-helper`: cannot delegate to bad-helper",
        ),
        (
            base()
                .with_plugin(
                    ToolPlugin {
                        manifest: PluginManifest::new("broken"),
                        tools: vec![Arc::new(Echo {
                            id: "bad_schema".into(),
                            schema: json!({"type": "nonsense"}),
                        })],
                        schema: None,
                    }
                    .arc(),
                )
                .with_agent_spec(AgentSpec::new("a", "m").with_plugin("broken")),
            "a",
            "agent `a`: ",
        ),
        (
            base()
                .with_tool(echo("search"))
                .with_plugin(plugin("web", &["search"]).arc())
                .with_agent_spec(AgentSpec::new("a", "m").with_plugin("web")),
            "a",
            "tool id `search` is provided by both global and plugin:web",
        ),
    ];
    for (registries, agent, expected) in cases {
        let message = err(registries, agent);
        assert!(
            message.starts_with(expected),
            "{message}\n  expected: {expected}"
        );
    }
    // The remaining variants: a delegate without a factory, and a backend nobody claims.
    let no_factory = Resolver::new(
        Arc::new(
            base()
                .with_agent_spec(AgentSpec::new("h", "m"))
                .with_agent_spec(AgentSpec::new("a", "m").with_delegate("h")),
        ),
        Arc::new(TestBuiltins),
    );
    assert!(matches!(
        no_factory.resolve("a"),
        Err(ResolveError::NoDelegateFactory { .. })
    ));
    let unclaimed = resolver(
        base().with_agent_spec(AgentSpec::new("r", "").with_endpoint(EndpointSpec {
            url: "a2a://far".into(),
            protocol: None,
            bearer_token_env: None,
        })),
    );
    assert!(matches!(
        unclaimed.plan("r"),
        Err(ResolveError::NoBackendForEndpoint { .. })
    ));
    let invalid_tool = resolver(
        base()
            .with_plugin(
                ToolPlugin {
                    manifest: PluginManifest::new("broken"),
                    tools: vec![Arc::new(Echo {
                        id: "bad_schema".into(),
                        schema: json!({"type": "nonsense"}),
                    })],
                    schema: None,
                }
                .arc(),
            )
            .with_agent_spec(AgentSpec::new("a", "m").with_plugin("broken")),
    );
    assert!(matches!(
        invalid_tool.resolve("a"),
        Err(ResolveError::InvalidTool { .. })
    ));
    let env_error = resolver(
        base()
            .with_plugin(plugin("loop_actions", &[]).arc())
            .with_agent_spec(AgentSpec::new("a", "m").with_plugin("loop_actions")),
    );
    assert!(matches!(
        env_error.resolve("a"),
        Err(ResolveError::Env {
            source: awaken_plugin::EnvError::DuplicatePlugin { .. },
            ..
        })
    ));
}

#[tokio::test]
async fn an_endpoint_agent_plans_onto_its_backend() {
    let r = resolver(
        base().with_agent_spec(AgentSpec::new("remote", "").with_endpoint(EndpointSpec {
            url: "echo://x".into(),
            protocol: None,
            bearer_token_env: None,
        })),
    );
    let Ok(ResolvedRunPlan::Backend(plan)) = r.plan("remote") else {
        panic!("a backend plan")
    };
    assert_eq!(plan.backend.id(), "echo");
    let sink = VecSink::new();
    let outcome = plan
        .backend
        .run(
            &plan.spec,
            BackendRequest {
                thread_id: ThreadId::new("t").expect("id"),
                run_id: RunId::new("r").expect("id"),
                messages: vec![Message::user("ping")],
                overrides: None,
                cancel: Default::default(),
                answering: None,
            },
            &sink,
        )
        .await
        .expect("runs");
    assert_eq!(outcome.response.as_deref(), Some("ping"));
    assert!(awaken_event::check_activation(&sink.events()).is_ok());
    assert!(matches!(r.plan("remote"), Ok(ResolvedRunPlan::Backend(_))));
    let local = resolver(base().with_agent_spec(AgentSpec::new("a", "m")));
    assert!(matches!(local.plan("a"), Ok(ResolvedRunPlan::Local(_))));
}

/// A plugin that is disabled, contributing a tool `off_tool`.
fn disabled(id: &str) -> ToolPlugin {
    let mut p = plugin(id, &["off_tool"]);
    p.manifest = PluginManifest::new(id)
        .with_priority(100)
        .with_enabled(false);
    p
}

#[test]
fn every_warning() {
    let registries = base()
        .with_tool(echo("fs_read"))
        .with_tool(echo("fs_write"))
        .with_plugin(disabled("off").arc())
        .with_agent_spec(
            AgentSpec::new("a", "m")
                .with_plugin("off")
                .with_allowed_tool_pattern(glob("fs_*"))
                .with_allowed_tool_pattern(glob("net_*"))
                .with_excluded_tool("fs_write")
                .with_excluded_tool("shell(rm)")
                .with_section("permission", json!({"rules": [{"tool": "fs_write", "decision": "ask"}, {"tool": "fs_*", "decision": "allow"}]}))
                .with_section("mystery", json!({})),
        );
    let resolved = resolver(registries)
        .resolve("a")
        .expect("warnings never fail resolution");
    expect_test::expect![[r#"
        agent=a model=m executor=scripted
        plugins=loop_actions,stop_conditions
        tools=fs_read (global)
        warnings=["plugin `off` is disabled; the agent runs without it", "config section `mystery` is claimed by no plugin", "config section `permission` is claimed by no plugin", "allowed_tool_patterns pattern `net_*` matches no tool", "excluded_tools entry `shell(rm)` looks like a permission rule; put it in the `permission` section", "permission rule 0 (`fs_write`) names only tools the catalog filtered out"]"#]]
    .assert_eq(&render(&resolved));
}

#[test]
fn a_misspelt_spec_field_is_rejected_with_its_name() {
    let err = AgentSpec::from_toml_str("id = \"a\"\nmodel = \"m\"\nplugins = [\"x\"]\n")
        .expect_err("typo");
    assert!(
        err.to_string().contains("plugins") && err.to_string().contains("line 3"),
        "{err}"
    );
}

#[test]
fn validation_lists_every_failure_at_once() {
    let registries = base()
        .with_agent_spec(AgentSpec::new("good", "m"))
        .with_agent_spec(AgentSpec::new("no_model", "ghost"))
        .with_agent_spec(AgentSpec::new("no_plugin", "m").with_plugin("ghost"))
        .with_agent_spec(AgentSpec::new("good", "m"))
        .with_tool(echo("t"))
        .with_tool(echo("t"));
    let failed = resolver(registries)
        .validate()
        .expect_err("several problems");
    let lines: Vec<String> = failed.problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        vec![
            "agent `good` is registered twice",
            "tool `t` is registered twice",
            "agent `no_model` uses model `ghost`, which is not registered",
            "agent `no_plugin` lists plugin `ghost`, which is not registered",
        ]
    );
    assert!(
        resolver(base().with_agent_spec(AgentSpec::new("good", "m")))
            .validate()
            .is_ok()
    );
}

#[test]
fn validation_lists_every_missing_id_of_one_agent() {
    let registries = base()
        .with_model(awaken_spec::ModelSpec::new("orphan", "nobody", "x"))
        .with_agent_spec(
            AgentSpec::new("lost", "ghost")
                .with_plugin("phantom")
                .with_plugin("spectre")
                .with_delegate("nobody"),
        )
        .with_agent_spec(AgentSpec::new("unserved", "orphan").with_plugin("phantom"))
        // Its spec is invalid (one plugin listed twice) and its model is missing.
        .with_agent_spec(
            AgentSpec::new("twice", "ghost")
                .with_plugin("phantom")
                .with_plugin("phantom"),
        );
    let failed = resolver(registries)
        .validate()
        .expect_err("several problems");
    let lines: Vec<String> = failed.problems.iter().map(ToString::to_string).collect();
    expect_test::expect![[r#"
        agent `lost` uses model `ghost`, which is not registered
        agent `lost` lists plugin `phantom`, which is not registered
        agent `lost` lists plugin `spectre`, which is not registered
        agent `lost` delegates to `nobody`, which is not registered
        agent `twice` has an invalid spec: invalid `agent.plugin_ids[1]`: "phantom" is listed twice
        agent `twice` uses model `ghost`, which is not registered
        agent `twice` lists plugin `phantom`, which is not registered
        model `orphan` of agent `unserved` is served by provider `nobody`, which is not registered
        agent `unserved` lists plugin `phantom`, which is not registered"#]]
    .assert_eq(&lines.join("\n"));
}

#[test]
fn a_plugin_registry_is_a_plugin_source_and_an_agent_source_refreshed_on_reload() {
    let registry = Arc::new(PluginRegistry::new());
    registry
        .load_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/plugins"))
        .expect("example plugins");
    let r = resolver(
        Registries::new()
            .with_model(awaken_spec::ModelSpec::new("scripted", "p", "x"))
            .with_provider("p", scripted(vec![]))
            .with_plugin_registry(registry),
    );
    let editor = r
        .resolve("editor")
        .expect("the registry's agent resolves with the registry's plugin");
    assert_eq!(
        editor.env.plugin_ids().join(","),
        "house-style,loop_actions,stop_conditions"
    );
    assert!(r.validate().is_ok());
}

#[tokio::test]
async fn a_disabled_plugin_is_left_out_of_the_plugin_source_and_of_resolution() {
    let retired = DeclarativePlugin::from_toml_str(
        "id = \"retired\"\nenabled = false\n[[agents]]\n[agents.spec]\nid = \"archivist\"\nmodel = \"m\"\n",
    )
    .expect("manifest");
    let registry = PluginRegistry::from_plugins(vec![Arc::new(retired)]).expect("registry");
    let registries = base()
        .with_plugin(plugin("on", &["on_tool"]).arc())
        .with_plugin(disabled("off").arc())
        .with_plugin_registry(Arc::new(registry))
        .with_agent_spec(
            AgentSpec::new("a", "m")
                .with_plugin("off")
                .with_plugin("on")
                .with_plugin("retired"),
        );
    let r = resolver(registries);
    let plugin_source: Vec<String> = r
        .registries()
        .plugins()
        .iter()
        .map(|p| p.manifest().id.clone())
        .collect();
    assert_eq!(plugin_source, vec!["on"]);
    assert!(r.registries().plugin("off").is_none());
    assert!(r.registries().plugin("retired").is_none());

    // An agent naming disabled plugins resolves without them, with a warning for each.
    expect_test::expect![[r#"
        agent=a model=m executor=scripted
        plugins=on,loop_actions,stop_conditions
        tools=on_tool (plugin:on)
        warnings=["plugin `off` is disabled; the agent runs without it", "plugin `retired` is disabled; the agent runs without it"]"#]]
    .assert_eq(&render(&r.resolve("a").expect("resolves")));

    // A disabled plugin's agents are not defined.
    assert_eq!(r.registries().agent_ids(), vec!["a"]);
    assert!(matches!(
        r.resolve("archivist"),
        Err(ResolveError::AgentNotFound { .. })
    ));
    assert!(r.validate().is_ok());
    // Validation does not count a disabled plugin among an agent's missing ids.
    let unmodelled = resolver(
        base()
            .with_plugin(disabled("off").arc())
            .with_agent_spec(AgentSpec::new("b", "ghost").with_plugin("off")),
    );
    let failed = unmodelled.validate().expect_err("missing model");
    let lines: Vec<String> = failed.problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        vec!["agent `b` uses model `ghost`, which is not registered"]
    );

    // The runtime's start and shutdown hooks go to the plugin source: never a disabled plugin.
    let dispatcher = LifecycleDispatcher::default();
    for event in [
        LifecycleEvent::RuntimeStart,
        LifecycleEvent::RuntimeShutdown,
    ] {
        dispatcher.dispatch(&r.registries().plugins(), event).await;
    }
    let called: Vec<String> = dispatcher
        .all_stats()
        .into_keys()
        .map(|(id, hook)| format!("{id} {}", hook.as_str()))
        .collect();
    assert_eq!(
        called,
        vec!["on on_runtime_start", "on on_runtime_shutdown"]
    );

    // A disabled plugin's id still counts against duplicates.
    let twice = base()
        .with_plugin(disabled("off").arc())
        .with_plugin(plugin("off", &[]).arc());
    assert_eq!(
        twice
            .errors()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        vec!["plugin `off` is registered twice"]
    );
}
