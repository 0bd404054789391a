//! The reference server's tools through both transports: listing with ids, effect classes and
//! schemas; calls with arguments; a tool error; progress; cancellation; a changed tool list.

use std::time::Duration;

use awaken_event::EffectClass;
use awaken_mcp::{McpServer, McpServerState};
use awaken_spec::{Glob, McpServerSpec};
use awaken_tool::ToolError;
use serde_json::json;

use crate::peers::{changing_tools, context, everything, http_server, listening, stdio_spec, tool};

/// Lists, calls and the error of a failed call, the same over either transport.
async fn lists_and_calls(server: &McpServer) {
    let status = server.status();
    assert_eq!(status.state, McpServerState::Ready);
    let echo = status
        .tools
        .iter()
        .find(|t| t.mcp_name == "echo")
        .expect("echo is listed");
    assert_eq!(echo.id, format!("{}__echo", server.name()));
    assert_eq!(echo.effect, EffectClass::ReadOnly, "echo says readOnlyHint");
    let sum = tool(server, &format!("{}__get-sum", server.name()));
    assert!(
        sum.validator()
            .validate(&json!({"a": "x", "b": 1}))
            .is_err(),
        "the server's schema is enforced before a call"
    );
    let (ctx, _) = context("call-1");
    let out = tool(server, &echo.id)
        .tool()
        .execute(&json!({"message": "hi"}), &ctx)
        .await
        .expect("echo answers");
    assert_eq!(*out.result.content, json!("Echo: hi"));
    let out = sum
        .tool()
        .execute(&json!({"a": 2, "b": 3.5}), &ctx)
        .await
        .expect("get-sum answers");
    assert_eq!(*out.result.content, json!("The sum of 2 and 3.5 is 5.5."));
    // Arguments the server refuses come back as the tool's error, which the model sees.
    let err = tool(server, &echo.id)
        .tool()
        .execute(&json!({}), &ctx)
        .await
        .expect_err("echo without a message fails");
    let ToolError::Execution { message } = &err else {
        panic!("not an execution error: {err:?}");
    };
    assert!(
        message.starts_with(&format!("`echo` on MCP server `{}` failed:", server.name()))
            && message.contains("message"),
        "{message}"
    );
}

/// A long call reports its progress and ends with its result.
async fn reports_progress(server: &McpServer) {
    let (ctx, reports) = context("call-2");
    let out = tool(
        server,
        &format!("{}__trigger-long-running-operation", server.name()),
    )
    .tool()
    .execute(&json!({"duration": 0.3, "steps": 3}), &ctx)
    .await
    .expect("the long call ends");
    assert!(
        out.result
            .content
            .as_str()
            .is_some_and(|t| t.starts_with("Long running operation completed")),
        "{:?}",
        out.result.content
    );
    let reports = reports.list.lock().expect("reports").clone();
    // The server's notifications are handled apart from its answer, so the last report may
    // come after the result and be dropped; those sent well before it arrive, in order.
    let expected = [
        json!({"progress": 1.0, "total": 3.0}),
        json!({"progress": 2.0, "total": 3.0}),
        json!({"progress": 3.0, "total": 3.0}),
    ];
    assert!(
        reports.len() >= 2 && expected.starts_with(&reports),
        "{reports:?}"
    );
}

