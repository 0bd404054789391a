//! Writing a segment.

use std::borrow::BorrowMut;

use super::*;
use crate::json_depth::nests_within;

pub(super) fn put_u64(out: &mut Vec<u8>, mut v: u64) {
    // (Most numbers written are counts, tags' payloads and short strings' lengths.)
    if v < 0x80 {
        out.push(v as u8);
        return;
    }
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The 32 bytes a `sha256:<64 lowercase hex digits>` digest spells, if it is one.
fn sha256_bytes(digest: &str) -> Option<[u8; 32]> {
    let hex = digest.strip_prefix(SHA256_PREFIX)?.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut bytes = [0u8; 32];
    for (b, pair) in bytes.iter_mut().zip(hex.chunks_exact(2)) {
        *b = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(bytes)
}

/// How many bytes `put_u64` takes for `v`.
fn u64_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Whether `seen` is `s`. A short string (most are) is compared in the loop here: a call to
/// `memcmp` costs more than its compare.
fn same(seen: &[u8], s: &[u8]) -> bool {
    if s.len() <= 16 {
        seen.len() == s.len() && seen.iter().zip(s).all(|(a, b)| a == b)
    } else {
        seen == s
    }
}

/// The set of slots a string of at least two bytes is remembered in: a hash of its length and
/// of its first and last bytes (up to eight of each). Cheaper than a hash of every byte, and as
/// good here: a collision only loses a back-reference.
fn set_of(b: &[u8]) -> usize {
    let n = b.len();
    let word = |i: usize| -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(w)
    };
    let half = |i: usize| -> u64 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&b[i..i + 4]);
        u64::from(u32::from_le_bytes(w))
    };
    let (x, y) = if n >= 8 {
        (word(0), word(n - 8))
    } else if n >= 4 {
        (half(0), half(n - 4))
    } else {
        (
            u64::from(b[0]) << 8 | u64::from(b[n - 1]),
            u64::from(b[n / 2]),
        )
    };
    let h = (x ^ y.rotate_left(29) ^ n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 56) as usize % SEEN_SETS
}

/// How many sets of [`SEEN_WAYS`] slots a writer remembers strings in for back-references (a
/// hash of the string picks the set; the most recent literals of a set are kept). A thread
/// being written keeps its table (see [`Writer::resume`]): a small one.
const SEEN_SETS: usize = 32;
const SEEN_WAYS: usize = 2;
const SEEN_SLOTS: usize = SEEN_SETS * SEEN_WAYS;

/// The literals a segment's writer remembers for back-references: per slot, a literal's
/// position in its part plus one (the high bits), the part (events or the only one: 0,
/// messages: 1) and its length (the low [`SEEN_LEN_BITS`] bits); 0: none. A literal past half
/// a mebibyte into its part, or over 4 KiB, is not remembered.
#[derive(Debug, Clone)]
pub(crate) struct Seen([u32; SEEN_SLOTS]);

const SEEN_LEN_BITS: u32 = 12;
const SEEN_POS_SHIFT: u32 = SEEN_LEN_BITS + 1;

impl Default for Seen {
    fn default() -> Self {
        Self([0; SEEN_SLOTS])
    }
}

impl Seen {
    /// Forgets the literals of `part` at or past `len` (the part was cut back to `len`
    /// bytes).
    pub(crate) fn forget_from(&mut self, part: u8, len: usize) {
        for slot in &mut self.0 {
            let (at, slot_part, _) = seen_parts(*slot);
            if *slot != 0 && slot_part == part && at >= len {
                *slot = 0;
            }
        }
    }
}

/// A slot remembering a literal of `len` bytes at `at` of `part` (`None`: too far or too
/// long).
fn seen_slot(at: usize, part: u8, len: usize) -> Option<u32> {
    let at = u32::try_from(at + 1)
        .ok()
        .filter(|a| a >> (32 - SEEN_POS_SHIFT) == 0)?;
    let len = u32::try_from(len)
        .ok()
        .filter(|l| l >> SEEN_LEN_BITS == 0)?;
    Some(at << SEEN_POS_SHIFT | u32::from(part) << SEEN_LEN_BITS | len)
}

/// A non-empty slot's literal: its position, its part and its length.
fn seen_parts(slot: u32) -> (usize, u8, usize) {
    (
        (slot >> SEEN_POS_SHIFT).wrapping_sub(1) as usize,
        (slot >> SEEN_LEN_BITS & 1) as u8,
        (slot & ((1 << SEEN_LEN_BITS) - 1)) as usize,
    )
}

