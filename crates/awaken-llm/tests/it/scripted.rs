//! The scripted executor: order, exhaustion, errors, deltas, waiting until cancelled, files,
//! the turn played after a refused tool call.

use std::time::Duration;

use awaken_event::{Message, TokenUsage, ToolCall, ToolCallId, ToolResult, ToolResultStatus};
use awaken_llm::{
    CancellableStream, InferenceExecutionError, InferenceRequest, LlmExecutor, LlmStreamEvent,
    Script, ScriptError, ScriptToolCall, ScriptTurn, ScriptedError, ScriptedErrorKind,
    ScriptedExecutor,
};
use expect_test::expect;
use futures_util::{FutureExt, StreamExt};

use crate::{render_error, render_response, render_stream, request};

fn three_turns() -> ScriptedExecutor {
    ScriptedExecutor::from_turns([
        ScriptTurn::text("first").with_usage(TokenUsage {
            input_tokens: 3,
            output_tokens: 1,
            ..TokenUsage::default()
        }),
        ScriptTurn::deltas(["sec", "ond"]).with_reasoning("hmm"),
        ScriptTurn::tool_call("search", serde_json::json!({"q": "rust"}))
            .with_tool_call(ScriptToolCall::new("echo", serde_json::json!({})).with_id("my-id")),
    ])
    .expect("valid script")
}

