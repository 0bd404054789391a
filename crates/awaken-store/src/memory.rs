//! [`MemoryStore`]: everything in process memory, for tests and as the library default.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use awaken_event::{AgentEvent, Message, ProfileId, RunId, ThreadId};
use awaken_state::{PersistedState, StateValue};
use hashbrown::hash_map::RawEntryMut as Entry;

use crate::commit::{
    BatchData, BatchWrite, LeaseToken, RunRecord, RunStatus, ThreadCommit, Timestamp,
};
use crate::compact;
use crate::error::StoreError;
use crate::failpoint::{FailPoint, Failpoints};
use crate::store::{
    Checkpoint, ClaimedRun, CommitReceipt, ProfileEntry, ProfileState, StoredEvent, ThreadStore,
    ThreadSummary,
};

/// A [`ThreadStore`] in process memory. Commits are atomic: every check runs before the first
/// change, and a failure between changes (an injected fault) is rolled back from an undo log,
/// so the cost of a commit stays proportional to what it writes.
///
/// Threads are spread over independently locked shards (by a hash of the thread id), so
/// commits to different threads rarely wait for each other. Profiles, shared by threads, and
/// the index of which thread each run is on (sharded by run id) have their own locks, always
/// taken after a shard's (a thread's shard, then a run index shard, then the profiles).
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Inner>]>,
    /// The thread each run is on, sharded by run id (every new run's first commit holds its
    /// entry's lock while it is written): finds a run's shard, and refuses a run id on two
    /// threads.
    run_threads: Box<[Mutex<HashMap<RunId, ThreadId>>]>,
    profiles: Mutex<Profiles>,
    /// The finished runs' spec digests (taken after a shard's lock, last of all).
    digests: Digests,
    failpoints: Failpoints,
    /// Whether a run's end compacts its thread ([`MemoryStore::without_compaction`]).
    compact: bool,
}

/// How many shards a store has.
const SHARDS: usize = 16;

/// A state key's name: borrowed from the registry when the commit carried it so.
type StateKeyName = std::borrow::Cow<'static, str>;

type Profiles = HashMap<ProfileId, BTreeMap<String, ProfileEntry>>;

/// A run's or thread's stored state. Hashed, not ordered: a commit writes each changed key with
/// one string comparison instead of a walk through a tree's nodes; a load sorts (through
/// `PersistedState`).
type StateMap = HashMap<StateKeyName, StateValue>;

/// The store's hash maps: a fast hash with a per-process random seed (ids are short strings
/// hashed several times per commit, where SipHash would cost a visible share of it; see
/// ADR 0009). `hashbrown`'s for its raw entries: a commit finds its thread and run by
/// reference, where `entry` takes an owned key (a clone and a drop of each shared id, four
/// atomic operations per commit).
type HashMap<K, V> = hashbrown::HashMap<K, V, MapHasher>;
type MapHasher = foldhash::fast::RandomState;

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            run_threads: (0..SHARDS).map(|_| Mutex::default()).collect(),
            profiles: Mutex::default(),
            digests: Digests::default(),
            failpoints: Failpoints::default(),
            compact: true,
        }
    }
}

/// One shard: the threads whose id hashes to it, and their runs.
#[derive(Debug, Default)]
struct Inner {
    /// Boxed: a table's slot is a pointer, not a thread's 170 bytes (a table has room for up
    /// to twice as many threads as it holds).
    threads: HashMap<ThreadId, Box<ThreadData>>,
    runs: HashMap<RunId, RunSlot>,
}

/// Everything of one thread, found with one lookup per commit.
#[derive(Debug, Default)]
struct ThreadData {
    /// `None` only while the thread's first commit is being applied (a thread exists once a
    /// commit to it succeeded).
    row: Option<ThreadRow>,
    /// The messages and events of the runs done on it, in [`crate::compact`]'s form: a
    /// segment each time a run was done and the thread held messages or events written since
    /// (see [`ThreadData::compact`]), oldest first. A segment is never written again: the cost
    /// of a run's end does not grow with the thread.
    segments: Segments,
    /// How many messages the thread has, its segments' too.
    message_count: usize,
    /// The messages and events since (boxed, and `None` when there are none: a finished
    /// thread keeps a pointer, not the buffers and table a run writes them with).
    recent: Option<Box<Recent>>,
    /// Values as the commits carried them (typed until a load asks for JSON); boxed, made at
    /// the first write (most threads have no thread-scoped state).
    state: Option<Box<StateMap>>,
}

/// A thread's messages and events since its last compact segment.
#[derive(Debug, Default)]
struct Recent {
    /// The messages and events, written as the commits bring them (with compaction on).
    open: Open,
    /// The messages kept as the commits carried them: all of them without compaction; with
    /// it, from the first that could not be written on (they follow `open`'s).
    messages: MessageLog,
    /// The same of the events.
    events: EventLog,
}

/// A thread's messages and events since its last segment, written in [`crate::compact`]'s
/// form as each commit brings them (nothing of a commit's messages and 80-byte events is kept
/// until the run is done): the two
/// parts of the thread's next segment, its events then its messages, which a run's end puts
/// together. A commit's events are written before its messages, which may refer to them.
#[derive(Debug, Default)]
struct Open {
    events: Vec<u8>,
    messages: Vec<u8>,
    /// The strings written so far, for the next commits' back-references.
    seen: compact::Seen,
    event_count: u32,
    message_count: u32,
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

/// Where a thread's messages and events stood before a commit (put back if it fails).
#[derive(Debug, Clone, Copy)]
struct LogMark {
    message_count: usize,
    message_chunks: usize,
    event_chunks: usize,
    open_events: usize,
    open_event_count: u32,
    open_messages: usize,
    open_message_count: u32,
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
    fn is_empty(&self) -> bool {
        self.event_count == 0 && self.message_count == 0
    }

