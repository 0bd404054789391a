//! A run cancelled while the model answers: what the thread keeps of the answer, and that the
//! thread's next requests still alternate user and assistant turns.

use awaken_event::{
    AgentEvent, ContentBlock, Message, Role, TerminationReason, ThreadId, VecSink, check_activation,
};
use awaken_llm::{ScriptToolCall, ScriptTurn};
use awaken_runtime::{AgentRuntime, RunActivation};
use serde_json::json;

use crate::support::{Scenario, render};

fn thread() -> ThreadId {
    ThreadId::new("thread").expect("id")
}

/// One line per message: its role, `(incomplete)` when marked so, its text, its calls or the
/// call it answers.
pub(crate) fn render_messages(messages: &[Message]) -> String {
    messages
        .iter()
        .map(|m| {
            let mut line = format!("{:?}", m.role).to_lowercase();
            if m.is_incomplete() {
                line.push_str(" (incomplete)");
            }
            line.push_str(&format!(" {:?}", m.content_as_text()));
            for call in m.tool_calls.iter() {
                line.push_str(&format!(" calls {}", call.id));
            }
            if let Some(id) = &m.tool_call_id {
                line.push_str(&format!(" answers {id}"));
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks `messages` (a request's, the system prompt being apart) as the strictest providers
/// do: the first message is the user's; user and assistant turns alternate; an assistant
/// message's calls are answered right after it, one result per call, in call order, and the
/// turn after the results is either's. System messages stand aside.
pub(crate) fn strictly_alternating(messages: &[Message]) -> Result<(), String> {
    #[derive(PartialEq)]
    enum Next {
        FirstUser,
        User,
        Assistant,
        Either,
    }
    let mut next = Next::FirstUser;
    let mut unanswered: Vec<&str> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let wrong = |why: &str| Err(format!("message {i} ({:?}): {why}", m.role));
        if m.role == Role::Tool {
            match unanswered.first() {
                None => return wrong("a result no call is waiting for"),
                Some(call) if m.tool_call_id.as_ref().map(|id| id.as_str()) != Some(*call) => {
                    return wrong(&format!("the next result must answer {call}"));
                }
                Some(_) => unanswered.remove(0),
            };
            continue;
        }
        if m.role == Role::System {
            continue;
        }
        if !unanswered.is_empty() {
            return wrong(&format!("calls {unanswered:?} are not answered"));
        }
        next = match (m.role, next) {
            (Role::User, Next::Assistant) => return wrong("a user message after another"),
            (Role::User, _) => Next::Assistant,
            (_, Next::FirstUser) => return wrong("the first message is not the user's"),
            (_, Next::User) => return wrong("an assistant message after another"),
            _ if m.tool_calls.is_empty() => Next::User,
            _ => {
                unanswered = m.tool_calls.iter().map(|c| c.id.as_str()).collect();
                Next::Either
            }
        };
    }
    match unanswered.first() {
        Some(call) => Err(format!("call {call} is not answered")),
        None if next == Next::FirstUser => Err("no user message".into()),
        None => Ok(()),
    }
}

/// Runs `text` as a new user message on the thread; the run's events pass the grammar check.
async fn next_run(runtime: &AgentRuntime, text: &str) -> (TerminationReason, String) {
    let sink = VecSink::new();
    let outcome = runtime
        .run(
            RunActivation::new(thread(), "agent").with_user_message(text),
            &sink,
        )
        .await
        .expect("the run starts");
    let events = sink.events();
    if let Err(v) = check_activation(&events) {
        panic!("event grammar violated: {v}\n{}", render(&events));
    }
    (outcome.termination, render(&events))
}

/// The thread's stored events; each run's are one well-formed activation.
async fn stored_activations(runtime: &AgentRuntime) -> usize {
    let stored = runtime
        .store()
        .load_events(&thread(), 0)
        .await
        .expect("events");
    let mut runs: Vec<(String, Vec<AgentEvent>)> = Vec::new();
    for e in stored {
        match runs.last_mut() {
            Some((run, events)) if *run == e.run_id.as_str() => events.push(e.event),
            _ => runs.push((e.run_id.to_string(), vec![e.event])),
        }
    }
    for (run, events) in &runs {
        if let Err(v) = check_activation(events) {
            panic!(
                "stored events of {run} violate the grammar: {v}\n{}",
                render(events)
            );
        }
    }
    runs.len()
}

#[test]
fn the_checker_refuses_what_strict_providers_refuse() {
    let call = |id: &str| {
        Message::assistant_with_calls(
            "",
            vec![awaken_event::ToolCall::new(
                awaken_event::ToolCallId::new(id).expect("id"),
                "echo",
                json!({}),
            )],
        )
    };
    let result = |id: &str| {
        Message::tool(
            awaken_event::ToolCallId::new(id).expect("id"),
            &awaken_event::ToolResult::success(json!("ok")),
        )
    };
    let cases = [
        vec![Message::user("a"), Message::user("b")],
        vec![Message::assistant("a")],
        vec![Message::system("s")],
        vec![
            Message::user("a"),
            Message::assistant("b"),
            Message::assistant("c"),
        ],
        vec![Message::user("a"), call("c1")],
        vec![Message::user("a"), call("c1"), result("c2")],
        vec![Message::user("a"), result("c1")],
        vec![Message::user("a"), call("c1"), Message::user("b")],
    ];
    let verdicts: Vec<String> = cases
        .iter()
        .map(|c| strictly_alternating(c).err().unwrap_or_else(|| "ok".into()))
        .collect();
    expect_test::expect![[r#"
        message 1 (User): a user message after another
        message 0 (Assistant): the first message is not the user's
        no user message
        message 2 (Assistant): an assistant message after another
        call c1 is not answered
        message 2 (Tool): the next result must answer c1
        message 1 (Tool): a result no call is waiting for
        message 2 (User): calls ["c1"] are not answered"#]]
    .assert_eq(&verdicts.join("\n"));
    let fine = [
        Message::system("s"),
        Message::user("a"),
        call("c1"),
        result("c1"),
        call("c2"),
        result("c2"),
        Message::assistant("b"),
        Message::user("c"),
        Message::incomplete_assistant("d"),
        Message::user("e"),
    ];
    assert_eq!(strictly_alternating(&fine), Ok(()));
}

#[tokio::test]
async fn a_run_cancelled_mid_answer_keeps_the_text_written_marked_incomplete() {
    let cut_off = ScriptTurn {
        wait_for_cancel: true,
        ..ScriptTurn::deltas(["Once upon", " a time"])
    }
    .with_reasoning("a story")
    .with_tool_call(ScriptToolCall::new("echo", json!({"text": "x"})).with_id("c1"));
    let out = Scenario::new(vec![cut_off, ScriptTurn::text("There was a dragon.")])
        // The model has begun a call after its text when the run is cancelled.
        .cancel_when(|e| matches!(e, AgentEvent::ToolCallStart { .. }))
        .run()
        .await;
    assert_eq!(out.outcome.termination, TerminationReason::Cancelled);
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        step_start 1
        reasoning_delta
        text "Once upon"
        text " a time"
        call_start c1 echo
        call_done c1 cancelled "not executed: the inference failed"
        step_end 1
        run_finish cancelled response=None tokens=0
    "#]]
    .assert_eq(&render(&out.events));
    // The answer so far, without its reasoning or its unfinished call.
    let history = out.runtime.history(&thread()).await.expect("history");
    expect_test::expect![[r#"
        user "hi"
        assistant (incomplete) "Once upon a time""#]]
    .assert_eq(&render_messages(&history));
    assert_eq!(
        &*history[1].content,
        [
            ContentBlock::text("Once upon a time"),
            ContentBlock::Incomplete
        ]
    );
    assert_eq!(stored_activations(&out.runtime).await, 1);

    // The thread goes on: the model sees what it had said as its turn.
    let (termination, _) = next_run(&out.runtime, "Go on.").await;
    assert_eq!(termination, TerminationReason::NaturalEnd);
    let requests = out.executor.requests();
    assert_eq!(requests.len(), 2);
    expect_test::expect![[r#"
        user "hi"
        assistant (incomplete) "Once upon a time"
        user "Go on.""#]]
    .assert_eq(&render_messages(&requests[1].messages));
    for request in &requests {
        assert_eq!(strictly_alternating(&request.messages), Ok(()));
    }
    assert_eq!(stored_activations(&out.runtime).await, 2);
}

#[tokio::test]
async fn a_run_cancelled_before_any_text_keeps_no_answer_and_later_requests_alternate() {
    let thinking = ScriptTurn {
        wait_for_cancel: true,
        ..ScriptTurn::default()
    }
    .with_reasoning("hmm");
    let out = Scenario::new(vec![
        thinking,
        ScriptTurn::text("Here."),
        ScriptTurn::tool_call("echo", json!({"text": "x"})),
        ScriptTurn::text("Echoed."),
    ])
    .cancel_when(|e| matches!(e, AgentEvent::ReasoningDelta { .. }))
    .run()
    .await;
    assert_eq!(out.outcome.termination, TerminationReason::Cancelled);
    let history = out.runtime.history(&thread()).await.expect("history");
    expect_test::expect![[r#"user "hi""#]].assert_eq(&render_messages(&history));
    assert_eq!(stored_activations(&out.runtime).await, 1);

    // The thread's next run stores its message after the first one...
    let (termination, _) = next_run(&out.runtime, "Are you there?").await;
    assert_eq!(termination, TerminationReason::NaturalEnd);
    let history = out.runtime.history(&thread()).await.expect("history");
    expect_test::expect![[r#"
        user "hi"
        user "Are you there?"
        assistant "Here.""#]]
    .assert_eq(&render_messages(&history));
    assert_eq!(
        strictly_alternating(&history),
        Err("message 1 (User): a user message after another".into())
    );
    // ... and sends them as one.
    let requests = out.executor.requests();
    expect_test::expect![[r#"user "hi\n\nAre you there?""#]]
        .assert_eq(&render_messages(&requests[1].messages));

    // A later run on this history, of two steps: every request merges them again.
    let (termination, _) = next_run(&out.runtime, "Echo x.").await;
    assert_eq!(termination, TerminationReason::NaturalEnd);
    let requests = out.executor.requests();
    assert_eq!(requests.len(), 4);
    expect_test::expect![[r#"
        user "hi\n\nAre you there?"
        assistant "Here."
        user "Echo x."
        assistant "" calls call_3_0
        tool "{\"echoed\":\"x\"}" answers call_3_0"#]]
    .assert_eq(&render_messages(&requests[3].messages));
    for (i, request) in requests.iter().enumerate() {
        assert_eq!(
            strictly_alternating(&request.messages),
            Ok(()),
            "request {i}"
        );
    }
    assert_eq!(stored_activations(&out.runtime).await, 3);
}