#[tokio::test]
async fn turns_play_in_order_and_requests_are_recorded() {
    let exec = three_turns();
    let mut out = String::new();
    for prompt in ["a", "b", "c"] {
        out.push_str(&render_stream(exec.execute_stream(request(prompt))).await);
        out.push_str("--\n");
    }
    expect![[r#"
        text "first"
        usage in=3 out=1 cached=0 reasoning=0
        stop EndTurn
        --
        reasoning "hmm"
        text "sec"
        text "ond"
        stop EndTurn
        --
        call_start #0 call_3_0 search
        call_args #0 "{\"q\":\"rust\"}"
        call_start #1 my-id echo
        call_args #1 "{}"
        stop ToolCalls
        --
    "#]]
    .assert_eq(&out);
    let prompts: Vec<String> = exec
        .requests()
        .iter()
        .map(|r| r.messages[0].text())
        .collect();
    assert_eq!(prompts, ["a", "b", "c"]);
    assert_eq!(exec.remaining(), 0);
}

#[tokio::test]
async fn replay_is_deterministic_and_execute_collects() {
    let mut runs = Vec::new();
    for _ in 0..2 {
        let exec = three_turns();
        let mut out = String::new();
        for _ in 0..3 {
            match exec.execute(request("x")).await {
                Ok(r) => out.push_str(&render_response(&r)),
                Err(e) => out.push_str(&render_error(&e)),
            }
        }
        runs.push(out);
    }
    assert_eq!(runs[0], runs[1]);
    expect![[r#"
        stop=EndTurn usage in=3 out=1
        block {"type":"text","text":"first"}
        stop=EndTurn usage in=0 out=0
        block {"type":"reasoning","text":"hmm"}
        block {"type":"text","text":"second"}
        stop=ToolCalls usage in=0 out=0
        call call_3_0 search {"q":"rust"} raw=None
        call my-id echo {} raw=None
    "#]]
    .assert_eq(&runs[0]);
}

#[tokio::test]
async fn an_exhausted_script_is_a_distinct_error() {
    let exec = ScriptedExecutor::from_turns([ScriptTurn::text("only")]).expect("valid");
    assert!(exec.execute(request("1")).await.is_ok());
    let err = exec.execute(request("2")).await.err();
    assert!(
        matches!(
            err,
            Some(InferenceExecutionError::ScriptExhausted { turns: 1 })
        ),
        "{err:?}"
    );
    assert_eq!(
        exec.requests().len(),
        2,
        "the call past the end is recorded too"
    );
    let again = exec.execute(request("3")).await.err();
    assert!(matches!(
        again,
        Some(InferenceExecutionError::ScriptExhausted { .. })
    ));
}

#[tokio::test]
async fn scripted_errors_come_with_their_class() {
    let exec = ScriptedExecutor::from_turns([
        ScriptTurn::error(
            ScriptedError::new(ScriptedErrorKind::RateLimited)
                .with_retry_after(Duration::from_millis(250)),
        ),
        ScriptTurn::deltas(["par", "tial"]).with_error(ScriptedError {
            kind: ScriptedErrorKind::StreamInterrupted,
            message: "cut".into(),
            retry_after_ms: None,
        }),
        ScriptTurn::error(ScriptedError::new(ScriptedErrorKind::ContextOverflow)),
    ])
    .expect("valid");
    let first = exec.execute(request("x")).await.err();
    assert_eq!(
        first.as_ref().and_then(|e| e.retry_after()),
        Some(Duration::from_millis(250))
    );
    let mut out = render_stream(exec.execute_stream(request("x"))).await;
    out.push_str(&render_stream(exec.execute_stream(request("x"))).await);
    expect![[r#"
        text "par"
        text "tial"
        error Retryable StreamInterrupted: the response stream was interrupted: cut
        error Permanent ContextOverflow: the request exceeds the model's context window: 
    "#]]
    .assert_eq(&out);
}

#[tokio::test]
async fn a_waiting_turn_stays_pending_until_dropped() {
    let exec = ScriptedExecutor::from_turns([ScriptTurn {
        text: Some("thinking…".into()),
        wait_for_cancel: true,
        ..ScriptTurn::default()
    }])
    .expect("valid");
    let mut stream = exec.execute_stream(request("x"));
    let first = stream.next().await;
    assert!(matches!(first, Some(Ok(LlmStreamEvent::TextDelta(ref t))) if t == "thinking…"));
    assert!(
        stream.next().now_or_never().is_none(),
        "the turn must wait, not end"
    );
    assert_eq!(exec.dropped_waits(), 0);
    drop(stream);
    assert_eq!(exec.dropped_waits(), 1, "dropping the stream ends the wait");
}

#[tokio::test(start_paused = true)]
async fn a_delayed_turn_pauses_before_each_event() {
    let exec = ScriptedExecutor::from_turns([ScriptTurn {
        delay_ms: Some(100),
        ..ScriptTurn::deltas(["a", "b"])
    }])
    .expect("valid");
    let started = tokio::time::Instant::now();
    let mut stream = exec.execute_stream(request("x"));
    assert!(
        stream.next().now_or_never().is_none(),
        "the first delta waits for its pause"
    );
    let mut texts = Vec::new();
    while let Some(event) = stream.next().await {
        if let Ok(LlmStreamEvent::TextDelta(t)) = event {
            texts.push((t, started.elapsed()));
        }
    }
    assert_eq!(
        texts,
        [
            ("a".to_owned(), Duration::from_millis(100)),
            ("b".to_owned(), Duration::from_millis(200)),
        ]
    );
}

#[tokio::test]
async fn cancel_waiting_ends_a_waiting_turn_with_cancelled() {
    let exec = ScriptedExecutor::from_turns([ScriptTurn::wait_for_cancel()]).expect("valid");
    let mut stream = exec.execute_stream(request("x"));
    assert!(stream.next().now_or_never().is_none());
    exec.cancel_waiting();
    let item = stream.next().await;
    assert!(
        matches!(item, Some(Err(InferenceExecutionError::Cancelled))),
        "{item:?}"
    );
    assert!(stream.next().await.is_none());
    drop(stream);
    assert_eq!(
        exec.dropped_waits(),
        0,
        "a cancelled wait is not counted as dropped"
    );
}

const TOML_SCRIPT: &str = r#"
[[turns]]
text = "Let me look."
[[turns.tool_calls]]
name = "search"
arguments = { query = "rust" }

[[turns]]
deltas = ["Found ", "it."]
usage = { input_tokens = 12, output_tokens = 3 }

[[turns]]
error = { kind = "rate_limited", retry_after_ms = 200 }

[[turns]]
wait_for_cancel = true
"#;

#[test]
fn scripts_load_from_json_and_toml_files() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let toml_path = dir.join("awaken-llm-script.toml");
    std::fs::write(&toml_path, TOML_SCRIPT).expect("writable tmp dir");
    let from_toml = Script::load(&toml_path).expect("valid TOML script");
    assert_eq!(from_toml.turns.len(), 4);

    let json = serde_json::to_string(&from_toml).expect("serializable");
    let json_path = dir.join("awaken-llm-script.json");
    std::fs::write(&json_path, &json).expect("writable tmp dir");
    let from_json = Script::load(&json_path).expect("valid JSON script");
    assert_eq!(
        from_json, from_toml,
        "JSON and TOML describe the same script"
    );
    expect![[r#"{"turns":[{"text":"Let me look.","tool_calls":[{"name":"search","arguments":{"query":"rust"}}]},{"deltas":["Found ","it."],"usage":{"input_tokens":12,"output_tokens":3}},{"error":{"kind":"rate_limited","retry_after_ms":200}},{"wait_for_cancel":true}]}"#]]
    .assert_eq(&json);

    let exec = ScriptedExecutor::load(&toml_path).expect("loads");
    assert_eq!(exec.remaining(), 4);

    let missing = Script::load(dir.join("no-such-script.toml"));
    assert!(
        matches!(missing, Err(ScriptError::Io { .. })),
        "{missing:?}"
    );
    let yaml = Script::load(dir.join("script.yaml"));
    assert!(matches!(yaml, Err(ScriptError::UnknownFormat { .. })));
}

#[test]
fn bad_scripts_are_rejected_with_their_place() {
    let unknown = Script::from_toml_str("[[turns]]\ntext = \"a\"\n\n[[turns]]\ntxet = \"b\"\n");
    let Err(ScriptError::Parse { source, .. }) = &unknown else {
        panic!("expected a parse error, got {unknown:?}");
    };
    assert_eq!(source.line(), Some(5), "{source}");

    let both = Script::from_json_str(r#"{"turns":[{"text":"a"},{"text":"b","deltas":["c"]}]}"#);
    expect![[r#"script turn 2: set either `text` or `deltas`, not both"#]]
        .assert_eq(&both.err().map(|e| e.to_string()).unwrap_or_default());

    let bad_id =
        Script::from_json_str(r#"{"turns":[{"tool_calls":[{"name":"f","id":"has space"}]}]}"#);
    assert!(
        matches!(bad_id, Err(ScriptError::Invalid { turn: 1, .. })),
        "{bad_id:?}"
    );

    let bad_kind = Script::from_json_str(r#"{"turns":[{"error":{"kind":"meteor"}}]}"#);
    assert!(matches!(bad_kind, Err(ScriptError::Parse { .. })));
}

#[tokio::test]
async fn raw_arguments_reach_the_response_unparsed() {
    let exec =
        ScriptedExecutor::from_turns([ScriptTurn::default().with_tool_call(ScriptToolCall {
            id: None,
            name: "f".into(),
            arguments: None,
            raw_arguments: Some("{not json".into()),
        })])
        .expect("valid");
    let response = exec.execute(request("x")).await.expect("a response");
    assert_eq!(
        response.message.tool_calls[0].invalid_arguments.as_deref(),
        Some("{not json")
    );
}

#[tokio::test]
async fn a_cancellation_token_ends_a_waiting_turn() {
    let exec = ScriptedExecutor::from_turns([ScriptTurn {
        deltas: vec!["partial".into()],
        wait_for_cancel: true,
        ..ScriptTurn::default()
    }])
    .expect("valid");
    let token = awaken_event::CancellationToken::new();
    let mut stream =
        awaken_llm::with_cancellation(exec.execute_stream(request("x")), token.clone());
    assert!(matches!(
        stream.next().await,
        Some(Ok(LlmStreamEvent::TextDelta(_)))
    ));
    assert!(stream.next().now_or_never().is_none(), "waiting");
    // Cancel from another task while this one awaits the stream.
    let canceller = tokio::spawn(async move { token.cancel() });
    let item = stream.next().await;
    assert!(
        matches!(item, Some(Err(InferenceExecutionError::Cancelled))),
        "{item:?}"
    );
    assert!(stream.next().await.is_none());
    assert_eq!(
        exec.dropped_waits(),
        1,
        "the waiting turn was dropped by the cancellation"
    );
    assert!(canceller.await.is_ok());
}

#[tokio::test]
async fn a_stream_that_waited_and_ended_leaves_no_waker_on_its_token() {
    let exec = ScriptedExecutor::from_turns([ScriptTurn::text("hi")]).expect("valid");
    let token = awaken_event::CancellationToken::new();
    // The scripted stream is pending once (it yields to the scheduler), so the stream waits
    // on the token too; a shared token would otherwise keep every such task's waker.
    let yielding = futures_util::stream::once(tokio::task::yield_now())
        .flat_map(move |()| exec.execute_stream(request("x")));
    let mut stream = awaken_llm::with_cancellation(Box::pin(yielding), token.clone());
    assert!(stream.next().now_or_never().is_none(), "waiting");
    assert_eq!(token.waiting_tasks(), 1);
    while let Some(item) = stream.next().await {
        item.expect("an event");
    }
    assert_eq!(token.waiting_tasks(), 0, "the ended stream stopped waiting");
    // A stream dropped while waiting takes its waker back too.
    let exec = ScriptedExecutor::from_turns([ScriptTurn {
        wait_for_cancel: true,
        ..ScriptTurn::default()
    }])
    .expect("valid");
    let mut stream =
        awaken_llm::with_cancellation(exec.execute_stream(request("x")), token.clone());
    assert!(stream.next().now_or_never().is_none(), "waiting");
    assert_eq!(token.waiting_tasks(), 1);
    drop(stream);
    assert_eq!(token.waiting_tasks(), 0);
}

#[tokio::test]
async fn a_lent_wait_stays_registered_across_streams_and_still_ends_one_when_cancelled() {
    let exec = std::sync::Arc::new(
        ScriptedExecutor::from_turns([
            ScriptTurn::text("one"),
            ScriptTurn {
                wait_for_cancel: true,
                ..ScriptTurn::default()
            },
        ])
        .expect("valid"),
    );
    let token = awaken_event::CancellationToken::new();
    // Pending once (it yields to the scheduler) before its events.
    let yielding = {
        let exec = exec.clone();
        Box::pin(
            futures_util::stream::once(tokio::task::yield_now())
                .flat_map(move |()| exec.execute_stream(request("x"))),
        )
    };
    // The first stream waits once (registering the task), ends, and hands the wait back still
    // registered: one waker on the token, not one per stream.
    let mut first = CancellableStream::with_waiter(yielding, token.clone().into_cancelled());
    assert!(first.next().now_or_never().is_none(), "waiting");
    while let Some(item) = first.next().await {
        item.expect("an event");
    }
    let waiter = first.into_waiter();
    assert_eq!(
        token.waiting_tasks(),
        1,
        "the lent wait is still registered"
    );
    // The second stream reuses it; a cancel from another task still ends it.
    let mut second = CancellableStream::with_waiter(exec.execute_stream(request("x")), waiter);
    assert!(second.next().now_or_never().is_none(), "waiting");
    assert_eq!(token.waiting_tasks(), 1, "still the one waker");
    let canceller = tokio::spawn({
        let token = token.clone();
        async move { token.cancel() }
    });
    let item = second.next().await;
    assert!(
        matches!(item, Some(Err(InferenceExecutionError::Cancelled))),
        "{item:?}"
    );
    assert!(second.next().await.is_none());
    assert!(canceller.await.is_ok());
    // Dropping the wait leaves nothing on the token.
    drop(second.into_waiter());
    assert_eq!(token.waiting_tasks(), 0);
}

#[tokio::test]
async fn an_already_cancelled_token_sends_no_request() {
    let exec = ScriptedExecutor::from_turns([ScriptTurn::text("never")]).expect("valid");
    let token = awaken_event::CancellationToken::new();
    token.cancel();
    let out = render_stream(awaken_llm::with_cancellation(
        exec.execute_stream(request("x")),
        token,
    ))
    .await;
    assert_eq!(out, "error Cancelled Cancelled: inference cancelled\n");
    assert!(exec.requests().is_empty());
    assert_eq!(exec.remaining(), 1);
}

/// A script whose second turn answers a refused call differently.
fn approval_script() -> Script {
    Script::new([
        ScriptTurn::default().with_tool_call(
            ScriptToolCall::new("append_file", serde_json::json!({"line": "buy milk"}))
                .with_id("call_1"),
        ),
        ScriptTurn::text("Added.").with_if_refused(ScriptTurn::text("Not added.")),
    ])
}

/// The history after the model called `call_1` and the calls were answered with `results`.
fn answered(results: &[(&str, ToolResult)]) -> InferenceRequest {
    let calls = results
        .iter()
        .map(|(id, _)| {
            ToolCall::new(
                ToolCallId::new(*id).expect("valid id"),
                "append_file",
                serde_json::json!({}),
            )
        })
        .collect();
    let mut messages = vec![
        Message::user("Remind me to buy milk"),
        Message::assistant_with_calls("", calls),
    ];
    for (id, result) in results {
        messages.push(Message::tool(
            ToolCallId::new(*id).expect("valid id"),
            result,
        ));
    }
    InferenceRequest::new("test-model", messages)
}

#[tokio::test]
async fn if_refused_plays_when_the_request_answers_a_failed_or_refused_call() {
    let error = |content: serde_json::Value| ToolResult {
        status: ToolResultStatus::Error,
        content: content.into(),
    };
    let cases: Vec<(&str, InferenceRequest)> = vec![
        (
            "approved",
            answered(&[("call_1", ToolResult::success(serde_json::json!("ok")))]),
        ),
        (
            "denied",
            answered(&[("call_1", ToolResult::error("denied by the user: not now"))]),
        ),
        (
            "failed with JSON",
            answered(&[("call_1", error(serde_json::json!({"code": 7})))]),
        ),
        (
            "one of two failed",
            answered(&[
                ("call_1", ToolResult::error("`append_file` was denied")),
                (
                    "call_2",
                    ToolResult::success(serde_json::json!({"ok": true})),
                ),
            ]),
        ),
        (
            "a user message after the refusal",
            InferenceRequest::new(
                "test-model",
                [
                    &answered(&[("call_1", ToolResult::error("denied by the user"))]).messages[..],
                    &[Message::user("never mind")],
                ]
                .concat(),
            ),
        ),
    ];
    let mut out = String::new();
    for (name, second) in cases {
        let exec = ScriptedExecutor::new(approval_script()).expect("valid");
        let first = render_stream(exec.execute_stream(request("Remind me to buy milk"))).await;
        assert!(
            first.contains("call_start #0 call_1 append_file"),
            "{first}"
        );
        out.push_str(&format!(
            "{name}: {}",
            render_stream(exec.execute_stream(second)).await
        ));
    }
    expect![[r#"
        approved: text "Added."
        stop EndTurn
        denied: text "Not added."
        stop EndTurn
        failed with JSON: text "Not added."
        stop EndTurn
        one of two failed: text "Not added."
        stop EndTurn
        a user message after the refusal: text "Added."
        stop EndTurn
    "#]]
    .assert_eq(&out);
}

#[test]
fn for_request_picks_the_turn_for_another_executor_too() {
    let script = approval_script();
    let turn = &script.turns[1];
    let denied = answered(&[("call_1", ToolResult::error("denied by the user"))]);
    let approved = answered(&[("call_1", ToolResult::success(serde_json::json!("ok")))]);
    assert_eq!(
        turn.for_request(&denied).text.as_deref(),
        Some("Not added.")
    );
    assert_eq!(turn.for_request(&approved).text.as_deref(), Some("Added."));
    // A turn without an alternative plays itself either way.
    assert_eq!(
        script.turns[0].for_request(&denied).tool_calls.len(),
        1,
        "no if_refused: the turn itself"
    );
}

const REFUSAL_TOML: &str = r#"
[[turns]]
tool_calls = [{ id = "call_1", name = "append_file", arguments = { line = "buy milk" } }]

[[turns]]
text = "Added."
[turns.if_refused]
text = "Not added."

[[turns]]
text = "Done."
if_refused = { deltas = ["Sorry", "."], stop = "end_turn" }
"#;

#[test]
fn if_refused_parses_as_a_nested_or_inline_table() {
    let script = Script::from_toml_str(REFUSAL_TOML).expect("valid script");
    let mut expected = approval_script();
    expected.turns[0].tool_calls[0].arguments = Some(serde_json::json!({"line": "buy milk"}));
    expected
        .turns
        .push(ScriptTurn::text("Done.").with_if_refused(
            ScriptTurn::deltas(["Sorry", "."]).with_stop(awaken_event::StopReason::EndTurn),
        ));
    assert_eq!(script, expected);
    expect![[r#"{"turns":[{"tool_calls":[{"id":"call_1","name":"append_file","arguments":{"line":"buy milk"}}]},{"text":"Added.","if_refused":{"text":"Not added."}},{"text":"Done.","if_refused":{"deltas":["Sorry","."],"stop":"end_turn"}}]}"#]]
    .assert_eq(&serde_json::to_string(&script).expect("serializable"));
}

#[test]
fn an_if_refused_inside_an_if_refused_is_rejected() {
    let nested = Script::from_toml_str(
        "[[turns]]\ntext = \"a\"\n\n[[turns]]\ntext = \"b\"\n[turns.if_refused]\ntext = \"c\"\n[turns.if_refused.if_refused]\ntext = \"d\"\n",
    );
    let invalid_inside = Script::from_json_str(
        r#"{"turns":[{"text":"a","if_refused":{"text":"b","deltas":["c"]}}]}"#,
    );
    let built = ScriptedExecutor::from_turns([ScriptTurn::text("a")
        .with_if_refused(ScriptTurn::text("b").with_if_refused(ScriptTurn::text("c")))]);
    let mut out = String::new();
    for result in [nested.map(drop), invalid_inside.map(drop), built.map(drop)] {
        out.push_str(&result.err().map(|e| e.to_string()).unwrap_or_default());
        out.push('\n');
    }
    expect![[r#"
        script turn 2: `if_refused` cannot have an `if_refused` of its own
        script turn 1: if_refused: set either `text` or `deltas`, not both
        script turn 1: `if_refused` cannot have an `if_refused` of its own
    "#]]
    .assert_eq(&out);
    let unknown = Script::from_toml_str("[[turns]]\n[turns.if_refused]\ntxet = \"a\"\n");
    assert!(
        matches!(unknown, Err(ScriptError::Parse { .. })),
        "{unknown:?}"
    );
}
