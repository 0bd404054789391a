//! The grammar checker accepts well-formed activations and rejects each kind of violation.

use awaken_event::*;
use serde_json::json;

fn cid(s: &str) -> ToolCallId {
    ToolCallId::new(s).expect("test id")
}

fn start(resumed: bool) -> AgentEvent {
    AgentEvent::RunStart {
        thread_id: ThreadId::new("t").expect("id"),
        run_id: RunId::new("r").expect("id"),
        agent_id: "a".into(),
        parent_run_id: None,
        resumed,
    }
}

fn finish(termination: TerminationReason) -> AgentEvent {
    AgentEvent::RunFinish {
        thread_id: ThreadId::new("t").expect("id"),
        run_id: RunId::new("r").expect("id"),
        termination: Box::new(termination),
        response: None,
        usage: Box::default(),
    }
}

fn step(n: u32) -> AgentEvent {
    AgentEvent::StepStart { step: n }
}
fn end(n: u32) -> AgentEvent {
    AgentEvent::StepEnd { step: n }
}
fn call(c: &str) -> AgentEvent {
    AgentEvent::ToolCallStart {
        call_id: cid(c),
        name: "tool".into(),
    }
}
fn args(c: &str) -> AgentEvent {
    AgentEvent::ToolCallArgsDelta {
        call_id: cid(c),
        delta: "{}".into(),
    }
}
fn done(c: &str) -> AgentEvent {
    AgentEvent::ToolCallDone {
        call_id: cid(c),
        result: ToolResult::success(json!(null)).into(),
        state: ToolCallState::Succeeded,
    }
}
fn suspended(c: &str) -> AgentEvent {
    AgentEvent::ToolCallSuspended {
        call_id: cid(c),
        ticket: Box::new(SuspendTicket {
            suspension_id: format!("s-{c}"),
            call: PendingCall {
                call_id: cid(c),
                tool_name: "tool".into(),
                arguments: json!({}),
                argument_digest: "x".into(),
            },
            message: "ok?".into(),
            response_schema: None,
            resume_mode: ResumeMode::Replay,
        }),
    }
}
fn resumed(c: &str) -> AgentEvent {
    AgentEvent::ToolCallResumed {
        call_id: cid(c),
        decision: ResumeDecision::Approve,
    }
}
fn text() -> AgentEvent {
    AgentEvent::TextDelta { delta: "x".into() }
}

fn added(step: u32) -> AgentEvent {
    AgentEvent::MessageAdded {
        step,
        message: Message::user("also this"),
    }
}

fn natural() -> AgentEvent {
    finish(TerminationReason::NaturalEnd)
}

/// The violation's kind rendered briefly, or "ok".
fn verdict(events: &[AgentEvent]) -> String {
    match check_events(events) {
        Ok(()) => "ok".into(),
        Err(v) => format!("#{} {}: {}", v.index, v.event, v.kind),
    }
}

#[test]
fn accepts_valid_activations() {
    let plain = vec![start(false), step(1), text(), end(1), natural()];
    assert_eq!(verdict(&plain), "ok");
    let tools = vec![
        start(false),
        step(1),
        call("a"),
        args("a"),
        call("b"),
        AgentEvent::ToolCallReady {
            call_id: cid("a"),
            name: "tool".into(),
            arguments: json!({}).into(),
        },
        AgentEvent::ToolCallProgress {
            call_id: cid("a"),
            progress: json!(1),
        },
        done("a"),
        done("b"),
        AgentEvent::InferenceComplete {
            model: "m".into(),
            usage: TokenUsage::default(),
            duration_ms: 1,
            stop_reason: awaken_event::StopReason::EndTurn,
        },
        end(1),
        added(2),
        step(2),
        text(),
        end(2),
        AgentEvent::Warning {
            kind: WarningKind::Other,
            detail: "w".into(),
        },
        natural(),
    ];
    assert_eq!(verdict(&tools), "ok");
    // A run may end right after a message was added (its commit failed, or it was cancelled).
    assert_eq!(
        verdict(&[start(false), added(1), finish(TerminationReason::Cancelled)]),
        "ok"
    );
    assert!(check_activation(&tools).is_ok());
    // No step at all (e.g. cancelled before the first step) is fine.
    assert_eq!(
        verdict(&[start(false), finish(TerminationReason::Cancelled)]),
        "ok"
    );
}

#[test]
fn accepts_suspend_then_resume_as_two_activations() {
    let first = vec![
        start(false),
        step(1),
        call("a"),
        suspended("a"),
        end(1),
        finish(TerminationReason::Suspended),
    ];
    let second = vec![
        start(true),
        step(1),
        resumed("a"),
        done("a"),
        end(1),
        step(2),
        text(),
        end(2),
        natural(),
    ];
    assert!(check_activation(&first).is_ok());
    assert!(
        check_activation(&second).is_ok(),
        "a resume checked without history"
    );
    let both: Vec<_> = first.iter().chain(&second).cloned().collect();
    assert_eq!(verdict(&both), "ok");
}

