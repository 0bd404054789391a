//! Starting the reference server, and the calling context of a tool call.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use awaken_event::{RunId, ThreadId, ToolCallId};
use awaken_mcp::McpServer;
use awaken_spec::{DurationSpec, McpServerSpec};
use awaken_state::{KeyRegistry, StateStore};
use awaken_tool::{RegisteredTool, ToolCallContext, ToolProvider};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

/// The Node project the tests' peers are installed in.
pub fn node_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/node")
}

/// The reference server's entry point, or `None` (with the reason printed) when it is not
/// installed; with `AWAKEN_REQUIRE_NODE_PEERS=1` a missing peer fails the test instead.
pub fn everything() -> Option<String> {
    let script =
        node_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let node = std::process::Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if node && script.exists() {
        return Some(script.display().to_string());
    }
    let why = format!(
        "the MCP reference server is not installed (node found: {node}; {} exists: {}); run `npm ci --prefix tests/node`",
        script.display(),
        script.exists()
    );
    assert!(
        std::env::var("AWAKEN_REQUIRE_NODE_PEERS").as_deref() != Ok("1"),
        "{why}"
    );
    // Straight to stderr: the test harness does not capture it, so the skip shows.
    let _ = writeln!(std::io::stderr(), "skipped: {why}");
    None
}

/// The reference server over stdio.
pub fn stdio_spec(name: &str, script: &str) -> McpServerSpec {
    McpServerSpec::stdio(name, "node", [script, "stdio"]).with_timeout(DurationSpec::from_secs(20))
}

/// The reference server over streamable HTTP on a port of 127.0.0.1 the system picks; the
/// process is killed when the returned child is dropped.
pub async fn http_server(script: &str) -> (tokio::process::Child, String) {
    let preload = node_dir().join("loopback.mjs").display().to_string();
    listening(&["--import", &preload, script, "streamableHttp"]).await
}

/// The server whose tool list changes on demand (`tests/node/changing-tools.mjs`), or `None`
/// when the official SDK is not installed (a failure with `AWAKEN_REQUIRE_NODE_PEERS=1`).
pub fn changing_tools() -> Option<String> {
    everything()?;
    let sdk = node_dir().join("node_modules/@modelcontextprotocol/sdk/package.json");
    assert!(
        sdk.exists(),
        "{} is missing: run `npm ci --prefix tests/node`",
        sdk.display()
    );
    Some(node_dir().join("changing-tools.mjs").display().to_string())
}

/// `node` with `args`, once it says on stderr `LISTENING HOST:PORT`; its `/mcp` URL. The
/// process is killed when the returned child is dropped.
pub async fn listening(args: &[&str]) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new("node")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the server");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let address = loop {
        let line = lines
            .next_line()
            .await
            .expect("read the server's stderr")
            .expect("the server stopped before it listened");
        if let Some(address) = line.strip_prefix("LISTENING ") {
            break address.to_owned();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, format!("http://{address}/mcp"))
}

/// The server's tool with this id.
pub fn tool(server: &McpServer, id: &str) -> RegisteredTool {
    server
        .tools()
        .iter()
        .find(|t| t.id() == id)
        .unwrap_or_else(|| panic!("no tool `{id}`"))
        .clone()
}

/// The progress reports of a call, and a signal at each one.
#[derive(Default)]
pub struct Reports {
    pub list: Mutex<Vec<Value>>,
    pub arrived: tokio::sync::Notify,
}

/// A call's context whose progress reports are collected.
pub fn context(call: &str) -> (ToolCallContext, Arc<Reports>) {
    let reports = Arc::new(Reports::default());
    let sink = reports.clone();
    let ctx = ToolCallContext::new(
        ThreadId::new("thread-1").expect("thread"),
        RunId::new("run-1").expect("run"),
        ToolCallId::new(call).expect("call"),
        StateStore::new(KeyRegistry::new()).snapshot(),
    )
    .with_progress(Arc::new(move |_: &ToolCallId, report: Value| {
        sink.list.lock().expect("reports").push(report);
        sink.arrived.notify_one();
    }));
    (ctx, reports)
}
