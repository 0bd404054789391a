//! What the server refuses, with which status and code: a busy or waiting thread, a body over
//! the limit, too many runs, malformed requests, unknown threads, a missing or wrong token, and
//! serving on a public address without one.

use awaken_server::{ServeError, ServerConfig};
use reqwest::StatusCode;
use serde_json::json;

use crate::support::*;

fn refused(
    status: StatusCode,
    code: &str,
    field: Option<&str>,
) -> (StatusCode, String, Option<String>) {
    (status, code.into(), field.map(Into::into))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_or_waiting_thread_refuses_a_new_run() {
    let rig = Rig::memory(vec![
        held(),
        call_turn("c1", "guarded", json!({"text": "a"})),
    ]);
    let server = TestServer::start(rig.runtime(), config()).await;
    let mut sse = server.start_run("busy", "hi").await;
    sse.until(|f| f.is_text("Hel")).await;
    let second = server
        .post("/v1/threads/busy/runs", json!({"message": "again"}))
        .await;
    assert_eq!(
        refusal(second).await,
        refused(StatusCode::CONFLICT, "thread_busy", None)
    );
    rig.model.release(1);
    sse.rest().await;

    // A thread waiting for a decision.
    server.start_run("waiting", "hi").await.rest().await;
    let second = server
        .post("/v1/threads/waiting/runs", json!({"message": "again"}))
        .await;
    assert_eq!(
        refusal(second).await,
        refused(StatusCode::CONFLICT, "thread_waiting", None)
    );
    // Neither refusal started anything.
    assert_eq!(rig.model.requests(), 2);
    for thread in ["busy", "waiting"] {
        let starts = rig
            .store
            .stored(thread)
            .await
            .into_iter()
            .filter(|(_, e)| e.type_name() == "run_start")
            .count();
        assert_eq!(starts, 1, "{thread}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_refused() {
    let rig = Rig::memory(vec![text_turn(&["ok"])]);
    let server = TestServer::start(rig.runtime(), config().with_max_body_bytes(64)).await;
    let big = server
        .post("/v1/threads/t/runs", json!({"message": "x".repeat(1000)}))
        .await;
    assert_eq!(
        refusal(big).await,
        refused(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", None)
    );
    // A body under the limit is served.
    let frames = server.start_run("t", "hi").await.rest().await;
    checked_live(&frames);
    assert_eq!(rig.model.requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_over_the_limit_are_refused() {
    let rig = Rig::memory(Vec::new());
    let small = awaken_server::ServerConfig {
        max_header_bytes: 1024,
        ..config()
    };
    let server = TestServer::start(rig.runtime(), small).await;
    let big = server
        .client
        .get(server.url("/v1/agents"))
        .header("x-padding", "x".repeat(2048))
        .send()
        .await
        .expect("request");
    assert_eq!(
        refusal(big).await,
        refused(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            None
        )
    );
    assert_eq!(server.get("/v1/agents").await.status(), StatusCode::OK);

    // On the default limit (16 KiB), past the connection's first buffer (8 KiB): headers under
    // the limit are served, and over it refused with the JSON body.
    let server = TestServer::start(rig.runtime(), config()).await;
    let padded = |bytes: usize| {
        server
            .client
            .get(server.url("/v1/agents"))
            .header("x-padding", "x".repeat(bytes))
            .send()
    };
    let under = padded(12 << 10).await.expect("request");
    assert_eq!(under.status(), StatusCode::OK);
    let over = padded(20 << 10).await.expect("request");
    assert_eq!(
        refusal(over).await,
        refused(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            None
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_over_the_limit_of_runs_is_told_to_retry() {
    let rig = Rig::memory(vec![held(), text_turn(&["later"])]);
    let server = TestServer::start(rig.runtime(), config().with_max_runs_in_flight(1)).await;
    let mut sse = server.start_run("one", "hi").await;
    sse.until(|f| f.is_text("Hel")).await;
    let other = server
        .post("/v1/threads/two/runs", json!({"message": "hi"}))
        .await;
    assert_eq!(
        other
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(
        refusal(other).await,
        refused(StatusCode::SERVICE_UNAVAILABLE, "too_many_runs", None)
    );
    // The thread of the run in flight is busy, however full the server is.
    let same = server
        .post("/v1/threads/one/runs", json!({"message": "again"}))
        .await;
    assert_eq!(
        refusal(same).await,
        refused(StatusCode::CONFLICT, "thread_busy", None)
    );
    // Once the run ended, its place is free again.
    rig.model.release(1);
    sse.rest().await;
    let frames = server.start_run("two", "hi").await.rest().await;
    checked_live(&frames);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_and_unknown_threads_are_refused() {
    let rig = Rig::memory(Vec::new());
    let server = TestServer::start(rig.runtime(), config()).await;
    let malformed = server
        .client
        .post(server.url("/v1/threads/t/runs"))
        .header("content-type", "application/json")
        .body("{\"message\": ")
        .send()
        .await
        .expect("request");
    assert_eq!(
        refusal(malformed).await,
        refused(StatusCode::BAD_REQUEST, "malformed_json", Some("body"))
    );
    let unknown_agent = server
        .post(
            "/v1/threads/t/runs",
            json!({"message": "hi", "agent": "nobody"}),
        )
        .await;
    assert_eq!(
        refusal(unknown_agent).await,
        refused(StatusCode::BAD_REQUEST, "unknown_agent", Some("agent"))
    );
    let bad_thread = server
        .post("/v1/threads/a%20b/runs", json!({"message": "hi"}))
        .await;
    assert_eq!(
        refusal(bad_thread).await,
        refused(StatusCode::BAD_REQUEST, "invalid_thread_id", Some("thread"))
    );
    let bad_thread = server.get("/v1/threads/a%20b/events").await;
    assert_eq!(
        refusal(bad_thread).await,
        refused(StatusCode::BAD_REQUEST, "invalid_thread_id", Some("thread"))
    );
    let bad_position = server.get("/v1/threads/t/events?after=x").await;
    assert_eq!(
        refusal(bad_position).await,
        refused(StatusCode::BAD_REQUEST, "invalid_event_id", Some("after"))
    );
    for path in ["/v1/threads/nope", "/v1/threads/nope/events"] {
        assert_eq!(
            refusal(server.get(path).await).await,
            refused(StatusCode::NOT_FOUND, "unknown_thread", None),
            "{path}"
        );
    }
    assert_eq!(
        refusal(server.get("/v1/agents/nobody").await).await,
        refused(StatusCode::NOT_FOUND, "unknown_agent", None)
    );
    // None of them started a run.
    assert_eq!(rig.model.requests(), 0);
    assert!(rig.store.stored("t").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_needs_the_token_and_health_does_not() {
    let rig = Rig::memory(Vec::new());
    let server = TestServer::start(rig.runtime(), config().with_auth_token("s3cret")).await;
    let none = server.get("/v1/agents").await;
    assert_eq!(
        none.headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer realm=\"awaken\"")
    );
    assert_eq!(
        refusal(none).await,
        refused(StatusCode::UNAUTHORIZED, "unauthorized", None)
    );
    let send = |token: &'static str| {
        server
            .client
            .get(server.url("/v1/agents"))
            .bearer_auth(token)
            .send()
    };
    let wrong = send("s3cre").await.expect("request");
    assert_eq!(
        refusal(wrong).await,
        refused(StatusCode::UNAUTHORIZED, "unauthorized", None)
    );
    let longer = send("s3cret!").await.expect("request");
    assert_eq!(longer.status(), StatusCode::UNAUTHORIZED);
    let right = send("s3cret").await.expect("request");
    assert_eq!(right.status(), StatusCode::OK);
    // The scheme's name is not case-sensitive; the token is.
    let scheme = |value: &'static str| {
        server
            .client
            .get(server.url("/v1/agents"))
            .header("authorization", value)
            .send()
    };
    let lower = scheme("bearer s3cret").await.expect("request");
    assert_eq!(lower.status(), StatusCode::OK);
    let token_case = scheme("Bearer S3CRET").await.expect("request");
    assert_eq!(token_case.status(), StatusCode::UNAUTHORIZED);
    let basic = scheme("Basic s3cret").await.expect("request");
    assert_eq!(basic.status(), StatusCode::UNAUTHORIZED);
    // Nor does the configuration print it.
    let shown = format!("{:?}", config().with_auth_token("s3cret"));
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(
        shown.contains("auth_token: Some(\"<redacted>\")"),
        "{shown}"
    );
    assert_eq!(server.get("/healthz").await.status(), StatusCode::OK);
    assert_eq!(server.get("/readyz").await.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_public_address_without_a_token() {
    // With a worker identity, a server that served would look for unfinished runs.
    let rig = Rig::memory(Vec::new()).with_worker("w");
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("bind");
    let server = awaken_server::AgentServer::new(rig.runtime(), ServerConfig::default());
    let served = guarded(
        "serve to refuse",
        awaken_server::serve(server, listener, std::future::pending()),
    )
    .await;
    let Err(ServeError::Unauthenticated { addr }) = served else {
        panic!("refused: {served:?}")
    };
    assert!(addr.ip().is_unspecified(), "{addr}");
    // Nothing was recovered or served.
    assert_eq!(rig.store.scans(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_end_was_not_written_says_so_and_recovery_finishes_it() {
    // Runs hold leases, so recovery looks for unfinished runs every `recover_interval`.
    let rig = Rig::memory(vec![text_turn(&["hello"])]).with_worker("w");
    rig.store.fail_ends(true);
    let server = TestServer::start(rig.runtime(), config()).await;
    let response = server
        .client
        .post(server.url("/v1/threads/t/runs?stream=false"))
        .json(&json!({"message": "hi"}))
        .send()
        .await
        .expect("an answer");
    assert_eq!(
        refusal(response).await,
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "end_not_written".into(),
            None
        )
    );
    assert_eq!(rig.store.last_run("t").await.status.as_str(), "running");
    // Once the store takes the end, the server's recovery ends the run as it had ended,
    // without asking the model again.
    rig.store.fail_ends(false);
    guarded("the recovered end", async {
        while rig.store.last_run("t").await.status.as_str() != "done" {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(
        rig.store.last_run("t").await.termination,
        Some(awaken_event::TerminationReason::NaturalEnd)
    );
    assert_eq!(rig.model.requests(), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_right_after_the_last_ones_finish_waits_for_it_to_close() {
    let rig = Rig::memory(vec![text_turn(&["one"]), text_turn(&["two"])]).with_worker("w");
    // The first run's lease release (after its `run_finish`) waits.
    rig.store.close_releases();
    let server = TestServer::start(rig.runtime(), config()).await;
    let mut sse = server.start_run("t", "first").await;
    sse.until(|f| f.is("run_finish")).await;
    let second = tokio::spawn(
        server
            .client
            .post(server.url("/v1/threads/t/runs?stream=false"))
            .json(&json!({"message": "second"}))
            .send(),
    );
    // Not refused as busy: it waits for the first run to close.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second start was answered at once"
    );
    rig.store.open_releases();
    let response = guarded("the second run", second)
        .await
        .expect("the request task")
        .expect("an answer");
    assert_eq!(response.status(), StatusCode::OK);
    let outcome: serde_json::Value = response.json().await.expect("the outcome");
    assert_eq!(outcome["response"], "two", "{outcome}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_inference_override_reaches_the_model_and_is_checked_first() {
    let rig = Rig::memory(vec![text_turn(&["Hello"])]);
    let server = TestServer::start(rig.runtime(), config()).await;
    // Out of range: refused before anything runs, naming the field.
    for inference in [
        json!({"temperature": 2.5}),
        json!({"top_p": -0.1}),
        json!({"max_tokens": 0}),
        json!({"upstream_model": " "}),
    ] {
        let response = server
            .post(
                "/v1/threads/t/runs",
                json!({"message": "hi", "inference": inference}),
            )
            .await;
        assert_eq!(
            refusal(response).await,
            refused(
                StatusCode::BAD_REQUEST,
                "invalid_inference",
                Some("inference")
            ),
            "{inference}"
        );
    }
    let unknown = server
        .post(
            "/v1/threads/t/runs",
            json!({"message": "hi", "inference": {"temprature": 0.2}}),
        )
        .await;
    assert_eq!(refusal(unknown).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(rig.model.requests(), 0);
    assert!(rig.store.stored("t").await.is_empty());

    // In range: the model's request carries it.
    let frames = Sse::new(
        server
            .post(
                "/v1/threads/t/runs",
                json!({"message": "hi", "inference": {"temperature": 0.25, "max_tokens": 77}}),
            )
            .await,
    )
    .await
    .rest()
    .await;
    checked_live(&frames);
    let overrides = rig.model.overrides();
    assert_eq!(overrides.len(), 1);
    assert_eq!(overrides[0].temperature, Some(0.25));
    assert_eq!(overrides[0].max_tokens, Some(77));
}
