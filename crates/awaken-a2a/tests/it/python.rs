//! [`A2aBackend`] against agents built with the official A2A Python SDK
//! (`tests/python/a2a_server.py`, a second implementation of the protocol, not written here).
//!
//! Each test starts the script as a child process (killed when the test ends) and waits for its
//! `listening http://HOST:PORT` line. When `python3` cannot import the SDK's server the tests
//! are skipped with a notice on stderr, unless `AWAKEN_REQUIRE_PYTHON_PEERS=1`, which makes
//! that a failure.

use std::io::{BufRead, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use awaken_event::{TerminationReason, ToolCallResume, VecSink, check_activation};
use awaken_resolver::ExecutionBackend;
use awaken_runtime::Resume;
use expect_test::expect;
use serde_json::Value;

use crate::client::{CancelOnText, backend, remote_agent, render, request};
use crate::runtime::{asked, tool_result};

/// The running SDK server; killed when dropped.
struct SdkServer {
    child: Child,
    url: String,
}

impl Drop for SdkServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the SDK server; `None` (after a notice) when the SDK is not importable and
/// `AWAKEN_REQUIRE_PYTHON_PEERS` is not `1`.
fn start(test: &str) -> Option<SdkServer> {
    let importable = Command::new("python3")
        .args([
            "-c",
            "import a2a.server.routes, sse_starlette, uvicorn, starlette",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !importable {
        assert!(
            std::env::var("AWAKEN_REQUIRE_PYTHON_PEERS").as_deref() != Ok("1"),
            "AWAKEN_REQUIRE_PYTHON_PEERS=1 but python3 cannot import the A2A SDK's server \
             (pip install -r .ci/requirements.txt)"
        );
        // Straight to stderr: the test harness does not capture it, so the skip shows.
        let _ = writeln!(
            std::io::stderr(),
            "skipped {test}: python3 cannot import the A2A SDK's server (pip install -r .ci/requirements.txt)"
        );
        return None;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/a2a_server.py");
    let mut child = Command::new("python3")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", script.display()));
    let Some(stdout) = child.stdout.take() else {
        panic!("the server's stdout is not piped");
    };
    let mut server = SdkServer {
        child,
        url: String::new(),
    };
    // Reads until the line naming the address; then keeps draining (a full pipe would block
    // the server).
    let (tx, rx) = mpsc::channel::<Option<String>>();
    std::thread::spawn(move || {
        let mut reported = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if !reported && let Some(url) = line.strip_prefix("listening ") {
                reported = true;
                let _ = tx.send(Some(url.trim().to_owned()));
            }
        }
        if !reported {
            let _ = tx.send(None);
        }
    });
    server.url = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Some(url)) => url,
        Ok(None) => panic!("the SDK server exited before listening"),
        Err(_) => panic!("the SDK server did not start listening within 60 s"),
    };
    Some(server)
}

#[tokio::test]
async fn the_sdk_agents_cards_pass_and_the_echo_answer_is_streamed_back() {
    let Some(server) = start("the_sdk_agents_cards_pass_and_the_echo_answer_is_streamed_back")
    else {
        return;
    };
    let agents: Vec<_> = ["echo", "asker", "slow"]
        .iter()
        .map(|name| remote_agent(name, &format!("{}/{name}", server.url)))
        .collect();
    let backend = backend();
    let found = backend
        .discover(&agents)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = found.iter().map(|a| a.card.name.as_str()).collect();
    assert_eq!(names, ["echo", "asker", "slow"]);

    let sink = VecSink::new();
    let outcome = backend
        .run(&agents[0], request("child-1", "Say hello"), &sink)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let events = sink.events();
    check_activation(&events).unwrap_or_else(|v| panic!("{v}"));
    expect![[r#"
        run_start echo thread=thread-1 run=child-1
        step_start 1
        text "echo: Say hello"
        text " [context thread-1, message awaken-child-1]"
        step_end 1
        run_finish natural_end response=Some("echo: Say hello [context thread-1, message awaken-child-1]")
    "#]]
    .assert_eq(&render(&events));
    assert_eq!(outcome.termination, TerminationReason::NaturalEnd);
}

/// The SDK's asker as a lead's delegate: its question suspends the lead's call, and the
/// lead's resume answers it in the same remote task.
#[tokio::test]
async fn an_sdk_agents_question_round_trips_through_the_parents_resume() {
    let Some(server) = start("an_sdk_agents_question_round_trips_through_the_parents_resume")
    else {
        return;
    };
    let (rt, thread, ticket) = asked(&format!("{}/asker", server.url)).await;
    assert_eq!(ticket.message, "[remote] Which city?");
    let answer = ToolCallResume::approve(&ticket.call).with_payload(Value::from("Paris"));
    let sink = VecSink::new();
    let outcome = rt
        .resume(Resume::new(thread.clone()).with_decision(answer), &sink)
        .await
        .unwrap_or_else(|e| panic!("resume: {e}"));
    assert_eq!(outcome.termination, TerminationReason::NaturalEnd);
    check_activation(&sink.events()).unwrap_or_else(|e| panic!("{e}"));
    expect![[r#"{"agent":"remote","answer":"forecast for Paris"}"#]]
        .assert_eq(&tool_result(&rt, &thread).await);
}

#[tokio::test]
async fn cancelling_a_run_cancels_the_sdk_agents_task() {
    let Some(server) = start("cancelling_a_run_cancels_the_sdk_agents_task") else {
        return;
    };
    let url = format!("{}/slow", server.url);
    let slow = remote_agent("slow", &url);
    let request = request("child-3", "a long job");
    let sink = CancelOnText {
        events: VecSink::new(),
        cancel: request.cancel.clone(),
    };
    let outcome = backend()
        .run(&slow, request, &sink)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcome.termination, TerminationReason::Cancelled);
    // The remote task of the thread's context is canceled.
    let body = reqwest::Client::new()
        .get(format!("{url}/tasks?contextId=thread-1"))
        .header("A2A-Version", "1.0")
        .send()
        .await
        .unwrap_or_else(|e| panic!("list tasks: {e}"))
        .bytes()
        .await
        .unwrap_or_else(|e| panic!("list tasks: {e}"));
    let listed: Value = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("list tasks: {e}"));
    let states: Vec<&Value> = listed["tasks"]
        .as_array()
        .map(|tasks| tasks.iter().map(|t| &t["status"]["state"]).collect())
        .unwrap_or_default();
    assert_eq!(states, [&Value::from("TASK_STATE_CANCELED")], "{listed}");
}
