//! The translator and the message reader on paths an HTTP test cannot steer: notices, each way
//! a run ends, a step's text replacing the one before; every decision form and refusal.

use std::collections::VecDeque;

use awaken_a2a::{Message, Part, PartContent, Role, TaskState};
use awaken_event::{
    AgentEvent, PendingCall, ResumeDecision, ResumeMode, RunId, SuspendTicket, TerminationReason,
    ThreadId, TokenUsage, ToolCallId,
};
use axum::body::Bytes;
use expect_test::{Expect, expect};
use serde_json::json;

use super::encoder::A2aEncoder;
use super::input::Input;
use crate::live::{EventId, frame};
use crate::sse::Encoder;

fn start() -> AgentEvent {
    AgentEvent::RunStart {
        thread_id: ThreadId::new("t").expect("id"),
        run_id: RunId::new("run-1").expect("id"),
        agent_id: "a".into(),
        parent_run_id: None,
        resumed: false,
    }
}

fn finish(termination: TerminationReason, response: Option<&str>) -> AgentEvent {
    AgentEvent::RunFinish {
        thread_id: ThreadId::new("t").expect("id"),
        run_id: RunId::new("run-1").expect("id"),
        termination: Box::new(termination),
        response: response.map(str::to_owned),
        usage: Box::new(TokenUsage::default()),
    }
}

fn delta(text: &str) -> AgentEvent {
    AgentEvent::TextDelta { delta: text.into() }
}

fn suspended(id: &str) -> AgentEvent {
    AgentEvent::ToolCallSuspended {
        call_id: ToolCallId::new(id).expect("id"),
        ticket: Box::new(SuspendTicket {
            suspension_id: format!("s-{id}"),
            call: PendingCall {
                call_id: ToolCallId::new(id).expect("id"),
                tool_name: "guarded".into(),
                arguments: json!({"text": "x"}),
                argument_digest: "digest".into(),
            },
            message: "Go?".into(),
            response_schema: None,
            resume_mode: ResumeMode::Replay,
        }),
    }
}

/// Runs `events`, then the notices, through an encoder of task `run-1` in context `t`; the
/// bytes it wrote, one SSE event a line, and whether it said the stream is complete.
fn encode(events: &[AgentEvent], notices: &[&str]) -> String {
    let mut encoder = A2aEncoder::new("t", "run-1", TaskState::Submitted, Vec::new());
    let mut out: VecDeque<Bytes> = VecDeque::new();
    for (seq, e) in events.iter().enumerate() {
        encoder.frame(&frame(EventId::stored(seq as u64 + 1), e), &mut out);
    }
    for n in notices {
        encoder.notice(n, &json!({"message": format!("{n} happened")}), &mut out);
    }
    let mut text: String = out
        .iter()
        .map(|b| String::from_utf8_lossy(b).trim_end().replace("\n", " / ") + "\n")
        .collect();
    text.push_str(&format!("complete: {}\n", encoder.complete()));
    text
}

fn check(events: &[AgentEvent], notices: &[&str], expected: Expect) {
    expected.assert_eq(&encode(events, notices));
}

