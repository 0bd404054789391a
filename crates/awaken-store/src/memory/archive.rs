//! The archived form of what the memory store keeps: a thread's messages and events, written
//! as the commits bring them ([`Open`]) and put together into a [`Segment`] when a run on the
//! thread is done, and a finished run's row. The bytes are [`crate::compact`]'s; this module
//! decides what goes into them and reads them back (a thread's log and a run's row call it and
//! never see the bytes).

use std::cell::Cell;
use std::sync::{Arc, Mutex};

use awaken_event::{AgentEvent, Message, RunId, ThreadId};
use awaken_state::StateValue;

use crate::commit::RunRecord;
use crate::compact::Malformed;
use crate::compact::read::Reader;
use crate::compact::write::{Seen, Writer};
use crate::error::StoreError;
use crate::store::StoredEvent;

use super::maps::{HashMap, StateKeyName, StateMap, lock};

/// A thread's messages and events since its last segment, written in [`crate::compact`]'s
/// form as each commit brings them (nothing of a commit's messages and 80-byte events is kept
/// until the run is done): the two parts of the thread's next segment, its events then its
/// messages, which a run's end puts together. A commit's events are written before its
/// messages, which may refer to them.
#[derive(Debug, Default)]
pub(super) struct Open {
    events: Vec<u8>,
    messages: Vec<u8>,
    /// The strings written so far, for the next commits' back-references.
    seen: Seen,
    pub(super) event_count: u32,
    pub(super) message_count: u32,
    /// The sequence number of its first event.
    first_seq: u64,
    /// Where the last run marker is, and its run (the run of the events since).
    run_at: Option<u32>,
    run: Option<RunId>,
}

/// How many bytes a thread's written events, and its written messages, make room for at first
/// (a five-step run's events take about 300, its messages about 100: the events grow once).
const OPEN_EVENTS_RESERVED: usize = 256;
const OPEN_MESSAGES_RESERVED: usize = 128;

/// Where a thread's written messages and events stood (see [`Open::reset`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct OpenMark {
    events: usize,
    event_count: u32,
    messages: usize,
    message_count: u32,
    run_at: Option<u32>,
}

/// The parts of the compact form.
const EVENTS_PART: u8 = 0;
const MESSAGES_PART: u8 = 1;

/// `count` with `n` more, if that fits a `u32`.
fn grown(count: u32, n: usize) -> Option<u32> {
    u32::try_from(n).ok().and_then(|n| count.checked_add(n))
}

impl Open {
    pub(super) fn is_empty(&self) -> bool {
        self.event_count == 0 && self.message_count == 0
    }

    /// The sequence number of its last event (it has one).
    pub(super) fn last_seq(&self) -> u64 {
        self.first_seq + u64::from(self.event_count) - 1
    }

    /// Cuts `part` (events or messages) back to `len` bytes, and forgets the strings written
    /// past the cut.
    fn cut(&mut self, part: u8, len: usize) {
        let bytes = if part == EVENTS_PART {
            &mut self.events
        } else {
            &mut self.messages
        };
        bytes.truncate(len);
        self.seen.forget_from(part, len);
    }

    /// Writes `events` (numbered from `first_seq`) of `run_id`; `false` (nothing written) if
    /// one of them cannot be (see [`crate::compact`]).
    pub(super) fn append_events(
        &mut self,
        first_seq: u64,
        run_id: &RunId,
        events: &[AgentEvent],
    ) -> bool {
        let len = self.events.len();
        let Some(count) = grown(self.event_count, events.len()) else {
            return false;
        };
        let marker = (self.run.as_ref() != Some(run_id)).then_some(len);
        let Ok(marker_at) = marker.map(u32::try_from).transpose() else {
            return false;
        };
        if self.events.capacity() == 0 {
            self.events.reserve_exact(OPEN_EVENTS_RESERVED);
        }
        let mut writer = Writer::resume(&mut self.events, &mut self.seen);
        if marker.is_some() {
            writer.run_marker(run_id);
        }
        if !events.iter().all(|e| writer.event(e).is_ok()) {
            self.cut(EVENTS_PART, len);
            return false;
        }
        if self.event_count == 0 {
            self.first_seq = first_seq;
        }
        self.event_count = count;
        if marker_at.is_some() {
            self.run_at = marker_at;
            self.run = Some(run_id.clone());
        }
        true
    }

