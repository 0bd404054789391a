//! The IO-free chat-completions decoder, status mapping and request body.

use std::time::Duration;

use awaken_event::{ContentBlock, Message, ToolCall, ToolCallId, ToolDescriptor};
use awaken_llm::openai::{
    BodyOptions, ChatStreamDecoder, MaxTokensField, error_from_status, parse_retry_after,
    request_body,
};
use awaken_llm::{InferenceExecutionError, InferenceRequest, LlmStreamEvent, ResponseCollector};
use awaken_spec::{InferenceOverride, ReasoningEffort};
use expect_test::expect;

use crate::{render_items, render_response};

/// A `data:` line carrying one chunk with this delta and finish reason.
pub(crate) fn delta_chunk(delta: &str, finish: Option<&str>) -> String {
    let finish = finish.map_or("null".to_owned(), |f| format!("{f:?}"));
    format!(
        "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
    )
}

/// The final usage-only chunk sent for `stream_options.include_usage`.
pub(crate) fn usage_chunk(input: u64, output: u64) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{input},\"completion_tokens\":{output},\"total_tokens\":{},\"prompt_tokens_details\":{{\"cached_tokens\":2}}}}}}\n\n",
        input + output
    )
}

pub(crate) const DONE: &str = "data: [DONE]\n\n";

