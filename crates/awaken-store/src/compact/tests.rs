//! The compact form's tests.

use super::read::Reader;
use super::write::{Seen, Writer, put_u64};
use super::*;
use proptest::prelude::*;
use serde_json::json;

fn value_back(v: &Value) -> Value {
    let mut out = Vec::new();
    Writer::new(&mut out).value(v).expect("writes");
    let mut r = Reader::new(&out);
    let back = r.value().expect("reads back");
    assert!(r.is_empty(), "every byte read");
    back
}

/// Any JSON value: numbers of every kind (finite floats of any size), strings with what
/// needs escaping in JSON, nested arrays and objects.
fn any_value() -> impl Strategy<Value = Value> {
    let number = prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number,
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,4}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn every_value_reads_back_equal(v in any_value()) {
        let back = value_back(&v);
        prop_assert_eq!(&back, &v);
        // Equal as JSON text too: the same kind of number (a float stays a float).
        prop_assert_eq!(back.to_string(), v.to_string());
    }
}

#[test]
fn edge_numbers_keep_their_kind_and_value() {
    for v in [
        json!(0),
        json!(u64::MAX),
        json!(i64::MAX),
        json!(-1),
        json!(i64::MIN),
        json!(0.0),
        json!(-0.0),
        json!(1.0),
        json!(f64::MAX),
        json!(f64::MIN_POSITIVE),
        json!("\u{0}\u{1f}\"\\"),
    ] {
        let back = value_back(&v);
        assert_eq!(back.to_string(), v.to_string(), "{v}");
    }
}

fn sample() -> (Vec<u8>, Vec<u8>) {
    let mut message = Vec::new();
    Writer::new(&mut message)
        .message(&Message::assistant_with_calls(
            "lookup",
            vec![ToolCall::new(
                ToolCallId::new("c1").expect("id"),
                // A back-reference to the text.
                "lookup",
                json!({"a": [1, -2, 0.5, "x", null, true]}),
            )],
        ))
        .expect("writes");
    let mut event = Vec::new();
    Writer::new(&mut event)
        .event(&AgentEvent::ToolCallDone {
            call_id: ToolCallId::new("c1").expect("id"),
            result: Arc::new(ToolResult::success(json!({"k": "v"}))),
            state: ToolCallState::Succeeded,
        })
        .expect("writes");
    (message, event)
}

/// Bytes cut short anywhere, or with a byte changed to an unknown tag, are an error, never
/// a panic or a different value read as if whole.
#[test]
fn cut_or_damaged_bytes_are_errors() {
    let (message, event) = sample();
    assert!(Reader::new(&message).message().is_ok());
    assert!(Reader::new(&event).event().is_ok());
    for cut in 0..message.len() {
        assert!(Reader::new(&message[..cut]).message().is_err(), "cut {cut}");
    }
    for cut in 0..event.len() {
        assert!(Reader::new(&event[..cut]).event().is_err(), "cut {cut}");
    }
    let mut bad = message.clone();
    bad[0] = 9; // no such role
    assert!(Reader::new(&bad).message().is_err());
    let mut bad = event.clone();
    bad[0] = 200; // no such event tag
    assert!(Reader::new(&bad).event().is_err());
    // A count far beyond the bytes left.
    let mut huge = Vec::new();
    put_u64(&mut huge, u64::MAX);
    assert!(Reader::new(&huge).len().is_err());
    // A number with more than ten 7-bit groups, or over 64 bits in its tenth.
    assert!(Reader::new(&[0xff; 11]).u64().is_err());
    let mut max = [0xff; 10];
    max[9] = 1;
    assert_eq!(Reader::new(&max).u64().expect("u64::MAX"), u64::MAX);
    max[9] = 2;
    assert!(Reader::new(&max).u64().is_err());
    // Arrays nested deeper than a writer writes: an error, not a stack overflow.
    let deep: Vec<u8> = std::iter::repeat_n([ARRAY, 1], 100_000).flatten().collect();
    assert!(Reader::new(&deep).value().is_err());
}

