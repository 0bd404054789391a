//! Gate decisions: priority for every pair and triple, ties, the gate runner, and the typed
//! policy hook adapted into a gate.

use std::sync::Arc;

use awaken_event::{
    ResumeDecision, ResumeMode, SuspendTicket, ToolCall, ToolCallResume, ToolResult,
};
use awaken_phase::{HookError, PhaseContext};
use awaken_tool::{
    FnGate, GateDecision, GateError, InterceptKind, PolicyDecision, PolicyGate, ToolGateHook,
    ToolInterceptPayload, ToolPolicyHook, argument_digest, evaluate_gates, pending_call,
    resolve_gate_decisions,
};
use expect_test::expect;
use serde::Deserialize;
use serde_json::json;

use crate::support::{call, gate_ctx};

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

fn gate(
    f: impl Fn(&PhaseContext) -> Result<Option<ToolInterceptPayload>, HookError> + Send + Sync + 'static,
) -> Arc<dyn ToolGateHook> {
    Arc::new(FnGate(f))
}

#[tokio::test]
async fn the_runner_asks_every_gate_in_order_and_resolves() {
    let hooks: Vec<(String, Arc<dyn ToolGateHook>)> = vec![
        ("allow".into(), gate(|_| Ok(None))),
        (
            "short".into(),
            gate(|_| {
                Ok(Some(ToolInterceptPayload::SetResult(ToolResult::success(
                    json!(1),
                ))))
            }),
        ),
        (
            "block-a".into(),
            gate(|_| Ok(Some(ToolInterceptPayload::block("a")))),
        ),
        (
            "block-b".into(),
            gate(|ctx| {
                // Gates see the call through the context.
                let name = &ctx.tool.as_ref().expect("call").call.name;
                Ok(Some(ToolInterceptPayload::block(format!("b on {name}"))))
            }),
        ),
    ];
    let ctx = gate_ctx(call("c1", "rm", json!({})), None);
    let resolution = evaluate_gates(&hooks, &ctx).await.expect("gates");
    let winner = resolution.decision.expect("a decision");
    assert_eq!(winner.source, "block-a");
    assert_eq!(winner.payload, ToolInterceptPayload::block("a"));
    assert_eq!(resolution.conflicts.len(), 1);
    assert_eq!(resolution.conflicts[0].loser, "block-b");

    let allow_all: Vec<(String, Arc<dyn ToolGateHook>)> =
        vec![("allow".into(), gate(|_| Ok(None)))];
    assert!(
        evaluate_gates(&allow_all, &ctx)
            .await
            .expect("gates")
            .is_allowed()
    );
}

