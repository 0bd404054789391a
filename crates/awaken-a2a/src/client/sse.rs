//! A server-sent-events decoder: bytes in, the `data` of each complete event out.

/// The most bytes one event may hold before the stream counts as malformed.
pub(crate) const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// Why a byte stream is not a well-formed event stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SseError {
    /// A line is not UTF-8.
    #[error("line {line} of the event stream is not UTF-8")]
    NotUtf8 {
        /// The line's number, from 1.
        line: usize,
    },
    /// The stream ended inside an event.
    #[error("the event stream ended inside an event")]
    Truncated,
    /// An event grew past [`MAX_EVENT_BYTES`].
    #[error("an event of the stream is larger than {MAX_EVENT_BYTES} bytes")]
    TooLarge,
}

/// Splits a byte stream into events; only `data` fields are kept (joined by `\n`), `event`,
/// `id`, `retry` and comments are skipped.
#[derive(Debug, Default)]
pub(crate) struct SseDecoder {
    /// Bytes of the line not yet ended.
    pending: Vec<u8>,
    /// The data of the event being read.
    data: String,
    /// Whether the event being read has a `data` field.
    has_data: bool,
    /// Lines read so far.
    lines: usize,
}

impl SseDecoder {
    /// Feeds `bytes`, appending the data of every event they complete to `out`.
    pub(crate) fn feed(&mut self, bytes: &[u8], out: &mut Vec<String>) -> Result<(), SseError> {
        self.pending.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(end) = self.pending[start..].iter().position(|b| *b == b'\n') {
            let mut line = &self.pending[start..start + end];
            if let Some(stripped) = line.strip_suffix(b"\r") {
                line = stripped;
            }
            self.lines += 1;
            let line =
                std::str::from_utf8(line).map_err(|_| SseError::NotUtf8 { line: self.lines })?;
            if line.is_empty() {
                if self.has_data {
                    out.push(std::mem::take(&mut self.data));
                    self.has_data = false;
                }
            } else if let Some(value) = field(line, "data") {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            start += end + 1;
        }
        self.pending.drain(..start);
        if self.pending.len() + self.data.len() > MAX_EVENT_BYTES {
            return Err(SseError::TooLarge);
        }
        Ok(())
    }

    /// Whether bytes of an unfinished event are left (the stream ended inside an event).
    pub(crate) fn has_partial_event(&self) -> bool {
        self.has_data || !self.pending.iter().all(u8::is_ascii_whitespace)
    }
}

/// The value of `line` if it is the field `name` (`name: value` or `name:value`).
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(name)?.strip_prefix(':')?;
    Some(rest.strip_prefix(' ').unwrap_or(rest))
}
