//! The A2A edge (`/a2a/{agent}/...`, HTTP+JSON binding, v1.0): the cards, a blocking and a
//! streamed send with their wire output pinned (the stream's order checked: the task first,
//! then updates, exactly one final status), get and list, cancel and subscribe on a held run,
//! an answer at once (`returnImmediately`), a call waiting for approval answered by a yes and by
//! a denial, and the typed refusals.

use awaken_event::StopReason;
use expect_test::expect;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

/// A client's message of `text` in context `context` (and task `task`, if given).
fn message(text: &str, context: &str, task: Option<&str>) -> Value {
    let mut m = json!({
        "messageId": format!("m-{context}-{text}"),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
        "contextId": context,
    });
    if let Some(task) = task {
        m["taskId"] = task.into();
    }
    m
}

/// POSTs `body` to `/a2a/agent{path}` as the SDK does (with `A2A-Version: 1.0`).
async fn post(server: &TestServer, path: &str, body: &Value) -> reqwest::Response {
    guarded(
        path,
        server
            .client
            .post(server.url(&format!("/a2a/agent{path}")))
            .header("A2A-Version", "1.0")
            .json(body)
            .send(),
    )
    .await
    .expect("request")
}

/// GETs `/a2a/agent{path}` with `A2A-Version: 1.0`.
async fn get(server: &TestServer, path: &str) -> reqwest::Response {
    guarded(
        path,
        server
            .client
            .get(server.url(&format!("/a2a/agent{path}")))
            .header("A2A-Version", "1.0")
            .send(),
    )
    .await
    .expect("request")
}