#[tokio::test]
async fn a_failing_gate_names_its_source_and_a_context_without_a_call_is_refused() {
    let hooks: Vec<(String, Arc<dyn ToolGateHook>)> = vec![
        ("ok".into(), gate(|_| Ok(None))),
        (
            "broken".into(),
            gate(|_| Err(HookError::failed("no policy table"))),
        ),
    ];
    let ctx = gate_ctx(call("c1", "rm", json!({})), None);
    let err = evaluate_gates(&hooks, &ctx)
        .await
        .expect_err("failing gate");
    assert!(
        matches!(&err, GateError::Hook { source_id, call_id, .. } if source_id == "broken" && call_id.as_str() == "c1"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "tool gate of `broken` failed on call `c1`: no policy table"
    );
    let mut no_call = ctx.clone();
    no_call.tool = None;
    assert!(matches!(
        evaluate_gates(&hooks, &no_call).await,
        Err(GateError::NoToolCall)
    ));
}

#[derive(Deserialize)]
struct ShellArgs {
    command: String,
}

/// Asks before `rm`, blocks `shutdown`, answers `date` itself, allows the rest; covers only
/// the tool `shell`.
struct ShellPolicy;

impl ToolPolicyHook for ShellPolicy {
    type Args = ShellArgs;

    fn applies_to(&self, tool_name: &str) -> bool {
        tool_name == "shell"
    }

    fn decide(
        &self,
        _call: &ToolCall,
        args: ShellArgs,
        _ctx: &PhaseContext,
    ) -> Result<PolicyDecision, HookError> {
        Ok(match args.command.split_whitespace().next() {
            Some("rm") => PolicyDecision::ask(format!("run `{}`?", args.command)),
            Some("shutdown") => PolicyDecision::Block {
                reason: "shutdown is not allowed".into(),
            },
            Some("date") => PolicyDecision::Respond(ToolResult::success(json!("Monday"))),
            Some("fail") => return Err(HookError::failed("policy broke")),
            _ => PolicyDecision::Allow,
        })
    }
}

async fn policy(c: ToolCall, resume: Option<ToolCallResume>) -> Option<ToolInterceptPayload> {
    PolicyGate(ShellPolicy)
        .decide(&gate_ctx(c, resume))
        .await
        .expect("policy")
}

fn resume(c: &ToolCall, digest: String, decision: ResumeDecision) -> Option<ToolCallResume> {
    Some(ToolCallResume {
        call_id: c.id.clone(),
        argument_digest: digest,
        decision,
        payload: None,
    })
}

#[tokio::test]
async fn a_policy_hook_maps_its_typed_decisions_to_gate_decisions() {
    assert_eq!(
        policy(call("c", "shell", json!({"command": "ls"})), None).await,
        None
    );
    assert_eq!(
        policy(call("c", "editor", json!({"command": "rm -rf /"})), None).await,
        None,
        "other tools are not covered"
    );
    assert_eq!(
        policy(call("c", "shell", json!({"command": "shutdown now"})), None).await,
        Some(ToolInterceptPayload::block("shutdown is not allowed"))
    );
    assert_eq!(
        policy(call("c", "shell", json!({"command": "date"})), None).await,
        Some(ToolInterceptPayload::SetResult(ToolResult::success(json!(
            "Monday"
        ))))
    );
    let err = PolicyGate(ShellPolicy)
        .decide(&gate_ctx(
            call("c", "shell", json!({"command": "fail"})),
            None,
        ))
        .await
        .expect_err("the policy's own error");
    assert_eq!(err.to_string(), "policy broke");
}

#[tokio::test]
async fn a_policy_fails_closed_on_arguments_it_cannot_read() {
    let decision = policy(call("c", "shell", json!({"cmd": "rm x"})), None).await;
    match decision {
        Some(ToolInterceptPayload::Block { reason }) => {
            assert!(reason.contains("missing field `command`"), "{reason}")
        }
        other => panic!("expected a block, got {other:?}"),
    }
}

#[tokio::test]
async fn ask_suspends_until_these_exact_arguments_are_approved() {
    let c = call("c7", "shell", json!({"command": "rm a.txt"}));
    let digest = argument_digest(&c.arguments);
    let first = match policy(c.clone(), None).await {
        Some(ToolInterceptPayload::Suspend(ticket)) => ticket,
        other => panic!("expected a suspension, got {other:?}"),
    };
    assert_eq!(first.call, pending_call(&c));
    assert_eq!(first.call.argument_digest, digest);
    assert_eq!(first.message, "run `rm a.txt`?");
    assert_eq!(first.suspension_id, format!("c7:0:{}", &digest[7..23]));

    // Approved for exactly these arguments: the gate lets it through, it does not ask again.
    assert_eq!(
        policy(
            c.clone(),
            resume(&c, digest.clone(), ResumeDecision::Approve)
        )
        .await,
        None
    );
    // An approval of other arguments does not count: a new suspension, with a new id.
    let other_digest = argument_digest(&json!({"command": "rm b.txt"}));
    match policy(c.clone(), resume(&c, other_digest, ResumeDecision::Approve)).await {
        Some(ToolInterceptPayload::Suspend(ticket)) => {
            assert_ne!(ticket.suspension_id, first.suspension_id);
            assert_eq!(ticket.call.argument_digest, digest);
        }
        other => panic!("expected a new suspension, got {other:?}"),
    }
    // A denial blocks.
    assert!(matches!(
        policy(c.clone(), resume(&c, digest, ResumeDecision::Deny)).await,
        Some(ToolInterceptPayload::Block { .. })
    ));
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
