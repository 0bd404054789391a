//! `awaken serve` over A2A with the protocol's own client: `tests/python/a2a_client.py` drives
//! the official Python SDK (`a2a-sdk`, pinned in `.ci/requirements.txt`) through card discovery,
//! a blocking and a streamed send, get and list, cancel and subscribe, and a call waiting for
//! approval answered by a yes and by a denial. A served agent delegates over A2A to another
//! server's agent, and to an agent built with the SDK (`tests/python/a2a_server.py`) across a
//! crash of the server driving the call.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use super::commands::{STUCK, Stream, Watched};
use super::serve::{client_against_served, request, start_serving};
use crate::{PROXY_VARS, path_str, repo, temp_dir, temp_store};

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

/// The SDK's client, as `python3 -c` imports it.
const SDK_CLIENT: &str = "import a2a.client";

/// The SDK's server and the web stack `tests/python/a2a_server.py` runs on.
const SDK_SERVER: &str = "import a2a.server.routes, sse_starlette, uvicorn, starlette";

/// Whether `python3 -c imports` succeeds; when it does not, the test is skipped with the reason
/// on standard error, unless [`REQUIRE_PYTHON_PEERS`] is `1`, which makes it a failure.
fn sdk_present(imports: &str) -> bool {
    let found = python()
        .args(["-c", imports])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return true;
    }
    let why = format!(
        "the A2A Python SDK is not installed (`python3 -c \"{imports}\"` fails); run `python3 -m pip install -r .ci/requirements.txt`"
    );
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
    if !sdk_present(SDK_CLIENT) {
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
    client_against_served(
        &files,
        |url| {
            let mut client = python();
            client
                .arg(repo().join("tests/python/a2a_client.py"))
                .arg(url)
                .current_dir(&dir);
            client
        },
        "ok: the A2A SDK works against awaken serve",
    );
    // The approved append ran; the denied one did not.
    let todo = std::fs::read_to_string(dir.join("notes/todo.txt")).expect("the approved append");
    assert_eq!(todo.trim(), "buy milk");
    let _ = std::fs::remove_dir_all(dir);
}

/// A lead agent's file: it delegates `task` to `delegate`, then answers `answer`.
fn lead_file(delegate: &str, task: &str, answer: &str) -> String {
    format!(
        r#"[agent]
id = "lead"
description = "Hands work to {delegate}"
model = "default"
delegates = ["{delegate}"]

[model]
id = "default"
provider = "scripted"
upstream_model = "scripted"
context_window = 32000

[[script.turns]]
tool_calls = [{{ id = "call_1", name = "delegate_{delegate}", arguments = {{ task = "{task}" }} }}]

[[script.turns]]
text = "{answer}"
"#
    )
}

/// Two `awaken serve` processes, each with its own token: the lead of one delegates to the
/// helper of the other, which its file names by its A2A endpoint with the variable holding that
/// server's token (the local server's own token would be refused there); the remote answer is
/// the delegate call's result, and the remote server ran the task once.
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
        &[("AWAKEN_API_TOKEN", "remote-secret")],
        1,
    );
    let lead = dir.join("lead.toml");
    std::fs::write(
        &lead,
        lead_file("helper", "Say hello", "The helper has answered."),
    )
    .expect("write the lead");
    let remote_helper = dir.join("remote-helper.toml");
    std::fs::write(
        &remote_helper,
        format!(
            "[agent]\nid = \"helper\"\ndescription = \"The helper of another server\"\n\n\
             [agent.endpoint]\nurl = \"http://{remote_addr}/a2a/helper\"\nprotocol = \"a2a\"\n\
             bearer_token_env = \"HELPER_TOKEN\"\n"
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
        &[
            ("AWAKEN_API_TOKEN", "local-secret"),
            ("HELPER_TOKEN", "remote-secret"),
        ],
        2,
    );
    let local_auth = ["Authorization: Bearer local-secret"];
    let (status, body) = request(
        &local_addr,
        "POST",
        "/v1/threads/main/runs?stream=false",
        &local_auth,
        r#"{"message": "Ask the helper", "agent": "lead"}"#,
    );
    let (_, thread) = request(&local_addr, "GET", "/v1/threads/main", &local_auth, "");
    let remote_auth = ["Authorization: Bearer remote-secret"];
    let (_, remote_threads) = request(&remote_addr, "GET", "/v1/threads", &remote_auth, "");
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

/// How often, and how many times, a test polls for a state it waits for.
const POLL_EVERY: Duration = Duration::from_millis(50);
const POLL_TRIES: usize = 400;

/// `tests/python/a2a_server.py` (agents built with the official A2A Python SDK) as a child
/// process, killed when dropped.
struct SdkServer {
    child: Child,
    /// `127.0.0.1:PORT`.
    addr: String,
}

impl SdkServer {
    /// Starts the script and waits for its `listening http://HOST:PORT` line.
    fn start() -> Self {
        let script = repo().join("tests/python/a2a_server.py");
        let mut child = python()
            .arg(&script)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", script.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        // Reads until the line naming the address, then keeps draining (a full pipe would
        // block the server).
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Some(url) = line.strip_prefix("listening http://") {
                    let _ = tx.send(url.trim().to_owned());
                }
            }
        });
        let mut server = Self {
            child,
            addr: String::new(),
        };
        server.addr = rx
            .recv_timeout(STUCK)
            .unwrap_or_else(|e| panic!("{} did not say where it listens: {e}", script.display()));
        server
    }

    /// `GET /stats`: per agent, the tasks it started and the repeated message ids it recognised.
    fn stats(&self) -> Value {
        let (status, body) = request(&self.addr, "GET", "/stats", &[], "");
        assert!(status.contains("200"), "GET /stats: {status} {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET /stats: {e}: {body}"))
    }

    /// Polls `/stats` until the `hold` agent's `field` is `want`; the last stats seen otherwise.
    fn hold_reaches(&self, field: &str, want: u64) -> Result<Value, String> {
        poll(|| {
            let stats = self.stats();
            if stats["hold"][field] == want {
                Ok(stats)
            } else {
                Err(stats.to_string())
            }
        })
    }
}

