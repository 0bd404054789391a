//! The memory store's compact form (`awaken_store::fuzzing`, feature `fuzzing`).
//!
//! - Arbitrary bytes read as a segment or as a finished run's row: a typed error, or values
//!   that, written again, read back equal.
//! - Arbitrary commits (events of several runs, messages, values nested past the limits, some
//!   rolled back) written as the store writes them: read back, the segment holds exactly the
//!   commits that were written and not rolled back, each value as its JSON form reads back.
//! - Arbitrary finished run rows: read back equal, or refused whole.

#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use awaken_event::{AgentEvent, Message, RunId, ThreadId};
use awaken_fuzz::{Event, Id, Json, Msg, Termination, Text, Usage};
use awaken_store::fuzzing::{CompactLog, RunDigests, RunRow, read_run, read_segment, write_run};
use awaken_store::{RunRecord, RunStatus, Timestamp};
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;

#[derive(Debug, Arbitrary)]
enum Input<'a> {
    Segment { messages_at: u16, bytes: &'a [u8] },
    RunRow { run: Id, bytes: &'a [u8] },
    Commits(Vec<Op>),
    Row(Row),
}

#[derive(Debug, Arbitrary)]
enum Op {
    Commit {
        run: Id,
        events: Vec<Event>,
        messages: Vec<Msg>,
    },
    Mark,
    /// Back to the last mark.
    Reset,
}

#[derive(Debug, Arbitrary)]
struct Row {
    thread: Id,
    run: Id,
    parent: Option<Id>,
    agent: Text,
    profile: Option<Id>,
    termination: Option<Termination>,
    steps: u32,
    usage: Usage,
    digest: Text,
    created: i64,
    updated: i64,
    state_revision: u64,
    lease_epoch: u64,
    state: Vec<(Text, Json)>,
}

fuzz_target!(|input: Input<'_>| match input {
    Input::Segment { messages_at, bytes } => damaged_segment(bytes, usize::from(messages_at)),
    Input::RunRow { run, bytes } => damaged_row(bytes, &run.run()),
    Input::Commits(ops) => commits(&ops),
    Input::Row(row) => row_round_trip(&row),
});

/// Bytes that read as a segment hold values that are written and read back alike.
fn damaged_segment(bytes: &[u8], messages_at: usize) {
    let Ok((events, messages)) = read_segment(bytes, messages_at) else {
        return;
    };
    let mut log = CompactLog::new();
    let mut written = Vec::new();
    for (run, event) in &events {
        if log.append_events(1, run, std::slice::from_ref(event)) {
            written.push((run.clone(), event.clone()));
        }
    }
    let messages_written = log.append_messages(&messages);
    let Some(read) = log.read_back() else {
        assert!(written.is_empty() && (messages.is_empty() || !messages_written));
        return;
    };
    let (read_messages, read_events) = read.expect("what was written reads back");
    let read_events: Vec<(RunId, AgentEvent)> = read_events
        .into_iter()
        .map(|e| (e.run_id, e.event))
        .collect();
    assert_eq!(read_events, written);
    if messages_written {
        assert_eq!(read_messages, messages);
    } else {
        assert!(read_messages.is_empty());
    }
}

/// Bytes that read as a run's row hold a row that is written and read back alike.
fn damaged_row(bytes: &[u8], run_id: &RunId) {
    let digests = RunDigests::new();
    let Ok(row) = read_run(bytes, run_id, &digests) else {
        return;
    };
    let Some(again) = write_run(&row, &digests) else {
        return;
    };
    let back = read_run(&again, run_id, &digests).expect("a written row reads back");
    assert_eq!(back, row);
}

