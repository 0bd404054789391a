//! The Anthropic executor against the loopback server, in real time with millisecond backoffs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use awaken_llm::anthropic::{AnthropicConfig, AnthropicExecutor};
use awaken_llm::{
    ConnectionFailure, InferenceExecutionError, LlmExecutor, LlmStreamEvent, RetryPolicy,
    RetryingExecutor,
};
use awaken_spec::{InferenceOverride, ReasoningEffort};
use expect_test::expect;
use futures_util::StreamExt;
use serde_json::json;
use tokio::sync::oneshot;

use crate::anthropic_decoder::{
    block_start, event, message_end, message_start, text_delta, text_stream, tool_conversation,
    tool_stream,
};
use crate::server::{Action, TestServer, response, sse_head, sse_plan};
use crate::{render_error, render_response, render_stream, request};

const KEY: &str = "sk-ant-test-SECRET-0123456789";

/// Fails the test if `f` takes longer than 10 s (a hang guard, never a wait).
async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("the test hung")
}

/// The test server's root without its `/v1` (the executor appends `/v1/messages`).
fn root(server: &TestServer) -> String {
    server.base_url.trim_end_matches("/v1").to_owned()
}

fn executor(
    server: &TestServer,
    configure: impl FnOnce(AnthropicConfig) -> AnthropicConfig,
) -> AnthropicExecutor {
    let config = configure(
        AnthropicConfig::new(root(server))
            .with_api_key(KEY)
            .with_request_timeout(Duration::from_secs(5))
            .with_stream_idle_timeout(Duration::from_secs(5)),
    );
    AnthropicExecutor::new(config).expect("valid config")
}

fn fast_retry(max_retries: u32) -> RetryPolicy {
    RetryPolicy {
        max_retries,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_secs(1),
        multiplier: 2.0,
        jitter: false,
        seed: 0,
    }
}