/// A segment of several messages and events: every string repeated in it is written
/// once, and everything reads back equal.
#[test]
fn repeated_strings_are_written_once() {
    let call = |i: usize| {
        ToolCall::new(
            ToolCallId::new(format!("call-{i}")).expect("id"),
            "a_tool_name",
            json!({"argument_key": "an argument value"}),
        )
    };
    let messages: Vec<Message> = (0..4)
        .map(|i| Message::assistant_with_calls("", vec![call(i)]))
        .collect();
    let events: Vec<AgentEvent> = (0..4)
        .map(|i| AgentEvent::ToolCallReady {
            call_id: call(i).id,
            name: Arc::from("a_tool_name"),
            arguments: call(i).arguments,
        })
        .collect();
    let run_id = RunId::new("run-with-a-long-id-0123456789").expect("id");
    // The events first, two commits' worth (a writer resumed with what the first remembered),
    // then the messages, as the memory store writes a segment.
    let mut out = Vec::new();
    let mut seen = Seen::default();
    for half in events.chunks(2) {
        let mut writer = Writer::resume(&mut out, &mut seen);
        writer.run_marker(&run_id);
        for e in half {
            writer.event(e).expect("writes");
        }
    }
    // The messages in their own part, one commit at a time too, then put after the events.
    let mut message_part = Vec::new();
    for m in &messages {
        let mut writer = Writer::resume_messages(&mut message_part, &out, &mut seen);
        writer.message(m).expect("writes");
    }
    let messages_at = out.len();
    out.extend_from_slice(&message_part);

    let mut reader = Reader::part(&out, 0..messages_at);
    let mut run = None;
    for e in &events {
        assert_eq!(
            reader.run_event(&mut run).expect("reads"),
            (run_id.clone(), e.clone())
        );
    }
    assert!(reader.is_empty());
    let mut reader = Reader::messages(&out, messages_at);
    for m in &messages {
        assert_eq!(&reader.message().expect("reads"), m);
    }
    assert!(reader.is_empty());

    // Each repeated string's bytes are there once.
    let count = |needle: &str| {
        out.windows(needle.len())
            .filter(|w| *w == needle.as_bytes())
            .count()
    };
    assert_eq!(count("a_tool_name"), 1);
    assert_eq!(count("argument_key"), 1);
    assert_eq!(count("an argument value"), 1);
    // A call id is repeated in its message: written with the event only.
    assert_eq!(count("call-1"), 1);
    // And the run's id once, its second marker a reference.
    assert_eq!(count(run_id.as_str()), 1);
}

/// A back-reference that points forward, at itself, or at another reference is an error.
#[test]
fn bad_string_references_are_errors() {
    // A literal "ab" at 0, then a reference to it at 3 (reads "ab").
    let mut out = Vec::new();
    let mut writer = Writer::new(&mut out);
    writer.str("ab");
    writer.str("ab");
    assert_eq!(out, [4, b'a', b'b', 1]);
    let mut reader = Reader::new(&out);
    assert_eq!(reader.str().expect("literal"), "ab");
    assert_eq!(reader.str().expect("reference"), "ab");
    // Forward (to 5), at itself (3), and to the reference at 3 (from 4).
    for bad in [
        &[4, b'a', b'b', (5 << 1) | 1][..],
        &[4, b'a', b'b', (3 << 1) | 1],
        &[4, b'a', b'b', 1, (3 << 1) | 1],
    ] {
        let mut reader = Reader::new(bad);
        reader.str().expect("literal");
        let mut last = reader.str();
        if bad.len() == 5 {
            last = reader.str();
        }
        assert!(last.is_err(), "{bad:?}");
    }
}

/// In the messages part, a reference names the part of its literal: an event's literal (any,
/// the events come first) or an earlier message's; one to the messages' own place or past it
/// is an error.
#[test]
fn message_part_references_name_their_part() {
    let mut seen = Seen::default();
    let mut events = Vec::new();
    Writer::resume(&mut events, &mut seen).str("ab");
    let mut messages = Vec::new();
    let mut writer = Writer::resume_messages(&mut messages, &events, &mut seen);
    writer.str("ab");
    writer.str("cd");
    writer.str("cd");
    // "ab" in the events at 0 (part 0), "cd" a literal at 1 of the messages, then it again
    // (part 1, at 1).
    assert_eq!(messages, [0b0001, 4, b'c', b'd', (1 << 2) | 0b11]);
    let mut segment = events.clone();
    segment.extend_from_slice(&messages);
    let mut reader = Reader::messages(&segment, events.len());
    assert_eq!(reader.str().expect("event literal"), "ab");
    assert_eq!(reader.str().expect("literal"), "cd");
    assert_eq!(reader.str().expect("message literal"), "cd");
    // The events never refer to the messages: written there, "cd" is a literal.
    let mut more = events.clone();
    Writer::resume(&mut more, &mut seen).str("cd");
    assert_eq!(more[events.len()..], [4, b'c', b'd']);
    // A message reference to its own place, or to a message part place past it.
    for bad in [0b11u8, (1 << 2) | 0b11] {
        let mut segment = events.clone();
        segment.extend_from_slice(&[bad]);
        assert!(
            Reader::messages(&segment, events.len()).str().is_err(),
            "{bad}"
        );
    }
}

/// A value nested as deep as a reader takes is written and read back; one deeper is
/// refused by the writer (the thread then stays as it is), never written unreadable.
#[test]
fn nesting_is_bounded_on_both_sides() {
    let nested = |depth: usize| (0..depth).fold(json!(1), |v, _| json!([v]));
    let ok = nested(MAX_DEPTH - 1);
    assert_eq!(value_back(&ok), ok);
    let mut out = Vec::new();
    assert!(Writer::new(&mut out).value(&nested(MAX_DEPTH)).is_err());
}