    /// The sequence number of its last event (it has one).
    fn last_seq(&self) -> u64 {
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
    fn append_events(&mut self, first_seq: u64, run_id: &RunId, events: &[AgentEvent]) -> bool {
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
        let mut writer = compact::Writer::resume(&mut self.events, &mut self.seen);
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
    fn append_messages(&mut self, messages: &[Message]) -> bool {
        let len = self.messages.len();
        let Some(count) = grown(self.message_count, messages.len()) else {
            return false;
        };
        if self.messages.capacity() == 0 {
            self.messages.reserve_exact(OPEN_MESSAGES_RESERVED);
        }
        let mut writer =
            compact::Writer::resume_messages(&mut self.messages, &self.events, &mut self.seen);
        if !messages.iter().all(|m| writer.message(m).is_ok()) {
            self.cut(MESSAGES_PART, len);
            return false;
        }
        self.message_count = count;
        true
    }

    /// Puts the written messages and events back where `mark` found them.
    fn reset(&mut self, mark: &LogMark) {
        self.cut(EVENTS_PART, mark.open_events);
        self.event_count = mark.open_event_count;
        self.cut(MESSAGES_PART, mark.open_messages);
        self.message_count = mark.open_message_count;
        if self.run_at != mark.run_at {
            // The run of the marker before (read back: a rollback of a run's first commit on a
            // thread is rare).
            self.run_at = mark.run_at;
            self.run = mark.run_at.and_then(|at| {
                compact::Reader::part(&self.events, at as usize + 1..self.events.len())
                    .id()
                    .ok()
            });
        }
    }

    /// The written events, and the messages when `with_messages`, as a segment (one
    /// allocation, copied); `next_seq` numbers a segment without events.
    fn segment(&self, with_messages: bool, next_seq: u64) -> Option<Segment> {
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

/// How many chunks a thread's message or event log makes room for at its first append: a short
/// conversation's logs never grow (with glibc, every `realloc` takes its arena's lock, which
/// the other worker threads contend for).
const LOG_CHUNKS_RESERVED: usize = 16;

/// A thread's messages kept as they came (when they cannot be written in the compact form, or
/// the store does not compact): one chunk per commit that brought any, a copy of the commit's
/// messages (shared with the reads that take it under the lock; never moved again by a
/// doubling buffer).
#[derive(Debug, Default)]
struct MessageLog {
    chunks: Vec<Arc<[Message]>>,
}

/// The events, then the messages, of the commits since the last segment, in
/// [`crate::compact`]'s form: one allocation, shared so that a read takes it under the shard's
/// lock and decodes it after releasing it (a string of the messages may refer back to the
/// events').
#[derive(Debug, Clone)]
struct Segment {
    bytes: Arc<[u8]>,
    /// Where the messages start in `bytes` (the events come first: they were written as the
    /// commits brought them, the messages when the run was done).
    messages_at: u32,
    messages: u32,
    events: u32,
    /// The sequence number of its first event (of the next event, when it has none).
    first_seq: u64,
}

/// A thread's segments, oldest first: the first is held in place (most threads have one, and
/// a vector of one is an allocation more per thread).
#[derive(Debug, Default)]
enum Segments {
    #[default]
    None,
    One(Segment),
    Many(Vec<Segment>),
}

impl Segments {
    fn push(&mut self, segment: Segment) {
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
    fn last_seq(&self) -> u64 {
        self.first_seq + u64::from(self.events) - 1
    }

    /// Where its messages start.
    fn messages_at(&self) -> usize {
        self.messages_at as usize
    }
}

/// A thread's messages as a read takes them under the lock: shared parts, decoded after the
/// lock is released.
struct MessageParts {
    segments: Vec<Segment>,
    chunks: Vec<Arc<[Message]>>,
    len: usize,
}

impl MessageParts {
    /// Every message, in order.
    fn decode(self) -> Result<Vec<Message>, StoreError> {
        let mut out = Vec::with_capacity(self.len);
        for segment in &self.segments {
            let mut reader = compact::Reader::messages(&segment.bytes, segment.messages_at());
            for _ in 0..segment.messages {
                out.push(
                    reader
                        .message()
                        .map_err(|e| StoreError::corrupt("message", e))?,
                );
            }
        }
        for chunk in &self.chunks {
            out.extend_from_slice(chunk);
        }
        Ok(out)
    }
}

impl MessageLog {
    fn append(&mut self, messages: Arc<[Message]>) {
        if self.chunks.capacity() == 0 {
            self.chunks.reserve_exact(LOG_CHUNKS_RESERVED);
        }
        self.chunks.push(messages);
    }
}

/// A thread's events kept as they came (as its messages are): one chunk per commit that brought
/// any, a copy of the commit's events (never padded out by a doubling vector).
#[derive(Debug, Default)]
struct EventLog {
    chunks: Vec<EventChunk>,
}

#[derive(Debug, Clone)]
struct EventChunk {
    /// The sequence number of the chunk's first event.
    first_seq: u64,
    run_id: RunId,
    /// A copy of the commit's events.
    events: Arc<[AgentEvent]>,
}

impl EventChunk {
    /// The sequence number of the chunk's last event (a chunk is never empty).
    fn last_seq(&self) -> u64 {
        self.first_seq + self.events.len() as u64 - 1
    }
}

/// The parts of an event log that hold events past a sequence number, as a read takes them
/// under the lock (shared), decoded after the lock is released.
struct EventParts {
    since: u64,
    segments: Vec<Segment>,
    chunks: Vec<EventChunk>,
}

impl EventParts {
    /// The events with a sequence number above `since`, in order.
    fn decode(self) -> Result<Vec<StoredEvent>, StoreError> {
        let since = self.since;
        let mut out = Vec::new();
        for segment in &self.segments {
            let mut reader = compact::Reader::part(&segment.bytes, 0..segment.messages_at());
            let mut seq = segment.first_seq;
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
        }
        for chunk in &self.chunks {
            for (i, event) in chunk.events.iter().enumerate() {
                let seq = chunk.first_seq + i as u64;
                if seq > since {
                    out.push(StoredEvent {
                        seq,
                        run_id: chunk.run_id.clone(),
                        event: event.clone(),
                    });
                }
            }
        }
        Ok(out)
    }
}

impl EventLog {
    fn append(&mut self, first_seq: u64, run_id: &RunId, events: Arc<[AgentEvent]>) {
        if self.chunks.capacity() == 0 {
            self.chunks.reserve_exact(LOG_CHUNKS_RESERVED);
        }
        self.chunks.push(EventChunk {
            first_seq,
            run_id: run_id.clone(),
            events,
        });
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

/// What a compaction took out of a thread, dropped after the locks are released.
type Compacted = Option<Box<Recent>>;

impl ThreadData {
    /// The message chunks kept as the commits carried them.
    fn message_chunks(&self) -> &[Arc<[Message]>] {
        self.recent.as_ref().map_or(&[], |r| &r.messages.chunks)
    }

    /// The event chunks kept as the commits carried them.
    fn event_chunks(&self) -> &[EventChunk] {
        self.recent.as_ref().map_or(&[], |r| &r.events.chunks)
    }

    /// The sequence number of the thread's last event (0: none).
    fn last_event_seq(&self) -> u64 {
        if let Some(chunk) = self.event_chunks().last() {
            return chunk.last_seq();
        }
        match &self.recent {
            Some(r) if r.open.event_count > 0 => r.open.last_seq(),
            _ => self.segments.last().map_or(0, Segment::last_seq),
        }
    }

    /// The number the next segment without events starts from.
    fn next_segment_seq(&self) -> u64 {
        self.segments.last().map_or(0, Segment::last_seq) + 1
    }

    /// Appends a commit's events, then its messages: written at once when `write` (compaction
    /// is on) and nothing of their kind before had to be kept as it came; kept as they came
    /// otherwise. (The thread's message count is the caller's.)
    fn append(&mut self, run_id: &RunId, messages: &[Message], events: &[AgentEvent], write: bool) {
        if !events.is_empty() {
            let first_seq = self.last_event_seq() + 1;
            let recent = self.recent.get_or_insert_default();
            if !(write
                && recent.events.chunks.is_empty()
                && recent.open.append_events(first_seq, run_id, events))
            {
                recent.events.append(first_seq, run_id, events.into());
            }
        }
        if !messages.is_empty() {
            let recent = self.recent.get_or_insert_default();
            if !(write
                && recent.messages.chunks.is_empty()
                && recent.open.append_messages(messages))
            {
                recent.messages.append(messages.into());
            }
        }
    }

    /// Where the thread's messages and events stand (see [`ThreadData::reset_log`]).
    fn log_mark(&self) -> LogMark {
        let (open, message_chunks, event_chunks) = match &self.recent {
            Some(r) => (
                Some(&r.open),
                r.messages.chunks.len(),
                r.events.chunks.len(),
            ),
            None => (None, 0, 0),
        };
        LogMark {
            message_count: self.message_count,
            message_chunks,
            event_chunks,
            open_events: open.map_or(0, |o| o.events.len()),
            open_event_count: open.map_or(0, |o| o.event_count),
            open_messages: open.map_or(0, |o| o.messages.len()),
            open_message_count: open.map_or(0, |o| o.message_count),
            run_at: open.and_then(|o| o.run_at),
        }
    }

    /// Puts the thread's messages and events back where `mark` found them (a rolled-back
    /// commit's).
    fn reset_log(&mut self, mark: &LogMark) {
        self.message_count = mark.message_count;
        if let Some(recent) = &mut self.recent {
            recent.messages.chunks.truncate(mark.message_chunks);
            recent.events.chunks.truncate(mark.event_chunks);
            recent.open.reset(mark);
        }
    }

    /// Every message, shared (see [`MessageParts`]); the ones written since the last segment
    /// copied.
    fn message_parts(&self) -> MessageParts {
        let mut segments = self.segments.to_vec();
        if let Some(open) = self.recent.as_ref().map(|r| &r.open)
            && open.message_count > 0
            && let Some(segment) = open.segment(true, self.next_segment_seq())
        {
            segments.push(segment);
        }
        MessageParts {
            segments,
            chunks: self.message_chunks().to_vec(),
            len: self.message_count,
        }
    }

    /// The parts holding events past `since` (the first segment and chunk with one, and all
    /// after them), shared (see [`EventParts`]); the ones written since the last segment
    /// copied.
    fn events_since(&self, since: u64) -> EventParts {
        let first = self.segments.partition_point(|s| s.last_seq() <= since);
        let mut segments = self.segments[first..].to_vec();
        if let Some(open) = self.recent.as_ref().map(|r| &r.open)
            && open.event_count > 0
            && open.last_seq() > since
            && let Some(segment) = open.segment(false, self.next_segment_seq())
        {
            segments.push(segment);
        }
        let chunks = self.event_chunks();
        let first_chunk = chunks.partition_point(|c| c.last_seq() <= since);
        EventParts {
            since,
            segments,
            chunks: chunks[first_chunk..].to_vec(),
        }
    }

    /// Makes the events and messages written since the last segment one more segment, when a
    /// run on it is done (another run's too if one is going on): a finished thread's messages
    /// and events take less than a tenth of the runtime's shared form (see
    /// [`crate::compact`]). A segment is never written again, and reads decode the segments.
    /// Hands back what the thread no longer needs (the buffers and their table), to be
    /// dropped after the locks are released. What was kept as it came stays so.
    fn compact(&mut self) -> Compacted {
        let next_seq = self.next_segment_seq();
        let open = &self.recent.as_ref()?.open;
        if !open.is_empty() {
            let segment = open.segment(true, next_seq)?;
            self.segments.push(segment);
        }
        let mut done = self.recent.take()?;
        if !done.messages.chunks.is_empty() || !done.events.chunks.is_empty() {
            self.recent = Some(Box::new(Recent {
                open: Open::default(),
                messages: std::mem::take(&mut done.messages),
                events: std::mem::take(&mut done.events),
            }));
        }
        Some(done)
    }
}

#[derive(Debug, Clone)]
struct ThreadRow {
    state_revision: u64,
    latest_run_id: RunId,
    created_at: Timestamp,
    updated_at: Timestamp,
}

/// A run's row: as the commits carried it while the run can change, and in [`crate::compact`]'s
/// form once a commit has finished it (written out, it takes less than half the heap of a boxed
/// row and its state map; see ADR 0009). A later write to a finished run reads it back first; a
/// read decodes it.
#[derive(Debug)]
enum RunSlot {
    Live(Box<RunRow>),
    /// A finished run holding no lease and no batch: [`compact::Writer::run_row`], then how
    /// many entries its state has, then each ([`compact::Writer::state_entry`]).
    Done(Box<[u8]>),
}

#[derive(Debug)]
struct RunRow {
    thread_id: ThreadId,
    record: RunRecord,
    state_revision: u64,
    /// As the commit carried it (shared, and typed when the writer kept it typed).
    batch: Option<BatchData>,
    /// The lease held on it, if any (boxed: most runs kept are done and hold none).
    lease: Option<Box<Lease>>,
    /// How many times it was claimed (kept when a lease ends: a token of an earlier claim
    /// never matches again).
    lease_epoch: u64,
    /// The run's state, as the commits carried it.
    state: StateMap,
}

/// A lease held on a run.
#[derive(Debug, Clone, PartialEq)]
struct Lease {
    owner: String,
    expires_at: Timestamp,
}

/// The spec digests of the finished runs' rows, each kept once (a row holds its digest's
/// place here: every run of an agent has the same 71-character digest).
#[derive(Debug, Default)]
struct Digests(Mutex<DigestTable>);

#[derive(Debug, Default)]
struct DigestTable {
    /// Each digest's place.
    places: HashMap<Arc<str>, u32>,
    /// The digests by place.
    all: Vec<Arc<str>>,
}

/// The most digests a store keeps; a row whose digest finds no room keeps its text.
const DIGESTS_KEPT: usize = 1024;

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
}

/// A run's record, state and batch as a load returns them.
struct LoadedRun {
    record: RunRecord,
    state: PersistedState,
    batch: Option<serde_json::Value>,
}

/// A finished run's row read back from `bytes` (see [`RunSlot::Done`]); its state's values
/// are JSON values.
fn read_row(bytes: &[u8], run_id: &RunId, digests: &Digests) -> Result<RunRow, StoreError> {
    let corrupt = |e| StoreError::corrupt("run", e);
    let mut reader = compact::Reader::new(bytes);
    let (thread_id, record, state_revision, lease_epoch) = reader
        .run_row(run_id, |i| digests.get(i))
        .map_err(corrupt)?;
    let entries = reader.len().map_err(corrupt)?;
    let mut state = StateMap::default();
    for _ in 0..entries {
        let (k, text) = reader.state_entry().map_err(corrupt)?;
        let value =
            serde_json::from_str(text).map_err(|e| corrupt(compact::Malformed(e.to_string())))?;
        state.insert(StateKeyName::Owned(k.to_owned()), StateValue::json(value));
    }
    if !reader.is_empty() {
        return Err(corrupt(compact::Malformed(
            "bytes after a finished run's state".to_owned(),
        )));
    }
    Ok(RunRow {
        thread_id,
        record,
        state_revision,
        batch: None,
        lease: None,
        lease_epoch,
        state,
    })
}

impl RunSlot {
    /// The row, to write to: a finished run's is read back first (a commit to a finished run
    /// is rare).
    fn live(&mut self, run_id: &RunId, digests: &Digests) -> Result<&mut RunRow, StoreError> {
        if let RunSlot::Done(bytes) = self {
            *self = RunSlot::Live(Box::new(read_row(bytes, run_id, digests)?));
        }
        self.live_row()
    }

    /// The row of a run whose finished row was read back already ([`RunSlot::live`]).
    fn live_row(&mut self) -> Result<&mut RunRow, StoreError> {
        match self {
            RunSlot::Live(row) => Ok(row),
            RunSlot::Done(_) => Err(StoreError::corrupt(
                "run",
                compact::Malformed("a finished run's row was not read back".to_owned()),
            )),
        }
    }

    /// The row if it can change (a finished run's holds no lease and is never claimable).
    fn if_live(&mut self) -> Option<&mut RunRow> {
        match self {
            RunSlot::Live(row) => Some(row),
            RunSlot::Done(_) => None,
        }
    }

    /// Whether the run is on `thread_id`.
    fn is_on(&self, thread_id: &ThreadId) -> Result<bool, StoreError> {
        match self {
            RunSlot::Live(row) => Ok(row.thread_id == *thread_id),
            RunSlot::Done(bytes) => compact::Reader::new(bytes)
                .str()
                .map(|t| t == thread_id.as_str())
                .map_err(|e| StoreError::corrupt("run", e)),
        }
    }

    /// The run's record.
    fn record(&self, run_id: &RunId, digests: &Digests) -> Result<RunRecord, StoreError> {
        match self {
            RunSlot::Live(row) => Ok(row.record.clone()),
            RunSlot::Done(bytes) => compact::Reader::new(bytes)
                .run_row(run_id, |i| digests.get(i))
                .map(|(_, record, _, _)| record)
                .map_err(|e| StoreError::corrupt("run", e)),
        }
    }

    /// The run's record, state and batch as a load returns them.
    fn load(&self, run_id: &RunId, digests: &Digests) -> Result<LoadedRun, StoreError> {
        let done;
        let row = match self {
            RunSlot::Live(row) => &**row,
            RunSlot::Done(bytes) => {
                done = read_row(bytes, run_id, digests)?;
                &done
            }
        };
        Ok(LoadedRun {
            record: row.record.clone(),
            state: persisted("run state", row.state_revision, &row.state)?,
            batch: row
                .batch
                .as_ref()
                .map(BatchData::to_json)
                .transpose()
                .map_err(|source| StoreError::Serialize {
                    what: "tool batch",
                    source,
                })?,
        })
    }

    /// Writes a finished run's row in compact form, if it holds no lease and no batch and
    /// each of its state's values has JSON text that reads back (not nested deeper than
    /// `serde_json` parses). Hands back the row it replaced, to be dropped after the locks are
    /// released.
    fn freeze(&mut self, digests: &Digests) -> Option<Box<RunRow>> {
        let RunSlot::Live(row) = self else {
            return None;
        };
        if row.record.status != RunStatus::Done || row.lease.is_some() || row.batch.is_some() {
            return None;
        }
        let digest = digests.index_of(&row.record.spec_digest);
        let bytes = with_compact_buffer(|buffer| {
            let mut writer = compact::Writer::new(buffer);
            writer
                .run_row(
                    &row.thread_id,
                    &row.record,
                    digest,
                    row.state_revision,
                    row.lease_epoch,
                )
                .ok()?;
            writer.len(row.state.len());
            for (k, v) in &row.state {
                let text = v.to_text().ok()?;
                writer.state_entry(k, &text).ok()?;
            }
            Some(Box::from(buffer.as_slice()))
        })?;
        match std::mem::replace(self, RunSlot::Done(bytes)) {
            RunSlot::Live(row) => Some(row),
            RunSlot::Done(_) => None,
        }
    }
}

/// What a commit changed in an existing run's row, to put back if it fails: the row is updated
/// in place (no new row per commit).
#[derive(Debug)]
struct RunUndo {
    record: RecordUndo,
    state_revision: u64,
    /// The batch before, if the commit set or cleared it.
    batch: Option<Option<BatchData>>,
    /// The lease before, if the commit (finishing the run) cleared it.
    lease: Option<Option<Box<Lease>>>,
}

/// What a commit replaced of a run's record, to put back if it fails.
#[derive(Debug)]
enum RecordUndo {
    /// What a run's commits move on (the record's shared strings and ids were the commit's
    /// own, and were kept).
    Progress {
        status: RunStatus,
        termination: Option<awaken_event::TerminationReason>,
        steps: u32,
        usage: awaken_event::TokenUsage,
        updated_at: Timestamp,
    },
    /// The whole record (the commit brought other ones).
    Whole(RunRecord),
}

impl RecordUndo {
    fn put_back(self, record: &mut RunRecord) {
        match self {
            Self::Whole(old) => *record = old,
            Self::Progress {
                status,
                termination,
                steps,
                usage,
                updated_at,
            } => {
                record.status = status;
                record.termination = termination;
                record.steps = steps;
                record.usage = usage;
                record.updated_at = updated_at;
            }
        }
    }
}

/// Writes `new` over a run's `stored` record (its creation time kept), and returns what it
/// replaced. A commit of the same run carries the same shared strings (the runtime's copies of
/// one record): then only what moves on is written, and no reference count changes.
fn write_record(stored: &mut RunRecord, new: &RunRecord) -> RecordUndo {
    // Every field, named: a new one is a compile error here until it is written.
    let RunRecord {
        run_id,
        parent_run_id,
        agent_id,
        profile_id,
        status,
        termination,
        steps,
        usage,
        spec_digest,
        created_at: _,
        updated_at,
    } = new;
    let same = Arc::ptr_eq(&stored.agent_id, agent_id)
        && Arc::ptr_eq(&stored.spec_digest, spec_digest)
        && stored.run_id == *run_id
        && stored.parent_run_id == *parent_run_id
        && stored.profile_id == *profile_id;
    if !same {
        let created_at = stored.created_at;
        return RecordUndo::Whole(std::mem::replace(
            stored,
            RunRecord {
                created_at,
                ..new.clone()
            },
        ));
    }
    RecordUndo::Progress {
        status: std::mem::replace(&mut stored.status, *status),
        termination: std::mem::replace(&mut stored.termination, termination.clone()),
        steps: std::mem::replace(&mut stored.steps, *steps),
        usage: std::mem::replace(&mut stored.usage, *usage),
        updated_at: std::mem::replace(&mut stored.updated_at, *updated_at),
    }
}

/// What a rollback needs to know about the commit it undoes.
struct CommitIds<'c> {
    thread_id: &'c ThreadId,
    run_id: &'c RunId,
    profile_id: Option<&'c ProfileId>,
}

impl<'c> CommitIds<'c> {
    fn of(c: &'c ThreadCommit) -> Self {
        Self {
            thread_id: &c.thread_id,
            run_id: &c.run.run_id,
            profile_id: c.run.profile_id.as_ref(),
        }
    }
}

/// One change to undo if a later write of the same commit fails. The log is a worker thread's,
/// reused from commit to commit (no allocation per commit); an entry is small (a run's old
/// record, a few hundred bytes, is kept beside the log, not in every entry).
enum Undo {
    /// Where the thread's messages and events stood before the commit.
    Log(LogMark),
    /// The commit created the run's row.
    RunCreated,
    /// The commit changed the run's row in place; what it held before is the commit's
    /// [`RunUndo`].
    RunUpdated,
    /// The thread row a commit replaced (`None`: the commit created it).
    Thread(Option<ThreadRow>),
    /// What a commit of the thread's latest run changed in its row (kept in place).
    ThreadTimes {
        state_revision: u64,
        updated_at: Timestamp,
    },
    ThreadKey(StateKeyName, Option<StateValue>),
    RunKey(StateKeyName, Option<StateValue>),
    ProfileKey(String, Option<ProfileEntry>),
}

/// The most undo entries a worker thread's reused log keeps room for between commits.
const UNDO_LOG_KEPT: usize = 64;

thread_local! {
    /// The undo log of the commits made on this OS thread, kept between them (emptied, with
    /// room for up to `UNDO_LOG_KEPT` entries).
    static UNDO_LOG: std::cell::Cell<Vec<Undo>> = const { std::cell::Cell::new(Vec::new()) };
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store that keeps a copy of every commit's messages and events as they came instead
    /// of its compact form: about six times the memory per finished thread, for no encoding.
    /// Reads give back the same either way.
    pub fn without_compaction() -> Self {
        Self {
            compact: false,
            ..Self::default()
        }
    }

    /// Makes the next commit that reaches `point` fail there (tests of atomicity).
    #[cfg(feature = "failpoints")]
    pub fn arm_failpoint(&self, point: FailPoint) {
        self.failpoints.arm(point);
    }

    /// The shard of `thread_id`, locked.
    fn shard(&self, thread_id: &ThreadId) -> MutexGuard<'_, Inner> {
        lock(&self.shards[shard_of(thread_id)])
    }

    /// The run index shard that holds `run_id`'s entry, locked.
    fn run_index(&self, run_id: &RunId) -> MutexGuard<'_, HashMap<RunId, ThreadId>> {
        lock(&self.run_threads[shard_of(run_id)])
    }

    /// The shard holding `run_id`, locked, if the run exists.
    fn run_shard(&self, run_id: &RunId) -> Option<MutexGuard<'_, Inner>> {
        // The index lock is released before the shard's is taken (shard first, always).
        let thread_id = self.run_index(run_id).get(run_id).cloned()?;
        Some(self.shard(&thread_id))
    }
}

/// The shard of `key` among [`SHARDS`].
fn shard_of(key: &impl std::hash::Hash) -> usize {
    let h = foldhash::fast::FixedState::default().hash_one(key);
    usize::try_from(h % SHARDS as u64).unwrap_or(0)
}

/// Locks `m`. A panic while holding a lock cannot leave a half-applied commit (the undo log
/// runs on errors, and nothing in the write path panics), so the data is still consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a commit finds of its thread and run in their shard (each looked up once).
type ThreadEntry<'a> = Entry<'a, ThreadId, Box<ThreadData>, MapHasher>;
type RunEntry<'a> = Entry<'a, RunId, RunSlot, MapHasher>;

impl Inner {
    /// Checks a commit against its thread and run as stored (`None`: not stored yet).
    fn check(
        thread: Option<&ThreadData>,
        run: Option<&RunRow>,
        c: &ThreadCommit,
        profiles: Option<&Profiles>,
    ) -> Result<(), StoreError> {
        let actual = thread.map_or(0, |t| t.message_count as u64);
        if actual != c.expected_message_count {
            return Err(StoreError::VersionConflict {
                expected: c.expected_message_count,
                actual,
            });
        }
        if let Some(run) = run
            && run.thread_id != c.thread_id
        {
            return Err(StoreError::RunOnOtherThread {
                run_id: c.run.run_id.clone(),
                thread_id: c.thread_id.clone(),
                stored_thread_id: run.thread_id.clone(),
            });
        }
        if let Some(lease) = &c.lease {
            let held = run.is_some_and(|r| holds(r, lease));
            if !held {
                return Err(StoreError::LeaseLost {
                    run_id: c.run.run_id.clone(),
                });
            }
        }
        if c.run.status == RunStatus::Done
            && matches!(c.batch, BatchWrite::Keep)
            && let Some(batch) = run.and_then(|r| r.batch.as_ref())
        {
            crate::commit::check_batch(batch, RunStatus::Done)
                .map_err(|v| StoreError::invalid(&c.thread_id, v))?;
        }
        if let Some(profile_id) = &c.run.profile_id {
            let stored = profiles.and_then(|p| p.get(profile_id));
            for (key, read) in &c.profile_versions {
                let current = stored.and_then(|p| p.get(key)).map_or(0, |e| e.version);
                if current != *read {
                    return Err(StoreError::ProfileConflict { key: key.clone() });
                }
            }
        }
        Ok(())
    }

    /// Applies a checked commit to its thread's and run's entries: the state's values and the
    /// batch are taken from it, the record written in place when it can be, the messages and
    /// events read (written in the compact form, or copied when they cannot be).
    fn apply(
        thread: ThreadEntry<'_>,
        run: RunEntry<'_>,
        c: &mut ThreadCommit,
        store: &MemoryStore,
        undo: &mut Vec<Undo>,
        run_undo: &mut Option<RunUndo>,
        profiles: Option<&mut Profiles>,
    ) -> Result<CommitReceipt, StoreError> {
        // What the store keeps of the commit is taken (the state's values, drained so their
        // lists keep their room for the runtime's next export, and the batch) or copied (the
        // record); its messages and events are read.
        let ThreadCommit {
            thread_id: tid,
            run: record,
            messages: new_messages,
            events: new_events,
            run_state: run_delta,
            thread_state: thread_delta,
            profile_state: profile_delta,
            batch,
            ..
        } = c;
        let (tid, record) = (&*tid, &*record);
        let batch_write = std::mem::replace(batch, BatchWrite::Keep);
        let rid = &record.run_id;
        let now = record.updated_at;
        let status = record.status;
        let profile_id = &record.profile_id;

        let thread = match thread {
            Entry::Occupied(t) => t.into_mut(),
            Entry::Vacant(t) => t.insert(tid.clone(), Box::default()).1,
        };
        undo.push(Undo::Log(thread.log_mark()));
        // (Written with the events, after them: see `ThreadData::append`.)
        thread.message_count += new_messages.len();
        let message_count = thread.message_count as u64;
        store.failpoints.check(FailPoint::AfterMessages)?;

        // The row is updated in place; what it held before is the undo.
        let row = match run {
            Entry::Occupied(slot) => {
                let row = slot.into_mut().live_row()?;
                let old_record = write_record(&mut row.record, record);
                let batch = match batch_write {
                    BatchWrite::Keep => None,
                    BatchWrite::Set(b) => Some(row.batch.replace(b)),
                    BatchWrite::Clear => Some(row.batch.take()),
                };
                let lease = (status == RunStatus::Done).then(|| row.lease.take());
                *run_undo = Some(RunUndo {
                    record: old_record,
                    state_revision: row.state_revision,
                    batch,
                    lease,
                });
                undo.push(Undo::RunUpdated);
                row
            }
            Entry::Vacant(slot) => {
                let batch = match batch_write {
                    BatchWrite::Set(b) => Some(b),
                    BatchWrite::Keep | BatchWrite::Clear => None,
                };
                undo.push(Undo::RunCreated);
                let (_, slot) = slot.insert(
                    rid.clone(),
                    RunSlot::Live(Box::new(RunRow {
                        thread_id: tid.clone(),
                        record: record.clone(),
                        state_revision: 0,
                        batch,
                        lease: None,
                        lease_epoch: 0,
                        state: StateMap::default(),
                    })),
                );
                slot.live_row()?
            }
        };
        if !run_delta.values.is_empty() {
            row.state_revision = run_delta.revision;
        }
        store.failpoints.check(FailPoint::AfterRun)?;

        for (k, v) in run_delta.values.drain() {
            let old = row.state.insert(k.clone(), v);
            undo.push(Undo::RunKey(k, old));
        }
        let thread_revision = (!thread_delta.values.is_empty()).then_some(thread_delta.revision);
        for (k, v) in thread_delta.values.drain() {
            let old = thread.state.get_or_insert_default().insert(k.clone(), v);
            undo.push(Undo::ThreadKey(k, old));
        }
        let mut profile_versions = BTreeMap::new();
        if let Some(pid) = profile_id
            && let Some(profiles) = profiles
            && !profile_delta.values.is_empty()
        {
            let profile = profiles.entry(pid.clone()).or_default();
            for (k, value) in profile_delta.values.drain() {
                let value = match value.into_json() {
                    Ok(value) => value,
                    Err(source) => {
                        return Err(StoreError::StateValue {
                            what: "profile state",
                            source,
                        });
                    }
                };
                let k = k.into_owned();
                let version = profile.get(&k).map_or(0, |e| e.version) + 1;
                profile_versions.insert(k.clone(), version);
                let old = profile.insert(k.clone(), ProfileEntry { value, version });
                undo.push(Undo::ProfileKey(k, old));
            }
        }
        store.failpoints.check(FailPoint::AfterState)?;

        // (Written in the compact form as they come when the store compacts.)
        thread.append(rid, new_messages, new_events, store.compact);
        let seq = thread.last_event_seq();
        store.failpoints.check(FailPoint::AfterEvents)?;

        // The thread row is written last, after every failpoint: no rollback undoes it today
        // (its undo entries keep a rollback correct if a failure point is ever added after it).
        match &mut thread.row {
            // The same run's next commit: the row changes in place (its run id is kept, not
            // replaced by an equal copy).
            Some(row) if row.latest_run_id == *rid => {
                undo.push(Undo::ThreadTimes {
                    state_revision: row.state_revision,
                    updated_at: row.updated_at,
                });
                row.state_revision = thread_revision.unwrap_or(row.state_revision);
                row.updated_at = now;
            }
            row => {
                // A new thread is created now, at state revision 0.
                let (created_at, state_revision) = row
                    .as_ref()
                    .map_or((now, 0), |old| (old.created_at, old.state_revision));
                let next = ThreadRow {
                    state_revision: thread_revision.unwrap_or(state_revision),
                    latest_run_id: rid.clone(),
                    created_at,
                    updated_at: now,
                };
                undo.push(Undo::Thread(row.replace(next)));
            }
        }

        Ok(CommitReceipt {
            message_count,
            last_event_seq: seq,
            profile_versions,
        })
    }

    /// Undoes a failed commit's changes, emptying `undo` (its capacity is kept).
    fn rollback(
        &mut self,
        ids: &CommitIds<'_>,
        undo: &mut Vec<Undo>,
        mut run_undo: Option<RunUndo>,
        mut profiles: Option<&mut Profiles>,
    ) {
        let (tid, rid) = (ids.thread_id, ids.run_id);
        for op in undo.drain(..).rev() {
            match op {
                Undo::Log(mark) => {
                    if let Some(t) = self.threads.get_mut(tid) {
                        t.reset_log(&mark);
                    }
                }
                Undo::RunCreated => {
                    self.runs.remove(rid);
                }
                Undo::RunUpdated => {
                    if let Some(old) = run_undo.take()
                        && let Some(row) = self.runs.get_mut(rid).and_then(RunSlot::if_live)
                    {
                        old.record.put_back(&mut row.record);
                        row.state_revision = old.state_revision;
                        if let Some(batch) = old.batch {
                            row.batch = batch;
                        }
                        if let Some(lease) = old.lease {
                            row.lease = lease;
                        }
                    }
                }
                Undo::Thread(old) => {
                    if let Some(t) = self.threads.get_mut(tid) {
                        t.row = old;
                    }
                }
                Undo::ThreadTimes {
                    state_revision,
                    updated_at,
                } => {
                    if let Some(row) = self.threads.get_mut(tid).and_then(|t| t.row.as_mut()) {
                        row.state_revision = state_revision;
                        row.updated_at = updated_at;
                    }
                }
                Undo::RunKey(k, old) => {
                    if let Some(row) = self.runs.get_mut(rid).and_then(RunSlot::if_live) {
                        restore(&mut row.state, &k, old);
                    }
                }
                Undo::ThreadKey(k, old) => {
                    if let Some(state) = self.threads.get_mut(tid).and_then(|t| t.state.as_mut()) {
                        restore(&mut **state, &k, old);
                    }
                }
                Undo::ProfileKey(k, old) => {
                    if let Some(m) = ids
                        .profile_id
                        .zip(profiles.as_deref_mut())
                        .and_then(|(p, profiles)| profiles.get_mut(p))
                    {
                        restore(m, &k, old);
                    }
                }
            }
        }
        // A thread whose first commit failed does not exist.
        if self.threads.get(tid).is_some_and(|t| t.row.is_none()) {
            self.threads.remove(tid);
        }
    }
}

trait MapLike<K, V> {
    fn put(&mut self, k: K, v: V);
    fn del(&mut self, k: &K);
}

impl<K: Ord, V> MapLike<K, V> for BTreeMap<K, V> {
    fn put(&mut self, k: K, v: V) {
        self.insert(k, v);
    }
    fn del(&mut self, k: &K) {
        self.remove(k);
    }
}

impl<K: std::hash::Hash + Eq, V, S: BuildHasher> MapLike<K, V> for hashbrown::HashMap<K, V, S> {
    fn put(&mut self, k: K, v: V) {
        self.insert(k, v);
    }
    fn del(&mut self, k: &K) {
        self.remove(k);
    }
}

fn restore<K: Clone, V>(map: &mut impl MapLike<K, V>, key: &K, old: Option<V>) {
    match old {
        Some(v) => map.put(key.clone(), v),
        None => map.del(key),
    }
}

fn persisted<'a>(
    what: &'static str,
    revision: u64,
    values: impl IntoIterator<Item = (&'a StateKeyName, &'a StateValue)>,
) -> Result<PersistedState, StoreError> {
    PersistedState::from_values(revision, values)
        .map_err(|source| StoreError::StateValue { what, source })
}

fn profile_state(profiles: &Profiles, profile_id: &ProfileId) -> ProfileState {
    ProfileState {
        profile_id: profile_id.clone(),
        keys: profiles.get(profile_id).cloned().unwrap_or_default(),
    }
}

impl MemoryStore {
    /// A commit, written at once (nothing in it waits). Its state's values and its batch are
    /// taken; the rest is read (see [`ThreadStore::commit_now`]).
    fn write(&self, commit: &mut ThreadCommit) -> Result<CommitReceipt, StoreError> {
        commit
            .validate()
            .map_err(|v| StoreError::invalid(&commit.thread_id, v))?;
        let mut inner = self.shard(&commit.thread_id);
        // A run new to this shard: the index says whether it is on another thread, and stays
        // locked until the commit has put it there.
        let Inner { threads, runs } = &mut *inner;
        // The thread and the run, each found once: checked, then written through the same
        // entries (a vacant one left unused inserts nothing).
        let thread = threads.raw_entry_mut().from_key(&commit.thread_id);
        let mut run = runs.raw_entry_mut().from_key(&commit.run.run_id);
        let mut run_threads = None;
        if matches!(run, Entry::Vacant(_)) {
            let index = self.run_index(&commit.run.run_id);
            if let Some(stored) = index.get(&commit.run.run_id)
                && *stored != commit.thread_id
            {
                return Err(StoreError::RunOnOtherThread {
                    run_id: commit.run.run_id.clone(),
                    thread_id: commit.thread_id.clone(),
                    stored_thread_id: stored.clone(),
                });
            }
            run_threads = Some(index);
        }
        let mut profiles = commit
            .run
            .profile_id
            .is_some()
            .then(|| lock(&self.profiles));
        let was_done = matches!(&run, Entry::Occupied(r) if matches!(r.get(), RunSlot::Done(_)));
        let checked = Inner::check(
            match &thread {
                Entry::Occupied(t) => Some(&**t.get()),
                Entry::Vacant(_) => None,
            },
            match &mut run {
                // (A finished run's row is read back here, before anything changes.)
                Entry::Occupied(r) => Some(&*r.get_mut().live(&commit.run.run_id, &self.digests)?),
                Entry::Vacant(_) => None,
            },
            commit,
            profiles.as_deref(),
        );
        if let Err(e) = checked {
            // A refused commit leaves a finished run's row written out, as it found it.
            if was_done && let Entry::Occupied(r) = &mut run {
                r.get_mut().freeze(&self.digests);
            }
            return Err(e);
        }
        // Room for every change the commit can make, in this thread's reused log (after the
        // first commits, no allocation at all).
        let mut undo = UNDO_LOG.take();
        undo.reserve(
            5 + commit.run_state.values.len()
                + commit.thread_state.values.len()
                + commit.profile_state.values.len(),
        );
        // What the commit replaced in its run's row: put back on failure, freed after the locks
        // are released on success.
        let mut run_undo = None;
        let finishing = commit.run.status == RunStatus::Done;
        let result = Inner::apply(
            thread,
            run,
            commit,
            self,
            &mut undo,
            &mut run_undo,
            profiles.as_deref_mut(),
        );
        let ids = CommitIds::of(commit);
        // A finished run's thread is compacted once the commit is in, under the shard's lock
        // only.
        let compact = self.compact && finishing && result.is_ok();
        match (&result, run_threads.as_mut()) {
            (Err(_), _) => {
                inner.rollback(&ids, &mut undo, run_undo.take(), profiles.as_deref_mut());
            }
            (Ok(_), Some(index)) => {
                index.insert(ids.run_id.clone(), ids.thread_id.clone());
            }
            (Ok(_), None) => {}
        }
        drop(profiles);
        drop(run_threads);
        // (The state's values serialize here, after the index and profile locks are released.)
        let compacted = compact.then(|| {
            let row = inner
                .runs
                .get_mut(ids.run_id)
                .and_then(|r| r.freeze(&self.digests));
            (
                row,
                inner
                    .threads
                    .get_mut(ids.thread_id)
                    .and_then(|t| t.compact()),
            )
        });
        // The replaced rows and values, and a compacted thread's shared form, are freed after
        // the locks are released.
        drop(inner);
        // (`run_undo` is dropped where it lies, at the end, after the locks too: a
        // `drop(run_undo)` would first copy its 232 bytes.)
        drop(compacted);
        undo.clear();
        // A commit of very many keys does not pin its log's room on this thread for good.
        undo.shrink_to(UNDO_LOG_KEPT);
        // (`with`: `LocalKey::set` first checks whether the thread's slot needs its initial
        // value, which a constant-initialized slot never does.)
        UNDO_LOG.with(|log| log.set(undo));
        result
    }
}

#[async_trait]
impl ThreadStore for MemoryStore {
    async fn commit(&self, mut commit: ThreadCommit) -> Result<CommitReceipt, StoreError> {
        self.write(&mut commit)
    }

