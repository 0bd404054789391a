//! The conformance suite: one set of behaviours every [`ThreadStore`] must show. Each function
//! takes a fresh [`Harness`]; `backends.rs` instantiates every function for every backend.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use awaken_event::{
    AgentEvent, Message, ProfileId, ResumeMode, RunId, SuspendTicket, TerminationReason, ThreadId,
    TokenUsage, ToolCall, ToolCallId, ToolCallState, ToolResult,
};
use awaken_state::PersistedState;
use awaken_store::{
    BatchWrite, CommitError, CommitViolation, FailPoint, LeaseError, LeaseToken, NewLease,
    RunRecord, RunStatus, StoreError, ThreadCommit, ThreadStore, Timestamp,
};
use awaken_tool::{ToolBatch, pending_call};
use serde_json::{Value, json};

/// A store under test and the way to inject a fault inside its next commit.
pub struct Harness {
    pub store: Box<dyn ThreadStore>,
    pub arm: Box<dyn Fn(FailPoint) + Send + Sync>,
    /// Keeps a backend's resources (a temporary directory) alive.
    pub _guard: Option<Box<dyn std::any::Any + Send + Sync>>,
}

pub fn tid(s: &str) -> ThreadId {
    ThreadId::new(s).expect("test thread id")
}

pub fn rid(s: &str) -> RunId {
    RunId::new(s).expect("test run id")
}

pub fn pid(s: &str) -> ProfileId {
    ProfileId::new(s).expect("test profile id")
}

pub fn at(ms: i64) -> Timestamp {
    Timestamp::from_unix_millis(ms)
}

pub fn run(id: &str, now: i64) -> RunRecord {
    let mut run = RunRecord::new(rid(id), "assistant", at(now));
    run.spec_digest = "sha256:spec".into();
    run
}

pub fn state(revision: u64, pairs: &[(&str, Value)]) -> PersistedState {
    PersistedState {
        revision,
        values: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect(),
    }
}

/// A tool batch of `search` calls, each moved from `Requested` to the state named (by its
/// serde name) through the batch's own transitions.
pub fn batch(calls: &[(&str, &str)]) -> ToolBatch {
    let call_id = |id: &str| ToolCallId::new(id).expect("test call id");
    let mut batch = ToolBatch::new(
        calls
            .iter()
            .map(|(id, _)| ToolCall::new(call_id(id), "search", json!({ "q": "x" }))),
    )
    .expect("distinct call ids");
    for (id, state) in calls {
        let id = call_id(id);
        let to: ToolCallState = serde_json::from_value(json!(state)).expect("a call state");
        let moved = match to {
            ToolCallState::Requested => Ok(()),
            ToolCallState::Suspended => {
                let call = batch.get(&id).expect("in the batch").call().clone();
                batch.suspend(
                    &id,
                    SuspendTicket {
                        suspension_id: format!("{id}:0"),
                        call: pending_call(&call),
                        message: "go on?".into(),
                        response_schema: None,
                        resume_mode: ResumeMode::Replay,
                    },
                )
            }
            ToolCallState::Blocked | ToolCallState::ShortCircuited | ToolCallState::Cancelled => {
                batch.transition(&id, to, Some(ToolResult::error("not run")))
            }
            ToolCallState::Executing => batch.start(&id),
            // `Succeeded`, `Failed`, `OutcomeUnknown`: closed after running.
            _ => batch
                .start(&id)
                .and_then(|()| batch.transition(&id, to, Some(ToolResult::success(json!("ok"))))),
        };
        moved.unwrap_or_else(|e| panic!("{id} to {state}: {e}"));
    }
    batch
}

/// One step of `run_id` on `thread`: two messages, three changed keys, a one-call batch and
/// three lifecycle events (the bench's shape).
pub fn step(thread: &str, run_id: &str, expected: u64, step_no: u32, now: i64) -> ThreadCommit {
    let mut record = run(run_id, now - i64::from(step_no));
    record.updated_at = at(now);
    record.steps = step_no;
    record.usage = TokenUsage {
        input_tokens: 10 * u64::from(step_no),
        output_tokens: u64::from(step_no),
        ..TokenUsage::default()
    };
    ThreadCommit::new(tid(thread), record, expected)
        .with_messages([
            Message::user(format!("question {step_no}")),
            Message::assistant(format!("answer {step_no}")),
        ])
        .with_run_state(state(
            u64::from(step_no),
            &[
                ("loop.round", json!(step_no)),
                ("loop.scratch", json!({"n": step_no})),
            ],
        ))
        .with_thread_state(state(
            u64::from(step_no),
            &[("memory.notes", json!([step_no]))],
        ))
        .with_batch(batch(&[(&format!("call-{step_no}"), "succeeded")]))
        .with_events([
            AgentEvent::StepStart { step: step_no },
            AgentEvent::InferenceComplete {
                model: "scripted".into(),
                usage: TokenUsage::default(),
                duration_ms: 1,
                stop_reason: awaken_event::StopReason::ToolCalls,
            },
            AgentEvent::StepEnd { step: step_no },
        ])
}

/// Everything the store holds about `thread` (and the profile of its latest run), as text.
pub async fn dump(store: &dyn ThreadStore, thread: &str) -> String {
    let thread = tid(thread);
    let mut out = String::new();
    let Some(cp) = store
        .load_checkpoint(&thread)
        .await
        .expect("load_checkpoint")
    else {
        return "no thread\n".to_owned();
    };
    for (i, m) in cp.messages.iter().enumerate() {
        let _ = writeln!(out, "message {i} {:?}: {}", m.role, m.text());
    }
    let _ = writeln!(
        out,
        "thread state r{}: {}",
        cp.thread_state.revision,
        json!(cp.thread_state.values)
    );
    if let Some(run) = &cp.run {
        let _ = writeln!(
            out,
            "run {} {} steps={} termination={} usage={}/{} created={} updated={} parent={:?} profile={:?}",
            run.run_id,
            run.status,
            run.steps,
            run.termination
                .as_ref()
                .map_or("none".to_owned(), |t| t.to_string()),
            run.usage.input_tokens,
            run.usage.output_tokens,
            run.created_at,
            run.updated_at,
            run.parent_run_id.as_ref().map(RunId::as_str),
            run.profile_id.as_ref().map(ProfileId::as_str),
        );
    }
    let _ = writeln!(
        out,
        "run state r{}: {}",
        cp.run_state.revision,
        json!(cp.run_state.values)
    );
    if let Some(profile) = &cp.profile {
        for (k, e) in &profile.keys {
            let _ = writeln!(out, "profile {k} v{} = {}", e.version, e.value);
        }
    }
    if let Some(batch) = &cp.batch {
        let states: Vec<String> = batch
            .calls()
            .iter()
            .map(|c| format!("{}:{}", json!(c.id()), json!(c.state())))
            .collect();
        let _ = writeln!(out, "batch {}", states.join(" "));
    }
    let events = store.load_events(&thread, 0).await.expect("load_events");
    let _ = writeln!(out, "events {} (last {})", events.len(), cp.last_event_seq);
    for e in events {
        let _ = writeln!(out, "event {} {} {}", e.seq, e.run_id, e.event.type_name());
    }
    for r in store.list_runs(&thread).await.expect("list_runs") {
        let _ = writeln!(out, "listed run {} {}", r.run_id, r.status);
    }
    out
}

/// Everything in the store: every listed thread's dump.
pub async fn dump_all(store: &dyn ThreadStore) -> String {
    let mut out = String::new();
    for t in store.list_threads().await.expect("list_threads") {
        let _ = writeln!(
            out,
            "== {} messages={} latest={:?} created={} updated={}",
            t.thread_id,
            t.message_count,
            t.latest_run_id.as_ref().map(RunId::as_str),
            t.created_at,
            t.updated_at
        );
        out.push_str(&dump(store, t.thread_id.as_str()).await);
    }
    out
}

fn check(actual: &str, expected: expect_test::Expect) {
    expected.assert_eq(actual);
}

// ---------------------------------------------------------------------------------------------

