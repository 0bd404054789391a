//! Servers that cannot be used: each failure is an error naming the server and the cause.

use awaken_mcp::{McpError, McpServer};
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
