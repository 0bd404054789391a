//! The OpenAI executor against the loopback server, in real time with millisecond backoffs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use awaken_llm::openai::{OpenAiConfig, OpenAiExecutor, RoutingKeyPlacement};
use awaken_llm::{
    ConnectionAttempt, ConnectionFailure, InferenceExecutionError, LlmExecutor, LlmStreamEvent,
    RetryPolicy, RetryingExecutor,
};
use awaken_spec::{InferenceOverride, ReasoningEffort};
use expect_test::expect;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::decoder::{DONE, delta_chunk, parallel_tool_stream, text_stream, usage_chunk};
use crate::server::{Action, TestServer, response, sse_head, sse_plan};
use crate::{render_error, render_response, render_stream, request};

const KEY: &str = "sk-test-SECRET-0123456789";

/// Fails the test if `f` takes longer than 10 s (a hang guard, never a wait).
async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("the test hung")
}

fn executor(
    server: &TestServer,
    configure: impl FnOnce(OpenAiConfig) -> OpenAiConfig,
) -> OpenAiExecutor {
    let config = configure(
        OpenAiConfig::new(&server.base_url)
            .with_api_key(KEY)
            .with_request_timeout(Duration::from_secs(5))
            .with_stream_idle_timeout(Duration::from_secs(5)),
    );
    OpenAiExecutor::new(config).expect("valid config")
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

const COMPLETION: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there."},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}"#;

#[tokio::test]
async fn a_plain_reply() {
    let mut server =
        TestServer::start(vec![vec![Action::Raw(response(200, &[], COMPLETION))]]).await;
    let exec = executor(&server, |c| {
        c.with_stream(false)
            .with_routing_key(RoutingKeyPlacement::Header("x-session-affinity".into()))
    });
    let req = request("hi").with_routing_key("thread-7").with_overrides(
        InferenceOverride::default()
            .with_max_tokens(64)
            .with_temperature(0.2)
            .with_top_p(0.5)
            .with_reasoning_effort(ReasoningEffort::High),
    );
    let response = bounded(exec.execute(req)).await;
    expect![[r#"
        stop=EndTurn usage in=9 out=3
        block {"type":"text","text":"Hello there."}
    "#]]
    .assert_eq(
        &response
            .map(|r| render_response(&r))
            .unwrap_or_else(|e| render_error(&e)),
    );

    let received = server.received();
    assert_eq!(received.len(), 1);
    let r = &received[0];
    assert!(
        r.head.starts_with("POST /v1/chat/completions HTTP/1.1"),
        "{}",
        r.head
    );
    assert_eq!(
        r.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(r.header("x-session-affinity"), Some("thread-7"));
    let b = &r.body;
    assert_eq!(b["model"], "test-model");
    assert_eq!(b["stream"], false);
    assert!(b.get("stream_options").is_none());
    assert_eq!(b["max_tokens"], 64);
    assert_eq!(b["temperature"], 0.2);
    assert_eq!(b["top_p"], 0.5);
    assert_eq!(b["reasoning_effort"], "high");
    assert_eq!(b["messages"][0]["content"], "hi");
}

/// Byte offset just after the first occurrence of `needle` in `haystack`, plus `extra`.
fn offset(haystack: &[u8], needle: &str, extra: usize) -> usize {
    haystack
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())
        .map(|i| i + needle.len() + extra)
        .expect("needle in body")
}

#[tokio::test]
async fn a_streamed_reply_split_at_awkward_boundaries() {
    let body = text_stream();
    let bytes = body.as_bytes();
    // Cut 1: inside the 4-byte 😀 (after its first byte). Cut 2: inside the JSON string "done".
    let cut1 = offset(bytes, "\\\"world\\\" ", 1);
    let cut2 = offset(bytes, "\"content\":\"do", 0);
    assert!(
        std::str::from_utf8(&bytes[..cut1]).is_err(),
        "cut 1 splits a character"
    );
    let (go1_tx, go1) = oneshot::channel();
    let (go2_tx, go2) = oneshot::channel();
    let mut server = TestServer::start(vec![vec![
        sse_head(),
        Action::Chunk(bytes[..cut1].to_vec()),
        Action::WaitFor(go1),
        Action::Chunk(bytes[cut1..cut2].to_vec()),
        Action::WaitFor(go2),
        Action::Chunk(bytes[cut2..].to_vec()),
        Action::EndChunks,
    ]])
    .await;
    let exec = executor(&server, |c| c);
    let mut stream = exec.execute_stream(request("hi"));
    // The event before each cut arrives before the rest of the cut event is even written, so
    // the cut event really spans two TCP writes (and two reads).
    let first = bounded(stream.next()).await;
    assert!(
        matches!(&first, Some(Ok(LlmStreamEvent::TextDelta(t))) if t == "Grüße, "),
        "{first:?}"
    );
    let _ = go1_tx.send(());
    let second = bounded(stream.next()).await;
    assert!(
        matches!(&second, Some(Ok(LlmStreamEvent::TextDelta(t))) if t == "\"world\" 😀\n"),
        "{second:?}"
    );
    let _ = go2_tx.send(());
    expect![[r#"
        text "done"
        usage in=11 out=7 cached=2 reasoning=0
        stop EndTurn
    "#]]
    .assert_eq(&bounded(render_stream(stream)).await);
    let received = server.received();
    assert_eq!(received[0].body["stream"], true);
    assert_eq!(received[0].body["stream_options"]["include_usage"], true);
    assert_eq!(received[0].header("accept"), Some("text/event-stream"));
}

#[tokio::test]
async fn two_parallel_tool_calls_streamed_interleaved() {
    let body = parallel_tool_stream();
    let pieces: Vec<&[u8]> = body.as_bytes().chunks(37).collect();
    let server = TestServer::start(vec![sse_plan(&pieces)]).await;
    let exec = executor(&server, |c| c);
    let response = bounded(exec.execute(request("weather and time?"))).await;
    expect![[r#"
        stop=ToolCalls usage in=30 out=12
        call call_a get_weather {"city":"Zürich"} raw=None
        call call_b get_time {"tz":"UTC"} raw=None
    "#]]
    .assert_eq(
        &response
            .map(|r| render_response(&r))
            .unwrap_or_else(|e| render_error(&e)),
    );
}

#[tokio::test]
async fn done_ends_the_stream_even_if_the_connection_stays_open() {
    // No end of body after [DONE]: the executor must stop at [DONE], not wait for EOF.
    let (_never_tx, never) = oneshot::channel::<()>();
    let body = [
        delta_chunk(r#"{"content":"ok"}"#, Some("stop")),
        usage_chunk(4, 1),
        DONE.to_owned(),
    ]
    .concat();
    let server = TestServer::start(vec![vec![
        sse_head(),
        Action::Chunk(body.into_bytes()),
        Action::WaitFor(never),
    ]])
    .await;
    let exec = executor(&server, |c| c);
    expect![[r#"
        text "ok"
        usage in=4 out=1 cached=2 reasoning=0
        stop EndTurn
    "#]]
    .assert_eq(&bounded(render_stream(exec.execute_stream(request("x")))).await);
}

#[tokio::test]
async fn malformed_json_in_a_chunk_is_a_typed_error() {
    let body = [
        delta_chunk(r#"{"content":"fine"}"#, None),
        "data: {\"choices\": [oops]}\n\n".to_owned(),
    ]
    .concat();
    let server = TestServer::start(vec![sse_plan(&[body.as_bytes()])]).await;
    let exec = executor(&server, |c| c);
    let out = bounded(render_stream(exec.execute_stream(request("x")))).await;
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some(r#"text "fine""#));
    let error = lines.next().unwrap_or_default();
    assert!(
        error.starts_with("error Permanent MalformedResponse: malformed provider response: a chunk is not valid JSON"),
        "{error}"
    );
    assert_eq!(lines.next(), None);
}

#[tokio::test]
async fn a_connection_dropped_mid_stream_is_a_retryable_interruption() {
    let body = delta_chunk(r#"{"content":"part"}"#, None);
    // The plan ends without the last chunk: the server closes the connection mid-body.
    let server = TestServer::start(vec![vec![
        sse_head(),
        Action::Chunk(body.into_bytes()),
        Action::Chunk(b"data: {\"choices\":[{\"delta\":{\"content\":\"lo".to_vec()),
    ]])
    .await;
    let exec = executor(&server, |c| c);
    let mut stream = exec.execute_stream(request("x"));
    let first = bounded(stream.next()).await;
    assert!(matches!(&first, Some(Ok(LlmStreamEvent::TextDelta(t))) if t == "part"));
    let second = bounded(stream.next()).await;
    match &second {
        Some(Err(e @ InferenceExecutionError::StreamInterrupted { .. })) => {
            assert!(e.is_retryable());
        }
        other => panic!("expected an interrupted stream, got {other:?}"),
    }
    assert!(bounded(stream.next()).await.is_none());
}

#[tokio::test]
async fn rate_limited_with_retry_after_then_success_through_the_retrying_executor() {
    let limited = || {
        Action::Raw(response(
            429,
            &[("retry-after", "1"), ("retry-after-ms", "40")],
            r#"{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}"#,
        ))
    };
    // First a direct call: the error carries the header's delay.
    let mut server = TestServer::start(vec![
        vec![limited()],
        vec![limited()],
        sse_plan(&[text_stream().as_bytes()]),
    ])
    .await;
    let exec = executor(&server, |c| c);
    let direct = bounded(exec.execute(request("x"))).await.err();
    assert!(
        matches!(direct, Some(InferenceExecutionError::RateLimited { .. })),
        "{direct:?}"
    );
    assert_eq!(
        direct.and_then(|e| e.retry_after()),
        Some(Duration::from_millis(40))
    );

    let retrying = RetryingExecutor::with_policy(Arc::new(exec), fast_retry(3));
    let started = std::time::Instant::now();
    let response = bounded(retrying.execute(request("x"))).await;
    let elapsed = started.elapsed();
    assert_eq!(
        response.map(|r| r.message.text()).ok().as_deref(),
        Some("Grüße, \"world\" 😀\ndone")
    );
    assert!(
        elapsed >= Duration::from_millis(40),
        "waited only {elapsed:?}"
    );
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn unauthorized_is_not_retried() {
    let mut server = TestServer::start(vec![
        vec![Action::Raw(response(
            401,
            &[],
            r#"{"error":{"message":"Incorrect API key provided","code":"invalid_api_key"}}"#,
        ))],
        sse_plan(&[text_stream().as_bytes()]),
    ])
    .await;
    let exec = RetryingExecutor::with_policy(Arc::new(executor(&server, |c| c)), fast_retry(3));
    let error = bounded(exec.execute(request("x"))).await.err();
    assert!(
        matches!(
            error,
            Some(InferenceExecutionError::Unauthorized { status: 401, .. })
        ),
        "{error:?}"
    );
    assert_eq!(server.received().len(), 1, "a 401 must not be retried");
}

#[tokio::test]
async fn statuses_over_http_map_to_their_errors() {
    let plans = vec![
        vec![Action::Raw(response(
            404,
            &[],
            r#"{"error":{"message":"no such model"}}"#,
        ))],
        vec![Action::Raw(response(
            400,
            &[],
            r#"{"error":{"message":"maximum context length is 4096 tokens","code":"context_length_exceeded"}}"#,
        ))],
        vec![Action::Raw(response(503, &[("retry-after", "2")], "busy"))],
        vec![Action::Raw(response(500, &[], "boom"))],
        vec![Action::Raw(response(404, &[], "Not Found"))],
    ];
    let server = TestServer::start(plans).await;
    let exec = executor(&server, |c| c);
    let mut out = String::new();
    for _ in 0..5 {
        let e = bounded(exec.execute(request("x"))).await.err();
        out.push_str(&e.map(|e| render_error(&e)).unwrap_or_default());
        out.push('\n');
    }
    let out = out.replace(&server.base_url, "BASE");
    expect![[r#"
        error Permanent ModelNotFound: model "test-model" not found: no such model
        error Permanent ContextOverflow: the request exceeds the model's context window: maximum context length is 4096 tokens
        error Retryable Overloaded: provider overloaded (HTTP 503) (retry after 2s): busy
        error Retryable ServerError: provider server error (HTTP 500): boom
        error Permanent EndpointNotFound: the server has no `POST BASE/chat/completions` (HTTP 404: Not Found)
    "#]]
    .assert_eq(&out);
}

#[tokio::test]
async fn dropping_the_stream_closes_the_connection() {
    let (closed_tx, closed) = oneshot::channel();
    let server = TestServer::start(vec![vec![
        sse_head(),
        Action::Chunk(delta_chunk(r#"{"content":"streaming"}"#, None).into_bytes()),
        Action::SignalClientClose(closed_tx),
    ]])
    .await;
    let exec = executor(&server, |c| c);
    let mut stream = exec.execute_stream(request("x"));
    let first = bounded(stream.next()).await;
    assert!(matches!(first, Some(Ok(LlmStreamEvent::TextDelta(_)))));
    drop(stream);
    assert!(
        bounded(closed).await.is_ok(),
        "the server saw the client close the connection"
    );
}

#[tokio::test]
async fn a_silent_server_times_out_retryably() {
    let (_never_tx, never) = oneshot::channel::<()>();
    let server = TestServer::start(vec![vec![Action::WaitFor(never)]]).await;
    let exec = executor(&server, |c| {
        c.with_request_timeout(Duration::from_millis(50))
    });
    let error = bounded(exec.execute(request("x"))).await.err();
    assert!(
        matches!(
            error,
            Some(InferenceExecutionError::Timeout {
                waiting_for: "response headers",
                ..
            })
        ),
        "{error:?}"
    );
    assert!(error.is_some_and(|e| e.is_retryable()));
}

/// A listener on a free loopback port, and its address.
async fn loopback_listener() -> (tokio::net::TcpListener, std::net::SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    (listener, addr)
}

#[tokio::test]
async fn a_refused_connection_names_the_address_and_is_retryable() {
    // Bind a port, then free it: nothing listens there any more.
    let (listener, addr) = loopback_listener().await;
    drop(listener);
    let exec = OpenAiExecutor::new(OpenAiConfig::new(format!("http://{addr}/v1"))).expect("config");
    let error = bounded(exec.execute(request("x"))).await.err();
    let Some(error) = error else {
        panic!("a call to a closed port succeeded");
    };
    let InferenceExecutionError::Connection { attempt, .. } = &error else {
        panic!("expected a connection error, got {error:?}");
    };
    assert_eq!(
        **attempt,
        ConnectionAttempt::new("127.0.0.1", addr.port(), ConnectionFailure::Refused)
    );
    assert!(error.is_retryable());
    expect![[r#"error Retryable Connection: could not reach the provider at http://ADDR/v1/chat/completions: connection refused by ADDR (is the server running?)"#]]
        .assert_eq(&render_error(&error).replace(&addr.to_string(), "ADDR"));
}

#[tokio::test]
async fn a_server_that_does_not_speak_tls_is_a_tls_failure_at_its_address() {
    let (listener, addr) = loopback_listener().await;
    // Reads the client's hello, answers plain HTTP, and holds the connection until the client
    // closes it (so the client reads the answer, not a reset).
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        let mut buf = [0u8; 4096];
        let _ = socket.read(&mut buf).await;
        let _ = socket
            .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            .await;
        while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
    });
    let exec =
        OpenAiExecutor::new(OpenAiConfig::new(format!("https://{addr}/v1"))).expect("config");
    let error = bounded(exec.execute(request("x"))).await.err();
    assert!(
        matches!(
            &error,
            Some(InferenceExecutionError::Connection { attempt, .. })
                if attempt.kind == ConnectionFailure::Tls
        ),
        "{error:?}"
    );
    let text = error.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        text.contains(&format!("TLS handshake with {addr} failed: ")),
        "{text}"
    );
    assert!(bounded(server).await.is_ok());
}

#[tokio::test]
async fn a_404_from_a_base_url_without_its_version_names_the_endpoint_and_the_fix() {
    let mut server =
        TestServer::start(vec![vec![Action::Raw(response(404, &[], "Not Found"))]]).await;
    let addr = server
        .base_url
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_owned();
    // User info in the base URL must not show in the error.
    let exec = OpenAiExecutor::new(
        OpenAiConfig::new(format!("http://user:SECRET@{addr}"))
            .with_api_key(KEY)
            .with_request_timeout(Duration::from_secs(5)),
    )
    .expect("config");
    let retrying = RetryingExecutor::with_policy(Arc::new(exec), fast_retry(3));
    let error = bounded(retrying.execute(request("x"))).await.err();
    let Some(error) = error else {
        panic!("a 404 succeeded");
    };
    assert!(!error.is_retryable());
    assert!(
        matches!(&error, InferenceExecutionError::EndpointNotFound { .. }),
        "{error:?}"
    );
    assert_eq!(
        error.suggested_base_url(),
        Some(format!("http://{addr}/v1")),
        "{error:?}"
    );
    expect![[r#"error Permanent EndpointNotFound: the server has no `POST http://ADDR/chat/completions` (HTTP 404: Not Found); the base URL may lack its version segment: try `http://ADDR/v1`"#]]
        .assert_eq(&render_error(&error).replace(&addr, "ADDR"));
    let received = server.received();
    assert_eq!(received.len(), 1, "a wrong endpoint is not retried");
    assert!(
        received[0]
            .head
            .starts_with("POST /chat/completions HTTP/1.1"),
        "{}",
        received[0].head
    );
}

#[tokio::test]
async fn a_404_with_openais_model_not_found_is_still_model_not_found() {
    let server = TestServer::start(vec![vec![Action::Raw(response(
        404,
        &[],
        r#"{"error":{"message":"The model `test-model` does not exist or you do not have access to it.","type":"invalid_request_error","param":null,"code":"model_not_found"}}"#,
    ))]])
    .await;
    let exec = executor(&server, |c| c);
    let error = bounded(exec.execute(request("x"))).await.err();
    assert!(
        matches!(
            &error,
            Some(InferenceExecutionError::ModelNotFound { model, .. }) if model == "test-model"
        ),
        "{error:?}"
    );
    assert!(error.is_some_and(|e| !e.is_retryable()));
}

#[test]
fn the_api_key_never_shows_in_debug() {
    let config = OpenAiConfig::new("http://127.0.0.1:9/v1").with_api_key(KEY);
    let exec = OpenAiExecutor::new(config.clone()).expect("config");
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
    let bad = OpenAiExecutor::new(OpenAiConfig::new("not a url"));
    assert!(matches!(
        bad,
        Err(InferenceExecutionError::Config {
            field: "base_url",
            ..
        })
    ));
}

#[tokio::test]
async fn a_server_that_ignores_stream_and_answers_json_still_works() {
    let server = TestServer::start(vec![vec![Action::Raw(response(200, &[], COMPLETION))]]).await;
    let exec = executor(&server, |c| c);
    assert!(exec.config().stream);
    let response = bounded(exec.execute(request("x"))).await;
    assert_eq!(
        response.map(|r| r.message.text()).ok().as_deref(),
        Some("Hello there.")
    );
}

#[tokio::test]
async fn a_stream_that_goes_silent_times_out_retryably() {
    let (_never_tx, never) = oneshot::channel::<()>();
    let server = TestServer::start(vec![vec![
        sse_head(),
        Action::Chunk(delta_chunk(r#"{"content":"then nothing"}"#, None).into_bytes()),
        Action::WaitFor(never),
    ]])
    .await;
    let exec = executor(&server, |c| {
        c.with_stream_idle_timeout(Duration::from_millis(50))
    });
    let out = bounded(render_stream(exec.execute_stream(request("x")))).await;
    expect![[r#"
        text "then nothing"
        error Retryable Timeout: inference timed out after 50ms waiting for next stream chunk
    "#]]
    .assert_eq(&out);
}

#[tokio::test]
async fn cancelling_the_token_closes_the_connection() {
    let (closed_tx, closed) = oneshot::channel();
    let server = TestServer::start(vec![vec![
        sse_head(),
        Action::Chunk(delta_chunk(r#"{"content":"streaming"}"#, None).into_bytes()),
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
async fn an_absurd_retry_after_saturates_instead_of_panicking() {
    let server = TestServer::start(vec![vec![Action::Raw(response(
        429,
        &[("retry-after-ms", "1e300")],
        "{}",
    ))]])
    .await;
    let exec = RetryingExecutor::with_policy(Arc::new(executor(&server, |c| c)), fast_retry(3));
    let error = bounded(exec.execute(request("x"))).await.err();
    assert_eq!(error.and_then(|e| e.retry_after()), Some(Duration::MAX));
}
