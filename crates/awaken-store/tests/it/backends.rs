//! Instantiates every conformance function for every backend.
//!
//! PostgreSQL needs a server: set `AWAKEN_TEST_POSTGRES_URL` (e.g. `eval "$(bash
//! .ci/postgres.sh start)"`). Without it the PostgreSQL tests print one line saying they were
//! skipped and pass, unless `AWAKEN_REQUIRE_POSTGRES=1`, which turns a missing or unreachable
//! server into a failure (CI sets it).

use std::sync::Arc;

use awaken_store::MemoryStore;
#[cfg(feature = "postgres")]
use awaken_store::{PostgresConfig, PostgresStore};
#[cfg(feature = "sqlite")]
use awaken_store::{SqliteConfig, SqliteStore};

use crate::conformance::Harness;

pub async fn memory(_test: &str) -> Option<Harness> {
    memory_store(MemoryStore::new())
}

/// The memory store keeping finished threads shared (no compaction at a run's end).
pub async fn memory_shared(_test: &str) -> Option<Harness> {
    memory_store(MemoryStore::without_compaction())
}

fn memory_store(store: MemoryStore) -> Option<Harness> {
    let store = Arc::new(store);
    let armed = Arc::clone(&store);
    Some(Harness {
        store: Box::new(store),
        arm: Box::new(move |p| armed.arm_failpoint(p)),
        _guard: None,
    })
}

#[cfg(feature = "sqlite")]
pub async fn sqlite(_test: &str) -> Option<Harness> {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(SqliteConfig::file(dir.path().join("awaken.db")))
        .await
        .expect("open sqlite");
    let armed = store.clone();
    Some(Harness {
        store: Box::new(store),
        arm: Box::new(move |p| armed.arm_failpoint(p)),
        _guard: Some(Box::new(dir)),
    })
}

#[cfg(feature = "postgres")]
fn postgres_required() -> bool {
    std::env::var("AWAKEN_REQUIRE_POSTGRES").is_ok_and(|v| v == "1")
}

#[cfg(feature = "postgres")]
/// Prints the one line saying the suite was skipped. Written to the stderr handle directly (not
/// through `eprintln!`), so the test harness does not capture it and it shows in every run.
fn note_skipped() {
    use std::io::Write as _;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = writeln!(
            std::io::stderr(),
            "awaken-store: PostgreSQL conformance tests SKIPPED (AWAKEN_TEST_POSTGRES_URL is not \
             set); run `eval \"$(bash .ci/postgres.sh start)\"` first to include them, and set \
             AWAKEN_REQUIRE_POSTGRES=1 to make a missing server fail"
        );
    });
}

#[cfg(feature = "postgres")]
/// The URL of the test server, `None` (skip) when it is not configured and not required.
pub fn postgres_url() -> Option<String> {
    match std::env::var("AWAKEN_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            assert!(
                !postgres_required(),
                "AWAKEN_REQUIRE_POSTGRES=1 but AWAKEN_TEST_POSTGRES_URL is not set"
            );
            note_skipped();
            None
        }
    }
}

#[cfg(feature = "postgres")]
/// A store in a fresh schema named after the test (tests run in parallel).
pub async fn postgres_store(test: &str) -> Option<PostgresStore> {
    let url = postgres_url()?;
    let schema = format!("awaken_t_{test}");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("AWAKEN_TEST_POSTGRES_URL is set but unreachable: {e}"));
    let conn = tokio::spawn(connection);
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await
        .expect("drop the test schema");
    drop(client);
    let _ = conn.await;
    let store = PostgresStore::connect(
        PostgresConfig::new(url)
            .with_schema(schema)
            .with_max_connections(4),
    )
    .await
    .expect("connect postgres store");
    Some(store)
}

#[cfg(feature = "postgres")]
pub async fn postgres(test: &str) -> Option<Harness> {
    let store = postgres_store(test).await?;
    let armed = store.clone();
    Some(Harness {
        store: Box::new(store),
        arm: Box::new(move |p| armed.arm_failpoint(p)),
        _guard: None,
    })
}

/// One `#[tokio::test]` per conformance function and backend.
macro_rules! conformance_suite {
    ($backend:ident; $($name:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(h) = super::$backend(stringify!($name)).await else { return };
                    crate::conformance::$name(&h).await;
                }
            )*
        }
    };
}

macro_rules! every_backend {
    ($($name:ident),* $(,)?) => {
        conformance_suite!(memory; $($name),*);
        conformance_suite!(memory_shared; $($name),*);
        #[cfg(feature = "sqlite")]
        conformance_suite!(sqlite; $($name),*);
        #[cfg(feature = "postgres")]
        conformance_suite!(postgres; $($name),*);
    };
}

every_backend!(
    round_trip,
    message_guard_conflict,
    concurrent_writers_one_wins,
    a_run_belongs_to_one_thread,
    profile_versions_and_conflict,
    deltas_upsert_changed_keys,
    events_in_order_since,
    batch_keep_set_clear,
    invalid_commits_write_nothing,
    list_and_delete,
    lease_claim_expiry_takeover,
    claims_take_turns,
    claim_one_run,
    a_run_created_leased_is_its_creators,
    concurrent_claims_never_share,
    failpoint_inside_the_write,
    failed_last_commit_keeps_lease_and_batch,
    commit_now_writes_or_leaves_the_commit,
    a_refused_commit_goes_through_once_corrected,
    failpoint_inside_an_immediate_write,
    commit_cost_shape_at_length,
    finished_threads_read_back_whole,
    runs_in_turn_read_back_in_order,
    a_finished_runs_state_reads_back_and_takes_writes,
    a_finished_runs_record_reads_back_whole,
    one_run_holds_a_thread,
    a_stale_holder_is_claimed_and_closed,
    concurrent_new_runs_one_holds_the_thread,
    deeply_nested_arguments_read_back,
);

/// The memory store writes at once: `commit_now` always writes (or refuses) the commit.
#[test]
fn the_memory_store_commits_without_a_future() {
    use awaken_store::ThreadStore as _;
    let store = MemoryStore::new();
    let written = store.commit_now(&crate::conformance::step("t1", "r1", 0, 1, 1_000));
    assert!(matches!(written, Some(Ok(_))), "{written:?}");
}

/// The memory store writes a commit's messages and events in its compact form, unless it was
/// made without compaction: then it keeps copies of them, also after the run's end; reads give
/// back the same either way.
#[tokio::test]
async fn commits_read_back_with_or_without_compaction() {
    use crate::conformance::{at, run, tid};
    use awaken_event::{AgentEvent, Message, TerminationReason};
    use awaken_store::{RunStatus, ThreadCommit, ThreadStore as _};
    for store in [MemoryStore::new(), MemoryStore::without_compaction()] {
        let messages = vec![Message::user("hi")];
        let events = vec![AgentEvent::StepStart { step: 1 }];
        let first = ThreadCommit::new(tid("t1"), run("r1", 1_000), 0)
            .with_messages(messages.clone())
            .with_events(events.clone());
        store.commit(&first).await.expect("commit");

        let mut record = run("r1", 1_000);
        record.updated_at = at(1_001);
        record.status = RunStatus::Done;
        record.termination = Some(TerminationReason::NaturalEnd);
        store
            .commit(&ThreadCommit::new(tid("t1"), record, 1))
            .await
            .expect("commit");

        let checkpoint = store
            .load_checkpoint(&tid("t1"))
            .await
            .expect("load")
            .expect("thread");
        assert_eq!(checkpoint.messages[..], messages[..]);
        let stored = store.load_events(&tid("t1"), 0).await.expect("events");
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].event, events[0]);
    }
}
