//! The translator on paths an HTTP test cannot steer: notices, a stream cut short, deltas
//! interleaved in every order, state deltas, a suspended run whose calls were all announced
//! before this activation, messages steered into a run.

use std::collections::BTreeSet;
use std::sync::Arc;

use awaken_event::{
    AgentEvent, Message, PendingCall, ResumeMode, RunId, SuspendTicket, TerminationReason,
    ThreadId, TokenUsage, ToolCallId, ToolCallState, ToolResult,
};
use serde_json::{Value, json};

use super::translate::{RunContext, Translator, patch};

fn ctx() -> RunContext {
    RunContext {
        thread_id: "t".into(),
        run_id: "r".into(),
        ..RunContext::default()
    }
}

fn start() -> AgentEvent {
    AgentEvent::RunStart {
        thread_id: ThreadId::new("t").expect("id"),
        run_id: RunId::new("run-1").expect("id"),
        agent_id: "a".into(),
        parent_run_id: None,
        resumed: false,
    }
}

fn finish(termination: TerminationReason) -> AgentEvent {
    AgentEvent::RunFinish {
        thread_id: ThreadId::new("t").expect("id"),
        run_id: RunId::new("run-1").expect("id"),
        termination: Box::new(termination),
        response: Some("done".into()),
        usage: Box::new(TokenUsage::default()),
    }
}

fn call(id: &str) -> ToolCallId {
    ToolCallId::new(id).expect("id")
}

fn ticket(id: &str) -> SuspendTicket {
    SuspendTicket {
        suspension_id: format!("s-{id}"),
        call: PendingCall {
            call_id: call(id),
            tool_name: "guarded".into(),
            arguments: json!({"text": "x"}),
            argument_digest: "digest".into(),
        },
        message: "Go?".into(),
        response_schema: None,
        resume_mode: ResumeMode::Replay,
    }
}

/// Runs `events` through a translator, then the notices `(kind, message)`, then the stream's
/// end; the AG-UI events as one compact line each (`TYPE key=value ...`).
fn translate(ctx: RunContext, events: &[AgentEvent], notices: &[&str]) -> Vec<Value> {
    let mut t = Translator::new(ctx);
    let mut out = Vec::new();
    for e in events {
        t.event(e, &mut out);
    }
    for n in notices {
        t.notice(n, &json!({"message": format!("{n} happened")}), &mut out);
    }
    t.end(&mut out);
    out
}

fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().expect("a type").to_owned())
        .collect()
}

/// The protocol's ordering rules, as the reference verifier checks them.
fn assert_ordered(events: &[Value]) {
    let (mut text, mut calls, mut reasoning, mut steps) = (
        BTreeSet::new(),
        BTreeSet::new(),
        BTreeSet::new(),
        BTreeSet::new(),
    );
    let mut ended = false;
    for (i, e) in events.iter().enumerate() {
        let ty = e["type"].as_str().expect("type");
        assert!(!ended, "{ty} after the run ended: {events:#?}");
        if i == 0 {
            assert!(
                ty == "RUN_STARTED" || ty == "RUN_ERROR",
                "first is {ty}: {events:#?}"
            );
        }
        let id = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
        match ty {
            "TEXT_MESSAGE_START" => assert!(text.insert(id("messageId")), "{events:#?}"),
            "TEXT_MESSAGE_CONTENT" => assert!(text.contains(&id("messageId")), "{events:#?}"),
            "TEXT_MESSAGE_END" => assert!(text.remove(&id("messageId")), "{events:#?}"),
            "TOOL_CALL_START" => assert!(calls.insert(id("toolCallId")), "{events:#?}"),
            "TOOL_CALL_ARGS" => assert!(calls.contains(&id("toolCallId")), "{events:#?}"),
            "TOOL_CALL_END" => assert!(calls.remove(&id("toolCallId")), "{events:#?}"),
            "REASONING_MESSAGE_START" => assert!(reasoning.insert(id("messageId"))),
            "REASONING_MESSAGE_CONTENT" => assert!(reasoning.contains(&id("messageId"))),
            "REASONING_MESSAGE_END" => assert!(reasoning.remove(&id("messageId"))),
            "STEP_STARTED" => assert!(steps.insert(id("stepName")), "{events:#?}"),
            "STEP_FINISHED" => assert!(steps.remove(&id("stepName")), "{events:#?}"),
            "RUN_FINISHED" => {
                assert!(
                    text.is_empty() && calls.is_empty() && reasoning.is_empty() && steps.is_empty(),
                    "open at RUN_FINISHED: {events:#?}"
                );
                ended = true;
            }
            "RUN_ERROR" => ended = true,
            _ => {}
        }
    }
    assert!(ended, "the run never ended: {events:#?}");
}