/// JSON text kept as text is refused past the depth `serde_json` reads back; brackets inside
/// strings (escaped quotes included) do not count.
#[test]
fn json_text_depth_counts_only_real_brackets() {
    let nested = |d: usize| format!("{}{}", "[".repeat(d), "]".repeat(d));
    assert!(crate::json_depth::nests_within(
        &nested(MAX_TEXT_DEPTH),
        MAX_TEXT_DEPTH
    ));
    assert!(!crate::json_depth::nests_within(
        &nested(MAX_TEXT_DEPTH + 1),
        MAX_TEXT_DEPTH
    ));
    assert!(crate::json_depth::nests_within(
        r#"["[[[[", "\"[[[", {"k": "{{{{"}]"#,
        2
    ));
    let mut out = Vec::new();
    let mut writer = Writer::new(&mut out);
    assert!(
        writer
            .state_entry("k", &nested(MAX_TEXT_DEPTH + 1))
            .is_err()
    );
    assert!(writer.state_entry("k", &nested(MAX_TEXT_DEPTH)).is_ok());
}

/// Each tag table reads back the variant its code writes.
#[test]
fn tag_tables_match_their_codes() {
    for (i, r) in ROLES.iter().enumerate() {
        assert_eq!(usize::from(role_code(*r)), i, "{r:?}");
    }
    for (i, s) in ToolCallState::ALL.iter().enumerate() {
        assert_eq!(usize::from(state_code(*s)), i, "{s:?}");
    }
    for (i, s) in STATUSES.iter().enumerate() {
        assert_eq!(usize::from(status_code(*s)), i, "{s:?}");
    }
}

/// A finished run's row reads back field for field: extreme numbers and times, every shape of
/// termination, and digests in the resolver's `sha256:` form (kept as 32 bytes) or any other
/// text (kept as written).
#[test]
fn run_rows_read_back_whole() {
    let sha = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let digests = [
        sha.clone(),
        sha.to_uppercase(),
        format!("sha256:{}", "0123456789abcdef".repeat(4).replace('f', "g")),
        sha[..sha.len() - 1].to_owned(),
        format!("{sha}0"),
        "sha256:".to_owned(),
        String::new(),
        "md5:xyz".to_owned(),
    ];
    let terminations = [
        None,
        Some(TerminationReason::NaturalEnd),
        Some(TerminationReason::stopped("code", "a \"detail\"\n")),
        Some(TerminationReason::error("")),
    ];
    let run_id = RunId::new("r1").expect("id");
    let thread_id = ThreadId::new("t1").expect("id");
    for (i, digest) in digests.iter().enumerate() {
        let mut record = RunRecord::new(
            run_id.clone(),
            "agent",
            Timestamp::from_unix_millis(i64::MIN),
        );
        record.status = RunStatus::Done;
        record.parent_run_id = (i % 2 == 0).then(|| RunId::new("parent").expect("id"));
        record.profile_id = (i % 3 == 0).then(|| ProfileId::new("p").expect("id"));
        record.termination = terminations[i % terminations.len()].clone();
        record.steps = u32::MAX;
        record.usage = TokenUsage {
            input_tokens: u64::MAX,
            output_tokens: 0,
            cached_input_tokens: 1,
            reasoning_tokens: 1 << 63,
        };
        record.spec_digest = digest.as_str().into();
        record.updated_at = Timestamp::from_unix_millis(i64::MAX - i as i64);
        let mut out = Vec::new();
        Writer::new(&mut out)
            .run_row(&thread_id, &record, None, u64::MAX, 7)
            .expect("writes");
        let mut reader = Reader::new(&out);
        let back = reader.run_row(&run_id, |_| None).expect("reads back");
        assert!(reader.is_empty(), "every byte read");
        assert_eq!(
            back,
            (thread_id.clone(), record.clone(), u64::MAX, 7),
            "{digest:?}"
        );
        // A digest the store keeps: its place, read back through the store's table.
        let mut out = Vec::new();
        Writer::new(&mut out)
            .run_row(&thread_id, &record, Some(3), 1, 2)
            .expect("writes");
        let kept = |at| (at == 3).then(|| record.spec_digest.clone());
        let back = Reader::new(&out)
            .run_row(&run_id, kept)
            .expect("reads back");
        assert_eq!(back, (thread_id.clone(), record, 1, 2), "{digest:?}");
        assert!(Reader::new(&out).run_row(&run_id, |_| None).is_err());
    }
    // The sha256 digest takes a tag and 32 bytes, not a tag, a two-byte length and 71 bytes.
    let length = |digest: &str| {
        let mut record = RunRecord::new(run_id.clone(), "agent", Timestamp::EPOCH);
        record.spec_digest = digest.into();
        let mut out = Vec::new();
        Writer::new(&mut out)
            .run_row(&thread_id, &record, None, 0, 0)
            .expect("writes");
        out.len()
    };
    assert_eq!(length(&sha) + 41, length(&digests[1]));
}
