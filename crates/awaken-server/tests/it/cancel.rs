//! `POST /cancel` on a run held mid-answer: the run ends cancelled, on the stream and in the
//! store.

use std::time::Duration;

use awaken_event::{AgentEvent, TerminationReason};
use awaken_server::ServerConfig;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_a_held_run_cancelled() {
    let rig = Rig::memory(vec![held()]);
    let server = TestServer::start(rig.runtime(), config()).await;
    let mut sse = server.start_run("t", "hi").await;
    let part = sse.until(|f| f.is_text("Hel")).await;
    rig.model.wait_holds(1).await;

    let response = server.post("/v1/threads/t/cancel", json!({})).await;
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.expect("JSON");
    assert_eq!(answer["cancelled"], true, "{answer}");
    assert_eq!(
        answer["outcome"]["termination"]["kind"], "cancelled",
        "{answer}"
    );

    let rest = sse.rest().await;
    let full: Vec<Frame> = part.into_iter().chain(rest).collect();
    let events = checked_live(&full);
    let Some((_, AgentEvent::RunFinish { termination, .. })) = events.last() else {
        panic!("the stream ends with run_finish: {full:#?}")
    };
    assert_eq!(**termination, TerminationReason::Cancelled);
    assert!(
        !full.iter().any(|f| f.is_text("lo")),
        "the held answer never went on"
    );
    let record = rig.store.last_run("t").await;
    assert_eq!(record.status.as_str(), "done");
    assert_eq!(record.termination, Some(TerminationReason::Cancelled));
    assert_eq!(answer["outcome"]["run_id"], record.run_id.as_str());
    assert_eq!(stored_only(&events), rig.store.stored("t").await);

    // Nothing is left to cancel.
    let again = server.post("/v1/threads/t/cancel", json!({})).await;
    assert_eq!(
        refusal(again).await,
        (StatusCode::CONFLICT, "not_running".into(), None)
    );
    let unknown = server.post("/v1/threads/nope/cancel", json!({})).await;
    assert_eq!(
        refusal(unknown).await,
        (StatusCode::NOT_FOUND, "unknown_thread".into(), None)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_whose_run_has_not_ended_within_the_wait_is_accepted() {
    let rig = Rig::memory(vec![held()]);
    let config = ServerConfig {
        cancel_wait: Duration::ZERO,
        ..config()
    };
    let server = TestServer::start(rig.runtime(), config).await;
    let mut sse = server.start_run("t", "hi").await;
    sse.until(|f| f.is_text("Hel")).await;
    rig.model.wait_holds(1).await;
    // The store holds the run's last commit: it cannot end within the wait.
    rig.store.close_commits();

    let response = server.post("/v1/threads/t/cancel", json!({})).await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let answer: Value = response.json().await.expect("JSON");
    assert_eq!(answer, json!({"cancelled": true, "outcome": null}));
    // The run ends cancelled all the same once its commit goes through.
    rig.store.wait_held_commits(1).await;
    rig.store.open_commits();
    assert_eq!(termination(&sse.rest().await), TerminationReason::Cancelled);
    let record = rig.store.last_run("t").await;
    assert_eq!(record.termination, Some(TerminationReason::Cancelled));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_supersedes_a_running_run_cancels_it_first() {
    let rig = Rig::memory(vec![held(), text_turn(&["instead"])]);
    // One run in flight at most: the superseded run's place is the new one's.
    let server = TestServer::start(rig.runtime(), config().with_max_runs_in_flight(1)).await;
    let mut first = server.start_run("t", "hi").await;
    let part = first.until(|f| f.is_text("Hel")).await;
    rig.model.wait_holds(1).await;

    // Without `supersede` the start is refused (the thread is busy, whether or not the server
    // has room); with it, the running run ends cancelled at its checkpoint and the new one runs.
    let refused = server
        .post("/v1/threads/t/runs", json!({"message": "again"}))
        .await;
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    let response = server
        .post(
            "/v1/threads/t/runs",
            json!({"message": "instead", "supersede": true}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let second = Sse::new(response).await.rest().await;
    let events = checked_live(&second);
    assert_eq!(termination(&second), TerminationReason::NaturalEnd);
    let Some((_, AgentEvent::RunFinish { response, .. })) = events.last() else {
        panic!("the new run finished: {second:#?}")
    };
    assert_eq!(response.as_deref(), Some("instead"));
    let first: Vec<Frame> = part.into_iter().chain(first.rest().await).collect();
    checked_live(&first);
    assert_eq!(termination(&first), TerminationReason::Cancelled);

    let shown: Value = server
        .get("/v1/threads/t")
        .await
        .json()
        .await
        .expect("JSON");
    let kinds: Vec<&Value> = shown["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| &r["termination"]["kind"])
        .collect();
    assert_eq!(
        kinds,
        [&json!("cancelled"), &json!("natural_end")],
        "{shown}"
    );
    assert_eq!(rig.model.requests(), 2);
}
