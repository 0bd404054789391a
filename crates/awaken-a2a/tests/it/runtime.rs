//! An endpoint agent as another agent's delegate: the runtime plans it onto [`A2aBackend`],
//! whose answer (or failure) is the delegate call's result the model sees.

use std::sync::Arc;

use awaken_a2a::A2aBackend;
use awaken_event::{
    AgentEvent, Role, SuspendTicket, TerminationReason, ThreadId, ToolCallResume, VecSink,
    check_activation,
};
use awaken_llm::{ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken_runtime::{AgentRuntime, Resume, RunActivation, SequentialIds};
use awaken_spec::{AgentSpec, ModelSpec};
use serde_json::{Value, json};

use crate::client::{backend, remote_agent};
use crate::server::{Loopback, Reply, event};

fn runtime(url: &str, backend: A2aBackend) -> AgentRuntime {
    let executor = Arc::new(
        ScriptedExecutor::from_turns(vec![
            ScriptTurn::text("").with_tool_call(
                ScriptToolCall::new("delegate_remote", json!({"task": "Say hello"}))
                    .with_id("call-1"),
            ),
            ScriptTurn::text("The remote agent answered."),
        ])
        .unwrap_or_else(|e| panic!("script: {e}")),
    );
    AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "scripted", "up"))
        .with_provider("scripted", executor)
        .with_backend(Arc::new(backend))
        .with_agent_spec(AgentSpec::new("lead", "model").with_delegate("remote"))
        .with_agent_spec(remote_agent("remote", url))
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"))
}

/// Runs the lead agent on thread `main`; its outcome and the delegate call's result as the
/// model saw it.
async fn lead_run(server: &Loopback) -> (TerminationReason, String) {
    let rt = runtime(&server.url, backend());
    let thread = ThreadId::new("main").unwrap_or_else(|e| panic!("{e}"));
    let out = rt
        .run_to_completion(RunActivation::new(thread.clone(), "lead").with_user_message("go"))
        .await
        .unwrap_or_else(|e| panic!("run: {e}"));
    let history = rt
        .history(&thread)
        .await
        .unwrap_or_else(|e| panic!("history: {e}"));
    let result = history
        .iter()
        .find(|m| m.role == Role::Tool)
        .map(awaken_event::Message::content_as_text)
        .unwrap_or_else(|| panic!("no tool result in {history:?}"));
    (out.termination, result.replace(&server.url, "<url>"))
}

fn stream(events: &[Value]) -> String {
    events.iter().map(event).collect()
}

