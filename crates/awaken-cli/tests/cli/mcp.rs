//! An agent file with an MCP server: `awaken run` calls the server's tool end to end, `awaken
//! mcp list` shows its tools, and a server that cannot start is named by `mcp list` and
//! `validate`.

use std::io::{BufRead as _, BufReader};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::{REQUIRE_NODE_PEERS, awaken_in_repo, command, peer_present, repo, temp_dir, text};

/// Whether the reference MCP server is installed.
fn peer_installed() -> bool {
    let script = repo()
        .join("tests/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    peer_present(
        "the MCP reference server",
        false,
        &[script],
        REQUIRE_NODE_PEERS,
    )
}

#[test]
fn run_calls_the_mcp_servers_tool_and_mcp_list_shows_it() {
    if !peer_installed() {
        return;
    }
    let out = awaken_in_repo(&[
        "run",
        "--agent",
        "examples/agents/mcp.toml",
        "--store",
        "memory",
        "--json",
        "Say hello",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let events: Vec<awaken::event::AgentEvent> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is an event"))
        .collect();
    awaken::event::check_activation(&events).expect("one well-formed activation");
    let lines: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let result = lines
        .iter()
        .find(|e| e["type"] == "tool_call_done")
        .unwrap_or_else(|| panic!("no tool result: {}", text(&out.stdout)));
    assert!(
        result.to_string().contains("Echo: hello"),
        "the server's answer is the result: {result}"
    );

    let out = awaken_in_repo(&["mcp", "list", "--agent", "examples/agents/mcp.toml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    assert!(
        listed.starts_with("everything (stdio: node) ready, 2 tool(s)"),
        "{listed}"
    );
    assert!(listed.contains("everything__echo  read_only"), "{listed}");
    assert!(
        listed.contains("everything__get-sum  read_only"),
        "{listed}"
    );
}

#[test]
fn a_server_that_cannot_start_is_named_by_mcp_list_and_validate() {
    let dir = temp_dir("mcp-ghost");
    let file = dir.join("ghost.toml");
    std::fs::write(
        &file,
        r#"
[agent]
id = "ghostly"
model = "default"

[model]
id = "default"
provider = "scripted"
upstream_model = "scripted"
context_window = 32000

[[mcp_servers]]
name = "ghost"
command = "/nonexistent/mcp-server"

[[script.turns]]
deltas = ["hi"]
"#,
    )
    .expect("write the agent");
    let path = file.to_str().expect("utf-8");
    let out = awaken_in_repo(&["mcp", "list", "--agent", path]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with(
            "ghost (stdio: /nonexistent/mcp-server) failed: MCP server `ghost`: cannot start `/nonexistent/mcp-server`:"
        ),
        "{}",
        text(&out.stdout)
    );
    let out = awaken_in_repo(&["validate", "--agent", path]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!(
            "{path}: MCP server `ghost`: cannot start `/nonexistent/mcp-server`"
        )),
        "{}",
        text(&out.stderr)
    );
}

/// Runs an agent whose MCP call (the reference server's long-running operation) is killed with
/// SIGKILL once it is executing (its first progress event), waits out the run's lease, and
/// recovers the run; returns what the recovery printed (`--json`) and the thread's transcript.
fn kill_during_the_call_then_recover(name: &str, trust_annotations: bool) -> (String, String) {
    let dir = temp_dir(name);
    let script = repo()
        .join("tests/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let agent = dir.join("slow.toml");
    std::fs::write(
        &agent,
        format!(
            r#"
[agent]
id = "slow"
model = "default"
max_rounds = 4

[model]
id = "default"
provider = "scripted"
upstream_model = "scripted"
context_window = 32000

[[mcp_servers]]
name = "everything"
command = "node"
args = [{script:?}, "stdio"]
timeout = "30s"
include = ["trigger-long-running-operation"]
trust_annotations = {trust_annotations}

[[script.turns]]
tool_calls = [{{ id = "call_1", name = "everything__trigger-long-running-operation", arguments = {{ duration = 1, steps = 10 }} }}]

[[script.turns]]
deltas = ["Recovered."]
"#,
            script = script.display().to_string()
        ),
    )
    .expect("write the agent");
    let agent = agent.to_str().expect("utf-8");
    let store = format!("sqlite:{}", dir.join("awaken.db").display());
    let mut child = command()
        .args([
            "run", "--agent", agent, "--store", &store, "--thread", "k", "--json", "Go",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the run");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let progressed =
        lines.any(|line| line.is_ok_and(|l| l.contains("\"type\":\"tool_call_progress\"")));
    assert!(
        progressed,
        "the call reported progress before the run ended"
    );
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    // The dead process's lease runs out a second after its last heartbeat.
    std::thread::sleep(Duration::from_millis(1500));
    let recovered = command()
        .args(["recover", "--agent", agent, "--store", &store, "--json"])
        .output()
        .expect("recover runs");
    assert_eq!(
        recovered.status.code(),
        Some(0),
        "{}\n{}",
        text(&recovered.stderr),
        text(&recovered.stdout)
    );
    let shown = command()
        .args(["show", "k", "--store", &store])
        .output()
        .expect("show runs");
    let _ = std::fs::remove_dir_all(&dir);
    (text(&recovered.stdout), text(&shown.stdout))
}

#[test]
fn a_read_only_mcp_call_killed_while_executing_is_run_again_by_recovery() {
    if !peer_installed() {
        return;
    }
    let (recovered, shown) = kill_during_the_call_then_recover("mcp-kill-ro", true);
    assert!(
        recovered.contains("Long running operation completed"),
        "the read-only call ran again: {recovered}"
    );
    assert!(!recovered.contains("outcome unknown"), "{recovered}");
    assert!(shown.contains("Recovered."), "{shown}");
}

#[test]
fn a_side_effecting_mcp_call_killed_while_executing_is_closed_as_outcome_unknown() {
    if !peer_installed() {
        return;
    }
    let (recovered, shown) = kill_during_the_call_then_recover("mcp-kill-se", false);
    assert!(
        !recovered.contains("Long running operation completed"),
        "the side-effecting call did not run again: {recovered}"
    );
    assert!(shown.contains("outcome unknown"), "{shown}");
    assert!(shown.contains("Recovered."), "{shown}");
}
