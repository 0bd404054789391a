//! An MCP server's tools in the runtime: a scripted agent calls the reference server's tool
//! through the agent loop, its events follow the grammar and the model sees the result; an
//! agent's catalog filter applies to the tools' ids as to any tool's.

use std::sync::Arc;

use awaken_event::{AgentEvent, ThreadId, VecSink, check_activation};
use awaken_llm::{ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken_mcp::McpServer;
use awaken_runtime::{AgentRuntime, RunActivation};
use awaken_spec::{AgentSpec, Glob, ModelSpec};
use serde_json::json;

use crate::peers::{everything, stdio_spec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_calls_an_mcp_tool_through_the_runtime() {
    let Some(script) = everything() else { return };
    let server = McpServer::connect(stdio_spec("everything", &script))
        .await
        .expect("connects");
    let model = ScriptedExecutor::from_turns(vec![
        ScriptTurn::text("").with_tool_call(
            ScriptToolCall::new("everything__echo", json!({"message": "from the loop"}))
                .with_id("c1"),
        ),
        ScriptTurn::text("done"),
    ])
    .expect("script");
    let runtime = AgentRuntime::builder()
        .with_model(ModelSpec::new("m", "scripted", "scripted-model"))
        .with_provider("scripted", Arc::new(model))
        .with_tool_provider(Arc::new(server.clone()))
        .with_agent_spec(AgentSpec::new("agent", "m"))
        // Another agent that does not see the server's other tools.
        .with_agent_spec(
            AgentSpec::new("narrow", "m")
                .with_allowed_tool_pattern(Glob::new("everything__get-*").expect("glob")),
        )
        .build()
        .expect("runtime");
    let resolved = runtime.resolver().resolve("narrow").expect("resolves");
    assert!(
        resolved
            .tools
            .iter()
            .all(|t| t.tool.id().starts_with("everything__get-")),
        "the catalog filter applies to MCP tool ids"
    );
    let sink = VecSink::new();
    let outcome = runtime
        .run(
            RunActivation::new(ThreadId::new("t").expect("id"), "agent")
                .with_user_message("echo something"),
            &sink,
        )
        .await
        .expect("the run ends");
    assert_eq!(outcome.response.as_deref(), Some("done"));
    let events = sink.events();
    check_activation(&events).expect("one well-formed activation");
    let done = events
        .iter()
        .find_map(|e| match e {
            AgentEvent::ToolCallDone { result, .. } => Some(result.content.clone()),
            _ => None,
        })
        .expect("the call finished");
    assert_eq!(*done, json!("Echo: from the loop"));
}
