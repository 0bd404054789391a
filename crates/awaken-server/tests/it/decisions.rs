//! Decisions on suspended calls across a server restart on a SQLite store: an approval and a
//! denial each stream the continued run to its end; refused decisions apply nothing.

use awaken_event::{AgentEvent, SuspendTicket, TerminationReason};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

/// The ticket of the activation's suspended call.
fn ticket(events: &[(awaken_server::EventId, AgentEvent)]) -> SuspendTicket {
    events
        .iter()
        .find_map(|(_, e)| match e {
            AgentEvent::ToolCallSuspended { ticket, .. } => Some((**ticket).clone()),
            _ => None,
        })
        .expect("a suspended call")
}

fn ended_as(events: &[(awaken_server::EventId, AgentEvent)]) -> TerminationReason {
    match events.last() {
        Some((_, AgentEvent::RunFinish { termination, .. })) => (**termination).clone(),
        other => panic!("the activation ends with run_finish: {other:?}"),
    }
}

fn decisions(call_id: &str, decision: &str, digest: &str) -> Value {
    json!({"decisions": [{"call_id": call_id, "decision": decision, "argument_digest": digest}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_and_deny_after_a_restart_on_sqlite() {
    let dir = tempfile::tempdir().expect("dir");
    let (approve_ticket, deny_ticket, approve_last, deny_last);
    {
        let rig = Rig::on(
            sqlite(dir.path()).await,
            vec![
                call_turn("c1", "guarded", json!({"text": "a"})),
                call_turn("c1", "guarded", json!({"text": "b"})),
            ],
        );
        let server = TestServer::start(rig.runtime(), config()).await;
        for thread in ["approve", "deny"] {
            let frames = server.start_run(thread, "hi").await.rest().await;
            let events = checked_live(&frames);
            assert_eq!(ended_as(&events), TerminationReason::Suspended);
            assert_eq!(stored_only(&events), rig.store.stored(thread).await);
        }
        approve_ticket = ticket(&rig.store.stored("approve").await);
        deny_ticket = ticket(&rig.store.stored("deny").await);
        approve_last = rig.store.stored("approve").await.len() as u64;
        deny_last = rig.store.stored("deny").await.len() as u64;
        server.stop().await;
    }

    // Another server over the same database file.
    let rig = Rig::on(
        sqlite(dir.path()).await,
        vec![text_turn(&["approved"]), text_turn(&["denied"])],
    );
    let server = TestServer::start(rig.runtime(), config()).await;
    let thread: Value = server
        .get("/v1/threads/approve")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(thread["waiting"][0]["call"]["call_id"], "c1");
    assert_eq!(
        thread["waiting"][0]["call"]["argument_digest"],
        approve_ticket.call.argument_digest.as_str()
    );

    // Refused: another digest than the one shown, an unknown call, no decision at all.
    let wrong = server
        .post(
            "/v1/threads/approve/decisions",
            decisions("c1", "approve", "not-the-digest"),
        )
        .await;
    assert_eq!(
        refusal(wrong).await,
        (
            StatusCode::BAD_REQUEST,
            "invalid_decision".into(),
            Some("decisions".into())
        )
    );
    let unknown = server
        .post(
            "/v1/threads/approve/decisions",
            json!({"decisions": [{"call_id": "nope", "decision": "approve"}]}),
        )
        .await;
    assert_eq!(
        refusal(unknown).await,
        (
            StatusCode::BAD_REQUEST,
            "unknown_call".into(),
            Some("decisions".into())
        )
    );
    let none = server
        .post("/v1/threads/approve/decisions", json!({"decisions": []}))
        .await;
    assert_eq!(refusal(none).await.1, "no_decisions");
    // Nothing of them was applied.
    assert_eq!(rig.store.stored("approve").await.len() as u64, approve_last);
    let thread: Value = server
        .get("/v1/threads/approve")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(thread["waiting"].as_array().map(Vec::len), Some(1));

    // The approval streams the continued run to its end.
    let response = server
        .post(
            "/v1/threads/approve/decisions",
            decisions("c1", "approve", &approve_ticket.call.argument_digest),
        )
        .await;
    let frames = Sse::new(response).await.rest().await;
    let events = checked_live(&frames);
    assert_eq!(
        events[0].0,
        awaken_server::EventId::stored(approve_last + 1)
    );
    expect_test::expect![[r#"
        9 run_start resumed=true
        10@9 step_start 2
        11@9 tool_call_resumed c1 Approve
        12@9 tool_call_ready c1 {"text":"a"}
        13 tool_call_done c1 succeeded {"echoed":"a"}
        14 step_end 2
        15@9 step_start 3
        15.1@9 text_delta "approved"
        16@9 inference_complete
        17 step_end 3
        18 run_finish natural_end response=Some("approved")
    "#]]
    .assert_eq(&render(&events));
    let stored = rig.store.stored("approve").await;
    assert_eq!(stored_only(&events), stored[approve_last as usize..]);

    // The denial too: the call is closed, not run.
    let response = server
        .post(
            "/v1/threads/deny/decisions",
            decisions("c1", "deny", &deny_ticket.call.argument_digest),
        )
        .await;
    let frames = Sse::new(response).await.rest().await;
    let events = checked_live(&frames);
    assert_eq!(events[0].0, awaken_server::EventId::stored(deny_last + 1));
    let done = events
        .iter()
        .find_map(|(_, e)| match e {
            AgentEvent::ToolCallDone { result, state, .. } => {
                Some((state.to_string(), result.clone()))
            }
            _ => None,
        })
        .expect("the call was closed");
    assert_eq!(done.0, "cancelled", "{done:?}");
    assert_eq!(ended_as(&events), TerminationReason::NaturalEnd);
    let stored = rig.store.stored("deny").await;
    assert_eq!(stored_only(&events), stored[deny_last as usize..]);

    // Neither thread waits any more.
    for thread in ["approve", "deny"] {
        let again = server
            .post(
                &format!("/v1/threads/{thread}/decisions"),
                decisions("c1", "approve", &approve_ticket.call.argument_digest),
            )
            .await;
        assert_eq!(
            refusal(again).await,
            (StatusCode::CONFLICT, "not_waiting".into(), None)
        );
    }
    assert_eq!(rig.store.last_run("approve").await.status.as_str(), "done");
    assert_eq!(rig.store.last_run("deny").await.status.as_str(), "done");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_for_a_run_still_in_flight_is_refused_busy_not_unwaited() {
    // The run suspends its call, but its end (the commit that makes it wait) is not written:
    // the store holds it `Running` with the call suspended, as while its step's other calls run.
    let rig = Rig::memory(vec![call_turn("c1", "guarded", json!({"text": "a"}))]);
    rig.store.fail_ends(true);
    let server = TestServer::start(rig.runtime(), config()).await;
    let ended = server
        .post("/v1/threads/t/runs?stream=false", json!({"message": "hi"}))
        .await;
    assert_eq!(refusal(ended).await.1, "end_not_written");
    let suspended = ticket(&rig.store.stored("t").await);
    assert_eq!(rig.store.last_run("t").await.status.as_str(), "running");
    let refused = server
        .post(
            "/v1/threads/t/decisions",
            decisions("c1", "approve", &suspended.call.argument_digest),
        )
        .await;
    let (status, code, _) = refusal(refused).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::CONFLICT, "thread_busy")
    );
    assert_eq!(rig.store.last_run("t").await.status.as_str(), "running");
    assert_eq!(rig.model.requests(), 1);
}