#[test]
fn interleaved_text_reasoning_and_calls_stay_well_nested() {
    let events = [
        start(),
        AgentEvent::StepStart { step: 1 },
        AgentEvent::ReasoningDelta {
            delta: "think".into(),
        },
        AgentEvent::TextDelta { delta: "".into() },
        AgentEvent::TextDelta { delta: "a".into() },
        AgentEvent::ReasoningDelta {
            delta: "more".into(),
        },
        AgentEvent::TextDelta { delta: "b".into() },
        AgentEvent::ToolCallStart {
            call_id: call("c1"),
            name: "echo".into(),
        },
        AgentEvent::ToolCallStart {
            call_id: call("c2"),
            name: "echo".into(),
        },
        AgentEvent::ToolCallArgsDelta {
            call_id: call("c2"),
            delta: "{}".into(),
        },
        AgentEvent::ToolCallReady {
            call_id: call("c1"),
            name: "echo".into(),
            arguments: Arc::new(json!({"text": "x"})),
        },
        // c2 never got ready: the step's end closes it.
        AgentEvent::StepEnd { step: 1 },
        finish(TerminationReason::NaturalEnd),
    ];
    let out = translate(ctx(), &events, &[]);
    assert_ordered(&out);
    assert_eq!(
        types(&out),
        [
            "RUN_STARTED",
            "STEP_STARTED",
            "REASONING_START",
            "REASONING_MESSAGE_START",
            "REASONING_MESSAGE_CONTENT",
            "REASONING_MESSAGE_END",
            "REASONING_END",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "REASONING_START",
            "REASONING_MESSAGE_START",
            "REASONING_MESSAGE_CONTENT",
            "REASONING_MESSAGE_END",
            "REASONING_END",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "TOOL_CALL_START",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_END",
            "STEP_FINISHED",
            "RUN_FINISHED",
        ]
    );
    // The text and the calls of a step share one assistant message.
    assert_eq!(out[7]["messageId"], "r-m1");
    assert_eq!(out[18]["parentMessageId"], "r-m1");
    assert_eq!(out[21]["delta"], r#"{"text":"x"}"#, "c1's arguments, whole");
    assert_eq!(out[25]["result"], "done");
}

#[test]
fn a_notice_ends_the_run_with_run_error_and_nothing_follows() {
    for kind in ["lagged", "shutdown", "error"] {
        let events = [
            start(),
            AgentEvent::StepStart { step: 1 },
            AgentEvent::TextDelta { delta: "a".into() },
        ];
        let out = translate(ctx(), &events, &[kind, "error"]);
        assert_ordered(&out);
        let last = out.last().expect("events");
        assert_eq!(last["type"], "RUN_ERROR");
        assert_eq!(last["code"], kind);
        assert_eq!(last["message"], format!("{kind} happened"));
        assert_eq!(types(&out).iter().filter(|t| *t == "RUN_ERROR").count(), 1);
    }
}

#[test]
fn a_stream_cut_before_the_finish_ends_with_run_error() {
    let out = translate(ctx(), &[start(), AgentEvent::StepStart { step: 1 }], &[]);
    assert_ordered(&out);
    assert_eq!(out.last().expect("events")["code"], "stream_ended");
    // A notice before any event: RUN_ERROR is the whole stream.
    let out = translate(ctx(), &[], &["shutdown"]);
    assert_eq!(types(&out), ["RUN_ERROR"]);
}

#[test]
fn finishes_map_to_outcomes_and_nothing_follows_them() {
    let cases = [
        (TerminationReason::Cancelled, json!({"type": "cancelled"})),
        (TerminationReason::NaturalEnd, json!({"type": "success"})),
        (
            TerminationReason::stopped("max_rounds", "4 rounds"),
            json!({"type": "success"}),
        ),
    ];
    for (termination, outcome) in cases {
        let out = translate(
            ctx(),
            &[
                start(),
                finish(termination),
                AgentEvent::StepStart { step: 9 },
            ],
            &["shutdown"],
        );
        assert_ordered(&out);
        assert_eq!(types(&out), ["RUN_STARTED", "RUN_FINISHED"]);
        assert_eq!(out[1]["outcome"], outcome);
        assert_eq!(out[1]["threadId"], "t");
        assert_eq!(out[1]["runId"], "r");
    }
    let out = translate(
        ctx(),
        &[start(), finish(TerminationReason::error("model down"))],
        &[],
    );
    assert_eq!(types(&out), ["RUN_STARTED", "RUN_ERROR"]);
    assert_eq!(out[1]["message"], "model down");
    assert_eq!(out[1]["code"], "run_failed");
}

#[test]
fn a_run_still_waiting_after_a_partial_resume_lists_the_undecided_calls() {
    let mut c = ctx();
    c.waiting = vec![ticket("c2")];
    c.snapshot = Some(vec![json!({"id": "t-0", "role": "user", "content": "hi"})]);
    let events = [
        start(),
        AgentEvent::StepStart { step: 2 },
        AgentEvent::ToolCallDone {
            call_id: call("c1"),
            result: Arc::new(ToolResult::success(json!({"ok": true}))),
            state: ToolCallState::Succeeded,
        },
        AgentEvent::StepEnd { step: 2 },
        finish(TerminationReason::Suspended),
    ];
    let out = translate(c, &events, &[]);
    assert_ordered(&out);
    assert_eq!(out[1]["type"], "MESSAGES_SNAPSHOT");
    let result = &out[3];
    assert_eq!(result["type"], "TOOL_CALL_RESULT");
    assert_eq!(result["messageId"], "c1-result");
    assert_eq!(result["content"], r#"{"ok":true}"#);
    let finished = out.last().expect("events");
    assert_eq!(finished["outcome"]["type"], "interrupt");
    assert_eq!(finished["outcome"]["interrupts"][0]["id"], "c2");
    assert_eq!(
        finished["outcome"]["interrupts"][0]["metadata"]["argumentDigest"],
        "digest"
    );

    // Waiting with no call known to the stream: an interrupt outcome needs one, so RUN_ERROR.
    let out = translate(ctx(), &[start(), finish(TerminationReason::Suspended)], &[]);
    assert_eq!(out.last().expect("events")["code"], "no_interrupts");
}

#[test]
fn state_deltas_become_patches_on_the_keys_the_stream_knows() {
    let mut keys = BTreeSet::from(["a".to_owned()]);
    let ops = patch(
        &json!({"a": 1, "b/c": {"x": 2}, "gone": null, "a~": true}),
        &mut keys,
    );
    assert_eq!(
        Value::from(ops),
        json!([
            {"op": "replace", "path": "/a", "value": 1},
            {"op": "add", "path": "/a~0", "value": true},
            {"op": "add", "path": "/b~1c", "value": {"x": 2}},
        ])
    );
    let ops = patch(&json!({"a": null, "b/c": 3}), &mut keys);
    assert_eq!(
        Value::from(ops),
        json!([
            {"op": "remove", "path": "/a"},
            {"op": "replace", "path": "/b~1c", "value": 3},
        ])
    );
    let events = [
        start(),
        AgentEvent::StateSnapshot {
            revision: 1,
            state: json!({"k": 1}),
        },
        AgentEvent::StateDelta {
            revision: 2,
            changes: json!({"k": 2, "n": 1}),
        },
        finish(TerminationReason::NaturalEnd),
    ];
    let out = translate(ctx(), &events, &[]);
    assert_eq!(
        out[1],
        json!({"type": "STATE_SNAPSHOT", "snapshot": {"k": 1}})
    );
    assert_eq!(
        out[2]["delta"],
        json!([{"op": "replace", "path": "/k", "value": 2}, {"op": "add", "path": "/n", "value": 1}])
    );
}

#[test]
fn a_steered_message_is_a_user_text_message_between_the_steps() {
    let events = [
        start(),
        AgentEvent::StepStart { step: 1 },
        AgentEvent::TextDelta {
            delta: "First.".into(),
        },
        AgentEvent::StepEnd { step: 1 },
        AgentEvent::MessageAdded {
            step: 2,
            message: Message::user("One more thing."),
        },
        AgentEvent::MessageAdded {
            step: 2,
            message: Message::user("And another."),
        },
        AgentEvent::StepStart { step: 2 },
        AgentEvent::TextDelta {
            delta: "Second.".into(),
        },
        AgentEvent::StepEnd { step: 2 },
        finish(TerminationReason::NaturalEnd),
    ];
    let out = translate(ctx(), &events, &[]);
    assert_ordered(&out);
    let added: Vec<_> = out
        .iter()
        .filter(|e| {
            e["messageId"]
                .as_str()
                .is_some_and(|m| m.starts_with("r-u"))
        })
        .map(|e| format!("{} {} {}", e["type"], e["messageId"], e["delta"]))
        .collect();
    assert_eq!(
        added,
        [
            r#""TEXT_MESSAGE_START" "r-u1" null"#,
            r#""TEXT_MESSAGE_CONTENT" "r-u1" "One more thing.""#,
            r#""TEXT_MESSAGE_END" "r-u1" null"#,
            r#""TEXT_MESSAGE_START" "r-u2" null"#,
            r#""TEXT_MESSAGE_CONTENT" "r-u2" "And another.""#,
            r#""TEXT_MESSAGE_END" "r-u2" null"#,
        ]
    );
    // Between the first step's end and the second's start; the answers keep their own ids.
    let at = |ty: &str, id: &str| {
        out.iter()
            .position(|e| e["type"] == ty && (e["messageId"] == id || e["stepName"] == id))
            .expect(ty)
    };
    assert!(at("STEP_FINISHED", "step-1") < at("TEXT_MESSAGE_START", "r-u1"));
    assert!(at("TEXT_MESSAGE_END", "r-u2") < at("STEP_STARTED", "step-2"));
    assert_eq!(out[at("TEXT_MESSAGE_START", "r-u1")]["role"], "user");
    assert_ne!(
        at("TEXT_MESSAGE_START", "r-m1"),
        at("TEXT_MESSAGE_START", "r-m2")
    );
}
