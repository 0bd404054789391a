use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, PingRequest, RequestId,
    ServerJsonRpcMessage,
};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};

use rmcp::transport::common::http_header::HEADER_SESSION_ID;

use super::{EventLimit, HttpClient, HttpError, ServerStreams, challenge_scope};

type Outcome<T> = Result<T, StreamableHttpError<HttpError>>;

/// A raw HTTP/1.1 response that closes the connection.
fn response(status: &str, headers: &[&str], body: &str) -> String {
    let mut head = format!("HTTP/1.1 {status}\r\nconnection: close\r\n");
    for header in headers {
        head.push_str(&format!("{header}\r\n"));
    }
    format!("{head}content-length: {}\r\n\r\n{body}", body.len())
}

/// Serves one connection on 127.0.0.1: reads one request, answers `response` and closes. The
/// handle yields the request's head, lowercased.
fn serve_once(response: String) -> (Arc<str>, JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind to loopback");
    let url = format!(
        "http://{}/mcp",
        listener.local_addr().expect("local address")
    );
    let server = std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().expect("accept");
        let (mut request, mut buf) = (Vec::new(), [0; 4096]);
        let head_len = loop {
            let n = socket.read(&mut buf).expect("read request");
            request.extend_from_slice(&buf[..n]);
            if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            assert_ne!(n, 0, "connection closed inside the request head");
        };
        let head = String::from_utf8_lossy(&request[..head_len]).to_ascii_lowercase();
        let body_len = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse::<usize>().expect("content length"));
        while request.len() < head_len + body_len {
            let n = socket.read(&mut buf).expect("read request body");
            assert_ne!(n, 0, "connection closed inside the request body");
            request.extend_from_slice(&buf[..n]);
        }
        socket
            .write_all(response.as_bytes())
            .expect("write response");
        head
    });
    (url.into(), server)
}

fn client() -> HttpClient {
    HttpClient::new(HeaderMap::new(), Duration::from_secs(5)).expect("client")
}

fn ping() -> ClientJsonRpcMessage {
    ClientJsonRpcMessage::request(
        ClientRequest::PingRequest(PingRequest::default()),
        RequestId::Number(1),
    )
}

fn initialized() -> ClientJsonRpcMessage {
    ClientJsonRpcMessage::notification(ClientNotification::InitializedNotification(
        Default::default(),
    ))
}

fn render(outcome: Outcome<StreamableHttpPostResponse>) -> String {
    match outcome {
        Ok(StreamableHttpPostResponse::Accepted) => "accepted".to_owned(),
        Ok(StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(e), session)) => {
            format!("json-rpc error {:?}, session {session:?}", e.error.message)
        }
        Ok(StreamableHttpPostResponse::Json(_, session)) => format!("json, session {session:?}"),
        Ok(StreamableHttpPostResponse::Sse(_, session)) => format!("sse, session {session:?}"),
        Ok(other) => format!("{other:?}"),
        Err(error) => format!("{error:?}"),
    }
}

#[tokio::test]
async fn configured_and_protocol_headers_are_sent_and_secrets_stay_out_of_debug() {
    let mut headers = HeaderMap::new();
    let token = HeaderValue::from_static("Bearer secret-token");
    headers.insert(reqwest::header::AUTHORIZATION, token);
    let client = HttpClient::new(headers, Duration::from_secs(5)).expect("client");
    assert!(
        !format!("{client:?}").contains("secret-token"),
        "{client:?}"
    );

    let (url, server) = serve_once(response("202 Accepted", &[], ""));
    let protocol = HashMap::from([(
        HeaderName::from_static("mcp-protocol-version"),
        HeaderValue::from_static("2025-06-18"),
    )]);
    let outcome = client
        .post_message(url, ping(), Some("s-1".into()), None, protocol)
        .await;
    assert_eq!(render(outcome), "accepted");
    let head = server.join().expect("server");
    for line in [
        "post /mcp http/1.1",
        "authorization: bearer secret-token",
        "accept: application/json, text/event-stream",
        "content-type: application/json",
        "mcp-session-id: s-1",
        "mcp-protocol-version: 2025-06-18",
    ] {
        assert!(
            head.lines().any(|l| l == line),
            "{line:?} missing from\n{head}"
        );
    }
}

