//! The PostgreSQL run queue: claim order and due times, one job per thread, concurrent
//! claimers, leases and their loss, retries and dead letters, and the fleet's notifications.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Duration;

use awaken_event::Message;
use awaken_store::{
    ClaimedJob, DeadJob, Enqueued, FleetListener, FleetWake, Hear, JobBeat, JobId, JobState,
    NewJob, PostgresConfig, PostgresStore, QueueDepth, QueueError, Retried, RunQueue, SteerAnswer,
    SteerId, ThreadJob,
};
use expect_test::expect;
use serde_json::json;

use crate::backends::{postgres_store, postgres_url};
use crate::conformance::{at, rid, tid};

const LEASE: Duration = Duration::from_secs(10);

/// How long a notification may take before a listener test fails (never waited out on success).
const WAKE_BOUND: Duration = Duration::from_secs(30);

/// A job for agent `a` on `thread` (run `r-<thread>`), due now.
fn job(thread: &str) -> NewJob {
    NewJob::new(
        tid(thread),
        rid(&format!("r-{thread}")),
        "a",
        json!({ "thread": thread }),
    )
}

fn queued(outcome: Enqueued) -> JobId {
    match outcome {
        Enqueued::Queued { job_id, .. } => job_id,
        busy => panic!("expected a queued job, got {busy:?}"),
    }
}

async fn enqueue(queue: &RunQueue, job: &NewJob, now: i64) -> JobId {
    queued(queue.enqueue(job, at(now)).await.expect("enqueue"))
}

async fn claim(queue: &RunQueue, worker: &str, now: i64, limit: usize) -> Vec<ClaimedJob> {
    queue
        .claim(worker, LEASE, at(now), limit, None)
        .await
        .expect("claim")
}

async fn claim_one(queue: &RunQueue, worker: &str, now: i64) -> ClaimedJob {
    let mut jobs = claim(queue, worker, now, 1).await;
    assert_eq!(jobs.len(), 1, "{}", show(&jobs));
    jobs.remove(0)
}

/// Claimed jobs, one line each.
fn show(jobs: &[ClaimedJob]) -> String {
    let mut out = String::new();
    for j in jobs {
        let _ = writeln!(
            out,
            "{} {} agent={} prio={} attempts={}/{} lease={}#{} expires={} enqueued={} \
             cancel={} last_error={:?} payload={}",
            j.thread_id,
            j.run_id,
            j.agent_id,
            j.priority,
            j.attempts,
            j.max_attempts,
            j.lease.worker_id,
            j.lease.attempt,
            j.expires_at.as_unix_millis(),
            j.enqueued_at.as_unix_millis(),
            j.cancel_requested,
            j.last_error,
            j.payload,
        );
    }
    out
}

fn threads(jobs: &[ClaimedJob]) -> Vec<String> {
    jobs.iter().map(|j| j.thread_id.to_string()).collect()
}

fn depth(queued: u64, claimed: u64, dead: u64) -> QueueDepth {
    QueueDepth {
        queued,
        claimed,
        dead,
    }
}

fn lost(result: Result<impl std::fmt::Debug, QueueError>, job_id: JobId) {
    match result {
        Err(QueueError::Lost { job_id: id }) => assert_eq!(id, job_id),
        other => panic!("expected the lease on {job_id} to be lost, got {other:?}"),
    }
}