    fn commit_now(&self, commit: &mut ThreadCommit) -> Option<Result<CommitReceipt, StoreError>> {
        Some(self.write(commit))
    }

    async fn load_checkpoint(
        &self,
        thread_id: &ThreadId,
    ) -> Result<Option<Checkpoint>, StoreError> {
        let inner = self.shard(thread_id);
        let Some((data, thread)) = inner
            .threads
            .get(thread_id)
            .and_then(|t| Some((t, t.row.as_ref()?)))
        else {
            return Ok(None);
        };
        let run_id = &thread.latest_run_id;
        let run = match inner.runs.get(run_id) {
            Some(slot) => Some(slot.load(run_id, &self.digests)?),
            None => None,
        };
        let messages = data.message_parts();
        let profile = run
            .as_ref()
            .and_then(|r| r.record.profile_id.as_ref())
            .map(|p| profile_state(&lock(&self.profiles), p));
        let (run, run_state, batch) = match run {
            Some(r) => (Some(r.record), r.state, r.batch),
            None => (None, PersistedState::default(), None),
        };
        let mut checkpoint = Checkpoint {
            thread_id: thread_id.clone(),
            messages: Vec::new(),
            thread_state: persisted(
                "thread state",
                thread.state_revision,
                data.state.iter().flat_map(|state| state.iter()),
            )?,
            run,
            run_state,
            profile,
            batch,
            last_event_seq: data.last_event_seq(),
        };
        // Decoded after the shard's lock is released.
        drop(inner);
        checkpoint.messages = messages.decode()?;
        Ok(Some(checkpoint))
    }

