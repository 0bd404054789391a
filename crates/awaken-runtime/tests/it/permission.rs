//! The standard permission plugin: each decision, rule order, argument matchers (numbers by
//! value in every spelling), the default, approval asked once, arguments in the tool's
//! canonical form for every gate and hook, an answer the gate itself checks, bad
//! configuration.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use awaken_event::{
    RunId, TerminationReason, ThreadId, ToolCall, ToolCallId, ToolCallResume, ToolDescriptor,
    VecSink,
};
use awaken_llm::{ScriptToolCall, ScriptTurn};
use awaken_phase::{FnHook, Phase, PhaseContext, RunIdentity, ToolPhaseInfo};
use awaken_plugin::{Plugin, PluginError, PluginManifest, PluginRegistrar, ToolGateHook};
use awaken_runtime::{PERMISSION_PLUGIN, PermissionGate, PermissionRefusal, Resume};
use awaken_spec::Sections;
use awaken_state::{KeyRegistry, StateCommand, StateStore};
use awaken_tool::{
    Tool, ToolCallContext, ToolError, ToolInterceptPayload, ToolOutput, Violation, argument_digest,
    pending_call,
};
use serde_json::{Value, json};

use crate::support::*;

fn echo_then_done(text: &str) -> Vec<ScriptTurn> {
    vec![
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": text})).with_id("c1")),
        ScriptTurn::text("done"),
    ]
}

fn with_rules(turns: Vec<ScriptTurn>, section: serde_json::Value) -> Scenario {
    Scenario::new(turns).spec(|s| {
        s.with_plugin(PERMISSION_PLUGIN)
            .with_section("permission", section)
    })
}

#[tokio::test]
async fn allow_deny_and_ask_by_the_first_matching_rule() {
    let rules = json!({
        "rules": [
            {"tool": "echo", "args": [{"pointer": "/text", "matches": "secret*"}], "decision": "deny"},
            {"tool": "echo", "args": [{"pointer": "/text", "equals": "hello"}], "decision": "allow"},
            {"tool": "ech*", "decision": "ask"}
        ],
        "default": "deny"
    });
    let allowed = with_rules(echo_then_done("hello"), rules.clone())
        .run()
        .await;
    assert!(render(&allowed.events).contains("call_done c1 succeeded {\"echoed\":\"hello\"}"));

    let denied = with_rules(echo_then_done("secret plan"), rules.clone())
        .run()
        .await;
    let text = render(&denied.events);
    assert!(
        text.contains("call_done c1 blocked \"`echo` is not permitted for this agent\""),
        "{text}"
    );
    assert_eq!(denied.outcome.termination, TerminationReason::NaturalEnd);

    let asked = with_rules(echo_then_done("other"), rules.clone())
        .run()
        .await;
    assert_eq!(asked.outcome.termination, TerminationReason::Suspended);
    let text = render(&asked.events);
    assert!(
        text.contains(
            "call_suspended c1 \"Allow `echo` with arguments {\\\"text\\\":\\\"other\\\"}?\""
        ),
        "{text}"
    );

    // No rule matches `broken`: the default (deny).
    let default = with_rules(
        vec![
            ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("broken", json!({})).with_id("c1")),
            ScriptTurn::text("done"),
        ],
        rules,
    )
    .run()
    .await;
    assert!(render(&default.events).contains("call_done c1 blocked"));
}

#[tokio::test]
async fn an_approved_call_runs_and_is_not_asked_again() {
    let out = with_rules(echo_then_done("x"), json!({"default": "ask"}))
        .run()
        .await;
    assert_eq!(out.outcome.termination, TerminationReason::Suspended);
    let thread = ThreadId::new("thread").expect("id");
    let tickets = out.runtime.waiting_calls(&thread).await.expect("read");
    assert_eq!(tickets.len(), 1);
    let resumed = out
        .runtime
        .resume_to_completion(
            Resume::new(thread.clone()).with_decision(ToolCallResume::approve(&tickets[0].call)),
        )
        .await
        .expect("resumed");
    // Asked again, the gate would have suspended the call a second time.
    assert_eq!(resumed.termination, TerminationReason::NaturalEnd);
    assert_eq!(resumed.response.as_deref(), Some("done"));
    let history = out.runtime.history(&thread).await.expect("history");
    assert_eq!(
        history[2].content[..],
        [awaken_event::ContentBlock::Json {
            value: json!({"echoed": "x"}).into()
        }]
    );
}