#[tokio::test]
async fn headers_the_transport_sets_are_refused() {
    let headers = HeaderMap::from_iter([(
        HeaderName::from_static("mcp-session-id"),
        HeaderValue::from_static("x"),
    )]);
    let refused = HttpClient::new(headers, Duration::from_secs(5)).map(|_| ());
    assert!(
        matches!(refused, Err(HttpError::ReservedHeader { ref name }) if name == "mcp-session-id")
    );

    let custom = HashMap::from([(reqwest::header::ACCEPT, HeaderValue::from_static("*/*"))]);
    let client = client();
    let outcome = client.post_message("http://127.0.0.1:9/mcp".into(), ping(), None, None, custom);
    assert_eq!(render(outcome.await), r#"ReservedHeaderConflict("accept")"#);
}

#[tokio::test]
async fn post_responses_map_to_the_transport_outcomes() {
    let rpc_error = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"boom"}}"#;
    let pong = r#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
    let json = "content-type: application/json";
    let cases: [(&str, ClientJsonRpcMessage, String, &str); 10] = [
        (
            "no session",
            ping(),
            response("404 Not Found", &[], ""),
            r#"UnexpectedServerResponse("HTTP 404 Not Found")"#,
        ),
        (
            "session",
            ping(),
            response("404 Not Found", &[], ""),
            "SessionExpired",
        ),
        (
            "401",
            ping(),
            response(
                "401 Unauthorized",
                &[r#"www-authenticate: Bearer realm="mcp""#],
                "",
            ),
            r#"AuthRequired(AuthRequiredError { www_authenticate_header: "Bearer realm=\"mcp\"" })"#,
        ),
        (
            "403",
            ping(),
            response(
                "403 Forbidden",
                &[r#"www-authenticate: Bearer error="insufficient_scope", scope="tools:call""#],
                "",
            ),
            r#"InsufficientScope(InsufficientScopeError { www_authenticate_header: "Bearer error=\"insufficient_scope\", scope=\"tools:call\"", required_scope: Some("tools:call") })"#,
        ),
        (
            "500 json-rpc",
            ping(),
            response("500 Internal Server Error", &[json], rpc_error),
            r#"json-rpc error "boom", session None"#,
        ),
        (
            "503",
            ping(),
            response("503 Service Unavailable", &["retry-after: 7"], "down"),
            r#"HttpStatus(HttpStatusError { status: 503, retry_after: Some("7") })"#,
        ),
        (
            "400",
            ping(),
            response("400 Bad Request", &[], "bad"),
            r#"UnexpectedServerResponse("HTTP 400 Bad Request: bad")"#,
        ),
        (
            "json",
            ping(),
            response("200 OK", &[json, "mcp-session-id: s-2"], pong),
            r#"json, session Some("s-2")"#,
        ),
        (
            "html",
            ping(),
            response("200 OK", &["content-type: text/html"], "<p>"),
            r#"UnexpectedContentType(Some("text/html"))"#,
        ),
        (
            "notification",
            initialized(),
            response("200 OK", &["content-type: text/plain"], "ok"),
            "accepted",
        ),
    ];
    for (name, message, answer, expected) in cases {
        let (url, server) = serve_once(answer);
        let session = (name == "session").then(|| "s-1".into());
        let outcome = client()
            .post_message(url, message, session, None, HashMap::new())
            .await;
        assert_eq!(render(outcome), expected, "case {name}");
        server.join().expect("server");
    }

    let mut limits = StreamableHttpResponseLimits::default();
    limits.max_json_response_size = 8;
    let (url, server) = serve_once(response("200 OK", &[json], pong));
    let client = client();
    let outcome =
        client.post_message_with_response_limits(url, ping(), None, None, HashMap::new(), limits);
    assert_eq!(
        render(outcome.await),
        "ResponseBodyTooLarge { max_size: 8 }"
    );
    server.join().expect("server");
}

#[tokio::test]
async fn get_and_delete_report_what_the_server_does_not_support() {
    let (url, server) = serve_once(response("405 Method Not Allowed", &[], ""));
    let stream = client()
        .get_stream(url, Some("s-1".into()), None, None, HashMap::new())
        .await;
    assert!(matches!(
        stream,
        Err(StreamableHttpError::ServerDoesNotSupportSse)
    ));
    let head = server.join().expect("server");
    assert!(head.contains("accept: text/event-stream\r\n"), "{head}");

    let (url, server) = serve_once(response("405 Method Not Allowed", &[], ""));
    let deleted = client()
        .delete_session(url, "s-1".into(), None, HashMap::new())
        .await;
    assert!(matches!(
        deleted,
        Err(StreamableHttpError::ServerDoesNotSupportDeleteSession)
    ));
    let head = server.join().expect("server");
    assert!(
        head.starts_with("delete /mcp") && head.contains("mcp-session-id: s-1\r\n"),
        "{head}"
    );
}

#[tokio::test]
async fn each_answered_get_is_counted_and_each_opened_stream_too() {
    let client = client();
    let mut streams = client.server_streams();
    let (url, server) = serve_once(response("405 Method Not Allowed", &[], ""));
    let refused = client
        .get_stream(url, Some("s-1".into()), None, None, HashMap::new())
        .await;
    assert!(refused.is_err());
    server.join().expect("server");
    assert_eq!(
        *streams.borrow_and_update(),
        ServerStreams {
            answered: 1,
            ..ServerStreams::default()
        }
    );

    let (url, server) = serve_once(response("200 OK", &["content-type: text/event-stream"], ""));
    let opened = client
        .get_stream(url, Some("s-1".into()), None, None, HashMap::new())
        .await;
    assert!(opened.is_ok());
    server.join().expect("server");
    assert_eq!(
        *streams.borrow_and_update(),
        ServerStreams {
            answered: 2,
            opened: 1,
            ..ServerStreams::default()
        }
    );
    drop((opened, client));
    assert!(
        streams.changed().await.is_err(),
        "the count ends with the client"
    );
}

#[tokio::test]
async fn an_initialize_answered_without_an_id_marks_the_server_stateless() {
    let initialize: ClientJsonRpcMessage = serde_json::from_value(serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}
    }))
    .expect("an initialize request");
    let answer = r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"s","version":"1"}}}"#;
    let client = client();
    let mut streams = client.server_streams();
    let id_header = format!("{HEADER_SESSION_ID}: s-1");
    for (id, stateless) in [(None, true), (Some(id_header.as_str()), false)] {
        let mut headers = vec!["content-type: application/json"];
        headers.extend(id);
        let (url, server) = serve_once(response("200 OK", &headers, answer));
        let posted = client
            .post_message(url, initialize.clone(), None, None, HashMap::new())
            .await;
        assert!(posted.is_ok(), "{}", render(posted));
        server.join().expect("server");
        assert_eq!(streams.borrow_and_update().stateless, stateless);
    }
    // Another request's answer leaves the mark as it is.
    let (url, server) = serve_once(response("202 Accepted", &[], ""));
    let _ = client
        .post_message(url, initialized(), Some("s-1".into()), None, HashMap::new())
        .await;
    server.join().expect("server");
    assert!(!streams.has_changed().expect("the client is alive"));
}