    async fn load_profile(&self, profile_id: &ProfileId) -> Result<ProfileState, StoreError> {
        Ok(profile_state(&lock(&self.profiles), profile_id))
    }

    async fn list_threads(&self) -> Result<Vec<ThreadSummary>, StoreError> {
        let mut threads: Vec<ThreadSummary> = Vec::new();
        for shard in &self.shards {
            let inner = lock(shard);
            threads.extend(inner.threads.iter().filter_map(|(id, data)| {
                let t = data.row.as_ref()?;
                Some(ThreadSummary {
                    thread_id: id.clone(),
                    message_count: data.message_count as u64,
                    latest_run_id: Some(t.latest_run_id.clone()),
                    created_at: t.created_at,
                    updated_at: t.updated_at,
                })
            }));
        }
        threads.sort_unstable_by(|a, b| a.thread_id.cmp(&b.thread_id));
        Ok(threads)
    }

    async fn list_runs(&self, thread_id: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        let inner = self.shard(thread_id);
        let mut runs: Vec<RunRecord> = Vec::new();
        for (run_id, slot) in &inner.runs {
            if slot.is_on(thread_id)? {
                runs.push(slot.record(run_id, &self.digests)?);
            }
        }
        runs.sort_by(|a, b| (a.created_at, &a.run_id).cmp(&(b.created_at, &b.run_id)));
        Ok(runs)
    }