fn build_with(section: serde_json::Value) -> String {
    let executor = std::sync::Arc::new(
        awaken_llm::ScriptedExecutor::from_turns(vec![ScriptTurn::text("x")]).expect("script"),
    );
    awaken_runtime::AgentRuntime::builder()
        .with_model(awaken_spec::ModelSpec::new("model", "scripted", "up"))
        .with_provider("scripted", executor)
        .with_agent_spec(
            awaken_spec::AgentSpec::new("agent", "model")
                .with_plugin(PERMISSION_PLUGIN)
                .with_section("permission", section),
        )
        .build()
        .expect_err("invalid section")
        .to_string()
}

#[test]
fn a_bad_permission_section_is_refused_when_the_agent_resolves() {
    // Against the plugin's schema.
    let err = build_with(json!({"default": "maybe"}));
    assert!(err.contains("permission"), "{err}");
    // What the schema cannot see: the field is named.
    let err = build_with(json!({
        "rules": [{"tool": "echo", "args": [{"pointer": "text", "equals": 1}], "decision": "allow"}]
    }));
    assert!(err.contains("permission.rules[0].args[0].pointer"), "{err}");
}

/// `open {"name": string, "n"?, "s"?, "t"?: any}`: counts its runs in `runs` (a witness outside the tool) and answers
/// with the name it was given. Its canonical form of a name drops leading `./` and trailing
/// `/`, then follows `aliases` (a stand-in for symbolic links); an empty name has none, and
/// `"unshaped"` normalises into arguments that break the schema.
struct Open {
    runs: Arc<AtomicUsize>,
    aliases: Arc<Mutex<HashMap<String, String>>>,
}

impl Open {
    fn new() -> Self {
        Self {
            runs: Arc::new(AtomicUsize::new(0)),
            aliases: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn alias(&self, from: &str, to: &str) {
        self.aliases
            .lock()
            .expect("aliases")
            .insert(from.to_owned(), to.to_owned());
    }
}

#[async_trait]
impl Tool for Open {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("open", "Opens a name").with_parameters(json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "n": {}, "s": {}, "t": {}},
            "required": ["name"],
            "additionalProperties": false
        }))
    }

    fn normalize_arguments(&self, args: &Value) -> Result<Option<Value>, ToolError> {
        let given = args["name"].as_str().unwrap_or_default();
        if given == "unshaped" {
            return Ok(Some(json!({"name": 5})));
        }
        let trimmed = given.trim_start_matches("./").trim_end_matches('/');
        if trimmed.is_empty() {
            return Err(ToolError::InvalidArguments {
                tool_id: "open".into(),
                violations: vec![Violation {
                    path: "/name".into(),
                    message: format!("{given:?} names nothing"),
                }],
            });
        }
        let name = match self.aliases.lock().expect("aliases").get(trimmed) {
            Some(target) => target.clone(),
            None => trimmed.to_owned(),
        };
        Ok((name != given).then(|| json!({ "name": name })))
    }

    async fn execute(&self, args: &Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(ToolOutput::success(json!({"opened": args["name"]})))
    }
}

/// A run of one `open` call (`c1`) with `arguments` (JSON text, as a model writes it) under
/// the permission section `rules`, and what the witness counted.
async fn open_once(
    open: Open,
    arguments: &str,
    rules: Value,
    plugins: Vec<Arc<dyn Plugin>>,
) -> (Outcome, usize) {
    let runs = open.runs.clone();
    let arguments: Value = serde_json::from_str(arguments).expect("JSON arguments");
    let mut scenario = with_rules(
        vec![
            ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("open", arguments).with_id("c1")),
            ScriptTurn::text("done"),
        ],
        rules,
    );
    scenario.tools = vec![Arc::new(open)];
    for p in plugins {
        scenario = scenario.plugin(p);
    }
    let out = scenario.run().await;
    let counted = runs.load(Ordering::SeqCst);
    (out, counted)
}

/// The closing line of call `c1` in the run's events.
fn closing(out: &Outcome) -> String {
    render(&out.events)
        .lines()
        .find(|l| l.starts_with("call_done c1") || l.starts_with("call_suspended c1"))
        .unwrap_or("no closing event")
        .to_owned()
}

