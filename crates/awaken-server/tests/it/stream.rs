//! A run streamed over HTTP: its events are well formed, numbered as the store numbers them,
//! replayed the same from `/events`, answered as an outcome with `?stream=false`, and the same
//! as what the runtime emits in process.

use awaken_event::{AgentEvent, StopReason, ToolCallResume};
use awaken_llm::LlmStreamEvent;
use awaken_runtime::{Resume, RunActivation};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

/// A step that says something and calls `echo`, then an answer in two deltas, then a second
/// run's answer.
fn two_steps() -> Vec<Vec<Piece>> {
    let mut first = vec![text("Looking")];
    first.extend(call("c1", "echo", json!({"text": "a"})));
    first.push(stop(StopReason::ToolCalls));
    vec![first, text_turn(&["Do", "ne"]), text_turn(&["Second"])]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_run_is_numbered_as_stored_and_replayed_alike() {
    let rig = Rig::memory(two_steps()).with_ids(Ids::Sequential);
    let server = TestServer::start(rig.runtime(), config()).await;
    let sse = server.start_run("t", "hi").await;
    assert_eq!(
        sse.headers
            .get("cache-control")
            .and_then(|v| v.to_str().ok()),
        Some("no-cache")
    );
    let frames = sse.rest().await;
    let events = checked_live(&frames);
    expect_test::expect![[r#"
        1 run_start resumed=false
        2@1 step_start 1
        2.1@1 text_delta "Looking"
        3@1 tool_call_start c1 echo
        3.1@1 tool_call_args_delta c1 {"text":"a"}
        4@1 inference_complete
        5@1 tool_call_ready c1 {"text":"a"}
        6 tool_call_done c1 succeeded {"echoed":"a"}
        7 step_end 1
        8@1 step_start 2
        8.1@1 text_delta "Do"
        8.2@1 text_delta "ne"
        9@1 inference_complete
        10 step_end 2
        11 run_finish natural_end response=Some("Done")
    "#]]
    .assert_eq(&render(&events));
    // The stored events are the store's, under the numbers it keeps them under.
    assert_eq!(stored_only(&events), rig.store.stored("t").await);

    // A replay from the start while the server still holds the run: the same frames.
    let replay = server.events_after("t", "0").await.rest().await;
    assert_eq!(replay, frames);
    // From a stored event in the middle, from an event sent before its commit (its id tagged),
    // and from a delta: the frames after it.
    let done = frames
        .iter()
        .position(|f| f.is("tool_call_done"))
        .expect("the call's result");
    let ready = frames
        .iter()
        .position(|f| f.is("tool_call_ready"))
        .expect("the call");
    let delta = frames
        .iter()
        .position(|f| f.is_text("Do"))
        .expect("the answer");
    for at in [done, ready, delta] {
        let id = frames[at].id.clone().expect("an id");
        let tail = server.events_after("t", &id).await.rest().await;
        assert_eq!(tail, frames[at + 1..], "after {id}");
        let tail = server.reconnect("t", &id).await.rest().await;
        assert_eq!(tail, frames[at + 1..], "Last-Event-ID {id}");
    }

    // A server on the same store that never ran it replays the stored events alone, with the
    // same ids and data (untagged: all are stored), and answers the same positions.
    let other = TestServer::start(Rig::on(rig.store.clone(), Vec::new()).runtime(), config()).await;
    assert_eq!(
        other.events_after("t", "0").await.rest().await,
        stored_frames(&frames)
    );
    for at in [done, ready, delta] {
        let id = frames[at].id.clone().expect("an id");
        assert_eq!(
            other.reconnect("t", &id).await.rest().await,
            stored_frames(&frames[at + 1..]),
            "the stored events after {id}"
        );
    }

    // The thread as stored.
    let thread: Value = server
        .get("/v1/threads/t")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(thread["last_event_seq"], 11);
    assert_eq!(thread["live"], false);
    assert_eq!(thread["waiting"], json!([]));
    assert_eq!(thread["runs"][0]["status"], "done");

    // `?stream=false` answers the outcome once the run ended.
    let response = server
        .post(
            "/v1/threads/t2/runs?stream=false",
            json!({"message": "again"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let outcome: Value = response.json().await.expect("JSON");
    expect_test::expect![[r#"{"response":"Second","run_id":"run-2","steps":1,"termination":{"kind":"natural_end"},"usage":{"input_tokens":0,"output_tokens":0}}"#]]
    .assert_eq(&outcome.to_string());
    let record = rig.store.last_run("t2").await;
    assert_eq!(outcome["run_id"], record.run_id.as_str());
    assert_eq!(record.status.as_str(), "done");
    let stored = rig.store.stored("t2").await;
    assert!(
        matches!(stored.last(), Some((_, AgentEvent::RunFinish { .. }))),
        "the outcome came after the run's end was stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_and_threads_are_listed() {
    let rig = Rig::memory(vec![text_turn(&["Hello"])]);
    let server = TestServer::start(rig.runtime(), config()).await;
    let agents: Value = server.get("/v1/agents").await.json().await.expect("JSON");
    assert_eq!(agents["agents"][0]["id"], "agent");
    let tools: Vec<&str> = agents["agents"][0]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["id"].as_str().expect("id"))
        .collect();
    assert_eq!(tools.len(), 3, "{tools:?}");
    for id in ["echo", "guarded", "count"] {
        assert!(tools.contains(&id), "{tools:?}");
    }
    let agent: Value = server
        .get("/v1/agents/agent")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(agent["description"], "The test agent");
    assert_eq!(agent, agents["agents"][0]);

    server.start_run("t", "hi").await.rest().await;
    let threads: Value = server.get("/v1/threads").await.json().await.expect("JSON");
    assert_eq!(threads["threads"].as_array().map(Vec::len), Some(1));
    assert_eq!(threads["threads"][0]["thread_id"], "t");
    assert_eq!(threads["threads"][0]["message_count"], 2);
    assert_eq!(threads["threads"][0]["live"], false);
}

/// A step with reasoning, text and a guarded call that suspends; after the approval, an
/// answer.
fn suspending() -> Vec<Vec<Piece>> {
    let mut first = vec![
        Piece::Event(LlmStreamEvent::ReasoningDelta("think".into())),
        text("Checking"),
    ];
    first.extend(call("c1", "guarded", json!({"text": "a"})));
    first.push(stop(StopReason::ToolCalls));
    vec![first, text_turn(&["Do", "ne"])]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_streams_what_the_runtime_emits_in_process() {
    // Over HTTP: a run that suspends, then the approval.
    let served = Rig::memory(suspending()).with_ids(Ids::Sequential);
    let server = TestServer::start(served.runtime(), config()).await;
    let first = server.start_run("t", "hi").await.rest().await;
    let first = checked_live(&first);
    let response = server
        .post(
            "/v1/threads/t/decisions",
            json!({"decisions": [{"call_id": "c1", "decision": "approve"}]}),
        )
        .await;
    let second = Sse::new(response).await.rest().await;
    let second = checked_live(&second);

    // In process, on a runtime built the same way.
    let local = Rig::memory(suspending()).with_ids(Ids::Sequential);
    let runtime = local.runtime();
    let recording = Recording::default();
    runtime
        .run(
            RunActivation::new(tid("t"), "agent").with_user_message("hi"),
            &recording,
        )
        .await
        .expect("the run starts");
    let local_first = recording.ids();
    let ticket = runtime
        .waiting_calls(&tid("t"))
        .await
        .expect("read")
        .remove(0);
    runtime
        .resume(
            Resume::new(tid("t")).with_decision(ToolCallResume::approve(&ticket.call)),
            &recording,
        )
        .await
        .expect("resumed");
    let local_second = recording.ids();

    expect_test::expect![[r#"
        1 run_start resumed=false
        2@1 step_start 1
        2.1@1 reasoning_delta
        2.2@1 text_delta "Checking"
        3@1 tool_call_start c1 guarded
        3.1@1 tool_call_args_delta c1 {"text":"a"}
        4@1 inference_complete
        5@1 tool_call_ready c1 {"text":"a"}
        6 tool_call_suspended c1
        7 step_end 1
        8 run_finish suspended response=Some("Checking")
    "#]]
    .assert_eq(&render(&first));
    expect_test::expect![[r#"
        9 run_start resumed=true
        10@9 step_start 2
        11@9 tool_call_resumed c1 Approve
        12@9 tool_call_ready c1 {"text":"a"}
        13 tool_call_done c1 succeeded {"echoed":"a"}
        14 step_end 2
        15@9 step_start 3
        15.1@9 text_delta "Do"
        15.2@9 text_delta "ne"
        16@9 inference_complete
        17 step_end 3
        18 run_finish natural_end response=Some("Done")
    "#]]
    .assert_eq(&render(&second));
    // The same events under the same ids, tagged where the runtime had not stored them when it
    // emitted them.
    assert_eq!(normalised(&first), normalised(&local_first));
    assert_eq!(normalised(&second), normalised(&local_second));
    // And both stores hold the same log.
    assert_eq!(
        normalised(&served.store.stored("t").await),
        normalised(&local.store.stored("t").await)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_is_shown_as_one_commit_left_it_even_when_its_runs_are_read_before_it() {
    let mut answer = vec![Piece::Hold];
    answer.extend(text_turn(&["Done"]));
    let rig = Rig::memory(vec![answer]).with_ids(Ids::Sequential);
    let server = TestServer::start(rig.runtime(), config()).await;
    let sse = server.start_run("t", "hi").await;
    rig.model.wait_holds(1).await;
    // The runs as they were while the run went on; then the run ends.
    rig.store.freeze_runs("t").await;
    rig.model.release(1);
    let frames = sse.rest().await;
    assert!(frames.iter().any(|f| f.is("run_finish")));
    let thread: Value = server
        .get("/v1/threads/t")
        .await
        .json()
        .await
        .expect("JSON");
    // The messages and the latest run record come from one read of the store.
    assert_eq!(thread["runs"][0]["status"], "done", "{thread}");
    assert_eq!(
        thread["messages"][1]["content"][0]["text"], "Done",
        "{thread}"
    );
}
