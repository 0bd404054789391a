//! The recovery-policy table: every (effect class × declared policy × last state).

use awaken_event::{EffectClass, ToolCallState};
use awaken_tool::{
    RecoveryAction, RegisteredTool, ToolRecoveryPolicy, ToolRegistrationError, recovery_action,
};

use crate::support::{Behaviour, Scripted};

use EffectClass::{Idempotent as I, ReadOnly as RO, SideEffecting as SE};
use RecoveryAction::{
    AlreadyClosed as Closed, AwaitDecision as Await, CloseOutcomeUnknown as Unknown, Regate,
    Rerun as RerunA, SuspendForHuman as SuspendA,
};
use ToolCallState as S;
use ToolRecoveryPolicy::{
    CloseOutcomeUnknown as PClose, Rerun as PRerun, SuspendForHuman as PSuspend,
};

/// Every combination, each with its expected action written out. The rows for one effect
/// class and policy list the nine states in `ToolCallState::ALL` order:
/// Requested, Executing, Suspended, then the six terminal states.
#[rustfmt::skip]
const TABLE: [(EffectClass, ToolRecoveryPolicy, [RecoveryAction; 9]); 9] = [
    //            Requested Executing Suspended Succeeded Failed  Blocked ShortCirc Cancelled OutcomeUnknown
    (RO, PRerun,   [Regate, RerunA,   Await,    Closed,   Closed, Closed, Closed,   Closed,   Closed]),
    (RO, PClose,   [Regate, Unknown,  Await,    Closed,   Closed, Closed, Closed,   Closed,   Closed]),
    (RO, PSuspend, [Regate, SuspendA, Await,    Closed,   Closed, Closed, Closed,   Closed,   Closed]),
    (I,  PRerun,   [Regate, RerunA,   Await,    Closed,   Closed, Closed, Closed,   Closed,   Closed]),
    (I,  PClose,   [Regate, Unknown,  Await,    Closed,   Closed, Closed, Closed,   Closed,   Closed]),
    (I,  PSuspend, [Regate, SuspendA, Await,    Closed,   Closed, Closed, Closed,   Closed,   Closed]),
    // A SideEffecting tool is never re-run, even if a stored declaration says so.
    (SE, PRerun,   [Regate, Unknown,  Await,    Closed,   Closed, Closed, Closed,   Closed,   Closed]),
    (SE, PClose,   [Regate, Unknown,  Await,    Closed,   Closed, Closed, Closed,   Closed,   Closed]),
    (SE, PSuspend, [Regate, SuspendA, Await,    Closed,   Closed, Closed, Closed,   Closed,   Closed]),
];

#[test]
fn every_combination_has_its_written_action() {
    let mut checked = 0;
    for (effect, policy, actions) in TABLE {
        for (state, expected) in ToolCallState::ALL.into_iter().zip(actions) {
            assert_eq!(
                recovery_action(effect, policy, state),
                expected,
                "{effect:?} × {policy:?} × {state}"
            );
            checked += 1;
        }
    }
    assert_eq!(
        checked,
        3 * ToolRecoveryPolicy::ALL.len() * ToolCallState::ALL.len()
    );
}

#[test]
fn a_side_effecting_call_is_never_rerun_and_a_requested_call_is_always_regated() {
    for policy in ToolRecoveryPolicy::ALL {
        for state in ToolCallState::ALL {
            assert_ne!(recovery_action(SE, policy, state), RerunA);
            for effect in [RO, I, SE] {
                if state == S::Requested {
                    assert_eq!(recovery_action(effect, policy, state), Regate);
                }
            }
        }
    }
}

#[test]
fn each_action_targets_a_state_the_table_allows_from_executing() {
    for action in [RerunA, Unknown, SuspendA] {
        let to = action.target_state().expect("moves the call");
        assert!(
            awaken_tool::is_allowed_transition(S::Executing, to),
            "{action:?}"
        );
    }
}

#[test]
fn registration_rejects_rerun_for_side_effecting_tools_only() {
    let err = RegisteredTool::from_tool(
        Scripted::new("pay", Behaviour::Echo)
            .with_effect(SE)
            .with_policy(PRerun),
    )
    .expect_err("rerun of a side-effecting tool");
    assert!(matches!(
        &err,
        ToolRegistrationError::PolicyNotAllowed { tool_id, effect: SE, policy: PRerun } if tool_id == "pay"
    ));
    for (effect, policy) in [(RO, PRerun), (I, PRerun), (SE, PClose), (SE, PSuspend)] {
        let tool = RegisteredTool::from_tool(
            Scripted::new("t", Behaviour::Echo)
                .with_effect(effect)
                .with_policy(policy),
        )
        .expect("allowed");
        assert_eq!(tool.recovery_policy(), policy);
    }
}

#[test]
fn the_default_policy_comes_from_the_effect_class() {
    for (effect, policy, executing) in [
        (RO, PRerun, RerunA),
        (I, PRerun, RerunA),
        (SE, PClose, Unknown),
    ] {
        let tool =
            RegisteredTool::from_tool(Scripted::new("t", Behaviour::Echo).with_effect(effect))
                .expect("registers");
        assert_eq!(tool.recovery_policy(), policy);
        assert_eq!(tool.recovery_action(S::Executing), executing);
    }
}

#[test]
fn a_recovered_batch_gets_one_action_per_call_and_unknown_tools_are_never_rerun() {
    use awaken_event::ToolResult;
    use awaken_tool::ToolBatch;
    use serde_json::json;

    use crate::support::{call, call_id};

    let mut b = ToolBatch::new([
        call("a", "search", json!({})),
        call("b", "search", json!({})),
        call("c", "pay", json!({})),
        call("d", "vanished", json!({})),
        call("e", "pay", json!({})),
    ])
    .expect("batch");
    for id in ["b", "c", "d", "e"] {
        b.start(&call_id(id)).expect("executing");
    }
    b.succeed(&call_id("e"), ToolResult::success(json!(1)))
        .expect("done");
    let plan = b.recovery_plan(|c| match c.name.as_str() {
        "search" => Some((RO, PRerun)),
        "pay" => Some((SE, PSuspend)),
        _ => None,
    });
    let plan: Vec<(String, RecoveryAction)> = plan
        .into_iter()
        .map(|(id, a)| (id.to_string(), a))
        .collect();
    assert_eq!(
        plan,
        vec![
            ("a".to_owned(), Regate),
            ("b".to_owned(), RerunA),
            ("c".to_owned(), SuspendA),
            ("d".to_owned(), Unknown),
            ("e".to_owned(), Closed),
        ]
    );
}
