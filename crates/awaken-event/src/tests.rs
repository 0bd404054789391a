//! Serde stability of the vocabulary: every event variant round-trips, and its JSON is pinned
//! as text so a renamed field or tag is caught.

use serde_json::json;

use crate::*;

fn id<T: std::str::FromStr>(s: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    s.parse().expect("test id")
}

fn ticket() -> SuspendTicket {
    SuspendTicket {
        suspension_id: "s1".into(),
        call: PendingCall {
            call_id: id("c1"),
            tool_name: "append_file".into(),
            arguments: json!({"path": "notes.txt"}),
            argument_digest: "d41d8".into(),
        },
        message: "Allow append_file?".into(),
        response_schema: Some(json!({"type": "string"})),
        resume_mode: ResumeMode::Replay,
    }
}

/// One sample of every variant. The exhaustive match in `covered` makes adding a variant
/// without a sample a compile error.
fn samples() -> Vec<AgentEvent> {
    vec![
        AgentEvent::RunStart {
            thread_id: id("t1"),
            run_id: id("r1"),
            agent_id: "assistant".into(),
            parent_run_id: Some(id("r0")),
            resumed: false,
        },
        AgentEvent::RunFinish {
            thread_id: id("t1"),
            run_id: id("r1"),
            termination: Box::new(TerminationReason::stopped("max_rounds", "3 inferences")),
            response: Some("done".into()),
            usage: Box::new(TokenUsage {
                input_tokens: 10,
                output_tokens: 5,
                ..Default::default()
            }),
        },
        AgentEvent::StepStart { step: 1 },
        AgentEvent::StepEnd { step: 1 },
        AgentEvent::TextDelta {
            delta: "Hel".into(),
        },
        AgentEvent::ReasoningDelta {
            delta: "think".into(),
        },
        AgentEvent::ToolCallStart {
            call_id: id("c1"),
            name: "echo".into(),
        },
        AgentEvent::ToolCallArgsDelta {
            call_id: id("c1"),
            delta: "{\"te".into(),
        },
        AgentEvent::ToolCallReady {
            call_id: id("c1"),
            name: "echo".into(),
            arguments: json!({"text": "hi"}).into(),
        },
        AgentEvent::ToolCallDone {
            call_id: id("c1"),
            result: ToolResult::success(json!({"echoed": "hi"})).into(),
            state: ToolCallState::Succeeded,
        },
        AgentEvent::ToolCallSuspended {
            call_id: id("c1"),
            ticket: Box::new(ticket()),
        },
        AgentEvent::ToolCallResumed {
            call_id: id("c1"),
            decision: ResumeDecision::Approve,
        },
        AgentEvent::ToolCallProgress {
            call_id: id("c1"),
            progress: json!({"done": 3, "of": 10}),
        },
        AgentEvent::InferenceComplete {
            model: "gpt-x".into(),
            usage: TokenUsage {
                input_tokens: 7,
                output_tokens: 2,
                cached_input_tokens: 4,
                reasoning_tokens: 1,
            },
            duration_ms: 12,
            stop_reason: crate::StopReason::MaxTokens,
        },
        AgentEvent::StateSnapshot {
            revision: 4,
            state: json!({"counter": 2}),
        },
        AgentEvent::StateDelta {
            revision: 5,
            changes: json!({"counter": 3}),
        },
        AgentEvent::ActionDeadLettered {
            action: "compact".into(),
            phase: "before_inference".into(),
            reason: "run ended".into(),
        },
        AgentEvent::Warning {
            kind: WarningKind::HistoryRepaired,
            detail: "closed c9".into(),
        },
        AgentEvent::Error {
            message: "boom".into(),
        },
        AgentEvent::MessageAdded {
            step: 3,
            message: crate::Message::user("and the eggs"),
        },
    ]
}

