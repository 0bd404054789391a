//! Gate decisions: priority for every pair and triple, ties, and their serde form. (The hooks
//! that make decisions, and the runner that asks them, are tested in `awaken-plugin`.)

use awaken_event::{ResumeMode, SuspendTicket, ToolResult};
use awaken_tool::{
    GateDecision, InterceptKind, ToolInterceptPayload, pending_call, resolve_gate_decisions,
};
use expect_test::expect;
use serde_json::json;

use crate::support::call;

const KINDS: [InterceptKind; 3] = [
    InterceptKind::Block,
    InterceptKind::Suspend,
    InterceptKind::SetResult,
];

fn letter(kind: InterceptKind) -> &'static str {
    match kind {
        InterceptKind::Block => "B",
        InterceptKind::Suspend => "S",
        InterceptKind::SetResult => "R",
    }
}

/// A decision of `kind` from plugin `p<index>`, whose payload names its source.
fn decision(index: usize, kind: InterceptKind) -> GateDecision {
    let source = format!("p{index}");
    let payload = match kind {
        InterceptKind::Block => ToolInterceptPayload::block(source.clone()),
        InterceptKind::Suspend => {
            let c = call("c1", "tool", json!({}));
            ToolInterceptPayload::Suspend(SuspendTicket {
                suspension_id: source.clone(),
                call: pending_call(&c),
                message: "ok?".into(),
                response_schema: None,
                resume_mode: ResumeMode::Replay,
            })
        }
        InterceptKind::SetResult => {
            ToolInterceptPayload::SetResult(ToolResult::success(json!(source.clone())))
        }
    };
    GateDecision::new(source, payload)
}

/// `B S R -> p0 block; conflicts: ...` for one sequence of decisions in plugin order.
fn render(kinds: &[InterceptKind]) -> String {
    let resolution = resolve_gate_decisions(kinds.iter().enumerate().map(|(i, k)| decision(i, *k)));
    let seq: Vec<&str> = kinds.iter().map(|k| letter(*k)).collect();
    let winner = resolution.decision.as_ref().expect("some decision wins");
    // The payload really is the winner's (not just the label).
    assert_eq!(
        winner.payload,
        decision(index_of(&winner.source), winner.payload.kind()).payload
    );
    let conflicts: Vec<String> = resolution
        .conflicts
        .iter()
        .map(|c| {
            assert_eq!(c.winner, winner.source);
            assert_eq!(c.kind, winner.payload.kind());
            c.loser.clone()
        })
        .collect();
    let mut line = format!(
        "{} -> {} {}",
        seq.join(" "),
        winner.source,
        letter(winner.payload.kind())
    );
    if !conflicts.is_empty() {
        line.push_str(&format!("; tie lost by {}", conflicts.join(", ")));
    }
    line.push('\n');
    line
}

fn index_of(source: &str) -> usize {
    source[1..].parse().expect("p<index>")
}

#[test]
fn no_decision_lets_the_call_run() {
    let resolution = resolve_gate_decisions(Vec::new());
    assert!(resolution.is_allowed());
    assert!(resolution.conflicts.is_empty());
}

#[test]
fn a_single_decision_wins_alone() {
    let out: String = KINDS.iter().map(|k| render(&[*k])).collect();
    expect![[r#"
        B -> p0 B
        S -> p0 S
        R -> p0 R
    "#]]
    .assert_eq(&out);
}

#[test]
fn every_pair_resolves_by_priority_and_ties_go_to_the_first() {
    let mut out = String::new();
    for a in KINDS {
        for b in KINDS {
            out.push_str(&render(&[a, b]));
        }
    }
    expect![[r#"
        B B -> p0 B; tie lost by p1
        B S -> p0 B
        B R -> p0 B
        S B -> p1 B
        S S -> p0 S; tie lost by p1
        S R -> p0 S
        R B -> p1 B
        R S -> p1 S
        R R -> p0 R; tie lost by p1
    "#]]
    .assert_eq(&out);
}

#[test]
fn every_triple_resolves_by_priority_and_ties_go_to_the_first() {
    let mut out = String::new();
    for a in KINDS {
        for b in KINDS {
            for c in KINDS {
                out.push_str(&render(&[a, b, c]));
            }
        }
    }
    expect![[r#"
        B B B -> p0 B; tie lost by p1, p2
        B B S -> p0 B; tie lost by p1
        B B R -> p0 B; tie lost by p1
        B S B -> p0 B; tie lost by p2
        B S S -> p0 B
        B S R -> p0 B
        B R B -> p0 B; tie lost by p2
        B R S -> p0 B
        B R R -> p0 B
        S B B -> p1 B; tie lost by p2
        S B S -> p1 B
        S B R -> p1 B
        S S B -> p2 B
        S S S -> p0 S; tie lost by p1, p2
        S S R -> p0 S; tie lost by p1
        S R B -> p2 B
        S R S -> p0 S; tie lost by p2
        S R R -> p0 S
        R B B -> p1 B; tie lost by p2
        R B S -> p1 B
        R B R -> p1 B
        R S B -> p2 B
        R S S -> p1 S; tie lost by p2
        R S R -> p1 S
        R R B -> p2 B
        R R S -> p2 S
        R R R -> p0 R; tie lost by p1, p2
    "#]]
    .assert_eq(&out);
}

#[test]
fn decisions_serialize_with_a_kind_tag() {
    let payload = ToolInterceptPayload::block("no");
    let json = serde_json::to_value(&payload).expect("serialize");
    assert_eq!(json, json!({"kind": "block", "reason": "no"}));
    let back: ToolInterceptPayload = serde_json::from_value(json).expect("deserialize");
    assert_eq!(back, payload);
    let set = ToolInterceptPayload::SetResult(ToolResult::success(json!(2)));
    let back: ToolInterceptPayload =
        serde_json::from_value(serde_json::to_value(&set).expect("serialize")).expect("de");
    assert_eq!(back, set);
}
