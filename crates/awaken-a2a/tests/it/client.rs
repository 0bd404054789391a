//! [`A2aBackend`] against a scripted loopback server: the card check, a streamed answer, the
//! failures it reports, cancellation, the request it derives from the run, credentials.

use std::fmt::Write as _;

use awaken_a2a::{A2aBackend, DiscoverError};
use awaken_event::{
    AgentEvent, CancellationToken, EventSink, Message, RunId, TerminationReason, ThreadId, VecSink,
    check_activation,
};
use awaken_resolver::{BackendOutcome, BackendRequest, ExecutionBackend};
use awaken_spec::{AgentSpec, EndpointSpec};
use expect_test::{Expect, expect};
use serde_json::{Value, json};

use crate::server::{Loopback, Recorded, Reply, event};

pub(crate) fn remote_agent(id: &str, url: &str) -> AgentSpec {
    AgentSpec::new(id, "").with_endpoint(EndpointSpec {
        url: url.to_owned(),
        protocol: Some("a2a".to_owned()),
        bearer_token_env: None,
    })
}

pub(crate) fn backend() -> A2aBackend {
    A2aBackend::new().unwrap_or_else(|e| panic!("client: {e}"))
}

pub(crate) fn request(run: &str, text: &str) -> BackendRequest {
    BackendRequest {
        thread_id: ThreadId::new("thread-1").unwrap_or_else(|e| panic!("{e}")),
        run_id: RunId::new(run).unwrap_or_else(|e| panic!("{e}")),
        messages: vec![
            Message::user("an earlier question"),
            Message::assistant("an earlier answer"),
            Message::user(text),
        ],
        overrides: None,
        cancel: CancellationToken::new(),
        answering: None,
    }
}

fn card(version: &str, streaming: bool) -> String {
    json!({
        "name": "echo",
        "description": "Echoes what it is sent.",
        "supportedInterfaces": [
            {"url": "http://127.0.0.1/", "protocolBinding": "HTTP+JSON", "protocolVersion": version}
        ],
        "version": "1.0.0",
        "capabilities": {"streaming": streaming},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": []
    })
    .to_string()
}

fn status(state: &str, text: Option<&str>) -> Value {
    let mut status = json!({"state": state});
    if let Some(text) = text {
        status["message"] =
            json!({"messageId": "m-status", "role": "ROLE_AGENT", "parts": [{"text": text}]});
    }
    json!({"statusUpdate": {"taskId": "task-1", "contextId": "thread-1", "status": status}})
}

fn artifact(text: &str, append: bool) -> Value {
    json!({"artifactUpdate": {
        "taskId": "task-1", "contextId": "thread-1", "append": append,
        "artifact": {"artifactId": "answer", "parts": [{"text": text}]}
    }})
}

fn submitted() -> Value {
    json!({"task": {"id": "task-1", "contextId": "thread-1", "status": {"state": "TASK_STATE_SUBMITTED"}}})
}

fn stream(events: &[Value]) -> String {
    events.iter().map(event).collect()
}

/// The events of one activation, a line each.
pub(crate) fn render(events: &[AgentEvent]) -> String {
    let mut out = String::new();
    for e in events {
        let _ = match e {
            AgentEvent::RunStart {
                thread_id,
                run_id,
                agent_id,
                ..
            } => writeln!(out, "run_start {agent_id} thread={thread_id} run={run_id}"),
            AgentEvent::StepStart { step } => writeln!(out, "step_start {step}"),
            AgentEvent::StepEnd { step } => writeln!(out, "step_end {step}"),
            AgentEvent::TextDelta { delta } => writeln!(out, "text {delta:?}"),
            AgentEvent::Error { message } => writeln!(out, "error {message}"),
            AgentEvent::RunFinish {
                termination,
                response,
                ..
            } => writeln!(
                out,
                "run_finish {} response={response:?}",
                termination.kind()
            ),
            other => writeln!(out, "{}", other.type_name()),
        };
    }
    out
}

/// Runs `request` on `agent` and renders its events and outcome, with the server's address
/// written as `<url>`.
async fn run_rendered(
    backend: &A2aBackend,
    server: &Loopback,
    agent: &AgentSpec,
    request: BackendRequest,
) -> (String, Result<BackendOutcome, String>) {
    let sink = VecSink::new();
    let outcome = backend
        .run(agent, request, &sink)
        .await
        .map_err(|e| e.to_string().replace(&server.url, "<url>"));
    let events = sink.events();
    check_activation(&events).unwrap_or_else(|v| panic!("not one activation: {v}"));
    (render(&events).replace(&server.url, "<url>"), outcome)
}

