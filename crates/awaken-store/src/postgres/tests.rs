use std::collections::BTreeSet;
use std::time::Duration;

use awaken_event::{AgentEvent, Message, RunId, ThreadId};
use awaken_state::PersistedState;
use serde_json::json;

use futures_util::future::join_all;

use super::*;
use crate::commit::NewLease;

/// A store on `schema` of the test database, or `None` when no database is configured (a
/// failure when one is required); `fresh` drops the schema first.
async fn open(schema: &str, max_connections: usize, fresh: bool) -> Option<PostgresStore> {
    let url = match std::env::var("AWAKEN_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => {
            let required = std::env::var("AWAKEN_REQUIRE_POSTGRES").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "AWAKEN_REQUIRE_POSTGRES=1 but AWAKEN_TEST_POSTGRES_URL is not set"
            );
            return None;
        }
    };
    if fresh {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("AWAKEN_TEST_POSTGRES_URL is set but unreachable");
        let connection = tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .await
            .expect("drop the test schema");
        drop(client);
        let _ = connection.await;
    }
    let config = PostgresConfig::new(url)
        .with_schema(schema)
        .with_max_connections(max_connections);
    Some(PostgresStore::connect(config).await.expect("connect"))
}

/// How many statements prepared on each of `n` of `store`'s connections at once are not
/// planned yet.
async fn unplanned(store: &PostgresStore, n: usize) -> Vec<i64> {
    let connections = join_all((0..n).map(|_| store.pool.get())).await;
    let mut counts = Vec::new();
    for conn in &connections {
        let conn = conn.as_ref().expect("connection");
        let sql = "SELECT count(*) FROM pg_prepared_statements WHERE generic_plans = 0";
        let row = conn.query_one(sql, &[]).await.expect("count");
        counts.push(row.get(0));
    }
    counts
}

/// What each idle connection of `store` has prepared beyond a job's statements, and how many
/// of those it lacks.
fn beyond_and_lacking(store: &PostgresStore) -> Vec<(Vec<String>, usize)> {
    let job: BTreeSet<&str> = queue::job_statements().iter().copied().collect();
    store
        .pool
        .idle_prepared()
        .into_iter()
        .map(|prepared| {
            let beyond = prepared
                .iter()
                .filter(|sql| !job.contains(sql.as_str()))
                .cloned()
                .collect();
            let lacking = job.iter().filter(|sql| !prepared.contains(**sql)).count();
            (beyond, lacking)
        })
        .collect()
}

fn at(ms: i64) -> Timestamp {
    Timestamp::from_unix_millis(ms)
}

