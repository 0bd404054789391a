//! Execution plans: an endpoint-backed agent runs through the `ExecutionBackend` that claims
//! its endpoint — here one that forwards to a second `AgentRuntime` in this process, as a
//! remote agent server would.

use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{EventSink, TerminationReason, ThreadId, VecSink, check_activation};
use awaken_llm::{ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken_resolver::{BackendError, BackendOutcome, BackendRequest, ExecutionBackend};
use awaken_runtime::{AgentRuntime, Resume, RunActivation, RunError, SequentialIds};
use awaken_spec::{AgentSpec, EndpointSpec, ModelSpec};
use serde_json::json;

use crate::support::*;

/// Serves `local://<agent>` endpoints by running `<agent>` on another runtime.
struct Forward(Option<AgentRuntime>);

#[async_trait]
impl ExecutionBackend for Forward {
    fn id(&self) -> &str {
        "forward"
    }
    fn claims(&self, endpoint: &EndpointSpec) -> bool {
        endpoint.url.starts_with("local://")
    }
    async fn run(
        &self,
        agent: &AgentSpec,
        request: BackendRequest,
        sink: &dyn EventSink,
    ) -> Result<BackendOutcome, BackendError> {
        let failed = |message: String| BackendError {
            backend: "forward".into(),
            message,
        };
        let target = self
            .0
            .as_ref()
            .ok_or_else(|| failed("the server is down".into()))?;
        let url = agent
            .endpoint
            .as_ref()
            .map(|e| e.url.clone())
            .unwrap_or_default();
        let mut activation =
            RunActivation::new(request.thread_id, url.trim_start_matches("local://"));
        activation.messages = request.messages;
        activation.inference = request.overrides;
        activation.cancel = request.cancel;
        let out = target
            .run(activation, sink)
            .await
            .map_err(|e| failed(e.to_string()))?;
        Ok(BackendOutcome {
            termination: out.termination,
            response: out.response,
            usage: out.usage,
            waiting: None,
        })
    }
}

fn server() -> AgentRuntime {
    let executor = Arc::new(
        ScriptedExecutor::from_turns(vec![
            ScriptTurn::text("").with_tool_call(
                ScriptToolCall::new("echo", json!({"text": "remote"})).with_id("c1"),
            ),
            ScriptTurn::text("served remotely"),
        ])
        .expect("script"),
    );
    AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "scripted", "up"))
        .with_provider("scripted", executor)
        .with_tool(Arc::new(Echo))
        .with_agent_spec(AgentSpec::new("worker", "model"))
        .build()
        .expect("server")
}

fn client(backend: Forward) -> AgentRuntime {
    let executor = Arc::new(ScriptedExecutor::from_turns(Vec::new()).expect("script"));
    AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "scripted", "up"))
        .with_provider("scripted", executor)
        .with_backend(Arc::new(backend))
        .with_agent_spec(
            AgentSpec::new("helper", "model").with_endpoint(EndpointSpec {
                url: "local://worker".into(),
                protocol: None,
                bearer_token_env: None,
            }),
        )
        .build()
        .expect("client")
}

#[tokio::test]
async fn an_endpoint_backed_agent_runs_through_its_backend() {
    let server = server();
    let client = client(Forward(Some(server.clone())));
    let thread = ThreadId::new("t").expect("id");
    let sink = VecSink::new();
    let out = client
        .run(
            RunActivation::new(thread.clone(), "helper").with_user_message("hi"),
            &sink,
        )
        .await
        .expect("ran");
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
    assert_eq!(out.response.as_deref(), Some("served remotely"));
    // The server's events reached the client's sink, as one well-formed activation.
    let events = sink.events();
    check_activation(&events).expect("grammar");
    assert!(render(&events).contains("call_done c1 succeeded {\"echoed\":\"remote\"}"));
    // The thread lives on the server, not in the client's store.
    assert_eq!(server.history(&thread).await.expect("h").len(), 4);
    assert!(client.history(&thread).await.expect("h").is_empty());
    // Resuming such a run is the backend's business.
    let resumed = client.resume_to_completion(Resume::new(thread)).await;
    assert!(
        matches!(resumed, Err(RunError::NotWaiting { .. })),
        "{resumed:?}"
    );
}

#[tokio::test]
async fn a_failing_backend_is_a_typed_error() {
    let client = client(Forward(None));
    let err = client
        .run_to_completion(
            RunActivation::new(ThreadId::new("t").expect("id"), "helper").with_user_message("hi"),
        )
        .await
        .expect_err("down");
    assert!(matches!(err, RunError::Backend(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "execution backend `forward` failed: the server is down"
    );
}
