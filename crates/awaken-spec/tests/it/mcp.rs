//! MCP server entries: both transports parse with their defaults and round-trip, the include
//! and exclude patterns pick tools, and every refusal names its field.

use awaken_spec::{DurationSpec, Glob, McpServerSpec, McpTransportSpec, SpecError};

/// The field an `Invalid` error names (panics on any other error).
fn field(err: SpecError) -> String {
    match err {
        SpecError::Invalid { field, .. } => field,
        other => panic!("not a field error: {other}"),
    }
}

#[test]
fn a_stdio_entry_parses_with_defaults_and_round_trips() {
    let spec = McpServerSpec::from_toml_str(
        r#"
name = "files"
command = "node"
args = ["server.js", "stdio"]
env = { TOKEN = "${FILES_TOKEN}" }
"#,
    )
    .expect("valid");
    assert_eq!(
        spec.transport(),
        McpTransportSpec::Stdio { command: "node" }
    );
    assert_eq!(spec.timeout(), DurationSpec::from_secs(60));
    assert_eq!(spec.tool_prefix(), "files__");
    let text = serde_json::to_string(&spec).expect("ser");
    expect_test::expect![[r#"{"name":"files","command":"node","args":["server.js","stdio"],"env":{"TOKEN":"${FILES_TOKEN}"}}"#]].assert_eq(&text);
    assert_eq!(
        McpServerSpec::from_json_str(&text).expect("round trip"),
        spec
    );
    assert_eq!(
        spec,
        McpServerSpec::stdio("files", "node", ["server.js", "stdio"])
            .with_env("TOKEN", "${FILES_TOKEN}")
    );
}

#[test]
fn an_http_entry_keeps_its_headers_timeout_and_prefix() {
    let spec = McpServerSpec::from_toml_str(
        r#"
name = "search"
url = "http://127.0.0.1:3001/mcp"
headers = { Authorization = "Bearer ${SEARCH_TOKEN}" }
timeout = "5s"
tool_prefix = "web_"
"#,
    )
    .expect("valid");
    assert_eq!(
        spec.transport(),
        McpTransportSpec::Http {
            url: "http://127.0.0.1:3001/mcp"
        }
    );
    assert_eq!(spec.timeout(), DurationSpec::from_secs(5));
    assert_eq!(spec.tool_prefix(), "web_");
    assert!(spec.trust_annotations, "annotations are trusted by default");
    assert_eq!(
        spec,
        McpServerSpec::http("search", "http://127.0.0.1:3001/mcp")
            .with_header("Authorization", "Bearer ${SEARCH_TOKEN}")
            .with_timeout(DurationSpec::from_secs(5))
            .with_tool_prefix("web_")
    );
}

#[test]
fn annotations_can_be_distrusted() {
    let spec =
        McpServerSpec::from_toml_str("name = \"s\"\ncommand = \"x\"\ntrust_annotations = false\n")
            .expect("valid");
    assert!(!spec.trust_annotations);
    let text = serde_json::to_string(&spec).expect("ser");
    assert_eq!(
        text,
        r#"{"name":"s","command":"x","trust_annotations":false}"#
    );
    assert_eq!(
        spec,
        McpServerSpec::stdio("s", "x", [""; 0]).with_trusted_annotations(false)
    );
}

#[test]
fn include_and_exclude_patterns_pick_the_tools() {
    let glob = |p: &str| Glob::new(p).expect("glob");
    let all = McpServerSpec::stdio("s", "x", [""; 0]);
    assert!(all.takes_tool("anything"));
    let some = all
        .clone()
        .with_include(glob("read_*"))
        .with_include(glob("list"))
        .with_exclude(glob("read_secret*"));
    let taken: Vec<&str> = ["read_file", "read_secrets", "list", "write_file"]
        .into_iter()
        .filter(|n| some.takes_tool(n))
        .collect();
    assert_eq!(taken, ["read_file", "list"]);
}

#[test]
fn every_refusal_names_its_field() {
    let cases = [
        (
            r#"name = "a b"
command = "x""#,
            "mcp_servers.name",
        ),
        (r#"name = "s""#, "mcp_servers.s.command"),
        (
            r#"name = "s"
command = "x"
url = "http://h/""#,
            "mcp_servers.s.url",
        ),
        (
            r#"name = "s"
command = " ""#,
            "mcp_servers.s.command",
        ),
        (
            r#"name = "s"
command = "x"
headers = { A = "b" }"#,
            "mcp_servers.s.headers",
        ),
        (
            r#"name = "s"
url = "ftp://h/""#,
            "mcp_servers.s.url",
        ),
        (
            r#"name = "s"
url = "http://h/"
args = ["a"]"#,
            "mcp_servers.s.args",
        ),
        (
            r#"name = "s"
url = "http://h/"
env = { A = "b" }"#,
            "mcp_servers.s.env",
        ),
        (
            r#"name = "s"
command = "x"
timeout = "0s""#,
            "mcp_servers.s.timeout",
        ),
        (
            r#"name = "s"
command = "x"
tool_prefix = "a.b""#,
            "mcp_servers.s.tool_prefix",
        ),
    ];
    for (text, expected) in cases {
        let err = McpServerSpec::from_toml_str(text).expect_err(text);
        assert_eq!(field(err), expected, "{text}");
    }
}

#[test]
fn an_unknown_field_is_refused_with_its_line() {
    let err = McpServerSpec::from_toml_str("name = \"s\"\ncommand = \"x\"\nargv = []\n")
        .expect_err("unknown field");
    assert_eq!(err.line(), Some(3), "{err}");
}
