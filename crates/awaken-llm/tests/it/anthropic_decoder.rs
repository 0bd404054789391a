//! The IO-free Messages stream decoder, status and error-event mapping, and request body.

use std::sync::Arc;
use std::time::Duration;

use awaken_event::{ContentBlock, Message, Role, ToolCall, ToolCallId, ToolDescriptor, ToolResult};
use awaken_llm::anthropic::{
    BodyOptions, MessagesStreamDecoder, error_from_event, error_from_status, request_body,
    thinking_budget,
};
use awaken_llm::{InferenceExecutionError, InferenceRequest, ResponseCollector};
use awaken_spec::{InferenceOverride, ReasoningEffort};
use expect_test::expect;
use serde_json::{Value, json};

use crate::{render_error, render_items, render_response};

/// One SSE event as the API writes it: its type on the `event:` line and in the JSON.
pub(crate) fn event(data: Value) -> String {
    let kind = data["type"].as_str().unwrap_or("message").to_owned();
    format!("event: {kind}\ndata: {data}\n\n")
}

/// `message_start` with these input counts.
pub(crate) fn message_start(input: u64, cache_write: u64, cache_read: u64) -> String {
    event(json!({
        "type": "message_start",
        "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {
                "input_tokens": input, "output_tokens": 1,
                "cache_creation_input_tokens": cache_write, "cache_read_input_tokens": cache_read
            }
        }
    }))
}

/// `content_block_start` of a `text` or `thinking` block.
pub(crate) fn block_start(index: u32, kind: &str) -> String {
    let block = match kind {
        "thinking" => json!({"type": "thinking", "thinking": "", "signature": ""}),
        _ => json!({"type": kind, "text": ""}),
    };
    event(json!({"type": "content_block_start", "index": index, "content_block": block}))
}

/// `content_block_start` of a `tool_use` block.
pub(crate) fn tool_start(index: u32, id: &str, name: &str) -> String {
    event(json!({
        "type": "content_block_start", "index": index,
        "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}
    }))
}

/// `content_block_delta` of this type carrying `value` in `field`.
pub(crate) fn delta(index: u32, kind: &str, field: &str, value: &str) -> String {
    let mut d = json!({"type": kind});
    d[field] = Value::String(value.to_owned());
    event(json!({"type": "content_block_delta", "index": index, "delta": d}))
}

pub(crate) fn text_delta(index: u32, text: &str) -> String {
    delta(index, "text_delta", "text", text)
}

/// `input_json_delta`s of `json`, three characters at a time.
pub(crate) fn json_deltas(index: u32, json: &str) -> String {
    let chars: Vec<char> = json.chars().collect();
    chars
        .chunks(3)
        .map(|piece| {
            delta(
                index,
                "input_json_delta",
                "partial_json",
                &piece.iter().collect::<String>(),
            )
        })
        .collect()
}

pub(crate) fn block_stop(index: u32) -> String {
    event(json!({"type": "content_block_stop", "index": index}))
}

/// `message_delta` with this stop reason and output count, then `message_stop`.
pub(crate) fn message_end(stop: &str, output: u64) -> String {
    [
        event(json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": output}
        })),
        event(json!({"type": "message_stop"})),
    ]
    .concat()
}

/// A streamed text reply with multi-byte characters and escapes, a ping, and cache usage.
pub(crate) fn text_stream() -> String {
    [
        message_start(25, 7, 100),
        block_start(0, "text"),
        event(json!({"type": "ping"})),
        text_delta(0, "Grüße, "),
        text_delta(0, "\"world\" 😀\n"),
        text_delta(0, "done"),
        block_stop(0),
        message_end("end_turn", 15),
    ]
    .concat()
}