/// A second store (another worker's pool) on `test`'s schema.
async fn second_store(test: &str) -> PostgresStore {
    let url = postgres_url().expect("url is set when the first store exists");
    PostgresStore::connect(
        PostgresConfig::new(url)
            .with_schema(format!("awaken_t_{test}"))
            .with_max_connections(4),
    )
    .await
    .expect("second store")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_by_priority_then_enqueue_order_when_due() {
    let Some(store) = postgres_store("queue_claim_order").await else {
        return;
    };
    let queue = store.queue();
    let high = |t: &str| NewJob {
        priority: 5,
        ..job(t)
    };
    enqueue(&queue, &job("t1"), 1_000).await;
    enqueue(&queue, &high("t2"), 1_001).await;
    enqueue(&queue, &job("t3"), 1_002).await;
    enqueue(
        &queue,
        &NewJob {
            not_before: at(5_000),
            ..high("t4")
        },
        1_003,
    )
    .await;
    let payload = json!({
        "text": "ünïcode \t\"quoted\" \\ and a NUL-free line\n",
        "nested": [1, 2.5, null, true, { "deep": [[]] }],
        "big": 9_007_199_254_740_991_i64,
    });
    let t5 = enqueue(
        &queue,
        &NewJob {
            priority: -1,
            max_attempts: 7,
            payload: payload.clone(),
            after_event: 41,
            ..job("t5")
        },
        1_004,
    )
    .await;
    enqueue(
        &queue,
        &NewJob {
            agent_id: "b".into(),
            ..high("t6")
        },
        1_005,
    )
    .await;
    assert_eq!(queue.depth(at(2_000)).await.expect("depth"), depth(6, 0, 0));
    // A thread's job, with where its events start.
    assert_eq!(
        queue.job_of_thread(&tid("t5")).await.expect("job"),
        Some(ThreadJob {
            job_id: t5,
            run_id: rid("r-t5"),
            after_event: 41,
        })
    );
    assert_eq!(
        queue
            .job_of_thread(&tid("t1"))
            .await
            .expect("job")
            .map(|j| j.after_event),
        Some(0)
    );

    // One at a time, so the order is the database's, not a sort of one batch.
    let mut order = Vec::new();
    for _ in 0..4 {
        let got = queue
            .claim("w1", LEASE, at(2_000), 1, Some(&["a".to_owned()]))
            .await
            .expect("claim");
        order.extend(threads(&got));
    }
    assert_eq!(order, ["t2", "t1", "t3", "t5"]);
    let rest = queue
        .claim("w1", LEASE, at(2_000), 10, Some(&["a".to_owned()]))
        .await
        .expect("claim");
    assert!(rest.is_empty(), "{}", show(&rest));
    assert_eq!(queue.depth(at(2_000)).await.expect("depth"), depth(2, 4, 0));

    // The other agent's job, then the one not due before 5 000.
    let b = claim(&queue, "w2", 4_999, 10).await;
    assert_eq!(threads(&b), ["t6"]);
    let due = claim(&queue, "w2", 5_000, 10).await;
    expect![[r#"
        t4 r-t4 agent=a prio=5 attempts=1/3 lease=w2#1 expires=15000 enqueued=1003 cancel=false last_error=None payload={"thread":"t4"}
    "#]]
    .assert_eq(&show(&due));

    // A batch comes back in claim order, and the payload as it was queued.
    let store2 = postgres_store("queue_claim_batch").await.expect("store");
    let queue2 = store2.queue();
    enqueue(&queue2, &job("t1"), 1_000).await;
    enqueue(&queue2, &high("t2"), 1_001).await;
    enqueue(
        &queue2,
        &NewJob {
            priority: -1,
            max_attempts: 7,
            payload: payload.clone(),
            ..job("t5")
        },
        1_002,
    )
    .await;
    enqueue(&queue2, &job("t3"), 1_003).await;
    let batch = claim(&queue2, "w1", 2_000, 10).await;
    expect![[r#"
        t2 r-t2 agent=a prio=5 attempts=1/3 lease=w1#1 expires=12000 enqueued=1001 cancel=false last_error=None payload={"thread":"t2"}
        t1 r-t1 agent=a prio=0 attempts=1/3 lease=w1#1 expires=12000 enqueued=1000 cancel=false last_error=None payload={"thread":"t1"}
        t3 r-t3 agent=a prio=0 attempts=1/3 lease=w1#1 expires=12000 enqueued=1003 cancel=false last_error=None payload={"thread":"t3"}
        t5 r-t5 agent=a prio=-1 attempts=1/7 lease=w1#1 expires=12000 enqueued=1002 cancel=false last_error=None payload={"big":9007199254740991,"nested":[1,2.5,null,true,{"deep":[[]]}],"text":"ünïcode \t\"quoted\" \\ and a NUL-free line\n"}
    "#]]
    .assert_eq(&show(&batch));
    assert_eq!(batch[3].payload, payload);

    // A blank worker id is refused before anything is claimed.
    enqueue(&queue2, &job("t7"), 3_000).await;
    let blank = queue2.claim("  ", LEASE, at(3_000), 1, None).await;
    assert!(blank.is_err(), "{blank:?}");
    assert_eq!(threads(&claim(&queue2, "w1", 3_000, 1).await), ["t7"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_holds_one_job_at_a_time() {
    let Some(store) = postgres_store("queue_one_per_thread").await else {
        return;
    };
    let queue = store.queue();
    let first = enqueue(&queue, &job("t1"), 1_000).await;
    let other = enqueue(&queue, &job("t2"), 1_000).await;
    assert_ne!(first, other);

    // Queued, then claimed: the thread is busy with the first job either way.
    let again = NewJob {
        run_id: rid("r-second"),
        ..job("t1")
    };
    assert_eq!(
        queue.enqueue(&again, at(1_001)).await.expect("enqueue"),
        Enqueued::ThreadBusy(first)
    );
    let claimed = claim(&queue, "w1", 2_000, 1).await;
    assert_eq!(claimed[0].lease.job_id, first);
    assert_eq!(
        queue.enqueue(&again, at(2_001)).await.expect("enqueue"),
        Enqueued::ThreadBusy(first)
    );
    assert_eq!(
        queue
            .job_of_thread(&tid("t1"))
            .await
            .expect("job of thread")
            .map(|j| (j.job_id, j.run_id)),
        Some((first, rid("r-t1")))
    );

    // Completed: the row is gone and the thread takes a new job, with a new number.
    queue.complete(&claimed[0].lease).await.expect("complete");
    assert_eq!(queue.job_state(first).await.expect("state"), JobState::Gone);
    assert_eq!(
        queue
            .job_of_thread(&tid("t1"))
            .await
            .expect("job of thread"),
        None
    );
    let second = enqueue(&queue, &again, 3_000).await;
    assert!(second > first && second != other, "{second} after {first}");
    assert_eq!(
        queue
            .job_of_thread(&tid("t1"))
            .await
            .expect("job of thread")
            .map(|j| (j.job_id, j.run_id)),
        Some((second, rid("r-second")))
    );
    assert_eq!(
        queue.job_state(JobId(i64::MAX)).await.expect("state"),
        JobState::Gone
    );

    // Enqueued at once on one thread: one is queued, the others find it.
    let other = second_store("queue_one_per_thread").await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let queue = if i % 2 == 0 {
            store.queue()
        } else {
            other.queue()
        };
        tasks.push(tokio::spawn(async move {
            queue
                .enqueue(&job("t3"), at(4_000 + i))
                .await
                .expect("enqueue")
        }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("enqueuer"));
    }
    let winners: Vec<JobId> = outcomes
        .iter()
        .filter_map(|o| match o {
            Enqueued::Queued { job_id, .. } => Some(*job_id),
            Enqueued::ThreadBusy(_) => None,
        })
        .collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    assert!(
        outcomes.iter().all(
            |o| matches!(o, Enqueued::Queued { job_id: id, .. } | Enqueued::ThreadBusy(id) if *id == winners[0])
        ),
        "{outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_take_every_job_once() {
    const JOBS: usize = 200;
    let Some(store) = postgres_store("queue_concurrent").await else {
        return;
    };
    let other = second_store("queue_concurrent").await;
    let queue = store.queue();
    let mut all = BTreeSet::new();
    for i in 0..JOBS {
        all.insert(enqueue(&queue, &job(&format!("t{i}")), 1_000).await);
    }
    let mut tasks = Vec::new();
    for w in 0..8 {
        // Half the claimers on each pool, as two workers of a fleet.
        let queue = if w % 2 == 0 {
            store.queue()
        } else {
            other.queue()
        };
        tasks.push(tokio::spawn(async move {
            let worker = format!("w{w}");
            let mut mine = Vec::new();
            loop {
                let got = queue
                    .claim(&worker, LEASE, at(2_000), 1 + w % 3, None)
                    .await
                    .expect("claim");
                if got.is_empty() {
                    // Whatever is left is locked by claims under way, which take it.
                    return mine;
                }
                mine.extend(got.into_iter().map(|j| (j.lease.job_id, j.attempts)));
            }
        }));
    }
    let mut seen = Vec::new();
    for task in tasks {
        seen.extend(task.await.expect("claimer"));
    }
    assert!(
        seen.iter().all(|&(_, attempts)| attempts == 1),
        "a job was claimed twice: {seen:?}"
    );
    let ids: Vec<JobId> = seen.iter().map(|&(id, _)| id).collect();
    let unique: BTreeSet<JobId> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "duplicate claims");
    assert_eq!(unique, all, "every job claimed");
    assert_eq!(
        queue.depth(at(2_000)).await.expect("depth"),
        depth(0, JOBS as u64, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_renewed_and_lost_once_another_worker_claims() {
    let Some(store) = postgres_store("queue_lease").await else {
        return;
    };
    let queue = store.queue();
    let id = enqueue(&queue, &job("t1"), 1_000).await;
    let first = claim_one(&queue, "w1", 1_000).await;
    assert_eq!(first.expires_at, at(11_000));

    assert_eq!(
        queue
            .heartbeat(&first.lease, LEASE, at(5_000))
            .await
            .expect("beat"),
        JobBeat {
            expires_at: at(15_000),
            cancel_requested: false,
            steering_waiting: false,
        }
    );
    assert_eq!(
        queue.request_cancel(&tid("t1")).await.expect("cancel"),
        Some(id)
    );
    assert_eq!(
        queue.request_cancel(&tid("nobody")).await.expect("cancel"),
        None
    );
    assert_eq!(
        queue
            .heartbeat(&first.lease, LEASE, at(6_000))
            .await
            .expect("beat"),
        JobBeat {
            expires_at: at(16_000),
            cancel_requested: true,
            steering_waiting: false,
        }
    );
    assert_eq!(
        queue.job_state(id).await.expect("state"),
        JobState::Pending {
            attempts: 1,
            claimed_by: Some("w1".into()),
            last_error: None
        }
    );
    assert_eq!(
        queue.depth(at(15_999)).await.expect("depth"),
        depth(0, 1, 0)
    );
    assert_eq!(
        queue.depth(at(16_000)).await.expect("depth"),
        depth(1, 0, 0)
    );

    // Live until the renewed expiry; then another worker takes it over, cancel and all.
    assert!(claim(&queue, "w2", 15_999, 1).await.is_empty());
    let second = claim_one(&queue, "w2", 16_000).await;
    expect![[r#"
        t1 r-t1 agent=a prio=0 attempts=2/3 lease=w2#2 expires=26000 enqueued=1000 cancel=true last_error=None payload={"thread":"t1"}
    "#]]
    .assert_eq(&show(std::slice::from_ref(&second)));

    lost(queue.heartbeat(&first.lease, LEASE, at(16_001)).await, id);
    lost(
        queue
            .retry(&first.lease, "late", at(17_000), at(16_001))
            .await,
        id,
    );
    lost(
        queue.dead_letter(&first.lease, "late", at(16_001)).await,
        id,
    );
    lost(queue.complete(&first.lease).await, id);
    assert!(!queue.release(&first.lease).await.expect("release"));
    // The stale holder changed nothing.
    assert_eq!(
        queue.job_state(id).await.expect("state"),
        JobState::Pending {
            attempts: 2,
            claimed_by: Some("w2".into()),
            last_error: None
        }
    );

    // The same worker claiming its own expired job again holds a new lease.
    let third = claim_one(&queue, "w2", 26_000).await;
    assert_eq!((third.attempts, third.lease.attempt), (3, 3));
    lost(queue.heartbeat(&second.lease, LEASE, at(26_001)).await, id);
    lost(queue.complete(&second.lease).await, id);
    queue.complete(&third.lease).await.expect("complete");
    assert_eq!(queue.job_state(id).await.expect("state"), JobState::Gone);
    lost(queue.complete(&third.lease).await, id);
    lost(queue.heartbeat(&third.lease, LEASE, at(26_002)).await, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_job_is_retried_then_dead_lettered() {
    let Some(store) = postgres_store("queue_retry").await else {
        return;
    };
    let queue = store.queue();
    let id = enqueue(
        &queue,
        &NewJob {
            max_attempts: 2,
            ..job("t1")
        },
        1_000,
    )
    .await;
    let first = claim_one(&queue, "w1", 1_000).await;
    assert_eq!(
        queue
            .retry(&first.lease, "boom 1", at(3_000), at(1_500))
            .await
            .expect("retry"),
        Retried::Requeued(at(3_000))
    );
    assert_eq!(
        queue.job_state(id).await.expect("state"),
        JobState::Pending {
            attempts: 1,
            claimed_by: None,
            last_error: Some("boom 1".into())
        }
    );
    assert_eq!(queue.depth(at(1_500)).await.expect("depth"), depth(1, 0, 0));
    // Given back: the old lease is gone.
    lost(queue.heartbeat(&first.lease, LEASE, at(1_600)).await, id);
    assert!(claim(&queue, "w1", 2_999, 1).await.is_empty());
    assert_eq!(
        queue.next_due(at(2_999), None).await.expect("next due"),
        Some(at(3_000))
    );

    let second = claim_one(&queue, "w2", 3_000).await;
    expect![[r#"
        t1 r-t1 agent=a prio=0 attempts=2/2 lease=w2#2 expires=13000 enqueued=1000 cancel=false last_error=Some("boom 1") payload={"thread":"t1"}
    "#]]
    .assert_eq(&show(std::slice::from_ref(&second)));
    assert_eq!(
        queue
            .retry(&second.lease, "boom 2", at(5_000), at(3_500))
            .await
            .expect("retry"),
        Retried::Dead
    );
    assert_eq!(
        queue.job_state(id).await.expect("state"),
        JobState::Dead {
            attempts: 2,
            error: "boom 2".into()
        }
    );
    lost(
        queue
            .retry(&second.lease, "again", at(5_000), at(3_600))
            .await,
        id,
    );
    assert!(claim(&queue, "w1", 10_000, 1).await.is_empty());
    assert_eq!(queue.next_due(at(10_000), None).await.expect("due"), None);
    assert_eq!(queue.depth(at(4_000)).await.expect("depth"), depth(0, 0, 1));
    assert_eq!(
        queue.dead_letters(10).await.expect("dead letters"),
        [DeadJob {
            job_id: id,
            thread_id: tid("t1"),
            run_id: rid("r-t1"),
            agent_id: "a".into(),
            attempts: 2,
            enqueued_at: at(1_000),
            died_at: at(3_500),
            error: "boom 2".into(),
        }]
    );

    // The thread is free; a job that fails beyond mending goes straight to the dead letters,
    // which list the newest first.
    assert_eq!(queue.job_of_thread(&tid("t1")).await.expect("job"), None);
    let next = enqueue(&queue, &job("t1"), 4_000).await;
    let third = claim_one(&queue, "w1", 4_000).await;
    assert_eq!(third.lease.job_id, next);
    assert_eq!((third.attempts, third.last_error.as_deref()), (1, None));
    queue
        .dead_letter(&third.lease, "bad input", at(4_500))
        .await
        .expect("dead letter");
    lost(queue.complete(&third.lease).await, next);
    let dead: Vec<(JobId, u32, String)> = queue
        .dead_letters(10)
        .await
        .expect("dead letters")
        .into_iter()
        .map(|d| (d.job_id, d.attempts, d.error))
        .collect();
    assert_eq!(
        dead,
        [(next, 1, "bad input".into()), (id, 2, "boom 2".into())]
    );
    assert_eq!(queue.dead_letters(1).await.expect("dead letters").len(), 1);
    assert_eq!(queue.depth(at(5_000)).await.expect("depth"), depth(0, 0, 2));

    // One attempt allowed: the first retry dead-letters.
    enqueue(
        &queue,
        &NewJob {
            max_attempts: 1,
            ..job("t2")
        },
        5_000,
    )
    .await;
    let only = claim_one(&queue, "w1", 5_000).await;
    assert_eq!(
        queue
            .retry(&only.lease, "once", at(6_000), at(5_100))
            .await
            .expect("retry"),
        Retried::Dead
    );
    assert_eq!(queue.depth(at(5_100)).await.expect("depth"), depth(0, 0, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_job_is_claimable_at_once_without_an_attempt() {
    let Some(store) = postgres_store("queue_release").await else {
        return;
    };
    let queue = store.queue();
    let id = enqueue(&queue, &job("t1"), 1_000).await;
    let first = claim_one(&queue, "w1", 1_000).await;
    assert!(queue.release(&first.lease).await.expect("release"));
    assert!(!queue.release(&first.lease).await.expect("release twice"));
    assert_eq!(
        queue.job_state(id).await.expect("state"),
        JobState::Pending {
            attempts: 0,
            claimed_by: None,
            last_error: None
        }
    );
    assert_eq!(queue.depth(at(1_001)).await.expect("depth"), depth(1, 0, 0));

    // Claimed again by the same worker: still the first attempt, under a new lease that the
    // given-up one does not match.
    let second = claim_one(&queue, "w1", 1_001).await;
    assert_eq!(second.attempts, 1);
    assert_ne!(second.lease, first.lease);
    lost(queue.heartbeat(&first.lease, LEASE, at(1_002)).await, id);
    lost(queue.complete(&first.lease).await, id);
    lost(
        queue
            .retry(&first.lease, "stale", at(1_002), at(1_002))
            .await,
        id,
    );
    queue
        .heartbeat(&second.lease, LEASE, at(1_003))
        .await
        .expect("beat");
    queue.complete(&second.lease).await.expect("complete");
    assert_eq!(queue.job_state(id).await.expect("state"), JobState::Gone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_due_is_the_soonest_due_time_or_lease_expiry() {
    let Some(store) = postgres_store("queue_next_due").await else {
        return;
    };
    let queue = store.queue();
    assert_eq!(queue.next_due(at(1_000), None).await.expect("due"), None);
    let later = |t: &str, ms: i64| NewJob {
        not_before: at(ms),
        ..job(t)
    };
    enqueue(&queue, &later("t1", 8_000), 1_000).await;
    enqueue(&queue, &later("t2", 5_000), 1_000).await;
    enqueue(
        &queue,
        &NewJob {
            agent_id: "b".into(),
            ..later("t3", 3_000)
        },
        1_000,
    )
    .await;
    assert_eq!(
        queue.next_due(at(1_000), None).await.expect("due"),
        Some(at(3_000))
    );
    let only_a = ["a".to_owned()];
    assert_eq!(
        queue.next_due(at(1_000), Some(&only_a)).await.expect("due"),
        Some(at(5_000))
    );
    assert_eq!(
        queue
            .next_due(at(1_000), Some(&["c".to_owned()]))
            .await
            .expect("due"),
        None
    );

    // t2 claimed at 5 000 under a one-second lease: due again when it expires.
    let held = queue
        .claim("w1", Duration::from_secs(1), at(5_000), 1, Some(&only_a))
        .await
        .expect("claim");
    assert_eq!(threads(&held), ["t2"]);
    assert_eq!(
        queue.next_due(at(5_500), Some(&only_a)).await.expect("due"),
        Some(at(6_000))
    );
    // A job claimable now is due now (or earlier).
    let due = queue.next_due(at(7_000), None).await.expect("due");
    assert!(due.is_some_and(|d| d <= at(7_000)), "{due:?}");
}

/// The ids and texts of the steering messages `lease`'s claim is handed.
async fn delivered(queue: &RunQueue, job: &ClaimedJob) -> Vec<(SteerId, String)> {
    queue
        .deliver_steering(&job.lease)
        .await
        .expect("deliver")
        .into_iter()
        .map(|m| (m.id, m.message.text()))
        .collect()
}

async fn steer(queue: &RunQueue, thread: &str, text: &str, now: i64) -> Option<SteerId> {
    queue
        .steer(&tid(thread), &Message::user(text), at(now))
        .await
        .expect("steer")
}

async fn answer(queue: &RunQueue, id: SteerId) -> SteerAnswer {
    queue.steer_answer(id).await.expect("answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steering_message_reaches_each_claim_once_and_is_answered_once() {
    let Some(store) = postgres_store("queue_steer").await else {
        return;
    };
    let queue = store.queue();
    let mut listener = queue.listen(Hear::All);
    listener.ready().await;
    assert_eq!(steer(&queue, "t1", "too early", 500).await, None);
    enqueue(&queue, &job("t1"), 1_000).await;
    assert_eq!(next(&mut listener).await, FleetWake::Job);

    // Sent while the job is queued: the claim says it has one, and is handed it once.
    let first = steer(&queue, "t1", "turn left", 1_000)
        .await
        .expect("stored");
    assert_eq!(next(&mut listener).await, FleetWake::Steer(tid("t1")));
    let w1 = claim_one(&queue, "w1", 1_000).await;
    assert!(w1.steering);
    let beat = queue
        .heartbeat(&w1.lease, LEASE, at(2_000))
        .await
        .expect("beat");
    assert!(beat.steering_waiting);
    assert_eq!(
        delivered(&queue, &w1).await,
        [(first, "turn left".to_owned())]
    );
    assert_eq!(delivered(&queue, &w1).await, []);
    let beat = queue
        .heartbeat(&w1.lease, LEASE, at(3_000))
        .await
        .expect("beat");
    assert!(!beat.steering_waiting);
    assert_eq!(answer(&queue, first).await, SteerAnswer::Waiting);

    // Answered: its sender is told, reads the answer once.
    let second = steer(&queue, "t1", "and right", 3_000)
        .await
        .expect("stored");
    assert_eq!(next(&mut listener).await, FleetWake::Steer(tid("t1")));
    assert_eq!(
        delivered(&queue, &w1).await,
        [(second, "and right".to_owned())]
    );
    queue
        .settle_steering(&[(second, Some(3))], at(3_000))
        .await
        .expect("settle");
    assert_eq!(next(&mut listener).await, FleetWake::Steered(tid("t1")));
    assert_eq!(answer(&queue, second).await, SteerAnswer::Taken { step: 3 });
    assert_eq!(answer(&queue, second).await, SteerAnswer::Unknown);

    // The claim stops unanswered: the next one is handed the message again; the earlier claim
    // is handed nothing more.
    let w2 = claim_one(&queue, "w2", 3_000 + LEASE.as_millis() as i64).await;
    assert!(w2.steering);
    let third = steer(&queue, "t1", "stop", 20_000).await.expect("stored");
    assert_eq!(delivered(&queue, &w1).await, []);
    assert_eq!(
        delivered(&queue, &w2).await,
        [(first, "turn left".to_owned()), (third, "stop".to_owned())]
    );
    // Settled once: a later settling changes nothing.
    for settled in [None, Some(9)] {
        queue
            .settle_steering(&[(first, settled)], at(20_000))
            .await
            .expect("settle");
    }
    assert_eq!(answer(&queue, first).await, SteerAnswer::NotTaken);

    // The job's messages not answered yet.
    assert_eq!(
        queue
            .unanswered_steering(w2.lease.job_id)
            .await
            .expect("unanswered"),
        [third]
    );
    // Its job gone with it unanswered: not taken.
    queue.complete(&w2.lease).await.expect("complete");
    assert_eq!(answer(&queue, third).await, SteerAnswer::NotTaken);
    assert_eq!(answer(&queue, third).await, SteerAnswer::Unknown);
    assert_eq!(steer(&queue, "t1", "too late", 21_000).await, None);

    // A message waiting for its live job is kept however long it waits; an answer nobody read
    // is deleted an hour after it was recorded, with the next message stored.
    const HOUR: i64 = 60 * 60 * 1000;
    enqueue(&queue, &job("t2"), 30_000).await;
    let slow = steer(&queue, "t2", "whenever", 30_000)
        .await
        .expect("stored");
    steer(&queue, "t2", "later", 30_000 + 2 * HOUR)
        .await
        .expect("stored");
    assert_eq!(answer(&queue, slow).await, SteerAnswer::Waiting);
    queue
        .settle_steering(&[(slow, Some(1))], at(30_000 + 2 * HOUR))
        .await
        .expect("settle");
    steer(&queue, "t2", "and later", 30_000 + 3 * HOUR - 1)
        .await
        .expect("stored");
    assert_eq!(answer(&queue, slow).await, SteerAnswer::Taken { step: 1 });
    let unread = steer(&queue, "t2", "unread", 30_000 + 3 * HOUR)
        .await
        .expect("stored");
    queue
        .settle_steering(&[(unread, None)], at(30_000 + 3 * HOUR))
        .await
        .expect("settle");
    steer(&queue, "t2", "much later", 30_000 + 4 * HOUR + 1)
        .await
        .expect("stored");
    assert_eq!(answer(&queue, unread).await, SteerAnswer::Unknown);
}

/// The next notification; fails the test when none comes within [`WAKE_BOUND`].
async fn next(listener: &mut FleetListener) -> FleetWake {
    tokio::time::timeout(WAKE_BOUND, listener.recv())
        .await
        .unwrap_or_else(|_| panic!("no notification within {WAKE_BOUND:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_hears_its_schemas_notifications() {
    let Some(store) = postgres_store("queue_listen").await else {
        return;
    };
    let Some(elsewhere) = postgres_store("queue_listen_other").await else {
        return;
    };
    let queue = store.queue();
    let other = elsewhere.queue();
    let mut listener = queue.listen(Hear::All);
    listener.ready().await;

    enqueue(&queue, &job("t1"), 1_000).await;
    assert_eq!(next(&mut listener).await, FleetWake::Job);
    queue.request_cancel(&tid("t1")).await.expect("cancel");
    assert_eq!(next(&mut listener).await, FleetWake::Cancel(tid("t1")));
    queue
        .notify(&FleetWake::Events(tid("t0")), &[tid("t1"), tid("t2")])
        .await
        .expect("notify");
    assert_eq!(next(&mut listener).await, FleetWake::Events(tid("t1")));
    assert_eq!(next(&mut listener).await, FleetWake::Events(tid("t2")));
    queue
        .notify(&FleetWake::Events(tid("t1")), &[])
        .await
        .expect("notify nobody");

    // Given back (released, retried): claimable again, so the workers are woken.
    let claimed = claim_one(&queue, "w1", 1_000).await;
    assert!(queue.release(&claimed.lease).await.expect("release"));
    assert_eq!(next(&mut listener).await, FleetWake::Job);
    let claimed = claim_one(&queue, "w1", 1_000).await;
    queue
        .retry(&claimed.lease, "boom", at(1_000), at(1_000))
        .await
        .expect("retry");
    assert_eq!(next(&mut listener).await, FleetWake::Job);
    let claimed = claim_one(&queue, "w1", 1_000).await;
    queue
        .dead_letter(&claimed.lease, "bad", at(1_000))
        .await
        .expect("dead letter");
    assert_eq!(next(&mut listener).await, FleetWake::Done(tid("t1")));

    // Another schema's notifications (and a completed job, which says nothing) are not heard:
    // notifications arrive in commit order, so the marker sent after them comes first.
    other.enqueue(&job("t1"), at(1_000)).await.expect("enqueue");
    other.request_cancel(&tid("t1")).await.expect("cancel");
    other
        .notify(&FleetWake::Events(tid("t1")), &[tid("t1")])
        .await
        .expect("notify");
    enqueue(&queue, &job("t2"), 2_000).await;
    assert_eq!(next(&mut listener).await, FleetWake::Job);
    let claimed = claim_one(&queue, "w1", 2_000).await;
    queue.complete(&claimed.lease).await.expect("complete");
    queue
        .notify(&FleetWake::Done(tid("t1")), &[tid("marker")])
        .await
        .expect("notify");
    assert_eq!(next(&mut listener).await, FleetWake::Done(tid("marker")));

    // Its own listener hears the other schema.
    let mut theirs = other.listen(Hear::All);
    theirs.ready().await;
    other
        .notify(&FleetWake::Cancel(tid("t1")), &[tid("t9")])
        .await
        .expect("notify");
    assert_eq!(next(&mut theirs).await, FleetWake::Cancel(tid("t9")));

    // A worker's listener hears jobs and cancels only; a front end's, events and ends only.
    let mut jobs = queue.listen(Hear::Jobs);
    let mut runs = queue.listen(Hear::Runs);
    jobs.ready().await;
    runs.ready().await;
    queue
        .notify(&FleetWake::Events(tid("t1")), &[tid("e1")])
        .await
        .expect("notify");
    queue
        .notify(&FleetWake::Cancel(tid("t1")), &[tid("c1")])
        .await
        .expect("notify");
    queue
        .notify(&FleetWake::Done(tid("t1")), &[tid("d1")])
        .await
        .expect("notify");
    queue
        .notify(&FleetWake::Job, &[tid("j1")])
        .await
        .expect("notify");
    assert_eq!(next(&mut jobs).await, FleetWake::Cancel(tid("c1")));
    assert_eq!(next(&mut jobs).await, FleetWake::Job);
    assert_eq!(next(&mut runs).await, FleetWake::Events(tid("e1")));
    assert_eq!(next(&mut runs).await, FleetWake::Done(tid("d1")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_reconnects_and_says_it_lost_notifications() {
    let Some(store) = postgres_store("queue_listen_lost").await else {
        return;
    };
    let queue = store.queue();
    let mut listener = queue.listen(Hear::All);
    listener.ready().await;

    let url = postgres_url().expect("url is set when the store exists");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(connection);
    let killed = client
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE query LIKE 'LISTEN%' AND datname = current_database() \
             AND application_name = $1",
            &[&"awaken-fleet-listener:awaken_t_queue_listen_lost"],
        )
        .await
        .expect("terminate the listener");
    let killed: Vec<bool> = killed.iter().map(|r| r.get(0)).collect();
    assert_eq!(killed, [true], "this test's listener, once");
    drop(client);
    let _ = conn.await;

    assert_eq!(next(&mut listener).await, FleetWake::Lost);
    enqueue(&queue, &job("t1"), 1_000).await;
    assert_eq!(next(&mut listener).await, FleetWake::Job);
    queue
        .notify(&FleetWake::Events(tid("t1")), &[tid("t1")])
        .await
        .expect("notify");
    assert_eq!(next(&mut listener).await, FleetWake::Events(tid("t1")));
}
