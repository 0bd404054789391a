//! The AG-UI edge (`POST /v1/ag-ui/agents/{agent}/run`): scripted runs through the translator
//! with their wire output pinned, every stream checked against the protocol's ordering rules,
//! an interrupt answered by a resume, a failing model, and the refusals of bad input.

use std::collections::BTreeSet;
use std::sync::Arc;

use awaken_llm::{ScriptTurn, ScriptedError, ScriptedErrorKind, ScriptedExecutor};
use awaken_runtime::AgentRuntime;
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_store::MemoryStore;
use expect_test::{Expect, expect};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

/// The input of a new run of `text` on `thread` as client run `run`.
fn input(thread: &str, run: &str, text: &str) -> Value {
    json!({
        "threadId": thread,
        "runId": run,
        "messages": [
            {"id": "u0", "role": "user", "content": "an earlier question"},
            {"id": "a0", "role": "assistant", "content": "an earlier answer"},
            {"id": "u1", "role": "user", "content": [{"type": "text", "text": text}]},
        ],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
    })
}

/// Posts `body` to the AG-UI route of `agent`.
async fn post(server: &TestServer, agent: &str, body: &Value) -> reqwest::Response {
    let path = format!("/v1/ag-ui/agents/{agent}/run");
    guarded(
        "an AG-UI request",
        server
            .client
            .post(server.url(&path))
            .header("accept", "text/event-stream")
            .json(body)
            .send(),
    )
    .await
    .expect("request")
}

/// Runs `body` on `agent` and returns the AG-UI events of the stream, checked.
async fn run(server: &TestServer, agent: &str, body: &Value) -> Vec<Value> {
    let frames = Sse::new(post(server, agent, body).await).await.rest().await;
    let events: Vec<Value> = frames
        .iter()
        .map(|f| {
            assert_eq!((f.id.as_deref(), f.event.as_deref()), (None, None), "{f:?}");
            serde_json::from_str(&f.data).unwrap_or_else(|e| panic!("not JSON ({e}): {f:?}"))
        })
        .collect();
    check_agui(&events);
    events
}

/// The fields each event type must carry (AG-UI 1.0's schemas), as strings unless noted.
fn required(ty: &str) -> &'static [&'static str] {
    match ty {
        "RUN_STARTED" | "RUN_FINISHED" => &["threadId", "runId"],
        "RUN_ERROR" => &["message"],
        "STEP_STARTED" | "STEP_FINISHED" => &["stepName"],
        "TEXT_MESSAGE_START" | "TEXT_MESSAGE_END" => &["messageId"],
        "TEXT_MESSAGE_CONTENT" | "REASONING_MESSAGE_CONTENT" => &["messageId", "delta"],
        "REASONING_START" | "REASONING_END" | "REASONING_MESSAGE_END" => &["messageId"],
        "REASONING_MESSAGE_START" => &["messageId", "role"],
        "TOOL_CALL_START" => &["toolCallId", "toolCallName"],
        "TOOL_CALL_ARGS" => &["toolCallId", "delta"],
        "TOOL_CALL_END" => &["toolCallId"],
        "TOOL_CALL_RESULT" => &["messageId", "toolCallId", "content"],
        "CUSTOM" => &["name"],
        "STATE_SNAPSHOT" | "STATE_DELTA" | "MESSAGES_SNAPSHOT" => &[],
        other => panic!("an event type this edge does not send: {other}"),
    }
}

