//! The HTTP layers around the API: CORS for the configured origins only, and compression of
//! JSON answers but never of an event stream.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_admits_the_configured_origins_only() {
    let rig = Rig::memory(Vec::new());
    let allowing = config().with_cors_origins(["https://app.example".to_owned()]);
    let server = TestServer::start(rig.runtime(), allowing).await;
    let preflight = |origin: &'static str| {
        server
            .client
            .request(Method::OPTIONS, server.url("/v1/threads/t/runs"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type, last-event-id",
            )
            .send()
    };
    let allowed = preflight("https://app.example").await.expect("preflight");
    assert_eq!(allowed.status(), StatusCode::OK);
    let header = |name: &str| {
        allowed
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase)
    };
    assert_eq!(
        header("access-control-allow-origin").as_deref(),
        Some("https://app.example")
    );
    let headers = header("access-control-allow-headers").unwrap_or_default();
    for name in ["authorization", "content-type", "last-event-id"] {
        assert!(headers.contains(name), "{name} not in {headers}");
    }
    let other = preflight("https://elsewhere.example")
        .await
        .expect("preflight");
    assert!(
        other.headers().get("access-control-allow-origin").is_none(),
        "{:?}",
        other.headers()
    );

    // Without configured origins, no CORS headers at all.
    let plain = TestServer::start(rig.runtime(), config()).await;
    let answer = plain
        .client
        .get(plain.url("/v1/agents"))
        .header("origin", "https://app.example")
        .send()
        .await
        .expect("request");
    assert_eq!(answer.status(), StatusCode::OK);
    assert!(
        answer
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_answers_are_compressed_and_event_streams_are_not() {
    let rig = Rig::memory(vec![text_turn(&["Hello"])]);
    let server = TestServer::start(rig.runtime(), config()).await;
    let encoding = |response: &reqwest::Response| {
        response
            .headers()
            .get("content-encoding")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let agents = server
        .client
        .get(server.url("/v1/agents"))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .expect("request");
    assert_eq!(agents.status(), StatusCode::OK);
    assert_eq!(encoding(&agents).as_deref(), Some("gzip"));
    // Without asking, as it is.
    let agents = server.get("/v1/agents").await;
    assert_eq!(encoding(&agents), None);

    let stream = server
        .client
        .post(server.url("/v1/threads/t/runs"))
        .header("accept-encoding", "gzip")
        .json(&json!({"message": "hi"}))
        .send()
        .await
        .expect("request");
    assert_eq!(stream.status(), StatusCode::OK);
    assert_eq!(encoding(&stream), None);
    let frames = Sse::new(stream).await.rest().await;
    checked_live(&frames);
}