fn covered(e: &AgentEvent) -> usize {
    match e {
        AgentEvent::RunStart { .. } => 0,
        AgentEvent::RunFinish { .. } => 1,
        AgentEvent::StepStart { .. } => 2,
        AgentEvent::StepEnd { .. } => 3,
        AgentEvent::TextDelta { .. } => 4,
        AgentEvent::ReasoningDelta { .. } => 5,
        AgentEvent::ToolCallStart { .. } => 6,
        AgentEvent::ToolCallArgsDelta { .. } => 7,
        AgentEvent::ToolCallReady { .. } => 8,
        AgentEvent::ToolCallDone { .. } => 9,
        AgentEvent::ToolCallSuspended { .. } => 10,
        AgentEvent::ToolCallResumed { .. } => 11,
        AgentEvent::ToolCallProgress { .. } => 12,
        AgentEvent::InferenceComplete { .. } => 13,
        AgentEvent::StateSnapshot { .. } => 14,
        AgentEvent::StateDelta { .. } => 15,
        AgentEvent::ActionDeadLettered { .. } => 16,
        AgentEvent::Warning { .. } => 17,
        AgentEvent::Error { .. } => 18,
        AgentEvent::MessageAdded { .. } => 19,
    }
}

#[test]
fn samples_cover_every_variant_once() {
    let idx: Vec<usize> = samples().iter().map(covered).collect();
    assert_eq!(idx, (0..20).collect::<Vec<_>>());
}

#[test]
fn every_event_round_trips_and_type_name_matches_tag() {
    for e in samples() {
        let v = serde_json::to_value(&e).expect("serialize");
        assert_eq!(v["type"], e.type_name(), "tag of {e:?}");
        let back: AgentEvent = serde_json::from_value(v).expect("deserialize");
        assert_eq!(back, e);
    }
}

#[test]
fn event_json_is_stable() {
    let text: String = samples()
        .iter()
        .map(|e| serde_json::to_string(e).expect("serialize") + "\n")
        .collect();
    expect_test::expect_file!["../tests/snapshots/events.jsonl"].assert_eq(&text);
}