impl Drop for SdkServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Calls `check` every [`POLL_EVERY`], up to [`POLL_TRIES`] times, until it is `Ok`; the last
/// `Err` (what it saw) otherwise.
fn poll<T>(mut check: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let mut seen = String::new();
    for _ in 0..POLL_TRIES {
        match check() {
            Ok(found) => return Ok(found),
            Err(now) => seen = now,
        }
        std::thread::sleep(POLL_EVERY);
    }
    Err(seen)
}

/// Kills `process` and fails with `what` and its standard error.
fn fail(process: Watched, stderr: &mut Stream, what: &str) -> ! {
    process.signal("-KILL");
    let _ = process.wait();
    panic!("{what}\nserver:\n{}", stderr.rest())
}

/// A delegate call in flight on a remote agent built with the official SDK survives the crash
/// of the server driving it: the server restarted on the same store continues the run and sends
/// the same A2A message again, which the remote agent recognises, so the call's result is the
/// answer of the one remote task started before the crash.
#[test]
fn a_delegate_call_to_an_sdk_agent_survives_a_crash_without_a_second_remote_task() {
    if !sdk_present(SDK_SERVER) {
        return;
    }
    let sdk = SdkServer::start();
    let (dir, store) = temp_store("a2a-crash");
    let lead = dir.join("lead.toml");
    std::fs::write(
        &lead,
        lead_file("remote", "Keep this", "The remote agent has answered."),
    )
    .expect("write the lead");
    let remote = dir.join("remote.toml");
    std::fs::write(
        &remote,
        format!(
            "[agent]\nid = \"remote\"\ndescription = \"The SDK server's hold agent\"\n\n\
             [agent.endpoint]\nurl = \"http://{}/hold\"\nprotocol = \"a2a\"\n",
            sdk.addr
        ),
    )
    .expect("write the remote agent");
    let serve = [
        "--store",
        &store,
        "--listen",
        "127.0.0.1:0",
        "--agent",
        path_str(&lead),
        "--agent",
        path_str(&remote),
    ];

    let (process, mut stderr, addr) = start_serving(&serve, &[], 2);
    // The run's stream is left unread: the server is killed while the call is in flight.
    let body = r#"{"message": "Hand this over", "agent": "lead"}"#;
    let mut run = TcpStream::connect(&addr).expect("connect");
    run.write_all(
        format!(
            "POST /v1/threads/main/runs HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .expect("start the run");
    if let Err(seen) = sdk.hold_reaches("started", 1) {
        fail(
            process,
            &mut stderr,
            &format!("the remote task never started: {seen}"),
        );
    }
    process.signal("-KILL");
    let status = process.wait();
    let first_log = stderr.rest();
    assert_eq!(status.code(), None, "killed by the signal:\n{first_log}");
    drop(run);
    // The killed process's run lease runs out a second after its last renewal; the next
    // server's first recovery pass then claims the run.
    std::thread::sleep(Duration::from_millis(1500));

    let (process, mut stderr, addr) = start_serving(&serve, &[], 2);
    if let Err(seen) = sdk.hold_reaches("repeats", 1) {
        fail(
            process,
            &mut stderr,
            &format!(
                "the recovered call did not send its message again: {seen}\nfirst server:\n{first_log}"
            ),
        );
    }
    let (status, body) = request(&sdk.addr, "POST", "/hold/release", &[], "");
    assert!(status.contains("204"), "release: {status} {body}");
    let ended = poll(|| {
        let (status, body) = request(&addr, "GET", "/v1/threads/main", &[], "");
        if status.contains("200") && body.contains("\"kind\":\"natural_end\"") {
            Ok(body)
        } else {
            Err(format!("{status} {body}"))
        }
    });
    let thread = match ended {
        Ok(thread) => thread,
        Err(seen) => fail(
            process,
            &mut stderr,
            &format!("the recovered run did not end: {seen}"),
        ),
    };
    let stats = sdk.stats();
    process.signal("-TERM");
    let status = process.wait();
    let log = format!(
        "first server:\n{first_log}\nsecond server:\n{}",
        stderr.rest()
    );
    let thread: Value = serde_json::from_str(&thread).expect("the thread");
    let messages = thread["messages"].as_array().expect("messages");
    let results: Vec<&Value> = messages.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(results.len(), 1, "one delegate result: {thread}\n{log}");
    assert!(
        results[0].to_string().contains("held: Keep this"),
        "the remote answer is the call's result: {}\n{log}",
        results[0]
    );
    let last = messages.last().expect("a last message");
    assert_eq!(last["role"], "assistant", "{thread}");
    assert!(
        last.to_string().contains("The remote agent has answered."),
        "the lead's second turn is the answer: {last}\n{log}"
    );
    // One remote task in all: the message sent again re-attached to it.
    assert_eq!(
        (&stats["hold"]["started"], &stats["hold"]["repeats"]),
        (&Value::from(1), &Value::from(1)),
        "{stats}\n{log}"
    );
    assert_eq!(status.code(), Some(0), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}
