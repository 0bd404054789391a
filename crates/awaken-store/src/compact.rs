//! The compact form the memory store keeps a thread's messages and events in once a run on it is
//! done: one byte segment each time (the messages, then the events), read back into equal
//! `Message`s and `AgentEvent`s; and a finished run's state (each key's name and JSON text).
//!
//! While a run goes on, the memory store keeps each commit's own message and event slices,
//! shared with the runtime (nothing is copied on the hot path). A finished thread kept that way
//! costs about 12 KB for a five-step run (a tool call's one-key JSON arguments alone are a
//! 632-byte tree node, twice per call, and every event is 80 bytes), and every byte of it is a
//! new page of heap the process faults in. Written here, its messages and events are about
//! 370 bytes, and the shared form is freed for the next runs to reuse.
//!
//! The format is the store's private business (never written to disk, never read by another
//! version): a varint (LEB128) for every count and length, one tag byte for each enum, JSON
//! values as a tagged tree (a number keeps its kind), a string as a literal (its length shifted
//! left by one, then its UTF-8 bytes) or, when it repeats an earlier literal of the segment and
//! that is shorter, a back-reference (the literal's position shifted left by one, plus one). A
//! reader takes a reference only to a literal's header before it (never forward, never to
//! another reference): a damaged reference reads as some other string or fails, never loops. A
//! message content block or an event of a kind written rarely (or added to the
//! `#[non_exhaustive]` enums later) is kept as its serde JSON text: it reads back as the
//! durable stores read it back (which, for one, takes a `Some(null)` optional field for
//! `None`).

use std::str::FromStr;
use std::sync::Arc;

use awaken_event::{
    AgentEvent, ContentBlock, IdError, Message, Role, RunId, TerminationReason, TokenUsage,
    ToolCall, ToolCallId, ToolCallState, ToolResult, ToolResultStatus, no_content, no_tool_calls,
};
use serde_json::{Map, Number, Value};

/// What could not be read back (the bytes were not written by this module).
#[derive(Debug)]
pub(crate) struct Malformed(pub(crate) String);

impl Malformed {
    fn new(what: impl Into<String>) -> Self {
        Self(what.into())
    }
}

type Read<T> = Result<T, Malformed>;

// ---------------------------------------------------------------------------------------------
// Writing.

fn put_u64(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// How many bytes `put_u64` takes for `v`.
fn u64_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// How deep a JSON value may nest in a segment (arrays and objects in one another): a writer
/// refuses a deeper one (the thread is then kept uncompacted), a reader takes no deeper one
/// (no stack overflow on damaged bytes). `serde_json` parses no deeper than 128.
const MAX_DEPTH: usize = 512;

/// Room made at most for the items a count announces, before they are read (a damaged count
/// asks for no more).
const MAX_RESERVED: usize = 64;

/// Whether `seen` is `s`. A short string (most are) is compared in the loop here: a call to
/// `memcmp` costs more than its compare.
fn same(seen: &[u8], s: &[u8]) -> bool {
    if s.len() <= 16 {
        seen.len() == s.len() && seen.iter().zip(s).all(|(a, b)| a == b)
    } else {
        seen == s
    }
}

/// The slot a string of at least two bytes is remembered in: a hash of its length and of its
/// first and last bytes (up to eight of each). Cheaper than a hash of every byte, and as good
/// here: a collision only loses a back-reference.
fn slot_of(b: &[u8]) -> usize {
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
    (h >> 56) as usize % SEEN_SLOTS
}

/// How many strings a writer remembers for back-references (a hash of the string picks the
/// slot; a collision only loses a back-reference).
const SEEN_SLOTS: usize = 256;

/// Writes one segment. A string is written once as its bytes (a literal: its length shifted
/// left by one, then the bytes); a later equal string, when that is shorter, as the literal's
/// position in the segment (shifted left by one, plus one). A finished run repeats most of its
/// strings: its run and thread ids, the model's name, every tool's name, a call's id (in the
/// message, its start, readiness and end), JSON keys, arguments also kept in the call's events.
pub(crate) struct Writer<'o> {
    out: &'o mut Vec<u8>,
    /// Where the segment starts in `out` (positions are relative to it).
    base: usize,
    /// A remembered literal per slot: its position plus one (0: none) and its length.
    seen: [(u32, u32); SEEN_SLOTS],
}