/// A 200 answer's JSON.
async fn json_of(response: reqwest::Response) -> Value {
    let status = response.status();
    let body: Value = guarded("a JSON body", response.json())
        .await
        .expect("a JSON body");
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// Sends `message` blocking; the task answered.
async fn send(server: &TestServer, message: Value) -> Value {
    let answer = json_of(post(server, "/message:send", &json!({"message": message})).await).await;
    answer
        .get("task")
        .cloned()
        .unwrap_or_else(|| panic!("a task: {answer}"))
}

/// `value`'s JSON with the task id shown as `TASK` and timestamps as `TIME`.
fn shown(value: &Value, task: &str) -> String {
    let mut value = value.clone();
    blank_timestamps(&mut value);
    value.to_string().replace(task, "TASK")
}

fn blank_timestamps(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if k == "timestamp" {
                    *v = "TIME".into();
                } else {
                    blank_timestamps(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(blank_timestamps),
        _ => {}
    }
}

/// The stream responses of an A2A stream, checked: plain `data` frames, the task first, then
/// updates of that task only, exactly one final status (last) when `ended`.
async fn responses(sse: Sse) -> Vec<Value> {
    let responses = rest_of(sse).await;
    check_stream(&responses);
    responses
}

/// The rest of an A2A stream's responses (plain `data` frames), unchecked.
async fn rest_of(sse: Sse) -> Vec<Value> {
    sse.rest()
        .await
        .iter()
        .map(|f| {
            assert_eq!((f.id.as_deref(), f.event.as_deref()), (None, None), "{f:?}");
            serde_json::from_str(&f.data).unwrap_or_else(|e| panic!("not JSON ({e}): {f:?}"))
        })
        .collect()
}

/// The stream's order: the task, then its updates, the last a final status and no other.
fn check_stream(responses: &[Value]) {
    let Some(task) = responses.first().and_then(|r| r.get("task")) else {
        panic!("the stream opens with the task: {responses:#?}");
    };
    let id = task["id"].as_str().expect("a task id");
    let is_final = |r: &Value| {
        r["statusUpdate"]["status"]["state"]
            .as_str()
            .is_some_and(|s| {
                !matches!(
                    s,
                    "TASK_STATE_WORKING" | "TASK_STATE_SUBMITTED" | "TASK_STATE_UNSPECIFIED"
                )
            })
    };
    for r in &responses[1..] {
        let update = r
            .get("statusUpdate")
            .or_else(|| r.get("artifactUpdate"))
            .unwrap_or_else(|| panic!("an update: {r}"));
        assert_eq!(update["taskId"], id, "{r}");
        assert_eq!(update["contextId"], task["contextId"], "{r}");
    }
    let finals = responses.iter().filter(|r| is_final(r)).count();
    assert_eq!(finals, 1, "exactly one final status: {responses:#?}");
    assert!(
        responses.last().is_some_and(is_final),
        "the final status ends the stream"
    );
}

/// A stream as lines: `task STATE`, `status STATE: text`, `artifact [append] [last]: text`.
fn stream_log(responses: &[Value]) -> String {
    let texts = |parts: &Value| -> String {
        parts
            .as_array()
            .map(|ps| {
                ps.iter()
                    .map(|p| match (p.get("text"), p.get("data")) {
                        (Some(t), _) => t.as_str().unwrap_or_default().to_owned(),
                        (_, Some(d)) => d.to_string(),
                        _ => p.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(" | ")
            })
            .unwrap_or_default()
    };
    let mut out = String::new();
    for r in responses {
        let line = if let Some(t) = r.get("task") {
            format!(
                "task {} history={}",
                t["status"]["state"].as_str().unwrap_or_default(),
                t["history"].as_array().map_or(0, Vec::len)
            )
        } else if let Some(s) = r.get("statusUpdate") {
            let status = &s["status"];
            format!(
                "status {}: {}",
                status["state"].as_str().unwrap_or_default(),
                texts(&status["message"]["parts"])
            )
        } else if let Some(a) = r.get("artifactUpdate") {
            format!(
                "artifact {}{}{}: {}",
                a["artifact"]["artifactId"].as_str().unwrap_or_default(),
                if a["append"] == true { " append" } else { "" },
                if a["lastChunk"] == true { " last" } else { "" },
                texts(&a["artifact"]["parts"])
            )
        } else {
            format!("other {r}")
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

async fn rig_server(turns: Vec<Vec<Piece>>) -> (Rig, TestServer) {
    let rig = Rig::memory(turns);
    let server = TestServer::start(rig.runtime(), config()).await;
    (rig, server)
}

#[tokio::test]
async fn cards_name_the_agent_its_interface_and_its_tools() {
    let (_rig, server) = rig_server(Vec::new()).await;
    let host = json_of(server.get("/.well-known/agent-card.json").await).await;
    let own = json_of(server.get("/a2a/agent/.well-known/agent-card.json").await).await;
    assert_eq!(host, own, "the host's card is its only agent's");
    let card = own.to_string().replace(&server.base, "BASE");
    expect![[r#"{"capabilities":{"pushNotifications":false,"streaming":true},"defaultInputModes":["text/plain","application/json"],"defaultOutputModes":["text/plain","application/json"],"description":"The test agent","name":"agent","skills":[{"description":"The test agent","id":"agent","name":"agent","tags":["agent"]},{"description":"Echo text","id":"tool:echo","name":"echo","tags":["tool"]},{"description":"Echo text","id":"tool:guarded","name":"guarded","tags":["tool"]},{"description":"Counts its executions","id":"tool:count","name":"count","tags":["tool"]}],"supportedInterfaces":[{"protocolBinding":"HTTP+JSON","protocolVersion":"1.0","url":"BASE/a2a/agent"}],"version":"0.1.0"}"#]]
        .assert_eq(&card);
    let missing = server.get("/a2a/nobody/.well-known/agent-card.json").await;
    assert_eq!(a2a_refusal(missing).await, (404, "METHOD_NOT_FOUND".into()));
}

#[tokio::test]
async fn send_answers_the_completed_task_which_get_and_list_show() {
    let (_rig, server) = rig_server(vec![
        text_turn(&["Hello", " there."]),
        text_turn(&["Again."]),
    ])
    .await;
    let task = send(&server, message("hi", "t-send", None)).await;
    let id = task["id"].as_str().expect("an id").to_owned();
    expect![[r#"{"artifacts":[{"artifactId":"TASK-answer","name":"answer","parts":[{"text":"Hello there."}]}],"contextId":"t-send","history":[{"contextId":"t-send","messageId":"m-t-send-hi","parts":[{"text":"hi"}],"role":"ROLE_USER","taskId":"TASK"}],"id":"TASK","status":{"message":{"contextId":"t-send","messageId":"TASK-completed","parts":[{"text":"Hello there."}],"role":"ROLE_AGENT","taskId":"TASK"},"state":"TASK_STATE_COMPLETED","timestamp":"TIME"}}"#]]
        .assert_eq(&shown(&task, &id));

    // The task as stored is the answer's, without the history.
    let got = json_of(get(&server, &format!("/tasks/{id}")).await).await;
    let mut answered = task.clone();
    answered
        .as_object_mut()
        .expect("an object")
        .remove("history");
    assert_eq!(got, answered);

    // A second message in the context is a second task, listed first.
    let second = send(&server, message("more", "t-send", None)).await;
    assert_ne!(second["id"], task["id"]);
    let listed = json_of(get(&server, "/tasks?contextId=t-send").await).await;
    let ids: Vec<&Value> = listed["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| &t["id"])
        .collect();
    assert_eq!(ids, [&second["id"], &task["id"]], "{listed}");
    assert_eq!(listed["totalSize"], 2);
    assert_eq!(listed["nextPageToken"], "");
    assert!(
        listed["tasks"][0].get("artifacts").is_none(),
        "artifacts only when asked for: {listed}"
    );
    let paged = json_of(
        get(
            &server,
            "/tasks?contextId=t-send&pageSize=1&includeArtifacts=true",
        )
        .await,
    )
    .await;
    assert_eq!(paged["tasks"][0]["id"], second["id"]);
    assert_eq!(
        paged["tasks"][0]["artifacts"][0]["parts"][0]["text"],
        "Again."
    );
    assert_eq!(paged["nextPageToken"], "1");
    let completed = json_of(get(&server, "/tasks?status=TASK_STATE_CANCELED").await).await;
    assert_eq!(completed["tasks"], json!([]), "{completed}");
}

#[tokio::test]
async fn a_message_sent_again_finds_its_task_and_runs_once() {
    // One scripted answer: a second run would find the model's script empty and fail.
    let (_rig, server) = rig_server(vec![text_turn(&["Once."])]).await;
    let first = send(&server, message("hi", "t-again", None)).await;
    assert_eq!(first["status"]["state"], "TASK_STATE_COMPLETED", "{first}");
    let again = send(&server, message("hi", "t-again", None)).await;
    assert_eq!(again["id"], first["id"], "{again}");
    assert_eq!(again["status"]["state"], "TASK_STATE_COMPLETED", "{again}");
    // Streamed again: the task as it ended, alone.
    let streamed = rest_of(
        Sse::new(
            post(
                &server,
                "/message:stream",
                &json!({"message": message("hi", "t-again", None)}),
            )
            .await,
        )
        .await,
    )
    .await;
    assert_eq!(streamed.len(), 1, "{streamed:?}");
    assert_eq!(streamed[0]["task"]["id"], first["id"]);
    let listed = json_of(get(&server, "/tasks?contextId=t-again").await).await;
    assert_eq!(listed["totalSize"], 1, "{listed}");
    // The same message id in another context is another message.
    let other = post(
        &server,
        "/message:send",
        &json!({"message": message("hi", "t-other", None)}),
    )
    .await;
    assert_ne!(json_of(other).await["id"], first["id"]);
}

#[tokio::test]
async fn a_context_id_is_made_when_absent() {
    let (_rig, server) = rig_server(vec![text_turn(&["Hi."])]).await;
    let mut m = message("hi", "unused", None);
    m.as_object_mut().expect("an object").remove("contextId");
    let task = send(&server, m).await;
    let context = task["contextId"].as_str().expect("a context id");
    assert!(!context.is_empty());
    // The context is the run's thread.
    let thread = json_of(server.get(&format!("/v1/threads/{context}")).await).await;
    assert_eq!(thread["runs"][0]["run_id"], task["id"], "{thread}");
}

#[tokio::test]
async fn stream_sends_the_task_then_updates_then_one_final_status() {
    let mut call_then_text = call_turn("c1", "echo", json!({"text": "hi"}));
    call_then_text.insert(0, text("Calling. "));
    let (_rig, server) = rig_server(vec![call_then_text, text_turn(&["Hel", "lo."])]).await;
    let response = post(
        &server,
        "/message:stream",
        &json!({"message": message("hi", "t-stream", None)}),
    )
    .await;
    let responses = responses(Sse::new(response).await).await;
    let id = responses[0]["task"]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    expect![[r#"
        task TASK_STATE_SUBMITTED history=1
        status TASK_STATE_WORKING: 
        artifact TASK-answer: Calling. 
        artifact TASK-answer: Hel
        artifact TASK-answer append: lo.
        artifact TASK-answer last: Hello.
        status TASK_STATE_COMPLETED: Hello.
    "#]]
    .assert_eq(&stream_log(&responses).replace(&id, "TASK"));
    // The stored task agrees with the stream's end.
    let got = json_of(get(&server, &format!("/tasks/{id}")).await).await;
    assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(got["artifacts"][0]["parts"][0]["text"], "Hello.");
}

#[tokio::test]
async fn a_failing_model_fails_the_task_with_its_error() {
    // (No turn that ends: the held model's stream ends without a stop, which fails the step.)
    let (_rig, server) = rig_server(vec![vec![text("Hal")]]).await;
    let task = send(&server, message("hi", "t-fail", None)).await;
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{task}");
    let said = task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(!said.is_empty(), "the error is said: {task}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_a_held_task_canceled() {
    let (rig, server) = rig_server(vec![held()]).await;
    let response = post(
        &server,
        "/message:stream",
        &json!({"message": message("hi", "t-cancel", None)}),
    )
    .await;
    let mut sse = Sse::new(response).await;
    let first = sse.next().await.expect("the task");
    let task: Value = serde_json::from_str(&first.data).expect("JSON");
    let id = task["task"]["id"].as_str().expect("an id").to_owned();
    rig.model.wait_holds(1).await;

    let canceled =
        json_of(post(&server, &format!("/tasks/{id}:cancel"), &json!({"id": id})).await).await;
    assert_eq!(
        canceled["status"]["state"], "TASK_STATE_CANCELED",
        "{canceled}"
    );
    let mut all = vec![task];
    all.extend(rest_of(sse).await);
    check_stream(&all);
    let log = stream_log(&all).replace(&id, "TASK");
    expect![[r#"
        task TASK_STATE_SUBMITTED history=1
        status TASK_STATE_WORKING: 
        artifact TASK-answer: Hel
        status TASK_STATE_CANCELED: the run was cancelled
    "#]]
    .assert_eq(&log);

    // A canceled task cannot be canceled again, nor followed.
    let again = post(&server, &format!("/tasks/{id}:cancel"), &json!({})).await;
    assert_eq!(
        a2a_refusal(again).await,
        (400, "TASK_NOT_CANCELABLE".into())
    );
    let follow = post(&server, &format!("/tasks/{id}:subscribe"), &json!({})).await;
    assert_eq!(
        a2a_refusal(follow).await,
        (400, "UNSUPPORTED_OPERATION".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_follows_a_live_task_to_its_end() {
    let (rig, server) = rig_server(vec![vec![
        text("Hel"),
        Piece::Hold,
        text("lo."),
        stop(StopReason::EndTurn),
    ]])
    .await;
    let response = post(
        &server,
        "/message:stream",
        &json!({"message": message("hi", "t-sub", None)}),
    )
    .await;
    let mut sse = Sse::new(response).await;
    let first = sse.next().await.expect("the task");
    let task: Value = serde_json::from_str(&first.data).expect("JSON");
    let id = task["task"]["id"].as_str().expect("an id").to_owned();
    rig.model.wait_holds(1).await;

    let follow = guarded(
        "a subscription",
        server
            .client
            .get(server.url(&format!("/a2a/agent/tasks/{id}:subscribe")))
            .send(),
    )
    .await
    .expect("request");
    // (The subscription is attached once its answer began.)
    let followed = Sse::new(follow).await;
    rig.model.release(1);
    let all = responses(followed).await;
    expect![[r#"
        task TASK_STATE_WORKING history=0
        status TASK_STATE_WORKING: 
        artifact TASK-answer: Hel
        artifact TASK-answer append: lo.
        artifact TASK-answer last: Hello.
        status TASK_STATE_COMPLETED: Hello.
    "#]]
    .assert_eq(&stream_log(&all).replace(&id, "TASK"));
    let mut own = vec![task];
    own.extend(rest_of(sse).await);
    check_stream(&own);
    assert_eq!(
        own.last(),
        all.last(),
        "both streams end with the same status"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn return_immediately_answers_the_working_task_at_once() {
    let (rig, server) = rig_server(vec![vec![
        text("Hel"),
        Piece::Hold,
        text("lo."),
        stop(StopReason::EndTurn),
    ]])
    .await;
    let body = json!({
        "message": message("hi", "t-now", None),
        "configuration": {"returnImmediately": true},
    });
    let answer = json_of(post(&server, "/message:send", &body).await).await;
    let task = &answer["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_WORKING", "{answer}");
    let id = task["id"].as_str().expect("an id").to_owned();
    rig.model.wait_holds(1).await;
    // Followed to its end once the model goes on.
    let follow = post(&server, &format!("/tasks/{id}:subscribe"), &json!({})).await;
    let followed = Sse::new(follow).await;
    rig.model.release(1);
    let all = responses(followed).await;
    assert_eq!(
        all.last().map(|r| &r["statusUpdate"]["status"]["state"]),
        Some(&json!("TASK_STATE_COMPLETED"))
    );
    let got = json_of(get(&server, &format!("/tasks/{id}")).await).await;
    assert_eq!(got["artifacts"][0]["parts"][0]["text"], "Hello.", "{got}");
}

/// The turns of a run that asks to run `guarded`, then answers `Done.` (or `Not done.` after
/// a denial, which the model sees as the call's result).
fn guarded_turns(after: &str) -> Vec<Vec<Piece>> {
    let mut ask = call_turn("c1", "guarded", json!({"text": "x"}));
    ask.insert(0, text("Asking. "));
    vec![ask, text_turn(&[after])]
}

#[tokio::test]
async fn a_waiting_call_is_input_required_and_a_yes_continues_the_task() {
    let (_rig, server) = rig_server(guarded_turns("Done.")).await;
    let task = send(&server, message("go", "t-yes", None)).await;
    let id = task["id"].as_str().expect("an id").to_owned();
    expect![[r#"{"contextId":"t-yes","history":[{"contextId":"t-yes","messageId":"m-t-yes-go","parts":[{"text":"go"}],"role":"ROLE_USER","taskId":"TASK"}],"id":"TASK","status":{"message":{"contextId":"t-yes","messageId":"TASK-input-required","parts":[{"text":"Run guarded with {\"text\":\"x\"}? (call `c1` of `guarded`)"},{"data":{"answer_with":{"decisions":[{"approve":true,"call_id":"c1"}]},"waiting":[{"argument_digest":"DIGEST","arguments":{"text":"x"},"call_id":"c1","message":"Run guarded with {\"text\":\"x\"}?","tool":"guarded"}]}}],"role":"ROLE_AGENT","taskId":"TASK"},"state":"TASK_STATE_INPUT_REQUIRED","timestamp":"TIME"}}"#]]
        .assert_eq(&shown(&task, &id).replace(
            task["status"]["message"]["parts"][1]["data"]["waiting"][0]["argument_digest"]
                .as_str()
                .expect("a digest"),
            "DIGEST",
        ));
    let listed = json_of(get(&server, "/tasks?status=TASK_STATE_INPUT_REQUIRED").await).await;
    assert_eq!(listed["tasks"][0]["id"], task["id"], "{listed}");

    // Another text while the call waits is refused, saying how to answer.
    let other = post(
        &server,
        "/message:send",
        &json!({"message": message("what?", "t-yes", Some(&id))}),
    )
    .await;
    assert_eq!(a2a_refusal(other).await, (400, "INVALID_PARAMS".into()));

    let done = send(&server, message("yes", "t-yes", Some(&id))).await;
    assert_eq!(done["id"], task["id"], "the same task goes on");
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    assert_eq!(done["artifacts"][0]["parts"][0]["text"], "Done.");
    let thread = json_of(server.get("/v1/threads/t-yes").await).await;
    assert!(
        thread["messages"].to_string().contains("echoed"),
        "the approved call ran: {thread}"
    );
}

#[tokio::test]
async fn a_denial_by_data_part_continues_the_task_without_the_call() {
    let (_rig, server) = rig_server(guarded_turns("Not done.")).await;
    let response = post(
        &server,
        "/message:stream",
        &json!({"message": message("go", "t-no", None)}),
    )
    .await;
    let responses1 = responses(Sse::new(response).await).await;
    let id = responses1[0]["task"]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let log = stream_log(&responses1).replace(&id, "TASK");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("status TASK_STATE_INPUT_REQUIRED: Run guarded with"),
        "{log}"
    );
    assert_eq!(
        responses1.last().map(
            |r| &r["statusUpdate"]["status"]["message"]["parts"][1]["data"]["waiting"][0]["call_id"]
        ),
        Some(&json!("c1")),
        "the waiting call is named"
    );

    let deny = json!({"message": {
        "messageId": "m-deny",
        "role": "ROLE_USER",
        "contextId": "t-no",
        "taskId": id,
        "parts": [{"data": {"decisions": [{"call_id": "c1", "approve": false}]}}],
    }});
    let response = post(&server, "/message:stream", &deny).await;
    let responses2 = responses(Sse::new(response).await).await;
    expect![[r#"
        task TASK_STATE_WORKING history=1
        status TASK_STATE_WORKING: 
        artifact TASK-answer: Not done.
        artifact TASK-answer last: Not done.
        status TASK_STATE_COMPLETED: Not done.
    "#]]
    .assert_eq(&stream_log(&responses2).replace(&id, "TASK"));
    let thread = json_of(server.get("/v1/threads/t-no").await).await;
    assert!(
        !thread["messages"].to_string().contains("echoed"),
        "the denied call never ran: {thread}"
    );
}

/// A refusal as `(status, reason)`, after checking the binding's error body.
async fn a2a_refusal(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: Value = guarded("an error body", response.json())
        .await
        .expect("a JSON body");
    let error = &body["error"];
    assert_eq!(error["code"], status, "{body}");
    assert!(
        error["status"].as_str().is_some_and(|s| !s.is_empty()),
        "{body}"
    );
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    let info = &error["details"][0];
    assert_eq!(
        info["@type"], "type.googleapis.com/google.rpc.ErrorInfo",
        "{body}"
    );
    assert_eq!(info["domain"], "a2a-protocol.org", "{body}");
    (
        status,
        info["reason"].as_str().expect("a reason").to_owned(),
    )
}

#[tokio::test]
async fn refusals_are_typed_with_their_status() {
    let (_rig, server) = rig_server(vec![text_turn(&["Done."])]).await;
    let finished = send(&server, message("hi", "t-done", None)).await;
    let finished_id = finished["id"].as_str().expect("an id").to_owned();
    let url = |p: &str| server.url(&format!("/a2a/agent{p}"));
    let c = &server.client;
    let hi = json!({"message": message("hi", "t-r", None)});
    let cases: Vec<(&str, reqwest::RequestBuilder)> = vec![
        ("unknown task", c.get(url("/tasks/run-nope"))),
        ("cancel an unknown task", c.post(url("/tasks/run-nope:cancel"))),
        ("malformed JSON", c.post(url("/message:send")).header("content-type", "application/json").body("{")),
        ("no message", c.post(url("/message:send")).json(&json!({}))),
        ("an agent's role", c.post(url("/message:send")).json(&json!({"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "hi"}]}}))),
        ("a file part", c.post(url("/message:send")).json(&json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"url": "https://example.invalid/a.png"}]}}))),
        ("a decision nothing waits for", c.post(url("/message:send")).json(&json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"data": {"decisions": [{"call_id": "c1", "approve": true}]}}]}}))),
        ("a text body", c.post(url("/message:send")).header("content-type", "text/plain").body("hi")),
        ("version 0.3", c.post(url("/message:send")).header("A2A-Version", "0.3").json(&hi)),
        ("version 2.0", c.get(url("/tasks")).header("A2A-Version", "2.0")),
        ("push notifications", c.post(url("/message:send")).json(&json!({"message": message("hi", "t-r", None), "configuration": {"taskPushNotificationConfig": {"url": "https://example.invalid/hook"}}}))),
        ("a message on a finished task", c.post(url("/message:send")).json(&json!({"message": message("more", "t-done", Some(&finished_id))}))),
        ("cancel a finished task", c.post(url(&format!("/tasks/{finished_id}:cancel")))),
        ("an unknown action", c.post(url(&format!("/tasks/{finished_id}:pause")))),
        ("an unknown page token", c.get(url("/tasks?pageToken=x"))),
        ("an unknown agent", c.post(server.url("/a2a/nobody/message:send")).json(&hi)),
        ("an unknown operation", c.get(url("/nothing"))),
    ];
    let mut out = String::new();
    for (what, request) in cases {
        let response = guarded(what, request.send()).await.expect("request");
        let (status, reason) = a2a_refusal(response).await;
        out.push_str(&format!("{what}: {status} {reason}\n"));
    }
    expect![[r#"
        unknown task: 404 TASK_NOT_FOUND
        cancel an unknown task: 404 TASK_NOT_FOUND
        malformed JSON: 400 INVALID_REQUEST
        no message: 400 INVALID_PARAMS
        an agent's role: 400 INVALID_PARAMS
        a file part: 400 CONTENT_TYPE_NOT_SUPPORTED
        a decision nothing waits for: 400 INVALID_PARAMS
        a text body: 415 CONTENT_TYPE_NOT_SUPPORTED
        version 0.3: 400 VERSION_NOT_SUPPORTED
        version 2.0: 400 VERSION_NOT_SUPPORTED
        push notifications: 400 PUSH_NOTIFICATION_NOT_SUPPORTED
        a message on a finished task: 400 UNSUPPORTED_OPERATION
        cancel a finished task: 400 TASK_NOT_CANCELABLE
        an unknown action: 404 METHOD_NOT_FOUND
        an unknown page token: 400 INVALID_PARAMS
        an unknown agent: 404 METHOD_NOT_FOUND
        an unknown operation: 404 METHOD_NOT_FOUND
    "#]]
    .assert_eq(&out);
}

#[tokio::test]
async fn the_servers_token_guards_the_a2a_routes() {
    let rig = Rig::memory(Vec::new());
    let server = TestServer::start(
        rig.runtime(),
        awaken_server::ServerConfig {
            auth_token: Some("secret".into()),
            ..config()
        },
    )
    .await;
    let card = server.get("/.well-known/agent-card.json").await;
    assert_eq!(a2a_refusal(card).await, (401, "INVALID_REQUEST".into()));
    let with_token = guarded(
        "a card",
        server
            .client
            .get(server.url("/.well-known/agent-card.json"))
            .bearer_auth("secret")
            .send(),
    )
    .await
    .expect("request");
    let card = json_of(with_token).await;
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"], "Bearer",
        "{card}"
    );
    let tasks = get(&server, "/tasks").await;
    assert_eq!(a2a_refusal(tasks).await, (401, "INVALID_REQUEST".into()));
}