#[test]
fn vocabulary_json_is_stable() {
    let mut text = String::new();
    let mut line = |v: serde_json::Value| text.push_str(&format!("{v}\n"));
    line(serde_json::to_value(Message::user("hi")).expect("ser"));
    line(
        serde_json::to_value(Message::assistant_with_calls(
            "",
            vec![ToolCall::from_raw_arguments(id("c2"), "echo", "{not json")],
        ))
        .expect("ser"),
    );
    line(
        serde_json::to_value(Message::tool(id("c1"), &ToolResult::error("no such file")))
            .expect("ser"),
    );
    line(
        serde_json::to_value(
            ToolDescriptor::new("echo", "Echo text").with_effect(EffectClass::ReadOnly),
        )
        .expect("ser"),
    );
    line(
        serde_json::to_value(ToolCallResume {
            call_id: id("c1"),
            argument_digest: "d41d8".into(),
            decision: ResumeDecision::Deny,
            payload: None,
        })
        .expect("ser"),
    );
    line(
        serde_json::to_value(InferenceResponse {
            message: Message::assistant("ok"),
            usage: TokenUsage::default(),
            stop_reason: StopReason::EndTurn,
        })
        .expect("ser"),
    );
    for t in [
        TerminationReason::NaturalEnd,
        TerminationReason::Suspended,
        TerminationReason::Cancelled,
        TerminationReason::error("provider unreachable"),
    ] {
        line(serde_json::to_value(t).expect("ser"));
    }
    line(serde_json::to_value(ToolCallState::ALL).expect("ser"));
    expect_test::expect![[r#"
        {"content":[{"text":"hi","type":"text"}],"role":"user"}
        {"role":"assistant","tool_calls":[{"arguments":null,"id":"c2","invalid_arguments":"{not json","name":"echo"}]}
        {"content":[{"text":"error: no such file","type":"text"}],"role":"tool","tool_call_id":"c1"}
        {"description":"Echo text","effect":"read_only","id":"echo","name":"echo","parameters":{"type":"object"}}
        {"argument_digest":"d41d8","call_id":"c1","decision":"deny"}
        {"message":{"content":[{"text":"ok","type":"text"}],"role":"assistant"},"stop_reason":"end_turn","usage":{"input_tokens":0,"output_tokens":0}}
        {"kind":"natural_end"}
        {"kind":"suspended"}
        {"kind":"cancelled"}
        {"kind":"error","message":"provider unreachable"}
        ["requested","executing","suspended","succeeded","failed","blocked","short_circuited","cancelled","outcome_unknown"]
    "#]]
    .assert_eq(&text);
}

#[test]
fn an_incomplete_message_round_trips_and_the_plain_forms_stay() {
    let cut = Message::incomplete_assistant("Once upon");
    let json = serde_json::to_string(&cut).expect("ser");
    expect_test::expect![[
        r#"{"role":"assistant","content":[{"type":"text","text":"Once upon"},{"type":"incomplete"}]}"#
    ]]
    .assert_eq(&json);
    let back: Message = serde_json::from_str(&json).expect("de");
    assert_eq!(back, cut);
    assert!(back.is_incomplete());
    // Its text is what the model wrote; the mark adds none.
    assert_eq!(back.text(), "Once upon");
    assert_eq!(back.content_as_text(), "Once upon");

    let plain = Message::assistant("Once upon");
    assert!(!plain.is_incomplete());
    expect_test::expect![[
        r#"{"role":"assistant","content":[{"type":"text","text":"Once upon"}]}"#
    ]]
    .assert_eq(&serde_json::to_string(&plain).expect("ser"));
    let back: Message = serde_json::from_str(
        r#"{"role":"assistant","content":[{"type":"text","text":"Once upon"}]}"#,
    )
    .expect("de");
    assert_eq!(back, plain);
}

#[test]
fn ids_reject_bad_strings_and_round_trip() {
    assert!(matches!(ThreadId::new(""), Err(IdError::Empty { .. })));
    assert!(matches!(
        RunId::new("a b"),
        Err(IdError::BadCharacter { at: 1, .. })
    ));
    assert!(matches!(
        ToolCallId::new("x".repeat(MAX_ID_LEN + 1)),
        Err(IdError::TooLong { .. })
    ));
    let t: ThreadId = "thread-1".parse().expect("valid");
    assert_eq!(t.to_string(), "thread-1");
    assert_eq!(serde_json::to_string(&t).expect("ser"), "\"thread-1\"");
    assert!(serde_json::from_str::<ProfileId>("\"\"").is_err());
}

#[test]
fn raw_arguments_parse_once() {
    let ok = ToolCall::from_raw_arguments(id("c"), "t", " {\"a\":1} ");
    assert_eq!(*ok.arguments, json!({"a": 1}));
    assert!(ok.invalid_arguments.is_none());
    let empty = ToolCall::from_raw_arguments(id("c"), "t", "");
    assert_eq!(*empty.arguments, json!({}));
    let bad = ToolCall::from_raw_arguments(id("c"), "t", "{\"a\":");
    assert_eq!(bad.invalid_arguments.as_deref(), Some("{\"a\":"));
    assert_eq!(*bad.arguments, serde_json::Value::Null);
}

#[test]
fn terminal_states() {
    let terminal: Vec<_> = ToolCallState::ALL
        .iter()
        .filter(|s| s.is_terminal())
        .collect();
    assert_eq!(terminal.len(), 6);
    assert!(!ToolCallState::Suspended.is_terminal());
    for s in ToolCallState::ALL {
        assert_eq!(serde_json::to_value(s).expect("ser"), s.as_str());
    }
}

#[test]
fn events_stay_small() {
    // Every stored event is one of these; a large payload goes behind a box instead of sizing
    // them all (a suspension ticket alone is about 180 bytes, a run's end 112).
    let size = std::mem::size_of::<AgentEvent>();
    assert!(size <= 80, "AgentEvent is {size} bytes");
}

#[test]
fn messages_stay_small() {
    // A history holds them side by side, and every request and phase context shares one.
    let size = std::mem::size_of::<Message>();
    assert!(size <= 56, "Message is {size} bytes");
}

#[test]
fn an_inference_complete_stored_without_its_stop_reason_reads_as_end_turn() {
    let stored = r#"{"type":"inference_complete","model":"m","usage":{"input_tokens":1,"output_tokens":1,"cached_input_tokens":0,"reasoning_tokens":0},"duration_ms":3}"#;
    let event: AgentEvent = serde_json::from_str(stored).expect("reads");
    assert!(matches!(
        event,
        AgentEvent::InferenceComplete {
            stop_reason: crate::StopReason::EndTurn,
            ..
        }
    ));
}
