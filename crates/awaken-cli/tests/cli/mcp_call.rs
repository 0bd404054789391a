//! `awaken mcp list --url` and `awaken mcp call`: the reference MCP server reached over
//! streamable HTTP on 127.0.0.1 and, through an agent file, over stdio; the arguments checked
//! against the tool's schema, and each kind of bad input named.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use serde_json::{Value, json};

use crate::{REQUIRE_NODE_PEERS, awaken_in_repo, expect_code, peer_present, repo, text};

/// The reference server's entry point, when it is installed.
fn everything() -> Option<PathBuf> {
    let script = repo()
        .join("tests/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    peer_present(
        "the MCP reference server",
        false,
        std::slice::from_ref(&script),
        REQUIRE_NODE_PEERS,
    )
    .then_some(script)
}

/// The reference server over streamable HTTP on a port of 127.0.0.1 the system picks (the
/// preloaded `loopback.mjs` binds it there and prints the address); killed when dropped.
struct HttpEverything {
    child: Child,
    /// The MCP endpoint.
    url: String,
}

impl HttpEverything {
    fn start(script: &PathBuf) -> Self {
        let mut child = Command::new("node")
            .arg("--import")
            .arg(repo().join("tests/node/loopback.mjs"))
            .arg(script)
            .arg("streamableHttp")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the reference server");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr is piped")).lines();
        let address = loop {
            let line = lines
                .next()
                .expect("the server stopped before it listened")
                .expect("read the server's stderr");
            if let Some(address) = line.strip_prefix("LISTENING ") {
                break address.to_owned();
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self {
            child,
            url: format!("http://{address}/mcp"),
        }
    }
}

impl Drop for HttpEverything {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asserts that standard error holds `needle`.
#[track_caller]
fn expect_stderr(out: &Output, needle: &str) {
    let stderr = text(&out.stderr);
    assert!(stderr.contains(needle), "expected {needle:?} in:\n{stderr}");
}

#[test]
fn mcp_list_and_call_reach_a_server_by_url() {
    let Some(script) = everything() else {
        return;
    };
    let server = HttpEverything::start(&script);
    let url = server.url.as_str();

    let out = awaken_in_repo(&["mcp", "list", "--url", url]);
    expect_code(&out, 0);
    let listed = text(&out.stdout);
    assert!(
        listed.starts_with(&format!("url (http: {url}) ready, ")),
        "{listed}"
    );
    assert!(listed.contains("\n  url__get-sum  read_only  "), "{listed}");
    let out = awaken_in_repo(&["mcp", "list", "--url", url, "--json"]);
    expect_code(&out, 0);
    let listed: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(
        (&listed["name"], &listed["state"]),
        (&json!("url"), &json!("ready"))
    );
    let tools = listed["tools"].as_array().expect("tools");
    assert!(
        tools
            .iter()
            .any(|t| t["mcp_name"] == "get-sum" && t["id"] == "url__get-sum"),
        "{listed}"
    );

    // `a=5` is the number 5: the schema takes it and the server adds numbers.
    let out = awaken_in_repo(&["mcp", "call", "get-sum", "a=5", "b=3", "--url", url]);
    expect_code(&out, 0);
    assert_eq!(text(&out.stdout), "The sum of 5 and 3 is 8.\n");

    // By the tool's id too, a value that is no JSON taken as text, and --json.
    let out = awaken_in_repo(&[
        "mcp",
        "call",
        "url__echo",
        "message=hi there",
        "--url",
        url,
        "--json",
    ]);
    expect_code(&out, 0);
    let printed: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(
        printed,
        json!({"server": "url", "tool": "url__echo", "id": "url__echo", "result": "Echo: hi there"})
    );

    // Arguments the schema refuses never reach the server: bad input.
    let out = awaken_in_repo(&["mcp", "call", "get-sum", "a=5", "b=x", "--url", url]);
    expect_code(&out, 2);
    expect_stderr(
        &out,
        "invalid arguments for tool `url__get-sum`: at /b: \"x\" is not of type \"number\"",
    );
    let out = awaken_in_repo(&["mcp", "call", "no-such-tool", "--url", url]);
    expect_code(&out, 2);
    expect_stderr(
        &out,
        "MCP server `url` offers no tool `no-such-tool`; its tools: echo, ",
    );
    expect_stderr(&out, ", get-sum, ");

    // A tool that fails: exit 1 with the server's message, in the JSON object with --json.
    let failing = [
        "mcp",
        "call",
        "gzip-file-as-resource",
        "name=x.gz",
        "data=ftp://nowhere/x",
        "--url",
        url,
    ];
    let out = awaken_in_repo(&failing);
    expect_code(&out, 1);
    expect_stderr(
        &out,
        "awaken: `gzip-file-as-resource` on MCP server `url` failed: Error processing file ftp://nowhere/x: Unsupported URL protocol",
    );
    let out = awaken_in_repo(&[&failing[..], &["--json"]].concat());
    expect_code(&out, 1);
    let printed: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(printed["tool"], "gzip-file-as-resource");
    assert!(
        printed["error"]
            .as_str()
            .is_some_and(|e| e.contains("Unsupported URL protocol")),
        "{printed}"
    );
}

#[test]
fn mcp_call_reaches_an_agent_files_server_and_names_bad_input() {
    let agent = "examples/agents/mcp.toml";
    let nowhere = "http://127.0.0.1:9/mcp";
    for (args, error) in [
        (
            &["mcp", "call", "echo", "--agent", agent][..],
            "`awaken mcp call --agent FILE` needs --server NAME",
        ),
        (
            &["mcp", "call", "echo", "--url", nowhere, "--agent", agent],
            "--url and --agent exclude each other",
        ),
        (
            &["mcp", "list", "--url", "ftp://127.0.0.1/mcp"],
            "--url \"ftp://127.0.0.1/mcp\": expected the http:// or https:// URL",
        ),
        (
            &["mcp", "list"],
            "`awaken mcp list` needs --agent FILE or --url URL",
        ),
        (
            &["mcp", "call", "--url", nowhere],
            "`awaken mcp call` takes a TOOL, then KEY=VALUE arguments",
        ),
        (
            &["mcp", "call", "echo", "a=1", "b", "--url", nowhere],
            "argument \"b\" is not KEY=VALUE",
        ),
        (
            &["mcp", "call", "echo", "a=1", "a=2", "--url", nowhere],
            "argument `a` is given twice",
        ),
        (
            &["mcp", "call", "echo", "--agent", agent, "--server", "nope"],
            "examples/agents/mcp.toml: no MCP server `nope` (its servers: everything)",
        ),
    ] {
        let out = awaken_in_repo(args);
        expect_code(&out, 2);
        expect_stderr(&out, error);
    }
    if everything().is_none() {
        return;
    }
    let by_agent = |tool: &str, arguments: &[&str]| {
        let mut args = vec!["mcp", "call", tool];
        args.extend_from_slice(arguments);
        args.extend_from_slice(&["--agent", agent, "--server", "everything"]);
        awaken_in_repo(&args)
    };
    let out = by_agent("echo", &["message=hello"]);
    expect_code(&out, 0);
    assert_eq!(text(&out.stdout), "Echo: hello\n");
    // The file's include patterns leave the server's other tools out.
    let out = by_agent("get-env", &[]);
    expect_code(&out, 2);
    expect_stderr(
        &out,
        "MCP server `everything` offers no tool `get-env`; its tools (after the agent file's include and exclude patterns): echo, get-sum",
    );
}