/// A cancelled call ends at once as cancelled, and the connection goes on serving calls.
async fn cancels(server: &McpServer) {
    let (ctx, reports) = context("call-3");
    let long = tool(
        server,
        &format!("{}__trigger-long-running-operation", server.name()),
    );
    let cancel = ctx.cancel_token().clone();
    let args = json!({"duration": 60, "steps": 60});
    let call = long.tool().execute(&args, &ctx);
    tokio::pin!(call);
    // Cancel once the server is at work (its first progress report), not before.
    let err = loop {
        tokio::select! {
            result = &mut call => break result.expect_err("the call is cancelled"),
            () = reports.arrived.notified() => cancel.cancel(),
        }
    };
    assert!(matches!(err, ToolError::Cancelled { .. }), "{err:?}");
    let (ctx, _) = context("call-4");
    let out = tool(server, &format!("{}__echo", server.name()))
        .tool()
        .execute(&json!({"message": "still here"}), &ctx)
        .await
        .expect("the connection still serves calls");
    assert_eq!(*out.result.content, json!("Echo: still here"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_lists_calls_reports_progress_and_cancels() {
    let Some(script) = everything() else { return };
    let server = McpServer::connect(stdio_spec("everything", &script))
        .await
        .expect("connects");
    lists_and_calls(&server).await;
    reports_progress(&server).await;
    cancels(&server).await;
    server.shutdown().await;
    assert_eq!(server.status().state, McpServerState::Stopped);
    let (ctx, _) = context("call-5");
    let err = tool(&server, "everything__echo")
        .tool()
        .execute(&json!({"message": "gone"}), &ctx)
        .await
        .expect_err("a stopped server's tools fail");
    assert!(
        err.to_string()
            .contains("MCP server `everything` is unavailable"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_lists_calls_reports_progress_and_cancels() {
    let Some(script) = everything() else { return };
    let (_child, url) = http_server(&script).await;
    let server = McpServer::connect(McpServerSpec::http("web", url))
        .await
        .expect("connects");
    lists_and_calls(&server).await;
    reports_progress(&server).await;
    cancels(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_list_reaches_the_tools_and_filters_apply() {
    let Some(script) = everything() else { return };
    // The reference server adds a tool once initialized and says its list changed.
    let spec = stdio_spec("ev", &script)
        .with_tool_prefix("x_")
        .with_exclude(Glob::new("get-*").expect("glob"));
    let server = McpServer::connect(spec).await.expect("connects");
    let mut listings = server.tool_listings();
    tokio::time::timeout(
        Duration::from_secs(20),
        // The first listing is made at connection; a second one only because the server said
        // its list changed.
        listings.wait_for(|n| {
            *n >= 2
                && server
                    .status()
                    .tools
                    .iter()
                    .any(|t| t.mcp_name == "simulate-research-query")
        }),
    )
    .await
    .expect("the changed list is read within the timeout")
    .expect("the server is still supervised");
    let status = server.status();
    assert!(status.tools.iter().all(|t| t.id.starts_with("x_")));
    assert!(
        !status.tools.iter().any(|t| t.mcp_name.starts_with("get-")),
        "excluded tools are left out: {:?}",
        status.tools
    );
    assert!(status.tools.iter().any(|t| t.id == "x_echo"));
}

/// A tool the server adds when asked reaches the tool list, and can be called.
async fn a_new_tool_is_listed_and_called(server: &McpServer) {
    let prefix = format!("{}__", server.name());
    let mut listings = server.tool_listings();
    let before = *listings.borrow_and_update();
    let (ctx, _) = context("call-add");
    let out = tool(server, &format!("{prefix}add_tool"))
        .tool()
        .execute(&json!({"name": "fresh"}), &ctx)
        .await
        .expect("add_tool answers");
    assert_eq!(*out.result.content, json!("added fresh"));
    tokio::time::timeout(
        Duration::from_secs(20),
        listings.wait_for(|n| {
            *n > before && server.status().tools.iter().any(|t| t.mcp_name == "fresh")
        }),
    )
    .await
    .expect("the new list is read after the server said it changed")
    .expect("the server is still supervised");
    let out = tool(server, &format!("{prefix}fresh"))
        .tool()
        .execute(&json!({}), &ctx)
        .await
        .expect("the new tool answers");
    assert_eq!(*out.result.content, json!("fresh called"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_the_server_adds_reaches_the_tools_over_stdio() {
    let Some(script) = changing_tools() else {
        return;
    };
    let spec = McpServerSpec::stdio("changing", "node", [script.as_str(), "stdio"]);
    let server = McpServer::connect(spec).await.expect("connects");
    a_new_tool_is_listed_and_called(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_the_server_adds_reaches_the_tools_over_http() {
    let Some(script) = changing_tools() else {
        return;
    };
    let (_child, url) = listening(&[script.as_str(), "http"]).await;
    let server = McpServer::connect(McpServerSpec::http("changing", url))
        .await
        .expect("connects");
    a_new_tool_is_listed_and_called(&server).await;
}