/// Writes one segment. A string is written once as its bytes (a literal: its length shifted
/// left by one, then the bytes); a later equal string, when that is shorter, as the literal's
/// position in the segment (shifted left by one, plus one). A finished run repeats most of its
/// strings: its run and thread ids, the model's name, every tool's name, a call's id (in the
/// message, its start, readiness and end), JSON keys, arguments also kept in the call's events.
///
/// A thread's segment has two parts, written side by side as the commits come: its events,
/// then its messages. A reference in the messages part names the part of its literal (its
/// position shifted left by two, the part, then one): it may be an earlier literal of the
/// messages or any of the events (which come first in the segment). The events never refer to
/// the messages.
pub(crate) struct Writer<'o, S: BorrowMut<Seen> = Seen> {
    out: &'o mut Vec<u8>,
    /// Where the part starts in `out` (positions are relative to it).
    base: usize,
    /// The part written: 0 (events, or a segment of one part), 1 (messages).
    part: u8,
    /// The events, when the messages are written.
    events: &'o [u8],
    seen: S,
}

impl<'o> Writer<'o> {
    /// A writer of a segment that starts at the end of `out`.
    pub(crate) fn new(out: &'o mut Vec<u8>) -> Self {
        let base = out.len();
        Self {
            out,
            base,
            part: 0,
            events: &[],
            seen: Seen::default(),
        }
    }
}

impl<'o> Writer<'o, &'o mut Seen> {
    /// A writer that goes on with the events part `out` holds (the whole of it), whose
    /// earlier writers remembered `seen`.
    pub(crate) fn resume(out: &'o mut Vec<u8>, seen: &'o mut Seen) -> Self {
        Self {
            out,
            base: 0,
            part: 0,
            events: &[],
            seen,
        }
    }

    /// A writer that goes on with the messages part `out` holds, beside the events part
    /// `events`, whose earlier writers remembered `seen`.
    pub(crate) fn resume_messages(
        out: &'o mut Vec<u8>,
        events: &'o [u8],
        seen: &'o mut Seen,
    ) -> Self {
        Self {
            out,
            base: 0,
            part: 1,
            events,
            seen,
        }
    }
}

