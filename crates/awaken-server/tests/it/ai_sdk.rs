//! The AI SDK edge: `useChat`'s requests become runs and decisions, and the runs stream as UI
//! message chunks (`data: {chunk}`, closed by `data: [DONE]`); the resume route replays a live
//! activation from its start.

use awaken_event::StopReason;
use awaken_llm::LlmStreamEvent;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

const CHAT: &str = "/v1/ai-sdk/chat";

/// A `useChat` body whose last message is a user message of `text` on chat `id`.
fn user_message(id: &str, text: &str) -> Value {
    json!({
        "id": id,
        "trigger": "submit-message",
        "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]}],
    })
}

/// A `useChat` body answering the approval of `call` on chat `id` with `approved`.
fn approval_response(id: &str, message_id: &str, call: &str, approved: bool) -> Value {
    json!({
        "id": id,
        "trigger": "submit-message",
        "messages": [
            {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "go"}]},
            {"id": message_id, "role": "assistant", "parts": [
                {"type": "step-start"},
                {
                    "type": "tool-guarded",
                    "toolCallId": call,
                    "state": "approval-responded",
                    "input": {"text": "x"},
                    "approval": {"id": call, "approved": approved, "reason": "not now"},
                },
            ]},
        ],
    })
}

/// The chunks of a UI message stream response, each as its `data` text; checks the stream's
/// headers and that it ends with `[DONE]` and nothing after.
async fn chunks(response: reqwest::Response) -> Vec<String> {
    let sse = Sse::new(response).await;
    assert_eq!(
        sse.headers
            .get("x-vercel-ai-ui-message-stream")
            .and_then(|v| v.to_str().ok()),
        Some("v1"),
        "{:?}",
        sse.headers
    );
    let frames = sse.rest().await;
    let data: Vec<String> = frames
        .iter()
        .map(|f| {
            assert_eq!((&f.id, &f.event), (&None, &None), "data only: {f:?}");
            f.data.clone()
        })
        .collect();
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "ends with [DONE]"
    );
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1);
    data
}

