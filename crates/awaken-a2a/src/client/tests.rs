//! The event-stream decoder: fields, line endings and chunk boundaries.

use super::sse::{SseDecoder, SseError};

fn decode_in_chunks(bytes: &[u8], chunk: usize) -> Result<(Vec<String>, bool), SseError> {
    let mut decoder = SseDecoder::default();
    let mut out = Vec::new();
    for piece in bytes.chunks(chunk) {
        decoder.feed(piece, &mut out)?;
    }
    Ok((out, decoder.has_partial_event()))
}

#[test]
fn data_fields_make_events_and_everything_else_is_skipped() {
    let stream = ": a comment\nevent: update\nid: 7\nretry: 10\ndata: {\"a\":1}\n\ndata:no space\r\ndata:  two spaces\r\n\r\n\n\ndata: é ✓\n\n";
    let expected = vec![
        "{\"a\":1}".to_owned(),
        "no space\n two spaces".to_owned(),
        "é ✓".to_owned(),
    ];
    // Whole, and cut at every byte (inside CRLFs and multi-byte characters too).
    for chunk in [stream.len(), 1, 2, 3, 5] {
        assert_eq!(
            decode_in_chunks(stream.as_bytes(), chunk),
            Ok((expected.clone(), false)),
            "chunks of {chunk} bytes"
        );
    }
}

#[test]
fn a_stream_cut_inside_an_event_leaves_a_partial_event() {
    assert_eq!(
        decode_in_chunks(b"data: {\"a\":1}\n\ndata: {\"b\"", 4),
        Ok((vec!["{\"a\":1}".to_owned()], true))
    );
    assert_eq!(
        decode_in_chunks(b"data: {\"a\":1}\n", 4),
        Ok((Vec::new(), true)),
        "a data line without the blank line that ends its event"
    );
    assert_eq!(
        decode_in_chunks(b"data: x\n\n\n", 4).map(|(_, p)| p),
        Ok(false)
    );
}

#[test]
fn a_line_that_is_not_utf8_is_an_error_naming_it() {
    assert_eq!(
        decode_in_chunks(b"data: ok\n\ndata: \xff\xfe\n\n", 3),
        Err(SseError::NotUtf8 { line: 3 })
    );
}
