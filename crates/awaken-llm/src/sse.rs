//! An IO-free parser of server-sent events (the `text/event-stream` format): bytes in, events
//! out, in pieces of any size.

/// One dispatched server-sent event, borrowed from the parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    /// The event type (`"message"` when the event named none).
    pub event: &'a str,
    /// The data lines joined with `\n`.
    pub data: &'a str,
}

#[derive(Debug, Default)]
struct Pending {
    data: String,
    event: String,
    has_data: bool,
}

impl Pending {
    fn line<E>(
        &mut self,
        line: &[u8],
        on_event: &mut impl FnMut(SseEvent<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        if line.is_empty() {
            if self.has_data {
                let event = if self.event.is_empty() {
                    "message"
                } else {
                    &self.event
                };
                let result = on_event(SseEvent {
                    event,
                    data: &self.data,
                });
                self.data.clear();
                self.event.clear();
                self.has_data = false;
                return result;
            }
            self.event.clear();
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(()); // a comment (keep-alive)
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let value = &line[i + 1..];
                (&line[..i], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &line[..0]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                push_utf8(&mut self.data, value);
                self.has_data = true;
            }
            b"event" => {
                self.event.clear();
                push_utf8(&mut self.event, value);
            }
            _ => {} // `id`, `retry` and unknown fields do not matter here
        }
        Ok(())
    }
}

fn push_utf8(out: &mut String, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => out.push_str(s),
        Err(_) => out.push_str(&String::from_utf8_lossy(bytes)),
    }
}

/// Parses a `text/event-stream` body fed in arbitrary pieces.
///
/// Lines may end in `\n`, `\r\n` or `\r`, and any piece boundary may fall anywhere (inside a
/// line, a UTF-8 character or a `\r\n` pair): a line is decoded only once it is complete.
/// Invalid UTF-8 is replaced (U+FFFD), as the format prescribes. An event is dispatched at the
/// blank line that ends it; an event still incomplete when the body ends is discarded
/// ([`SseParser::has_partial`] tells whether there is one).
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    pending: Pending,
    skip_lf: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next piece of the body, calling `on_event` for every event it completes. An
    /// error from `on_event` stops parsing and is returned; the parser should then be dropped.
    pub fn push<E>(
        &mut self,
        bytes: &[u8],
        mut on_event: impl FnMut(SseEvent<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.skip_lf {
                self.skip_lf = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match memchr::memchr2(b'\n', b'\r', rest) {
                None => {
                    self.line.extend_from_slice(rest);
                    break;
                }
                Some(i) => {
                    self.skip_lf = rest[i] == b'\r';
                    if self.line.is_empty() {
                        self.pending.line(&rest[..i], &mut on_event)?;
                    } else {
                        self.line.extend_from_slice(&rest[..i]);
                        let result = self.pending.line(&self.line, &mut on_event);
                        self.line.clear();
                        result?;
                    }
                    rest = &rest[i + 1..];
                }
            }
        }
        Ok(())
    }

    /// How many bytes of unfinished lines and events are buffered (callers bound it to reject
    /// a body that never ends a line).
    pub fn buffered_len(&self) -> usize {
        self.line.len() + self.pending.data.len()
    }

    /// Whether an unfinished line or event is buffered (at the end of a body, it is lost).
    pub fn has_partial(&self) -> bool {
        !self.line.is_empty() || self.pending.has_data
    }
}
