//! Tool-gate hooks: the runner that asks every gate of a call in plugin order and resolves
//! their decisions, and the typed policy hook adapted into a gate.

use std::sync::Arc;

use awaken_event::{
    ResumeDecision, RunId, ThreadId, ToolCall, ToolCallId, ToolCallResume, ToolResult,
};
use awaken_phase::{HookError, Phase, PhaseContext, RunIdentity, ToolPhaseInfo};
use awaken_plugin::{FnGate, GateError, PolicyGate, ToolGateHook, ToolPolicyHook, evaluate_gates};
use awaken_state::{KeyRegistry, StateStore};
use awaken_tool::{PolicyDecision, ToolInterceptPayload, argument_digest, pending_call};
use serde::Deserialize;
use serde_json::{Value, json};

fn call(id: &str, name: &str, arguments: Value) -> ToolCall {
    ToolCall {
        id: ToolCallId::new(id).expect("test call id"),
        name: name.to_owned(),
        arguments: arguments.into(),
        invalid_arguments: None,
    }
}

/// The `ToolGate` context of `call`, with a resume decision when given.
fn gate_ctx(call: ToolCall, resume: Option<ToolCallResume>) -> PhaseContext {
    let run = Arc::new(RunIdentity {
        thread_id: ThreadId::new("thread-1").expect("thread"),
        run_id: RunId::new("run-1").expect("run"),
        agent_id: "agent".into(),
        profile_id: None,
    });
    let snapshot = StateStore::new(KeyRegistry::new()).snapshot();
    PhaseContext::new(Phase::ToolGate, snapshot, run).with_tool(ToolPhaseInfo {
        call,
        result: None,
        resume,
        asked_while_running: false,
    })
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
    // An answer to a question the tool asked while it ran (a delegate's child's call, with
    // its own digest) is the tool's: the policy let the call run before.
    let mut ctx = gate_ctx(
        c.clone(),
        resume(
            &c,
            argument_digest(&json!({"child": 1})),
            ResumeDecision::Approve,
        ),
    );
    let mut info = (**ctx.tool.as_ref().expect("a call")).clone();
    info.asked_while_running = true;
    ctx.tool = Some(std::sync::Arc::new(info));
    assert_eq!(
        PolicyGate(ShellPolicy).decide(&ctx).await.expect("policy"),
        None
    );
}