impl<'o> Writer<'o> {
    /// A writer of a segment that starts at the end of `out`.
    pub(crate) fn new(out: &'o mut Vec<u8>) -> Self {
        let base = out.len();
        Self {
            out,
            base,
            seen: [(0, 0); SEEN_SLOTS],
        }
    }

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

    fn len(&mut self, n: usize) {
        self.u64(n as u64);
    }

    fn str(&mut self, s: &str) {
        let bytes = s.as_bytes();
        // A string of under two bytes is never shorter as a back-reference.
        if bytes.len() >= 2 {
            let at = self.position();
            let slot = &mut self.seen[slot_of(bytes)];
            let (seen_at, seen_len) = *slot;
            if seen_len as usize == bytes.len() && seen_at != 0 {
                let seen_at = seen_at as usize - 1;
                let header = u64_len((bytes.len() as u64) << 1);
                let reference = ((seen_at as u64) << 1) | 1;
                let start = self.base + seen_at + header;
                if u64_len(reference) < header + bytes.len()
                    && same(&self.out[start..start + bytes.len()], bytes)
                {
                    self.u64(reference);
                    return;
                }
            }
            // Remembered only when a position and length fit the slot (always, short of a
            // segment of 4 GiB).
            if let (Ok(p), Ok(l)) = (u32::try_from(at + 1), u32::try_from(bytes.len())) {
                *slot = (p, l);
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
        self.str(&text);
        Ok(())
    }

    fn value(&mut self, value: &Value) -> Result<(), serde_json::Error> {
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

    fn usage(&mut self, u: &TokenUsage) {
        self.u64(u.input_tokens);
        self.u64(u.output_tokens);
        self.u64(u.cached_input_tokens);
        self.u64(u.reasoning_tokens);
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
                self.u8(match result.status {
                    ToolResultStatus::Success => 0,
                    ToolResultStatus::Error => 1,
                    ToolResultStatus::Pending => 2,
                });
                self.value(&result.content)?;
                self.u8(state_code(*state));
            }
            AgentEvent::InferenceComplete {
                model,
                usage,
                duration_ms,
            } => {
                self.u8(INFERENCE_COMPLETE);
                self.str(model);
                self.usage(usage);
                self.u64(*duration_ms);
            }
            other => {
                self.u8(AS_JSON);
                self.json(other)?;
            }
        }
        Ok(())
    }

    /// Appends one entry of a run's state: its key's name and its value's JSON text.
    pub(crate) fn state_entry(&mut self, key: &str, json: &str) {
        self.str(key);
        self.str(json);
    }

    /// Appends one run's `count` events: the run's id, how many, and the events.
    pub(crate) fn event_run<'e>(
        &mut self,
        run_id: &RunId,
        count: usize,
        events: impl IntoIterator<Item = &'e AgentEvent>,
    ) -> Result<(), serde_json::Error> {
        self.str(run_id.as_str());
        self.len(count);
        for event in events {
            self.event(event)?;
        }
        Ok(())
    }
}

const NULL: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const UNSIGNED: u8 = 3;
const NEGATIVE: u8 = 4;
const FLOAT: u8 = 5;
const STRING: u8 = 6;
const ARRAY: u8 = 7;
const OBJECT: u8 = 8;

/// (Exhaustive, as [`role_code`]: a new state is a compile error here, not an unreadable
/// thread.)
fn state_code(state: ToolCallState) -> u8 {
    match state {
        ToolCallState::Requested => 0,
        ToolCallState::Executing => 1,
        ToolCallState::Suspended => 2,
        ToolCallState::Succeeded => 3,
        ToolCallState::Failed => 4,
        ToolCallState::Blocked => 5,
        ToolCallState::ShortCircuited => 6,
        ToolCallState::Cancelled => 7,
        ToolCallState::OutcomeUnknown => 8,
    }
}

