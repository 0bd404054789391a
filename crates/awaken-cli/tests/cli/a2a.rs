//! `awaken serve` over A2A with the protocol's own client: `tests/python/a2a_client.py` drives
//! the official Python SDK (`a2a-sdk`, pinned in `.ci/requirements.txt`) through card discovery,
//! a blocking and a streamed send, get and list, cancel and subscribe, and a call waiting for
//! approval answered by a yes and by a denial.

use std::process::{Command, Stdio};

use super::serve::{request, start_serving};
use crate::{PROXY_VARS, path_str, repo, temp_dir, text};

/// The variable that makes a missing Python peer (`pip install -r .ci/requirements.txt`) a
/// failure.
const REQUIRE_PYTHON_PEERS: &str = "AWAKEN_REQUIRE_PYTHON_PEERS";

/// The scripted agents the script talks to (the host's card is `helper`'s: the first agent).
/// Each run plays its agent's script from the first turn.
const AGENTS: [(&str, &str); 3] = [
    (
        "helper.toml",
        r#"[agent]
id = "helper"
description = "Answers questions"
model = "default"

[model]
id = "default"
provider = "scripted"
upstream_model = "scripted"
context_window = 32000

[[script.turns]]
deltas = ["Hello ", "from Awaken."]
"#,
    ),
    (
        "waiter.toml",
        r#"[agent]
id = "waiter"
description = "Waits until it is cancelled"
model = "default"

[model]
id = "default"
provider = "scripted"
upstream_model = "scripted"
context_window = 32000

[[script.turns]]
wait_for_cancel = true
"#,
    ),
    (
        "scribe.toml",
        r#"[agent]
id = "scribe"
description = "Keeps a to-do list"
model = "default"
max_rounds = 4
plugin_ids = ["awaken.permission"]

[agent.sections.permission]
default = "allow"
rules = [{ tool = "append_file", decision = "ask" }]

[model]
id = "default"
provider = "scripted"
upstream_model = "scripted"
context_window = 32000

[tools.append_file]
root = "notes"

[[script.turns]]
tool_calls = [{ id = "call_1", name = "append_file", arguments = { path = "todo.txt", line = "buy milk" } }]

[[script.turns]]
text = "Added \"buy milk\" to todo.txt."

[script.turns.if_refused]
text = "I did not add it: the append was refused."
"#,
    ),
];

/// `python3` with no proxy to use (loopback only) and no standard input.
fn python() -> Command {
    let mut python = Command::new("python3");
    python.stdin(Stdio::null());
    for var in PROXY_VARS {
        python.env_remove(var);
    }
    python
}

/// Whether the SDK can be imported; when it cannot, the test is skipped with the reason on
/// standard error, unless [`REQUIRE_PYTHON_PEERS`] is `1`, which makes it a failure.
fn sdk_present() -> bool {
    let found = python()
        .args(["-c", "import a2a.client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return true;
    }
    let why = "the A2A Python SDK is not installed (`python3 -c \"import a2a.client\"` fails); run `python3 -m pip install -r .ci/requirements.txt`";
    assert!(
        std::env::var(REQUIRE_PYTHON_PEERS).as_deref() != Ok("1"),
        "{REQUIRE_PYTHON_PEERS}=1 but {why}"
    );
    // Straight to stderr: the test harness does not capture it, so the skip shows.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("skipped: {why}\n").as_bytes(),
    );
    false
}

