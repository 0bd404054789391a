use std::sync::Arc;

use awaken_event::{RunId, ThreadId};

use super::archive::DIGESTS_KEPT;
use super::runs::RunSlot;
use super::undo::{RecordUndo, write_record};
use super::*;
use crate::commit::RunStatus;
use crate::failpoint::FailPoint;

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
    let shard = store.tables.shard(&thread);
    (
        shard.threads.contains_key(&thread),
        shard.runs.contains_key(&run),
        store.tables.run_index(&run).contains_key(&run),
    )
}

#[test]
fn a_refused_commit_of_a_new_thread_or_run_inserts_nothing() {
    let store = MemoryStore::new();
    // A message guard the new thread does not meet.
    assert!(matches!(
        store.write(&commit("t1", "r1", 3)),
        Err(CommitError::VersionConflict { .. })
    ));
    assert_eq!(holds(&store, "t1", "r1"), (false, false, false));
    // A run already on another thread.
    store.write(&commit("t2", "r2", 0)).expect("written");
    assert_eq!(holds(&store, "t2", "r2"), (true, true, true));
    assert!(matches!(
        store.write(&commit("t3", "r2", 0)),
        Err(CommitError::RunOnOtherThread { .. })
    ));
    assert!(!holds(&store, "t3", "r2").0);
    // A new run on a stored thread, refused by its guard.
    assert!(matches!(
        store.write(&commit("t2", "r4", 5)),
        Err(CommitError::VersionConflict { .. })
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
        compacting.write(&c).expect("written");
        shared.write(&c).expect("written");
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
    let shard = compacting.tables.shard(&thread);
    let t = &shard.threads[&thread];
    assert_eq!(t.segments[0].events, 1);
    assert!(t.segments.iter().skip(1).all(|s| s.events == 0));
    assert_eq!(t.event_chunks().len(), 5);
    assert_eq!(t.message_chunks().len(), 2);
}

/// A failed commit of another run's events takes back the run marker it wrote: the
/// other run's next events are still told apart. (The store no longer interleaves two runs'
/// commits in one open segment, since one run at a time holds a thread and a run's end closes
/// the segment; the log itself still must.)
#[test]
fn a_failed_commit_takes_back_its_run_marker() {
    use awaken_event::AgentEvent;

    use super::archive::Open;
    let id = |s: &str| RunId::new(s).expect("id");
    let step = |step| [AgentEvent::StepStart { step }];
    let mut open = Open::default();
    assert!(open.append_events(1, &id("r1"), &step(1)));
    let mark = open.mark();
    assert!(open.append_events(2, &id("r2"), &step(7)));
    open.reset(&mark);
    assert!(open.append_events(2, &id("r2"), &step(8)));
    assert!(open.append_events(3, &id("r1"), &step(2)));
    let mut events = Vec::new();
    open.segment(false, 1)
        .expect("a segment")
        .read_events(0, &mut events)
        .expect("events");
    let read: Vec<(u64, &str, &AgentEvent)> = events
        .iter()
        .map(|e| (e.seq, e.run_id.as_str(), &e.event))
        .collect();
    assert_eq!(
        read,
        [
            (1, "r1", &step(1)[0]),
            (2, "r2", &step(8)[0]),
            (3, "r1", &step(2)[0])
        ]
    );
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
    store.write(&c).expect("written");
    let stored = |store: &MemoryStore| {
        let shard = store.tables.shard(&ThreadId::new("t1").expect("id"));
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
    store.write(&c).expect("written");
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
        store.write(&failing).expect_err("injected");
        assert_eq!(stored(&store), second, "{point:?}");
    }
    // Other strings (an equal digest, not the same one): the record is replaced whole, and
    // put back whole on failure.
    let mut other = c.clone();
    other.run.spec_digest = Arc::from("digest-1");
    other.run.agent_id = Arc::from("agent-2");
    other.run.steps = 4;
    store.arm_failpoint(FailPoint::AfterRun);
    store.write(&other).expect_err("injected");
    assert_eq!(stored(&store), second);
    assert!(Arc::ptr_eq(&stored(&store).agent_id, &first.agent_id));
    store.write(&other).expect("written");
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
            store.write(&c).expect("written");
        }
    }
    assert_eq!(store.tables.digests.len(), DIGESTS_KEPT);
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
    store.write(&commit("t1", "r1", 0)).expect("written");
    let mut done = commit("t1", "r1", 0);
    done.run.status = RunStatus::Done;
    done.run.termination = Some(awaken_event::TerminationReason::NaturalEnd);
    store.write(&done).expect("written");
    let run = RunId::new("r1").expect("id");
    let thread = ThreadId::new("t1").expect("id");
    let is_done = || {
        matches!(
            store.tables.shard(&thread).runs.get(&run),
            Some(RunSlot::Done(_))
        )
    };
    assert!(is_done(), "the finished run's row is not written out");
    // A refused commit leaves it written out.
    let mut refused = done.clone();
    refused.expected_message_count = 5;
    assert!(matches!(
        store.write(&refused),
        Err(CommitError::VersionConflict { .. })
    ));
    assert!(is_done(), "a refused commit left the row read back");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let corrupt = |e: &StoreError| matches!(e, StoreError::Corrupt { what: "run", .. });
    let damage = |cut: &dyn Fn(&mut Box<[u8]>)| {
        let mut shard = store.tables.shard(&thread);
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
    let written = store.write(&done);
    assert!(
        matches!(&written, Err(CommitError::Backend(e)) if corrupt(e)),
        "{written:?}"
    );
    assert!(matches!(
        store.tables.shard(&thread).runs.get(&run),
        Some(RunSlot::Done(_))
    ));
}
