//! The compact form the memory store keeps a thread's messages and events in: written as the
//! commits bring them into the thread's open segment (its events part, then its messages part,
//! side by side), which becomes one byte segment when a run on the thread is done; read back
//! into equal `Message`s and `AgentEvent`s. Also a finished run's row (its record and each of
//! its state's keys with the value's JSON text).
//!
//! Kept as the commits carried them (as `Message`s and `AgentEvent`s, where a tool call's JSON
//! arguments are a tree of nodes), a finished thread costs many times its encoded size, and
//! every byte of it is a new page of heap the process faults in. Written here, nothing of the
//! commits is kept (the figures are in ADR 0009 and `docs/performance.md`).
//!
//! The format is the store's private business (never written to disk, never read by another
//! version): a varint (LEB128) for every count and length, one tag byte for each enum, JSON
//! values as a tagged tree (a number keeps its kind), a string as a literal (its length shifted
//! left by one, then its UTF-8 bytes) or, when it repeats an earlier literal of the segment and
//! that is shorter, a back-reference (the literal's position shifted left by one, plus one; in
//! a messages part, shifted left by two, then the literal's part, then one). A
//! reader takes a reference only to a literal's header before it (never forward, never to
//! another reference): a damaged reference reads as some other string or fails, never loops. A
//! message content block or an event of a kind written rarely (or added to the
//! `#[non_exhaustive]` enums later) is kept as its serde JSON text: it reads back as the
//! durable stores read it back (which, for one, takes a `Some(null)` optional field for
//! `None`).

use std::str::FromStr;
use std::sync::Arc;

use awaken_event::{
    AgentEvent, ContentBlock, IdError, Message, ProfileId, Role, RunId, StopReason,
    TerminationReason, ThreadId, TokenUsage, ToolCall, ToolCallId, ToolCallState, ToolResult,
    ToolResultStatus, no_content, no_tool_calls,
};
use serde_json::{Map, Number, Value};

use crate::commit::{RunRecord, RunStatus, Timestamp};

/// What could not be read back (the bytes were not written by this module).
#[derive(Debug)]
pub(crate) struct Malformed(pub(crate) String);

impl Malformed {
    fn new(what: impl Into<String>) -> Self {
        Self(what.into())
    }
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the memory store's compact form: {}", self.0)
    }
}

type Read<T> = Result<T, Malformed>;

/// How deep a JSON value may nest in a segment (arrays and objects in one another): a writer
/// refuses a deeper one (the thread is then kept uncompacted), a reader takes no deeper one
/// (no stack overflow on damaged bytes). `serde_json` parses no deeper than 128.
const MAX_DEPTH: usize = 512;

/// How deep JSON text kept as text may nest (`serde_json` reads no deeper than 127).
const MAX_TEXT_DEPTH: usize = 100;

/// Room made at most for the items a count announces, before they are read (a damaged count
/// asks for no more).
const MAX_RESERVED: usize = 64;

const NULL: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const UNSIGNED: u8 = 3;
const NEGATIVE: u8 = 4;
const FLOAT: u8 = 5;
const STRING: u8 = 6;
const ARRAY: u8 = 7;
const OBJECT: u8 = 8;

// An enum's tag is its variant's place in its table; the writer's `*_code` match is exhaustive
// (a new variant is a compile error here, not an unreadable thread), the reader looks the tag
// up in the table (a tool call state's is `ToolCallState::ALL`), and a test checks that each
// table reads back what its `*_code` writes.

const ROLES: [Role; 4] = [Role::System, Role::User, Role::Assistant, Role::Tool];

fn role_code(role: Role) -> u8 {
    match role {
        Role::System => 0,
        Role::User => 1,
        Role::Assistant => 2,
        Role::Tool => 3,
    }
}

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

fn stop_code(reason: StopReason) -> u8 {
    match reason {
        StopReason::EndTurn => 0,
        StopReason::ToolCalls => 1,
        StopReason::MaxTokens => 2,
        StopReason::ContentFiltered => 3,
        StopReason::Other => 4,
    }
}

const STATUSES: [ToolResultStatus; 3] = [
    ToolResultStatus::Success,
    ToolResultStatus::Error,
    ToolResultStatus::Pending,
];

fn status_code(status: ToolResultStatus) -> u8 {
    match status {
        ToolResultStatus::Success => 0,
        ToolResultStatus::Error => 1,
        ToolResultStatus::Pending => 2,
    }
}

/// The variant `tag` stands for in `table` (`what` names the kind in the error).
fn variant<T: Copy>(table: &[T], tag: u8, what: &str) -> Read<T> {
    table
        .get(usize::from(tag))
        .copied()
        .ok_or_else(|| Malformed::new(format!("{what} tag {tag}")))
}

const BLOCK_TEXT: u8 = 0;
const BLOCK_REASONING: u8 = 1;
const BLOCK_IMAGE: u8 = 2;
const BLOCK_JSON: u8 = 3;
/// Any other kind of content block or event: its serde JSON text.
const AS_JSON: u8 = 255;
/// Not an event: the events after it are of the run whose id follows.
const RUN_MARKER: u8 = 254;

const RUN_START: u8 = 0;
const RUN_FINISH: u8 = 1;
const STEP_START: u8 = 2;
const STEP_END: u8 = 3;
const TOOL_CALL_START: u8 = 4;
const TOOL_CALL_READY: u8 = 5;
const TOOL_CALL_DONE: u8 = 6;
const INFERENCE_COMPLETE: u8 = 7;

/// A spec digest kept as text.
const DIGEST_TEXT: u8 = 0;
/// A `sha256:` spec digest kept as its 32 bytes.
const DIGEST_SHA256: u8 = 1;
const SHA256_PREFIX: &str = "sha256:";
/// A spec digest kept by the memory store: its place in the store's table.
const DIGEST_KEPT: u8 = 2;

pub(crate) mod read;
pub(crate) mod write;

#[cfg(test)]
mod tests;
