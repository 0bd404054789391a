//! The SSE parser (`awaken_llm::SseParser`) fed a body cut into arbitrary pieces: every cutting
//! gives the events of a plain model of the format (lines ending in `\n`, `\r\n` or `\r`; data
//! lines joined with `\n`; an event dispatched at a blank line; invalid UTF-8 replaced), and
//! leaves the same unfinished line and event behind.

#![no_main]

use arbitrary::Arbitrary;
use awaken_llm::SseParser;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input<'a> {
    /// Sizes of the pieces the body is fed in (the rest goes in one last piece).
    cuts: Vec<u8>,
    body: &'a [u8],
}

/// An event as (type, data).
type Event = (String, String);

fuzz_target!(|input: Input<'_>| {
    let body = input.body;
    let (whole, whole_state) = parse(&[body]);
    let mut pieces = Vec::new();
    let mut rest = body;
    for &cut in &input.cuts {
        let n = usize::from(cut).min(rest.len());
        let (head, tail) = rest.split_at(n);
        pieces.push(head);
        rest = tail;
    }
    pieces.push(rest);
    let (split, split_state) = parse(&pieces);
    assert_eq!(whole, split, "the events depend on where the body was cut");
    assert_eq!(whole_state, split_state, "what is left depends on the cuts");
    let (expected, partial) = model(body);
    assert_eq!(whole, expected, "the events differ from the format's");
    assert_eq!(
        whole_state.0, partial,
        "has_partial differs from the format's"
    );
});

/// The events of `pieces` fed in order, and whether (and how much) is left unfinished.
fn parse(pieces: &[&[u8]]) -> (Vec<Event>, (bool, usize)) {
    let mut parser = SseParser::new();
    let mut events = Vec::new();
    for piece in pieces {
        let pushed: Result<(), ()> = parser.push(piece, |e| {
            events.push((e.event.to_owned(), e.data.to_owned()));
            Ok(())
        });
        assert!(pushed.is_ok(), "the callback never fails");
    }
    (events, (parser.has_partial(), parser.buffered_len()))
}

/// The format, line by line: the events of `body` and whether an unfinished line or event is
/// left at its end.
fn model(body: &[u8]) -> (Vec<Event>, bool) {
    let mut events = Vec::new();
    let (mut data, mut event, mut has_data) = (String::new(), String::new(), false);
    let mut lines = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'\n' => {
                lines.push(&body[start..i]);
                start = i + 1;
            }
            b'\r' => {
                lines.push(&body[start..i]);
                if body.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    let unfinished_line = start < body.len();
    for line in lines {
        if line.is_empty() {
            if has_data {
                let name = if event.is_empty() { "message" } else { &event };
                events.push((name.to_owned(), std::mem::take(&mut data)));
                has_data = false;
            }
            event.clear();
            continue;
        }
        if line[0] == b':' {
            continue;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(at) => {
                let value = &line[at + 1..];
                (&line[..at], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &line[..0]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"data" => {
                if has_data {
                    data.push('\n');
                }
                data.push_str(&value);
                has_data = true;
            }
            b"event" => event = value.into_owned(),
            _ => {}
        }
    }
    (events, unfinished_line || has_data)
}
