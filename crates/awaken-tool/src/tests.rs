//! Unit tests of the pieces that need no runtime: the digest, the idempotency key, the
//! transition table helper, error rendering and the conflict log.

use std::sync::{Arc, Mutex};

use awaken_event::{RunId, ThreadId, ToolCallId, ToolCallState, ToolResult};
use serde_json::{Value, json};

use crate::*;

fn id(s: &str) -> ToolCallId {
    ToolCallId::new(s).unwrap_or_else(|e| panic!("test id {s}: {e}"))
}

#[test]
fn canonical_form_sorts_keys_recursively_and_is_compact() {
    let v = json!({"b": [ {"z": 1, "a": "x\"y\n"} ], "a": null, "é": 1.5, "A": true, "": [] });
    assert_eq!(
        canonical_json(&v),
        r#"{"":[],"A":true,"a":null,"b":[{"a":"x\"y\n","z":1}],"é":1.5}"#
    );
}

#[test]
fn digest_is_pinned_and_ignores_key_order_only() {
    let a = json!({"city": "Paris", "days": 3});
    let b: Value = serde_json::from_str(r#"{ "days" : 3, "city":"Paris" }"#)
        .unwrap_or_else(|e| panic!("fixture: {e}"));
    assert_eq!(argument_digest(&a), argument_digest(&b));
    // Pinned (computed independently with `printf '{"city":"Paris","days":3}' | sha256sum`):
    // the digest is persisted in tickets and compared across processes and versions.
    assert_eq!(
        argument_digest(&a),
        "sha256:3d2e15266c8f3cadfde0307ac8ab31fa7d6cbcb95b5fb16e7e1c48a961db5969"
    );
    assert_ne!(
        argument_digest(&a),
        argument_digest(&json!({"city": "Paris", "days": 4}))
    );
    assert_ne!(argument_digest(&json!(1)), argument_digest(&json!(1.0)));
    assert_ne!(
        argument_digest(&json!(["a", "b"])),
        argument_digest(&json!(["b", "a"]))
    );
    assert_ne!(
        argument_digest(&json!({"a": {"b": 1}})),
        argument_digest(&json!({"a": {"b": "1"}}))
    );
}

#[test]
fn idempotency_key_is_derived_from_the_three_ids_only() {
    let (t, r, c) = (
        ThreadId::new("t1").unwrap_or_else(|e| panic!("{e}")),
        RunId::new("r1").unwrap_or_else(|e| panic!("{e}")),
        id("c1"),
    );
    let key = IdempotencyKey::derive(&t, &r, &c);
    // Pinned (`printf 'awaken.idempotency.v1\n2:t12:r12:c1' | sha256sum`).
    assert_eq!(
        key.as_str(),
        "awk1-e29b63d7d988cd38f985b32ea6d188858430b20fd0f447498f0d792e483b56b1"
    );
    assert_eq!(key, IdempotencyKey::derive(&t, &r, &c));
    // Lengths are part of the hashed text, so shifting characters between ids changes it.
    let shifted = IdempotencyKey::derive(
        &ThreadId::new("t1r").unwrap_or_else(|e| panic!("{e}")),
        &RunId::new("1").unwrap_or_else(|e| panic!("{e}")),
        &c,
    );
    assert_ne!(key, shifted);
    assert_ne!(key, IdempotencyKey::derive(&t, &r, &id("c2")));
    let json = serde_json::to_string(&key).unwrap_or_default();
    assert_eq!(json, format!("\"{key}\""));
}

#[test]
fn suspension_ids_are_deterministic_and_differ_per_attempt() {
    let digest = argument_digest(&json!({"x": 1}));
    let a0 = suspension_id(&id("call_1"), &digest, 0);
    assert_eq!(a0, format!("call_1:0:{}", &digest[7..23]));
    assert_eq!(a0, suspension_id(&id("call_1"), &digest, 0));
    assert_ne!(a0, suspension_id(&id("call_1"), &digest, 1));
    assert_eq!(suspension_id(&id("c"), "short", 2), "c:2:short");
}

#[test]
fn recovery_defaults_follow_the_effect_class() {
    use awaken_event::EffectClass as E;
    assert_eq!(
        ToolRecoveryPolicy::default_for(E::ReadOnly),
        ToolRecoveryPolicy::Rerun
    );
    assert_eq!(
        ToolRecoveryPolicy::default_for(E::Idempotent),
        ToolRecoveryPolicy::Rerun
    );
    assert_eq!(
        ToolRecoveryPolicy::default_for(E::SideEffecting),
        ToolRecoveryPolicy::CloseOutcomeUnknown
    );
    assert!(!ToolRecoveryPolicy::Rerun.is_allowed_for(E::SideEffecting));
    assert!(ToolRecoveryPolicy::SuspendForHuman.is_allowed_for(E::SideEffecting));
    assert_eq!(
        RecoveryAction::Rerun.target_state(),
        Some(ToolCallState::Executing)
    );
    assert_eq!(RecoveryAction::Regate.target_state(), None);
}

#[test]
fn tool_errors_render_for_the_model_and_pick_their_closing_state() {
    let invalid = ToolError::InvalidArguments {
        tool_id: "weather".into(),
        violations: vec![
            Violation {
                path: String::new(),
                message: "\"city\" is a required property".into(),
            },
            Violation {
                path: "/days".into(),
                message: "\"x\" is not of type \"integer\"".into(),
            },
        ],
    };
    expect_test::expect![[r#"invalid arguments for tool `weather`: at (root): "city" is a required property; at /days: "x" is not of type "integer""#]]
    .assert_eq(&invalid.to_string());
    assert_eq!(invalid.to_result(), ToolResult::error(invalid.to_string()));
    assert_eq!(invalid.closing_state(), ToolCallState::Failed);
    let cancelled = ToolError::Cancelled {
        tool_id: "t".into(),
    };
    assert_eq!(cancelled.closing_state(), ToolCallState::Cancelled);
    let timeout = ToolError::Timeout {
        tool_id: "t".into(),
        after: Some(std::time::Duration::from_secs(2)),
    };
    assert_eq!(timeout.to_string(), "tool `t` timed out after 2s");
    assert_eq!(ToolError::execution("boom").to_string(), "boom");
}

/// A minimal subscriber that records the level and message of every event.
#[derive(Default, Clone)]
struct Recorder(Arc<Mutex<Vec<(tracing::Level, String)>>>);

struct MessageVisitor<'a>(&'a mut String);
impl tracing::field::Visit for MessageVisitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut text = String::new();
        event.record(&mut MessageVisitor(&mut text));
        if let Ok(mut log) = self.0.lock() {
            log.push((*event.metadata().level(), text));
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_tie_is_logged_at_error_level_and_an_outranked_decision_is_not() {
    let recorder = Recorder::default();
    let resolution = tracing::subscriber::with_default(recorder.clone(), || {
        resolve_gate_decisions([
            GateDecision::new("p1", ToolInterceptPayload::block("first")),
            GateDecision::new(
                "p2",
                ToolInterceptPayload::SetResult(ToolResult::success(json!(1))),
            ),
            GateDecision::new("p3", ToolInterceptPayload::block("second")),
        ])
    });
    assert_eq!(resolution.conflicts.len(), 1);
    let log = recorder.0.lock().map(|l| l.clone()).unwrap_or_default();
    assert_eq!(log.len(), 1, "one conflict, one log line: {log:?}");
    assert_eq!(log[0].0, tracing::Level::ERROR);
    assert!(
        log[0].1.contains("winner=p1") && log[0].1.contains("loser=p3"),
        "{}",
        log[0].1
    );
}

fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop::sample::select(vec![0.5f64, -2.25, 1e100, 3.0]).prop_map(Value::from),
        "\\PC{0,6}|[\"\\\\\n\t\u{1}é]{0,3}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec(("[a-cA-C_é]{0,3}", inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Rebuilds every object inserting its keys in reverse order (a no-op for the default sorted
/// map; the guard for a build where `serde_json/preserve_order` is on).
fn reversed(v: &Value) -> Value {
    match v {
        Value::Array(items) => Value::Array(items.iter().map(reversed).collect()),
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> =
                map.iter().map(|(k, v)| (k.clone(), reversed(v))).collect();
            entries.reverse();
            Value::Object(entries.into_iter().collect())
        }
        other => other.clone(),
    }
}

proptest::proptest! {
    #[test]
    fn canonical_json_is_lossless_and_independent_of_key_order(v in arb_json()) {
        let text = canonical_json(&v);
        let back: Value = serde_json::from_str(&text)
            .map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{e}: {text}")))?;
        proptest::prop_assert_eq!(&back, &v);
        proptest::prop_assert_eq!(canonical_json(&back), text.clone());
        proptest::prop_assert_eq!(canonical_json(&reversed(&v)), text);
        proptest::prop_assert_eq!(argument_digest(&reversed(&v)), argument_digest(&v));
    }
}