#[test]
fn a2a_sdk_discovers_sends_streams_cancels_and_answers_approvals() {
    if !sdk_present() {
        return;
    }
    let dir = temp_dir("a2a");
    let files: Vec<String> = AGENTS
        .iter()
        .map(|(name, body)| {
            let path = dir.join(name);
            std::fs::write(&path, body).expect("write the agent");
            path_str(&path).to_owned()
        })
        .collect();
    let mut serve = vec!["--store", "memory", "--listen", "127.0.0.1:0"];
    for f in &files {
        serve.extend(["--agent", f.as_str()]);
    }
    let (process, mut stderr, addr) = start_serving(&serve, &[], files.len());
    let script = repo().join("tests/python/a2a_client.py");
    let out = python()
        .arg(&script)
        .arg(format!("http://{addr}"))
        .current_dir(&dir)
        .output()
        .expect("python3 runs");
    process.signal("-TERM");
    let status = process.wait();
    let served = stderr.rest();
    assert!(
        out.status.success(),
        "{} failed ({:?}):\n{}{}\nserver:\n{served}",
        script.display(),
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("ok: the A2A SDK works against awaken serve"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(status.code(), Some(0), "server:\n{served}");
    // The approved append ran; the denied one did not.
    let todo = std::fs::read_to_string(dir.join("notes/todo.txt")).expect("the approved append");
    assert_eq!(todo.trim(), "buy milk");
    let _ = std::fs::remove_dir_all(dir);
}

/// The lead agent, whose delegate `helper` is another server's agent (`{url}`).
const LEAD: &str = r#"[agent]
id = "lead"
description = "Hands questions to the helper"
model = "default"
delegates = ["helper"]

[model]
id = "default"
provider = "scripted"
upstream_model = "scripted"
context_window = 32000

[[script.turns]]
tool_calls = [{ id = "call_1", name = "delegate_helper", arguments = { task = "Say hello" } }]

[[script.turns]]
text = "The helper has answered."
"#;

/// Two `awaken serve` processes: the lead of one delegates to the helper of the other, which
/// its file names by its A2A endpoint; the remote answer is the delegate call's result, and the
/// remote server ran the task once.
#[test]
fn a_served_agent_delegates_to_another_servers_agent_over_a2a() {
    let dir = temp_dir("a2a-delegate");
    let helper = dir.join("helper.toml");
    std::fs::write(&helper, AGENTS[0].1).expect("write the helper");
    let (remote, mut remote_err, remote_addr) = start_serving(
        &[
            "--store",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--agent",
            path_str(&helper),
        ],
        &[],
        1,
    );
    let lead = dir.join("lead.toml");
    std::fs::write(&lead, LEAD).expect("write the lead");
    let remote_helper = dir.join("remote-helper.toml");
    std::fs::write(
        &remote_helper,
        format!(
            "[agent]\nid = \"helper\"\ndescription = \"The helper of another server\"\n\n\
             [agent.endpoint]\nurl = \"http://{remote_addr}/a2a/helper\"\nprotocol = \"a2a\"\n"
        ),
    )
    .expect("write the remote helper");
    let (local, mut local_err, local_addr) = start_serving(
        &[
            "--store",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--agent",
            path_str(&lead),
            "--agent",
            path_str(&remote_helper),
        ],
        &[],
        2,
    );
    let (status, body) = request(
        &local_addr,
        "POST",
        "/v1/threads/main/runs?stream=false",
        &[],
        r#"{"message": "Ask the helper", "agent": "lead"}"#,
    );
    let (_, thread) = request(&local_addr, "GET", "/v1/threads/main", &[], "");
    let (_, remote_threads) = request(&remote_addr, "GET", "/v1/threads", &[], "");
    local.signal("-TERM");
    remote.signal("-TERM");
    let (local_status, remote_status) = (local.wait(), remote.wait());
    let logs = format!(
        "local:\n{}\nremote:\n{}",
        local_err.rest(),
        remote_err.rest()
    );
    assert!(status.contains("200"), "{status} {body}\n{logs}");
    let outcome: serde_json::Value = serde_json::from_str(&body).expect("the outcome");
    assert_eq!(
        outcome["response"], "The helper has answered.",
        "{body}\n{logs}"
    );
    let thread: serde_json::Value = serde_json::from_str(&thread).expect("the thread");
    let results: Vec<&serde_json::Value> = thread["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(results.len(), 1, "{thread}");
    assert!(
        results[0].to_string().contains("Hello from Awaken."),
        "the remote answer is the call's result: {}\n{logs}",
        results[0]
    );
    // The remote server ran one task, on the thread the delegate's request named.
    let remote_threads: serde_json::Value =
        serde_json::from_str(&remote_threads).expect("the remote threads");
    let listed = remote_threads["threads"]
        .as_array()
        .or_else(|| remote_threads.as_array())
        .unwrap_or_else(|| panic!("no threads in {remote_threads}"));
    assert_eq!(listed.len(), 1, "{remote_threads}\n{logs}");
    assert_eq!(local_status.code(), Some(0), "{logs}");
    assert_eq!(remote_status.code(), Some(0), "{logs}");
    let _ = std::fs::remove_dir_all(dir);
}