#[tokio::test]
async fn a_remote_delegates_answer_is_the_delegate_calls_result() {
    let server = Loopback::start(|_| {
        Reply::Sse(stream(&[
            json!({"task": {"id": "task-1", "contextId": "main/call-1", "status": {"state": "TASK_STATE_WORKING"}}}),
            json!({"artifactUpdate": {"taskId": "task-1", "contextId": "main/call-1",
                "artifact": {"artifactId": "a", "parts": [{"text": "Hello from afar"}]}}}),
            json!({"statusUpdate": {"taskId": "task-1", "contextId": "main/call-1",
                "status": {"state": "TASK_STATE_COMPLETED"}}}),
        ]))
    })
    .await;
    let (termination, result) = lead_run(&server).await;
    assert_eq!(termination, TerminationReason::NaturalEnd);
    expect_test::expect![[r#"{"agent":"remote","answer":"Hello from afar"}"#]].assert_eq(&result);
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let message = &requests[0].json()["message"];
    // The child run's thread is the remote context; its run id (derived from the parent's call)
    // names the message.
    assert_eq!(message["contextId"], "main/call-1");
    assert_eq!(message["parts"], json!([{"text": "Say hello"}]));
    let id = message["messageId"].as_str().unwrap_or_default();
    assert!(id.starts_with("awaken-child-"), "{id}");
}

#[tokio::test]
async fn a_remote_delegates_failure_is_an_error_result_for_the_model() {
    let server = Loopback::start(|_| {
        Reply::Sse(stream(&[
            json!({"task": {"id": "task-1", "contextId": "main/call-1", "status": {"state": "TASK_STATE_WORKING"}}}),
            json!({"statusUpdate": {"taskId": "task-1", "contextId": "main/call-1",
                "status": {"state": "TASK_STATE_FAILED", "message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "out of paper"}]}}}}),
        ]))
    })
    .await;
    let (termination, result) = lead_run(&server).await;
    assert_eq!(
        termination,
        TerminationReason::NaturalEnd,
        "the lead goes on"
    );
    expect_test::expect!["error: the remote agent `remote` failed: execution backend `a2a` failed: agent `remote`: remote task `task-1` ended TASK_STATE_FAILED: out of paper"].assert_eq(&result);
}

/// The loopback agent's replies: its question on a new task, then the answer to what the
/// message continuing `task-1` says.
fn asker(request: &crate::server::Recorded) -> Reply {
    let message = &request.json()["message"];
    if request.path.ends_with(":cancel") {
        let task = json!({"id": "task-1", "contextId": "main/call-1",
            "status": {"state": "TASK_STATE_CANCELED"}});
        return Reply::Json(200, task.to_string());
    }
    if message["taskId"].is_null() {
        return Reply::Sse(stream(&[
            json!({"task": {"id": "task-1", "contextId": "main/call-1", "status": {"state": "TASK_STATE_WORKING"}}}),
            json!({"statusUpdate": {"taskId": "task-1", "contextId": "main/call-1",
                "status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "Which city?"}]}}}}),
        ]));
    }
    let city = message["parts"][0]["text"].as_str().unwrap_or_default();
    Reply::Sse(stream(&[
        json!({"statusUpdate": {"taskId": "task-1", "contextId": "main/call-1", "status": {"state": "TASK_STATE_WORKING"}}}),
        json!({"artifactUpdate": {"taskId": "task-1", "contextId": "main/call-1",
            "artifact": {"artifactId": "a", "parts": [{"text": format!("Sunny in {city}")}]}}}),
        json!({"statusUpdate": {"taskId": "task-1", "contextId": "main/call-1", "status": {"state": "TASK_STATE_COMPLETED"}}}),
    ]))
}

/// Runs the lead (its remote delegate at `url`) until the remote agent's question suspends it; the runtime and the ticket.
pub(crate) async fn asked(url: &str) -> (AgentRuntime, ThreadId, SuspendTicket) {
    let rt = runtime(url, backend());
    let thread = ThreadId::new("main").unwrap_or_else(|e| panic!("{e}"));
    let out = rt
        .run_to_completion(RunActivation::new(thread.clone(), "lead").with_user_message("go"))
        .await
        .unwrap_or_else(|e| panic!("run: {e}"));
    assert_eq!(out.termination, TerminationReason::Suspended);
    let waiting = rt
        .waiting_calls(&thread)
        .await
        .unwrap_or_else(|e| panic!("waiting: {e}"));
    let [ticket] = <[SuspendTicket; 1]>::try_from(waiting)
        .unwrap_or_else(|w| panic!("one waiting call, not {w:?}"));
    (rt, thread, ticket)
}

/// The delegate call's result as the model saw it.
pub(crate) async fn tool_result(rt: &AgentRuntime, thread: &ThreadId) -> String {
    let history = rt
        .history(thread)
        .await
        .unwrap_or_else(|e| panic!("history: {e}"));
    history
        .iter()
        .find(|m| m.role == Role::Tool)
        .map(awaken_event::Message::content_as_text)
        .unwrap_or_else(|| panic!("no tool result in {history:?}"))
}

#[tokio::test]
async fn a_remote_delegates_question_suspends_the_call_and_the_answer_continues_its_task() {
    let server = Loopback::start(asker).await;
    let (rt, thread, ticket) = asked(&server.url).await;
    assert_eq!(ticket.message, "[remote] Which city?");
    assert_eq!(ticket.call.call_id.as_str(), "call-1");
    assert_eq!(ticket.call.tool_name, "delegate_remote");

    // An approval without an answer is refused; nothing is sent.
    let unanswered = ToolCallResume::approve(&ticket.call);
    let refused = rt
        .resume_to_completion(Resume::new(thread.clone()).with_decision(unanswered))
        .await;
    assert!(
        matches!(&refused, Err(e) if e.to_string().contains("does not match its schema")),
        "{refused:?}"
    );
    assert_eq!(server.requests().len(), 1);

    let answer = ToolCallResume::approve(&ticket.call).with_payload(json!("Paris"));
    let sink = VecSink::new();
    let out = rt
        .resume(Resume::new(thread.clone()).with_decision(answer), &sink)
        .await
        .unwrap_or_else(|e| panic!("resume: {e}"));
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
    check_activation(&sink.events()).unwrap_or_else(|e| panic!("{e}"));
    // The remote agent's streamed text is the call's progress.
    assert!(
        sink.events().iter().any(|e| matches!(e,
            AgentEvent::ToolCallProgress { progress, .. } if progress["text"] == "Sunny in Paris")),
        "{:?}",
        sink.events()
    );
    expect_test::expect![[r#"{"agent":"remote","answer":"Sunny in Paris"}"#]]
        .assert_eq(&tool_result(&rt, &thread).await);

    // The history the next provider request carries: one result for the one call, after it.
    let history = rt
        .history(&thread)
        .await
        .unwrap_or_else(|e| panic!("history: {e}"));
    let shape: Vec<(Role, usize)> = history
        .iter()
        .map(|m| (m.role, m.tool_calls.len()))
        .collect();
    assert_eq!(
        shape,
        [
            (Role::User, 0),
            (Role::Assistant, 1),
            (Role::Tool, 0),
            (Role::Assistant, 0)
        ]
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let (first, second) = (
        &requests[0].json()["message"],
        &requests[1].json()["message"],
    );
    // The answer goes into the waiting task, in its context, under a message id of its own.
    assert_eq!(second["taskId"], "task-1");
    assert_eq!(second["contextId"], first["contextId"]);
    assert_eq!(second["parts"], json!([{"text": "Paris"}]));
    assert_ne!(second["messageId"], first["messageId"]);
}

#[tokio::test]
async fn declining_a_remote_delegates_question_cancels_its_task() {
    let server = Loopback::start(asker).await;
    let (rt, thread, ticket) = asked(&server.url).await;
    let out = rt
        .resume_to_completion(
            Resume::new(thread.clone()).with_decision(ToolCallResume::deny(&ticket.call)),
        )
        .await
        .unwrap_or_else(|e| panic!("resume: {e}"));
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
    expect_test::expect![
        "error: the user declined to answer `remote`'s question; its remote task was asked to cancel"
    ]
    .assert_eq(&tool_result(&rt, &thread).await);
    let requests = server.requests();
    let paths: Vec<&str> = requests.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert!(paths[1].ends_with("/tasks/task-1:cancel"), "{paths:?}");
}

/// Cancels the run at the delegate call's first progress report.
struct CancelOnProgress {
    events: VecSink,
    cancel: awaken_event::CancellationToken,
}

impl awaken_event::EventSink for CancelOnProgress {
    fn emit(&self, event: &AgentEvent) {
        if matches!(event, AgentEvent::ToolCallProgress { .. }) {
            self.cancel.cancel();
        }
        self.events.emit(event);
    }
}

#[tokio::test]
async fn cancelling_the_parent_while_its_remote_delegate_streams_cancels_the_remote_task() {
    let (cancelled, mut cancel_seen) = tokio::sync::mpsc::unbounded_channel();
    let server = Loopback::start(move |r| {
        if r.path.ends_with(":cancel") {
            let _ = cancelled.send(r.path.clone());
            let task = json!({"id": "task-1", "contextId": "main/call-1",
                "status": {"state": "TASK_STATE_CANCELED"}});
            return Reply::Json(200, task.to_string());
        }
        Reply::SseHeld(stream(&[
            json!({"task": {"id": "task-1", "contextId": "main/call-1", "status": {"state": "TASK_STATE_WORKING"}}}),
            json!({"artifactUpdate": {"taskId": "task-1", "contextId": "main/call-1",
                "artifact": {"artifactId": "a", "parts": [{"text": "partial"}]}}}),
        ]))
    })
    .await;
    let rt = runtime(&server.url, backend());
    let thread = ThreadId::new("main").unwrap_or_else(|e| panic!("{e}"));
    let activation = RunActivation::new(thread.clone(), "lead").with_user_message("go");
    let sink = CancelOnProgress {
        events: VecSink::new(),
        cancel: activation.cancel.clone(),
    };
    let out = rt
        .run(activation, &sink)
        .await
        .unwrap_or_else(|e| panic!("run: {e}"));
    assert_eq!(out.termination, TerminationReason::Cancelled);
    check_activation(&sink.events.events()).unwrap_or_else(|e| panic!("{e}"));
    // The runtime dropped the call's future; the remote task is cancelled in the background.
    let cancel = tokio::time::timeout(std::time::Duration::from_secs(10), cancel_seen.recv())
        .await
        .unwrap_or_else(|_| panic!("no cancel reached the remote host: {:?}", server.requests()));
    assert_eq!(cancel.as_deref(), Some("/tasks/task-1:cancel"));
    let paths: Vec<String> = server.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/message:stream", "/tasks/task-1:cancel"]);
}
