//! `POST /v1/threads/{thread}/messages`: a message for the run in flight, committed at its
//! next step before the inference that sees it; answered with that step, or refused when no
//! run here can take it.

use awaken_event::{AgentEvent, StopReason, TerminationReason};
use awaken_server::EventId;
use reqwest::StatusCode;
use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_for_a_run_in_flight_is_taken_at_its_next_step() {
    let mut first = vec![Piece::Hold];
    first.extend(call("c1", "echo", json!({"text": "milk"})));
    first.push(stop(StopReason::ToolCalls));
    let rig = Rig::memory(vec![first, text_turn(&["Noted: milk and eggs."])]);
    let server = TestServer::start(rig.runtime(), config()).await;
    let stream = server.start_run("t", "Remind me to buy milk").await;
    rig.model.wait_holds(1).await;

    // Sent while the model holds its first answer: taken at the second step.
    let answer = steered_while_held(&server, &rig, "Also eggs.").await;
    assert_eq!(answer, json!({"taken": true, "step": 2}));

    let frames = stream.rest().await;
    let live = checked_live(&frames);
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    // The stream shows the message between the steps, under its stored id; so does the
    // thread's stored log, to a client that comes back later.
    let added = |events: &[(EventId, AgentEvent)]| -> Vec<String> {
        let mut shown = Vec::new();
        for (id, e) in events {
            match e {
                AgentEvent::MessageAdded { step, message } => {
                    shown.push(format!("{id} added {step}: {}", message.text()));
                }
                AgentEvent::StepStart { step } => shown.push(format!("step_start {step}")),
                _ => {}
            }
        }
        shown
    };
    let shown = added(&live);
    assert_eq!(shown.len(), 3, "{shown:?}");
    assert_eq!(shown[0], "step_start 1");
    assert!(shown[1].ends_with(" added 2: Also eggs."), "{shown:?}");
    assert_eq!(shown[2], "step_start 2");
    let stored = server.events_after("t", "0").await.rest().await;
    assert_eq!(added(&checked_activation(&stored))[1], shown[1]);
    // Tool calls and results carry no text part.
    let expected = [
        ("user", "Remind me to buy milk"),
        ("assistant", ""),
        ("tool", ""),
        ("user", "Also eggs."),
        ("assistant", "Noted: milk and eggs."),
    ]
    .map(|(role, text)| (role.to_owned(), text.to_owned()));
    assert_eq!(messages(&server, "t").await, expected);

    // The run is over: nothing here takes a message, and a blank one is refused first.
    let over = server
        .post("/v1/threads/t/messages", json!({"message": "And bread."}))
        .await;
    assert_eq!(
        refusal(over).await,
        (StatusCode::CONFLICT, "not_running".into(), None)
    );
    let nowhere = server
        .post("/v1/threads/nobody/messages", json!({"message": "Hello?"}))
        .await;
    assert_eq!(
        refusal(nowhere).await,
        (StatusCode::NOT_FOUND, "unknown_thread".into(), None)
    );
    let blank = server
        .post("/v1/threads/t/messages", json!({"message": " "}))
        .await;
    assert_eq!(
        refusal(blank).await,
        (
            StatusCode::BAD_REQUEST,
            "empty_message".into(),
            Some("message".into())
        )
    );
    assert_eq!(rig.model.requests(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_waiting_at_the_final_answer_keeps_the_run_going() {
    let rig = Rig::memory(vec![
        vec![Piece::Hold, text("First."), stop(StopReason::EndTurn)],
        text_turn(&["Second."]),
    ]);
    let server = TestServer::start(rig.runtime(), config()).await;
    let stream = server.start_run("t", "hi").await;
    rig.model.wait_holds(1).await;
    let answer = steered_while_held(&server, &rig, "One more.").await;
    assert_eq!(answer["step"], 2);
    let frames = stream.rest().await;
    let events = checked_live(&frames);
    let Some((_, AgentEvent::RunFinish { response, .. })) = events.last() else {
        panic!("the run finished: {frames:#?}")
    };
    assert_eq!(response.as_deref(), Some("Second."));
    assert_eq!(rig.model.requests(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_for_a_run_that_stops_to_wait_for_a_decision_is_refused() {
    let mut first = vec![Piece::Hold];
    first.extend(call("c1", "guarded", json!({"text": "x"})));
    first.push(stop(StopReason::ToolCalls));
    let rig = Rig::memory(vec![first]);
    let server = TestServer::start(rig.runtime(), config()).await;
    let stream = server.start_run("t", "hi").await;
    rig.model.wait_holds(1).await;
    // The run suspends at the call: it ends with the message still waiting, which it refuses.
    let steered = server.post_later("/v1/threads/t/messages", json!({"message": "Wait."}));
    waiting(&server, "t", 1).await;
    rig.model.release(1);
    let response = guarded("the steering answer", steered)
        .await
        .expect("posted");
    assert_eq!(
        refusal(response).await,
        (StatusCode::CONFLICT, "not_taken".into(), None)
    );
    assert_eq!(
        termination(&stream.rest().await),
        TerminationReason::Suspended
    );
    assert!(
        !messages(&server, "t")
            .await
            .iter()
            .any(|(_, text)| text == "Wait."),
        "the message was not stored"
    );
}