#[test]
fn rejects_each_violation() {
    let cases: Vec<(&str, Vec<AgentEvent>, &str)> = vec![
        (
            "before start",
            vec![step(1)],
            "#0 step_start: event before run_start",
        ),
        (
            "nested start",
            vec![start(false), start(false)],
            "#1 run_start: run_start inside an activation that has not finished",
        ),
        (
            "missing finish",
            vec![start(false), step(1), end(1)],
            "#3 end: activation ended without run_finish",
        ),
        (
            "after finish",
            vec![start(false), natural(), text()],
            "#2 text_delta: event after run_finish",
        ),
        (
            "finish in step",
            vec![start(false), step(1), natural()],
            "#2 run_finish: run_finish while step 1 is open",
        ),
        (
            "steered message in a step",
            vec![start(false), step(1), added(2)],
            "#2 message_added: message_added inside step 1",
        ),
        (
            "steered message for a later step",
            vec![start(false), step(1), end(1), added(3), step(2)],
            "#4 step_start: message_added for step 3, but step 2 came next",
        ),
        (
            "steered messages for two steps",
            vec![start(false), added(1), added(2)],
            "#2 message_added: message_added for step 1, but step 2 came next",
        ),
        (
            "steered message before start",
            vec![added(1)],
            "#0 message_added: event before run_start",
        ),
        (
            "nested step",
            vec![start(false), step(1), step(2)],
            "#2 step_start: step_start 2 while step 1 is open",
        ),
        (
            "end without start",
            vec![start(false), end(1)],
            "#1 step_end: step_end 1 with no open step",
        ),
        (
            "mismatched end",
            vec![start(false), step(1), end(2)],
            "#2 step_end: step_end 2 closes step 1",
        ),
        (
            "text outside step",
            vec![start(false), text()],
            "#1 text_delta: text_delta outside a step",
        ),
        (
            "call outside step",
            vec![start(false), call("a")],
            "#1 tool_call_start: tool_call_start outside a step",
        ),
        (
            "unclosed call",
            vec![start(false), step(1), call("b"), call("a"), end(1)],
            "#4 step_end: step 1 ended with unclosed tool calls: [\"a\", \"b\"]",
        ),
        (
            "done without start",
            vec![start(false), step(1), done("a")],
            "#2 tool_call_done: tool_call_done for tool call a which is not open",
        ),
        (
            "args after done",
            vec![start(false), step(1), call("a"), done("a"), args("a")],
            "#4 tool_call_args_delta: tool_call_args_delta for tool call a which is not open",
        ),
        (
            "call reopened",
            vec![start(false), step(1), call("a"), done("a"), call("a")],
            "#4 tool_call_start: tool call a opened twice",
        ),
        (
            "resume of unknown call",
            vec![start(true), step(1), resumed("z")],
            "#2 tool_call_resumed: tool_call_resumed for z, which no earlier activation suspended",
        ),
        (
            "args for resumed call",
            vec![
                start(false),
                step(1),
                call("a"),
                suspended("a"),
                end(1),
                finish(TerminationReason::Suspended),
                start(true),
                step(1),
                resumed("a"),
                args("a"),
            ],
            "#9 tool_call_args_delta: tool_call_args_delta for resumed call a",
        ),
    ];
    for (name, events, expected) in cases {
        assert_eq!(verdict(&events), expected, "case {name}");
    }
}

#[test]
fn check_activation_rejects_two_activations_and_empty() {
    let two = vec![start(false), natural(), start(false), natural()];
    assert!(check_events(&two).is_ok());
    let err = check_activation(&two).expect_err("two activations");
    assert_eq!(err.index, 2);
    assert_eq!(err.kind, ViolationKind::AfterRunFinish);
    assert_eq!(
        check_activation(&[]).expect_err("empty").kind,
        ViolationKind::MissingRunFinish
    );
}

#[test]
fn sinks_receive_events_in_order() {
    let sink = VecSink::new();
    let events = vec![start(false), natural()];
    for e in &events {
        sink.emit(e);
    }
    assert_eq!(sink.events(), events);
    assert_eq!(sink.take().len(), 2);
    assert!(sink.events().is_empty());
    let count = std::sync::atomic::AtomicUsize::new(0);
    let f = |_: &AgentEvent| {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    };
    f.emit(&text());
    NullSink.emit(&text());
    assert_eq!(count.load(std::sync::atomic::Ordering::Relaxed), 1);
}