/// Checks `events` as strictly as the protocol's verifier (`verifyEvents` of `@ag-ui/client`):
/// `RUN_STARTED` (or `RUN_ERROR`) first; nothing after `RUN_FINISHED` or `RUN_ERROR`; a text
/// message, reasoning span, reasoning message, tool call or step opened once, continued and
/// closed only while open, and all closed at `RUN_FINISHED`; and each event's required fields.
fn check_agui(events: &[Value]) {
    let fail = |what: String| -> ! { panic!("{what}\n{events:#?}") };
    let mut open: [BTreeSet<String>; 5] = Default::default();
    let [text, reasoning, spans, calls, steps] = &mut open;
    let mut ended = false;
    for (i, e) in events.iter().enumerate() {
        let ty = e["type"]
            .as_str()
            .unwrap_or_else(|| fail(format!("#{i} has no type")));
        if ended {
            fail(format!("#{i} {ty} after the run ended"));
        }
        if i == 0 && ty != "RUN_STARTED" && ty != "RUN_ERROR" {
            fail(format!("the first event is {ty}"));
        }
        if i > 0 && ty == "RUN_STARTED" {
            fail(format!("#{i}: a second RUN_STARTED in one run"));
        }
        for field in required(ty) {
            if !e[field]
                .as_str()
                .is_some_and(|s| !s.is_empty() || *field == "delta")
            {
                fail(format!("#{i} {ty} lacks the string `{field}`"));
            }
        }
        let key = |field: &str| e[field].as_str().unwrap_or_default().to_owned();
        let (set, id, opens, closes) = match ty {
            "TEXT_MESSAGE_START" => (&mut *text, key("messageId"), true, false),
            "TEXT_MESSAGE_CONTENT" => (&mut *text, key("messageId"), false, false),
            "TEXT_MESSAGE_END" => (&mut *text, key("messageId"), false, true),
            "REASONING_MESSAGE_START" => (&mut *reasoning, key("messageId"), true, false),
            "REASONING_MESSAGE_CONTENT" => (&mut *reasoning, key("messageId"), false, false),
            "REASONING_MESSAGE_END" => (&mut *reasoning, key("messageId"), false, true),
            "REASONING_START" => (&mut *spans, key("messageId"), true, false),
            "REASONING_END" => (&mut *spans, key("messageId"), false, true),
            "TOOL_CALL_START" => (&mut *calls, key("toolCallId"), true, false),
            "TOOL_CALL_ARGS" => (&mut *calls, key("toolCallId"), false, false),
            "TOOL_CALL_END" => (&mut *calls, key("toolCallId"), false, true),
            "STEP_STARTED" => (&mut *steps, key("stepName"), true, false),
            "STEP_FINISHED" => (&mut *steps, key("stepName"), false, true),
            "RUN_FINISHED" => {
                for (name, set) in ["text", "reasoning", "span", "call", "step"].iter().zip([
                    &*text,
                    &*reasoning,
                    &*spans,
                    &*calls,
                    &*steps,
                ]) {
                    if !set.is_empty() {
                        fail(format!("RUN_FINISHED with {name} {set:?} open"));
                    }
                }
                check_outcome(e);
                ended = true;
                continue;
            }
            "RUN_ERROR" => {
                ended = true;
                continue;
            }
            "TOOL_CALL_RESULT" => {
                if e["role"] != "tool" {
                    fail(format!("#{i} TOOL_CALL_RESULT's role is not `tool`"));
                }
                continue;
            }
            _ => continue,
        };
        if opens && !set.insert(id.clone()) {
            fail(format!("#{i} {ty} opens {id}, which is open"));
        }
        if !opens && !set.contains(&id) {
            fail(format!("#{i} {ty} on {id}, which is not open"));
        }
        if closes {
            set.remove(&id);
        }
    }
    if !ended {
        fail("the stream ended before the run did".into());
    }
}

/// A `RUN_FINISHED` outcome as the schema has it: success, cancelled, or an interrupt with at
/// least one interrupt, each with an `id` and a `reason`.
fn check_outcome(finished: &Value) {
    match finished["outcome"]["type"].as_str() {
        Some("success" | "cancelled") => {}
        Some("interrupt") => {
            let interrupts = finished["outcome"]["interrupts"]
                .as_array()
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| panic!("an interrupt outcome without interrupts: {finished}"));
            for i in interrupts {
                assert!(
                    i["id"].is_string() && i["reason"].is_string(),
                    "an interrupt needs an id and a reason: {i}"
                );
            }
        }
        _ => panic!("RUN_FINISHED without a known outcome: {finished}"),
    }
}