/// A streamed text reply with multi-byte characters and escapes, usage in the last chunk.
pub(crate) fn text_stream() -> String {
    [
        delta_chunk(r#"{"role":"assistant","content":""}"#, None),
        delta_chunk(r#"{"content":"Grüße, "}"#, None),
        delta_chunk(r#"{"content":"\"world\" 😀\n"}"#, None),
        delta_chunk(r#"{"content":"done"}"#, None),
        delta_chunk("{}", Some("stop")),
        usage_chunk(11, 7),
        DONE.to_owned(),
    ]
    .concat()
}

/// Two tool calls whose argument fragments interleave.
pub(crate) fn parallel_tool_stream() -> String {
    [
        delta_chunk(r#"{"role":"assistant","content":null}"#, None),
        delta_chunk(
            r#"{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]}"#,
            None,
        ),
        delta_chunk(
            r#"{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{\"tz\":"}}]}"#,
            None,
        ),
        delta_chunk(
            r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}"#,
            None,
        ),
        delta_chunk(
            r#"{"tool_calls":[{"index":1,"function":{"arguments":"\"UTC\"}"}}]}"#,
            None,
        ),
        delta_chunk(
            r#"{"tool_calls":[{"index":0,"function":{"arguments":"\"Zürich\"}"}}]}"#,
            None,
        ),
        delta_chunk("{}", Some("tool_calls")),
        usage_chunk(30, 12),
        DONE.to_owned(),
    ]
    .concat()
}

/// Decodes `pieces` in order, then ends the body; renders events and the final error.
fn decode(pieces: &[&[u8]]) -> String {
    let mut decoder = ChatStreamDecoder::new();
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

fn collect(body: &str) -> String {
    let mut decoder = ChatStreamDecoder::new();
    let mut out = Vec::new();
    let mut collector = ResponseCollector::new();
    let pushed = decoder
        .push(body.as_bytes(), &mut out)
        .and_then(|()| decoder.finish(&mut out));
    if let Err(e) = pushed {
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
fn text_stream_with_usage_in_the_last_chunk_and_done() {
    expect![[r#"
        text "Grüße, "
        text "\"world\" 😀\n"
        text "done"
        usage in=11 out=7 cached=2 reasoning=0
        stop EndTurn
    "#]]
    .assert_eq(&decode(&[text_stream().as_bytes()]));
}

#[test]
fn every_split_point_decodes_the_same() {
    for body in [text_stream(), parallel_tool_stream()] {
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
fn interleaved_parallel_tool_calls_are_assembled_per_index() {
    let body = parallel_tool_stream();
    expect![[r#"
        call_start #0 call_a get_weather
        call_start #1 call_b get_time
        call_args #1 "{\"tz\":"
        call_args #0 "{\"city\":"
        call_args #1 "\"UTC\"}"
        call_args #0 "\"Zürich\"}"
        usage in=30 out=12 cached=2 reasoning=0
        stop ToolCalls
    "#]]
    .assert_eq(&decode(&[body.as_bytes()]));
    expect![[r#"
        stop=ToolCalls usage in=30 out=12
        call call_a get_weather {"city":"Zürich"} raw=None
        call call_b get_time {"tz":"UTC"} raw=None
    "#]]
    .assert_eq(&collect(&body));
}

#[test]
fn reasoning_deltas_and_stop_after_tool_calls() {
    // Some servers say `stop` after tool calls; a call without an id gets a generated one.
    let body = [
        delta_chunk(r#"{"reasoning_content":"think"}"#, None),
        delta_chunk(
            r#"{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{}"}}]}"#,
            Some("stop"),
        ),
        DONE.to_owned(),
    ]
    .concat();
    let rendered = decode(&[body.as_bytes()]);
    let mut lines = rendered.lines();
    assert_eq!(lines.next(), Some(r#"reasoning "think""#));
    let start = lines.next().unwrap_or_default();
    assert!(
        start.starts_with("call_start #0 call_") && start.ends_with(" f"),
        "{start}"
    );
    assert_eq!(lines.next(), Some(r#"call_args #0 "{}""#));
    assert_eq!(lines.next(), Some("stop ToolCalls"));
    assert_eq!(lines.next(), None);
}

#[test]
fn arguments_before_the_name_wait_for_it() {
    let body = [
        delta_chunk(
            r#"{"tool_calls":[{"index":0,"id":"c1","function":{"arguments":"{\"a\""}}]}"#,
            None,
        ),
        delta_chunk(
            r#"{"tool_calls":[{"index":0,"function":{"name":"f","arguments":":1}"}}]}"#,
            Some("tool_calls"),
        ),
        DONE.to_owned(),
    ]
    .concat();
    expect![[r#"
        call_start #0 c1 f
        call_args #0 "{\"a\":1}"
        stop ToolCalls
    "#]]
    .assert_eq(&decode(&[body.as_bytes()]));
}

#[test]
fn malformed_json_in_a_chunk_is_a_typed_error() {
    let body = [
        delta_chunk(r#"{"content":"ok"}"#, None),
        "data: {\"choices\":[{\"delta\":{\"content\":\"bro\n\n".to_owned(),
        delta_chunk(r#"{"content":"never seen"}"#, None),
    ]
    .concat();
    expect![[r#"
        text "ok"
        error Permanent MalformedResponse: malformed provider response: a chunk is not valid JSON (in "{\"choices\":[{\"delta\":{\"content\":\"bro")
    "#]]
    .assert_eq(&decode(&[body.as_bytes()]));
}

#[test]
fn an_error_chunk_becomes_its_error() {
    let body = [
        delta_chunk(r#"{"content":"par"}"#, None),
        "data: {\"error\":{\"message\":\"upstream failed\",\"type\":\"server_error\"}}\n\n"
            .to_owned(),
    ]
    .concat();
    expect![[r#"
        text "par"
        error Retryable ServerError: provider server error: upstream failed
    "#]]
    .assert_eq(&decode(&[body.as_bytes()]));
}

#[test]
fn end_of_body_after_finish_reason_completes_and_without_it_is_interrupted() {
    let finished = [delta_chunk(r#"{"content":"hi"}"#, Some("length"))].concat();
    expect![[r#"
        text "hi"
        stop MaxTokens
    "#]]
    .assert_eq(&decode(&[finished.as_bytes()]));

    let cut = [
        delta_chunk(r#"{"content":"hi"}"#, None),
        "data: {\"choices\":[{\"delta\":{\"content\":\"tr".to_owned(),
    ]
    .concat();
    expect![[r#"
        text "hi"
        error Retryable StreamInterrupted: the response stream was interrupted: the response body ended before the stream was complete (no finish_reason and no [DONE])
    "#]]
    .assert_eq(&decode(&[cut.as_bytes()]));
}

#[test]
fn bytes_after_done_are_ignored() {
    let body = [
        delta_chunk(r#"{"content":"a"}"#, Some("stop")),
        DONE.to_owned(),
        "data: not json at all\n\n".to_owned(),
    ]
    .concat();
    expect![[r#"
        text "a"
        stop EndTurn
    "#]]
    .assert_eq(&decode(&[body.as_bytes()]));
}

#[test]
fn a_whole_completion_decodes_like_a_stream() {
    let body = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Let me check.","tool_calls":[{"id":"call_9","type":"function","function":{"name":"lookup","arguments":"{\"q\":\"rust\"}"}},{"id":"call_10","type":"function","function":{"name":"broken","arguments":"{not json"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":5,"completion_tokens":9,"completion_tokens_details":{"reasoning_tokens":3}}}"#;
    let events = ChatStreamDecoder::decode_completion(body.as_bytes());
    let items: Vec<_> = match events {
        Ok(events) => events.into_iter().map(Ok).collect(),
        Err(e) => vec![Err(e)],
    };
    expect![[r#"
        text "Let me check."
        call_start #0 call_9 lookup
        call_args #0 "{\"q\":\"rust\"}"
        call_start #1 call_10 broken
        call_args #1 "{not json"
        usage in=5 out=9 cached=0 reasoning=3
        stop ToolCalls
    "#]]
    .assert_eq(&render_items(&items));
    let mut collector = ResponseCollector::new();
    for item in items {
        let event = item.expect("decoded");
        assert!(collector.push(event).is_ok());
    }
    let response = collector.finish();
    let calls = response.map(|r| r.message.tool_calls).unwrap_or_default();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].invalid_arguments.as_deref(), Some("{not json"));

    let garbage = ChatStreamDecoder::decode_completion(b"<html>bad gateway</html>");
    assert!(matches!(
        garbage,
        Err(InferenceExecutionError::MalformedResponse { .. })
    ));
}

#[test]
fn http_statuses_map_to_error_classes() {
    // A base URL without its version segment, so the 404s that are not about a model say so.
    const URL: &str = "http://localhost:8000/chat/completions";
    let after = Some(Duration::from_secs(3));
    let cases: &[(u16, &str)] = &[
        (
            429,
            r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
        ),
        (
            401,
            r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#,
        ),
        (403, "forbidden"),
        (
            404,
            r#"{"error":{"message":"The model `gpt-9` does not exist","code":"model_not_found"}}"#,
        ),
        (
            404,
            r#"{"error":{"message":"model \"gpt-9\" not found, try pulling it first"}}"#,
        ),
        (404, r#"{"detail":"Not Found"}"#),
        (404, "<html><body><h1>404 Not Found</h1></body></html>"),
        (
            404,
            r#"{"error":{"message":"Invalid URL (POST /chat/completions)","type":"invalid_request_error","code":null}}"#,
        ),
        (
            400,
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
        ),
        (
            400,
            r#"{"error":"prompt is too long: 9000 tokens > 8192 maximum"}"#,
        ),
        (
            400,
            r#"{"error":{"message":"flagged","code":"content_filter"}}"#,
        ),
        (
            400,
            r#"{"error":{"message":"'messages' is required","type":"invalid_request_error"}}"#,
        ),
        (422, "unprocessable"),
        (408, ""),
        (500, "internal"),
        (502, "<html>bad gateway</html>"),
        (503, r#"{"error":{"message":"overloaded"}}"#),
    ];
    let mut out = String::new();
    for (status, body) in cases {
        let e = error_from_status(*status, after, body, "gpt-9", URL);
        out.push_str(&format!(
            "{status} retry_after={:?} {}\n",
            e.retry_after(),
            crate::render_error(&e)
        ));
    }
    expect![[r#"
        429 retry_after=Some(3s) error Retryable RateLimited: rate limited by the provider (retry after 3s): Rate limit reached
        401 retry_after=None error Permanent Unauthorized: unauthorized (HTTP 401): Incorrect API key provided
        403 retry_after=None error Permanent Unauthorized: unauthorized (HTTP 403): forbidden
        404 retry_after=None error Permanent ModelNotFound: model "gpt-9" not found: The model `gpt-9` does not exist
        404 retry_after=None error Permanent ModelNotFound: model "gpt-9" not found: model "gpt-9" not found, try pulling it first
        404 retry_after=None error Permanent EndpointNotFound: the server has no `POST http://localhost:8000/chat/completions` (HTTP 404: {"detail":"Not Found"}); the base URL may lack its version segment: try `http://localhost:8000/v1`
        404 retry_after=None error Permanent EndpointNotFound: the server has no `POST http://localhost:8000/chat/completions` (HTTP 404: <html><body><h1>404 Not Found</h1></body></html>); the base URL may lack its version segment: try `http://localhost:8000/v1`
        404 retry_after=None error Permanent EndpointNotFound: the server has no `POST http://localhost:8000/chat/completions` (HTTP 404: Invalid URL (POST /chat/completions)); the base URL may lack its version segment: try `http://localhost:8000/v1`
        400 retry_after=None error Permanent ContextOverflow: the request exceeds the model's context window: This model's maximum context length is 8192 tokens.
        400 retry_after=None error Permanent ContextOverflow: the request exceeds the model's context window: prompt is too long: 9000 tokens > 8192 maximum
        400 retry_after=None error Permanent ContentFiltered: the provider's content filter refused the request: flagged
        400 retry_after=None error Permanent InvalidRequest: the provider rejected the request (HTTP 400): 'messages' is required
        422 retry_after=None error Permanent InvalidRequest: the provider rejected the request (HTTP 422): unprocessable
        408 retry_after=None error Retryable Timeout: inference timed out after 0ns waiting for response headers
        500 retry_after=None error Retryable ServerError: provider server error (HTTP 500): internal
        502 retry_after=None error Retryable ServerError: provider server error (HTTP 502): <html>bad gateway</html>
        503 retry_after=Some(3s) error Retryable Overloaded: provider overloaded (HTTP 503) (retry after 3s): overloaded
    "#]]
    .assert_eq(&out);
}

#[test]
fn retry_after_accepts_seconds_and_http_dates() {
    // 1994-11-06T08:49:37Z is 784111777.
    let now = 784_111_777;
    assert_eq!(parse_retry_after("5", now), Some(Duration::from_secs(5)));
    assert_eq!(
        parse_retry_after(" 0.25 ", now),
        Some(Duration::from_millis(250))
    );
    assert_eq!(
        parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
        Some(Duration::ZERO),
        "a date in the past means now"
    );
    assert_eq!(
        parse_retry_after("1e300", now),
        Some(Duration::MAX),
        "huge, not a panic"
    );
    assert_eq!(parse_retry_after("NaN", now), None);
    assert_eq!(parse_retry_after("-1", now), None);
    assert_eq!(parse_retry_after("soon", now), None);
    assert_eq!(
        parse_retry_after("Sun, 06 Foo 1994 08:50:07 GMT", now),
        None
    );
}

/// Found by the `openai_stream` fuzz target: a year too long for the date arithmetic
/// overflowed it (a panic in a debug build, a wrong delay in a release build).
#[test]
fn retry_after_dates_outside_four_digit_years_are_refused() {
    let now = 784_111_777;
    for date in [
        "Sun, 06 Nov 99999999999999999 08:49:37 GMT",
        "Sun, 06 Feb -9223372036854775808 08:49:37 GMT",
        "Sun, 06 Nov 9223372036854775807 08:49:37 GMT",
        "Sun, 06 Nov 10000 08:49:37 GMT",
    ] {
        assert_eq!(parse_retry_after(date, now), None, "{date}");
    }
    assert_eq!(
        parse_retry_after("Sun, 06 Nov 9999 08:49:37 GMT", now),
        Some(Duration::from_secs(253_397_494_177 - now)),
    );
    assert_eq!(
        parse_retry_after("Sun, 06 Nov 1960 08:49:37 GMT", now),
        Some(Duration::ZERO),
        "a date before 1970 is in the past"
    );
}

#[test]
fn request_body_carries_history_tools_and_overrides() {
    let call = ToolCall::new(
        ToolCallId::new("call_1").expect("valid id"),
        "lookup",
        serde_json::json!({"q": "rust"}),
    );
    let bad = ToolCall::from_raw_arguments(
        ToolCallId::new("call_2").expect("valid id"),
        "lookup",
        "{oops",
    );
    let mut image = Message::user("what is this?");
    image.content = [
        image.content[0].clone(),
        ContentBlock::Image {
            url: "https://example.invalid/cat.png".into(),
            media_type: None,
        },
    ]
    .into();
    let messages = vec![
        Message::user("find rust"),
        Message::assistant_with_calls("", vec![call.clone(), bad]),
        Message::tool(
            call.id.clone(),
            &awaken_event::ToolResult::success(serde_json::json!({"hits": 3})),
        ),
        image,
    ];
    let request = InferenceRequest::new("gpt-base", messages)
        .with_system_prompt("be brief")
        .with_tools(vec![ToolDescriptor::new("lookup", "searches")])
        .with_routing_key("thread-1")
        .with_overrides(
            InferenceOverride::default()
                .with_upstream_model("gpt-override")
                .with_temperature(0.5)
                .with_top_p(0.9)
                .with_max_tokens(100)
                .with_reasoning_effort(ReasoningEffort::Low),
        );
    let extra = serde_json::Map::from_iter([
        ("seed".to_owned(), serde_json::json!(7)),
        ("temperature".to_owned(), serde_json::json!(2.0)),
    ]);
    let options = BodyOptions {
        stream: true,
        include_usage: true,
        max_tokens_field: MaxTokensField::MaxCompletionTokens,
        extra: Some(&extra),
        routing_field: Some("prompt_cache_key"),
    };
    let body = request_body(&request, &options).expect("serializable");
    let value: serde_json::Value = serde_json::from_slice(&body).expect("JSON body");
    expect![[r#"
        {
          "max_completion_tokens": 100,
          "messages": [
            {
              "content": "be brief",
              "role": "system"
            },
            {
              "content": "find rust",
              "role": "user"
            },
            {
              "content": null,
              "role": "assistant",
              "tool_calls": [
                {
                  "function": {
                    "arguments": "{\"q\":\"rust\"}",
                    "name": "lookup"
                  },
                  "id": "call_1",
                  "type": "function"
                },
                {
                  "function": {
                    "arguments": "{oops",
                    "name": "lookup"
                  },
                  "id": "call_2",
                  "type": "function"
                }
              ]
            },
            {
              "content": "{\"hits\":3}",
              "role": "tool",
              "tool_call_id": "call_1"
            },
            {
              "content": [
                {
                  "text": "what is this?",
                  "type": "text"
                },
                {
                  "image_url": {
                    "url": "https://example.invalid/cat.png"
                  },
                  "type": "image_url"
                }
              ],
              "role": "user"
            }
          ],
          "model": "gpt-override",
          "prompt_cache_key": "thread-1",
          "reasoning_effort": "low",
          "seed": 7,
          "stream": true,
          "stream_options": {
            "include_usage": true
          },
          "temperature": 0.5,
          "tools": [
            {
              "function": {
                "description": "searches",
                "name": "lookup",
                "parameters": {
                  "type": "object"
                }
              },
              "type": "function"
            }
          ],
          "top_p": 0.9
        }"#]]
    .assert_eq(&serde_json::to_string_pretty(&value).expect("printable"));
}

#[test]
fn collector_rejects_broken_grammar() {
    let mut c = ResponseCollector::new();
    let orphan = c.push(LlmStreamEvent::ToolCallArgsDelta {
        index: 3,
        delta: "{}".into(),
    });
    assert!(matches!(
        orphan,
        Err(InferenceExecutionError::MalformedResponse { .. })
    ));
    let no_stop = ResponseCollector::new().finish();
    assert!(matches!(
        no_stop,
        Err(InferenceExecutionError::StreamInterrupted { .. })
    ));
}

#[test]
fn one_collector_collects_stream_after_stream() {
    let call = |index: u32, id: &str, args: &str| {
        [
            LlmStreamEvent::ToolCallStart {
                index,
                id: awaken_event::ToolCallId::new(id).expect("id"),
                name: "echo".into(),
            },
            LlmStreamEvent::ToolCallArgsDelta {
                index,
                delta: args.into(),
            },
        ]
    };
    let mut c = ResponseCollector::new();
    for e in call(0, "a", r#"{"text":"1"}"#)
        .into_iter()
        .chain(call(1, "b", r#"{"text":"2"}"#))
        .chain([
            LlmStreamEvent::TextDelta("first".into()),
            LlmStreamEvent::Usage(awaken_event::TokenUsage {
                input_tokens: 1,
                output_tokens: 2,
                ..Default::default()
            }),
            LlmStreamEvent::Stop(awaken_event::StopReason::ToolCalls),
        ])
    {
        c.push(e).expect("pushed");
    }
    let first = c.take().expect("first");
    assert_eq!(first.message.text(), "first");
    assert_eq!(first.message.tool_calls.len(), 2);
    assert_eq!(first.usage.output_tokens, 2);
    // The second stream starts from nothing: no text, call or usage of the first; its call
    // index 0 is new again.
    for e in call(0, "c", r#"{"text":"3"}"#)
        .into_iter()
        .chain([LlmStreamEvent::Stop(awaken_event::StopReason::ToolCalls)])
    {
        c.push(e).expect("pushed");
    }
    let second = c.take().expect("second");
    assert_eq!(second.message.text(), "");
    assert_eq!(
        second
            .message
            .tool_calls
            .iter()
            .map(|t| (t.id.as_str(), t.arguments["text"].as_str()))
            .collect::<Vec<_>>(),
        [("c", Some("3"))]
    );
    assert_eq!(second.usage, awaken_event::TokenUsage::default());
    // A stream that breaks the grammar or ends without a stop leaves nothing behind either.
    c.push(LlmStreamEvent::TextDelta("lost".into()))
        .expect("pushed");
    assert!(matches!(
        c.take(),
        Err(InferenceExecutionError::StreamInterrupted { .. })
    ));
    c.push(LlmStreamEvent::Stop(awaken_event::StopReason::EndTurn))
        .expect("pushed");
    assert!(c.push(LlmStreamEvent::TextDelta("late".into())).is_err());
    c.clear();
    c.push(LlmStreamEvent::TextDelta("third".into()))
        .expect("pushed");
    c.push(LlmStreamEvent::Stop(awaken_event::StopReason::EndTurn))
        .expect("pushed");
    assert_eq!(c.take().expect("third").message.text(), "third");
}

#[test]
fn an_event_that_never_ends_is_rejected_not_buffered_forever() {
    let mut decoder = ChatStreamDecoder::new();
    let mut out = Vec::new();
    let piece = vec![b'x'; 1024 * 1024];
    let mut result = decoder.push(b"data: ", &mut out);
    for _ in 0..17 {
        if result.is_err() {
            break;
        }
        result = decoder.push(&piece, &mut out);
    }
    assert!(
        matches!(
            result,
            Err(InferenceExecutionError::MalformedResponse { .. })
        ),
        "{result:?}"
    );
}

#[test]
fn only_the_first_choice_is_used_and_null_choices_are_fine() {
    let body = [
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"first\"}},{\"index\":1,\"delta\":{\"content\":\"second\"}}]}\n\n",
        "data: {\"choices\":null,\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n",
        "data: {\"choices\":[],\"usage\":null}\n\n",
        "data: {\"choices\":{\"not\":\"a list\"}}\n\n",
    ]
    .concat();
    expect![[r#"
        text "first"
        error Permanent MalformedResponse: malformed provider response: a chunk does not have the shape of a chat-completion chunk (in "{\"choices\":{\"not\":\"a list\"}}")
    "#]]
    .assert_eq(&decode(&[body.as_bytes()]));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Any number of cuts anywhere (inside characters, strings, `\n\n`) decodes the same.
    #[test]
    fn any_pieces_decode_like_the_whole(
        cuts in proptest::collection::vec(0usize..4000, 0..12),
        tools in proptest::bool::ANY,
    ) {
        let body = if tools { parallel_tool_stream() } else { text_stream() };
        let bytes = body.as_bytes();
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        let mut pieces = Vec::new();
        let mut start = 0;
        for cut in cuts {
            pieces.push(&bytes[start..cut]);
            start = cut;
        }
        pieces.push(&bytes[start..]);
        proptest::prop_assert_eq!(decode(&pieces), decode(&[bytes]));
    }
}