#[tokio::test]
async fn a_streamed_reply_with_its_request_and_headers() {
    let body = text_stream();
    // Pieces of 29 bytes: events, lines and characters are cut everywhere.
    let pieces: Vec<&[u8]> = body.as_bytes().chunks(29).collect();
    let mut server = TestServer::start(vec![sse_plan(&pieces)]).await;
    let exec = executor(&server, |c| c);
    assert_eq!(exec.name(), "anthropic");
    let req = request("hi").with_system_prompt("Be brief.");
    expect![[r#"
        text "Grüße, "
        text "\"world\" 😀\n"
        text "done"
        usage in=132 out=15 cached=100 reasoning=0
        stop EndTurn
    "#]]
    .assert_eq(&bounded(render_stream(exec.execute_stream(req))).await);

    let received = server.received();
    assert_eq!(received.len(), 1);
    let r = &received[0];
    assert!(
        r.head.starts_with("POST /v1/messages HTTP/1.1"),
        "{}",
        r.head
    );
    assert_eq!(r.header("x-api-key"), Some(KEY));
    assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("accept"), Some("text/event-stream"));
    assert_eq!(r.header("authorization"), None);
    expect![[r#"{"max_tokens":4096,"messages":[{"content":[{"text":"hi","type":"text"}],"role":"user"}],"model":"test-model","stream":true,"system":"Be brief."}"#]]
        .assert_eq(&r.body.to_string());
}

#[tokio::test]
async fn tool_use_with_arguments_over_many_deltas_and_thinking() {
    let body = tool_stream();
    let mut server = TestServer::start(vec![sse_plan(&[body.as_bytes()])]).await;
    let exec = executor(&server, |c| c.with_max_tokens(2000));
    let req = request("weather and time?").with_overrides(
        InferenceOverride::default()
            .with_reasoning_effort(ReasoningEffort::Low)
            .with_temperature(0.3),
    );
    let response = bounded(exec.execute(req)).await;
    expect![[r#"
        stop=ToolCalls usage in=40 out=52
        block {"type":"reasoning","text":"The user wants weather and time."}
        block {"type":"text","text":"Let me check."}
        call toolu_a get_weather {"city":"Zürich","days":3} raw=None
        call toolu_b get_time {"tz":"UTC"} raw=None
    "#]]
    .assert_eq(
        &response
            .map(|r| render_response(&r))
            .unwrap_or_else(|e| render_error(&e)),
    );
    let b = &server.received()[0].body;
    assert_eq!(
        b["thinking"],
        json!({"type": "enabled", "budget_tokens": 4096})
    );
    assert_eq!(
        b["max_tokens"], 6096,
        "the configured limit plus the budget"
    );
    assert!(b.get("temperature").is_none(), "{b}");
}

#[tokio::test]
async fn the_request_body_of_a_tool_conversation() {
    let mut server = TestServer::start(vec![sse_plan(&[text_stream().as_bytes()])]).await;
    let exec = executor(&server, |c| c);
    let req = tool_conversation()
        .with_overrides(InferenceOverride::default().with_max_tokens(512))
        .with_routing_key("thread-1");
    assert!(bounded(exec.execute(req)).await.is_ok());
    let b = &server.received()[0].body;
    assert_eq!(b["model"], "claude-test");
    assert_eq!(b["max_tokens"], 512);
    assert_eq!(b["system"], "You are helpful.\n\nAnswer in English.");
    let messages = b["messages"].as_array().cloned().unwrap_or_default();
    let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "user"], "{b}");
    assert!(
        messages
            .iter()
            .all(|m| m["role"] != "system" && m["role"] != "tool"),
        "{b}"
    );
    let results: Vec<(&str, bool)> = messages[2]["content"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter(|b| b["type"] == "tool_result")
                .map(|b| {
                    (
                        b["tool_use_id"].as_str().unwrap_or(""),
                        b["is_error"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(results, [("toolu_a", false), ("toolu_b", true)]);
    assert_eq!(
        b["tools"],
        json!([{"name": "get_weather", "description": "Looks up the weather.", "input_schema": {"type": "object"}}])
    );
}

#[tokio::test]
async fn statuses_over_http_map_to_their_errors_without_the_key() {
    let envelope = |kind: &str, message: &str| {
        json!({"type": "error", "error": {"type": kind, "message": message}}).to_string()
    };
    let plans = vec![
        vec![Action::Raw(response(
            429,
            &[("retry-after", "7")],
            &envelope("rate_limit_error", "rate limited"),
        ))],
        vec![Action::Raw(response(
            529,
            &[],
            &envelope("overloaded_error", "Overloaded"),
        ))],
        vec![Action::Raw(response(
            401,
            &[],
            &envelope("authentication_error", &format!("invalid x-api-key {KEY}")),
        ))],
        vec![Action::Raw(response(
            400,
            &[],
            &envelope("invalid_request_error", "max_tokens: Field required"),
        ))],
        vec![Action::Raw(response(
            400,
            &[],
            &envelope(
                "invalid_request_error",
                "prompt is too long: 210000 tokens > 200000 maximum",
            ),
        ))],
        vec![Action::Raw(response(
            404,
            &[],
            &envelope("not_found_error", "model: test-model"),
        ))],
        vec![Action::Raw(response(404, &[], "Not Found"))],
        vec![Action::Raw(response(
            500,
            &[],
            &envelope("api_error", "Internal server error"),
        ))],
    ];
    let count = plans.len();
    let server = TestServer::start(plans).await;
    let exec = executor(&server, |c| c);
    let mut out = String::new();
    for _ in 0..count {
        let e = bounded(exec.execute(request("x"))).await.err();
        out.push_str(&e.map(|e| render_error(&e)).unwrap_or_default());
        out.push('\n');
    }
    assert!(!out.contains("SECRET"), "the key leaked: {out}");
    let out = out.replace(&root(&server), "ROOT");
    expect![[r#"
        error Retryable RateLimited: rate limited by the provider (retry after 7s): rate limited
        error Retryable Overloaded: provider overloaded (HTTP 529): Overloaded
        error Permanent Unauthorized: unauthorized (HTTP 401): invalid x-api-key <redacted>
        error Permanent InvalidRequest: the provider rejected the request (HTTP 400): max_tokens: Field required
        error Permanent ContextOverflow: the request exceeds the model's context window: prompt is too long: 210000 tokens > 200000 maximum
        error Permanent ModelNotFound: model "test-model" not found: model: test-model
        error Permanent EndpointNotFound: the server has no `POST ROOT/v1/messages` (HTTP 404: Not Found)
        error Retryable ServerError: provider server error (HTTP 500): Internal server error
    "#]]
    .assert_eq(&out);
}

#[tokio::test]
async fn an_error_event_mid_stream_ends_it_after_the_text_so_far() {
    let body = [
        message_start(5, 0, 0),
        block_start(0, "text"),
        text_delta(0, "Hel"),
        event(json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
    ]
    .concat();
    let server = TestServer::start(vec![sse_plan(&[body.as_bytes()])]).await;
    let exec = executor(&server, |c| c);
    expect![[r#"
        text "Hel"
        error Retryable Overloaded: provider overloaded (HTTP 529): Overloaded
    "#]]
    .assert_eq(&bounded(render_stream(exec.execute_stream(request("x")))).await);
}

#[tokio::test]
async fn a_stream_cut_before_message_stop_is_a_retryable_interruption() {
    let body = [
        message_start(5, 0, 0),
        block_start(0, "text"),
        text_delta(0, "part"),
    ]
    .concat();
    let server = TestServer::start(vec![sse_plan(&[body.as_bytes()])]).await;
    let exec = executor(&server, |c| c);
    let out = bounded(render_stream(exec.execute_stream(request("x")))).await;
    expect![[r#"
        text "part"
        error Retryable StreamInterrupted: the response stream was interrupted: the response body ended before the stream was complete (no message_stop)
    "#]]
    .assert_eq(&out);

    // The connection dropped mid-body (no chunked terminator): interrupted too.
    let server = TestServer::start(vec![vec![
        sse_head(),
        Action::Chunk(body.into_bytes()),
        Action::Chunk(b"event: content_block_delta\ndata: {\"type\":\"content_bl".to_vec()),
    ]])
    .await;
    let exec = executor(&server, |c| c);
    let out = bounded(render_stream(exec.execute_stream(request("x")))).await;
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error Retryable StreamInterrupted"),
        "{out}"
    );
}

#[tokio::test]
async fn malformed_json_is_a_permanent_error_with_a_snippet() {
    let body = [
        message_start(5, 0, 0),
        block_start(0, "text"),
        text_delta(0, "fine"),
        "event: content_block_delta\ndata: {\"type\": oops}\n\n".to_owned(),
    ]
    .concat();
    let server = TestServer::start(vec![sse_plan(&[body.as_bytes()])]).await;
    let exec = executor(&server, |c| c);
    expect![[r#"
        text "fine"
        error Permanent MalformedResponse: malformed provider response: an event is not valid JSON (in "{\"type\": oops}")
    "#]]
    .assert_eq(&bounded(render_stream(exec.execute_stream(request("x")))).await);
}

#[tokio::test]
async fn overloaded_then_success_through_the_retrying_executor() {
    let mut server = TestServer::start(vec![
        vec![Action::Raw(response(
            529,
            &[("retry-after", "0")],
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ))],
        sse_plan(&[text_stream().as_bytes()]),
    ])
    .await;
    let retrying = RetryingExecutor::with_policy(Arc::new(executor(&server, |c| c)), fast_retry(3));
    let response = bounded(retrying.execute(request("x"))).await;
    assert_eq!(
        response.map(|r| r.message.text()).ok().as_deref(),
        Some("Grüße, \"world\" 😀\ndone")
    );
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn a_plain_json_message_is_decoded_too() {
    let message = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "Hello there."}],
        "stop_reason": "end_turn", "usage": {"input_tokens": 9, "output_tokens": 3}
    })
    .to_string();
    let server = TestServer::start(vec![vec![Action::Raw(response(200, &[], &message))]]).await;
    let exec = executor(&server, |c| c);
    expect![[r#"
        stop=EndTurn usage in=9 out=3
        block {"type":"text","text":"Hello there."}
    "#]]
    .assert_eq(
        &bounded(exec.execute(request("x")))
            .await
            .map(|r| render_response(&r))
            .unwrap_or_else(|e| render_error(&e)),
    );
}

#[tokio::test]
async fn cancelling_the_token_closes_the_connection() {
    let (closed_tx, closed) = oneshot::channel();
    let head = [
        message_start(5, 0, 0),
        block_start(0, "text"),
        text_delta(0, "streaming"),
    ]
    .concat();
    let server = TestServer::start(vec![vec![
        sse_head(),
        Action::Chunk(head.into_bytes()),
        Action::SignalClientClose(closed_tx),
    ]])
    .await;
    let exec = executor(&server, |c| c);
    let token = awaken_event::CancellationToken::new();
    let mut stream =
        awaken_llm::with_cancellation(exec.execute_stream(request("x")), token.clone());
    assert!(matches!(
        bounded(stream.next()).await,
        Some(Ok(LlmStreamEvent::TextDelta(_)))
    ));
    token.cancel();
    let item = bounded(stream.next()).await;
    assert!(
        matches!(item, Some(Err(InferenceExecutionError::Cancelled))),
        "{item:?}"
    );
    assert!(
        bounded(closed).await.is_ok(),
        "the server saw the connection close"
    );
}

#[tokio::test]
async fn a_stream_that_goes_silent_times_out_retryably() {
    let (_never_tx, never) = oneshot::channel::<()>();
    let head = [
        message_start(5, 0, 0),
        block_start(0, "text"),
        text_delta(0, "then nothing"),
    ]
    .concat();
    let server = TestServer::start(vec![vec![
        sse_head(),
        Action::Chunk(head.into_bytes()),
        Action::WaitFor(never),
    ]])
    .await;
    let exec = executor(&server, |c| {
        c.with_stream_idle_timeout(Duration::from_millis(50))
    });
    expect![[r#"
        text "then nothing"
        error Retryable Timeout: inference timed out after 50ms waiting for next stream chunk
    "#]]
    .assert_eq(&bounded(render_stream(exec.execute_stream(request("x")))).await);
}

#[tokio::test]
async fn a_refused_connection_names_the_address() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    drop(listener);
    let exec =
        AnthropicExecutor::new(AnthropicConfig::new(format!("http://{addr}"))).expect("config");
    let error = bounded(exec.execute(request("x"))).await.err();
    assert!(
        matches!(
            &error,
            Some(InferenceExecutionError::Connection { attempt, url, .. })
                if attempt.kind == ConnectionFailure::Refused && url.ends_with("/v1/messages")
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_base_url_with_or_without_v1_reaches_v1_messages() {
    let mut server = TestServer::start(vec![
        sse_plan(&[text_stream().as_bytes()]),
        sse_plan(&[text_stream().as_bytes()]),
    ])
    .await;
    for base in [server.base_url.clone(), format!("{}/", root(&server))] {
        let exec = AnthropicExecutor::new(AnthropicConfig::new(base)).expect("config");
        assert!(bounded(exec.execute(request("x"))).await.is_ok());
    }
    let received = server.received();
    assert_eq!(received.len(), 2);
    for r in &received {
        assert!(
            r.head.starts_with("POST /v1/messages HTTP/1.1"),
            "{}",
            r.head
        );
        assert_eq!(r.header("x-api-key"), None, "no key configured, none sent");
    }
}

#[test]
fn the_api_key_never_shows_and_bad_config_is_refused() {
    let config = AnthropicConfig::new("http://127.0.0.1:9")
        .with_api_key(KEY)
        .with_header("anthropic-beta", "prompt-caching-2024-07-31");
    let exec = AnthropicExecutor::new(config.clone()).expect("config");
    for text in [
        format!("{config:?}"),
        format!("{exec:?}"),
        format!("{exec:#?}"),
    ] {
        assert!(!text.contains("SECRET"), "{text}");
        assert!(
            text.contains("<redacted>") || text.contains("Sensitive"),
            "{text}"
        );
    }
    let field = |c: AnthropicConfig| match AnthropicExecutor::new(c) {
        Err(InferenceExecutionError::Config { field, .. }) => field,
        other => panic!("expected a config error, got {other:?}"),
    };
    assert_eq!(field(AnthropicConfig::new("not a url")), "base_url");
    assert_eq!(field(AnthropicConfig::new("ftp://h")), "base_url");
    assert_eq!(
        field(AnthropicConfig::new("http://h").with_max_tokens(0)),
        "max_tokens"
    );
    assert_eq!(
        field(AnthropicConfig::new("http://h").with_api_key("bad\nkey")),
        "api_key"
    );
    assert_eq!(
        field(AnthropicConfig::new("http://h").with_header("bad name", "v")),
        "extra_headers"
    );
    assert_eq!(
        AnthropicConfig::default().base_url,
        "https://api.anthropic.com"
    );
}

#[tokio::test]
async fn message_end_alone_is_a_complete_empty_answer() {
    // A reply with no content block at all (the model had nothing to say).
    let body = [message_start(3, 0, 0), message_end("end_turn", 1)].concat();
    let server = TestServer::start(vec![sse_plan(&[body.as_bytes()])]).await;
    let exec = executor(&server, |c| c);
    expect![[r#"
        usage in=3 out=1 cached=0 reasoning=0
        stop EndTurn
    "#]]
    .assert_eq(&bounded(render_stream(exec.execute_stream(request("x")))).await);
}
