//! The standard permission plugin: each decision, rule order, argument matchers, the default,
//! approval asked once, bad configuration.

use awaken_event::{TerminationReason, ThreadId, ToolCallResume};
use awaken_llm::{ScriptToolCall, ScriptTurn};
use awaken_runtime::{PERMISSION_PLUGIN, Resume};
use serde_json::json;

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
