//! PostgreSQL-specific checks: two stores (two workers' pools) on one database, and what
//! connection errors say.

use std::time::Duration;

use awaken_store::{CommitError, PostgresConfig, PostgresStore, ThreadStore};

use crate::backends::postgres_store;
use crate::conformance::{at, corrupt_batch_errors, rid, step, tid};

/// Another store (another worker's pool of `max_connections`) on the schema of `test`'s store
/// from `postgres_store`.
async fn second_store(test: &str, max_connections: usize) -> PostgresStore {
    let url = crate::backends::postgres_url().expect("url is set when the first store exists");
    PostgresStore::connect(
        PostgresConfig::new(url)
            .with_schema(format!("awaken_t_{test}"))
            .with_max_connections(max_connections),
    )
    .await
    .expect("second store")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_one_database() {
    let Some(a) = postgres_store("two_workers").await else {
        return;
    };
    let b = second_store("two_workers", 2).await;
    for i in 0..8i64 {
        a.commit(&step(&format!("t{i}"), &format!("r{i}"), 0, 1, 1_000 + i))
            .await
            .expect("commit");
    }
    // Both claim at once: together they get every run, never the same one.
    let lease = Duration::from_secs(5);
    let (ca, cb) = tokio::join!(
        a.claim_runnable("worker-a", lease, at(2_000), 8),
        b.claim_runnable("worker-b", lease, at(2_000), 8),
    );
    let mut ids: Vec<String> = ca
        .expect("claim a")
        .into_iter()
        .chain(cb.expect("claim b"))
        .map(|c| c.run.run_id.to_string())
        .collect();
    ids.sort();
    assert_eq!(ids, (0..8).map(|i| format!("r{i}")).collect::<Vec<_>>());
    // Both write the same thread with the same guard: one wins, the other sees the new count.
    let (first, second) = (step("t0", "r0", 2, 2, 3_000), step("t0", "r0", 2, 3, 3_001));
    let (wa, wb) = tokio::join!(a.commit(&first), b.commit(&second));
    assert_eq!(
        u8::from(wa.is_ok()) + u8::from(wb.is_ok()),
        1,
        "{wa:?} {wb:?}"
    );
    let loser = if wa.is_ok() { wb } else { wa };
    assert!(matches!(
        loser,
        Err(CommitError::VersionConflict {
            expected: 2,
            actual: 4
        })
    ));
    // What one worker wrote, the other reads.
    let cp = b
        .load_checkpoint(&tid("t0"))
        .await
        .expect("load")
        .expect("thread");
    assert_eq!(cp.messages.len(), 4);
}

/// A stored batch that does not read back as a tool batch is a `Corrupt` error naming the tool
/// batch, on load and when a commit reads the kept batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_stored_batch_reads_back_as_a_typed_error() {
    let Some(store) = postgres_store("corrupt_batch").await else {
        return;
    };
    store
        .commit(&step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("commit");
    let (client, conn) = raw_connection().await;
    let changed = client
        .execute(
            "UPDATE awaken_t_corrupt_batch.runs SET batch = '{\"calls\": [{\"state\": \"flying\"}]}' \
             WHERE run_id = 'r1'",
            &[],
        )
        .await
        .expect("overwrite the batch");
    assert_eq!(changed, 1);
    drop(client);
    let _ = conn.await;
    expect_test::expect![[r#"
        corrupt tool batch: unknown variant `flying`, expected one of `requested`, `executing`, `suspended`, `succeeded`, `failed`, `blocked`, `short_circuited`, `cancelled`, `outcome_unknown` at line 1 column 29
        corrupt tool batch: unknown variant `flying`, expected one of `requested`, `executing`, `suspended`, `succeeded`, `failed`, `blocked`, `short_circuited`, `cancelled`, `outcome_unknown` at line 1 column 29"#]].assert_eq(&corrupt_batch_errors(&store).await);
}

/// Two stores on one database (two processes' runtimes) starting a new run each on one thread
/// at once: one holds the thread, the other's first commit is `ThreadBusy` naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_start_runs_on_one_thread_one_holds_it() {
    use awaken_store::{RunRecord, RunStatus, ThreadCommit};
    let Some(a) = postgres_store("two_stores_one_thread").await else {
        return;
    };
    let url = crate::backends::postgres_url().expect("url is set when the store exists");
    let b = PostgresStore::connect(
        PostgresConfig::new(url).with_schema("awaken_t_two_stores_one_thread"),
    )
    .await
    .expect("second store");
    for round in 0..20 {
        let thread = format!("t{round}");
        let first = |run: &str| {
            let record = RunRecord::new(rid(run), "assistant", at(1_000));
            ThreadCommit::new(tid(&thread), record, 0)
        };
        let (ca, cb) = (first(&format!("{thread}-a")), first(&format!("{thread}-b")));
        let (wa, wb) = tokio::join!(a.commit(&ca), b.commit(&cb));
        let (winner, lost) = match (&wa, &wb) {
            (Ok(_), Err(e)) => (&ca.run.run_id, e),
            (Err(e), Ok(_)) => (&cb.run.run_id, e),
            _ => panic!("round {round}: {wa:?} {wb:?}"),
        };
        assert!(
            matches!(
                lost,
                CommitError::ThreadBusy { run_id, status: RunStatus::Running, .. }
                    if run_id == winner
            ),
            "round {round}: {lost:?}"
        );
    }
}

/// Connection errors name the server and database, never the password, and tell a wrong setup
/// (a URL that does not parse, an unknown database) from a server that cannot be reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_errors_name_the_database_and_their_kind() {
    use awaken_store::{StoreError, StoreErrorKind};
    let connect = async |url: &str| {
        PostgresStore::connect(PostgresConfig::new(url))
            .await
            .expect_err("no store")
    };
    let bad_url = connect("postgresql://postgres:s3cret@127.0.0.1:notaport/db").await;
    assert!(matches!(bad_url, StoreError::Config { .. }), "{bad_url:?}");
    assert!(!bad_url.to_string().contains("s3cret"), "{bad_url}");
    // Nothing listens on port 1 of the loopback.
    let unreachable = connect("postgresql://postgres:s3cret@127.0.0.1:1/awaken_nowhere").await;
    assert_eq!(
        unreachable.kind(),
        StoreErrorKind::Storage,
        "{unreachable:?}"
    );
    assert_eq!(
        unreachable.database().and_then(|d| d.name()),
        Some("127.0.0.1:1/awaken_nowhere")
    );
    assert!(
        unreachable
            .to_string()
            .starts_with("PostgreSQL database 127.0.0.1:1/awaken_nowhere: error connecting"),
        "{unreachable}"
    );
    assert!(!unreachable.to_string().contains("s3cret"));

    let Some(url) = crate::backends::postgres_url() else {
        return;
    };
    // The test server trusts loopback connections, so the password is never asked for.
    let Some((server, _)) = url.rsplit_once('/') else {
        panic!("a URL with a database name: {url}");
    };
    let server = server.replacen("postgres@", "postgres:s3cret@", 1);
    let unknown = connect(&format!("{server}/awaken_no_such_database")).await;
    assert_eq!(unknown.kind(), StoreErrorKind::Config, "{unknown:?}");
    let shown = unknown.to_string();
    assert!(
        shown.contains(
            "/awaken_no_such_database: db error: \
             FATAL: database \"awaken_no_such_database\" does not exist"
        ),
        "{shown}"
    );
    assert!(!shown.contains("s3cret"), "{shown}");
}

/// The twin of `sqlite_only.rs`'s checks found by the `sqlite_rows` fuzz target: a thread whose
/// latest run's row was moved to another thread does not read back as a thread without a run,
/// and a damaged message is a `Corrupt` error naming the thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_rows_of_a_thread_are_corrupt_errors_naming_it() {
    let Some(store) = postgres_store("damaged_rows").await else {
        return;
    };
    store
        .commit(&step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("commit");
    let url = crate::backends::postgres_url().expect("url is set when the store exists");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(connection);
    let mut errors = Vec::new();
    for (damage, undo) in [
        (
            "UPDATE awaken_t_damaged_rows.runs SET thread_id = 't2' WHERE run_id = 'r1'",
            Some("UPDATE awaken_t_damaged_rows.runs SET thread_id = 't1' WHERE run_id = 'r1'"),
        ),
        (
            "UPDATE awaken_t_damaged_rows.messages SET body = '+' WHERE thread_id = 't1' AND idx = 0",
            None,
        ),
    ] {
        assert_eq!(
            client.execute(damage, &[]).await.expect("damage"),
            1,
            "{damage}"
        );
        let loaded = store.load_checkpoint(&tid("t1")).await;
        errors.push(loaded.expect_err(damage).to_string());
        if undo.is_some() {
            // The latest run's record alone says the same.
            let latest = store.latest_run(&tid("t1")).await;
            errors.push(latest.expect_err(damage).to_string());
        }
        if let Some(undo) = undo {
            client.execute(undo, &[]).await.expect("undo");
        }
    }
    drop(client);
    let _ = conn.await;
    let errors: Vec<String> = errors
        .iter()
        .map(|e| {
            // The database's name holds the server's port: keep what is before and after it.
            let (head, tail) = e.split_once(" in ").expect("names the database");
            let tail = tail.split_once(" could not").map_or("", |(_, t)| t);
            format!("{head} in <database> could not{tail}")
        })
        .collect();
    expect_test::expect![[r#"
        stored run record of thread t1 in <database> could not be read: the latest run "r1" is not stored
        stored run record of thread t1 in <database> could not be read: the latest run "r1" is not stored
        stored message of thread t1 in <database> could not be read: expected value at line 1 column 1"#]]
    .assert_eq(&errors.join("\n"));
}

/// A connection of the test's own to the database, beside the store's pool, and the task
/// driving it.
async fn raw_connection() -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
    let url = crate::backends::postgres_url().expect("url is set when the store exists");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, driver)
}

/// A connection of its own, in a transaction holding the row of `thread` in `test`'s schema
/// (`ROLLBACK` releases it), and the task driving the connection.
async fn hold_thread_row(
    test: &str,
    thread: &str,
) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
    let (holder, driver) = raw_connection().await;
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM awaken_t_{test}.threads WHERE thread_id = '{thread}' FOR UPDATE"
        ))
        .await
        .expect("hold the thread's row");
    (holder, driver)
}