    async fn load_events(
        &self,
        thread_id: &ThreadId,
        since: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let parts = self
            .shard(thread_id)
            .threads
            .get(thread_id)
            .map(|t| t.events_since(since));
        // Decoded after the shard's lock is released.
        parts.map_or_else(|| Ok(Vec::new()), EventParts::decode)
    }

    async fn delete_thread(&self, thread_id: &ThreadId) -> Result<bool, StoreError> {
        let mut inner = self.shard(thread_id);
        // (Its runs are found first: a row that does not read back fails the delete before
        // anything is removed.)
        let mut runs: Vec<RunId> = Vec::new();
        for (run_id, slot) in &inner.runs {
            if slot.is_on(thread_id)? {
                runs.push(run_id.clone());
            }
        }
        let existed = inner
            .threads
            .remove(thread_id)
            .is_some_and(|t| t.row.is_some());
        for run in runs {
            inner.runs.remove(&run);
            self.run_index(&run).remove(&run);
        }
        Ok(existed)
    }

    async fn claim_runnable(
        &self,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<ClaimedRun>, StoreError> {
        check_worker(worker_id)?;
        // Every shard, locked in order, so the oldest runs of the whole store are claimed.
        let mut shards: Vec<MutexGuard<'_, Inner>> = self.shards.iter().map(lock).collect();
        let mut free: Vec<&mut RunRow> = shards
            .iter_mut()
            .flat_map(|inner| inner.runs.values_mut())
            .filter_map(RunSlot::if_live)
            .filter(|r| claimable(r, now))
            .collect();
        free.sort_by(|a, b| {
            (a.record.updated_at, &a.record.run_id).cmp(&(b.record.updated_at, &b.record.run_id))
        });
        let expires_at = now.saturating_add(lease_duration);
        Ok(free
            .into_iter()
            .take(limit)
            .map(|r| claim(r, worker_id, expires_at))
            .collect())
    }

    async fn claim_run(
        &self,
        run_id: &RunId,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Option<ClaimedRun>, StoreError> {
        check_worker(worker_id)?;
        let Some(mut inner) = self.run_shard(run_id) else {
            return Ok(None);
        };
        Ok(inner
            .runs
            .get_mut(run_id)
            .and_then(RunSlot::if_live)
            .filter(|r| claimable(r, now))
            .map(|r| claim(r, worker_id, now.saturating_add(lease_duration))))
    }

    async fn heartbeat(
        &self,
        lease: &LeaseToken,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Timestamp, StoreError> {
        let mut inner = self.run_shard(&lease.run_id);
        match inner
            .as_mut()
            .and_then(|i| i.runs.get_mut(&lease.run_id))
            .and_then(RunSlot::if_live)
        {
            Some(r) if holds(r, lease) => {
                let expires_at = now.saturating_add(lease_duration);
                if let Some(held) = &mut r.lease {
                    held.expires_at = expires_at;
                }
                Ok(expires_at)
            }
            _ => Err(StoreError::LeaseLost {
                run_id: lease.run_id.clone(),
            }),
        }
    }

    async fn release(&self, lease: &LeaseToken) -> Result<bool, StoreError> {
        let mut inner = self.run_shard(&lease.run_id);
        match inner
            .as_mut()
            .and_then(|i| i.runs.get_mut(&lease.run_id))
            .and_then(RunSlot::if_live)
        {
            Some(r) if holds(r, lease) => {
                r.lease = None;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

/// An unfinished run whose lease is free or expired at `now`.
fn claimable(r: &RunRow, now: Timestamp) -> bool {
    r.record.status != RunStatus::Done && r.lease.as_ref().is_none_or(|l| l.expires_at <= now)
}

/// Gives `r`'s lease to `worker_id` until `expires_at` (a new epoch).
fn claim(r: &mut RunRow, worker_id: &str, expires_at: Timestamp) -> ClaimedRun {
    r.lease = Some(Box::new(Lease {
        owner: worker_id.to_owned(),
        expires_at,
    }));
    r.lease_epoch += 1;
    ClaimedRun {
        thread_id: r.thread_id.clone(),
        run: r.record.clone(),
        lease: LeaseToken {
            run_id: r.record.run_id.clone(),
            worker_id: worker_id.to_owned(),
            epoch: r.lease_epoch,
        },
        expires_at,
    }
}

fn holds(r: &RunRow, lease: &LeaseToken) -> bool {
    r.lease.as_ref().is_some_and(|l| l.owner == lease.worker_id) && r.lease_epoch == lease.epoch
}

pub(crate) fn check_worker(worker_id: &str) -> Result<(), StoreError> {
    if worker_id.trim().is_empty() {
        return Err(StoreError::Config {
            detail: "worker id is blank".to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(thread: &str, run: &str, expected_messages: u64) -> ThreadCommit {
        let run = RunRecord::new(
            RunId::new(run).expect("id"),
            "agent",
            Timestamp::from_unix_millis(10),
        );
        ThreadCommit::new(ThreadId::new(thread).expect("id"), run, expected_messages)
    }

    /// Whether the store holds anything of `thread` or `run` (the public reads hide a thread
    /// without a row; this looks at the maps themselves).
    fn holds(store: &MemoryStore, thread: &str, run: &str) -> (bool, bool, bool) {
        let thread = ThreadId::new(thread).expect("id");
        let run = RunId::new(run).expect("id");
        let shard = store.shard(&thread);
        (
            shard.threads.contains_key(&thread),
            shard.runs.contains_key(&run),
            store.run_index(&run).contains_key(&run),
        )
    }

    #[test]
    fn a_refused_commit_of_a_new_thread_or_run_inserts_nothing() {
        let store = MemoryStore::new();
        // A message guard the new thread does not meet.
        assert!(matches!(
            store.write(&mut commit("t1", "r1", 3)),
            Err(StoreError::VersionConflict { .. })
        ));
        assert_eq!(holds(&store, "t1", "r1"), (false, false, false));
        // A run already on another thread.
        store.write(&mut commit("t2", "r2", 0)).expect("written");
        assert_eq!(holds(&store, "t2", "r2"), (true, true, true));
        assert!(matches!(
            store.write(&mut commit("t3", "r2", 0)),
            Err(StoreError::RunOnOtherThread { .. })
        ));
        assert!(!holds(&store, "t3", "r2").0);
        // A new run on a stored thread, refused by its guard.
        assert!(matches!(
            store.write(&mut commit("t2", "r4", 5)),
            Err(StoreError::VersionConflict { .. })
        ));
        assert_eq!(holds(&store, "t2", "r4"), (true, false, false));
    }

    /// Events and messages that cannot be written in the compact form (JSON nested deeper
    /// than it takes) are kept as they came, with every event after such an event: reads give
    /// back what a store without compaction gives, in order, from every sequence number.
    #[test]
    fn what_cannot_be_written_is_kept_as_it_came() {
        use awaken_event::{AgentEvent, Message, TerminationReason, ToolCall, ToolCallId};
        let mut deep = serde_json::json!(1);
        for _ in 0..600 {
            deep = serde_json::Value::Array(vec![deep]);
        }
        let call = ToolCall::new(ToolCallId::new("c1").expect("id"), "t", deep.clone());
        let ready = AgentEvent::ToolCallReady {
            call_id: call.id.clone(),
            name: Arc::from("t"),
            arguments: Arc::new(deep),
        };
        let step = |step| AgentEvent::StepStart { step };
        // (run, expected messages, messages, events, finishes)
        let commits: Vec<(&str, u64, Vec<Message>, Vec<AgentEvent>, bool)> = vec![
            ("r1", 0, vec![Message::user("hi")], vec![step(1)], false),
            ("r1", 1, vec![], vec![ready], false),
            ("r1", 1, vec![], vec![step(2)], false),
            ("r1", 1, vec![Message::assistant("ok")], vec![step(3)], true),
            (
                "r2",
                2,
                vec![Message::assistant_with_calls("", vec![call])],
                vec![step(1)],
                true,
            ),
            ("r3", 3, vec![Message::user("again")], vec![step(1)], true),
        ];
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let thread = ThreadId::new("t1").expect("id");
        let (compacting, shared) = (MemoryStore::new(), MemoryStore::without_compaction());
        for (i, (run, expected, messages, events, done)) in commits.into_iter().enumerate() {
            let mut c = commit("t1", run, expected);
            c.messages = messages;
            c.events = events;
            if done {
                c.run.status = RunStatus::Done;
                c.run.termination = Some(TerminationReason::NaturalEnd);
            }
            compacting.write(&mut c.clone()).expect("written");
            shared.write(&mut c).expect("written");
            let read = |store: &MemoryStore| {
                let messages = rt
                    .block_on(store.load_checkpoint(&thread))
                    .expect("load")
                    .expect("thread")
                    .messages;
                let events: Vec<_> = (0..8)
                    .map(|since| {
                        rt.block_on(store.load_events(&thread, since))
                            .expect("events")
                    })
                    .collect();
                (messages, events)
            };
            assert_eq!(read(&compacting), read(&shared), "after commit {i}");
        }
        // The first segment has the one event written before the deep one; the rest came as
        // they were, and the deep message stays shared.
        let shard = compacting.shard(&thread);
        let t = &shard.threads[&thread];
        assert_eq!(t.segments[0].events, 1);
        assert!(t.segments.iter().skip(1).all(|s| s.events == 0));
        assert_eq!(t.event_chunks().len(), 5);
        assert_eq!(t.message_chunks().len(), 2);
    }

    /// A failed commit of another run's events takes back the run marker it wrote: the
    /// other run's next events are still told apart.
    #[test]
    fn a_failed_commit_takes_back_its_run_marker() {
        use awaken_event::AgentEvent;
        let store = MemoryStore::new();
        let with_step = |run: &str, step| {
            let mut c = commit("t1", run, 0);
            c.events = vec![AgentEvent::StepStart { step }];
            c
        };
        store.write(&mut with_step("r1", 1)).expect("written");
        store.arm_failpoint(FailPoint::AfterEvents);
        store.write(&mut with_step("r2", 7)).expect_err("injected");
        store.write(&mut with_step("r2", 8)).expect("written");
        store.write(&mut with_step("r1", 2)).expect("written");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let events = rt
            .block_on(store.load_events(&ThreadId::new("t1").expect("id"), 0))
            .expect("events");
        let read: Vec<(u64, &str)> = events.iter().map(|e| (e.seq, e.run_id.as_str())).collect();
        assert_eq!(read, [(1, "r1"), (2, "r2"), (3, "r1")]);
    }

    /// A run's later commits carrying its record's own shared strings write only what moves on
    /// (the stored strings are kept, no count moves); one that fails puts the record back as
    /// it was, and a commit with other strings replaces the record whole.
    #[test]
    fn a_runs_record_is_written_in_place_and_put_back_on_failure() {
        use awaken_event::TerminationReason;
        let store = MemoryStore::new();
        let mut c = commit("t1", "r1", 0);
        c.run.spec_digest = Arc::from("digest-1");
        store.write(&mut c).expect("written");
        let stored = |store: &MemoryStore| {
            let shard = store.shard(&ThreadId::new("t1").expect("id"));
            let slot = shard.runs.get(&RunId::new("r1").expect("id"));
            match slot {
                Some(RunSlot::Live(row)) => row.record.clone(),
                _ => panic!("a live row"),
            }
        };
        let first = stored(&store);
        // The same record, moved on: written in place.
        c.run.steps = 2;
        c.run.updated_at = Timestamp::from_unix_millis(20);
        store.write(&mut c).expect("written");
        let second = stored(&store);
        assert_eq!((second.steps, second.updated_at), (2, c.run.updated_at));
        assert!(Arc::ptr_eq(&second.agent_id, &first.agent_id));
        assert!(Arc::ptr_eq(&second.spec_digest, &c.run.spec_digest));
        // A failure after the row was written puts back every field it moved.
        for point in [FailPoint::AfterRun, FailPoint::AfterEvents] {
            let mut failing = c.clone();
            failing.run.steps = 3;
            failing.run.usage.input_tokens = 9;
            failing.run.updated_at = Timestamp::from_unix_millis(30);
            failing.run.status = RunStatus::Done;
            failing.run.termination = Some(TerminationReason::NaturalEnd);
            store.arm_failpoint(point);
            store.write(&mut failing).expect_err("injected");
            assert_eq!(stored(&store), second, "{point:?}");
        }
        // Other strings (an equal digest, not the same one): the record is replaced whole, and
        // put back whole on failure.
        let mut other = c.clone();
        other.run.spec_digest = Arc::from("digest-1");
        other.run.agent_id = Arc::from("agent-2");
        other.run.steps = 4;
        store.arm_failpoint(FailPoint::AfterRun);
        store.write(&mut other).expect_err("injected");
        assert_eq!(stored(&store), second);
        assert!(Arc::ptr_eq(&stored(&store).agent_id, &first.agent_id));
        store.write(&mut other).expect("written");
        let third = stored(&store);
        assert_eq!((&*third.agent_id, third.steps), ("agent-2", 4));
        assert_eq!(
            third.created_at, first.created_at,
            "the creation time is kept"
        );
    }

    /// The record's own shared strings: only what moves on is written (the undo keeps those
    /// fields); an equal string in another allocation: the record is replaced whole.
    #[test]
    fn a_record_with_the_stored_strings_is_written_in_place() {
        use awaken_event::TerminationReason;
        let mut stored = commit("t1", "r1", 0).run;
        let mut next = stored.clone();
        next.steps = 5;
        next.status = RunStatus::Done;
        next.termination = Some(TerminationReason::NaturalEnd);
        next.updated_at = Timestamp::from_unix_millis(50);
        next.created_at = Timestamp::from_unix_millis(1);
        let undo = write_record(&mut stored, &next);
        assert!(
            matches!(undo, RecordUndo::Progress { steps: 0, .. }),
            "{undo:?}"
        );
        assert_eq!(
            stored,
            RunRecord {
                created_at: Timestamp::from_unix_millis(10),
                ..next.clone()
            }
        );
        let mut other = next.clone();
        other.agent_id = Arc::from(&*next.agent_id);
        let undo = write_record(&mut stored, &other);
        assert!(matches!(undo, RecordUndo::Whole(_)), "{undo:?}");
        assert!(Arc::ptr_eq(&stored.agent_id, &other.agent_id));
    }

    /// A finished run's spec digest is a place in the store's table, each digest once; past
    /// the table's room a row keeps its digest, and every row reads back its own.
    #[test]
    fn finished_runs_share_their_digests() {
        let store = MemoryStore::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let digest = |i: usize| -> Arc<str> { format!("sha256:{i:064x}").into() };
        for i in 0..=DIGESTS_KEPT {
            for run in [format!("a{i}"), format!("b{i}")] {
                let mut c = commit(&format!("t{i}"), &run, 0);
                c.run.spec_digest = digest(i);
                c.run.status = RunStatus::Done;
                c.run.termination = Some(awaken_event::TerminationReason::NaturalEnd);
                store.write(&mut c).expect("written");
            }
        }
        assert_eq!(lock(&store.digests.0).all.len(), DIGESTS_KEPT);
        for i in [0, DIGESTS_KEPT - 1, DIGESTS_KEPT] {
            let thread = ThreadId::new(format!("t{i}")).expect("id");
            let runs = rt.block_on(store.list_runs(&thread)).expect("runs");
            assert_eq!(runs.len(), 2);
            assert!(runs.iter().all(|r| r.spec_digest == digest(i)), "{i}");
        }
    }

    /// A finished run's row is kept written out; damaged, every read of it is a typed error
    /// (never a panic), and a commit to it is refused with nothing changed.
    #[test]
    fn a_finished_runs_row_is_written_out_and_damage_is_an_error() {
        let store = MemoryStore::new();
        store.write(&mut commit("t1", "r1", 0)).expect("written");
        let mut done = commit("t1", "r1", 0);
        done.run.status = RunStatus::Done;
        done.run.termination = Some(awaken_event::TerminationReason::NaturalEnd);
        store.write(&mut done.clone()).expect("written");
        let run = RunId::new("r1").expect("id");
        let thread = ThreadId::new("t1").expect("id");
        let is_done = || matches!(store.shard(&thread).runs.get(&run), Some(RunSlot::Done(_)));
        assert!(is_done(), "the finished run's row is not written out");
        // A refused commit leaves it written out.
        let mut refused = done.clone();
        refused.expected_message_count = 5;
        assert!(matches!(
            store.write(&mut refused),
            Err(StoreError::VersionConflict { .. })
        ));
        assert!(is_done(), "a refused commit left the row read back");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let corrupt = |e: &StoreError| matches!(e, StoreError::Corrupt { what: "run", .. });
        let damage = |cut: &dyn Fn(&mut Box<[u8]>)| {
            let mut shard = store.shard(&thread);
            if let Some(RunSlot::Done(bytes)) = shard.runs.get_mut(&run) {
                cut(bytes);
            }
        };
        // A byte after its state's last entry.
        damage(&|bytes| *bytes = [&bytes[..], &[0]].concat().into());
        let loaded = rt.block_on(store.load_checkpoint(&thread));
        assert!(loaded.as_ref().is_err_and(corrupt), "{loaded:?}");
        // Cut in the middle.
        damage(&|bytes| *bytes = bytes[..bytes.len() / 2].into());
        let loaded = rt.block_on(store.load_checkpoint(&thread));
        assert!(loaded.as_ref().is_err_and(corrupt), "{loaded:?}");
        let listed = rt.block_on(store.list_runs(&thread));
        assert!(listed.as_ref().is_err_and(corrupt), "{listed:?}");
        let written = store.write(&mut done);
        assert!(written.as_ref().is_err_and(corrupt), "{written:?}");
        assert!(matches!(
            store.shard(&thread).runs.get(&run),
            Some(RunSlot::Done(_))
        ));
    }
}