/// Thinking, text, then two tool calls whose arguments come three characters at a time.
pub(crate) fn tool_stream() -> String {
    [
        message_start(40, 0, 0),
        block_start(0, "thinking"),
        delta(0, "thinking_delta", "thinking", "The user wants "),
        delta(0, "thinking_delta", "thinking", "weather and time."),
        delta(
            0,
            "signature_delta",
            "signature",
            "EqQBCgIYAhIM1gbcDa9GJwZA",
        ),
        block_stop(0),
        block_start(1, "text"),
        text_delta(1, "Let me check."),
        block_stop(1),
        tool_start(2, "toolu_a", "get_weather"),
        json_deltas(2, r#"{"city": "Zürich", "days": 3}"#),
        block_stop(2),
        tool_start(3, "toolu_b", "get_time"),
        json_deltas(3, r#"{"tz": "UTC"}"#),
        block_stop(3),
        message_end("tool_use", 52),
    ]
    .concat()
}

/// Decodes `pieces` in order, then ends the body; renders events and the final error.
fn decode(pieces: &[&[u8]]) -> String {
    let mut decoder = MessagesStreamDecoder::new();
    let mut items = Vec::new();
    let mut out = Vec::new();
    for piece in pieces {
        let result = decoder.push(piece, &mut out);
        items.extend(out.drain(..).map(Ok));
        if let Err(e) = result {
            items.push(Err(e));
            return render_items(&items);
        }
    }
    let result = decoder.finish(&mut out);
    items.extend(out.drain(..).map(Ok));
    if let Err(e) = result {
        items.push(Err(e));
    }
    render_items(&items)
}

/// Decodes a whole body and collects it into a response.
fn collect(body: &str) -> String {
    let mut decoder = MessagesStreamDecoder::new();
    let mut out = Vec::new();
    let mut collector = ResponseCollector::new();
    if let Err(e) = decoder
        .push(body.as_bytes(), &mut out)
        .and_then(|()| decoder.finish(&mut out))
    {
        return format!("decode error: {e}");
    }
    for e in out {
        if let Err(e) = collector.push(e) {
            return format!("collect error: {e}");
        }
    }
    match collector.finish() {
        Ok(r) => render_response(&r),
        Err(e) => format!("collect error: {e}"),
    }
}

#[test]
fn a_text_stream_with_cache_usage_decodes_to_text_usage_and_stop() {
    expect![[r#"
        text "Grüße, "
        text "\"world\" 😀\n"
        text "done"
        usage in=132 out=15 cached=100 reasoning=0
        stop EndTurn
    "#]]
    .assert_eq(&decode(&[text_stream().as_bytes()]));
}

#[test]
fn every_split_point_decodes_the_same() {
    for body in [text_stream(), tool_stream()] {
        let bytes = body.as_bytes();
        let whole = decode(&[bytes]);
        for i in 0..=bytes.len() {
            assert_eq!(
                decode(&[&bytes[..i], &bytes[i..]]),
                whole,
                "split at byte {i}"
            );
        }
    }
}

#[test]
fn thinking_text_and_tool_calls_numbered_densely_from_zero() {
    let body = tool_stream();
    let rendered = decode(&[body.as_bytes()]);
    // Block indexes 2 and 3 are calls 0 and 1; the signature is not surfaced.
    let first: String = rendered.lines().take(6).map(|l| format!("{l}\n")).collect();
    expect![[r#"
        reasoning "The user wants "
        reasoning "weather and time."
        text "Let me check."
        call_start #0 toolu_a get_weather
        call_args #0 "{\"c"
        call_args #0 "ity"
    "#]]
    .assert_eq(&first);
    assert!(!rendered.contains("EqQB"), "{rendered}");
    assert!(
        rendered.contains("call_start #1 toolu_b get_time\n"),
        "{rendered}"
    );
    assert!(
        rendered.ends_with("usage in=40 out=52 cached=0 reasoning=0\nstop ToolCalls\n"),
        "{rendered}"
    );
    expect![[r#"
        stop=ToolCalls usage in=40 out=52
        block {"type":"reasoning","text":"The user wants weather and time."}
        block {"type":"text","text":"Let me check."}
        call toolu_a get_weather {"city":"Zürich","days":3} raw=None
        call toolu_b get_time {"tz":"UTC"} raw=None
    "#]]
    .assert_eq(&collect(&body));
}

#[test]
fn stop_reasons_map_to_the_neutral_vocabulary() {
    let mut out = String::new();
    for reason in [
        "end_turn",
        "stop_sequence",
        "max_tokens",
        "tool_use",
        "refusal",
        "model_context_window_exceeded",
        "pause_turn",
    ] {
        let body = [message_start(1, 0, 0), message_end(reason, 1)].concat();
        let rendered = decode(&[body.as_bytes()]);
        out.push_str(&format!(
            "{reason} -> {}\n",
            rendered.lines().last().unwrap_or("")
        ));
    }
    expect![[r#"
        end_turn -> stop EndTurn
        stop_sequence -> stop EndTurn
        max_tokens -> stop MaxTokens
        tool_use -> stop ToolCalls
        refusal -> stop ContentFiltered
        model_context_window_exceeded -> stop MaxTokens
        pause_turn -> stop Other
    "#]]
    .assert_eq(&out);
}

#[test]
fn an_error_event_mid_stream_becomes_its_error() {
    let body = [
        message_start(5, 0, 0),
        block_start(0, "text"),
        text_delta(0, "par"),
        event(json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
        text_delta(0, "never seen"),
    ]
    .concat();
    expect![[r#"
        text "par"
        error Retryable Overloaded: provider overloaded (HTTP 529): Overloaded
    "#]]
    .assert_eq(&decode(&[body.as_bytes()]));
}

#[test]
fn a_body_that_ends_before_message_stop_is_interrupted() {
    let body = [
        message_start(5, 0, 0),
        block_start(0, "text"),
        text_delta(0, "hi"),
        event(json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}})),
    ]
    .concat();
    expect![[r#"
        text "hi"
        error Retryable StreamInterrupted: the response stream was interrupted: the response body ended before the stream was complete (no message_stop)
    "#]]
    .assert_eq(&decode(&[body.as_bytes()]));
}

#[test]
fn malformed_events_are_typed_errors_with_a_snippet() {
    let bad_json = [
        message_start(5, 0, 0),
        block_start(0, "text"),
        text_delta(0, "ok"),
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"text\":\"bro\n\n"
            .to_owned(),
    ]
    .concat();
    expect![[r#"
        text "ok"
        error Permanent MalformedResponse: malformed provider response: an event is not valid JSON (in "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"text\":\"bro")
    "#]]
    .assert_eq(&decode(&[bad_json.as_bytes()]));

    let unknown_block = [message_start(5, 0, 0), text_delta(4, "orphan")].concat();
    let rendered = decode(&[unknown_block.as_bytes()]);
    assert!(
        rendered.starts_with("error Permanent MalformedResponse: malformed provider response: a delta for a content block that was never started"),
        "{rendered}"
    );

    let mismatched = [
        message_start(5, 0, 0),
        block_start(0, "text"),
        json_deltas(0, "{}"),
    ]
    .concat();
    let rendered = decode(&[mismatched.as_bytes()]);
    assert!(
        rendered.contains("a delta that does not fit its content block"),
        "{rendered}"
    );

    let no_id = [
        message_start(5, 0, 0),
        event(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "name": "f", "input": {}}})),
    ]
    .concat();
    let rendered = decode(&[no_id.as_bytes()]);
    assert!(
        rendered.contains("a tool_use block without a usable id"),
        "{rendered}"
    );
}

#[test]
fn unknown_events_blocks_and_deltas_are_skipped_and_bytes_after_message_stop_ignored() {
    let body = [
        message_start(3, 0, 0),
        event(json!({"type": "some_future_event", "x": 1})),
        event(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}})),
        json_deltas(0, r#"{"q":"x"}"#),
        block_stop(0),
        event(json!({"type": "content_block_start", "index": 1, "content_block": {"type": "redacted_thinking", "data": "abc"}})),
        block_stop(1),
        block_start(2, "text"),
        delta(2, "citations_delta", "citation", "ignored"),
        text_delta(2, "a"),
        block_stop(2),
        message_end("end_turn", 1),
        "data: not json at all\n\n".to_owned(),
    ]
    .concat();
    expect![[r#"
        text "a"
        usage in=3 out=1 cached=0 reasoning=0
        stop EndTurn
    "#]]
    .assert_eq(&decode(&[body.as_bytes()]));
}

#[test]
fn a_whole_message_decodes_like_a_stream() {
    let body = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_9", "name": "lookup", "input": {"q": "rust"}},
            {"type": "tool_use", "id": "toolu_10", "name": "noargs", "input": {}}
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 5, "output_tokens": 9, "cache_read_input_tokens": 2}
    })
    .to_string();
    let items: Vec<_> = match MessagesStreamDecoder::decode_message(body.as_bytes()) {
        Ok(events) => events.into_iter().map(Ok).collect(),
        Err(e) => vec![Err(e)],
    };
    expect![[r#"
        reasoning "hmm"
        text "Let me check."
        call_start #0 toolu_9 lookup
        call_args #0 "{\"q\":\"rust\"}"
        call_start #1 toolu_10 noargs
        usage in=7 out=9 cached=2 reasoning=0
        stop ToolCalls
    "#]]
    .assert_eq(&render_items(&items));

    let error = MessagesStreamDecoder::decode_message(
        br#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
    );
    assert!(
        matches!(&error, Err(InferenceExecutionError::ServerError { message, .. }) if message == "Internal server error"),
        "{error:?}"
    );
    let garbage = MessagesStreamDecoder::decode_message(b"<html>bad gateway</html>");
    assert!(matches!(
        garbage,
        Err(InferenceExecutionError::MalformedResponse { .. })
    ));
}

fn envelope(kind: &str, message: &str) -> String {
    json!({"type": "error", "error": {"type": kind, "message": message}}).to_string()
}

#[test]
fn http_statuses_map_to_error_classes() {
    const URL: &str = "https://api.anthropic.com/v1/messages";
    let after = Some(Duration::from_secs(7));
    let cases: Vec<(u16, String)> = vec![
        (
            429,
            envelope(
                "rate_limit_error",
                "Number of request tokens has exceeded your per-minute rate limit",
            ),
        ),
        (529, envelope("overloaded_error", "Overloaded")),
        (503, "upstream connect error".to_owned()),
        (401, envelope("authentication_error", "invalid x-api-key")),
        (
            403,
            envelope(
                "permission_error",
                "Your API key does not have permission to use the specified resource.",
            ),
        ),
        (
            400,
            envelope(
                "invalid_request_error",
                "messages: roles must alternate between \"user\" and \"assistant\"",
            ),
        ),
        (
            400,
            envelope(
                "invalid_request_error",
                "prompt is too long: 213456 tokens > 200000 maximum",
            ),
        ),
        (
            413,
            envelope(
                "request_too_large",
                "Request exceeds the maximum allowed number of bytes.",
            ),
        ),
        (404, envelope("not_found_error", "model: claude-nope")),
        (404, envelope("not_found_error", "Not Found")),
        (404, "<html>404 page</html>".to_owned()),
        (500, envelope("api_error", "Internal server error")),
        (502, "bad gateway".to_owned()),
    ];
    let mut out = String::new();
    for (status, body) in &cases {
        let e = error_from_status(*status, after, body, "claude-nope", URL);
        out.push_str(&format!("{status} {}\n", render_error(&e)));
    }
    expect![[r#"
        429 error Retryable RateLimited: rate limited by the provider (retry after 7s): Number of request tokens has exceeded your per-minute rate limit
        529 error Retryable Overloaded: provider overloaded (HTTP 529) (retry after 7s): Overloaded
        503 error Retryable Overloaded: provider overloaded (HTTP 503) (retry after 7s): upstream connect error
        401 error Permanent Unauthorized: unauthorized (HTTP 401): invalid x-api-key
        403 error Permanent Unauthorized: unauthorized (HTTP 403): Your API key does not have permission to use the specified resource.
        400 error Permanent InvalidRequest: the provider rejected the request (HTTP 400): messages: roles must alternate between "user" and "assistant"
        400 error Permanent ContextOverflow: the request exceeds the model's context window: prompt is too long: 213456 tokens > 200000 maximum
        413 error Permanent InvalidRequest: the provider rejected the request (HTTP 413): Request exceeds the maximum allowed number of bytes.
        404 error Permanent ModelNotFound: model "claude-nope" not found: model: claude-nope
        404 error Permanent EndpointNotFound: the server has no `POST https://api.anthropic.com/v1/messages` (HTTP 404: Not Found)
        404 error Permanent EndpointNotFound: the server has no `POST https://api.anthropic.com/v1/messages` (HTTP 404: <html>404 page</html>)
        500 error Retryable ServerError: provider server error (HTTP 500): Internal server error
        502 error Retryable ServerError: provider server error (HTTP 502): bad gateway
    "#]]
    .assert_eq(&out);
}

#[test]
fn error_events_map_to_error_classes() {
    let mut out = String::new();
    for kind in [
        "overloaded_error",
        "rate_limit_error",
        "api_error",
        "timeout_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "invalid_request_error",
        "billing_error",
        "something_new",
    ] {
        let message = if kind == "not_found_error" {
            "model: m"
        } else {
            "msg"
        };
        out.push_str(&format!(
            "{kind} {}\n",
            render_error(&error_from_event(kind, message, "m"))
        ));
    }
    out.push_str(&render_error(&error_from_event(
        "invalid_request_error",
        "input length and `max_tokens` exceed context limit: 197669 + 21333 > 200000",
        "m",
    )));
    expect![[r#"
        overloaded_error error Retryable Overloaded: provider overloaded (HTTP 529): msg
        rate_limit_error error Retryable RateLimited: rate limited by the provider: msg
        api_error error Retryable ServerError: provider server error: msg
        timeout_error error Retryable ServerError: provider server error: msg
        authentication_error error Permanent Unauthorized: unauthorized (HTTP 401): msg
        permission_error error Permanent Unauthorized: unauthorized (HTTP 403): msg
        not_found_error error Permanent ModelNotFound: model "m" not found: model: m
        invalid_request_error error Permanent InvalidRequest: the provider rejected the request: msg
        billing_error error Permanent InvalidRequest: the provider rejected the request: msg
        something_new error Retryable ServerError: provider server error: msg
        error Permanent ContextOverflow: the request exceeds the model's context window: input length and `max_tokens` exceed context limit: 197669 + 21333 > 200000"#]]
    .assert_eq(&out);
}

fn id(s: &str) -> ToolCallId {
    ToolCallId::new(s).expect("valid id")
}

/// A tool-using conversation: two calls, their results (one an error), a user follow-up.
pub(crate) fn tool_conversation() -> InferenceRequest {
    let calls = vec![
        ToolCall::new(id("toolu_a"), "get_weather", json!({"city": "Zürich"})),
        ToolCall::from_raw_arguments(id("toolu_b"), "get_time", "{not json"),
    ];
    let messages = vec![
        Message::system("Answer in English."),
        Message::user("Weather and time?"),
        Message::user("In Zürich."),
        Message::assistant_with_calls("Let me check.", calls),
        Message::tool(id("toolu_a"), &ToolResult::success(json!({"sky": "sunny"}))),
        Message::tool(id("toolu_b"), &ToolResult::error("bad arguments")),
        Message::user("Thanks!"),
    ];
    InferenceRequest::new("claude-test", messages)
        .with_system_prompt("You are helpful.")
        .with_tools(vec![ToolDescriptor::new(
            "get_weather",
            "Looks up the weather.",
        )])
}

fn body(request: &InferenceRequest, options: &BodyOptions<'_>) -> Value {
    let bytes = request_body(request, options).expect("a body");
    serde_json::from_slice(&bytes).expect("JSON")
}

#[test]
fn the_body_puts_the_system_prompt_on_top_and_alternates_user_and_assistant() {
    let b = body(&tool_conversation(), &BodyOptions::default());
    expect![[r#"
        {
          "max_tokens": 4096,
          "messages": [
            {
              "content": [
                {
                  "text": "Weather and time?",
                  "type": "text"
                },
                {
                  "text": "In Zürich.",
                  "type": "text"
                }
              ],
              "role": "user"
            },
            {
              "content": [
                {
                  "text": "Let me check.",
                  "type": "text"
                },
                {
                  "id": "toolu_a",
                  "input": {
                    "city": "Zürich"
                  },
                  "name": "get_weather",
                  "type": "tool_use"
                },
                {
                  "id": "toolu_b",
                  "input": {},
                  "name": "get_time",
                  "type": "tool_use"
                }
              ],
              "role": "assistant"
            },
            {
              "content": [
                {
                  "content": "{\"sky\":\"sunny\"}",
                  "is_error": false,
                  "tool_use_id": "toolu_a",
                  "type": "tool_result"
                },
                {
                  "content": "error: bad arguments",
                  "is_error": true,
                  "tool_use_id": "toolu_b",
                  "type": "tool_result"
                },
                {
                  "text": "Thanks!",
                  "type": "text"
                }
              ],
              "role": "user"
            }
          ],
          "model": "claude-test",
          "stream": true,
          "system": "You are helpful.\n\nAnswer in English.",
          "tools": [
            {
              "description": "Looks up the weather.",
              "input_schema": {
                "type": "object"
              },
              "name": "get_weather"
            }
          ]
        }"#]]
    .assert_eq(&serde_json::to_string_pretty(&b).unwrap_or_default());
}

#[test]
fn tool_results_come_first_in_their_user_turn() {
    // A user message sent between a call and its result still leaves the result first.
    let messages = vec![
        Message::user("go"),
        Message::assistant_with_calls("", vec![ToolCall::new(id("toolu_1"), "f", json!({}))]),
        Message::user("hurry"),
        Message::tool(id("toolu_1"), &ToolResult::success(json!("done"))),
    ];
    let b = body(
        &InferenceRequest::new("m", messages),
        &BodyOptions::default(),
    );
    let roles: Vec<&str> = b["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["role"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(roles, ["user", "assistant", "user"]);
    let last: Vec<&str> = b["messages"][2]["content"]
        .as_array()
        .map(|c| c.iter().filter_map(|b| b["type"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(last, ["tool_result", "text"]);
    assert_eq!(b["messages"][2]["content"][0]["content"], "done");
    // The assistant turn had no text: only its call is sent.
    assert_eq!(
        b["messages"][1]["content"].as_array().map(Vec::len),
        Some(1)
    );
}

#[test]
fn parameters_thinking_and_extra_fields() {
    let plain = InferenceRequest::new("claude-test", vec![Message::user("hi")]).with_overrides(
        InferenceOverride::default()
            .with_max_tokens(300)
            .with_temperature(0.2)
            .with_top_p(0.5),
    );
    let extra: serde_json::Map<String, Value> =
        serde_json::from_value(json!({"top_k": 5, "max_tokens": 1, "model": "hijack"}))
            .unwrap_or_default();
    let options = BodyOptions {
        stream: false,
        default_max_tokens: 4096,
        extra: Some(&extra),
    };
    let b = body(&plain, &options);
    assert_eq!(b["max_tokens"], 300);
    assert_eq!(b["temperature"], 0.2);
    assert_eq!(b["top_p"], 0.5);
    assert_eq!(b["stream"], false);
    assert_eq!(b["top_k"], 5, "an extra field the request leaves free");
    assert_eq!(b["model"], "claude-test", "the request's fields win");
    assert!(b.get("thinking").is_none());
    assert!(b.get("system").is_none());

    let think = |effort: ReasoningEffort, max_tokens: Option<u32>| {
        let mut o = InferenceOverride::default()
            .with_reasoning_effort(effort)
            .with_temperature(0.7);
        if let Some(m) = max_tokens {
            o = o.with_max_tokens(m);
        }
        let r = InferenceRequest::new("claude-test", vec![Message::user("hi")]).with_overrides(o);
        let b = body(&r, &BodyOptions::default());
        format!(
            "{:?} max={:?}: max_tokens={} thinking={} temperature={}\n",
            effort, max_tokens, b["max_tokens"], b["thinking"], b["temperature"]
        )
    };
    let mut out = String::new();
    for effort in [
        ReasoningEffort::None,
        ReasoningEffort::Minimal,
        ReasoningEffort::Low,
        ReasoningEffort::Medium,
        ReasoningEffort::High,
    ] {
        out.push_str(&think(effort, None));
    }
    out.push_str(&think(ReasoningEffort::High, Some(8000)));
    out.push_str(&think(ReasoningEffort::Low, Some(1024)));
    expect![[r#"
        None max=None: max_tokens=4096 thinking=null temperature=0.7
        Minimal max=None: max_tokens=5120 thinking={"budget_tokens":1024,"type":"enabled"} temperature=null
        Low max=None: max_tokens=8192 thinking={"budget_tokens":4096,"type":"enabled"} temperature=null
        Medium max=None: max_tokens=16384 thinking={"budget_tokens":12288,"type":"enabled"} temperature=null
        High max=None: max_tokens=28672 thinking={"budget_tokens":24576,"type":"enabled"} temperature=null
        High max=Some(8000): max_tokens=8000 thinking={"budget_tokens":7999,"type":"enabled"} temperature=null
        Low max=Some(1024): max_tokens=1024 thinking=null temperature=0.7
    "#]]
    .assert_eq(&out);
    assert_eq!(thinking_budget(ReasoningEffort::None), None);

    // While the latest assistant message calls tools, thinking stays off.
    let mid = tool_conversation()
        .with_overrides(InferenceOverride::default().with_reasoning_effort(ReasoningEffort::High));
    let b = body(&mid, &BodyOptions::default());
    assert!(b.get("thinking").is_none(), "{b}");
    assert_eq!(b["max_tokens"], 4096);
}

#[test]
fn images_and_malformed_history() {
    let image = Message {
        role: Role::User,
        content: Arc::new([
            ContentBlock::text("What is this?"),
            ContentBlock::Image {
                url: "data:image/png;base64,iVBORw0KGgo=".to_owned(),
                media_type: None,
            },
            ContentBlock::Image {
                url: "https://example.com/cat.jpg".to_owned(),
                media_type: Some("image/jpeg".to_owned()),
            },
        ]),
        tool_calls: Arc::new([]),
        tool_call_id: None,
    };
    let b = body(
        &InferenceRequest::new("m", vec![image]),
        &BodyOptions::default(),
    );
    expect![[r#"[{"text":"What is this?","type":"text"},{"source":{"data":"iVBORw0KGgo=","media_type":"image/png","type":"base64"},"type":"image"},{"source":{"type":"url","url":"https://example.com/cat.jpg"},"type":"image"}]"#]]
        .assert_eq(&b["messages"][0]["content"].to_string());

    let orphan = Message {
        role: Role::Tool,
        content: Arc::new([ContentBlock::text("result")]),
        tool_calls: Arc::new([]),
        tool_call_id: None,
    };
    let error = request_body(
        &InferenceRequest::new("m", vec![Message::user("x"), orphan]),
        &BodyOptions::default(),
    );
    expect![[r#"Err(InvalidRequest { status: None, message: "message 1 is a tool result without the id of the call it answers" })"#]]
        .assert_eq(&format!("{:?}", error.map(|_| ())));
}
