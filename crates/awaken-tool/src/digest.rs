//! The canonical argument digest carried by `SuspendTicket` and `ToolCallResume`.
//!
//! Format (version 1, stable across processes, platforms and object key order):
//!
//! 1. Canonical JSON of the arguments: objects with their keys sorted by the bytes of their
//!    UTF-8 encoding (recursively), arrays in their order, no whitespace, strings escaped as
//!    `serde_json` escapes them (`"`, `\`, control characters; everything else verbatim),
//!    numbers as `serde_json` prints them (so `1` and `1.0` are different arguments).
//! 2. SHA-256 of those bytes.
//! 3. The digest is `sha256:` followed by the 64 lowercase hex digits.

use std::fmt::Write as _;

use awaken_event::{PendingCall, ToolCall};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The prefix of every digest this crate produces (`sha256:` + 64 hex digits).
pub const DIGEST_PREFIX: &str = "sha256:";

/// The canonical JSON text of `value`: keys sorted recursively, compact (see the module docs).
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

/// The canonical digest of a call's arguments: `sha256:<64 hex digits>` of
/// [`canonical_json`]. Two argument values that differ only in object key order have the same
/// digest; any other difference changes it.
pub fn argument_digest(arguments: &Value) -> String {
    let hash = Sha256::digest(canonical_json(arguments).as_bytes());
    hex_with_prefix(DIGEST_PREFIX, &hash)
}

/// The [`PendingCall`] a suspension ticket shows for `call`, with its argument digest.
pub fn pending_call(call: &ToolCall) -> PendingCall {
    PendingCall {
        call_id: call.id.clone(),
        tool_name: call.name.clone(),
        arguments: Value::clone(&call.arguments),
        argument_digest: argument_digest(&call.arguments),
    }
}

/// A SHA-256 digest fed incrementally through [`std::io::Write`] (for instance by
/// `serde_json::to_writer`) and finished as `sha256:<64 hex digits>`: digests a serialized
/// value without building its text or a JSON tree first.
#[derive(Default)]
pub struct DigestWriter(Sha256);

impl DigestWriter {
    /// An empty digest.
    pub fn new() -> Self {
        Self::default()
    }

    /// `sha256:` followed by the 64 lowercase hex digits of everything written.
    pub fn finish(self) -> String {
        hex_with_prefix(DIGEST_PREFIX, &self.0.finalize())
    }
}

impl std::io::Write for DigestWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub(crate) fn hex_with_prefix(prefix: &str, bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(prefix.len() + bytes.len() * 2);
    out.push_str(prefix);
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // Sorted here, whatever order the map keeps (`preserve_order` may be enabled by
            // another crate in the build).
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    // serde_json's escaping of a string cannot fail.
    match serde_json::to_string(s) {
        Ok(escaped) => out.push_str(&escaped),
        Err(_) => out.push_str("\"\""),
    }
}
