//! The IO-free SSE parser.

use std::convert::Infallible;

use awaken_llm::SseParser;
use expect_test::expect;

/// Feeds `pieces` and renders every dispatched event as `event|data` (newlines shown as ⏎).
fn parse(pieces: &[&[u8]]) -> (String, bool) {
    let mut parser = SseParser::new();
    let mut out = String::new();
    for piece in pieces {
        parser
            .push(piece, |e| {
                out.push_str(&format!("{}|{}\n", e.event, e.data.replace('\n', "⏎")));
                Ok::<(), Infallible>(())
            })
            .unwrap_or_else(|never| match never {});
    }
    (out, parser.has_partial())
}

const BODY: &str = ": keep-alive\n\
data: one\n\
\n\
event: update\r\n\
data: two\r\n\
data:  three spaced\r\n\
\r\n\
data:é€😀\r\r\
id: 7\n\
retry: 10\n\
data\n\
\n\
\n\
data: unterminated";

#[test]
fn parses_fields_line_endings_and_comments() {
    let (out, partial) = parse(&[BODY.as_bytes()]);
    expect![[r#"
        message|one
        update|two⏎ three spaced
        message|é€😀
        message|
    "#]]
    .assert_eq(&out);
    assert!(partial, "the last event has no blank line yet");
}

#[test]
fn every_split_point_gives_the_same_events() {
    let bytes = BODY.as_bytes();
    let (whole, _) = parse(&[bytes]);
    for i in 0..=bytes.len() {
        let (split, _) = parse(&[&bytes[..i], &bytes[i..]]);
        assert_eq!(split, whole, "split at byte {i}");
    }
    // One byte at a time: every boundary at once, including inside \r\n and UTF-8 sequences.
    let singles: Vec<&[u8]> = bytes.chunks(1).collect();
    let (bytewise, _) = parse(&singles);
    assert_eq!(bytewise, whole);
}

#[test]
fn invalid_utf8_is_replaced_not_fatal() {
    let (out, _) = parse(&[b"data: a\xffb\n\n"]);
    assert_eq!(out, "message|a\u{fffd}b\n");
}

#[test]
fn callback_errors_stop_parsing() {
    let mut parser = SseParser::new();
    let mut seen = 0;
    let result = parser.push(b"data: 1\n\ndata: 2\n\n", |_| {
        seen += 1;
        Err("stop")
    });
    assert_eq!(result, Err("stop"));
    assert_eq!(seen, 1);
}