/// One line per event: its type and the fields that tell it apart (ids, text, outcome).
fn render(events: &[Value]) -> String {
    let mut out = String::new();
    for e in events {
        let mut line = e["type"].as_str().unwrap_or("?").to_owned();
        for key in [
            "threadId",
            "runId",
            "stepName",
            "name",
            "messageId",
            "role",
            "toolCallId",
            "toolCallName",
            "parentMessageId",
            "delta",
            "content",
            "result",
            "code",
            "message",
        ] {
            match &e[key] {
                Value::Null => {}
                Value::String(s) => line.push_str(&format!(" {key}={s:?}")),
                v => line.push_str(&format!(" {key}={v}")),
            }
        }
        if let Some(outcome) = e.get("outcome") {
            line.push_str(&format!(" outcome={}", outcome["type"]));
            for i in outcome["interrupts"].as_array().into_iter().flatten() {
                let m = &i["metadata"];
                line.push_str(&format!(
                    " interrupt({} {} {:?} tool={} args={})",
                    i["id"], i["reason"], i["message"], m["toolName"], m["arguments"]
                ));
            }
        }
        if let Some(messages) = e["messages"].as_array() {
            for m in messages {
                line.push_str(&format!("\n  {m}"));
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn pin(events: &[Value], expected: Expect) {
    expected.assert_eq(&render(events));
}

/// A server of the test rig's runtime (agent `agent`, `echo` and `guarded` behind approval).
async fn rig_server(turns: Vec<Vec<Piece>>) -> (Rig, TestServer) {
    let rig = Rig::memory(turns);
    let server = TestServer::start(rig.runtime(), config()).await;
    (rig, server)
}

#[tokio::test]
async fn text_and_tool_call_runs_translate_as_pinned() {
    let mut call_then_text = call_turn("c1", "echo", json!({"text": "hi"}));
    call_then_text.insert(0, text("Calling. "));
    let (_rig, server) = rig_server(vec![
        text_turn(&["Hel", "", "lo"]),
        call_then_text,
        text_turn(&["Echoed."]),
    ])
    .await;

    let events = run(&server, "agent", &input("t-text", "run-a", "Say hello")).await;
    pin(
        &events,
        expect![[r#"
        RUN_STARTED threadId="t-text" runId="run-a"
        STEP_STARTED stepName="step-1"
        TEXT_MESSAGE_START messageId="run-a-m1" role="assistant"
        TEXT_MESSAGE_CONTENT messageId="run-a-m1" delta="Hel"
        TEXT_MESSAGE_CONTENT messageId="run-a-m1" delta="lo"
        TEXT_MESSAGE_END messageId="run-a-m1"
        STEP_FINISHED stepName="step-1"
        RUN_FINISHED threadId="t-text" runId="run-a" result="Hello" outcome="success"
    "#]],
    );

    let events = run(&server, "agent", &input("t-tool", "run-b", "Echo hi")).await;
    pin(
        &events,
        expect![[r#"
        RUN_STARTED threadId="t-tool" runId="run-b"
        STEP_STARTED stepName="step-1"
        TEXT_MESSAGE_START messageId="run-b-m1" role="assistant"
        TEXT_MESSAGE_CONTENT messageId="run-b-m1" delta="Calling. "
        TEXT_MESSAGE_END messageId="run-b-m1"
        TOOL_CALL_START toolCallId="c1" toolCallName="echo" parentMessageId="run-b-m1"
        TOOL_CALL_ARGS toolCallId="c1" delta="{\"text\":\"hi\"}"
        TOOL_CALL_END toolCallId="c1"
        TOOL_CALL_RESULT messageId="c1-result" role="tool" toolCallId="c1" content="{\"echoed\":\"hi\"}"
        STEP_FINISHED stepName="step-1"
        STEP_STARTED stepName="step-2"
        TEXT_MESSAGE_START messageId="run-b-m2" role="assistant"
        TEXT_MESSAGE_CONTENT messageId="run-b-m2" delta="Echoed."
        TEXT_MESSAGE_END messageId="run-b-m2"
        STEP_FINISHED stepName="step-2"
        RUN_FINISHED threadId="t-tool" runId="run-b" result="Echoed." outcome="success"
    "#]],
    );
}

#[tokio::test]
async fn an_interrupt_is_answered_by_a_resume_and_the_run_goes_on() {
    let (rig, server) = rig_server(vec![
        call_turn("c2", "guarded", json!({"text": "x"})),
        text_turn(&["Done."]),
        call_turn("c3", "guarded", json!({"text": "y"})),
        text_turn(&["Not done."]),
    ])
    .await;

    let events = run(&server, "agent", &input("t-wait", "run-c", "Guard x")).await;
    pin(
        &events,
        expect![[r#"
        RUN_STARTED threadId="t-wait" runId="run-c"
        STEP_STARTED stepName="step-1"
        TOOL_CALL_START toolCallId="c2" toolCallName="guarded" parentMessageId="run-c-m1"
        TOOL_CALL_ARGS toolCallId="c2" delta="{\"text\":\"x\"}"
        TOOL_CALL_END toolCallId="c2"
        STEP_FINISHED stepName="step-1"
        RUN_FINISHED threadId="t-wait" runId="run-c" outcome="interrupt" interrupt("c2" "tool_approval" String("Run guarded with {\"text\":\"x\"}?") tool="guarded" args={"text":"x"})
    "#]],
    );
    let finished = events.last().expect("events");
    let interrupt = &finished["outcome"]["interrupts"][0];
    let digest = interrupt["metadata"]["argumentDigest"].clone();
    assert!(
        digest.as_str().is_some_and(|d| !d.is_empty()),
        "{interrupt}"
    );

    // The resume sends the client's messages again; only `resume` is read.
    let mut resume = input("t-wait", "run-d", "Guard x");
    resume["resume"] = json!([{
        "interruptId": "c2",
        "status": "resolved",
        "payload": {"approved": true},
        "metadata": {"argumentDigest": digest},
    }]);
    let events = run(&server, "agent", &resume).await;
    pin(
        &events,
        expect![[r#"
        RUN_STARTED threadId="t-wait" runId="run-d"
        MESSAGES_SNAPSHOT
          {"content":"Guard x","id":"t-wait-0","role":"user"}
          {"id":"t-wait-1","role":"assistant","toolCalls":[{"function":{"arguments":"{\"text\":\"x\"}","name":"guarded"},"id":"c2","type":"function"}]}
        STEP_STARTED stepName="step-2"
        TOOL_CALL_RESULT messageId="c2-result" role="tool" toolCallId="c2" content="{\"echoed\":\"x\"}"
        STEP_FINISHED stepName="step-2"
        STEP_STARTED stepName="step-3"
        TEXT_MESSAGE_START messageId="run-d-m1" role="assistant"
        TEXT_MESSAGE_CONTENT messageId="run-d-m1" delta="Done."
        TEXT_MESSAGE_END messageId="run-d-m1"
        STEP_FINISHED stepName="step-3"
        RUN_FINISHED threadId="t-wait" runId="run-d" result="Done." outcome="success"
    "#]],
    );
    let thread: Value = server
        .get("/v1/threads/t-wait")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(thread["waiting"], json!([]), "{thread}");
    assert_eq!(
        thread["messages"].as_array().map(Vec::len),
        Some(4),
        "{thread}"
    );

    // A `cancelled` entry denies the call: it is closed as cancelled and the model is told.
    let events = run(&server, "agent", &input("t-deny", "run-e", "Guard y")).await;
    assert_eq!(
        events.last().expect("events")["outcome"]["interrupts"][0]["id"],
        "c3"
    );
    let mut deny = input("t-deny", "run-f", "Guard y");
    deny["resume"] = json!([{"interruptId": "c3", "status": "cancelled"}]);
    let events = run(&server, "agent", &deny).await;
    let result = events
        .iter()
        .find(|e| e["type"] == "TOOL_CALL_RESULT")
        .expect("the denied call's result");
    assert_eq!(result["toolCallId"], "c3");
    assert_eq!(events.last().expect("events")["result"], "Not done.");
    assert_eq!(rig.model.requests(), 4);
}

/// A runtime whose model fails its first inference with a permanent error.
fn failing_runtime() -> AgentRuntime {
    let turn = ScriptTurn {
        error: Some(ScriptedError {
            kind: ScriptedErrorKind::InvalidRequest,
            message: "the model refused the request".into(),
            retry_after_ms: None,
        }),
        ..ScriptTurn::text("Partial ")
    };
    let executor = ScriptedExecutor::from_turns([turn]).expect("script");
    AgentRuntime::builder()
        .with_store(Arc::new(MemoryStore::new()))
        .with_model(ModelSpec::new("model", "scripted", "scripted"))
        .with_provider("scripted", Arc::new(executor))
        .with_agent_spec(AgentSpec::new("agent", "model"))
        .build()
        .expect("runtime")
}

#[tokio::test]
async fn a_failing_model_ends_the_stream_with_run_error() {
    let server = TestServer::start(failing_runtime(), config()).await;
    let events = run(&server, "agent", &input("t-fail", "run-g", "Fail")).await;
    pin(
        &events,
        expect![[r#"
        RUN_STARTED threadId="t-fail" runId="run-g"
        STEP_STARTED stepName="step-1"
        TEXT_MESSAGE_START messageId="run-g-m1" role="assistant"
        TEXT_MESSAGE_CONTENT messageId="run-g-m1" delta="Partial "
        CUSTOM name="awaken.error"
        TEXT_MESSAGE_END messageId="run-g-m1"
        STEP_FINISHED stepName="step-1"
        RUN_ERROR code="run_failed" message="inference failed: the provider rejected the request (HTTP 400): the model refused the request"
    "#]],
    );
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field() {
    let (_rig, server) = rig_server(vec![]).await;
    let ok = input("t-bad", "run-h", "hi");
    let with = |key: &str, value: Value| {
        let mut body = ok.clone();
        match value {
            Value::Null => {
                body.as_object_mut().expect("object").remove(key);
            }
            v => body[key] = v,
        }
        body
    };
    let cases = [
        (
            "nobody",
            ok.clone(),
            StatusCode::NOT_FOUND,
            "unknown_agent",
            None,
        ),
        (
            "agent",
            json!([1]),
            StatusCode::BAD_REQUEST,
            "invalid_body",
            Some("body"),
        ),
        (
            "agent",
            with("threadId", Value::Null),
            StatusCode::BAD_REQUEST,
            "missing_field",
            Some("threadId"),
        ),
        (
            "agent",
            with("threadId", json!("bad id/")),
            StatusCode::BAD_REQUEST,
            "invalid_thread_id",
            Some("threadId"),
        ),
        (
            "agent",
            with("runId", json!(7)),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            Some("runId"),
        ),
        (
            "agent",
            with("messages", json!({})),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            Some("messages"),
        ),
        (
            "agent",
            with("messages", json!([{"content": "no role"}])),
            StatusCode::BAD_REQUEST,
            "invalid_message",
            Some("messages"),
        ),
        (
            "agent",
            with(
                "messages",
                json!([{"id": "a", "role": "assistant", "content": "hi"}]),
            ),
            StatusCode::BAD_REQUEST,
            "no_user_message",
            Some("messages"),
        ),
        (
            "agent",
            with(
                "messages",
                json!([{"id": "u", "role": "user", "content": [{"type": "text"}]}]),
            ),
            StatusCode::BAD_REQUEST,
            "invalid_message",
            Some("messages"),
        ),
        (
            "agent",
            with("tools", json!("all")),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            Some("tools"),
        ),
        (
            "agent",
            with("context", json!([3])),
            StatusCode::BAD_REQUEST,
            "invalid_field",
            Some("context"),
        ),
        (
            "agent",
            with("resume", json!([{"interruptId": "c9", "status": "maybe"}])),
            StatusCode::BAD_REQUEST,
            "invalid_resume",
            Some("resume"),
        ),
        (
            "agent",
            with("resume", json!([{"status": "resolved"}])),
            StatusCode::BAD_REQUEST,
            "invalid_resume",
            Some("resume"),
        ),
        // A resume of a thread that does not exist.
        (
            "agent",
            with(
                "resume",
                json!([{"interruptId": "c9", "status": "resolved"}]),
            ),
            StatusCode::NOT_FOUND,
            "unknown_thread",
            None,
        ),
    ];
    for (agent, body, status, code, field) in cases {
        let refused = refusal(post(&server, agent, &body).await).await;
        assert_eq!(
            refused,
            (status, code.to_owned(), field.map(str::to_owned)),
            "{body}"
        );
    }

    // A stream is the only answer.
    let response = guarded(
        "a request for JSON",
        server
            .client
            .post(server.url("/v1/ag-ui/agents/agent/run"))
            .header("accept", "application/json")
            .json(&ok)
            .send(),
    )
    .await
    .expect("request");
    assert_eq!(
        refusal(response).await,
        (
            StatusCode::NOT_ACCEPTABLE,
            "not_acceptable".to_owned(),
            None
        )
    );

    // A resume naming a call that does not wait, on a thread that waits for another.
    let (_rig, server) = rig_server(vec![call_turn("c4", "guarded", json!({"text": "z"}))]).await;
    let events = run(&server, "agent", &input("t-other", "run-i", "Guard z")).await;
    assert_eq!(
        events.last().expect("events")["outcome"]["type"],
        "interrupt"
    );
    let mut wrong = input("t-other", "run-j", "Guard z");
    wrong["resume"] = json!([{"interruptId": "c5", "status": "resolved"}]);
    let refused = refusal(post(&server, "agent", &wrong).await).await;
    assert_eq!(
        refused,
        (
            StatusCode::BAD_REQUEST,
            "unknown_call".to_owned(),
            Some("resume".to_owned())
        )
    );
}

/// The notes a run took: shown to clients.
struct Notes;

impl awaken_state::StateKey for Notes {
    const KEY: &'static str = "notes.items";
    type Value = Vec<String>;
    type Update = String;
    fn apply(value: &mut Vec<String>, note: String) -> Result<(), awaken_state::StateError> {
        value.push(note);
        Ok(())
    }
}

/// Registers [`Notes`] as a visible thread key and notes each step's start and end.
struct NoteTaker(awaken_plugin::PluginManifest);

impl awaken_plugin::Plugin for NoteTaker {
    fn manifest(&self) -> &awaken_plugin::PluginManifest {
        &self.0
    }
    fn register(
        &self,
        r: &mut awaken_plugin::PluginRegistrar,
    ) -> Result<(), awaken_plugin::PluginError> {
        use awaken_phase::{FnHook, Phase, PhaseContext};
        use awaken_state::{KeyOptions, KeyScope, StateCommand};
        r.register_key::<Notes>(
            KeyOptions::new()
                .with_scope(KeyScope::Thread)
                .with_visible(true),
        )?;
        for (phase, what) in [(Phase::StepStart, "start"), (Phase::StepEnd, "end")] {
            r.register_phase_hook(
                phase,
                what,
                Arc::new(FnHook(move |ctx: &PhaseContext| {
                    let note = format!("{what} {}", ctx.step);
                    Ok(StateCommand::new().with_update::<Notes>(note))
                })),
            )?;
        }
        Ok(())
    }
}

/// Applies a JSON Patch of top-level `add`, `replace` and `remove` operations (what the edge
/// sends for state keys) to `state`.
fn apply_patch(state: &mut Value, ops: &Value) {
    let state = state.as_object_mut().expect("the state is an object");
    for op in ops.as_array().expect("a patch is an array") {
        let path = op["path"].as_str().expect("a path");
        let key = path
            .strip_prefix('/')
            .filter(|k| !k.contains('/'))
            .unwrap_or_else(|| panic!("not a top-level path: {path}"))
            .replace("~1", "/")
            .replace("~0", "~");
        match op["op"].as_str() {
            Some("add") => {
                state.insert(key, op["value"].clone());
            }
            Some("replace") => {
                assert!(state.contains_key(&key), "replace of a missing {key}: {op}");
                state.insert(key, op["value"].clone());
            }
            Some("remove") => {
                assert!(
                    state.remove(&key).is_some(),
                    "remove of a missing {key}: {op}"
                );
            }
            _ => panic!("an operation this edge does not send: {op}"),
        }
    }
}

#[tokio::test]
async fn a_visible_state_key_streams_as_a_snapshot_and_patches() {
    let store = Arc::new(MemoryStore::new());
    let executor = ScriptedExecutor::from_turns([ScriptTurn::text("Noted.")]).expect("script");
    let runtime = AgentRuntime::builder()
        .with_store(store.clone())
        .with_model(ModelSpec::new("model", "scripted", "scripted"))
        .with_provider("scripted", Arc::new(executor))
        .with_plugin(Arc::new(NoteTaker(awaken_plugin::PluginManifest::new(
            "notes",
        ))))
        .with_agent_spec(AgentSpec::new("agent", "model").with_plugin("notes"))
        .build()
        .expect("runtime");
    let server = TestServer::start(runtime, config()).await;

    let events = run(&server, "agent", &input("t-state", "run-s", "Take notes")).await;
    let state_events: Vec<String> = events
        .iter()
        .filter(|e| matches!(e["type"].as_str(), Some("STATE_SNAPSHOT" | "STATE_DELTA")))
        .map(|e| e.to_string())
        .collect();
    expect![[r#"
        {"snapshot":{"notes.items":[]},"type":"STATE_SNAPSHOT"}
        {"delta":[{"op":"replace","path":"/notes.items","value":["start 1"]}],"type":"STATE_DELTA"}
        {"delta":[{"op":"replace","path":"/notes.items","value":["start 1","end 1"]}],"type":"STATE_DELTA"}"#]]
    .assert_eq(&state_events.join("\n"));
    // The snapshot comes right after RUN_STARTED, before the first step.
    assert_eq!(events[1]["type"], "STATE_SNAPSHOT", "{events:#?}");

    // The snapshot patched in order gives the value the thread kept.
    let mut state = events[1]["snapshot"].clone();
    for e in events.iter().filter(|e| e["type"] == "STATE_DELTA") {
        apply_patch(&mut state, &e["delta"]);
    }
    let thread = awaken_event::ThreadId::new("t-state").expect("id");
    let kept = awaken_store::ThreadStore::load_checkpoint(&*store, &thread)
        .await
        .expect("loads")
        .expect("stored")
        .thread_state
        .values;
    assert_eq!(state, json!({"notes.items": kept["notes.items"]}));
    assert_eq!(state, json!({"notes.items": ["start 1", "end 1"]}));
}