/// A commit dropped while its transaction is open (here, waiting for a lock another connection
/// holds) leaves no transaction behind on a pooled connection: the thread's next writer, from
/// another store, is not blocked by it, and the dropped commit wrote nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_dropped_mid_transaction_leaves_no_open_transaction() {
    let Some(a) = postgres_store("dropped_commit").await else {
        return;
    };
    let b = second_store("dropped_commit", 1).await;
    a.commit(&step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("first commit");

    // Another connection holds the thread's row, so the commit waits inside its transaction.
    let (holder, holder_conn) = hold_thread_row("dropped_commit", "t1").await;
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        b.commit(&step("t1", "r1", 2, 2, 2_000)),
    )
    .await;
    assert!(dropped.is_err(), "the commit did not wait: {dropped:?}");
    holder.batch_execute("ROLLBACK").await.expect("release");

    // Had the dropped commit's connection gone back to the pool in its transaction, it would
    // now hold the row, and this commit would wait for it.
    tokio::time::timeout(
        Duration::from_secs(10),
        a.commit(&step("t1", "r1", 2, 3, 3_000)),
    )
    .await
    .expect("the next writer is not blocked")
    .expect("commit");
    // The store whose commit was dropped works on, and sees only the commit that landed.
    let cp = b
        .load_checkpoint(&tid("t1"))
        .await
        .expect("load")
        .expect("thread");
    assert_eq!(cp.messages.len(), 4);
    drop(holder);
    let _ = holder_conn.await;
}

