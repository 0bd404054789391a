//! The tool batch: the transition table as a model for random transition sequences, closing,
//! and the serde round trip.

use std::sync::Arc;

use awaken_event::{ResumeMode, SuspendTicket, ToolCall, ToolCallId, ToolCallState, ToolResult};
use awaken_tool::{
    BatchError, OUTCOME_UNKNOWN_MESSAGE, ToolBatch, ToolError, ToolInterceptPayload,
    is_allowed_transition, pending_call,
};
use expect_test::expect;
use proptest::prelude::*;
use serde_json::json;

use crate::support::{call, call_id};

use ToolCallState as S;

/// The transition table as `is_allowed_transition` documents it, written out independently
/// (the model the batch is checked against).
const DESIGN_TABLE: [(S, &[S]); 3] = [
    (
        S::Requested,
        &[
            S::Executing,
            S::Blocked,
            S::Suspended,
            S::ShortCircuited,
            S::Cancelled,
        ],
    ),
    (
        S::Executing,
        &[
            S::Succeeded,
            S::Failed,
            S::Cancelled,
            S::Executing,
            S::OutcomeUnknown,
            S::Suspended,
        ],
    ),
    (
        S::Suspended,
        &[
            S::Executing,
            S::ShortCircuited,
            S::Blocked,
            S::Suspended,
            S::Cancelled,
        ],
    ),
];

fn model_allows(from: S, to: S) -> bool {
    DESIGN_TABLE
        .iter()
        .any(|(f, tos)| *f == from && tos.contains(&to))
}

fn ticket(id: &ToolCallId, n: usize) -> SuspendTicket {
    let c = call(id.as_str(), "tool", json!({"n": 1}));
    SuspendTicket {
        suspension_id: format!("{id}:{n}"),
        call: pending_call(&c),
        message: "approve?".into(),
        response_schema: None,
        resume_mode: ResumeMode::Replay,
    }
}

fn batch(n: usize) -> ToolBatch {
    ToolBatch::new((0..n).map(|i| call(&format!("call_{i}"), "tool", json!({"i": i}))))
        .expect("distinct ids")
}

/// Moves `id` to `to` with the payload that target needs.
fn step(b: &mut ToolBatch, id: &ToolCallId, to: S, n: usize) -> Result<(), BatchError> {
    if to == S::Suspended {
        b.suspend(id, ticket(id, n))
    } else if to.is_terminal() {
        b.transition(id, to, Some(ToolResult::error(format!("{to} #{n}"))))
    } else {
        b.transition(id, to, None)
    }
}

fn round_trip(b: &ToolBatch) -> ToolBatch {
    let json = serde_json::to_string(b).expect("serialize");
    serde_json::from_str(&json).expect("deserialize")
}