    /// Writes `messages`; `false` (nothing written) if one of them cannot be.
    pub(super) fn append_messages(&mut self, messages: &[Message]) -> bool {
        let len = self.messages.len();
        let Some(count) = grown(self.message_count, messages.len()) else {
            return false;
        };
        if self.messages.capacity() == 0 {
            self.messages.reserve_exact(OPEN_MESSAGES_RESERVED);
        }
        let mut writer = Writer::resume_messages(&mut self.messages, &self.events, &mut self.seen);
        if !messages.iter().all(|m| writer.message(m).is_ok()) {
            self.cut(MESSAGES_PART, len);
            return false;
        }
        self.message_count = count;
        true
    }

    /// Where the written messages and events stand (see [`Open::reset`]).
    pub(super) fn mark(&self) -> OpenMark {
        OpenMark {
            events: self.events.len(),
            event_count: self.event_count,
            messages: self.messages.len(),
            message_count: self.message_count,
            run_at: self.run_at,
        }
    }

    /// Puts the written messages and events back where `mark` found them.
    pub(super) fn reset(&mut self, mark: &OpenMark) {
        self.cut(EVENTS_PART, mark.events);
        self.event_count = mark.event_count;
        self.cut(MESSAGES_PART, mark.messages);
        self.message_count = mark.message_count;
        if self.run_at != mark.run_at {
            // The run of the marker before (read back: a rollback of a run's first commit on a
            // thread is rare).
            self.run_at = mark.run_at;
            self.run = mark.run_at.and_then(|at| {
                Reader::part(&self.events, at as usize + 1..self.events.len())
                    .id()
                    .ok()
            });
        }
    }

    /// The written events, and the messages when `with_messages`, as a segment (one
    /// allocation, copied); `next_seq` numbers a segment without events.
    pub(super) fn segment(&self, with_messages: bool, next_seq: u64) -> Option<Segment> {
        let messages_at = u32::try_from(self.events.len()).ok()?;
        let messages: &[u8] = if with_messages { &self.messages } else { &[] };
        // Put together in this OS thread's buffer, then copied once (a byte iterator's
        // `collect` copies a byte at a time).
        let bytes = with_compact_buffer(|buffer| {
            buffer.extend_from_slice(&self.events);
            buffer.extend_from_slice(messages);
            Arc::from(buffer.as_slice())
        });
        Some(Segment {
            bytes,
            messages_at,
            messages: if with_messages { self.message_count } else { 0 },
            events: self.event_count,
            first_seq: if self.event_count > 0 {
                self.first_seq
            } else {
                next_seq
            },
        })
    }
}

/// The events, then the messages, of the commits since the last segment, in
/// [`crate::compact`]'s form: one allocation, shared so that a read takes it under the shard's
/// lock and decodes it after releasing it (a string of the messages may refer back to the
/// events').
#[derive(Debug, Clone)]
pub(super) struct Segment {
    bytes: Arc<[u8]>,
    /// Where the messages start in `bytes` (the events come first: they were written as the
    /// commits brought them, the messages when the run was done).
    messages_at: u32,
    messages: u32,
    pub(super) events: u32,
    /// The sequence number of its first event (of the next event, when it has none).
    first_seq: u64,
}

/// A thread's segments, oldest first: the first is held in place (most threads have one, and
/// a vector of one is an allocation more per thread).
#[derive(Debug, Default)]
pub(super) enum Segments {
    #[default]
    None,
    One(Segment),
    Many(Vec<Segment>),
}