fn role_code(role: Role) -> u8 {
    match role {
        Role::System => 0,
        Role::User => 1,
        Role::Assistant => 2,
        Role::Tool => 3,
    }
}

const BLOCK_TEXT: u8 = 0;
const BLOCK_REASONING: u8 = 1;
const BLOCK_IMAGE: u8 = 2;
const BLOCK_JSON: u8 = 3;
/// Any other kind of content block or event: its serde JSON text.
const AS_JSON: u8 = 255;

const RUN_START: u8 = 0;
const RUN_FINISH: u8 = 1;
const STEP_START: u8 = 2;
const STEP_END: u8 = 3;
const TOOL_CALL_START: u8 = 4;
const TOOL_CALL_READY: u8 = 5;
const TOOL_CALL_DONE: u8 = 6;
const INFERENCE_COMPLETE: u8 = 7;

// ---------------------------------------------------------------------------------------------
// Reading.

/// A cursor over a segment written above.
pub(crate) struct Reader<'a> {
    /// The whole segment (back-references point into it).
    segment: &'a [u8],
    /// The next byte to read.
    pos: usize,
    /// Where this reader stops (the end of the segment or of its part being read).
    end: usize,
}

impl<'a> Reader<'a> {
    /// A reader of the whole of `segment`.
    #[cfg(test)]
    pub(crate) fn new(segment: &'a [u8]) -> Self {
        Self::part(segment, 0..segment.len())
    }

    /// A reader of `part` of `segment` (clamped to it).
    pub(crate) fn part(segment: &'a [u8], part: std::ops::Range<usize>) -> Self {
        let end = part.end.min(segment.len());
        Self {
            segment,
            pos: part.start.min(end),
            end,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.end
    }

    fn left(&self) -> usize {
        self.end - self.pos
    }

    fn u8(&mut self) -> Read<u8> {
        if self.is_empty() {
            return Err(Malformed::new("ends early"));
        }
        let b = self.segment[self.pos];
        self.pos += 1;
        Ok(b)
    }

    fn u64(&mut self) -> Read<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(Malformed::new("a number longer than 64 bits"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Malformed::new("a number longer than 64 bits"))
    }

    fn u32(&mut self) -> Read<u32> {
        u32::try_from(self.u64()?).map_err(|_| Malformed::new("a step number above u32"))
    }

    /// A count or length: never more than the bytes left (every item takes at least one).
    fn bounded(&self, n: u64) -> Read<usize> {
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.left())
            .ok_or_else(|| Malformed::new(format!("a count of {n} with fewer bytes left")))
    }

    pub(crate) fn len(&mut self) -> Read<usize> {
        let n = self.u64()?;
        self.bounded(n)
    }

