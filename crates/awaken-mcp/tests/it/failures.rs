//! Servers that cannot be used: each failure is an error naming the server and the cause.

use awaken_mcp::{McpError, McpServer, McpServerState};
use awaken_spec::{DurationSpec, McpServerSpec};

#[tokio::test]
async fn a_program_that_does_not_exist_is_named_with_the_server() {
    let spec = McpServerSpec::stdio("ghost", "/nonexistent/mcp-server", ["--stdio"]);
    let err = McpServer::connect(spec).await.expect_err("cannot start");
    assert!(matches!(err, McpError::Start { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with("MCP server `ghost`: cannot start `/nonexistent/mcp-server`:"),
        "{text}"
    );
}

#[tokio::test]
async fn a_program_that_exits_at_once_fails_initialization_with_its_last_words() {
    let spec = McpServerSpec::stdio(
        "quitter",
        "sh",
        ["-c", "echo 'config file missing' >&2; exit 3"],
    )
    .with_timeout(DurationSpec::from_secs(10));
    let err = McpServer::connect(spec).await.expect_err("no handshake");
    assert!(matches!(err, McpError::Initialize { .. }), "{err:?}");
    assert!(err.to_string().contains("config file missing"), "{err}");
}

#[tokio::test]
async fn a_program_that_never_answers_times_out() {
    let spec = McpServerSpec::stdio("mute", "sh", ["-c", "exec sleep 30"])
        .with_timeout(DurationSpec::from_millis(300));
    let err = McpServer::connect(spec).await.expect_err("no answer");
    assert!(
        matches!(
            err,
            McpError::Timeout {
                what: "initialize",
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_unset_variable_is_named_before_anything_starts() {
    let spec = McpServerSpec::stdio("keyed", "/nonexistent", [""; 0])
        .with_env("TOKEN", "${AWAKEN_MCP_TEST_UNSET_VARIABLE}");
    let err = McpServer::connect(spec).await.expect_err("unset");
    assert!(matches!(err, McpError::MissingVariable { .. }), "{err:?}");
}

#[tokio::test]
async fn an_unreachable_http_server_fails_with_its_name() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let spec = McpServerSpec::http("nowhere", format!("http://127.0.0.1:{port}/mcp"))
        .with_timeout(DurationSpec::from_secs(5));
    let err = McpServer::connect(spec).await.expect_err("refused");
    assert!(
        err.to_string().starts_with("MCP server `nowhere`:"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_is_reconnected_and_calls_fail_meanwhile() {
    let Some(script) = crate::peers::everything() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("awaken-mcp-reconnect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let pid_file = dir.join("pid");
    // The shell writes its pid and becomes the server, so the test can kill the server.
    let spec = McpServerSpec::stdio(
        "phoenix",
        "sh",
        [
            "-c".to_owned(),
            format!(
                "echo $$ > '{}'; exec node '{script}' stdio",
                pid_file.display()
            ),
        ],
    )
    .with_timeout(DurationSpec::from_secs(20));
    let server = McpServer::connect(spec).await.expect("connects");
    let mut states = server.state_changes();
    let first_pid = std::fs::read_to_string(&pid_file).expect("pid written");
    let killed = std::process::Command::new("kill")
        .args(["-9", first_pid.trim()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let wait = |states: &mut tokio::sync::watch::Receiver<McpServerState>, ready: bool| {
        let mut states = states.clone();
        async move {
            tokio::time::timeout(
                std::time::Duration::from_secs(20),
                states.wait_for(|s| (*s == McpServerState::Ready) == ready),
            )
            .await
            .expect("the state changes in time")
            .expect("still supervised")
            .clone()
        }
    };
    let down = wait(&mut states, false).await;
    let McpServerState::Reconnecting { cause, .. } = &down else {
        panic!("not reconnecting: {down:?}");
    };
    assert!(cause.contains("the connection closed"), "{cause}");
    let (ctx, _) = crate::peers::context("call-r");
    let echo = crate::peers::tool(&server, "phoenix__echo");
    // The first attempt waits 250 ms and the server takes longer to start: it is away now.
    assert_ne!(*states.borrow(), McpServerState::Ready);
    let err = echo
        .tool()
        .execute(&serde_json::json!({"message": "anyone?"}), &ctx)
        .await
        .expect_err("no server to call");
    assert!(
        err.to_string()
            .contains("MCP server `phoenix` is unavailable"),
        "{err}"
    );
    wait(&mut states, true).await;
    let second_pid = std::fs::read_to_string(&pid_file).expect("pid written again");
    assert_ne!(first_pid, second_pid, "a new process serves");
    let out = echo
        .tool()
        .execute(&serde_json::json!({"message": "back"}), &ctx)
        .await
        .expect("the tool works again");
    assert_eq!(*out.result.content, serde_json::json!("Echo: back"));
    let _ = std::fs::remove_dir_all(&dir);
}