#[tokio::test]
async fn equals_catches_every_spelling_of_a_number_and_the_tool_never_runs() {
    let rules = json!({
        "rules": [
            {"tool": "open", "args": [{"pointer": "/n", "equals": 1}], "decision": "deny"},
            {"tool": "open", "args": [{"pointer": "/s", "equals": 1, "as": "number"}], "decision": "deny"},
            {"tool": "open", "args": [{"pointer": "/t", "equals": "1", "as": "string"}], "decision": "deny"}
        ],
        "default": "allow"
    });
    // (Arguments as the model wrote them, whether the rule stops the call.)
    let rows = [
        (r#"{"name": "a", "n": 1}"#, true),
        (r#"{"name": "a", "n": 1.0}"#, true),
        (r#"{"name": "a", "n": 1e0}"#, true),
        (r#"{"name": "a", "n": 10e-1}"#, true),
        (r#"{"name": "a", "n": 2}"#, false),
        (r#"{"name": "a", "n": "1"}"#, false),
        (r#"{"name": "a", "s": "1.0"}"#, true),
        (r#"{"name": "a", "s": "1e0"}"#, true),
        (r#"{"name": "a", "s": 10e-1}"#, true),
        (r#"{"name": "a", "s": "2"}"#, false),
        (r#"{"name": "a", "t": "1"}"#, true),
        (r#"{"name": "a", "t": 1}"#, false),
    ];
    let mut wrong = Vec::new();
    for (arguments, denied) in rows {
        let open = Open::new();
        let (out, runs) = open_once(open, arguments, rules.clone(), Vec::new()).await;
        let line = closing(&out);
        let expected = if denied {
            (
                "call_done c1 blocked \"`open` is not permitted for this agent\"",
                0,
            )
        } else {
            ("call_done c1 succeeded {\"opened\":\"a\"}", 1)
        };
        if (line.as_str(), runs) != expected {
            wrong.push(format!("{arguments}: {line} (ran {runs} times)"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Records the arguments `BeforeToolExecute` and `AfterToolExecute` see.
struct Watch(PluginManifest, Log);

impl Plugin for Watch {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        for phase in [Phase::BeforeToolExecute, Phase::AfterToolExecute] {
            let log = self.1.clone();
            r.register_phase_hook(
                phase,
                "watch",
                Arc::new(FnHook(move |ctx: &PhaseContext| {
                    let call = &ctx.tool.as_ref().expect("a tool phase").call;
                    log.push(format!("{phase} {}", call.arguments));
                    Ok(StateCommand::new())
                })),
            )?;
        }
        Ok(())
    }
}

#[tokio::test]
async fn rules_tickets_hooks_and_the_tool_see_the_normalized_arguments() {
    let rules = json!({
        "rules": [
            {"tool": "open", "args": [{"pointer": "/name", "equals": "secret"}], "decision": "deny"},
            {"tool": "open", "args": [{"pointer": "/name", "matches": "notes*"}], "decision": "ask"}
        ],
        "default": "allow"
    });
    let open = |alias: Option<(&str, &str)>| {
        let open = Open::new();
        if let Some((from, to)) = alias {
            open.alias(from, to);
        }
        open
    };
    // Every spelling of `secret` is denied, and the tool never runs.
    for (name, alias) in [
        ("secret", None),
        ("./secret", None),
        ("secret/", None),
        ("././secret//", None),
        ("link", Some(("link", "secret"))),
        ("./link/", Some(("link", "secret"))),
    ] {
        let (out, runs) = open_once(
            open(alias),
            &json!({ "name": name }).to_string(),
            rules.clone(),
            Vec::new(),
        )
        .await;
        assert_eq!(
            (closing(&out).as_str(), runs),
            (
                "call_done c1 blocked \"`open` is not permitted for this agent\"",
                0
            ),
            "{name}"
        );
    }
    // Allowed: the hooks and the tool see the canonical name; the history keeps the model's.
    let log = Log::default();
    let watch: Arc<dyn Plugin> = Arc::new(Watch(PluginManifest::new("watch"), log.clone()));
    let (out, runs) = open_once(
        open(Some(("docs", "manual"))),
        r#"{"name": "./docs/"}"#,
        rules.clone(),
        vec![watch],
    )
    .await;
    assert_eq!(runs, 1);
    assert_eq!(
        closing(&out),
        "call_done c1 succeeded {\"opened\":\"manual\"}"
    );
    assert_eq!(
        log.lines(),
        [
            "before_tool_execute {\"name\":\"manual\"}",
            "after_tool_execute {\"name\":\"manual\"}"
        ]
    );
    let thread = ThreadId::new("thread").expect("id");
    let history = out.runtime.history(&thread).await.expect("history");
    assert_eq!(
        *history[1].tool_calls[0].arguments,
        json!({"name": "./docs/"})
    );
    // Asked: the human sees, and approves, the canonical arguments.
    let (out, runs) = open_once(open(None), r#"{"name": "./notes/"}"#, rules, Vec::new()).await;
    assert_eq!(runs, 0);
    assert_eq!(
        closing(&out),
        r#"call_suspended c1 "Allow `open` with arguments {\"name\":\"notes\"}?""#
    );
    let tickets = out.runtime.waiting_calls(&thread).await.expect("read");
    assert_eq!(tickets[0].call.arguments, json!({"name": "notes"}));
    assert_eq!(
        tickets[0].call.argument_digest,
        argument_digest(&json!({"name": "notes"}))
    );
    let resumed = out
        .runtime
        .resume_to_completion(
            Resume::new(thread.clone()).with_decision(ToolCallResume::approve(&tickets[0].call)),
        )
        .await
        .expect("resumed");
    assert_eq!(resumed.termination, TerminationReason::NaturalEnd);
    let history = out.runtime.history(&thread).await.expect("history");
    assert_eq!(
        history[2].content[..],
        [awaken_event::ContentBlock::Json {
            value: json!({"opened": "notes"}).into()
        }]
    );
}

#[tokio::test]
async fn concurrent_calls_run_on_the_normalized_arguments_too() {
    let rules = json!({
        "rules": [{"tool": "open", "args": [{"pointer": "/name", "equals": "secret"}], "decision": "deny"}],
        "default": "allow"
    });
    let open = Open::new();
    open.alias("docs", "manual");
    let runs = open.runs.clone();
    let log = Log::default();
    let call =
        |id: &str, name: &str| ScriptToolCall::new("open", json!({ "name": name })).with_id(id);
    let mut scenario = with_rules(
        vec![
            ScriptTurn::text("")
                .with_tool_call(call("c1", "./secret/"))
                .with_tool_call(call("c2", "./docs/"))
                .with_tool_call(call("c3", "plain")),
            ScriptTurn::text("done"),
        ],
        rules,
    )
    .spec(|s| s.with_parallel_tools(true))
    .plugin(Arc::new(Watch(PluginManifest::new("watch"), log.clone())));
    scenario.tools = vec![Arc::new(open)];
    let out = scenario.run().await;
    let done: Vec<String> = render(&out.events)
        .lines()
        .filter(|l| l.starts_with("call_done"))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        done,
        [
            "call_done c1 blocked \"`open` is not permitted for this agent\"",
            "call_done c2 succeeded {\"opened\":\"manual\"}",
            "call_done c3 succeeded {\"opened\":\"plain\"}",
        ]
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let mut seen = log.lines();
    seen.sort();
    assert_eq!(
        seen,
        [
            "after_tool_execute {\"name\":\"manual\"}",
            "after_tool_execute {\"name\":\"plain\"}",
            "before_tool_execute {\"name\":\"manual\"}",
            "before_tool_execute {\"name\":\"plain\"}",
        ]
    );
}

#[tokio::test]
async fn arguments_without_a_canonical_form_are_blocked_before_any_gate() {
    // Every call would be allowed: the refusal is the normalisation's.
    let rules = json!({"default": "allow"});
    let (out, runs) = open_once(Open::new(), r#"{"name": "./"}"#, rules.clone(), Vec::new()).await;
    assert_eq!(runs, 0);
    assert_eq!(
        closing(&out),
        r#"call_done c1 blocked "invalid arguments for tool `open`: at /name: \"./\" names nothing""#
    );
    // Canonical arguments that break the schema never reach the tool either.
    let (out, runs) = open_once(Open::new(), r#"{"name": "unshaped"}"#, rules, Vec::new()).await;
    assert_eq!(runs, 0);
    assert!(
        closing(&out)
            .starts_with("call_done c1 blocked \"invalid arguments for tool `open`: at /name"),
        "{}",
        closing(&out)
    );
}

#[tokio::test]
async fn an_answer_on_arguments_that_changed_since_is_refused_by_the_gate() {
    let rules = json!({"default": "ask"});
    let open = Open::new();
    open.alias("today", "notes-1");
    let aliases = open.aliases.clone();
    let runs = open.runs.clone();
    let (out, _) = open_once(open, r#"{"name": "today"}"#, rules, Vec::new()).await;
    let thread = ThreadId::new("thread").expect("id");
    let tickets = out.runtime.waiting_calls(&thread).await.expect("read");
    assert_eq!(tickets[0].call.arguments, json!({"name": "notes-1"}));
    // While the call waits, what its name leads to changes: the approval is for `notes-1`.
    aliases
        .lock()
        .expect("aliases")
        .insert("notes-1".into(), "secret".into());
    let sink = VecSink::new();
    let resumed = out
        .runtime
        .resume(
            Resume::new(thread.clone()).with_decision(ToolCallResume::approve(&tickets[0].call)),
            &sink,
        )
        .await
        .expect("resumed");
    assert_eq!(resumed.termination, TerminationReason::NaturalEnd);
    let refusal = PermissionRefusal::OtherArguments {
        call_id: ToolCallId::new("c1").expect("id"),
        tool: "open".into(),
        answered: argument_digest(&json!({"name": "notes-1"})),
        actual: argument_digest(&json!({"name": "secret"})),
    };
    let text = render(&sink.events());
    assert!(
        text.contains(&format!(
            "call_done c1 blocked {}",
            json!(refusal.to_string())
        )),
        "{text}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the tool never ran");
}

#[tokio::test]
async fn the_gate_checks_the_answer_it_is_reached_with_whatever_the_path() {
    let mut sections = Sections::new();
    sections.insert("permission", json!({"default": "ask"}));
    let call = ToolCall::new(
        ToolCallId::new("c1").expect("id"),
        "open",
        json!({"name": "notes"}),
    );
    let pending = pending_call(&call);
    let decide_as = |resume: Option<ToolCallResume>, asked_while_running: bool| {
        let run = Arc::new(RunIdentity {
            thread_id: ThreadId::new("thread").expect("id"),
            run_id: RunId::new("run").expect("id"),
            agent_id: "agent".into(),
            profile_id: None,
        });
        let ctx = PhaseContext::new(
            Phase::ToolGate,
            StateStore::new(KeyRegistry::new()).snapshot(),
            run,
        )
        .with_sections(Arc::new(sections.clone()))
        .with_tool(ToolPhaseInfo {
            call: call.clone(),
            result: None,
            resume,
            asked_while_running,
        });
        async move { PermissionGate.decide(&ctx).await.expect("decides") }
    };
    let decide = |resume: Option<ToolCallResume>| decide_as(resume, false);
    let stale = ToolCallResume {
        argument_digest: argument_digest(&json!({"name": "other"})),
        ..ToolCallResume::approve(&pending)
    };
    let denied_stale = ToolCallResume {
        argument_digest: argument_digest(&json!({"name": "other"})),
        ..ToolCallResume::deny(&pending)
    };
    let other_call = ToolCallResume {
        call_id: ToolCallId::new("c2").expect("id"),
        ..ToolCallResume::approve(&pending)
    };
    let blocked = |refusal: PermissionRefusal| {
        Some(ToolInterceptPayload::Block {
            reason: refusal.to_string(),
        })
    };
    let other_arguments = PermissionRefusal::OtherArguments {
        call_id: call.id.clone(),
        tool: "open".into(),
        answered: argument_digest(&json!({"name": "other"})),
        actual: pending.argument_digest.clone(),
    };
    assert!(matches!(
        decide(None).await,
        Some(ToolInterceptPayload::Suspend(_))
    ));
    assert_eq!(decide(Some(ToolCallResume::approve(&pending))).await, None);
    assert_eq!(decide(Some(ToolCallResume::deny(&pending))).await, None);
    assert_eq!(decide(Some(stale)).await, blocked(other_arguments.clone()));
    assert_eq!(decide(Some(denied_stale)).await, blocked(other_arguments));
    assert_eq!(
        decide(Some(other_call)).await,
        blocked(PermissionRefusal::OtherCall {
            call_id: call.id.clone(),
            tool: "open".into(),
            answered: ToolCallId::new("c2").expect("id"),
        })
    );
    // An answer to a question asked while the call ran (its tool's: a delegate relaying its
    // child's) carries that question's digest; the gate let the call run before.
    let childs = ToolCallResume {
        argument_digest: argument_digest(&json!({"text": "the child's call"})),
        ..ToolCallResume::approve(&pending)
    };
    assert_eq!(decide_as(Some(childs.clone()), true).await, None);
    assert!(
        decide(Some(childs)).await.is_some(),
        "never from a gate's question"
    );
}
