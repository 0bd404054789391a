//! An endpoint agent as another agent's delegate: the runtime plans it onto [`A2aBackend`],
//! whose answer (or failure) is the delegate call's result the model sees.

use std::sync::Arc;

use awaken_a2a::A2aBackend;
use awaken_event::{Role, TerminationReason, ThreadId};
use awaken_llm::{ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken_runtime::{AgentRuntime, RunActivation, SequentialIds};
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
    expect_test::expect!["error: the child run could not go on: execution backend `a2a` failed: agent `remote`: remote task `task-1` ended TASK_STATE_FAILED: out of paper"].assert_eq(&result);
}

/// A backend's suspension carries no ticket and leaves nothing in the child thread for the
/// delegate tool to ask the parent with, so the delegate call fails: this pins that edge until
/// the backend interface can carry the remote agent's question.
#[tokio::test]
async fn a_remote_delegate_asking_for_input_is_an_error_result_for_now() {
    let server = Loopback::start(|_| {
        Reply::Sse(stream(&[
            json!({"task": {"id": "task-1", "contextId": "main/call-1", "status": {"state": "TASK_STATE_WORKING"}}}),
            json!({"statusUpdate": {"taskId": "task-1", "contextId": "main/call-1",
                "status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "Which city?"}]}}}}),
        ]))
    })
    .await;
    let (termination, result) = lead_run(&server).await;
    assert_eq!(termination, TerminationReason::NaturalEnd);
    expect_test::expect!["error: the child run is suspended but waits on no call"]
        .assert_eq(&result);
}
