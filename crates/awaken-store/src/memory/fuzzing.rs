//! The memory store's compact form as the store writes and reads it, for the fuzz targets and
//! their regression tests (feature `fuzzing`; not a stable API). Bytes are written by the
//! store's own open log and run rows, and read by the same loops a load runs.

use std::collections::BTreeMap;

use awaken_event::{AgentEvent, Message, RunId, ThreadId};
use awaken_state::StateValue;
use serde_json::Value;

use crate::commit::RunRecord;
use crate::compact::read::Reader;
use crate::error::StoreError;
use crate::store::StoredEvent;

use super::archive::{self, Digests, Open, OpenMark};
use super::maps::{StateKeyName, StateMap};

/// A thread's messages and events written as the memory store writes them between two of its
/// segments: each commit's events (after a run marker when its run changes), then its messages.
#[derive(Debug, Default)]
pub struct CompactLog {
    open: Open,
}

/// Where a [`CompactLog`] stood, to put it back there (a rolled-back commit).
#[derive(Debug, Clone, Copy)]
pub struct CompactMark(OpenMark);

impl CompactLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes `events`, numbered from `first_seq`, of `run_id`; `false` (nothing written) when
    /// one of them has no compact form, as the store then keeps them as they came.
    pub fn append_events(&mut self, first_seq: u64, run_id: &RunId, events: &[AgentEvent]) -> bool {
        self.open.append_events(first_seq, run_id, events)
    }

    /// Writes `messages`; `false` (nothing written) when one of them has no compact form.
    pub fn append_messages(&mut self, messages: &[Message]) -> bool {
        self.open.append_messages(messages)
    }

    /// Where the log stands.
    pub fn mark(&self) -> CompactMark {
        CompactMark(self.open.mark())
    }

    /// Puts the log back where `mark` found it.
    pub fn reset(&mut self, mark: &CompactMark) {
        self.open.reset(&mark.0);
    }

    /// The log made a segment (as a finished run makes it) and read back: its messages, and
    /// its events numbered from its first. `None` when it holds nothing or does not fit a
    /// segment.
    pub fn read_back(&self) -> Option<Result<(Vec<Message>, Vec<StoredEvent>), StoreError>> {
        if self.open.is_empty() {
            return None;
        }
        let segment = self.open.segment(true, 1)?;
        let mut messages = Vec::new();
        let mut events = Vec::new();
        Some(
            segment
                .read_messages(&mut messages)
                .and_then(|()| segment.read_events(0, &mut events))
                .map(|()| (messages, events)),
        )
    }
}

/// Reads `bytes` as a segment whose messages start at `messages_at`: every event of the
/// events part with its run, then every message of the messages part, each part to its end
/// (a segment's counts bound a store's reads; here the bytes do).
pub fn read_segment(
    bytes: &[u8],
    messages_at: usize,
) -> Result<(Vec<(RunId, AgentEvent)>, Vec<Message>), StoreError> {
    let mut events = Vec::new();
    let mut reader = Reader::part(bytes, 0..messages_at);
    let mut run = None;
    while !reader.is_empty() {
        events.push(
            reader
                .run_event(&mut run)
                .map_err(|e| StoreError::corrupt("event", e))?,
        );
    }
    let mut messages = Vec::new();
    let mut reader = Reader::messages(bytes, messages_at);
    while !reader.is_empty() {
        messages.push(
            reader
                .message()
                .map_err(|e| StoreError::corrupt("message", e))?,
        );
    }
    Ok((events, messages))
}

/// The table of spec digests a store's finished run rows refer to.
#[derive(Debug, Default)]
pub struct RunDigests(Digests);

impl RunDigests {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }
}

/// A finished run's row as read back.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    /// The run's thread.
    pub thread_id: ThreadId,
    /// Its record.
    pub record: RunRecord,
    /// Its state's revision.
    pub state_revision: u64,
    /// Its lease epoch.
    pub lease_epoch: u64,
    /// Its state, by key.
    pub state: BTreeMap<String, Value>,
}

/// A finished run's row in compact form, as the store writes it (its spec digest a place in
/// `digests` when there is room); `None` when it has none (a state value nested too deep).
pub fn write_run(row: &RunRow, digests: &RunDigests) -> Option<Box<[u8]>> {
    let state: StateMap = row
        .state
        .iter()
        .map(|(k, v)| (StateKeyName::Owned(k.clone()), StateValue::json(v.clone())))
        .collect();
    archive::write_run(
        &row.thread_id,
        &row.record,
        row.state_revision,
        row.lease_epoch,
        &state,
        &digests.0,
    )
}

/// The row of `run_id` in `bytes`, read as the store reads it.
pub fn read_run(bytes: &[u8], run_id: &RunId, digests: &RunDigests) -> Result<RunRow, StoreError> {
    let run = archive::read_run(bytes, run_id, &digests.0)?;
    let mut state = BTreeMap::new();
    for (k, v) in &run.state {
        let value = v.to_json().map_err(|source| StoreError::StateValue {
            what: "run state",
            source,
        })?;
        state.insert(k.to_string(), value);
    }
    Ok(RunRow {
        thread_id: run.thread_id,
        record: run.record,
        state_revision: run.state_revision,
        lease_epoch: run.lease_epoch,
        state,
    })
}