#[tokio::test]
async fn an_oversized_event_ends_the_stream_and_is_not_fetched_again() {
    let big = "x".repeat(100);
    let body = format!("id: 1\ndata: {{}}\n\nid: 2\ndata: {big}\n\n");
    let (url, server) = serve_once(response(
        "200 OK",
        &["content-type: text/event-stream"],
        &body,
    ));
    let mut limits = StreamableHttpResponseLimits::default();
    limits.max_sse_event_size = 64;
    let client = client();
    let posted = client
        .post_message_with_response_limits(url.clone(), ping(), None, None, HashMap::new(), limits)
        .await;
    let Ok(StreamableHttpPostResponse::Sse(mut events, _)) = posted else {
        panic!("expected an SSE response, got {}", render(posted));
    };
    let first = events
        .next()
        .await
        .expect("first event")
        .expect("first event parses");
    assert_eq!(first.id.as_deref(), Some("1"));
    let Some(Err(SseError::Body(error))) = events.next().await else {
        panic!("expected the oversized event to fail the stream");
    };
    assert_eq!(
        error.to_string(),
        "an SSE event exceeded the maximum size of 64 bytes"
    );
    assert!(events.next().await.is_none());
    server.join().expect("server");

    let resumed = client
        .get_stream_with_max_sse_event_size(url, None, Some("1".into()), None, HashMap::new(), 64)
        .await
        .map(|_| ());
    let refused = matches!(&resumed, Err(StreamableHttpError::Client(HttpError::OversizedEventAhead { event_id })) if event_id == "1");
    assert!(refused, "{resumed:?}");
}

#[test]
fn event_limit_counts_each_event_across_chunks() {
    let check = |max, chunks: &[&[u8]]| {
        let mut limit = EventLimit::new(max);
        chunks
            .iter()
            .try_for_each(|chunk| limit.check(chunk))
            .is_ok()
    };
    // "data: a" and its line break are 8 bytes; the blank line starts the next event.
    assert!(check(8, &[b"data: a\n\ndata: b\n\n"]));
    assert!(!check(7, &[b"data: a\n\n"]));
    assert!(check(8, &[b"data: a\r", b"\n\r", b"\ndata: b\r\n\r\n"]));
    assert!(!check(15, &[b"data: a\nda", b"ta: b\n"]));
    // A comment line (a keep-alive) counts only until its line break.
    assert!(check(14, &[b"data: a\n: ping\n", b": ping\r\n\r\n"]));
    assert!(!check(8, &[b": a comment too long"]));
}

#[test]
fn challenge_scope_reads_the_scope_parameter() {
    let scope = |challenge| challenge_scope(challenge);
    assert_eq!(
        scope(r#"Bearer error="insufficient_scope", scope="a b""#).as_deref(),
        Some("a b")
    );
    assert_eq!(
        scope("Bearer scope=read:data, error=x").as_deref(),
        Some("read:data")
    );
    assert_eq!(scope(r#"Bearer realm="mcp", myscope=x"#), None);
    assert_eq!(scope("Bearer"), None);
}
