//! One thread of the memory store: its row, its state, and its log of messages and events.
//! The log holds the segments archived when runs on the thread were done, the messages and
//! events written since (in the archive's form as the commits bring them), and what could not
//! be written so (kept as the commits carried it).

use std::sync::Arc;

use awaken_event::{AgentEvent, Message, RunId};

use crate::commit::Timestamp;
use crate::error::StoreError;
use crate::store::StoredEvent;

use super::archive::{Open, OpenMark, Segment, Segments};
use super::maps::StateMap;

/// Everything of one thread, found with one lookup per commit.
#[derive(Debug, Default)]
pub(super) struct ThreadData {
    /// `None` only while the thread's first commit is being applied (a thread exists once a
    /// commit to it succeeded).
    pub(super) row: Option<ThreadRow>,
    /// The messages and events of the runs done on it, in [`crate::compact`]'s form: a
    /// segment each time a run was done and the thread held messages or events written since
    /// (see [`ThreadData::compact`]), oldest first. A segment is never written again: the cost
    /// of a run's end does not grow with the thread.
    pub(super) segments: Segments,
    /// How many messages the thread has, its segments' too.
    pub(super) message_count: usize,
    /// The messages and events since (boxed, and `None` when there are none: a finished
    /// thread keeps a pointer, not the buffers and table a run writes them with).
    recent: Option<Box<Recent>>,
    /// Values as the commits carried them (typed until a load asks for JSON); boxed, made at
    /// the first write (most threads have no thread-scoped state).
    pub(super) state: Option<Box<StateMap>>,
}

/// A thread's row: what a listing shows of it, and the run that wrote it last.
#[derive(Debug, Clone)]
pub(super) struct ThreadRow {
    pub(super) state_revision: u64,
    pub(super) latest_run_id: RunId,
    pub(super) created_at: Timestamp,
    pub(super) updated_at: Timestamp,
}

/// A thread's messages and events since its last compact segment.
#[derive(Debug, Default)]
pub(super) struct Recent {
    /// The messages and events, written as the commits bring them (with compaction on).
    open: Open,
    /// The messages kept as the commits carried them: all of them without compaction; with
    /// it, from the first that could not be written on (they follow `open`'s).
    messages: MessageLog,
    /// The same of the events.
    events: EventLog,
}

/// Where a thread's messages and events stood before a commit (put back if it fails).
#[derive(Debug, Clone, Copy)]
pub(super) struct LogMark {
    message_count: usize,
    message_chunks: usize,
    event_chunks: usize,
    open: OpenMark,
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

/// A thread's messages as a read takes them under the lock: shared parts, decoded after the
/// lock is released.
pub(super) struct MessageParts {
    segments: Vec<Segment>,
    chunks: Vec<Arc<[Message]>>,
    len: usize,
}

impl MessageParts {
    /// Every message, in order.
    pub(super) fn decode(self) -> Result<Vec<Message>, StoreError> {
        let mut out = Vec::with_capacity(self.len);
        for segment in &self.segments {
            segment.read_messages(&mut out)?;
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
pub(super) struct EventChunk {
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
pub(super) struct EventParts {
    since: u64,
    segments: Vec<Segment>,
    chunks: Vec<EventChunk>,
}

impl EventParts {
    /// The events with a sequence number above `since`, in order.
    pub(super) fn decode(self) -> Result<Vec<StoredEvent>, StoreError> {
        let since = self.since;
        let mut out = Vec::new();
        for segment in &self.segments {
            segment.read_events(since, &mut out)?;
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

/// What a compaction took out of a thread, dropped after the locks are released.
pub(super) type Compacted = Option<Box<Recent>>;

impl ThreadData {
    /// The message chunks kept as the commits carried them.
    pub(super) fn message_chunks(&self) -> &[Arc<[Message]>] {
        self.recent.as_ref().map_or(&[], |r| &r.messages.chunks)
    }

    /// The event chunks kept as the commits carried them.
    pub(super) fn event_chunks(&self) -> &[EventChunk] {
        self.recent.as_ref().map_or(&[], |r| &r.events.chunks)
    }

    /// The sequence number of the thread's last event (0: none).
    pub(super) fn last_event_seq(&self) -> u64 {
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
    pub(super) fn append(
        &mut self,
        run_id: &RunId,
        messages: &[Message],
        events: &[AgentEvent],
        write: bool,
    ) {
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
    pub(super) fn log_mark(&self) -> LogMark {
        let (open, message_chunks, event_chunks) = match &self.recent {
            Some(r) => (
                r.open.mark(),
                r.messages.chunks.len(),
                r.events.chunks.len(),
            ),
            None => (OpenMark::default(), 0, 0),
        };
        LogMark {
            message_count: self.message_count,
            message_chunks,
            event_chunks,
            open,
        }
    }

    /// Puts the thread's messages and events back where `mark` found them (a rolled-back
    /// commit's).
    pub(super) fn reset_log(&mut self, mark: &LogMark) {
        self.message_count = mark.message_count;
        if let Some(recent) = &mut self.recent {
            recent.messages.chunks.truncate(mark.message_chunks);
            recent.events.chunks.truncate(mark.event_chunks);
            recent.open.reset(&mark.open);
        }
    }

    /// Every message, shared (see [`MessageParts`]); the ones written since the last segment
    /// copied.
    pub(super) fn message_parts(&self) -> MessageParts {
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
    pub(super) fn events_since(&self, since: u64) -> EventParts {
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
    pub(super) fn compact(&mut self) -> Compacted {
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