pub async fn round_trip(h: &Harness) {
    let s = &*h.store;
    assert!(s.load_checkpoint(&tid("t1")).await.expect("load").is_none());
    let receipt = s
        .commit(&step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("commit 1");
    assert_eq!((receipt.message_count, receipt.last_event_seq), (2, 3));
    let receipt = s
        .commit(&step("t1", "r1", 2, 2, 2_000))
        .await
        .expect("commit 2");
    assert_eq!((receipt.message_count, receipt.last_event_seq), (4, 6));
    check(
        &dump_all(s).await,
        expect_test::expect![[r#"
            == t1 messages=4 latest=Some("r1") created=1000ms updated=2000ms
            message 0 User: question 1
            message 1 Assistant: answer 1
            message 2 User: question 2
            message 3 Assistant: answer 2
            thread state r2: {"memory.notes":[2]}
            run r1 running steps=2 termination=none usage=20/2 created=999ms updated=2000ms parent=None profile=None
            run state r2: {"loop.round":2,"loop.scratch":{"n":2}}
            batch "call-2":"succeeded"
            events 6 (last 6)
            event 1 r1 step_start
            event 2 r1 inference_complete
            event 3 r1 step_end
            event 4 r1 step_start
            event 5 r1 inference_complete
            event 6 r1 step_end
            listed run r1 running
        "#]],
    );
}

pub async fn message_guard_conflict(h: &Harness) {
    let s = &*h.store;
    s.commit(&step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("commit");
    let before = dump_all(s).await;
    for stale in [0, 1, 3] {
        let err = s
            .commit(&step("t1", "r1", stale, 2, 2_000))
            .await
            .expect_err("stale guard");
        assert!(
            matches!(err, CommitError::VersionConflict { expected, actual: 2 } if expected == stale),
            "{err:?}"
        );
        assert!(err.is_conflict());
    }
    assert_eq!(
        dump_all(s).await,
        before,
        "a conflicting commit wrote something"
    );
    // The guard holds without new messages too.
    let bare = ThreadCommit::new(tid("t1"), run("r1", 1_500), 1);
    assert!(matches!(
        s.commit(&bare).await,
        Err(CommitError::VersionConflict {
            expected: 1,
            actual: 2
        })
    ));
    let bare = ThreadCommit::new(tid("t1"), run("r1", 1_500), 2);
    s.commit(&bare).await.expect("a commit without messages");
    // A thread that does not exist holds no messages, and is not created by the refusal.
    let before = dump_all(s).await;
    let err = s
        .commit(&step("t2", "r2", 2, 2, 2_000))
        .await
        .expect_err("a thread that does not exist");
    assert!(
        matches!(
            err,
            CommitError::VersionConflict {
                expected: 2,
                actual: 0
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        dump_all(s).await,
        before,
        "the refused commit wrote something"
    );
}

pub async fn concurrent_writers_one_wins(h: &Harness) {
    let s = &*h.store;
    s.commit(&step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("commit");
    let (first, second) = (step("t1", "r1", 2, 2, 2_000), step("t1", "r1", 2, 3, 3_000));
    let (a, b) = tokio::join!(s.commit(&first), s.commit(&second));
    let wins = [a.is_ok(), b.is_ok()];
    assert_eq!(wins.iter().filter(|w| **w).count(), 1, "{a:?} {b:?}");
    let loser = if a.is_ok() { b } else { a };
    assert!(matches!(
        loser,
        Err(CommitError::VersionConflict {
            expected: 2,
            actual: 4
        })
    ));
    let cp = s
        .load_checkpoint(&tid("t1"))
        .await
        .expect("load")
        .expect("thread");
    assert_eq!(cp.messages.len(), 4);
    assert_eq!(s.load_events(&tid("t1"), 0).await.expect("events").len(), 6);
}

/// A run id lives on one thread: a commit of it on another thread is `RunOnOtherThread` and
/// writes nothing, also when two first commits of one new run race on two threads (exactly one
/// wins; the check cannot lock a run that does not exist yet, so the write itself must refuse).
pub async fn a_run_belongs_to_one_thread(h: &Harness) {
    let s = &*h.store;
    s.commit(&step("ta", "r1", 0, 1, 1_000))
        .await
        .expect("first commit");
    let err = s
        .commit(&step("tb", "r1", 0, 1, 2_000))
        .await
        .expect_err("the run is on ta");
    assert!(
        matches!(&err, CommitError::RunOnOtherThread { stored_thread_id, .. } if stored_thread_id.as_str() == "ta"),
        "{err:?}"
    );
    assert!(
        s.load_checkpoint(&tid("tb")).await.expect("load").is_none(),
        "nothing written for tb"
    );

    let handle = tokio::runtime::Handle::current();
    for i in 0..20 {
        let (run, x, y) = (format!("race-{i}"), format!("x{i}"), format!("y{i}"));
        let (a, b) = tokio::task::block_in_place(|| {
            std::thread::scope(|scope| {
                let a = scope.spawn(|| handle.block_on(s.commit(&step(&x, &run, 0, 1, 1_000))));
                let b = scope.spawn(|| handle.block_on(s.commit(&step(&y, &run, 0, 1, 1_000))));
                (a.join().expect("thread a"), b.join().expect("thread b"))
            })
        });
        assert_eq!(
            usize::from(a.is_ok()) + usize::from(b.is_ok()),
            1,
            "{run}: {a:?} {b:?}"
        );
        let (winner, loser, lost) = if a.is_ok() { (&x, &y, b) } else { (&y, &x, a) };
        assert!(
            matches!(lost, Err(CommitError::RunOnOtherThread { .. })),
            "{run}: {lost:?}"
        );
        assert!(
            s.load_checkpoint(&tid(loser))
                .await
                .expect("load")
                .is_none(),
            "{run}: nothing written for the losing thread"
        );
        let cp = s
            .load_checkpoint(&tid(winner))
            .await
            .expect("load")
            .expect("the winner's thread");
        assert_eq!(cp.messages.len(), 2);
    }
}

fn profile_commit(
    thread: &str,
    run_id: &str,
    expected: u64,
    version: u64,
    value: Value,
) -> ThreadCommit {
    let mut record = run(run_id, 1_000);
    record.profile_id = Some(pid("alice"));
    ThreadCommit::new(tid(thread), record, expected)
        .with_messages([Message::user("hi")])
        .with_profile_state(
            state(1, &[("prefs.lang", value)]),
            BTreeMap::from([("prefs.lang".to_owned(), version)]),
        )
}

pub async fn profile_versions_and_conflict(h: &Harness) {
    let s = &*h.store;
    let fresh = s.load_profile(&pid("alice")).await.expect("profile");
    assert!(fresh.keys.is_empty());
    // Two threads read version 0; the first write wins, the second conflicts.
    let receipt = s
        .commit(&profile_commit("t1", "r1", 0, 0, json!("en")))
        .await
        .expect("first writer");
    assert_eq!(
        receipt.profile_versions,
        BTreeMap::from([("prefs.lang".to_owned(), 1)])
    );
    let before = dump_all(s).await;
    let err = s
        .commit(&profile_commit("t2", "r2", 0, 0, json!("fr")))
        .await
        .expect_err("stale profile version");
    assert!(
        matches!(&err, CommitError::ProfileConflict { key } if key == "prefs.lang"),
        "{err:?}"
    );
    assert_eq!(
        dump_all(s).await,
        before,
        "the conflicting commit wrote something"
    );
    // Retried on fresh state it goes through.
    let profile = s.load_profile(&pid("alice")).await.expect("profile");
    assert_eq!(
        profile.versions(),
        BTreeMap::from([("prefs.lang".to_owned(), 1)])
    );
    let version = profile.versions()["prefs.lang"];
    s.commit(&profile_commit("t2", "r2", 0, version, json!("fr")))
        .await
        .expect("retry");
    let profile = s.load_profile(&pid("alice")).await.expect("profile");
    assert_eq!(profile.keys["prefs.lang"].value, json!("fr"));
    assert_eq!(profile.keys["prefs.lang"].version, 2);
    assert_eq!(profile.to_persisted().values["prefs.lang"], json!("fr"));
    // A read guard on a key the commit does not write is checked too.
    let mut record = run("r1", 1_000);
    record.profile_id = Some(pid("alice"));
    let read_only = ThreadCommit::new(tid("t1"), record, 1).with_profile_state(
        PersistedState::default(),
        BTreeMap::from([("prefs.lang".to_owned(), 1)]),
    );
    assert!(matches!(
        s.commit(&read_only).await,
        Err(CommitError::ProfileConflict { .. })
    ));
    check(
        &dump(s, "t1").await,
        expect_test::expect![[r#"
            message 0 User: hi
            thread state r0: {}
            run r1 running steps=0 termination=none usage=0/0 created=1000ms updated=1000ms parent=None profile=Some("alice")
            run state r0: {}
            profile prefs.lang v2 = "fr"
            events 0 (last 0)
            listed run r1 running
        "#]],
    );
}

pub async fn deltas_upsert_changed_keys(h: &Harness) {
    let s = &*h.store;
    let first = ThreadCommit::new(tid("t1"), run("r1", 1_000), 0)
        .with_run_state(state(3, &[("a", json!(1)), ("b", json!(2))]))
        .with_thread_state(state(3, &[("x", json!("x1")), ("y", json!("y1"))]));
    s.commit(&first).await.expect("first");
    let mut record = run("r1", 1_000);
    record.updated_at = at(1_100);
    let second = ThreadCommit::new(tid("t1"), record.clone(), 0)
        .with_run_state(state(5, &[("b", json!(20))]))
        .with_thread_state(state(5, &[("y", json!("y2")), ("z", json!(null))]));
    s.commit(&second).await.expect("second");
    // A commit without deltas keeps the state and its revisions (this one finishes the run).
    record.updated_at = at(1_200);
    record.status = RunStatus::Done;
    record.termination = Some(TerminationReason::NaturalEnd);
    s.commit(&ThreadCommit::new(tid("t1"), record, 0))
        .await
        .expect("third");
    let cp = s
        .load_checkpoint(&tid("t1"))
        .await
        .expect("load")
        .expect("thread");
    assert_eq!(cp.run_state, state(5, &[("a", json!(1)), ("b", json!(20))]));
    assert_eq!(
        cp.thread_state,
        state(
            5,
            &[("x", json!("x1")), ("y", json!("y2")), ("z", json!(null))]
        )
    );
    // A new run of the thread starts with empty run state and sees the thread state.
    let new_run = ThreadCommit::new(tid("t1"), run("r2", 2_000), 0);
    s.commit(&new_run).await.expect("second run");
    let cp = s
        .load_checkpoint(&tid("t1"))
        .await
        .expect("load")
        .expect("thread");
    assert_eq!(cp.run.as_ref().map(|r| r.run_id.as_str()), Some("r2"));
    assert!(cp.run_state.values.is_empty());
    assert_eq!(cp.thread_state.values.len(), 3);
}

pub async fn events_in_order_since(h: &Harness) {
    let s = &*h.store;
    for i in 0..3u32 {
        s.commit(&step(
            "t1",
            "r1",
            u64::from(i) * 2,
            i + 1,
            1_000 + i64::from(i),
        ))
        .await
        .expect("commit");
    }
    let all = s.load_events(&tid("t1"), 0).await.expect("events");
    let seqs: Vec<u64> = all.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=9).collect::<Vec<_>>());
    assert_eq!(all[3].event, AgentEvent::StepStart { step: 2 });
    let tail = s.load_events(&tid("t1"), 7).await.expect("events");
    assert_eq!(tail.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![8, 9]);
    // From the end of one commit's events: the next commit's, whole.
    let from_second = s.load_events(&tid("t1"), 3).await.expect("events");
    assert_eq!(
        from_second.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (4..=9).collect::<Vec<_>>()
    );
    assert_eq!(from_second[0], all[3]);
    assert!(
        s.load_events(&tid("t1"), 9)
            .await
            .expect("events")
            .is_empty()
    );
    assert!(
        s.load_events(&tid("nope"), 0)
            .await
            .expect("events")
            .is_empty()
    );
}

pub async fn batch_keep_set_clear(h: &Harness) {
    let s = &*h.store;
    let c = ThreadCommit::new(tid("t1"), run("r1", 1_000), 0)
        .with_batch(batch(&[("c1", "requested"), ("c2", "executing")]));
    s.commit(&c).await.expect("set");
    let c = ThreadCommit::new(tid("t1"), run("r1", 1_000), 0);
    s.commit(&c).await.expect("keep");
    let cp = s
        .load_checkpoint(&tid("t1"))
        .await
        .expect("load")
        .expect("thread");
    assert_eq!(
        cp.batch,
        Some(batch(&[("c1", "requested"), ("c2", "executing")]))
    );
    // Finishing the run while the kept batch holds open calls is refused, nothing written.
    let mut done = run("r1", 1_000);
    done.status = RunStatus::Done;
    done.termination = Some(TerminationReason::NaturalEnd);
    let before = dump_all(s).await;
    let err = s
        .commit(&ThreadCommit::new(tid("t1"), done.clone(), 0))
        .await
        .expect_err("open call on a done run");
    assert!(
        matches!(
            &err,
            CommitError::Invalid { violation: CommitViolation::CallInFlight { call_id, .. }, .. }
                if call_id.as_str() == "c1"
        ),
        "{err:?}"
    );
    assert_eq!(dump_all(s).await, before);
    // Closing the calls (or clearing the batch) lets it finish.
    let closed = ThreadCommit::new(tid("t1"), done.clone(), 0)
        .with_batch(batch(&[("c1", "cancelled"), ("c2", "outcome_unknown")]));
    s.commit(&closed).await.expect("closed batch");
    let mut cleared = ThreadCommit::new(tid("t1"), done, 0);
    cleared.batch = BatchWrite::Clear;
    s.commit(&cleared).await.expect("clear");
    let cp = s
        .load_checkpoint(&tid("t1"))
        .await
        .expect("load")
        .expect("thread");
    assert_eq!(cp.batch, None);
    assert_eq!(cp.run.map(|r| r.status), Some(RunStatus::Done));
}

/// What a SQL store says once a test has overwritten the stored batch of run `r1` on thread
/// `t1` (one step committed, two messages) with text that is not a tool batch: the load, then a
/// commit finishing the run while keeping the batch (which reads it to check its calls), each
/// rendered as a line. The commit must write nothing.
pub async fn corrupt_batch_errors(store: &dyn ThreadStore) -> String {
    let load = store
        .load_checkpoint(&tid("t1"))
        .await
        .expect_err("a corrupt batch does not load");
    let mut finish = step("t1", "r1", 2, 2, 2_000);
    finish.batch = BatchWrite::Keep;
    finish.run.status = RunStatus::Done;
    finish.run.termination = Some(TerminationReason::NaturalEnd);
    let commit = store
        .commit(&finish)
        .await
        .expect_err("a corrupt kept batch fails the commit");
    let threads = store.list_threads().await.expect("list_threads");
    assert_eq!(threads.len(), 1);
    assert_eq!(
        threads[0].message_count, 2,
        "the failed commit wrote messages"
    );
    // A SQL store's errors name its database.
    assert!(load.database().is_some(), "{load:?}");
    assert!(
        matches!(&commit, CommitError::Backend(e) if e.database() == load.database()),
        "{commit:?}"
    );
    let render = |e: &StoreError| match e {
        StoreError::Corrupt { what, detail, .. } => format!("corrupt {what}: {detail}"),
        other => format!("other: {other}"),
    };
    let commit = match &commit {
        CommitError::Backend(e) => render(e),
        refused => format!("refused: {refused}"),
    };
    format!("{}\n{commit}", render(&load))
}

pub async fn invalid_commits_write_nothing(h: &Harness) {
    let s = &*h.store;
    s.commit(&step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("commit");
    let before = dump_all(s).await;
    let mut blank = step("t1", "r1", 2, 2, 2_000);
    blank.run.agent_id = " ".into();
    let mut unguarded = step("t1", "r1", 2, 2, 2_000);
    unguarded.run.profile_id = Some(pid("alice"));
    unguarded.profile_state = state(1, &[("prefs.lang", json!("en"))]).into();
    let mut in_flight = step("t1", "r1", 2, 2, 2_000);
    in_flight.run.status = RunStatus::Done;
    in_flight.run.termination = Some(TerminationReason::Cancelled);
    in_flight.batch = BatchWrite::Set(batch(&[("c9", "executing")]));
    let delta_event = step("t1", "r1", 2, 2, 2_000).with_events([AgentEvent::TextDelta {
        delta: "tok".to_owned(),
    }]);
    let mut foreign_lease = step("t1", "r1", 2, 2, 2_000);
    foreign_lease.lease = Some(LeaseToken {
        run_id: rid("r2"),
        worker_id: "w1".to_owned(),
        epoch: 1,
    });
    let mut other_thread = step("t2", "r1", 0, 1, 2_000);
    other_thread.batch = BatchWrite::Keep;
    let mut rendered = Vec::new();
    for c in [
        blank,
        unguarded,
        in_flight,
        delta_event,
        foreign_lease,
        other_thread,
    ] {
        let err = s.commit(&c).await.expect_err("invalid commit");
        rendered.push(match err {
            CommitError::Invalid { violation, .. } => format!("invalid: {violation}"),
            e @ CommitError::RunOnOtherThread { .. } => format!("run on another thread: {e}"),
            other => format!("other: {other}"),
        });
    }
    check(
        &rendered.join("\n"),
        expect_test::expect![[r#"
            invalid: agent_id is blank
            invalid: profile key "prefs.lang" is written without the version it was read at
            invalid: the run is done but tool call c9 is still Executing
            invalid: event text_delta is not a lifecycle event and is not stored
            invalid: the lease token is for run r2, the commit is for run r1
            run on another thread: run r1 belongs to thread t1, not to t2"#]],
    );
    assert_eq!(
        dump_all(s).await,
        before,
        "an invalid commit wrote something"
    );
}

pub async fn list_and_delete(h: &Harness) {
    let s = &*h.store;
    s.commit(&step("t2", "r2", 0, 1, 2_000)).await.expect("t2");
    s.commit(&step("t1", "r1", 0, 1, 1_000)).await.expect("t1");
    let mut done = run("r1", 1_000);
    done.status = RunStatus::Done;
    done.termination = Some(TerminationReason::NaturalEnd);
    s.commit(&ThreadCommit::new(tid("t1"), done, 2))
        .await
        .expect("r1 done");
    let mut child = run("r1-child", 1_500);
    child.parent_run_id = Some(rid("r1"));
    s.commit(&ThreadCommit::new(tid("t1"), child, 2))
        .await
        .expect("child run");
    let threads: Vec<String> = s
        .list_threads()
        .await
        .expect("threads")
        .iter()
        .map(|t| format!("{} {} {:?}", t.thread_id, t.message_count, t.latest_run_id))
        .collect();
    assert_eq!(
        threads,
        vec![
            r#"t1 2 Some(RunId("r1-child"))"#,
            r#"t2 2 Some(RunId("r2"))"#
        ]
    );
    let runs = s.list_runs(&tid("t1")).await.expect("runs");
    assert_eq!(
        runs.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
        vec!["r1", "r1-child"]
    );
    assert_eq!(runs[1].parent_run_id, Some(rid("r1")));
    for (run, thread) in [("r1-child", Some("t1")), ("r2", Some("t2")), ("r9", None)] {
        assert_eq!(
            s.run_thread(&rid(run)).await.expect("run's thread"),
            thread.map(tid),
            "the thread of {run}"
        );
    }
    assert!(s.delete_thread(&tid("t1")).await.expect("delete"));
    assert!(!s.delete_thread(&tid("t1")).await.expect("delete again"));
    assert_eq!(s.run_thread(&rid("r1")).await.expect("deleted run"), None);
    assert!(s.load_checkpoint(&tid("t1")).await.expect("load").is_none());
    assert!(s.list_runs(&tid("t1")).await.expect("runs").is_empty());
    assert!(
        s.load_events(&tid("t1"), 0)
            .await
            .expect("events")
            .is_empty()
    );
    assert_eq!(s.list_threads().await.expect("threads").len(), 1);
    // The thread can start again from nothing, with the same run ids.
    s.commit(&step("t1", "r1", 0, 1, 3_000))
        .await
        .expect("recreate");
    assert_eq!(
        s.load_events(&tid("t1"), 0).await.expect("events")[0].seq,
        1
    );
    assert!(
        s.load_checkpoint(&tid("t1"))
            .await
            .expect("load")
            .is_some_and(|c| c.run_state.values.len() == 2)
    );
}

pub async fn lease_claim_expiry_takeover(h: &Harness) {
    let s = &*h.store;
    let lease = Duration::from_secs(30);
    s.commit(&step("t1", "r1", 0, 1, 1_000)).await.expect("r1");
    s.commit(&step("t2", "r2", 0, 1, 2_000)).await.expect("r2");
    let mut done = step("t3", "r3", 0, 1, 500);
    done.run.status = RunStatus::Done;
    done.run.termination = Some(TerminationReason::NaturalEnd);
    s.commit(&done).await.expect("r3 done");
    // The oldest run waits for a decision: claims for recovery pass it by.
    let mut waiting = step("t4", "r4", 0, 1, 100);
    waiting.run.status = RunStatus::Waiting;
    waiting.run.termination = Some(TerminationReason::Suspended);
    s.commit(&waiting).await.expect("r4 waiting");
    // The oldest running run is a delegate's child: its parent's call continues it.
    let mut child = step("t5", "r5", 0, 1, 50);
    child.run.parent_run_id = Some(rid("r1"));
    s.commit(&child).await.expect("r5 child");

    // w1 claims one run (the oldest update first, neither claimed before), then the other; done, waiting and child
    // runs are never claimed.
    let a = s
        .claim_runnable("w1", lease, at(10_000), 1)
        .await
        .expect("claim");
    assert_eq!(a.len(), 1);
    assert_eq!(
        (a[0].run.run_id.as_str(), a[0].thread_id.as_str()),
        ("r1", "t1")
    );
    assert_eq!(a[0].expires_at, at(40_000));
    let b = s
        .claim_runnable("w1", lease, at(10_000), 10)
        .await
        .expect("claim");
    assert_eq!(
        b.iter().map(|c| c.run.run_id.as_str()).collect::<Vec<_>>(),
        vec!["r2"]
    );
    assert!(
        s.claim_runnable("w2", lease, at(39_999), 10)
            .await
            .expect("claim")
            .is_empty()
    );
    // A resume takes the waiting run's lease with a targeted claim.
    let resumed = s
        .claim_run(&RunId::new("r4").expect("id"), "w3", lease, at(10_000))
        .await
        .expect("claim r4");
    assert_eq!(resumed.map(|c| c.run.status), Some(RunStatus::Waiting));

    // w1 heartbeats r1; r2's lease expires and w2 takes it over.
    let r1 = a[0].lease.clone();
    let r2_old = b[0].lease.clone();
    assert_eq!(
        s.heartbeat(&r1, lease, at(35_000))
            .await
            .expect("heartbeat"),
        at(65_000)
    );
    let taken = s
        .claim_runnable("w2", lease, at(40_000), 10)
        .await
        .expect("takeover");
    assert_eq!(
        taken
            .iter()
            .map(|c| c.run.run_id.as_str())
            .collect::<Vec<_>>(),
        vec!["r2"]
    );
    let r2_new = taken[0].lease.clone();
    assert!(r2_new.epoch > r2_old.epoch);

    // The old holder's commit and heartbeat are refused; nothing is written.
    let before = dump_all(s).await;
    let stale = step("t2", "r2", 2, 2, 41_000).with_lease(r2_old.clone());
    let err = s.commit(&stale).await.expect_err("lost lease");
    assert!(
        matches!(&err, CommitError::LeaseLost { run_id } if run_id.as_str() == "r2"),
        "{err:?}"
    );
    assert_eq!(dump_all(s).await, before);
    assert!(matches!(
        s.heartbeat(&r2_old, lease, at(41_000)).await,
        Err(LeaseError::Lost { .. })
    ));
    assert!(!s.release(&r2_old).await.expect("release lost"));

    // The new holder commits; w1's commit on r1 with its lease goes through.
    s.commit(&step("t2", "r2", 2, 2, 41_000).with_lease(r2_new.clone()))
        .await
        .expect("new holder");
    s.commit(&step("t1", "r1", 2, 2, 41_000).with_lease(r1.clone()))
        .await
        .expect("r1 holder");

    // A lease that expired but that nobody claimed since is still the holder's.
    assert_eq!(
        s.heartbeat(&r1, lease, at(70_000))
            .await
            .expect("late heartbeat"),
        at(100_000)
    );

    // Release frees the run for the next claimer; finishing a run drops its lease.
    assert!(s.release(&r2_new).await.expect("release"));
    let again = s
        .claim_runnable("w3", lease, at(42_000), 10)
        .await
        .expect("claim");
    assert_eq!(
        again
            .iter()
            .map(|c| c.run.run_id.as_str())
            .collect::<Vec<_>>(),
        vec!["r2"]
    );
    let mut finish = step("t1", "r1", 4, 3, 43_000).with_lease(r1.clone());
    finish.run.status = RunStatus::Done;
    finish.run.termination = Some(TerminationReason::stopped("max_rounds", "3 rounds"));
    s.commit(&finish).await.expect("finish");
    assert!(matches!(
        s.heartbeat(&r1, lease, at(44_000)).await,
        Err(LeaseError::Lost { .. })
    ));
    assert!(
        s.claim_runnable("w4", lease, at(1_000_000), 10)
            .await
            .expect("claim")
            .iter()
            .all(|c| c.run.run_id.as_str() == "r2")
    );
    // A lease on a run that was never committed is lost too.
    let ghost = LeaseToken {
        run_id: rid("ghost"),
        worker_id: "w1".to_owned(),
        epoch: 1,
    };
    assert!(matches!(
        s.heartbeat(&ghost, lease, at(1)).await,
        Err(LeaseError::Lost { .. })
    ));
}

/// Claims take turns: a run claimed and given back (its continuation failed before it wrote
/// anything, so its update time stays the oldest) goes behind a run claimed fewer times.
pub async fn claims_take_turns(h: &Harness) {
    let s = &*h.store;
    let lease = Duration::from_secs(30);
    s.commit(&step("t1", "r1", 0, 1, 1_000)).await.expect("r1");
    s.commit(&step("t2", "r2", 0, 1, 2_000)).await.expect("r2");
    s.commit(&step("t3", "r3", 0, 1, 3_000)).await.expect("r3");
    let mut order = Vec::new();
    for round in 0..6 {
        let claimed = s
            .claim_runnable("w1", lease, at(10_000 + round), 1)
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1, "round {round}");
        order.push(claimed[0].run.run_id.to_string());
        assert!(s.release(&claimed[0].lease).await.expect("release"));
    }
    assert_eq!(order, ["r1", "r2", "r3", "r1", "r2", "r3"]);
    // r1 is claimed once more; several claimed at once come in the same order, r1 last.
    let again = s
        .claim_runnable("w1", lease, at(20_000), 1)
        .await
        .expect("claim r1");
    assert_eq!(again[0].run.run_id.as_str(), "r1");
    assert!(s.release(&again[0].lease).await.expect("release"));
    let all = s
        .claim_runnable("w2", lease, at(20_001), 5)
        .await
        .expect("claim all");
    assert_eq!(
        all.iter()
            .map(|c| c.run.run_id.as_str())
            .collect::<Vec<_>>(),
        vec!["r2", "r3", "r1"]
    );
}

/// `claim_run`: the lease a worker takes on the run it starts.
pub async fn claim_one_run(h: &Harness) {
    let s = &*h.store;
    let lease = Duration::from_secs(30);
    assert!(
        s.claim_run(&rid("nope"), "w1", lease, at(1))
            .await
            .expect("claim")
            .is_none(),
        "no such run"
    );
    s.commit(&step("t1", "r1", 0, 1, 1_000)).await.expect("r1");
    let mine = s
        .claim_run(&rid("r1"), "w1", lease, at(1_000))
        .await
        .expect("claim")
        .expect("a fresh run is free");
    assert_eq!((mine.thread_id.as_str(), mine.lease.epoch), ("t1", 1));
    assert_eq!(mine.expires_at, at(31_000));
    // Held: neither a targeted claim nor claim_runnable takes it.
    assert!(
        s.claim_run(&rid("r1"), "w2", lease, at(2_000))
            .await
            .expect("claim")
            .is_none()
    );
    assert!(
        s.claim_runnable("w2", lease, at(2_000), 10)
            .await
            .expect("claim")
            .is_empty()
    );
    // Commits carry it; once it expired another worker takes the run over.
    s.commit(&step("t1", "r1", 2, 2, 3_000).with_lease(mine.lease.clone()))
        .await
        .expect("commit with the lease");
    let taken = s
        .claim_run(&rid("r1"), "w2", lease, at(31_000))
        .await
        .expect("claim")
        .expect("expired");
    assert_eq!(taken.lease.epoch, 2);
    assert!(matches!(
        s.commit(&step("t1", "r1", 4, 3, 32_000).with_lease(mine.lease))
            .await,
        Err(CommitError::LeaseLost { .. })
    ));
    // A finished run is never claimed.
    let mut finish = step("t1", "r1", 4, 3, 33_000).with_lease(taken.lease);
    finish.run.status = RunStatus::Done;
    finish.run.termination = Some(TerminationReason::NaturalEnd);
    s.commit(&finish).await.expect("finish");
    assert!(
        s.claim_run(&rid("r1"), "w3", lease, at(1_000_000))
            .await
            .expect("claim")
            .is_none()
    );
}

/// A run's first commit can create it leased: no claim takes it before the lease expires, and
/// the lease's token (epoch 1) carries the run's commits like a claimed one's.
pub async fn a_run_created_leased_is_its_creators(h: &Harness) {
    let s = &*h.store;
    let lease = Duration::from_secs(30);
    let new_lease = |worker: &str| NewLease {
        worker_id: worker.to_owned(),
        expires_at: at(31_000),
    };
    s.commit(&step("t1", "r1", 0, 1, 1_000).with_new_lease(new_lease("w1")))
        .await
        .expect("r1");
    let mine = new_lease("w1").token(&rid("r1"));
    assert!(
        s.claim_runnable("w2", lease, at(1_000), 10)
            .await
            .expect("claim")
            .is_empty()
    );
    assert!(
        s.claim_run(&rid("r1"), "w2", lease, at(30_999))
            .await
            .expect("claim")
            .is_none()
    );
    assert_eq!(
        s.heartbeat(&mine, lease, at(2_000)).await.expect("held"),
        at(32_000)
    );
    // A new lease on a commit of a run that exists is checked as its token: the creator's
    // commit goes through (a first commit made again), another worker's is refused, and the
    // run stays w1's.
    let before = dump_all(s).await;
    assert!(matches!(
        s.commit(&step("t1", "r1", 2, 2, 2_500).with_new_lease(new_lease("w9")))
            .await,
        Err(CommitError::LeaseLost { .. })
    ));
    assert_eq!(dump_all(s).await, before);
    s.commit(&step("t1", "r1", 2, 2, 2_500).with_new_lease(new_lease("w1")))
        .await
        .expect("the creator's commit");
    s.commit(
        &step("t1", "r1", 4, 2, 3_000)
            .with_lease(mine.clone())
            .with_new_lease(new_lease("w9")),
    )
    .await
    .expect("commit with the lease");
    assert!(matches!(
        s.heartbeat(&new_lease("w9").token(&rid("r1")), lease, at(3_000))
            .await,
        Err(LeaseError::Lost { .. })
    ));
    // Once it expired, a recovery takes the run over and the creator's token is lost.
    let taken = s
        .claim_runnable("w2", lease, at(32_000), 10)
        .await
        .expect("claim");
    assert_eq!(
        taken
            .iter()
            .map(|c| (c.run.run_id.as_str(), c.lease.epoch))
            .collect::<Vec<_>>(),
        vec![("r1", 2)]
    );
    assert!(matches!(
        s.commit(&step("t1", "r1", 6, 3, 33_000).with_lease(mine))
            .await,
        Err(CommitError::LeaseLost { .. })
    ));
    // A run done in its first commit holds no lease.
    let mut done = step("t2", "r2", 0, 1, 1_000).with_new_lease(new_lease("w1"));
    done.run.status = RunStatus::Done;
    done.run.termination = Some(TerminationReason::NaturalEnd);
    s.commit(&done).await.expect("r2");
    assert!(matches!(
        s.heartbeat(&new_lease("w1").token(&rid("r2")), lease, at(2_000))
            .await,
        Err(LeaseError::Lost { .. })
    ));
    // A new lease names its worker.
    let before = dump_all(s).await;
    let blank = step("t3", "r3", 0, 1, 1_000).with_new_lease(new_lease(" "));
    assert!(matches!(
        s.commit(&blank).await,
        Err(CommitError::Invalid {
            violation: CommitViolation::BlankId {
                field: "new_lease.worker_id"
            },
            ..
        })
    ));
    assert_eq!(dump_all(s).await, before);
}

pub async fn concurrent_claims_never_share(h: &Harness) {
    let s = &*h.store;
    for i in 0..6u64 {
        s.commit(&step(
            &format!("t{i}"),
            &format!("r{i}"),
            0,
            1,
            1_000 + i as i64,
        ))
        .await
        .expect("commit");
    }
    let lease = Duration::from_secs(10);
    let (a, b, c) = tokio::join!(
        s.claim_runnable("w1", lease, at(5_000), 3),
        s.claim_runnable("w2", lease, at(5_000), 3),
        s.claim_runnable("w3", lease, at(5_000), 3),
    );
    let mut ids: Vec<String> = [a, b, c]
        .into_iter()
        .flat_map(|r| r.expect("claim"))
        .map(|c| c.run.run_id.to_string())
        .collect();
    let n = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "a run was claimed twice");
    assert_eq!(n, 6);
}

/// Every failpoint, on a first commit and on a later one: the failed commit leaves the store
/// exactly as after the last successful commit, and the same commit then succeeds.
pub async fn failpoint_inside_the_write(h: &Harness) {
    let s = &*h.store;
    for point in FailPoint::all() {
        // A first commit of a thread (and a first profile write) that fails leaves nothing.
        let before = dump_all(s).await;
        (h.arm)(point);
        let mut first = step("fresh", "fresh-run", 0, 1, 1_000);
        first.run.profile_id = Some(pid("bob"));
        first.profile_state = state(1, &[("prefs.tz", json!("UTC"))]).into();
        first.profile_versions = BTreeMap::from([("prefs.tz".to_owned(), 0)]);
        let err = s.commit(&first).await.expect_err("injected");
        assert!(
            matches!(err, CommitError::Backend(StoreError::Injected { point: p }) if p == point),
            "{err:?}"
        );
        assert_eq!(
            dump_all(s).await,
            before,
            "first commit, failpoint {point:?}"
        );
        assert!(
            s.load_profile(&pid("bob"))
                .await
                .expect("profile")
                .keys
                .is_empty()
        );
    }
    each_fault_writes_nothing(h, false).await;
    let events = s.load_events(&tid("t1"), 0).await.expect("events");
    assert_eq!(events.len(), 15);
    assert!(
        events
            .iter()
            .enumerate()
            .all(|(i, e)| e.seq == i as u64 + 1)
    );
}

pub async fn commit_cost_shape_at_length(h: &Harness) {
    // Not a timing test: a long thread still takes appends at the right index and the guard
    // still reads the count (the benches measure the cost).
    let s = &*h.store;
    let mut expected = 0;
    let mut batch_msgs = Vec::new();
    for i in 0..200 {
        batch_msgs.push(Message::user(format!("m{i}")));
    }
    let c = ThreadCommit::new(tid("long"), run("r1", 1), 0).with_messages(batch_msgs);
    expected += s.commit(&c).await.expect("bulk").message_count;
    let r = s
        .commit(&step("long", "r1", expected, 1, 10))
        .await
        .expect("step");
    assert_eq!(r.message_count, 202);
    let cp = s
        .load_checkpoint(&tid("long"))
        .await
        .expect("load")
        .expect("thread");
    assert_eq!(cp.messages[199].text(), "m199");
    assert_eq!(cp.messages[201].text(), "answer 1");
}

/// A leased run's last commit (finishing it, clearing its batch, releasing its lease) failing
/// at any point leaves the run as it was: still leased to its worker, its batch still there.
pub async fn failed_last_commit_keeps_lease_and_batch(h: &Harness) {
    let s = &*h.store;
    let lease = Duration::from_secs(30);
    s.commit(&step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("commit 1");
    let claimed = s
        .claim_run(&rid("r1"), "w1", lease, at(2_000))
        .await
        .expect("claim")
        .expect("claimable");
    let last = || {
        let mut c = step("t1", "r1", 2, 2, 3_000)
            .with_batch_cleared()
            .with_lease(claimed.lease.clone());
        c.run.status = RunStatus::Done;
        c.run.termination = Some(TerminationReason::NaturalEnd);
        c
    };
    for point in FailPoint::all() {
        let before = dump_all(s).await;
        (h.arm)(point);
        let err = s.commit(&last()).await.expect_err("injected");
        assert!(
            matches!(err, CommitError::Backend(StoreError::Injected { .. })),
            "{err:?}"
        );
        assert_eq!(dump_all(s).await, before, "failpoint {point:?}");
        assert!(before.contains("batch "), "{before}");
        s.heartbeat(&claimed.lease, lease, at(4_000))
            .await
            .unwrap_or_else(|e| panic!("failpoint {point:?}: the lease was lost: {e}"));
    }
    s.commit(&last()).await.expect("the last commit");
    let after = dump_all(s).await;
    assert!(!after.contains("batch "), "{after}");
    assert!(
        s.heartbeat(&claimed.lease, lease, at(5_000)).await.is_err(),
        "a finished run holds no lease"
    );
}

/// `commit_now` either writes as `commit` would, or writes nothing (`None`) for `commit` to
/// write; a refusal is the same on either path and writes nothing.
pub async fn commit_now_writes_or_leaves_the_commit(h: &Harness) {
    let s = &*h.store;
    let first = step("t1", "r1", 0, 1, 1_000);
    let receipt = match s.commit_now(&first) {
        Some(written) => written.expect("written at once"),
        None => {
            assert_eq!(dump_all(s).await, "", "nothing written at once");
            s.commit(&first).await.expect("commit")
        }
    };
    assert_eq!((receipt.message_count, receipt.last_event_seq), (2, 3));
    let before = dump_all(s).await;
    let stale = step("t1", "r1", 0, 2, 2_000);
    let err = match s.commit_now(&stale) {
        Some(written) => written.expect_err("stale guard"),
        None => {
            assert_eq!(dump_all(s).await, before, "nothing written at once");
            s.commit(&stale).await.expect_err("stale guard")
        }
    };
    assert!(
        matches!(
            err,
            CommitError::VersionConflict {
                expected: 0,
                actual: 2
            }
        ),
        "{err:?}"
    );
    assert_eq!(dump_all(s).await, before);
}

/// `commit_now`, or `commit` when the store writes nothing at once.
async fn commit_either(
    s: &dyn ThreadStore,
    commit: &ThreadCommit,
) -> Result<awaken_store::CommitReceipt, CommitError> {
    match s.commit_now(commit) {
        Some(written) => written,
        None => s.commit(commit).await,
    }
}

/// Commits a first step of `t1`, then for every failpoint: a commit that hits it fails with
/// that point and writes nothing, and the same commit then goes through. Through `commit_now`
/// (on the caller's thread, where the store allows it) if `immediate`, else through `commit`.
async fn each_fault_writes_nothing(h: &Harness, immediate: bool) {
    let s = &*h.store;
    let write = async |c: &ThreadCommit| {
        if immediate {
            commit_either(s, c).await
        } else {
            s.commit(c).await
        }
    };
    write(&step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("commit 1");
    let mut expected = 2;
    for (i, point) in FailPoint::all().into_iter().enumerate() {
        let before = dump_all(s).await;
        (h.arm)(point);
        let commit = step("t1", "r1", expected, 2 + i as u32, 2_000 + i as i64);
        let err = write(&commit).await.expect_err("injected");
        assert!(
            matches!(err, CommitError::Backend(StoreError::Injected { point: p }) if p == point),
            "{err:?}"
        );
        assert!(!err.is_refusal(), "{err:?}");
        assert_eq!(dump_all(s).await, before, "failpoint {point:?}");
        // The failpoint fired once; the caller's commit, still whole, now goes through.
        write(&commit).await.expect("retry");
        expected += 2;
    }
}

/// A refusal, by its variant and the fields that do not name a thread or run.
fn refusal(e: &CommitError) -> String {
    assert!(e.is_refusal(), "{e:?}");
    match e {
        CommitError::Invalid { violation, .. } => format!("Invalid: {violation}"),
        CommitError::VersionConflict { expected, actual } => {
            format!("VersionConflict: expected {expected}, actual {actual}")
        }
        CommitError::ProfileConflict { key } => format!("ProfileConflict: {key}"),
        CommitError::LeaseLost { .. } => "LeaseLost".to_owned(),
        CommitError::RunOnOtherThread { .. } => "RunOnOtherThread".to_owned(),
        CommitError::ThreadBusy { status, .. } => format!("ThreadBusy: {status}"),
        other => format!("not a refusal: {other}"),
    }
}

/// Every refusal is its own `CommitError` variant and writes nothing, and the caller keeps its
/// commit: the same commit, once its cause is corrected, goes through. Through `commit_now`
/// (where the store writes at once) and through `commit`, on a thread and run of each.
pub async fn a_refused_commit_goes_through_once_corrected(h: &Harness) {
    let s = &*h.store;
    let mut logs = Vec::new();
    for (prefix, immediate) in [("now", true), ("later", false)] {
        let write = async |c: &ThreadCommit| {
            if immediate {
                commit_either(s, c).await
            } else {
                s.commit(c).await
            }
        };
        let (thread, run_id) = (format!("{prefix}-t"), format!("{prefix}-r"));
        // (Shared: the closure below and the holder's refusal further down both write to it.)
        let log = std::cell::RefCell::new(Vec::new());
        // Refused as it is, written once `correct` has changed it.
        let refuse_then_correct =
            async |mut c: ThreadCommit, correct: &dyn Fn(&mut ThreadCommit)| {
                let before = dump_all(s).await;
                let err = write(&c).await.expect_err("refused");
                assert_eq!(dump_all(s).await, before, "{err}: something was written");
                log.borrow_mut().push(refusal(&err));
                correct(&mut c);
                write(&c)
                    .await
                    .unwrap_or_else(|e| panic!("once corrected: {e}"));
                err
            };
        write(&step(&thread, &run_id, 0, 1, 1_000))
            .await
            .expect("first step");
        let held = s
            .claim_run(&rid(&run_id), "w1", Duration::from_secs(30), at(1_000))
            .await
            .expect("claim")
            .expect("claimable")
            .lease;

        let mut blank = step(&thread, &run_id, 2, 2, 2_000).with_lease(held.clone());
        blank.run.agent_id = " ".into();
        refuse_then_correct(blank, &|c| c.run.agent_id = "assistant".into()).await;

        let stale = step(&thread, &run_id, 2, 3, 3_000).with_lease(held.clone());
        refuse_then_correct(stale, &|c| c.expected_message_count = 4).await;

        let other_worker = LeaseToken {
            worker_id: "w2".to_owned(),
            ..held.clone()
        };
        let lost = step(&thread, &run_id, 6, 4, 4_000).with_lease(other_worker);
        let err = refuse_then_correct(lost, &|c| c.lease = Some(held.clone())).await;
        assert!(
            matches!(&err, CommitError::LeaseLost { run_id: r } if r.as_str() == run_id),
            "{err:?}"
        );

        let elsewhere = step(&format!("{prefix}-other"), &run_id, 0, 5, 5_000);
        let err = refuse_then_correct(elsewhere, &|c| {
            c.thread_id = tid(&thread);
            c.expected_message_count = 8;
        })
        .await;
        assert!(
            matches!(&err, CommitError::RunOnOtherThread { stored_thread_id, .. } if *stored_thread_id == tid(&thread)),
            "{err:?}"
        );

        // A profile key another run wrote since this commit read it (at version 0).
        let profile = pid(&format!("{prefix}-profile"));
        let profile_run = format!("{prefix}-profiled");
        let profiled = |expected: u64, value: Value| {
            let mut record = run(&profile_run, 6_000);
            record.profile_id = Some(profile.clone());
            ThreadCommit::new(tid(&thread), record, expected).with_profile_state(
                state(1, &[("prefs.lang", value)]),
                BTreeMap::from([("prefs.lang".to_owned(), 0)]),
            )
        };
        // A new run while the first one holds the thread: refused until that one is done.
        let before = dump_all(s).await;
        let err = write(&profiled(10, json!("en")))
            .await
            .expect_err("the thread is held");
        assert_eq!(dump_all(s).await, before, "{err}: something was written");
        log.borrow_mut().push(refusal(&err));
        assert!(
            matches!(
                &err,
                CommitError::ThreadBusy { run_id: holder, .. } if holder.as_str() == run_id
            ),
            "{err:?}"
        );
        let mut done = run(&run_id, 5_500);
        done.status = RunStatus::Done;
        done.termination = Some(TerminationReason::NaturalEnd);
        write(&ThreadCommit::new(tid(&thread), done, 10).with_lease(held.clone()))
            .await
            .expect("the holder finishes");
        write(&profiled(10, json!("en")))
            .await
            .expect("first write");
        refuse_then_correct(profiled(10, json!("fr")), &|c| {
            c.profile_versions.insert("prefs.lang".to_owned(), 1);
        })
        .await;
        let stored = s.load_profile(&profile).await.expect("profile");
        assert_eq!(
            (
                &stored.keys["prefs.lang"].value,
                stored.keys["prefs.lang"].version
            ),
            (&json!("fr"), 2)
        );
        let cp = s
            .load_checkpoint(&tid(&thread))
            .await
            .expect("load")
            .expect("thread");
        assert_eq!(cp.messages.len(), 10, "every corrected commit was written");
        logs.push(log.into_inner().join("\n"));
    }
    assert_eq!(logs[0], logs[1], "commit_now and commit refuse alike");
    check(
        &logs[0],
        expect_test::expect![[r#"
            Invalid: agent_id is blank
            VersionConflict: expected 2, actual 4
            LeaseLost
            RunOnOtherThread
            ThreadBusy: running
            ProfileConflict: prefs.lang"#]],
    );
}

/// A fault between two writes of a commit made through `commit_now` writes nothing, as
/// through `commit`.
pub async fn failpoint_inside_an_immediate_write(h: &Harness) {
    each_fault_writes_nothing(h, true).await;
}

/// Messages of every kind a store keeps: every content block, calls with nested, numeric,
/// unicode and unparsable arguments, results as text and as JSON.
fn every_kind_of_message() -> Vec<Message> {
    use awaken_event::{ContentBlock, Role, ToolCall, ToolCallId, ToolResult};
    use std::sync::Arc;
    let call_id = |s: &str| ToolCallId::new(s).expect("call id");
    let arguments = json!({
        "text": "héllo \"quoted\" \n ✓",
        "n": -42, "big": u64::MAX, "min": i64::MIN, "f": 0.1, "e": -2.5e-300,
        "flags": [true, false, null], "nested": {"a": {"b": [1, {"c": []}]}, "empty": {}},
    });
    vec![
        Message::system("be brief"),
        Message {
            role: Role::User,
            content: Arc::new([
                ContentBlock::text("look"),
                ContentBlock::Image {
                    url: "data:image/png;base64,AAAA".into(),
                    media_type: Some("image/png".into()),
                },
                ContentBlock::Image {
                    url: "https://example.invalid/a.jpg".into(),
                    media_type: None,
                },
            ]),
            tool_calls: awaken_event::no_tool_calls(),
            tool_call_id: None,
        },
        Message {
            role: Role::Assistant,
            content: Arc::new([
                ContentBlock::Reasoning {
                    text: "thinking".into(),
                },
                ContentBlock::text(""),
            ]),
            tool_calls: Arc::new([
                ToolCall::new(call_id("c1"), "search", arguments.clone()),
                ToolCall::from_raw_arguments(call_id("c2"), "search", "{not json"),
                ToolCall::new(call_id("c3"), "noop", json!({})),
            ]),
            tool_call_id: None,
        },
        Message::tool(call_id("c1"), &ToolResult::success(arguments)),
        Message::tool(call_id("c2"), &ToolResult::error("bad arguments")),
        Message::tool(call_id("c3"), &ToolResult::success(json!("plain text"))),
        Message::assistant_with_calls("", vec![]),
        Message::assistant("done"),
    ]
}

/// Lifecycle events of every kind, for `run_id` on `thread`.
fn every_kind_of_event(thread: &str, run_id: &str) -> Vec<AgentEvent> {
    use awaken_event::{
        PendingCall, ResumeDecision, SuspendTicket, ToolCallId, ToolCallState, ToolResult,
        WarningKind,
    };
    use std::sync::Arc;
    let call_id = |s: &str| ToolCallId::new(s).expect("call id");
    let usage = TokenUsage {
        input_tokens: 7,
        output_tokens: 3,
        cached_input_tokens: 2,
        reasoning_tokens: 1,
    };
    vec![
        AgentEvent::RunStart {
            thread_id: tid(thread),
            run_id: rid(run_id),
            agent_id: "agent".into(),
            parent_run_id: Some(rid("parent")),
            resumed: true,
        },
        AgentEvent::StepStart { step: 1 },
        AgentEvent::ToolCallStart {
            call_id: call_id("c1"),
            name: "search".into(),
        },
        AgentEvent::InferenceComplete {
            model: "m".into(),
            usage,
            duration_ms: u64::MAX,
            stop_reason: awaken_event::StopReason::MaxTokens,
        },
        AgentEvent::ToolCallReady {
            call_id: call_id("c1"),
            name: "search".into(),
            arguments: Arc::new(json!({"q": "x", "k": [1.5, -1]})),
        },
        AgentEvent::ToolCallDone {
            call_id: call_id("c1"),
            result: Arc::new(ToolResult::error("boom")),
            state: ToolCallState::Failed,
        },
        AgentEvent::ToolCallSuspended {
            call_id: call_id("c2"),
            ticket: Box::new(SuspendTicket {
                suspension_id: "s1".into(),
                call: PendingCall {
                    call_id: call_id("c2"),
                    tool_name: "pay".into(),
                    arguments: json!({"amount": 3}),
                    argument_digest: "sha256:00".into(),
                },
                message: "pay?".into(),
                response_schema: Some(json!({"type": "string"})),
                resume_mode: Default::default(),
            }),
        },
        AgentEvent::ToolCallResumed {
            call_id: call_id("c2"),
            decision: ResumeDecision::Deny,
        },
        AgentEvent::ActionDeadLettered {
            action: "a".into(),
            phase: "p".into(),
            reason: "r".into(),
        },
        AgentEvent::Warning {
            kind: WarningKind::GateConflict,
            detail: "d".into(),
        },
        AgentEvent::Error {
            message: "e".into(),
        },
        AgentEvent::MessageAdded {
            step: 2,
            message: Message::user("and \u{e9}ggs"),
        },
        AgentEvent::StepEnd { step: u32::MAX },
        AgentEvent::RunFinish {
            thread_id: tid(thread),
            run_id: rid(run_id),
            termination: Box::new(TerminationReason::Stopped {
                code: "max_rounds".into(),
                detail: "5".into(),
            }),
            response: Some("done".into()),
            usage: Box::new(usage),
        },
        AgentEvent::RunFinish {
            thread_id: tid(thread),
            run_id: rid(run_id),
            termination: Box::new(TerminationReason::NaturalEnd),
            response: None,
            usage: Box::new(TokenUsage::default()),
        },
    ]
}

/// A commit of `run_id` on `thread` carrying `messages` and `events`, finishing the run when
/// `done`.
fn carrying(
    thread: &str,
    run_id: &str,
    expected: u64,
    now: i64,
    messages: &[Message],
    events: &[AgentEvent],
    done: bool,
) -> ThreadCommit {
    let mut record = run(run_id, 1_000);
    record.updated_at = at(now);
    if done {
        record.status = RunStatus::Done;
        record.termination = Some(TerminationReason::NaturalEnd);
    }
    ThreadCommit::new(tid(thread), record, expected)
        .with_messages(messages.iter().cloned())
        .with_events(events.iter().cloned())
}

/// What the store gives back of `thread`: its messages, and its events after each sequence
/// number (all of them and every tail).
async fn read_back(
    s: &dyn ThreadStore,
    thread: &str,
) -> (Vec<Message>, Vec<Vec<(u64, String, AgentEvent)>>) {
    let messages = s
        .load_checkpoint(&tid(thread))
        .await
        .expect("load")
        .map(|cp| cp.messages)
        .unwrap_or_default();
    let all = s.load_events(&tid(thread), 0).await.expect("events");
    let mut tails = Vec::new();
    for since in 0..=all.len() as u64 + 1 {
        let tail = s.load_events(&tid(thread), since).await.expect("events");
        tails.push(
            tail.into_iter()
                .map(|e| (e.seq, e.run_id.to_string(), e.event))
                .collect(),
        );
    }
    (messages, tails)
}

/// Each tail read (the events after 0, 1, 2, ...) is the matching suffix of `expected`.
fn assert_tails(
    tails: &[Vec<(u64, String, AgentEvent)>],
    expected: &[(u64, String, AgentEvent)],
    context: &str,
) {
    for (since, tail) in tails.iter().enumerate() {
        assert_eq!(
            tail[..],
            expected[since.min(expected.len())..],
            "{context}since {since}"
        );
    }
}

/// A thread reads back whole, message for message and event for event, before and after its
/// runs finish (the memory store keeps a finished thread in another form), with a later run's
/// commits on top, and a failed commit on top of a finished run changes nothing.
pub async fn finished_threads_read_back_whole(h: &Harness) {
    let s = &*h.store;
    let messages = every_kind_of_message();
    let (first, second) = messages.split_at(3);
    let events = every_kind_of_event("t1", "r1");
    let (early, late) = events.split_at(5);

    // Run r1: two commits, the second finishing it.
    s.commit(&carrying("t1", "r1", 0, 1_001, first, early, false))
        .await
        .expect("commit");
    let running = read_back(s, "t1").await;
    assert_eq!(running.0, first);
    s.commit(&carrying("t1", "r1", 3, 1_002, second, late, true))
        .await
        .expect("commit");
    let finished = read_back(s, "t1").await;
    assert_eq!(finished.0, messages);
    let expected: Vec<(u64, String, AgentEvent)> = events
        .iter()
        .enumerate()
        .map(|(i, e)| (i as u64 + 1, "r1".to_owned(), e.clone()))
        .collect();
    assert_eq!(finished.1[0], expected);
    assert_tails(&finished.1, &expected, "");
    // What was read while the run went on reads the same after it finished.
    assert_eq!(running.1[0], expected[..early.len()]);

    // Run r2 on the same thread: its commits read after r1's, in order, with their run id.
    let more = [Message::user("again"), Message::assistant("again")];
    let r2_events = every_kind_of_event("t1", "r2");
    s.commit(&carrying(
        "t1",
        "r2",
        8,
        1_003,
        &more[..1],
        &r2_events[..2],
        false,
    ))
    .await
    .expect("commit");
    let before_fault = read_back(s, "t1").await;
    assert_eq!(before_fault.0.len(), 9);
    assert_eq!(before_fault.0[8], more[0]);
    assert_eq!(
        before_fault.1[0]
            .last()
            .map(|(seq, run, _)| (*seq, run.as_str())),
        Some((events.len() as u64 + 2, "r2"))
    );
    // A commit that fails at any point changes nothing of what reads back.
    let last = || carrying("t1", "r2", 9, 1_004, &more[1..], &r2_events[2..], true);
    for point in FailPoint::all() {
        (h.arm)(point);
        let err = s.commit(&last()).await.expect_err("injected");
        assert!(
            matches!(err, CommitError::Backend(StoreError::Injected { .. })),
            "{err:?}"
        );
        assert_eq!(
            read_back(s, "t1").await,
            before_fault,
            "failpoint {point:?}"
        );
    }
    s.commit(&last()).await.expect("commit");
    let (all_messages, tails) = read_back(s, "t1").await;
    let mut expected_messages = messages.clone();
    expected_messages.extend(more.iter().cloned());
    assert_eq!(all_messages, expected_messages);
    let mut expected_events = expected;
    expected_events.extend(
        r2_events
            .iter()
            .enumerate()
            .map(|(i, e)| ((events.len() + i) as u64 + 1, "r2".to_owned(), e.clone())),
    );
    assert_tails(&tails, &expected_events, "");
}

/// Two runs writing to one thread in turn: their events keep their order, numbers and run ids
/// through one run's end and the other's, and the second run's commits while the first one
/// holds the thread are refused and write nothing. After each, `latest_run` reads the record
/// the checkpoint holds.
pub async fn runs_in_turn_read_back_in_order(h: &Harness) {
    let s = &*h.store;
    let events = every_kind_of_event("t1", "a");
    let mut expected: Vec<(u64, String, AgentEvent)> = Vec::new();
    let mut messages = Vec::new();
    // a, b (refused: a holds the thread), a, a finishing, then b twice, finishing.
    let plan = [
        ("a", false),
        ("b", false),
        ("a", false),
        ("a", true),
        ("b", false),
        ("b", true),
    ];
    let mut outcomes = Vec::new();
    assert_eq!(s.latest_run(&tid("t1")).await.expect("latest run"), None);
    for (i, (run_id, done)) in plan.into_iter().enumerate() {
        let batch = &events[i * 2..i * 2 + 2];
        let message = Message::user(format!("{run_id} {i}"));
        let before = read_back(s, "t1").await;
        let written = s
            .commit(&carrying(
                "t1",
                run_id,
                messages.len() as u64,
                1_001 + i as i64,
                std::slice::from_ref(&message),
                batch,
                done,
            ))
            .await;
        match written {
            Ok(_) => {
                outcomes.push(format!("{run_id}: written"));
                messages.push(message);
                for e in batch {
                    expected.push((expected.len() as u64 + 1, run_id.to_owned(), e.clone()));
                }
            }
            Err(e) => {
                outcomes.push(format!("{run_id}: {}", refusal(&e)));
                assert_eq!(read_back(s, "t1").await, before, "commit {i}: {e}");
            }
        }
        let (read, tails) = read_back(s, "t1").await;
        assert_eq!(read, messages, "after commit {i}");
        assert_tails(&tails, &expected, &format!("after commit {i}, "));
        // The latest run's record alone reads back as the checkpoint holds it.
        let held = s
            .load_checkpoint(&tid("t1"))
            .await
            .expect("load")
            .and_then(|c| c.run);
        assert!(held.is_some(), "after commit {i}");
        assert_eq!(
            s.latest_run(&tid("t1")).await.expect("latest run"),
            held,
            "after commit {i}"
        );
    }
    // Each run read by its id is the record the thread's list holds; on another thread, or
    // an id no run has, there is none.
    for run in s.list_runs(&tid("t1")).await.expect("runs") {
        let read = s.load_run(&tid("t1"), &run.run_id).await.expect("run");
        assert_eq!(read, Some(run.clone()));
        let elsewhere = s.load_run(&tid("t2"), &run.run_id).await.expect("run");
        assert_eq!(elsewhere, None, "run {} on another thread", run.run_id);
    }
    let unknown = s.load_run(&tid("t1"), &rid("zz")).await.expect("run");
    assert_eq!(unknown, None);
    check(
        &outcomes.join("\n"),
        expect_test::expect![[r#"
            a: written
            b: ThreadBusy: running
            a: written
            a: written
            b: written
            b: written"#]],
    );
}

/// A run's state reads back the same once a commit has finished the run (the memory store
/// keeps a finished run's state in another form), and a later commit to the finished run still
/// changes only the keys it carries, or nothing when it fails.
pub async fn a_finished_runs_state_reads_back_and_takes_writes(h: &Harness) {
    let s = &*h.store;
    let run_state = |cp: Option<awaken_store::Checkpoint>| {
        let cp = cp.expect("thread");
        (cp.run_state.revision, cp.run_state.values)
    };
    let mut first = carrying("t1", "r1", 0, 1_001, &[Message::user("hi")], &[], false);
    first.run_state = state(
        2,
        &[
            ("a", json!(1)),
            ("b", json!({"x": [1, 2]})),
            ("e", json!({"f": -0.25, "g": 1e300, "s": "\"q\"\n\u{1}"})),
        ],
    )
    .into();
    s.commit(&first).await.expect("commit");
    let running = run_state(s.load_checkpoint(&tid("t1")).await.expect("load"));
    let mut done = carrying("t1", "r1", 1, 1_002, &[], &[], true);
    done.run_state = state(3, &[("c", json!("three"))]).into();
    s.commit(&done).await.expect("commit");
    let finished = run_state(s.load_checkpoint(&tid("t1")).await.expect("load"));
    let mut expected = running.1.clone();
    expected.insert("c".to_owned(), json!("three"));
    assert_eq!(finished, (3, expected.clone()));

    // Another commit to the finished run: failing at any point, then written.
    let again = || {
        let mut c = carrying("t1", "r1", 1, 1_003, &[], &[], true);
        c.run_state = state(4, &[("a", json!(10)), ("d", json!(null))]).into();
        c
    };
    for point in FailPoint::all() {
        (h.arm)(point);
        s.commit(&again()).await.expect_err("injected");
        assert_eq!(
            run_state(s.load_checkpoint(&tid("t1")).await.expect("load")),
            finished,
            "failpoint {point:?}"
        );
    }
    s.commit(&again()).await.expect("commit");
    expected.insert("a".to_owned(), json!(10));
    expected.insert("d".to_owned(), json!(null));
    assert_eq!(
        run_state(s.load_checkpoint(&tid("t1")).await.expect("load")),
        (4, expected)
    );
}

/// A finished run's record reads back field for field (the memory store keeps a finished run's
/// row in another form), from a checkpoint and from the list of a thread's runs; a finished
/// run cannot be claimed, and a later commit to it is taken (keeping its creation time).
pub async fn a_finished_runs_record_reads_back_whole(h: &Harness) {
    let s = &*h.store;
    let reasons = [
        TerminationReason::NaturalEnd,
        TerminationReason::stopped("max_rounds", "ran \"out\"\n of rounds"),
        TerminationReason::Cancelled,
        TerminationReason::error("it broke"),
    ];
    let mut finished = Vec::new();
    for (i, reason) in reasons.into_iter().enumerate() {
        let n = i64::try_from(i).expect("small");
        let mut record = run(&format!("r{i}"), -5_000 + n);
        record.parent_run_id = (i % 2 == 1).then(|| rid("parent"));
        record.profile_id = (i == 2).then(|| pid("p1"));
        s.commit(&ThreadCommit::new(tid("t1"), record.clone(), 0))
            .await
            .expect("commit");
        record.status = RunStatus::Done;
        record.termination = Some(reason);
        record.steps = 7 + u32::try_from(i).expect("small");
        record.usage = TokenUsage {
            input_tokens: 1 << 40,
            output_tokens: 3,
            cached_input_tokens: 0,
            reasoning_tokens: 5 + i as u64,
        };
        record.updated_at = at(i64::MAX / 2 + n);
        s.commit(
            &ThreadCommit::new(tid("t1"), record.clone(), 0)
                .with_run_state(state(1, &[("k", json!(i))])),
        )
        .await
        .expect("commit");
        let cp = s.load_checkpoint(&tid("t1")).await.expect("load");
        let cp = cp.expect("thread");
        assert_eq!(cp.run.as_ref(), Some(&record), "run {i}");
        assert_eq!(cp.run_state, state(1, &[("k", json!(i))]), "run {i}");
        assert_eq!(cp.batch, None);
        finished.push(record);
    }
    // A finished run on another thread is not listed with these.
    let mut other = run("x", 0);
    s.commit(&ThreadCommit::new(tid("t2"), other.clone(), 0))
        .await
        .expect("commit");
    other.status = RunStatus::Done;
    other.termination = Some(TerminationReason::NaturalEnd);
    s.commit(&ThreadCommit::new(tid("t2"), other.clone(), 0))
        .await
        .expect("commit");
    assert_eq!(s.list_runs(&tid("t1")).await.expect("list"), finished);
    assert_eq!(s.list_runs(&tid("t2")).await.expect("list"), [other]);

    let claimed = s
        .claim_run(&rid("r1"), "w1", Duration::from_secs(30), at(0))
        .await
        .expect("claim");
    assert!(claimed.is_none(), "{claimed:?}");

    // A later commit to a finished run: the store keeps its first creation time.
    let mut again = finished[3].clone();
    again.created_at = at(1);
    again.steps = 99;
    again.updated_at = at(2);
    s.commit(&ThreadCommit::new(tid("t1"), again.clone(), 0))
        .await
        .expect("commit");
    again.created_at = finished[3].created_at;
    finished[3] = again;
    assert_eq!(s.list_runs(&tid("t1")).await.expect("list"), finished);

    assert!(s.delete_thread(&tid("t2")).await.expect("delete"));
    assert!(s.list_runs(&tid("t2")).await.expect("list").is_empty());
    assert_eq!(s.list_runs(&tid("t1")).await.expect("list"), finished);
}

/// The outcome of a commit as a line: `written`, or the refusal with its message.
fn outcome(written: &Result<awaken_store::CommitReceipt, CommitError>) -> String {
    match written {
        Ok(_) => "written".to_owned(),
        Err(e) => format!("{}: {e}", refusal(e)),
    }
}

/// `run_id`'s record on its way: `Running`, `Waiting` (suspended) or `Done`, at `now`.
fn record(run_id: &str, status: RunStatus, now: i64) -> RunRecord {
    let mut record = run(run_id, now);
    record.status = status;
    record.termination = match status {
        RunStatus::Running => None,
        RunStatus::Waiting => Some(TerminationReason::Suspended),
        RunStatus::Done => Some(TerminationReason::NaturalEnd),
    };
    record
}

/// One run at a time holds a thread: a new run's commit while another run is `Running` or
/// `Waiting` on the thread is `ThreadBusy` naming that run, and writes nothing; the holder's own
/// commits go through, and once one of them is `Done` the new run starts. A finished run's
/// commit is then refused too, while the new run holds the thread.
pub async fn one_run_holds_a_thread(h: &Harness) {
    let s = &*h.store;
    let mut log = Vec::new();
    let mut commit = async |label: &str, c: ThreadCommit| {
        let before = dump_all(s).await;
        let written = s.commit(&c).await;
        if let Err(e) = &written {
            assert!(e.is_refusal() && e.is_conflict(), "{e:?}");
            assert_eq!(dump_all(s).await, before, "{label}: something was written");
        }
        log.push(format!("{label}: {}", outcome(&written)));
    };
    commit("r1 starts", step("t1", "r1", 0, 1, 1_000)).await;
    commit(
        "r2 starts",
        ThreadCommit::new(tid("t1"), record("r2", RunStatus::Running, 1_100), 2),
    )
    .await;
    commit(
        "r1 waits",
        ThreadCommit::new(tid("t1"), record("r1", RunStatus::Waiting, 1_200), 2)
            .with_batch(batch(&[("c1", "suspended")])),
    )
    .await;
    commit(
        "r2 starts",
        ThreadCommit::new(tid("t1"), record("r2", RunStatus::Running, 1_300), 2)
            .with_messages([Message::user("hello")]),
    )
    .await;
    commit(
        "r1 closes its waiting call",
        ThreadCommit::new(tid("t1"), record("r1", RunStatus::Done, 1_400), 2)
            .with_batch(batch(&[("c1", "cancelled")])),
    )
    .await;
    commit(
        "r2 starts",
        ThreadCommit::new(tid("t1"), record("r2", RunStatus::Running, 1_500), 2)
            .with_messages([Message::user("hello")]),
    )
    .await;
    commit(
        "r1 again",
        ThreadCommit::new(tid("t1"), record("r1", RunStatus::Done, 1_600), 3),
    )
    .await;
    commit(
        "r2 goes on",
        ThreadCommit::new(tid("t1"), record("r2", RunStatus::Running, 1_700), 3),
    )
    .await;
    commit(
        "r2 ends",
        ThreadCommit::new(tid("t1"), record("r2", RunStatus::Done, 1_800), 3),
    )
    .await;
    commit(
        "r1 again",
        ThreadCommit::new(tid("t1"), record("r1", RunStatus::Done, 1_900), 3),
    )
    .await;
    // Another thread is not held by r2.
    commit(
        "r3 starts on t2",
        ThreadCommit::new(tid("t2"), record("r3", RunStatus::Running, 2_000), 0),
    )
    .await;
    check(
        &log.join("\n"),
        expect_test::expect![[r#"
            r1 starts: written
            r2 starts: ThreadBusy: running: thread t1 is held by run r1, which is running
            r1 waits: written
            r2 starts: ThreadBusy: waiting: thread t1 is held by run r1, which is waiting
            r1 closes its waiting call: written
            r2 starts: written
            r1 again: ThreadBusy: running: thread t1 is held by run r2, which is running
            r2 goes on: written
            r2 ends: written
            r1 again: written
            r3 starts on t2: written"#]],
    );
    let runs: Vec<String> = s
        .list_runs(&tid("t1"))
        .await
        .expect("runs")
        .iter()
        .map(|r| format!("{} {}", r.run_id, r.status))
        .collect();
    assert_eq!(runs, ["r1 done", "r2 done"]);
}

/// A `Running` holder whose worker is gone (its lease expired) is taken over with `claim_run`
/// and closed with the new lease; then a new run starts, and the old worker's commits are
/// `LeaseLost` (not `ThreadBusy`: its lease is what it lost). A holder that never had a lease is
/// claimed and closed the same way.
pub async fn a_stale_holder_is_claimed_and_closed(h: &Harness) {
    let s = &*h.store;
    let lease = Duration::from_secs(30);
    s.commit(&step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("r1 starts");
    let gone = s
        .claim_run(&rid("r1"), "w1", lease, at(1_000))
        .await
        .expect("claim")
        .expect("a fresh run is free");
    let newcomer = ThreadCommit::new(tid("t1"), record("r2", RunStatus::Running, 40_000), 2);
    let mut log = vec![format!(
        "r2 starts: {}",
        outcome(&s.commit(&newcomer).await)
    )];
    assert!(
        s.claim_run(&rid("r1"), "w2", lease, at(30_999))
            .await
            .expect("claim")
            .is_none(),
        "the lease has not expired yet"
    );
    let taken = s
        .claim_run(&rid("r1"), "w2", lease, at(31_000))
        .await
        .expect("claim")
        .expect("the lease expired");
    assert!(taken.lease.epoch > gone.lease.epoch);
    let close = ThreadCommit::new(tid("t1"), record("r1", RunStatus::Done, 31_000), 2)
        .with_batch_cleared()
        .with_lease(taken.lease.clone());
    log.push(format!(
        "w2 closes r1: {}",
        outcome(&s.commit(&close).await)
    ));
    log.push(format!(
        "r2 starts: {}",
        outcome(&s.commit(&newcomer).await)
    ));
    let stale = ThreadCommit::new(tid("t1"), record("r1", RunStatus::Running, 41_000), 2)
        .with_lease(gone.lease.clone());
    let before = dump_all(s).await;
    log.push(format!(
        "w1 writes r1: {}",
        outcome(&s.commit(&stale).await)
    ));
    assert_eq!(dump_all(s).await, before);
    assert!(matches!(
        s.heartbeat(&gone.lease, lease, at(41_000)).await,
        Err(LeaseError::Lost { .. })
    ));

    // A holder without a lease (a single-process run that stopped) is claimed at once.
    s.commit(&step("t2", "r3", 0, 1, 1_000))
        .await
        .expect("r3 starts");
    let newcomer = ThreadCommit::new(tid("t2"), record("r4", RunStatus::Running, 2_000), 2);
    log.push(format!(
        "r4 starts: {}",
        outcome(&s.commit(&newcomer).await)
    ));
    let taken = s
        .claim_run(&rid("r3"), "w2", lease, at(2_000))
        .await
        .expect("claim")
        .expect("no lease on it");
    let close = ThreadCommit::new(tid("t2"), record("r3", RunStatus::Done, 2_000), 2)
        .with_batch_cleared()
        .with_lease(taken.lease);
    log.push(format!(
        "w2 closes r3: {}",
        outcome(&s.commit(&close).await)
    ));
    log.push(format!(
        "r4 starts: {}",
        outcome(&s.commit(&newcomer).await)
    ));
    check(
        &log.join("\n"),
        expect_test::expect![[r#"
            r2 starts: ThreadBusy: running: thread t1 is held by run r1, which is running
            w2 closes r1: written
            r2 starts: written
            w1 writes r1: LeaseLost: the lease on run r1 was lost
            r4 starts: ThreadBusy: running: thread t2 is held by run r3, which is running
            w2 closes r3: written
            r4 starts: written"#]],
    );
}

/// Eight first commits of eight new runs on one thread at once, without messages (so the
/// message guard lets every one through): exactly one is written, and the others are
/// `ThreadBusy` naming it. On brand-new threads (no row yet to lock) and on a thread that
/// holds a finished run and messages.
pub async fn concurrent_new_runs_one_holds_the_thread(h: &Harness) {
    const RUNS: usize = 8;
    let s = &*h.store;
    let handle = tokio::runtime::Handle::current();
    for round in 0..6 {
        let thread = format!("t{round}");
        let existing = round % 2 == 1;
        let expected = if existing {
            let mut first = step(&thread, &format!("{thread}-first"), 0, 1, 1_000);
            first.run.status = RunStatus::Done;
            first.run.termination = Some(TerminationReason::NaturalEnd);
            s.commit(&first)
                .await
                .expect("a finished run")
                .message_count
        } else {
            0
        };
        let commits: Vec<ThreadCommit> = (0..RUNS)
            .map(|i| {
                ThreadCommit::new(
                    tid(&thread),
                    record(&format!("{thread}-r{i}"), RunStatus::Running, 2_000),
                    expected,
                )
            })
            .collect();
        let start = std::sync::Barrier::new(RUNS);
        let results: Vec<_> = tokio::task::block_in_place(|| {
            std::thread::scope(|scope| {
                let writers: Vec<_> = commits
                    .iter()
                    .map(|c| {
                        let (start, handle) = (&start, &handle);
                        scope.spawn(move || {
                            start.wait();
                            handle.block_on(s.commit(c))
                        })
                    })
                    .collect();
                writers
                    .into_iter()
                    .map(|w| w.join().expect("writer"))
                    .collect()
            })
        });
        let winners: Vec<usize> = (0..RUNS).filter(|i| results[*i].is_ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let winner = commits[winners[0]].run.run_id.clone();
        for (i, r) in results.iter().enumerate() {
            if i != winners[0] {
                assert!(
                    matches!(
                        r,
                        Err(CommitError::ThreadBusy { run_id, status: RunStatus::Running, .. })
                            if *run_id == winner
                    ),
                    "round {round}, run {i}: {r:?}"
                );
            }
        }
        let cp = s
            .load_checkpoint(&tid(&thread))
            .await
            .expect("load")
            .expect("thread");
        assert_eq!(cp.run.as_ref().map(|r| &r.run_id), Some(&winner));
        assert_eq!(cp.message_count(), expected);
        let unfinished: Vec<RunId> = s
            .list_runs(&tid(&thread))
            .await
            .expect("runs")
            .into_iter()
            .filter(|r| r.status != RunStatus::Done)
            .map(|r| r.run_id)
            .collect();
        assert_eq!(unfinished, [winner], "round {round}");
    }
}

/// A model's tool-call arguments nested as deep as JSON parsing allows (`serde_json` reads 128
/// levels) are stored a few levels further down, in the message, the batch and an event: the
/// thread reads back whole, with the same values.
pub async fn deeply_nested_arguments_read_back(h: &Harness) {
    let s = &*h.store;
    let arguments = (0..126).fold(json!(1), |v, _| json!([v]));
    let call = ToolCall::new(
        ToolCallId::new("deep").expect("id"),
        "echo",
        arguments.clone(),
    );
    let commit = ThreadCommit::new(tid("t1"), run("r1", 1_000), 0)
        .with_messages([
            Message::user("go"),
            Message::assistant_with_calls("", vec![call.clone()]),
        ])
        .with_batch(ToolBatch::of_shared(&std::sync::Arc::from([call])).expect("batch"))
        .with_events([
            AgentEvent::StepStart { step: 1 },
            AgentEvent::ToolCallReady {
                call_id: ToolCallId::new("deep").expect("id"),
                name: "echo".into(),
                arguments: arguments.clone().into(),
            },
        ]);
    s.commit(&commit).await.expect("a deep value is stored");
    let cp = s
        .load_checkpoint(&tid("t1"))
        .await
        .expect("the thread reads back")
        .expect("thread");
    assert_eq!(*cp.messages[1].tool_calls[0].arguments, arguments);
    let batch = cp.batch.expect("batch");
    assert_eq!(*batch.calls()[0].call().arguments, arguments);
    let events = s
        .load_events(&tid("t1"), 0)
        .await
        .expect("events read back");
    assert!(matches!(
        &events[1].event,
        AgentEvent::ToolCallReady { arguments: a, .. } if **a == arguments
    ));
}