impl Segments {
    pub(super) fn push(&mut self, segment: Segment) {
        *self = match std::mem::take(self) {
            Segments::None => Segments::One(segment),
            Segments::One(first) => Segments::Many(vec![first, segment]),
            Segments::Many(mut all) => {
                // Room for exactly one more (a vector's growth would make room for twice as
                // many).
                all.reserve_exact(1);
                all.push(segment);
                Segments::Many(all)
            }
        };
    }
}

impl std::ops::Deref for Segments {
    type Target = [Segment];

    fn deref(&self) -> &[Segment] {
        match self {
            Segments::None => &[],
            Segments::One(segment) => std::slice::from_ref(segment),
            Segments::Many(all) => all,
        }
    }
}

impl Segment {
    /// The sequence number of its last event (of the event before it, when it has none).
    pub(super) fn last_seq(&self) -> u64 {
        self.first_seq + u64::from(self.events) - 1
    }

    /// Where its messages start.
    fn messages_at(&self) -> usize {
        self.messages_at as usize
    }

    /// Reads its messages, in order, into `out`.
    pub(super) fn read_messages(&self, out: &mut Vec<Message>) -> Result<(), StoreError> {
        let mut reader = Reader::messages(&self.bytes, self.messages_at());
        for _ in 0..self.messages {
            out.push(
                reader
                    .message()
                    .map_err(|e| StoreError::corrupt("message", e))?,
            );
        }
        Ok(())
    }

    /// Reads its events with a sequence number above `since`, in order, into `out`.
    pub(super) fn read_events(
        &self,
        since: u64,
        out: &mut Vec<StoredEvent>,
    ) -> Result<(), StoreError> {
        let mut reader = Reader::part(&self.bytes, 0..self.messages_at());
        let mut seq = self.first_seq;
        let mut run = None;
        while !reader.is_empty() {
            let (run_id, event) = reader
                .run_event(&mut run)
                .map_err(|e| StoreError::corrupt("event", e))?;
            if seq > since {
                out.push(StoredEvent { seq, run_id, event });
            }
            seq += 1;
        }
        Ok(())
    }
}

thread_local! {
    /// The buffer a thread's compact form is written into on this OS thread before its
    /// exact-size copy is kept (no doubling allocations per finished run).
    static COMPACT_BUFFER: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// The most bytes an OS thread's compaction buffer keeps between runs.
const COMPACT_BUFFER_KEPT: usize = 64 * 1024;

/// Calls `write` with this OS thread's compaction buffer, emptied (its exact-size copy is what
/// is kept).
fn with_compact_buffer<T>(write: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    // (`try_with`: an OS thread being torn down gets a fresh buffer, never a panic.)
    let mut buffer = COMPACT_BUFFER.try_with(Cell::take).unwrap_or_default();
    buffer.clear();
    let written = write(&mut buffer);
    buffer.clear();
    buffer.shrink_to(COMPACT_BUFFER_KEPT);
    let _ = COMPACT_BUFFER.try_with(|b| b.set(buffer));
    written
}

/// The spec digests of the finished runs' rows, each kept once (a row holds its digest's
/// place here: every run of an agent has the same 71-character digest).
#[derive(Debug, Default)]
pub(super) struct Digests(Mutex<DigestTable>);

#[derive(Debug, Default)]
struct DigestTable {
    /// Each digest's place.
    places: HashMap<Arc<str>, u32>,
    /// The digests by place.
    all: Vec<Arc<str>>,
}

/// The most digests a store keeps; a row whose digest finds no room keeps its text.
pub(super) const DIGESTS_KEPT: usize = 1024;

impl Digests {
    /// The place of `digest`, given one if it has none and there is room.
    fn index_of(&self, digest: &Arc<str>) -> Option<u32> {
        let mut table = lock(&self.0);
        if let Some(&i) = table.places.get(&**digest) {
            return Some(i);
        }
        let i = u32::try_from(table.all.len())
            .ok()
            .filter(|&i| (i as usize) < DIGESTS_KEPT)?;
        table.all.push(Arc::clone(digest));
        table.places.insert(Arc::clone(digest), i);
        Some(i)
    }

    /// The digest at place `i`.
    fn get(&self, i: u32) -> Option<Arc<str>> {
        lock(&self.0).all.get(i as usize).cloned()
    }

    /// How many digests have a place.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        lock(&self.0).all.len()
    }
}