    fn bytes(&mut self, n: usize) -> Read<&'a [u8]> {
        if n > self.left() {
            return Err(Malformed::new("ends early"));
        }
        let head = &self.segment[self.pos..self.pos + n];
        self.pos += n;
        Ok(head)
    }

    /// A string: a literal, or a back-reference to an earlier literal of the segment.
    fn str(&mut self) -> Read<&'a str> {
        let at = self.pos;
        let head = self.u64()?;
        let bytes = if head & 1 == 0 {
            let n = self.bounded(head >> 1)?;
            self.bytes(n)?
        } else {
            // The literal must start before the reference (never at or after it: no loop).
            let target = usize::try_from(head >> 1)
                .ok()
                .filter(|&t| t < at)
                .ok_or_else(|| Malformed::new("a string reference that is not backwards"))?;
            let mut literal = Reader::part(self.segment, target..at);
            let literal_head = literal.u64()?;
            if literal_head & 1 != 0 {
                return Err(Malformed::new("a string reference to a reference"));
            }
            let n = literal.bounded(literal_head >> 1)?;
            literal.bytes(n)?
        };
        std::str::from_utf8(bytes).map_err(|e| Malformed::new(e.to_string()))
    }

    fn opt_str(&mut self) -> Read<Option<&'a str>> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.str().map(Some),
            tag => Err(Malformed::new(format!("option tag {tag}"))),
        }
    }

    fn json<T: serde::de::DeserializeOwned>(&mut self) -> Read<T> {
        serde_json::from_str(self.str()?).map_err(|e| Malformed::new(e.to_string()))
    }

    fn value(&mut self) -> Read<Value> {
        self.value_at(0)
    }

    fn value_at(&mut self, depth: usize) -> Read<Value> {
        if depth >= MAX_DEPTH {
            return Err(Malformed::new(format!(
                "a JSON value nested over {MAX_DEPTH} deep"
            )));
        }
        Ok(match self.u8()? {
            NULL => Value::Null,
            FALSE => Value::Bool(false),
            TRUE => Value::Bool(true),
            UNSIGNED => Value::Number(Number::from(self.u64()?)),
            NEGATIVE => Value::Number(Number::from(!self.u64()? as i64)),
            FLOAT => {
                let raw = self.bytes(8)?;
                let mut b = [0u8; 8];
                b.copy_from_slice(raw);
                let f = f64::from_le_bytes(b);
                Value::Number(Number::from_f64(f).ok_or_else(|| Malformed::new("a NaN"))?)
            }
            STRING => Value::String(self.str()?.to_owned()),
            ARRAY => {
                let n = self.len()?;
                let mut items = Vec::with_capacity(n.min(MAX_RESERVED));
                for _ in 0..n {
                    items.push(self.value_at(depth + 1)?);
                }
                Value::Array(items)
            }
            OBJECT => {
                let n = self.len()?;
                let mut map = Map::new();
                for _ in 0..n {
                    let k = self.str()?.to_owned();
                    map.insert(k, self.value_at(depth + 1)?);
                }
                Value::Object(map)
            }
            tag => return Err(Malformed::new(format!("value tag {tag}"))),
        })
    }

    fn usage(&mut self) -> Read<TokenUsage> {
        Ok(TokenUsage {
            input_tokens: self.u64()?,
            output_tokens: self.u64()?,
            cached_input_tokens: self.u64()?,
            reasoning_tokens: self.u64()?,
        })
    }

    /// An id of any kind (parsed as its type parses it).
    pub(crate) fn id<T: FromStr<Err = IdError>>(&mut self) -> Read<T> {
        self.str()?
            .parse()
            .map_err(|e: IdError| Malformed::new(e.to_string()))
    }

    fn opt_id<T: FromStr<Err = IdError>>(&mut self) -> Read<Option<T>> {
        self.opt_str()?
            .map(|id| {
                id.parse()
                    .map_err(|e: IdError| Malformed::new(e.to_string()))
            })
            .transpose()
    }

    /// The next entry of a run's state: its key's name and its value's JSON text.
    pub(crate) fn state_entry(&mut self) -> Read<(&'a str, &'a str)> {
        Ok((self.str()?, self.str()?))
    }

    /// The next message.
    pub(crate) fn message(&mut self) -> Read<Message> {
        let role = match self.u8()? {
            0 => Role::System,
            1 => Role::User,
            2 => Role::Assistant,
            3 => Role::Tool,
            tag => return Err(Malformed::new(format!("role tag {tag}"))),
        };
        let blocks = self.len()?;
        let content: Arc<[ContentBlock]> = if blocks == 0 {
            no_content()
        } else {
            let mut content = Vec::with_capacity(blocks.min(MAX_RESERVED));
            for _ in 0..blocks {
                content.push(match self.u8()? {
                    BLOCK_TEXT => ContentBlock::Text {
                        text: self.str()?.to_owned(),
                    },
                    BLOCK_REASONING => ContentBlock::Reasoning {
                        text: self.str()?.to_owned(),
                    },
                    BLOCK_IMAGE => ContentBlock::Image {
                        url: self.str()?.to_owned(),
                        media_type: self.opt_str()?.map(str::to_owned),
                    },
                    BLOCK_JSON => ContentBlock::Json {
                        value: Arc::new(self.value()?),
                    },
                    AS_JSON => self.json()?,
                    tag => return Err(Malformed::new(format!("content block tag {tag}"))),
                });
            }
            content.into()
        };
        let calls = self.len()?;
        let tool_calls: Arc<[ToolCall]> = if calls == 0 {
            no_tool_calls()
        } else {
            let mut tool_calls = Vec::with_capacity(calls.min(MAX_RESERVED));
            for _ in 0..calls {
                tool_calls.push(ToolCall {
                    id: self.id()?,
                    name: self.str()?.to_owned(),
                    arguments: Arc::new(self.value()?),
                    invalid_arguments: self.opt_str()?.map(str::to_owned),
                });
            }
            tool_calls.into()
        };
        let tool_call_id = self.opt_id()?;
        Ok(Message {
            role,
            content,
            tool_calls,
            tool_call_id,
        })
    }

    /// The next event.
    pub(crate) fn event(&mut self) -> Read<AgentEvent> {
        Ok(match self.u8()? {
            RUN_START => AgentEvent::RunStart {
                thread_id: self.id()?,
                run_id: self.id()?,
                agent_id: Arc::from(self.str()?),
                parent_run_id: self.opt_id()?,
                resumed: self.u8()? != 0,
            },
            RUN_FINISH => AgentEvent::RunFinish {
                thread_id: self.id()?,
                run_id: self.id()?,
                termination: Box::new(match self.u8()? {
                    0 => TerminationReason::NaturalEnd,
                    1 => self.json()?,
                    tag => return Err(Malformed::new(format!("termination tag {tag}"))),
                }),
                response: self.opt_str()?.map(str::to_owned),
                usage: Box::new(self.usage()?),
            },
            STEP_START => AgentEvent::StepStart { step: self.u32()? },
            STEP_END => AgentEvent::StepEnd { step: self.u32()? },
            TOOL_CALL_START => AgentEvent::ToolCallStart {
                call_id: self.id()?,
                name: Arc::from(self.str()?),
            },
            TOOL_CALL_READY => AgentEvent::ToolCallReady {
                call_id: self.id()?,
                name: Arc::from(self.str()?),
                arguments: Arc::new(self.value()?),
            },
            TOOL_CALL_DONE => {
                let call_id = self.id()?;
                let status = match self.u8()? {
                    0 => ToolResultStatus::Success,
                    1 => ToolResultStatus::Error,
                    2 => ToolResultStatus::Pending,
                    tag => return Err(Malformed::new(format!("result status tag {tag}"))),
                };
                let content = Arc::new(self.value()?);
                let state = match self.u8()? {
                    0 => ToolCallState::Requested,
                    1 => ToolCallState::Executing,
                    2 => ToolCallState::Suspended,
                    3 => ToolCallState::Succeeded,
                    4 => ToolCallState::Failed,
                    5 => ToolCallState::Blocked,
                    6 => ToolCallState::ShortCircuited,
                    7 => ToolCallState::Cancelled,
                    8 => ToolCallState::OutcomeUnknown,
                    tag => return Err(Malformed::new(format!("tool call state tag {tag}"))),
                };
                AgentEvent::ToolCallDone {
                    call_id,
                    result: Arc::new(ToolResult { status, content }),
                    state,
                }
            }
            INFERENCE_COMPLETE => AgentEvent::InferenceComplete {
                model: Arc::from(self.str()?),
                usage: self.usage()?,
                duration_ms: self.u64()?,
            },
            AS_JSON => self.json()?,
            tag => return Err(Malformed::new(format!("event tag {tag}"))),
        })
    }
}

#[cfg(test)]
mod tests {
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
        let mut out = Vec::new();
        let mut writer = Writer::new(&mut out);
        for m in &messages {
            writer.message(m).expect("writes");
        }
        let events_at = writer.position();
        writer
            .event_run(&run_id, events.len(), &events)
            .expect("writes");

        let mut reader = Reader::part(&out, 0..events_at);
        for m in &messages {
            assert_eq!(&reader.message().expect("reads"), m);
        }
        assert!(reader.is_empty());
        let mut reader = Reader::part(&out, events_at..out.len());
        assert_eq!(reader.id::<RunId>().expect("run id"), run_id);
        assert_eq!(reader.len().expect("count"), events.len());
        for e in &events {
            assert_eq!(&reader.event().expect("reads"), e);
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
        // A call id is repeated in its event: written with the message only.
        assert_eq!(count("call-1"), 1);
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
}
