//! The chat-completions decoder (`awaken_llm::openai::ChatStreamDecoder`) from SSE data lines to
//! events: chunks of every shape (text, reasoning, tool-call fragments with and without index
//! or id, finish reasons, usage, errors) mixed with arbitrary data lines and bytes. Every
//! cutting of the body decodes alike, and what it decodes keeps the event grammar
//! (`ResponseCollector` accepts it, `Stop` comes once and last). Also the other answers a
//! server sends: a whole completion, an error status's body and a `Retry-After` value.

#![no_main]

use std::collections::HashSet;

use arbitrary::Arbitrary;
use awaken_llm::openai::{ChatStreamDecoder, error_from_status, parse_retry_after};
use awaken_llm::{LlmStreamEvent, ResponseCollector};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};

#[derive(Debug, Arbitrary)]
struct Input<'a> {
    pieces: Vec<Piece<'a>>,
    /// Sizes of the pieces the body is fed in.
    cuts: Vec<u8>,
    /// An HTTP error: its status and body.
    error: Option<(u16, &'a str)>,
    /// A `Retry-After` value and the clock.
    retry_after: Option<(RetryAfter<'a>, u64)>,
}

/// A `Retry-After` value: seconds, an HTTP date of any numbers, or any text.
#[derive(Debug, Arbitrary)]
enum RetryAfter<'a> {
    Seconds(f64),
    Date {
        weekday: u8,
        day: u8,
        month: u8,
        year: i64,
        time: (u8, u8, u8),
    },
    Text(&'a str),
}

impl RetryAfter<'_> {
    fn text(&self) -> String {
        const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
        const MONTHS: [&str; 13] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            "Xyz",
        ];
        match self {
            RetryAfter::Seconds(s) => s.to_string(),
            RetryAfter::Date {
                weekday,
                day,
                month,
                year,
                time: (h, m, s),
            } => format!(
                "{}, {day:02} {} {year} {h:02}:{m:02}:{s:02} GMT",
                DAYS[usize::from(*weekday) % 7],
                MONTHS[usize::from(*month) % 13]
            ),
            RetryAfter::Text(t) => (*t).to_owned(),
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Piece<'a> {
    Chunk(Chunk),
    /// A `data:` line with any text.
    Data(&'a str),
    Done,
    Comment(&'a str),
    /// Any bytes.
    Raw(&'a [u8]),
}

#[derive(Debug, Arbitrary)]
struct Chunk {
    content: Option<String>,
    /// Reasoning, in `reasoning_content` (true) or `reasoning`.
    reasoning: Option<(bool, String)>,
    tool_calls: Option<Vec<CallDelta>>,
    finish: Option<Finish>,
    usage: Option<(u32, u32, Option<u16>, Option<u16>)>,
    error: Option<(Option<String>, Option<String>, Option<String>)>,
    /// The delta as `message` (a whole completion's shape).
    as_message: bool,
    /// A second choice, which is ignored.
    second_choice: bool,
}

#[derive(Debug, Arbitrary)]
struct CallDelta {
    index: Option<u8>,
    id: Option<CallId>,
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Debug, Arbitrary)]
enum CallId {
    A,
    B,
    C,
    Empty,
    Text(String),
}

#[derive(Debug, Arbitrary)]
enum Finish {
    Stop,
    ToolCalls,
    Length,
    ContentFilter,
    Null,
    Other(String),
}

/// An event or the error that ended decoding, rendered with generated call ids blanked.
type Item = String;

fuzz_target!(|input: Input<'_>| {
    let mut given_ids = HashSet::new();
    let mut body = Vec::new();
    for piece in &input.pieces {
        match piece {
            Piece::Chunk(c) => {
                body.extend_from_slice(b"data: ");
                body.extend_from_slice(chunk_json(c, &mut given_ids).to_string().as_bytes());
                body.extend_from_slice(b"\n\n");
            }
            Piece::Data(text) => {
                body.extend_from_slice(b"data: ");
                body.extend_from_slice(text.as_bytes());
                body.extend_from_slice(b"\n\n");
            }
            Piece::Done => body.extend_from_slice(b"data: [DONE]\n\n"),
            Piece::Comment(text) => {
                body.push(b':');
                body.extend_from_slice(text.as_bytes());
                body.push(b'\n');
            }
            Piece::Raw(bytes) => body.extend_from_slice(bytes),
        }
    }

    let whole = decode(&[&body], &given_ids);
    let mut pieces = Vec::new();
    let mut rest = &body[..];
    for &cut in &input.cuts {
        let (head, tail) = rest.split_at(usize::from(cut).min(rest.len()));
        pieces.push(head);
        rest = tail;
    }
    pieces.push(rest);
    let split = decode(&pieces, &given_ids);
    assert_eq!(whole, split, "the events depend on where the body was cut");

    // The first chunk as a whole (non-streamed) completion.
    if let Some(Piece::Chunk(c)) = input.pieces.first() {
        let text = chunk_json(c, &mut given_ids).to_string();
        if let Ok(events) = ChatStreamDecoder::decode_completion(text.as_bytes()) {
            check_grammar(&events, true);
        }
    }
    if let Some((status, text)) = input.error {
        let error = error_from_status(status, None, text, "model-x", "http://127.0.0.1/v1");
        let _ = error.to_string();
    }
    if let Some((value, now)) = &input.retry_after {
        let text = value.text();
        if let (Some(later), Some(at_zero)) =
            (parse_retry_after(&text, *now), parse_retry_after(&text, 0))
        {
            assert!(later <= at_zero, "{text:?}: a later clock waits longer");
        }
    }
});

/// Decodes `pieces` in order, then ends the body: the events, and the error that stopped it.
fn decode(pieces: &[&[u8]], given_ids: &HashSet<String>) -> Vec<Item> {
    let mut decoder = ChatStreamDecoder::new();
    let mut out = Vec::new();
    let mut failed = None;
    for piece in pieces {
        if let Err(e) = decoder.push(piece, &mut out) {
            failed = Some(e);
            break;
        }
    }
    if failed.is_none()
        && let Err(e) = decoder.finish(&mut out)
    {
        failed = Some(e);
    }
    check_grammar(&out, failed.is_none());
    let mut items: Vec<Item> = out.iter().map(|e| render(e, given_ids)).collect();
    if let Some(e) = failed {
        items.push(format!("error: {e}"));
    }
    items
}

/// The stream grammar: the collector takes every event; a complete stream has one `Usage` at
/// most and ends with its one `Stop`.
fn check_grammar(events: &[LlmStreamEvent], complete: bool) {
    let mut collector = ResponseCollector::new();
    for e in events {
        if let Err(err) = collector.push(e.clone()) {
            panic!("the decoder broke the event grammar at {e:?}: {err}");
        }
    }
    let stops = events
        .iter()
        .filter(|e| matches!(e, LlmStreamEvent::Stop(_)))
        .count();
    let usages = events
        .iter()
        .filter(|e| matches!(e, LlmStreamEvent::Usage(_)))
        .count();
    assert!(usages <= 1, "{usages} usage events");
    if complete {
        assert_eq!(stops, 1, "a complete stream has one stop event");
        assert!(matches!(events.last(), Some(LlmStreamEvent::Stop(_))));
        assert!(collector.finish().is_ok());
    } else {
        assert_eq!(stops, 0, "a failed stream has no stop event");
    }
}

fn render(event: &LlmStreamEvent, given_ids: &HashSet<String>) -> Item {
    match event {
        LlmStreamEvent::ToolCallStart { index, id, name } => {
            let id = if given_ids.contains(id.as_str()) {
                id.as_str()
            } else {
                "<generated>"
            };
            format!("start {index} {id} {name:?}")
        }
        other => format!("{other:?}"),
    }
}

fn chunk_json(c: &Chunk, given_ids: &mut HashSet<String>) -> Value {
    let mut delta = Map::new();
    if let Some(text) = &c.content {
        delta.insert("content".into(), json!(text));
    }
    if let Some((field, text)) = &c.reasoning {
        let key = if *field {
            "reasoning_content"
        } else {
            "reasoning"
        };
        delta.insert(key.into(), json!(text));
    }
    if let Some(calls) = &c.tool_calls {
        let calls: Vec<Value> = calls
            .iter()
            .map(|call| {
                let mut v = Map::new();
                if let Some(i) = call.index {
                    v.insert("index".into(), json!(i));
                }
                if let Some(id) = &call.id {
                    let id = match id {
                        CallId::A => "call_a".to_owned(),
                        CallId::B => "call_b".to_owned(),
                        CallId::C => "call_c".to_owned(),
                        CallId::Empty => String::new(),
                        CallId::Text(t) => t.clone(),
                    };
                    given_ids.insert(id.clone());
                    v.insert("id".into(), json!(id));
                }
                let mut function = Map::new();
                if let Some(name) = &call.name {
                    function.insert("name".into(), json!(name));
                }
                if let Some(args) = &call.arguments {
                    function.insert("arguments".into(), json!(args));
                }
                v.insert("type".into(), json!("function"));
                v.insert("function".into(), Value::Object(function));
                Value::Object(v)
            })
            .collect();
        delta.insert("tool_calls".into(), Value::Array(calls));
    }
    let finish = match &c.finish {
        None => None,
        Some(Finish::Stop) => Some(json!("stop")),
        Some(Finish::ToolCalls) => Some(json!("tool_calls")),
        Some(Finish::Length) => Some(json!("length")),
        Some(Finish::ContentFilter) => Some(json!("content_filter")),
        Some(Finish::Null) => Some(Value::Null),
        Some(Finish::Other(t)) => Some(json!(t)),
    };
    let mut choice = Map::new();
    choice.insert("index".into(), json!(0));
    let key = if c.as_message { "message" } else { "delta" };
    choice.insert(key.into(), Value::Object(delta));
    if let Some(f) = finish {
        choice.insert("finish_reason".into(), f);
    }
    let mut choices = vec![Value::Object(choice)];
    if c.second_choice {
        choices.push(json!({"index": 1, "delta": {"content": "ignored"}}));
    }
    let mut chunk = Map::new();
    chunk.insert("id".into(), json!("chatcmpl-1"));
    chunk.insert("choices".into(), Value::Array(choices));
    if let Some((input, output, cached, reasoning)) = c.usage {
        let mut usage = json!({"prompt_tokens": input, "completion_tokens": output});
        if let Some(n) = cached {
            usage["prompt_tokens_details"] = json!({"cached_tokens": n});
        }
        if let Some(n) = reasoning {
            usage["completion_tokens_details"] = json!({"reasoning_tokens": n});
        }
        chunk.insert("usage".into(), usage);
    }
    if let Some((message, kind, code)) = &c.error {
        chunk.insert(
            "error".into(),
            json!({"message": message, "type": kind, "code": code}),
        );
    }
    Value::Object(chunk)
}