/// The chunks one per line, with the run id and the message id (which is the run id) shown
/// as `RUN`; checks that every block started is ended, in order, before `finish` or `error`.
fn render(chunks: &[String]) -> String {
    let mut run = None;
    let mut open: Vec<String> = Vec::new();
    let mut out = String::new();
    for c in chunks {
        if c == "[DONE]" {
            out.push_str("[DONE]\n");
            continue;
        }
        let value: Value = serde_json::from_str(c).unwrap_or_else(|e| panic!("JSON ({e}): {c}"));
        let kind = value["type"].as_str().expect("a type").to_owned();
        if kind == "start" {
            run = value["messageId"].as_str().map(str::to_owned);
        }
        let id = value["id"].as_str().unwrap_or_default();
        match kind.as_str() {
            "text-start" | "reasoning-start" => open.push(id.to_owned()),
            "start-step" => open.push("step".to_owned()),
            "text-end" | "reasoning-end" => {
                assert_eq!(
                    open.pop().as_deref(),
                    Some(id),
                    "{kind} ends the open block"
                )
            }
            "finish-step" => assert_eq!(open.pop().as_deref(), Some("step"), "{chunks:#?}"),
            "text-delta" | "reasoning-delta" => {
                assert_eq!(
                    open.last().map(String::as_str),
                    Some(id),
                    "{kind} in its block"
                )
            }
            "finish" | "error" => assert!(open.is_empty(), "{open:?} open at {kind}"),
            _ => {}
        }
        let mut line = c.clone();
        if let Some(run) = &run {
            line = line.replace(run.as_str(), "RUN");
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

async fn chat(server: &TestServer, body: Value) -> String {
    render(&chunks(server.post(CHAT, body).await).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_stream_as_ui_message_chunks() {
    let rig = Rig::memory(vec![
        // Reasoning, then text in two deltas.
        vec![
            Piece::Event(LlmStreamEvent::ReasoningDelta("Thinking.".into())),
            text("Hel"),
            text("lo."),
            stop(StopReason::EndTurn),
        ],
        // A call with its output, then the answer.
        call_turn("c1", "echo", json!({"text": "a"})),
        text_turn(&["Echoed."]),
        // A call that fails (its arguments miss `text`), then the answer.
        call_turn("c2", "echo", json!({})),
        text_turn(&["It failed."]),
        // A model stream that breaks off: the run fails.
        vec![text("Par")],
    ]);
    let server = TestServer::start(rig.runtime(), config()).await;

    expect_test::expect![[r#"
        {"messageId":"RUN","messageMetadata":{"runId":"RUN","threadId":"text"},"type":"start"}
        {"type":"start-step"}
        {"id":"reasoning-1","type":"reasoning-start"}
        {"delta":"Thinking.","id":"reasoning-1","type":"reasoning-delta"}
        {"id":"reasoning-1","type":"reasoning-end"}
        {"id":"text-2","type":"text-start"}
        {"delta":"Hel","id":"text-2","type":"text-delta"}
        {"delta":"lo.","id":"text-2","type":"text-delta"}
        {"id":"text-2","type":"text-end"}
        {"type":"finish-step"}
        {"finishReason":"stop","messageMetadata":{"runId":"RUN","termination":{"kind":"natural_end"},"threadId":"text","usage":{"input_tokens":0,"output_tokens":0}},"type":"finish"}
        [DONE]
    "#]]
    .assert_eq(&chat(&server, user_message("text", "hi")).await);
    expect_test::expect![[r#"
        {"messageId":"RUN","messageMetadata":{"runId":"RUN","threadId":"tool"},"type":"start"}
        {"type":"start-step"}
        {"toolCallId":"c1","toolName":"echo","type":"tool-input-start"}
        {"inputTextDelta":"{\"text\":\"a\"}","toolCallId":"c1","type":"tool-input-delta"}
        {"input":{"text":"a"},"toolCallId":"c1","toolName":"echo","type":"tool-input-available"}
        {"output":{"echoed":"a"},"toolCallId":"c1","type":"tool-output-available"}
        {"type":"finish-step"}
        {"type":"start-step"}
        {"id":"text-1","type":"text-start"}
        {"delta":"Echoed.","id":"text-1","type":"text-delta"}
        {"id":"text-1","type":"text-end"}
        {"type":"finish-step"}
        {"finishReason":"stop","messageMetadata":{"runId":"RUN","termination":{"kind":"natural_end"},"threadId":"tool","usage":{"input_tokens":0,"output_tokens":0}},"type":"finish"}
        [DONE]
    "#]]
    .assert_eq(&chat(&server, user_message("tool", "echo a")).await);
    expect_test::expect![[r#"
        {"messageId":"RUN","messageMetadata":{"runId":"RUN","threadId":"tool-error"},"type":"start"}
        {"type":"start-step"}
        {"toolCallId":"c2","toolName":"echo","type":"tool-input-start"}
        {"inputTextDelta":"{}","toolCallId":"c2","type":"tool-input-delta"}
        {"input":{},"toolCallId":"c2","toolName":"echo","type":"tool-input-available"}
        {"errorText":"invalid arguments for tool `echo`: at (root): \"text\" is a required property","toolCallId":"c2","type":"tool-output-error"}
        {"type":"finish-step"}
        {"type":"start-step"}
        {"id":"text-1","type":"text-start"}
        {"delta":"It failed.","id":"text-1","type":"text-delta"}
        {"id":"text-1","type":"text-end"}
        {"type":"finish-step"}
        {"finishReason":"stop","messageMetadata":{"runId":"RUN","termination":{"kind":"natural_end"},"threadId":"tool-error","usage":{"input_tokens":0,"output_tokens":0}},"type":"finish"}
        [DONE]
    "#]]
    .assert_eq(&chat(&server, user_message("tool-error", "echo nothing")).await);
    expect_test::expect![[r#"
        {"messageId":"RUN","messageMetadata":{"runId":"RUN","threadId":"failing"},"type":"start"}
        {"type":"start-step"}
        {"id":"text-1","type":"text-start"}
        {"delta":"Par","id":"text-1","type":"text-delta"}
        {"id":"text-1","type":"text-end"}
        {"type":"finish-step"}
        {"errorText":"inference failed: the response stream was interrupted: the stream ended without a stop event","type":"error"}
        [DONE]
    "#]]
    .assert_eq(&chat(&server, user_message("failing", "break")).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_comes_back_as_a_ui_message() {
    let rig = Rig::memory(vec![
        call_turn("c1", "guarded", json!({"text": "x"})),
        text_turn(&["Done."]),
        call_turn("c1", "guarded", json!({"text": "x"})),
        text_turn(&["Not done."]),
    ]);
    let server = TestServer::start(rig.runtime(), config()).await;

    for (thread, approved) in [("approved", true), ("denied", false)] {
        let asked = chunks(server.post(CHAT, user_message(thread, "go")).await).await;
        let start: Value = serde_json::from_str(&asked[0]).expect("JSON");
        let message_id = start["messageId"]
            .as_str()
            .expect("a message id")
            .to_owned();
        expect_test::expect![[r#"
            {"messageId":"RUN","messageMetadata":{"runId":"RUN","threadId":"THREAD"},"type":"start"}
            {"type":"start-step"}
            {"toolCallId":"c1","toolName":"guarded","type":"tool-input-start"}
            {"inputTextDelta":"{\"text\":\"x\"}","toolCallId":"c1","type":"tool-input-delta"}
            {"input":{"text":"x"},"toolCallId":"c1","toolName":"guarded","type":"tool-input-available"}
            {"approvalId":"c1","reason":"Run guarded with {\"text\":\"x\"}?","toolCallId":"c1","type":"tool-approval-request"}
            {"type":"finish-step"}
            {"finishReason":"tool-calls","messageMetadata":{"runId":"RUN","termination":{"kind":"suspended"},"threadId":"THREAD","usage":{"input_tokens":0,"output_tokens":0}},"type":"finish"}
            [DONE]
        "#]]
        .assert_eq(&render(&asked).replace(thread, "THREAD"));
        let answered = server
            .post(CHAT, approval_response(thread, &message_id, "c1", approved))
            .await;
        let answered = chunks(answered).await;
        let start: Value = serde_json::from_str(&answered[0]).expect("JSON");
        assert_eq!(
            start["messageId"].as_str(),
            Some(message_id.as_str()),
            "the continuation is the same assistant message"
        );
        let expected = if approved {
            expect_test::expect![[r#"
                {"messageId":"RUN","messageMetadata":{"runId":"RUN","threadId":"approved"},"type":"start"}
                {"type":"start-step"}
                {"output":{"echoed":"x"},"toolCallId":"c1","type":"tool-output-available"}
                {"type":"finish-step"}
                {"type":"start-step"}
                {"id":"text-1","type":"text-start"}
                {"delta":"Done.","id":"text-1","type":"text-delta"}
                {"id":"text-1","type":"text-end"}
                {"type":"finish-step"}
                {"finishReason":"stop","messageMetadata":{"runId":"RUN","termination":{"kind":"natural_end"},"threadId":"approved","usage":{"input_tokens":0,"output_tokens":0}},"type":"finish"}
                [DONE]
            "#]]
        } else {
            expect_test::expect![[r#"
                {"messageId":"RUN","messageMetadata":{"runId":"RUN","threadId":"denied"},"type":"start"}
                {"type":"start-step"}
                {"toolCallId":"c1","type":"tool-output-denied"}
                {"type":"finish-step"}
                {"type":"start-step"}
                {"id":"text-1","type":"text-start"}
                {"delta":"Not done.","id":"text-1","type":"text-delta"}
                {"id":"text-1","type":"text-end"}
                {"type":"finish-step"}
                {"finishReason":"stop","messageMetadata":{"runId":"RUN","termination":{"kind":"natural_end"},"threadId":"denied","usage":{"input_tokens":0,"output_tokens":0}},"type":"finish"}
                [DONE]
            "#]]
        };
        expected.assert_eq(&render(&answered));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_it_cannot_map_are_refused() {
    let rig = Rig::memory(vec![text_turn(&["Hi."])]);
    let server = TestServer::start(rig.runtime(), config()).await;
    let cases = [
        (
            json!({"id": "t", "trigger": "regenerate-message", "messageId": "m2", "messages": []}),
            (StatusCode::BAD_REQUEST, "regenerate_unsupported", "trigger"),
        ),
        (
            json!({"id": "t", "trigger": "submit-message", "messages": []}),
            (StatusCode::BAD_REQUEST, "no_messages", "messages"),
        ),
        (
            user_message("t", "  "),
            (StatusCode::BAD_REQUEST, "empty_message", "messages"),
        ),
        (
            user_message("not a thread id!", "hi"),
            (StatusCode::BAD_REQUEST, "invalid_thread_id", "id"),
        ),
        (
            json!({"id": "t", "messages": [{"id": "a", "role": "assistant", "parts": [{"type": "text", "text": "x"}]}]}),
            (StatusCode::BAD_REQUEST, "no_approval_responses", "messages"),
        ),
    ];
    for (body, (status, code, field)) in cases {
        let refused = refusal(server.post(CHAT, body.clone()).await).await;
        assert_eq!(
            refused,
            (status, code.to_owned(), Some(field.to_owned())),
            "{body}"
        );
    }
    // An approval on a thread that waits for none.
    let done = chunks(server.post(CHAT, user_message("t", "hi")).await).await;
    assert!(done.iter().any(|c| c.contains(r#""finishReason":"stop""#)));
    let refused = refusal(
        server
            .post(CHAT, approval_response("t", "m", "c1", true))
            .await,
    )
    .await;
    assert_eq!(refused.0, StatusCode::CONFLICT);
    assert_eq!(refused.1, "not_waiting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resume_route_replays_a_live_run_from_its_start() {
    let rig = Rig::memory(vec![vec![
        text("One, "),
        Piece::Hold,
        text("two."),
        stop(StopReason::EndTurn),
    ]]);
    let server = TestServer::start(rig.runtime(), config()).await;
    let resume = |thread: &str| format!("{CHAT}/{thread}/stream");

    // Nothing in flight: 204, for an unknown thread too.
    assert_eq!(
        server.get(&resume("live")).await.status(),
        StatusCode::NO_CONTENT
    );

    let posted = server.post(CHAT, user_message("live", "count")).await;
    let mut posted = Sse::new(posted).await;
    let first = posted.until(|f| f.data.contains("One, ")).await;
    rig.model.wait_holds(1).await;
    // The live run's stream, from its start: the first delta is in it.
    let resumed = server.get(&resume("live")).await;
    assert_eq!(resumed.status(), StatusCode::OK);
    let mut resumed = Sse::new(resumed).await;
    let before = resumed.until(|f| f.data.contains("One, ")).await;
    assert!(before[0].data.contains(r#""type":"start""#), "{before:?}");
    rig.model.release(1);
    let replayed: Vec<String> = before
        .into_iter()
        .chain(resumed.rest().await)
        .map(|f| f.data)
        .collect();
    let whole: Vec<String> = first
        .into_iter()
        .chain(posted.rest().await)
        .map(|f| f.data)
        .collect();
    expect_test::expect![[r#"
        {"messageId":"RUN","messageMetadata":{"runId":"RUN","threadId":"live"},"type":"start"}
        {"type":"start-step"}
        {"id":"text-1","type":"text-start"}
        {"delta":"One, ","id":"text-1","type":"text-delta"}
        {"delta":"two.","id":"text-1","type":"text-delta"}
        {"id":"text-1","type":"text-end"}
        {"type":"finish-step"}
        {"finishReason":"stop","messageMetadata":{"runId":"RUN","termination":{"kind":"natural_end"},"threadId":"live","usage":{"input_tokens":0,"output_tokens":0}},"type":"finish"}
        [DONE]
    "#]]
    .assert_eq(&render(&replayed));
    assert_eq!(replayed, whole, "the resumed stream is the posted one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_the_message_with_an_error() {
    let rig = Rig::memory(vec![vec![
        text("Before "),
        Piece::Hold,
        text("after."),
        stop(StopReason::EndTurn),
    ]]);
    let mut server = TestServer::start(rig.runtime(), config()).await;
    let posted = server.post(CHAT, user_message("closing", "go")).await;
    let mut posted = Sse::new(posted).await;
    posted.until(|f| f.data.contains("Before ")).await;
    rig.model.wait_holds(1).await;
    server.begin_shutdown();
    // The open text block and step are ended before the error.
    let rest: Vec<String> = posted.rest().await.into_iter().map(|f| f.data).collect();
    expect_test::expect![[r#"
        {"id":"text-1","type":"text-end"}
        {"type":"finish-step"}
        {"errorText":"the server is shutting down; the run goes on from its last checkpoint when it restarts","type":"error"}
        [DONE]
    "#]]
    .assert_eq(&(rest.join("\n") + "\n"));
    rig.model.release(1);
}
