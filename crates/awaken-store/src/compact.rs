//! The compact form the memory store keeps a thread's messages and events in once a run on it is
//! done: a byte segment per log each time, read back into equal `Message`s and `AgentEvent`s.
//!
//! While a run goes on, the memory store keeps each commit's own message and event slices,
//! shared with the runtime (nothing is copied on the hot path). A finished thread kept that way
//! costs about 12 KB for a five-step run (a tool call's one-key JSON arguments alone are a
//! 632-byte tree node, twice per call, and every event is 80 bytes), and every byte of it is a
//! new page of heap the process faults in. Written here, its messages and events are about
//! 600 bytes, and the shared form is freed for the next runs to reuse.
//!
//! The format is the store's private business (never written to disk, never read by another
//! version): a varint (LEB128) for every count and length, one tag byte for each enum, strings
//! as their length and UTF-8 bytes, JSON values as a tagged tree (a number keeps its kind). A
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

fn put_len(out: &mut Vec<u8>, n: usize) {
    put_u64(out, n as u64);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

fn put_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => out.push(0),
        Some(s) => {
            out.push(1);
            put_str(out, s);
        }
    }
}

/// `value` as serde JSON text (what a kind without its own form is kept as).
fn put_json<T: serde::Serialize>(out: &mut Vec<u8>, value: &T) -> Result<(), serde_json::Error> {
    let text = serde_json::to_string(value)?;
    put_str(out, &text);
    Ok(())
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

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.push(NULL),
        Value::Bool(false) => out.push(FALSE),
        Value::Bool(true) => out.push(TRUE),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                out.push(UNSIGNED);
                put_u64(out, u);
            } else if let Some(i) = n.as_i64() {
                // Negative (a non-negative integer is a `u64` above): its magnitude less one.
                out.push(NEGATIVE);
                put_u64(out, !(i as u64));
            } else {
                // A float (never NaN or infinite in a `Value`).
                out.push(FLOAT);
                out.extend_from_slice(&n.as_f64().unwrap_or_default().to_le_bytes());
            }
        }
        Value::String(s) => {
            out.push(STRING);
            put_str(out, s);
        }
        Value::Array(items) => {
            out.push(ARRAY);
            put_len(out, items.len());
            for item in items {
                put_value(out, item);
            }
        }
        Value::Object(map) => {
            out.push(OBJECT);
            put_len(out, map.len());
            for (k, v) in map {
                put_str(out, k);
                put_value(out, v);
            }
        }
    }
}

fn put_usage(out: &mut Vec<u8>, u: &TokenUsage) {
    put_u64(out, u.input_tokens);
    put_u64(out, u.output_tokens);
    put_u64(out, u.cached_input_tokens);
    put_u64(out, u.reasoning_tokens);
}

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

/// Appends `message`.
pub(crate) fn put_message(out: &mut Vec<u8>, m: &Message) -> Result<(), serde_json::Error> {
    out.push(role_code(m.role));
    put_len(out, m.content.len());
    for block in m.content.iter() {
        match block {
            ContentBlock::Text { text } => {
                out.push(BLOCK_TEXT);
                put_str(out, text);
            }
            ContentBlock::Reasoning { text } => {
                out.push(BLOCK_REASONING);
                put_str(out, text);
            }
            ContentBlock::Image { url, media_type } => {
                out.push(BLOCK_IMAGE);
                put_str(out, url);
                put_opt_str(out, media_type.as_deref());
            }
            ContentBlock::Json { value } => {
                out.push(BLOCK_JSON);
                put_value(out, value);
            }
            other => {
                out.push(AS_JSON);
                put_json(out, other)?;
            }
        }
    }
    put_len(out, m.tool_calls.len());
    for call in m.tool_calls.iter() {
        put_str(out, call.id.as_str());
        put_str(out, &call.name);
        put_value(out, &call.arguments);
        put_opt_str(out, call.invalid_arguments.as_deref());
    }
    put_opt_str(out, m.tool_call_id.as_ref().map(ToolCallId::as_str));
    Ok(())
}

const RUN_START: u8 = 0;
const RUN_FINISH: u8 = 1;
const STEP_START: u8 = 2;
const STEP_END: u8 = 3;
const TOOL_CALL_START: u8 = 4;
const TOOL_CALL_READY: u8 = 5;
const TOOL_CALL_DONE: u8 = 6;
const INFERENCE_COMPLETE: u8 = 7;