impl<S: BorrowMut<Seen>> Writer<'_, S> {
    /// How many bytes the segment has so far.
    pub(crate) fn position(&self) -> usize {
        self.out.len() - self.base
    }

    fn u8(&mut self, b: u8) {
        self.out.push(b);
    }

    fn u64(&mut self, v: u64) {
        put_u64(self.out, v);
    }

    /// A signed number, zigzag-encoded (small magnitudes take few bytes).
    fn i64(&mut self, v: i64) {
        self.u64(((v << 1) ^ (v >> 63)) as u64);
    }

    /// A count or length of what follows.
    pub(crate) fn len(&mut self, n: usize) {
        self.u64(n as u64);
    }

    pub(super) fn str(&mut self, s: &str) {
        let bytes = s.as_bytes();
        // A string of under two bytes is never shorter as a back-reference.
        if bytes.len() >= 2 {
            let at = self.position();
            let set = set_of(bytes) * SEEN_WAYS;
            let header = u64_len((bytes.len() as u64) << 1);
            for way in 0..SEEN_WAYS {
                let slot = self.seen.borrow().0[set + way];
                let (seen_at, part, len) = seen_parts(slot);
                if slot == 0 || len != bytes.len() {
                    continue;
                }
                // The events never refer to the messages.
                let (seen_in, reference) = match (self.part, part) {
                    (0, 0) => (&self.out[self.base..], (seen_at as u64) << 1 | 1),
                    (1, p) => (
                        if p == 1 { &self.out[..] } else { self.events },
                        (seen_at as u64) << 2 | u64::from(p) << 1 | 1,
                    ),
                    _ => continue,
                };
                let start = seen_at + header;
                if u64_len(reference) < header + len
                    && seen_in
                        .get(start..start + len)
                        .is_some_and(|seen| same(seen, bytes))
                {
                    self.u64(reference);
                    return;
                }
            }
            // Remembered first in its set (the set's oldest is forgotten).
            if let Some(slot) = seen_slot(at, self.part, bytes.len()) {
                let slots = &mut self.seen.borrow_mut().0[set..set + SEEN_WAYS];
                slots.copy_within(..SEEN_WAYS - 1, 1);
                slots[0] = slot;
            }
        }
        self.u64((bytes.len() as u64) << 1);
        self.out.extend_from_slice(bytes);
    }

    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }

    /// `value` as serde JSON text (what a kind without its own form is kept as).
    fn json<T: serde::Serialize>(&mut self, value: &T) -> Result<(), serde_json::Error> {
        let text = serde_json::to_string(value)?;
        self.json_text(&text)
    }

    /// JSON text, refused when it nests deeper than `serde_json` reads back.
    fn json_text(&mut self, text: &str) -> Result<(), serde_json::Error> {
        if !nests_within(text, MAX_TEXT_DEPTH) {
            return Err(serde::ser::Error::custom(format!(
                "JSON text nested over {MAX_TEXT_DEPTH} deep"
            )));
        }
        self.str(text);
        Ok(())
    }

    pub(super) fn value(&mut self, value: &Value) -> Result<(), serde_json::Error> {
        self.value_at(value, 0)
    }

    fn value_at(&mut self, value: &Value, depth: usize) -> Result<(), serde_json::Error> {
        if depth >= MAX_DEPTH {
            return Err(serde::ser::Error::custom(format!(
                "a JSON value nested over {MAX_DEPTH} deep"
            )));
        }
        match value {
            Value::Null => self.u8(NULL),
            Value::Bool(false) => self.u8(FALSE),
            Value::Bool(true) => self.u8(TRUE),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    self.u8(UNSIGNED);
                    self.u64(u);
                } else if let Some(i) = n.as_i64() {
                    // Negative (a non-negative integer is a `u64` above): its magnitude less
                    // one.
                    self.u8(NEGATIVE);
                    self.u64(!(i as u64));
                } else {
                    // A float (never NaN or infinite in a `Value`).
                    self.u8(FLOAT);
                    self.out
                        .extend_from_slice(&n.as_f64().unwrap_or_default().to_le_bytes());
                }
            }
            Value::String(s) => {
                self.u8(STRING);
                self.str(s);
            }
            Value::Array(items) => {
                self.u8(ARRAY);
                self.len(items.len());
                for item in items {
                    self.value_at(item, depth + 1)?;
                }
            }
            Value::Object(map) => {
                self.u8(OBJECT);
                self.len(map.len());
                for (k, v) in map {
                    self.str(k);
                    self.value_at(v, depth + 1)?;
                }
            }
        }
        Ok(())
    }

    /// Token counts: a byte of which are not zero, then those (cached and reasoning tokens
    /// are often none).
    fn usage(&mut self, u: &TokenUsage) {
        let counts = [
            u.input_tokens,
            u.output_tokens,
            u.cached_input_tokens,
            u.reasoning_tokens,
        ];
        let present = counts
            .iter()
            .enumerate()
            .fold(0u8, |bits, (i, &n)| bits | u8::from(n != 0) << i);
        self.u8(present);
        for n in counts.into_iter().filter(|&n| n != 0) {
            self.u64(n);
        }
    }

    /// Appends `message`.
    pub(crate) fn message(&mut self, m: &Message) -> Result<(), serde_json::Error> {
        self.u8(role_code(m.role));
        self.len(m.content.len());
        for block in m.content.iter() {
            match block {
                ContentBlock::Text { text } => {
                    self.u8(BLOCK_TEXT);
                    self.str(text);
                }
                ContentBlock::Reasoning { text } => {
                    self.u8(BLOCK_REASONING);
                    self.str(text);
                }
                ContentBlock::Image { url, media_type } => {
                    self.u8(BLOCK_IMAGE);
                    self.str(url);
                    self.opt_str(media_type.as_deref());
                }
                ContentBlock::Json { value } => {
                    self.u8(BLOCK_JSON);
                    self.value(value)?;
                }
                other => {
                    self.u8(AS_JSON);
                    self.json(other)?;
                }
            }
        }
        self.len(m.tool_calls.len());
        for call in m.tool_calls.iter() {
            self.str(call.id.as_str());
            self.str(&call.name);
            self.value(&call.arguments)?;
            self.opt_str(call.invalid_arguments.as_deref());
        }
        self.opt_str(m.tool_call_id.as_ref().map(ToolCallId::as_str));
        Ok(())
    }

    /// Appends `event`. The kinds every run stores have their own form; the rest are JSON.
    pub(crate) fn event(&mut self, event: &AgentEvent) -> Result<(), serde_json::Error> {
        match event {
            AgentEvent::RunStart {
                thread_id,
                run_id,
                agent_id,
                parent_run_id,
                resumed,
            } => {
                self.u8(RUN_START);
                self.str(thread_id.as_str());
                self.str(run_id.as_str());
                self.str(agent_id);
                self.opt_str(parent_run_id.as_ref().map(RunId::as_str));
                self.u8(u8::from(*resumed));
            }
            AgentEvent::RunFinish {
                thread_id,
                run_id,
                termination,
                response,
                usage,
            } => {
                self.u8(RUN_FINISH);
                self.str(thread_id.as_str());
                self.str(run_id.as_str());
                match &**termination {
                    TerminationReason::NaturalEnd => self.u8(0),
                    other => {
                        self.u8(1);
                        self.json(other)?;
                    }
                }
                self.opt_str(response.as_deref());
                self.usage(usage);
            }
            AgentEvent::StepStart { step } => {
                self.u8(STEP_START);
                self.u64(u64::from(*step));
            }
            AgentEvent::StepEnd { step } => {
                self.u8(STEP_END);
                self.u64(u64::from(*step));
            }
            AgentEvent::ToolCallStart { call_id, name } => {
                self.u8(TOOL_CALL_START);
                self.str(call_id.as_str());
                self.str(name);
            }
            AgentEvent::ToolCallReady {
                call_id,
                name,
                arguments,
            } => {
                self.u8(TOOL_CALL_READY);
                self.str(call_id.as_str());
                self.str(name);
                self.value(arguments)?;
            }
            AgentEvent::ToolCallDone {
                call_id,
                result,
                state,
            } => {
                self.u8(TOOL_CALL_DONE);
                self.str(call_id.as_str());
                self.u8(status_code(result.status));
                self.value(&result.content)?;
                self.u8(state_code(*state));
            }
            AgentEvent::InferenceComplete {
                model,
                usage,
                duration_ms,
                stop_reason,
            } => {
                self.u8(INFERENCE_COMPLETE);
                self.str(model);
                self.usage(usage);
                self.u64(*duration_ms);
                self.u8(stop_code(*stop_reason));
            }
            other => {
                self.u8(AS_JSON);
                self.json(other)?;
            }
        }
        Ok(())
    }

    /// Appends a finished run's row: its thread, its record but for the id (the row's key) and
    /// the status (`Done`), its state's revision and its lease epoch. Its state's entries
    /// follow ([`Writer::state_entry`]). Its spec digest is `digest_at`, a place in a table the
    /// store keeps, when that is given.
    pub(crate) fn run_row(
        &mut self,
        thread_id: &ThreadId,
        r: &RunRecord,
        digest_at: Option<u32>,
        state_revision: u64,
        lease_epoch: u64,
    ) -> Result<(), serde_json::Error> {
        self.str(thread_id.as_str());
        self.opt_str(r.parent_run_id.as_ref().map(RunId::as_str));
        self.str(&r.agent_id);
        self.opt_str(r.profile_id.as_ref().map(ProfileId::as_str));
        match &r.termination {
            None => self.u8(0),
            Some(TerminationReason::NaturalEnd) => self.u8(1),
            Some(other) => {
                self.u8(2);
                self.json(other)?;
            }
        }
        self.u64(u64::from(r.steps));
        self.usage(&r.usage);
        match digest_at {
            Some(at) => {
                self.u8(DIGEST_KEPT);
                self.u64(u64::from(at));
            }
            None => self.digest(&r.spec_digest),
        }
        // The update's time as the milliseconds since the creation (a run lasts seconds).
        let created = r.created_at.as_unix_millis();
        self.i64(created);
        self.i64(r.updated_at.as_unix_millis().wrapping_sub(created));
        self.u64(state_revision);
        self.u64(lease_epoch);
        Ok(())
    }

    /// A spec digest: the resolver's `sha256:` and 64 lowercase hex digits as the 32 bytes
    /// they spell, any other text as a string.
    fn digest(&mut self, digest: &str) {
        match sha256_bytes(digest) {
            Some(bytes) => {
                self.u8(DIGEST_SHA256);
                self.out.extend_from_slice(&bytes);
            }
            None => {
                self.u8(DIGEST_TEXT);
                self.str(digest);
            }
        }
    }

    /// Appends one entry of a run's state: its key's name and its value's JSON text (refused
    /// when it nests deeper than it reads back).
    pub(crate) fn state_entry(&mut self, key: &str, json: &str) -> Result<(), serde_json::Error> {
        self.str(key);
        self.json_text(json)
    }

    /// Appends a run marker: the events after it, up to the next marker, are `run_id`'s.
    pub(crate) fn run_marker(&mut self, run_id: &RunId) {
        self.u8(RUN_MARKER);
        self.str(run_id.as_str());
    }
}