/// A step of run `r1` on thread `t`: `messages` new ones after `expected`, one event, and
/// run state when `run_state`.
fn step(expected: u64, messages: usize, run_state: bool, now: i64) -> ThreadCommit {
    let mut run = RunRecord::new(RunId::new("r1").expect("id"), "assistant", at(1_000));
    run.updated_at = at(now);
    let mut commit = ThreadCommit::new(ThreadId::new("t").expect("id"), run, expected)
        .with_messages((0..messages).map(|i| Message::user(format!("m{i}"))))
        .with_events([AgentEvent::StepStart { step: 1 }]);
    if run_state {
        commit = commit.with_run_state(PersistedState {
            revision: u64::try_from(now).expect("time"),
            values: [("loop.round".to_owned(), json!(now))].into(),
        });
    }
    commit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmed_connections_have_a_jobs_statements_prepared_and_planned() {
    let Some(store) = open("awaken_u_warm_up", 3, true).await else {
        return;
    };
    let front = open("awaken_u_warm_up", 1, false).await.expect("front");
    let thread = ThreadId::new("t").expect("id");
    let job = NewJob::new(
        thread.clone(),
        RunId::new("r1").expect("id"),
        "a",
        json!({}),
    );
    front.queue().enqueue(&job, at(500)).await.expect("enqueue");

    let queue = store.queue();
    queue.warm_up(2).await.expect("warm up");
    assert_eq!(beyond_and_lacking(&store), [(vec![], 0), (vec![], 0)]);
    assert_eq!(unplanned(&store, 2).await, [0, 0]);

    // A job's path from its claim to its end prepares nothing more.
    let lease = Duration::from_secs(30);
    let claimed = queue.claim("w", lease, at(1_000), 1, None).await;
    let claimed = claimed.expect("claim").pop().expect("a job");
    assert_eq!(store.latest_run(&thread).await.expect("latest"), None);
    let run = RunId::new("r1").expect("id");
    assert_eq!(store.load_run(&thread, &run).await.expect("run"), None);
    let new_lease = NewLease {
        worker_id: "w".to_owned(),
        expires_at: at(31_000),
    };
    let token = new_lease.token(&RunId::new("r1").expect("id"));
    let steps = [
        step(0, 1, false, 1_001).with_new_lease(new_lease),
        step(1, 0, false, 1_002),
        step(1, 0, true, 1_003),
        step(1, 2, true, 1_004),
        step(3, 1, false, 1_005),
    ];
    for commit in steps {
        let commit = match commit.new_lease {
            Some(_) => commit,
            None => commit.with_lease(token.clone()),
        };
        store.commit(&commit).await.expect("commit");
    }
    let checkpoint = store.load_checkpoint(&thread).await.expect("load");
    assert_eq!(checkpoint.map(|c| c.messages.len()), Some(4));
    store
        .heartbeat(&token, lease, at(1_006))
        .await
        .expect("renew");
    assert!(store.release(&token).await.expect("release"));
    let wake = FleetWake::Events(thread.clone());
    queue
        .notify(&wake, std::slice::from_ref(&thread))
        .await
        .expect("notify");
    queue
        .heartbeat(&claimed.lease, lease, at(1_007))
        .await
        .expect("beat");
    queue.complete(&claimed.lease).await.expect("complete");
    assert_eq!(queue.next_due(at(1_008), None).await.expect("due"), None);
    assert_eq!(beyond_and_lacking(&store), [(vec![], 0), (vec![], 0)]);

    // A connection opened later prepares them as it opens; more than the pool holds is its
    // size, not a wait for connections that never come.
    let (a, b, c) = tokio::join!(store.pool.get(), store.pool.get(), store.pool.get());
    drop((a.expect("a"), b.expect("b"), c.expect("c")));
    let ready = [(vec![], 0), (vec![], 0), (vec![], 0)];
    assert_eq!(beyond_and_lacking(&store), ready);
    assert_eq!(unplanned(&store, 3).await, [0, 0, 0]);
    queue.warm_up(8).await.expect("warm up again");
    assert_eq!(beyond_and_lacking(&store), ready);
}

/// A job queued with the thread's position as its caller last read it starts after the
/// thread's last stored event when the insert was made, should the thread have gone on since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_starts_after_the_threads_last_event_when_it_was_queued() {
    let Some(store) = open("awaken_u_after_event", 1, true).await else {
        return;
    };
    let thread = ThreadId::new("t").expect("id");
    let new = |run: &str, after_event| NewJob {
        after_event,
        ..NewJob::new(thread.clone(), RunId::new(run).expect("id"), "a", json!({}))
    };
    let queue = store.queue();
    let enqueue = async |run, now| match queue.enqueue(&new(run, 0), at(now)).await {
        Ok(Enqueued::Queued {
            job_id,
            after_event,
        }) => (job_id, after_event),
        other => panic!("expected a queued job, got {other:?}"),
    };
    // A thread with no event yet: the caller's position.
    let (first, after) = enqueue("r0", 500).await;
    assert_eq!(after, 0);
    let lease = queue
        .claim("w", Duration::from_secs(30), at(600), 1, None)
        .await;
    let lease = lease.expect("claim").pop().expect("the job").lease;
    assert_eq!(lease.job_id, first);
    // Its run stores two events after the next caller read the thread at none, then ends.
    store
        .commit(&step(0, 1, false, 1_000))
        .await
        .expect("commit");
    store
        .commit(&step(1, 0, false, 1_001))
        .await
        .expect("commit");
    queue.complete(&lease).await.expect("complete");
    let (next, after) = enqueue("r1", 1_100).await;
    assert_eq!(after, 2);
    let job = queue
        .job_of_thread(&thread)
        .await
        .expect("job")
        .expect("queued");
    assert_eq!((job.job_id, job.after_event), (next, 2));
}