#[test]
fn each_step_replaces_the_text_of_the_one_before() {
    check(
        &[
            start(),
            AgentEvent::StepStart { step: 1 },
            delta("Looking"),
            delta("…"),
            AgentEvent::StepStart { step: 2 },
            delta("Found it."),
            finish(TerminationReason::NaturalEnd, Some("Found it.")),
        ],
        &[],
        expect![[r#"
            data: {"task":{"contextId":"t","id":"run-1","status":{"state":"TASK_STATE_SUBMITTED"}}}
            data: {"statusUpdate":{"contextId":"t","status":{"state":"TASK_STATE_WORKING"},"taskId":"run-1"}}
            data: {"artifactUpdate":{"artifact":{"artifactId":"run-1-answer","name":"answer","parts":[{"text":"Looking"}]},"contextId":"t","taskId":"run-1"}}
            data: {"artifactUpdate":{"append":true,"artifact":{"artifactId":"run-1-answer","name":"answer","parts":[{"text":"…"}]},"contextId":"t","taskId":"run-1"}}
            data: {"artifactUpdate":{"artifact":{"artifactId":"run-1-answer","name":"answer","parts":[{"text":"Found it."}]},"contextId":"t","taskId":"run-1"}}
            data: {"artifactUpdate":{"artifact":{"artifactId":"run-1-answer","name":"answer","parts":[{"text":"Found it."}]},"contextId":"t","lastChunk":true,"taskId":"run-1"}}
            data: {"statusUpdate":{"contextId":"t","status":{"message":{"contextId":"t","messageId":"run-1-completed","parts":[{"text":"Found it."}],"role":"ROLE_AGENT","taskId":"run-1"},"state":"TASK_STATE_COMPLETED"},"taskId":"run-1"}}
            complete: true
        "#]],
    );
}

#[test]
fn a_run_that_ends_otherwise_has_no_answer_artifact() {
    let end = |termination, response| {
        let out = encode(&[start(), finish(termination, response)], &[]);
        out.lines()
            .rev()
            .nth(1)
            .unwrap_or_default()
            .replace("data: ", "")
            .to_owned()
    };
    let lines = [
        end(TerminationReason::error("the model failed"), None),
        end(TerminationReason::Cancelled, Some("Hal")),
        end(TerminationReason::stopped("max_rounds", "4 rounds"), None),
    ]
    .join("\n");
    expect![[r#"
        {"statusUpdate":{"contextId":"t","status":{"message":{"contextId":"t","messageId":"run-1-failed","parts":[{"text":"the model failed"}],"role":"ROLE_AGENT","taskId":"run-1"},"state":"TASK_STATE_FAILED"},"taskId":"run-1"}}
        {"statusUpdate":{"contextId":"t","status":{"message":{"contextId":"t","messageId":"run-1-canceled","parts":[{"text":"the run was cancelled"}],"role":"ROLE_AGENT","taskId":"run-1"},"state":"TASK_STATE_CANCELED"},"taskId":"run-1"}}
        {"statusUpdate":{"contextId":"t","status":{"message":{"contextId":"t","messageId":"run-1-completed","parts":[{"text":"the run stopped (max_rounds): 4 rounds"}],"role":"ROLE_AGENT","taskId":"run-1"},"state":"TASK_STATE_COMPLETED"},"taskId":"run-1"}}"#]]
    .assert_eq(&lines);
    for termination in [TerminationReason::error("x"), TerminationReason::Cancelled] {
        let out = encode(&[start(), finish(termination, Some("Hal"))], &[]);
        assert!(!out.contains("artifactUpdate"), "{out}");
    }
}

#[test]
fn a_suspended_run_asks_about_the_calls_still_waiting() {
    let decided = AgentEvent::ToolCallResumed {
        call_id: ToolCallId::new("c1").expect("id"),
        decision: ResumeDecision::Approve,
    };
    check(
        &[
            start(),
            suspended("c1"),
            suspended("c2"),
            decided,
            finish(TerminationReason::Suspended, Some("Asking.")),
        ],
        &[],
        expect![[r#"
            data: {"task":{"contextId":"t","id":"run-1","status":{"state":"TASK_STATE_SUBMITTED"}}}
            data: {"statusUpdate":{"contextId":"t","status":{"state":"TASK_STATE_WORKING"},"taskId":"run-1"}}
            data: {"statusUpdate":{"contextId":"t","status":{"message":{"contextId":"t","messageId":"run-1-input-required","parts":[{"text":"Go? (call `c2` of `guarded`)"},{"data":{"answer_with":{"decisions":[{"approve":true,"call_id":"c2"}]},"waiting":[{"argument_digest":"digest","arguments":{"text":"x"},"call_id":"c2","message":"Go?","tool":"guarded"}]}}],"role":"ROLE_AGENT","taskId":"run-1"},"state":"TASK_STATE_INPUT_REQUIRED"},"taskId":"run-1"}}
            complete: true
        "#]],
    );
}

#[test]
fn notices_a_lag_is_silent_a_shutdown_ends_the_stream_with_an_error() {
    check(
        &[start(), delta("Hal")],
        &["lagged", "shutdown"],
        expect![[r#"
            data: {"task":{"contextId":"t","id":"run-1","status":{"state":"TASK_STATE_SUBMITTED"}}}
            data: {"statusUpdate":{"contextId":"t","status":{"state":"TASK_STATE_WORKING"},"taskId":"run-1"}}
            data: {"artifactUpdate":{"artifact":{"artifactId":"run-1-answer","name":"answer","parts":[{"text":"Hal"}]},"contextId":"t","taskId":"run-1"}}
            event: error / data: {"error":{"code":503,"status":"UNAVAILABLE","message":"shutdown happened","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"INTERNAL_ERROR","domain":"a2a-protocol.org","metadata":{"code":"shutting_down"}}]}}
            complete: true
        "#]],
    );
}

fn message(parts: Vec<Part>) -> Message {
    Message {
        message_id: "m".into(),
        role: Role::User,
        parts,
        ..Message::default()
    }
}

#[test]
fn a_message_reads_as_text_and_decisions() {
    let read = Input::read(&message(vec![
        Part::text("yes"),
        Part::data(json!({"note": 1})),
        Part::data(json!({"decisions": [
            {"call_id": "c1", "approve": true},
            {"callId": "c2", "decision": "deny", "argumentDigest": "d", "payload": "no"},
        ]})),
    ]))
    .expect("a message");
    assert_eq!(read.text, "yes\n{\"note\":1}");
    let decisions: Vec<_> = read
        .decisions
        .iter()
        .map(|d| {
            (
                d.call_id.as_str(),
                d.decision,
                d.argument_digest.as_deref(),
                d.payload.clone(),
            )
        })
        .collect();
    assert_eq!(
        decisions,
        [
            ("c1", ResumeDecision::Approve, None, None),
            ("c2", ResumeDecision::Deny, Some("d"), Some(json!("no"))),
        ]
    );
}

#[test]
fn a_lone_yes_or_no_is_a_decision() {
    let word = |text: &str| Input::read(&message(vec![Part::text(text)])).map(|i| i.yes_or_no());
    for (text, decision) in [
        ("yes", Some(ResumeDecision::Approve)),
        (" Approve! ", Some(ResumeDecision::Approve)),
        ("OK.", Some(ResumeDecision::Approve)),
        ("no", Some(ResumeDecision::Deny)),
        ("Deny", Some(ResumeDecision::Deny)),
        ("yes please", None),
        ("maybe", None),
    ] {
        assert_eq!(word(text), Ok(decision), "{text:?}");
    }
}

#[test]
fn a_text_answers_the_one_call_that_asks_for_text() {
    let ticket = |schema: Option<serde_json::Value>| SuspendTicket {
        suspension_id: "s".to_owned(),
        call: PendingCall {
            call_id: ToolCallId::new("c1").expect("an id"),
            tool_name: "delegate_remote".to_owned(),
            arguments: json!({}),
            argument_digest: "d".to_owned(),
        },
        message: "[remote] Which city?".to_owned(),
        response_schema: schema,
        resume_mode: ResumeMode::PassDecisionToTool,
    };
    let on = |text: &str, waiting: &[SuspendTicket]| {
        Input::read(&message(vec![Part::text(text)])).map(|i| {
            i.decision_on(waiting)
                .map(|d| (d.call_id, d.decision, d.payload))
        })
    };
    let asks = ticket(Some(json!({"type": "string", "minLength": 1})));
    let approve = |payload| Ok(Some(("c1".to_owned(), ResumeDecision::Approve, payload)));
    assert_eq!(
        on("Paris", std::slice::from_ref(&asks)),
        approve(Some(json!("Paris")))
    );
    // Even a yes is the answer to a question.
    assert_eq!(
        on("yes", std::slice::from_ref(&asks)),
        approve(Some(json!("yes")))
    );
    // A call asking for approval takes a yes or a no only.
    let approval = ticket(None);
    assert_eq!(on("yes", std::slice::from_ref(&approval)), approve(None));
    assert_eq!(on("Paris", std::slice::from_ref(&approval)), Ok(None));
    // Two waiting calls: the text alone decides neither.
    assert_eq!(on("Paris", &[asks.clone(), asks]), Ok(None));
}

#[test]
fn a_bad_message_names_the_part_at_fault() {
    let refused = |m: Message| match Input::read(&m) {
        Err(e) => format!("{}: {e}", e.reason()),
        Ok(i) => format!("read: {i:?}"),
    };
    let lines = [
        refused(Message {
            role: Role::Agent,
            ..message(vec![Part::text("hi")])
        }),
        refused(message(Vec::new())),
        refused(message(vec![
            Part::text("hi"),
            Part::data(json!({"decisions": {"c1": true}})),
        ])),
        refused(message(vec![Part::data(
            json!({"decisions": [{"approve": true}]}),
        )])),
        refused(message(vec![Part::data(
            json!({"decisions": [{"call_id": "c1", "approve": "yes"}]}),
        )])),
        refused(message(vec![Part {
            content: PartContent::Url("https://example.invalid/a.png".into()),
            metadata: None,
            filename: None,
            media_type: None,
        }])),
    ]
    .join("\n");
    expect![[r#"
        INVALID_PARAMS: invalid `message.role`: a client's message has role `ROLE_USER`
        INVALID_PARAMS: invalid `message.parts`: the message has no part
        INVALID_PARAMS: invalid `message.parts[1].data.decisions`: `decisions` must be an array of `{"call_id", "approve"}` objects
        INVALID_PARAMS: invalid `message.parts[0].data.decisions[0]`: the decision names no `call_id`
        INVALID_PARAMS: invalid `message.parts[0].data.decisions[0]`: give either `approve` (true or false) or `decision` ("approve" or "deny")
        CONTENT_TYPE_NOT_SUPPORTED: part 0 of the message is a `url` part: this agent takes `text` and `data` parts"#]]
    .assert_eq(&lines);
}