/// A commit whose wait for the thread's row is cancelled on the server reports that cancel
/// (a `Storage` failure naming it), not the aborted transaction the statements sent with it
/// then meet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_lock_wait_is_reported_as_the_cancel() {
    let Some(store) = postgres_store("cancelled_lock").await else {
        return;
    };
    store
        .commit(&step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("first commit");
    let (holder, holder_conn) = hold_thread_row("cancelled_lock", "t1").await;
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move { store.commit(&step("t1", "r1", 2, 2, 2_000)).await })
    };
    // The backend waiting behind the holder's lock is the commit's: cancel its statement.
    let cancelled = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let row = holder
                .query_one(
                    "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity \
                     WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))",
                    &[],
                )
                .await
                .expect("cancel the waiting backend");
            if row.get::<_, i64>(0) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(cancelled.is_ok(), "no commit waited for the thread's row");
    let error = waiting
        .await
        .expect("the commit's task")
        .expect_err("a cancelled commit fails");
    holder.batch_execute("ROLLBACK").await.expect("release");
    let CommitError::Backend(error) = &error else {
        panic!("a backend failure, not {error:?}");
    };
    assert_eq!(
        error.kind(),
        awaken_store::StoreErrorKind::Storage,
        "{error}"
    );
    assert!(
        error.to_string().contains("canceling statement"),
        "the cancel is what is reported: {error}"
    );
    // The store goes on: the commit can be made again.
    store
        .commit(&step("t1", "r1", 2, 2, 2_000))
        .await
        .expect("the commit, tried again");
    drop(holder);
    let _ = holder_conn.await;
}