/// A finished run's row as [`read_run`] gives it back (it holds no lease and no batch); its
/// state's values are JSON values.
pub(super) struct ArchivedRun {
    pub(super) thread_id: ThreadId,
    pub(super) record: RunRecord,
    pub(super) state_revision: u64,
    pub(super) lease_epoch: u64,
    /// Its state, the values read back as JSON values.
    pub(super) state: StateMap,
}

/// A finished run's row in compact form: [`Writer::run_row`] (its spec digest a place in
/// `digests` when there is room), then how many entries its state has, then each
/// ([`Writer::state_entry`]). `None` if a value of its state has no JSON text that reads back
/// (nested deeper than `serde_json` parses).
pub(super) fn write_run(
    thread_id: &ThreadId,
    record: &RunRecord,
    state_revision: u64,
    lease_epoch: u64,
    state: &StateMap,
    digests: &Digests,
) -> Option<Box<[u8]>> {
    let digest = digests.index_of(&record.spec_digest);
    with_compact_buffer(|buffer| {
        let mut writer = Writer::new(buffer);
        writer
            .run_row(thread_id, record, digest, state_revision, lease_epoch)
            .ok()?;
        writer.len(state.len());
        for (k, v) in state {
            let text = v.to_text().ok()?;
            writer.state_entry(k, &text).ok()?;
        }
        Some(Box::from(buffer.as_slice()))
    })
}

/// The row of `run_id` that [`write_run`] wrote into `bytes`.
pub(super) fn read_run(
    bytes: &[u8],
    run_id: &RunId,
    digests: &Digests,
) -> Result<ArchivedRun, StoreError> {
    let corrupt = |e| StoreError::corrupt("run", e);
    let mut reader = Reader::new(bytes);
    let (thread_id, record, state_revision, lease_epoch) = reader
        .run_row(run_id, |i| digests.get(i))
        .map_err(corrupt)?;
    let entries = reader.len().map_err(corrupt)?;
    let mut state = StateMap::default();
    for _ in 0..entries {
        let (k, text) = reader.state_entry().map_err(corrupt)?;
        let value = serde_json::from_str(text).map_err(|e| corrupt(Malformed(e.to_string())))?;
        state.insert(StateKeyName::Owned(k.to_owned()), StateValue::json(value));
    }
    if !reader.is_empty() {
        return Err(corrupt(Malformed(
            "bytes after a finished run's state".to_owned(),
        )));
    }
    Ok(ArchivedRun {
        thread_id,
        record,
        state_revision,
        lease_epoch,
        state,
    })
}

/// Whether the row [`write_run`] wrote into `bytes` is of a run on `thread_id`.
pub(super) fn run_is_on(bytes: &[u8], thread_id: &ThreadId) -> Result<bool, StoreError> {
    Reader::new(bytes)
        .str()
        .map(|t| t == thread_id.as_str())
        .map_err(|e| StoreError::corrupt("run", e))
}

/// The record of the row of `run_id` that [`write_run`] wrote into `bytes`.
pub(super) fn run_record(
    bytes: &[u8],
    run_id: &RunId,
    digests: &Digests,
) -> Result<RunRecord, StoreError> {
    Reader::new(bytes)
        .run_row(run_id, |i| digests.get(i))
        .map(|(_, record, _, _)| record)
        .map_err(|e| StoreError::corrupt("run", e))
}