fn check(actual: &str, expected: Expect) {
    expected.assert_eq(actual);
}

#[tokio::test]
async fn a_card_that_speaks_http_json_1_0_with_streaming_passes() {
    let server = Loopback::start(|r| match r.path.as_str() {
        "/.well-known/agent-card.json" => Reply::Json(200, card("1.0", true)),
        _ => Reply::Json(404, "{}".into()),
    })
    .await;
    let remote = remote_agent("remote", &format!("{}/", server.url));
    let local = AgentSpec::new("local", "model");
    let found = backend()
        .discover([&local, &remote])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(found.len(), 1, "only the endpoint agent is checked");
    assert_eq!(found[0].agent_id, "remote");
    assert_eq!(found[0].card.name, "echo");
    assert_eq!(
        found[0].card_url,
        format!("{}/.well-known/agent-card.json", server.url)
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].method, "GET");
    assert_eq!(requests[0].header("a2a-version"), Some("1.0"));
}

#[tokio::test]
async fn a_card_of_another_protocol_version_or_without_streaming_fails_naming_agent_and_url() {
    let server = Loopback::start(|_| Reply::Json(200, card("0.3", true))).await;
    let agent = remote_agent("old", &server.url);
    let err = backend()
        .discover([&agent])
        .await
        .err()
        .unwrap_or_else(|| panic!("a 0.3 card passed"));
    assert!(
        matches!(err, DiscoverError::NoHttpJsonInterface { .. }),
        "{err:?}"
    );
    check(
        &err.to_string().replace(&server.url, "<url>"),
        expect![[
            r#"agent `old`: the card at <url>/.well-known/agent-card.json offers no HTTP+JSON interface of protocol version 1.0 (it offers: HTTP+JSON 0.3)"#
        ]],
    );

    let server = Loopback::start(|_| Reply::Json(200, card("1.0", false))).await;
    let agent = remote_agent("batch", &server.url);
    let err = backend().discover([&agent]).await.err();
    assert!(
        matches!(&err, Some(DiscoverError::NoStreaming { agent_id, .. }) if agent_id == "batch"),
        "{err:?}"
    );

    let server = Loopback::start(|_| Reply::Json(200, "{\"name\": 1}".into())).await;
    let agent = remote_agent("garbled", &server.url);
    let err = backend().discover([&agent]).await.err();
    assert!(
        matches!(&err, Some(DiscoverError::InvalidCard { agent_id, .. }) if agent_id == "garbled"),
        "{err:?}"
    );

    let server = Loopback::start(|_| Reply::Json(404, "{}".into())).await;
    let agent = remote_agent("absent", &server.url);
    let err = backend().discover([&agent]).await.err();
    assert!(
        matches!(&err, Some(DiscoverError::Status { status: 404, .. })),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_unreachable_card_fails_naming_agent_and_url() {
    // A port that was free a moment ago: nothing listens on it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("address: {e}"));
    drop(listener);
    let url = format!("http://{addr}");
    let agent = remote_agent("gone", &url);
    let err = backend()
        .discover([&agent])
        .await
        .err()
        .unwrap_or_else(|| panic!("a closed port answered"));
    assert!(matches!(err, DiscoverError::Unreachable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "agent `gone`: the card at {url}/.well-known/agent-card.json could not be fetched"
        )),
        "{text}"
    );
}

#[tokio::test]
async fn a_streamed_answer_becomes_the_outcome_and_the_events() {
    let server = Loopback::start(|_| {
        Reply::Sse(stream(&[
            submitted(),
            status("TASK_STATE_WORKING", Some("thinking")),
            artifact("Hello, ", false),
            artifact("world", true),
            status("TASK_STATE_COMPLETED", None),
        ]))
    })
    .await;
    let agent = remote_agent("remote", &server.url);
    let (events, outcome) =
        run_rendered(&backend(), &server, &agent, request("child-1", "Say hello")).await;
    check(
        &events,
        expect![[r#"
            run_start remote thread=thread-1 run=child-1
            step_start 1
            text "Hello, "
            text "world"
            step_end 1
            run_finish natural_end response=Some("Hello, world")
        "#]],
    );
    assert_eq!(
        outcome,
        Ok(BackendOutcome {
            termination: TerminationReason::NaturalEnd,
            response: Some("Hello, world".to_owned()),
            usage: Default::default(),
            waiting: None,
        })
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("POST", "/message:stream")
    );
    assert_eq!(sent.header("a2a-version"), Some("1.0"));
    assert_eq!(sent.header("accept"), Some("text/event-stream"));
    assert_eq!(sent.header("authorization"), None);
    let body = sent.json();
    assert_eq!(body["message"]["role"], "ROLE_USER");
    assert_eq!(body["message"]["parts"], json!([{"text": "Say hello"}]));
    assert_eq!(body["message"]["contextId"], "thread-1");
    assert_eq!(body["message"]["messageId"], "awaken-child-1");
}

#[tokio::test]
async fn a_direct_message_answer_and_a_completed_status_message_are_answers_too() {
    let server = Loopback::start(|_| {
        Reply::Sse(stream(&[json!({"message": {
            "messageId": "m-1", "role": "ROLE_AGENT", "parts": [{"text": "direct"}]
        }})]))
    })
    .await;
    let agent = remote_agent("remote", &server.url);
    let (_, outcome) = run_rendered(&backend(), &server, &agent, request("r-1", "hi")).await;
    assert_eq!(outcome.map(|o| o.response), Ok(Some("direct".to_owned())));

    let server = Loopback::start(|_| {
        Reply::Sse(stream(&[
            submitted(),
            status("TASK_STATE_COMPLETED", Some("in the status")),
        ]))
    })
    .await;
    let agent = remote_agent("remote", &server.url);
    let (_, outcome) = run_rendered(&backend(), &server, &agent, request("r-1", "hi")).await;
    assert_eq!(
        outcome.map(|o| o.response),
        Ok(Some("in the status".to_owned()))
    );
}

#[tokio::test]
async fn a_failed_or_rejected_task_is_a_backend_error_with_the_remote_message() {
    let server = Loopback::start(|_| {
        Reply::Sse(stream(&[
            submitted(),
            status("TASK_STATE_FAILED", Some("the tool broke")),
        ]))
    })
    .await;
    let agent = remote_agent("remote", &server.url);
    let (events, outcome) = run_rendered(&backend(), &server, &agent, request("r-1", "hi")).await;
    check(
        &events,
        expect![[r#"
            run_start remote thread=thread-1 run=r-1
            step_start 1
            step_end 1
            error agent `remote`: remote task `task-1` ended TASK_STATE_FAILED: the tool broke
            run_finish error response=None
        "#]],
    );
    check(
        &outcome.err().unwrap_or_default(),
        expect![
            "execution backend `a2a` failed: agent `remote`: remote task `task-1` ended TASK_STATE_FAILED: the tool broke"
        ],
    );

    let server = Loopback::start(|_| {
        Reply::Sse(stream(&[submitted(), status("TASK_STATE_REJECTED", None)]))
    })
    .await;
    let agent = remote_agent("remote", &server.url);
    let (_, outcome) = run_rendered(&backend(), &server, &agent, request("r-1", "hi")).await;
    check(
        &outcome.err().unwrap_or_default(),
        expect![
            "execution backend `a2a` failed: agent `remote`: remote task `task-1` ended TASK_STATE_REJECTED: (no message)"
        ],
    );
}

#[tokio::test]
async fn a_malformed_stream_is_a_backend_error_saying_where() {
    let cases: [(&str, String, Expect); 4] = [
        (
            "not JSON",
            "data: {not json\n\n".to_owned(),
            expect![
                "execution backend `a2a` failed: agent `remote`: event 1 of the stream of POST <url>/message:stream is no A2A stream response: key must be a string at line 1 column 2"
            ],
        ),
        (
            "unknown payload",
            format!("{}data: {{\"surprise\": {{}}}}\n\n", event(&submitted())),
            expect![
                "execution backend `a2a` failed: agent `remote`: event 2 of the stream of POST <url>/message:stream is no A2A stream response: unknown variant `surprise`, expected one of `task`, `message`, `statusUpdate`, `artifactUpdate` at line 1 column 11"
            ],
        ),
        (
            "cut inside an event",
            format!("{}data: {{\"task\"", event(&submitted())),
            expect![
                "execution backend `a2a` failed: agent `remote`: the stream of POST <url>/message:stream is malformed: the event stream ended inside an event"
            ],
        ),
        (
            "ended while working",
            stream(&[submitted(), status("TASK_STATE_WORKING", None)]),
            expect![
                "execution backend `a2a` failed: agent `remote`: the stream of POST <url>/message:stream ended before the task finished (last state: TASK_STATE_WORKING)"
            ],
        ),
    ];
    for (name, body, expected) in cases {
        let server = Loopback::start(move |_| Reply::Sse(body.clone())).await;
        let agent = remote_agent("remote", &server.url);
        let (events, outcome) =
            run_rendered(&backend(), &server, &agent, request("r-1", "hi")).await;
        assert!(events.contains("run_finish error"), "{name}: {events}");
        check(
            &outcome.err().unwrap_or_else(|| format!("{name}: no error")),
            expected,
        );
    }
}

#[tokio::test]
async fn an_http_error_is_a_backend_error_with_the_error_body() {
    let server = Loopback::start(|_| {
        Reply::Json(
            400,
            json!({"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "parts must not be empty", "details": []}})
                .to_string(),
        )
    })
    .await;
    let agent = remote_agent("remote", &server.url);
    let (_, outcome) = run_rendered(&backend(), &server, &agent, request("r-1", "hi")).await;
    check(
        &outcome.err().unwrap_or_default(),
        expect![
            "execution backend `a2a` failed: agent `remote`: POST <url>/message:stream answered HTTP 400: parts must not be empty (INVALID_ARGUMENT)"
        ],
    );
}

#[tokio::test]
async fn an_unreachable_endpoint_is_a_backend_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let url = format!(
        "http://{}",
        listener.local_addr().unwrap_or_else(|e| panic!("{e}"))
    );
    drop(listener);
    let agent = remote_agent("remote", &url);
    let sink = VecSink::new();
    let err = backend()
        .run(&agent, request("r-1", "hi"), &sink)
        .await
        .err()
        .unwrap_or_else(|| panic!("a closed port answered"));
    assert!(
        err.message
            .starts_with(&format!("agent `remote`: POST {url}/message:stream failed")),
        "{err}"
    );
    check_activation(&sink.events()).unwrap_or_else(|v| panic!("{v}"));
}

#[tokio::test]
async fn input_required_suspends_the_run_with_the_remote_question() {
    let server = Loopback::start(|_| {
        Reply::Sse(stream(&[
            submitted(),
            status("TASK_STATE_INPUT_REQUIRED", Some("Which city?")),
        ]))
    })
    .await;
    let agent = remote_agent("remote", &server.url);
    let (events, outcome) =
        run_rendered(&backend(), &server, &agent, request("r-1", "weather")).await;
    check(
        &events,
        expect![[r#"
            run_start remote thread=thread-1 run=r-1
            step_start 1
            text "Which city?"
            step_end 1
            run_finish suspended response=Some("Which city?")
        "#]],
    );
    // The waiting task's id is the handle an answer is sent into.
    assert_eq!(
        outcome.map(|o| (o.termination, o.response, o.waiting)),
        Ok((
            TerminationReason::Suspended,
            Some("Which city?".to_owned()),
            Some("task-1".to_owned())
        ))
    );
}

/// Cancels the run when the first text arrives.
pub(crate) struct CancelOnText {
    pub(crate) events: VecSink,
    pub(crate) cancel: CancellationToken,
}

impl EventSink for CancelOnText {
    fn emit(&self, event: &AgentEvent) {
        if matches!(event, AgentEvent::TextDelta { .. }) {
            self.cancel.cancel();
        }
        self.events.emit(event);
    }
}

#[tokio::test]
async fn cancelling_the_run_cancels_the_remote_task() {
    let server = Loopback::start(|r| match r.path.as_str() {
        "/message:stream" => Reply::SseHeld(stream(&[submitted(), artifact("partial", false)])),
        _ => Reply::Json(
            200,
            json!({"id": "task-1", "contextId": "thread-1", "status": {"state": "TASK_STATE_CANCELED"}})
                .to_string(),
        ),
    })
    .await;
    let agent = remote_agent("remote", &server.url);
    let request = request("r-1", "a long job");
    let sink = CancelOnText {
        events: VecSink::new(),
        cancel: request.cancel.clone(),
    };
    let outcome = backend()
        .run(&agent, request, &sink)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcome.termination, TerminationReason::Cancelled);
    let events = sink.events.events();
    check_activation(&events).unwrap_or_else(|v| panic!("{v}"));
    check(
        &render(&events),
        expect![[r#"
            run_start remote thread=thread-1 run=r-1
            step_start 1
            text "partial"
            step_end 1
            run_finish cancelled response=None
        "#]],
    );
    let calls: Vec<String> = server
        .requests()
        .iter()
        .map(|r: &Recorded| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(calls, ["POST /message:stream", "POST /tasks/task-1:cancel"]);
}

#[tokio::test]
async fn a_run_cancelled_before_it_starts_sends_nothing() {
    let server = Loopback::start(|_| Reply::Sse(String::new())).await;
    let agent = remote_agent("remote", &server.url);
    let request = request("r-1", "hi");
    request.cancel.cancel();
    let (_, outcome) = run_rendered(&backend(), &server, &agent, request).await;
    assert_eq!(
        outcome.map(|o| o.termination),
        Ok(TerminationReason::Cancelled)
    );
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn a_resent_run_carries_the_same_message_id_and_another_run_another() {
    let server = Loopback::start(|_| {
        Reply::Sse(stream(&[
            submitted(),
            status("TASK_STATE_COMPLETED", Some("ok")),
        ]))
    })
    .await;
    let agent = remote_agent("remote", &server.url);
    let backend = backend();
    for run in ["child-7", "child-7", "child-8"] {
        let (_, outcome) = run_rendered(&backend, &server, &agent, request(run, "hi")).await;
        assert!(outcome.is_ok(), "{run}: {outcome:?}");
    }
    let ids: Vec<(Value, Value)> = server
        .requests()
        .iter()
        .map(|r| {
            let body = r.json();
            (
                body["message"]["messageId"].clone(),
                body["message"]["contextId"].clone(),
            )
        })
        .collect();
    assert_eq!(
        ids,
        [
            (json!("awaken-child-7"), json!("thread-1")),
            (json!("awaken-child-7"), json!("thread-1")),
            (json!("awaken-child-8"), json!("thread-1")),
        ]
    );
}

#[tokio::test]
async fn the_bearer_token_is_sent_only_for_the_agent_it_is_configured_for() {
    let server = Loopback::start(|r| match r.path.as_str() {
        "/.well-known/agent-card.json" => Reply::Json(200, card("1.0", true)),
        _ => Reply::Sse(stream(&[
            submitted(),
            status("TASK_STATE_COMPLETED", Some("ok")),
        ])),
    })
    .await;
    let secured = remote_agent("secured", &server.url);
    let open = remote_agent("open", &server.url);
    // The variable named by the agent's endpoint (as an agent file names it).
    let mut named = remote_agent("named", &server.url);
    if let Some(endpoint) = named.endpoint.as_mut() {
        endpoint.bearer_token_env = Some("NAMED_TOKEN".to_owned());
    }
    let backend = backend()
        .with_bearer_token_env("secured", "SECURED_TOKEN")
        .with_env_lookup(|name| match name {
            "SECURED_TOKEN" => Some("s3cret".to_owned()),
            "NAMED_TOKEN" => Some("n4med".to_owned()),
            _ => None,
        });
    backend
        .discover([&secured, &open, &named])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for agent in [&secured, &open, &named] {
        let sink = VecSink::new();
        backend
            .run(agent, request("r-1", "hi"), &sink)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let seen: Vec<(String, Option<String>)> = server
        .requests()
        .iter()
        .map(|r| (r.path.clone(), r.header("authorization").map(str::to_owned)))
        .collect();
    let token = Some("Bearer s3cret".to_owned());
    let named_token = Some("Bearer n4med".to_owned());
    assert_eq!(
        seen,
        [
            ("/.well-known/agent-card.json".to_owned(), token.clone()),
            ("/.well-known/agent-card.json".to_owned(), None),
            (
                "/.well-known/agent-card.json".to_owned(),
                named_token.clone()
            ),
            ("/message:stream".to_owned(), token),
            ("/message:stream".to_owned(), None),
            ("/message:stream".to_owned(), named_token),
        ]
    );

    // A configured variable that is not set: an error, and nothing is sent.
    let before = server.requests().len();
    let unset = backend.with_env_lookup(|_| None);
    let err = unset
        .run(&secured, request("r-2", "hi"), &VecSink::new())
        .await
        .err()
        .unwrap_or_else(|| panic!("ran without its token"));
    check(
        &err.to_string(),
        expect![
            "execution backend `a2a` failed: agent `secured`: its bearer token variable `SECURED_TOKEN` is not set or holds no valid token"
        ],
    );
    let err = unset.discover([&secured]).await.err();
    assert!(
        matches!(&err, Some(DiscoverError::MissingCredential { variable, .. }) if variable == "SECURED_TOKEN"),
        "{err:?}"
    );
    assert_eq!(server.requests().len(), before);
}

#[test]
fn the_backend_claims_only_a2a_endpoints() {
    let backend = backend();
    let endpoint = |protocol: Option<&str>| EndpointSpec {
        url: "http://127.0.0.1:1".to_owned(),
        protocol: protocol.map(str::to_owned),
        bearer_token_env: None,
    };
    assert!(backend.claims(&endpoint(Some("a2a"))));
    assert!(backend.claims(&endpoint(Some("A2A"))));
    assert!(!backend.claims(&endpoint(Some("mcp"))));
    assert!(!backend.claims(&endpoint(None)));
    assert_eq!(backend.id(), "a2a");
}