/// The commits written (and not rolled back) read back as their JSON forms read back.
fn commits(ops: &[Op]) {
    let mut log = CompactLog::new();
    let mut marks = Vec::new();
    // What the log holds: (run, event) and messages, with the length of each at every mark.
    let (mut events, mut messages) = (Vec::new(), Vec::new());
    let mut seq = 1;
    for op in ops {
        match op {
            Op::Commit {
                run,
                events: new_events,
                messages: new_messages,
            } => {
                let run = run.run();
                let new_events: Vec<AgentEvent> = new_events.iter().map(Event::get).collect();
                let new_messages: Vec<Message> = new_messages.iter().map(Msg::get).collect();
                if !new_events.is_empty() && log.append_events(seq, &run, &new_events) {
                    seq += new_events.len() as u64;
                    events.extend(new_events.iter().map(|e| (run.clone(), e.clone())));
                }
                if !new_messages.is_empty() && log.append_messages(&new_messages) {
                    messages.extend(new_messages);
                }
            }
            Op::Mark => marks.push((log.mark(), events.len(), messages.len(), seq)),
            Op::Reset => {
                if let Some((mark, e, m, s)) = marks.pop() {
                    log.reset(&mark);
                    events.truncate(e);
                    messages.truncate(m);
                    seq = s;
                }
            }
        }
    }
    let Some(read) = log.read_back() else {
        assert!(events.is_empty() && messages.is_empty());
        return;
    };
    let (read_messages, read_events) = read.expect("what was written reads back");
    let expected_events: Vec<(RunId, AgentEvent)> = events
        .iter()
        .map(|(run, e)| (run.clone(), as_stored(e)))
        .collect();
    let read_events: Vec<(RunId, AgentEvent)> = read_events
        .into_iter()
        .map(|e| (e.run_id, e.event))
        .collect();
    assert_eq!(read_events, expected_events);
    let expected_messages: Vec<Message> = messages.iter().map(as_stored).collect();
    assert_eq!(read_messages, expected_messages);
}

/// A finished run's row reads back as written (its state's values as JSON text reads back).
fn row_round_trip(row: &Row) {
    let thread_id: ThreadId = row.thread.thread();
    let mut record = RunRecord::new(
        row.run.run(),
        row.agent.get(),
        Timestamp::from_unix_millis(row.created),
    );
    record.parent_run_id = row.parent.as_ref().map(Id::run);
    record.profile_id = row.profile.as_ref().map(Id::profile);
    record.status = RunStatus::Done;
    record.termination = row.termination.as_ref().map(Termination::get);
    record.steps = row.steps;
    record.usage = row.usage.get();
    record.spec_digest = row.digest.get().into();
    record.updated_at = Timestamp::from_unix_millis(row.updated);
    let state: BTreeMap<String, serde_json::Value> =
        row.state.iter().map(|(k, v)| (k.get(), v.get())).collect();
    let written = RunRow {
        thread_id,
        record,
        state_revision: row.state_revision,
        lease_epoch: row.lease_epoch,
        state,
    };
    let digests = RunDigests::new();
    let Some(bytes) = write_run(&written, &digests) else {
        assert!(
            written.state.values().any(|v| depth(v) > MAX_TEXT_DEPTH),
            "a row without a value nested past {MAX_TEXT_DEPTH} was refused"
        );
        return;
    };
    assert!(
        written.state.values().all(|v| depth(v) <= MAX_TEXT_DEPTH),
        "a value nested past {MAX_TEXT_DEPTH} was written as text"
    );
    let back =
        read_run(&bytes, &written.record.run_id, &digests).expect("a written row reads back");
    let mut expected = written;
    expected.record.termination = expected.record.termination.as_ref().map(as_stored);
    assert_eq!(back, expected);
}

/// How deep JSON text the compact form keeps as text may nest.
const MAX_TEXT_DEPTH: usize = 100;

/// How deep `v` nests arrays and objects.
fn depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        serde_json::Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// `value` as the store gives it back: its JSON form read back (a kind kept as JSON text
/// reads back as a durable store reads it); itself when that JSON nests too deep to read back
/// (a kind with a form of its own, the only kind such a value is written in).
fn as_stored<T: Serialize + DeserializeOwned + Clone>(value: &T) -> T {
    let text = serde_json::to_string(value).expect("serializes");
    serde_json::from_str(&text).unwrap_or_else(|_| value.clone())
}