/// Appends `event`. The kinds every run stores have their own form; the rest are JSON.
pub(crate) fn put_event(out: &mut Vec<u8>, event: &AgentEvent) -> Result<(), serde_json::Error> {
    match event {
        AgentEvent::RunStart {
            thread_id,
            run_id,
            agent_id,
            parent_run_id,
            resumed,
        } => {
            out.push(RUN_START);
            put_str(out, thread_id.as_str());
            put_str(out, run_id.as_str());
            put_str(out, agent_id);
            put_opt_str(out, parent_run_id.as_ref().map(RunId::as_str));
            out.push(u8::from(*resumed));
        }
        AgentEvent::RunFinish {
            thread_id,
            run_id,
            termination,
            response,
            usage,
        } => {
            out.push(RUN_FINISH);
            put_str(out, thread_id.as_str());
            put_str(out, run_id.as_str());
            match &**termination {
                TerminationReason::NaturalEnd => out.push(0),
                other => {
                    out.push(1);
                    put_json(out, other)?;
                }
            }
            put_opt_str(out, response.as_deref());
            put_usage(out, usage);
        }
        AgentEvent::StepStart { step } => {
            out.push(STEP_START);
            put_u64(out, u64::from(*step));
        }
        AgentEvent::StepEnd { step } => {
            out.push(STEP_END);
            put_u64(out, u64::from(*step));
        }
        AgentEvent::ToolCallStart { call_id, name } => {
            out.push(TOOL_CALL_START);
            put_str(out, call_id.as_str());
            put_str(out, name);
        }
        AgentEvent::ToolCallReady {
            call_id,
            name,
            arguments,
        } => {
            out.push(TOOL_CALL_READY);
            put_str(out, call_id.as_str());
            put_str(out, name);
            put_value(out, arguments);
        }
        AgentEvent::ToolCallDone {
            call_id,
            result,
            state,
        } => {
            out.push(TOOL_CALL_DONE);
            put_str(out, call_id.as_str());
            out.push(match result.status {
                ToolResultStatus::Success => 0,
                ToolResultStatus::Error => 1,
                ToolResultStatus::Pending => 2,
            });
            put_value(out, &result.content);
            out.push(state_code(*state));
        }
        AgentEvent::InferenceComplete {
            model,
            usage,
            duration_ms,
        } => {
            out.push(INFERENCE_COMPLETE);
            put_str(out, model);
            put_usage(out, usage);
            put_u64(out, *duration_ms);
        }
        other => {
            out.push(AS_JSON);
            put_json(out, other)?;
        }
    }
    Ok(())
}

/// Appends one run's `count` events: the run's id, how many, and the events.
pub(crate) fn put_event_run<'e>(
    out: &mut Vec<u8>,
    run_id: &RunId,
    count: usize,
    events: impl IntoIterator<Item = &'e AgentEvent>,
) -> Result<(), serde_json::Error> {
    put_str(out, run_id.as_str());
    put_len(out, count);
    for event in events {
        put_event(out, event)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Reading.

/// A cursor over bytes written above.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn u8(&mut self) -> Read<u8> {
        let (&b, rest) = self
            .bytes
            .split_first()
            .ok_or_else(|| Malformed::new("ends early"))?;
        self.bytes = rest;
        Ok(b)
    }

    fn u64(&mut self) -> Read<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
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

    pub(crate) fn len(&mut self) -> Read<usize> {
        let n = self.u64()?;
        // A count can never exceed the bytes left (every item takes at least one).
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.bytes.len())
            .ok_or_else(|| Malformed::new(format!("a count of {n} with fewer bytes left")))
    }

    fn bytes(&mut self, n: usize) -> Read<&'a [u8]> {
        if n > self.bytes.len() {
            return Err(Malformed::new("ends early"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn str(&mut self) -> Read<&'a str> {
        let n = self.len()?;
        std::str::from_utf8(self.bytes(n)?).map_err(|e| Malformed::new(e.to_string()))
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
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value()?);
                }
                Value::Array(items)
            }
            OBJECT => {
                let n = self.len()?;
                let mut map = Map::new();
                for _ in 0..n {
                    let k = self.str()?.to_owned();
                    map.insert(k, self.value()?);
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
            let mut content = Vec::with_capacity(blocks);
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
            let mut tool_calls = Vec::with_capacity(calls);
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
        put_value(&mut out, v);
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
        put_message(
            &mut message,
            &Message::assistant_with_calls(
                "text",
                vec![ToolCall::new(
                    ToolCallId::new("c1").expect("id"),
                    "t",
                    json!({"a": [1, -2, 0.5, "x", null, true]}),
                )],
            ),
        )
        .expect("writes");
        let mut event = Vec::new();
        put_event(
            &mut event,
            &AgentEvent::ToolCallDone {
                call_id: ToolCallId::new("c1").expect("id"),
                result: Arc::new(ToolResult::success(json!({"k": "v"}))),
                state: ToolCallState::Succeeded,
            },
        )
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
        // A number with more than ten 7-bit groups.
        assert!(Reader::new(&[0xff; 11]).u64().is_err());
    }
}