#[test]
fn the_table_is_designs_table() {
    let mut out = String::from("from \\ to   ");
    for to in S::ALL {
        out.push_str(&format!("{:>4}", &to.as_str()[..3]));
    }
    out.push('\n');
    for from in S::ALL {
        out.push_str(&format!("{:<12}", from.as_str()));
        for to in S::ALL {
            assert_eq!(is_allowed_transition(from, to), model_allows(from, to));
            out.push_str(if is_allowed_transition(from, to) {
                "   x"
            } else {
                "   ."
            });
        }
        out.push('\n');
    }
    expect![[r#"
        from \ to    req exe sus suc fai blo sho can out
        requested      .   x   x   .   .   x   x   x   .
        executing      .   x   x   x   x   .   .   x   x
        suspended      .   x   x   .   .   x   x   x   .
        succeeded      .   .   .   .   .   .   .   .   .
        failed         .   .   .   .   .   .   .   .   .
        blocked        .   .   .   .   .   .   .   .   .
        short_circuited   .   .   .   .   .   .   .   .   .
        cancelled      .   .   .   .   .   .   .   .   .
        outcome_unknown   .   .   .   .   .   .   .   .   .
    "#]]
    .assert_eq(&out);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_follow_the_table_and_closing_gives_one_result_each(
        n in 1usize..=4,
        ops in prop::collection::vec((0usize..4, 0usize..9), 0..40),
    ) {
        let mut b = batch(n);
        let ids: Vec<ToolCallId> = b.calls().iter().map(|c| c.id().clone()).collect();
        let mut model: Vec<S> = vec![S::Requested; n];
        for (k, (i, t)) in ops.into_iter().enumerate() {
            let i = i % n;
            let to = S::ALL[t];
            let before = b.clone();
            let outcome = step(&mut b, &ids[i], to, k);
            let allowed = model_allows(model[i], to);
            prop_assert_eq!(outcome.is_ok(), allowed, "{} -> {}: {:?}", model[i], to, outcome);
            if allowed {
                model[i] = to;
            } else {
                prop_assert_eq!(
                    outcome,
                    Err(BatchError::InvalidTransition { call_id: ids[i].clone(), from: model[i], to })
                );
                // A refused move changes nothing; in particular a terminal call keeps its
                // state and its one result.
                prop_assert_eq!(&b, &before);
            }
            for (j, id) in ids.iter().enumerate() {
                let c = b.get(id).expect("call");
                prop_assert_eq!(c.state(), model[j]);
                prop_assert_eq!(c.result().is_some(), model[j].is_terminal());
            }
            prop_assert_eq!(&round_trip(&b), &b);
        }
        let before = b.clone();
        let closed = b.close("the run ended");
        prop_assert!(b.is_closed());
        prop_assert_eq!(b.closing_results().count(), n);
        for (j, id) in ids.iter().enumerate() {
            let c = b.get(id).expect("call");
            let was = before.get(id).expect("call");
            prop_assert!(c.state().is_terminal());
            prop_assert!(model_allows(model[j], c.state()) || model[j] == c.state());
            if model[j].is_terminal() {
                prop_assert_eq!(c, was, "a terminal call keeps its result");
                prop_assert!(!closed.contains(id));
            } else {
                prop_assert!(closed.contains(id));
                let expected = if model[j] == S::Executing { S::OutcomeUnknown } else { S::Cancelled };
                prop_assert_eq!(c.state(), expected);
            }
        }
        prop_assert_eq!(&round_trip(&b), &b);
        prop_assert!(b.close("again").is_empty());
    }
}

#[test]
fn closing_gives_each_open_call_its_documented_result() {
    let mut b = batch(5);
    let id = |i: usize| call_id(&format!("call_{i}"));
    b.start(&id(1)).expect("exec");
    b.suspend(&id(2), ticket(&id(2), 0)).expect("suspend");
    b.start(&id(3)).expect("exec");
    b.succeed(&id(3), ToolResult::success(json!("done")))
        .expect("ok");
    b.apply_gate(&id(4), &ToolInterceptPayload::block("not allowed"))
        .expect("block");
    assert!(!b.is_closed());
    assert_eq!(b.open_calls().count(), 3);
    let closed = b.close("round limit");
    assert_eq!(closed, vec![id(0), id(1), id(2)]);
    let out: String = b
        .calls()
        .iter()
        .map(|c| {
            format!(
                "{} {} {}\n",
                c.id(),
                c.state(),
                c.result()
                    .map(|r| r.content.to_string())
                    .unwrap_or_default()
            )
        })
        .collect();
    expect![[r#"
        call_0 cancelled "not executed: round limit"
        call_1 outcome_unknown "outcome unknown: the call was interrupted while it was executing, so its effect may or may not have happened; check before calling it again"
        call_2 cancelled "not executed: round limit"
        call_3 succeeded "done"
        call_4 blocked "not allowed"
    "#]]
    .assert_eq(&out);
    assert_eq!(
        b.get(&id(1)).and_then(|c| c.result()),
        Some(&ToolResult::error(OUTCOME_UNKNOWN_MESSAGE))
    );
}

#[test]
fn gate_decisions_and_tool_errors_land_in_their_states() {
    let mut b = batch(4);
    let id = |i: usize| call_id(&format!("call_{i}"));
    let set = ToolResult::success(json!("cached"));
    b.apply_gate(&id(0), &ToolInterceptPayload::SetResult(set.clone()))
        .expect("short-circuit");
    b.apply_gate(&id(1), &ToolInterceptPayload::Suspend(ticket(&id(1), 0)))
        .expect("suspend");
    b.start(&id(2)).expect("exec");
    b.fail_with(
        &id(2),
        &ToolError::Cancelled {
            tool_id: "tool".into(),
        },
    )
    .expect("cancelled");
    b.start(&id(3)).expect("exec");
    b.start(&id(3)).expect("re-run after a crash");
    b.fail_with(&id(3), &ToolError::execution("boom"))
        .expect("failed");
    assert_eq!(b.state(&id(0)), Some(S::ShortCircuited));
    assert_eq!(b.get(&id(0)).and_then(|c| c.result()), Some(&set));
    assert_eq!(b.state(&id(1)), Some(S::Suspended));
    assert_eq!(
        b.get(&id(1))
            .and_then(|c| c.ticket())
            .map(|t| t.suspension_id.as_str()),
        Some("call_1:0")
    );
    assert_eq!(b.state(&id(2)), Some(S::Cancelled));
    assert_eq!(b.state(&id(3)), Some(S::Failed));
    assert_eq!(b.get(&id(3)).map(|c| c.attempts()), Some(2));
    assert_eq!(
        b.get(&id(3)).and_then(|c| c.result()),
        Some(&ToolResult::error("boom"))
    );
}

#[test]
fn malformed_moves_are_typed_errors_that_change_nothing() {
    let mut b = batch(1);
    let id = call_id("call_0");
    let before = b.clone();
    assert_eq!(
        b.transition(&id, S::Blocked, None),
        Err(BatchError::MissingResult {
            call_id: id.clone(),
            to: S::Blocked
        })
    );
    assert_eq!(
        b.transition(&id, S::Executing, Some(ToolResult::success(json!(1)))),
        Err(BatchError::UnexpectedResult {
            call_id: id.clone(),
            to: S::Executing
        })
    );
    assert_eq!(
        b.transition(&id, S::Suspended, None),
        Err(BatchError::MissingTicket {
            call_id: id.clone()
        })
    );
    assert_eq!(
        b.succeed(&id, ToolResult::success(json!(1))),
        Err(BatchError::InvalidTransition {
            call_id: id.clone(),
            from: S::Requested,
            to: S::Succeeded
        })
    );
    assert_eq!(
        b.start(&call_id("nope")),
        Err(BatchError::UnknownCall {
            call_id: call_id("nope")
        })
    );
    assert_eq!(b, before);
    assert_eq!(
        ToolBatch::new([call("x", "t", json!({})), call("x", "t", json!({}))]),
        Err(BatchError::DuplicateCall {
            call_id: call_id("x")
        })
    );
}

#[test]
fn a_batch_of_a_messages_shared_calls_is_the_batch_of_those_calls() {
    let calls: Arc<[ToolCall]> = (0..3)
        .map(|i| call(&format!("call_{i}"), "tool", json!({"i": i})))
        .collect();
    let mut shared = ToolBatch::of_shared(&calls).expect("distinct ids");
    let mut owned = batch(3);
    assert_eq!(shared, owned);
    assert_eq!(
        serde_json::to_value(&shared).expect("json"),
        serde_json::to_value(&owned).expect("json")
    );
    for (i, c) in shared.calls().iter().enumerate() {
        assert_eq!(c.call(), &calls[i]);
    }
    // Read back, it is the same batch, and it changes like one.
    let read: ToolBatch =
        serde_json::from_value(serde_json::to_value(&shared).expect("json")).expect("read back");
    assert_eq!(read, shared);
    for b in [&mut shared, &mut owned] {
        b.start(&call_id("call_1")).expect("start");
    }
    assert_eq!(shared, owned);
    let twice: Arc<[ToolCall]> = Arc::from([call("x", "t", json!({})), call("x", "t", json!({}))]);
    assert_eq!(
        ToolBatch::of_shared(&twice),
        Err(BatchError::DuplicateCall {
            call_id: call_id("x")
        })
    );
}

#[test]
fn arguments_change_only_before_a_call_runs_and_stop_being_shared() {
    let calls: Arc<[ToolCall]> = (0..3)
        .map(|i| {
            call(
                &format!("call_{i}"),
                "tool",
                json!({"path": format!("./f{i}")}),
            )
        })
        .collect();
    let mut b = ToolBatch::of_shared(&calls).expect("distinct ids");
    let canonical = |i: usize| Arc::new(json!({"path": format!("f{i}")}));
    // Requested, and suspended (a resumed call passes the gates again).
    b.set_arguments(&call_id("call_0"), canonical(0))
        .expect("requested");
    b.suspend(&call_id("call_1"), ticket(&call_id("call_1"), 0))
        .expect("suspend");
    b.set_arguments(&call_id("call_1"), canonical(1))
        .expect("suspended");
    b.start(&call_id("call_2")).expect("start");
    let before = b.clone();
    assert_eq!(
        b.set_arguments(&call_id("call_2"), canonical(2)),
        Err(BatchError::ArgumentsFixed {
            call_id: call_id("call_2"),
            state: S::Executing
        })
    );
    assert_eq!(
        b.set_arguments(&call_id("nope"), canonical(2)),
        Err(BatchError::UnknownCall {
            call_id: call_id("nope")
        })
    );
    assert_eq!(b, before);
    let shown: Vec<String> = b
        .calls()
        .iter()
        .map(|c| format!("{} {} {}", c.id(), c.state(), c.call().arguments))
        .collect();
    assert_eq!(
        shown,
        [
            r#"call_0 requested {"path":"f0"}"#,
            r#"call_1 suspended {"path":"f1"}"#,
            r#"call_2 executing {"path":"./f2"}"#,
        ]
    );
    // The message's calls keep the model's arguments; the batch's are its own and read back.
    assert_eq!(calls[0].arguments, Arc::new(json!({"path": "./f0"})));
    assert_eq!(round_trip(&b), b);
}

#[test]
fn the_stored_form_is_stable_and_checked_when_read() {
    let mut b = batch(2);
    b.start(&call_id("call_0")).expect("exec");
    b.succeed(&call_id("call_0"), ToolResult::success(json!({"t": 21})))
        .expect("ok");
    expect![[r#"{"calls":[{"call":{"id":"call_0","name":"tool","arguments":{"i":0}},"state":"succeeded","result":{"status":"success","content":{"t":21}},"attempts":1},{"call":{"id":"call_1","name":"tool","arguments":{"i":1}},"state":"requested","attempts":0}]}"#]]
    .assert_eq(&serde_json::to_string(&b).expect("serialize"));
    assert_eq!(round_trip(&b), b);

    let no_result = r#"{"calls":[{"call":{"id":"a","name":"t","arguments":{}},"state":"failed"}]}"#;
    let err = serde_json::from_str::<ToolBatch>(no_result).expect_err("inconsistent");
    assert!(
        err.to_string()
            .contains("a terminal call has no closing result"),
        "{err}"
    );
    let open_with_result = r#"{"calls":[{"call":{"id":"a","name":"t","arguments":{}},"state":"executing","result":{"status":"success","content":1}}]}"#;
    assert!(serde_json::from_str::<ToolBatch>(open_with_result).is_err());
    let suspended_without_ticket =
        r#"{"calls":[{"call":{"id":"a","name":"t","arguments":{}},"state":"suspended"}]}"#;
    assert!(serde_json::from_str::<ToolBatch>(suspended_without_ticket).is_err());
    let duplicate = r#"{"calls":[{"call":{"id":"a","name":"t","arguments":{}},"state":"requested"},{"call":{"id":"a","name":"t","arguments":{}},"state":"requested"}]}"#;
    assert!(serde_json::from_str::<ToolBatch>(duplicate).is_err());
}

#[test]
fn a_suspension_while_running_is_recorded_and_read_back() {
    let ticket = |id: &str| SuspendTicket {
        suspension_id: format!("s-{id}"),
        call: pending_call(&call(id, "tool", json!({}))),
        message: "?".into(),
        response_schema: None,
        resume_mode: ResumeMode::PassDecisionToTool,
    };
    let mut batch = ToolBatch::new([
        call("gated", "tool", json!({})),
        call("asked", "tool", json!({})),
    ])
    .expect("batch");
    let (gated, asked) = (call_id("gated"), call_id("asked"));
    batch.suspend(&gated, ticket("gated")).expect("a gate asks");
    batch.start(&asked).expect("runs");
    batch
        .suspend(&asked, ticket("asked"))
        .expect("its tool asks");
    let flags = |b: &ToolBatch| {
        b.calls()
            .iter()
            .map(|c| c.asked_while_running())
            .collect::<Vec<_>>()
    };
    assert_eq!(flags(&batch), [false, true]);
    let read: ToolBatch =
        serde_json::from_value(serde_json::to_value(&batch).expect("json")).expect("reads");
    assert_eq!(flags(&read), [false, true]);
    // Resumed, and asked again by a gate before it runs: the new question is the gate's.
    batch.suspend(&asked, ticket("asked")).expect("a gate asks");
    assert_eq!(flags(&batch), [false, false]);
}
