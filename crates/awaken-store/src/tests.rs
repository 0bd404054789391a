use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use awaken_event::{
    AgentEvent, RunId, SuspendTicket, TerminationReason, ThreadId, ToolCall, ToolCallId, ToolResult,
};
use awaken_state::PersistedState;
use awaken_tool::{BatchError, ToolBatch};
use serde_json::json;

use super::*;

fn commit() -> ThreadCommit {
    let run_id = RunId::new("r1").expect("id");
    let run = RunRecord::new(run_id, "assistant", Timestamp::from_unix_millis(10));
    ThreadCommit::new(ThreadId::new("t1").expect("id"), run, 0)
}

fn violation(c: &ThreadCommit) -> String {
    c.validate()
        .err()
        .map_or("ok".to_owned(), |v| v.to_string())
}

#[test]
fn a_plain_commit_is_valid() {
    assert_eq!(violation(&commit()), "ok");
    assert_eq!(commit().message_count_after(), 0);
}

#[test]
fn status_and_termination_must_agree() {
    let mut table = String::new();
    for status in [RunStatus::Running, RunStatus::Waiting, RunStatus::Done] {
        for termination in [
            None,
            Some(TerminationReason::Suspended),
            Some(TerminationReason::NaturalEnd),
        ] {
            let mut c = commit();
            c.run.status = status;
            c.run.termination = termination.clone();
            table.push_str(&format!(
                "{status} {:?}: {}\n",
                termination.map(|t| t.kind()),
                violation(&c)
            ));
        }
    }
    expect_test::expect![[r#"
        running None: ok
        running Some("suspended"): a running run cannot have termination suspended
        running Some("natural_end"): a running run cannot have termination natural_end
        waiting None: a waiting run cannot have termination none
        waiting Some("suspended"): ok
        waiting Some("natural_end"): a waiting run cannot have termination natural_end
        done None: a done run cannot have termination none
        done Some("suspended"): a done run cannot have termination suspended
        done Some("natural_end"): ok
    "#]]
    .assert_eq(&table);
}

#[test]
fn blank_ids_own_parent_and_time_travel_are_rejected() {
    let mut c = commit();
    c.run.agent_id = "".into();
    assert_eq!(violation(&c), "agent_id is blank");
    let mut c = commit();
    c.run.parent_run_id = Some(c.run.run_id.clone());
    assert_eq!(violation(&c), "run r1 names itself as its parent");
    let mut c = commit();
    c.run.updated_at = Timestamp::from_unix_millis(9);
    assert_eq!(violation(&c), "updated_at 9ms is before created_at 10ms");
    let c = commit().with_lease(LeaseToken {
        run_id: RunId::new("r1").expect("id"),
        worker_id: "  ".to_owned(),
        epoch: 1,
    });
    assert_eq!(violation(&c), "lease.worker_id is blank");
}

#[test]
fn profile_deltas_need_a_profile_and_a_guard_per_key() {
    let delta = PersistedState {
        revision: 1,
        values: BTreeMap::from([("k".to_owned(), json!(1))]),
    };
    let c = commit().with_profile_state(delta.clone(), BTreeMap::new());
    assert_eq!(
        violation(&c),
        "profile state is written but the run has no profile id"
    );
    let mut c = commit().with_profile_state(delta.clone(), BTreeMap::new());
    c.run.profile_id = Some(awaken_event::ProfileId::new("p").expect("id"));
    assert_eq!(
        violation(&c),
        "profile key \"k\" is written without the version it was read at"
    );
    c.profile_versions.insert("k".to_owned(), 0);
    assert_eq!(violation(&c), "ok");
}

#[test]
fn only_lifecycle_events_are_stored() {
    let c = commit().with_events([AgentEvent::StepStart { step: 1 }]);
    assert_eq!(violation(&c), "ok");
    let c = commit().with_events([AgentEvent::ReasoningDelta {
        delta: "x".to_owned(),
    }]);
    assert_eq!(
        violation(&c),
        "event reasoning_delta is not a lifecycle event and is not stored"
    );
}

#[test]
fn a_finished_run_cannot_hold_an_open_call() {
    let id = |s: &str| ToolCallId::new(s).expect("id");
    // Call `a` succeeded; call `b` is moved by `to_b`.
    let batch = |to_b: fn(&mut ToolBatch, &ToolCallId) -> Result<(), BatchError>| {
        let mut batch = ToolBatch::new(["a", "b"].map(|c| ToolCall::new(id(c), "t", json!({}))))
            .expect("batch");
        batch.start(&id("a")).expect("start");
        batch
            .succeed(&id("a"), ToolResult::success(json!(1)))
            .expect("succeed");
        to_b(&mut batch, &id("b")).expect("move b");
        batch
    };
    let moves: [(
        fn(&mut ToolBatch, &ToolCallId) -> Result<(), BatchError>,
        &str,
    ); 5] = [
        (
            |_, _| Ok(()),
            "the run is done but tool call b is still Requested",
        ),
        (
            |b, id| b.start(id),
            "the run is done but tool call b is still Executing",
        ),
        (
            |b, id| {
                let call = b.get(id).expect("b").call().clone();
                let ticket = SuspendTicket {
                    suspension_id: "s".into(),
                    call: awaken_tool::pending_call(&call),
                    message: "ok?".into(),
                    response_schema: None,
                    resume_mode: Default::default(),
                };
                b.suspend(id, ticket)
            },
            "the run is done but tool call b is still Suspended",
        ),
        (
            |b, id| {
                b.start(id)
                    .and_then(|()| b.fail(id, ToolResult::error("no")))
            },
            "ok",
        ),
        (
            |b, id| b.start(id).and_then(|()| b.close_outcome_unknown(id)),
            "ok",
        ),
    ];
    for (to_b, expected) in moves {
        let mut c = commit().with_batch(batch(to_b));
        c.run.status = RunStatus::Done;
        c.run.termination = Some(TerminationReason::NaturalEnd);
        assert_eq!(violation(&c), expected);
        // A running run may hold it.
        let c = commit().with_batch(batch(to_b));
        assert_eq!(violation(&c), "ok");
    }
}

#[test]
fn timestamps_convert_and_saturate() {
    let t = Timestamp::from_system_time(UNIX_EPOCH + Duration::from_millis(1_500));
    assert_eq!(t.as_unix_millis(), 1_500);
    assert_eq!(
        t.saturating_add(Duration::from_secs(2)).as_unix_millis(),
        3_500
    );
    assert_eq!(
        Timestamp::from_unix_millis(i64::MAX)
            .saturating_add(Duration::from_secs(1))
            .as_unix_millis(),
        i64::MAX
    );
    assert_eq!(
        Timestamp::from_system_time(UNIX_EPOCH - Duration::from_secs(1)),
        Timestamp::EPOCH
    );
    for s in [RunStatus::Running, RunStatus::Waiting, RunStatus::Done] {
        assert_eq!(RunStatus::parse(s.as_str()), Some(s));
    }
    assert_eq!(RunStatus::parse("paused"), None);
}

#[test]
fn a_failpoint_fires_once_and_only_where_armed() {
    let fp = failpoint::Failpoints::default();
    assert!(fp.check(FailPoint::AfterRun).is_ok());
    fp.arm(FailPoint::AfterRun);
    assert!(fp.check(FailPoint::AfterMessages).is_ok());
    assert!(matches!(
        fp.check(FailPoint::AfterRun),
        Err(StoreError::Injected {
            point: FailPoint::AfterRun
        })
    ));
    assert!(fp.check(FailPoint::AfterRun).is_ok());
}

#[test]
fn refusals_and_backend_failures_are_told_apart_and_render_their_fields() {
    let e = CommitError::VersionConflict {
        expected: 3,
        actual: 5,
    };
    assert!(e.is_conflict() && e.is_refusal());
    assert_eq!(
        e.to_string(),
        "stale message guard: the commit expected 3 messages, the thread holds 5"
    );
    let e = CommitError::LeaseLost {
        run_id: RunId::new("r9").expect("id"),
    };
    assert!(!e.is_conflict() && e.is_refusal());
    assert_eq!(e.to_string(), "the lease on run r9 was lost");
    // A backend failure is neither; it reads as the store's own error.
    let e = CommitError::from(StoreError::Injected {
        point: FailPoint::AfterRun,
    });
    assert!(!e.is_conflict() && !e.is_refusal());
    assert_eq!(e.to_string(), "injected failure at AfterRun");
    let e = LeaseError::Lost {
        run_id: RunId::new("r9").expect("id"),
    };
    assert_eq!(e.to_string(), "the lease on run r9 was lost");
}
