//! SQLite-specific checks: durability across reopening the file, the schema version table,
//! opening one new file from several stores at once, and what a damaged file gives back.

use awaken_store::{SqliteConfig, SqliteStore, StoreError, ThreadStore};

use crate::conformance::{corrupt_batch_errors, dump_all, step};

#[tokio::test]
async fn reopened_file_holds_the_last_commit_and_schema_version() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("awaken.db");
    let before = {
        let store = one_step(SqliteConfig::file(&path)).await;
        store
            .commit(&step("t1", "r1", 2, 2, 2_000))
            .await
            .expect("commit");
        dump_all(&store).await
    };
    let store = SqliteStore::open(SqliteConfig::file(&path))
        .await
        .expect("reopen");
    assert_eq!(dump_all(&store).await, before);
    store
        .commit(&step("t1", "r1", 4, 3, 3_000))
        .await
        .expect("commit after reopen");
    let conn = rusqlite_version(&path);
    assert_eq!(conn, (SqliteStore::schema_version(), "wal".to_owned()));
}

/// A store opened with `config`, holding one step of run `r1` on thread `t1`.
async fn one_step(config: SqliteConfig) -> SqliteStore {
    let store = SqliteStore::open(config).await.expect("open");
    store
        .commit(&step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("commit");
    store
}

fn rusqlite_version(path: &std::path::Path) -> (i64, String) {
    // Read the version table and the journal mode with the sqlite3 library the store links.
    let conn = rusqlite::Connection::open(path).expect("open");
    let version: i64 = conn
        .query_row("SELECT MAX(version) FROM awaken_schema_version", [], |r| {
            r.get(0)
        })
        .expect("version");
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("journal mode");
    (version, mode)
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("awaken.db");
    drop(
        SqliteStore::open(SqliteConfig::file(&path))
            .await
            .expect("open"),
    );
    let conn = rusqlite::Connection::open(&path).expect("open");
    conn.execute(
        "INSERT INTO awaken_schema_version (version) VALUES (99)",
        [],
    )
    .expect("bump version");
    drop(conn);
    let err = SqliteStore::open(SqliteConfig::file(&path))
        .await
        .expect_err("newer schema");
    assert!(
        matches!(err, awaken_store::StoreError::SchemaTooNew { found: 99, supported, .. } if supported == SqliteStore::schema_version()),
        "{err:?}"
    );
}

#[tokio::test]
async fn in_memory_and_full_sync_databases_behave_alike() {
    use awaken_store::Synchronous;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("awaken.db");
    let store = one_step(SqliteConfig::file(&path).with_synchronous(Synchronous::Full)).await;
    let in_memory = one_step(SqliteConfig::in_memory()).await;
    assert_eq!(dump_all(&in_memory).await, dump_all(&store).await);
}

/// A stored batch that does not read back as a tool batch (text that is not one, or one that
/// breaks the batch's invariants) is a `Corrupt` error naming the tool batch, on load and when a
/// commit reads the kept batch.
#[tokio::test]
async fn a_corrupt_stored_batch_reads_back_as_a_typed_error() {
    let mut rendered = Vec::new();
    for corrupt in [
        r#"{"calls": [{"state": "flying"}]}"#,
        r#"{"calls": [{"call": {"id": "a", "name": "t", "arguments": {}}, "state": "succeeded"}]}"#,
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("awaken.db");
        let store = one_step(SqliteConfig::file(&path)).await;
        let changed = rusqlite::Connection::open(&path)
            .expect("open")
            .execute("UPDATE runs SET batch = ?1 WHERE run_id = 'r1'", [corrupt])
            .expect("overwrite the batch");
        assert_eq!(changed, 1);
        rendered.push(corrupt_batch_errors(&store).await);
    }
    expect_test::expect![[r#"
        corrupt tool batch: unknown variant `flying`, expected one of `requested`, `executing`, `suspended`, `succeeded`, `failed`, `blocked`, `short_circuited`, `cancelled`, `outcome_unknown` at line 1 column 29
        corrupt tool batch: unknown variant `flying`, expected one of `requested`, `executing`, `suspended`, `succeeded`, `failed`, `blocked`, `short_circuited`, `cancelled`, `outcome_unknown` at line 1 column 29
        corrupt tool batch: tool call `a` in state succeeded is inconsistent: a terminal call has no closing result
        corrupt tool batch: tool call `a` in state succeeded is inconsistent: a terminal call has no closing result"#]].assert_eq(&rendered.join("\n"));
}

/// Stores opening one new file at once (as processes started together do) all open: each
/// waits while another sets the file up, and the schema is whole afterwards.
#[test]
fn concurrent_opens_of_a_new_file_all_succeed() {
    const ROUNDS: usize = 100;
    const OPENERS: usize = 8;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    for round in 0..ROUNDS {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("awaken.db");
        let start = std::sync::Barrier::new(OPENERS);
        let opened: Vec<_> = std::thread::scope(|scope| {
            let openers: Vec<_> = (0..OPENERS)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        runtime.block_on(SqliteStore::open(SqliteConfig::file(&path)))
                    })
                })
                .collect();
            openers
                .into_iter()
                .map(|o| o.join().expect("opener"))
                .collect()
        });
        for (i, store) in opened.into_iter().enumerate() {
            let store = store.unwrap_or_else(|e| panic!("round {round}, opener {i}: {e}"));
            runtime
                .block_on(store.commit(&step(&format!("t{i}"), &format!("r{i}"), 0, 1, 1_000)))
                .unwrap_or_else(|e| panic!("round {round}, opener {i}: {e}"));
        }
        assert_eq!(
            rusqlite_version(&path),
            (SqliteStore::schema_version(), "wal".to_owned()),
            "round {round}"
        );
    }
}

/// An error rendered with the store's path as `<db>`: its kind, the database it names, its
/// message.
fn rendered(e: &StoreError, path: &std::path::Path) -> String {
    let path = path.display().to_string();
    format!(
        "{:?} {:?}: {}",
        e.kind(),
        e.database()
            .and_then(|d| d.name())
            .map(|n| n.replace(&path, "<db>")),
        e.to_string().replace(&path, "<db>")
    )
}

/// A file that is not a database (random bytes) is a storage failure naming the file, and a
/// path that cannot be opened is a configuration error naming it; neither panics.
#[tokio::test]
async fn a_file_that_is_not_a_database_is_a_storage_failure_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("awaken.db");
    // Deterministic noise (xorshift), not starting with SQLite's header.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: Vec<u8> = (0..16 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect();
    std::fs::write(&path, &noise).expect("write noise");
    let noise_err = SqliteStore::open(SqliteConfig::file(&path))
        .await
        .expect_err("not a database");
    let missing = dir.path().join("no-such-dir").join("awaken.db");
    let missing_err = SqliteStore::open(SqliteConfig::file(&missing))
        .await
        .expect_err("no directory");
    expect_test::expect![[r#"
        Storage Some("<db>"): SQLite database <db>: file is not a database
        Config Some("<db>"): SQLite database <db>: unable to open database file: <db>"#]]
    .assert_eq(&format!(
        "{}\n{}",
        rendered(&noise_err, &path),
        rendered(&missing_err, &missing)
    ));
    assert!(noise_err.is_storage_failure());
    assert_eq!(
        std::fs::read(&path).expect("read"),
        noise,
        "the file was changed"
    );
}

/// A database file cut short (the second half of its pages gone) opens or not, and reading it
/// gives a storage failure naming the file, never a panic.
#[tokio::test]
async fn a_truncated_database_is_a_storage_failure_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("awaken.db");
    {
        let store = SqliteStore::open(SqliteConfig::file(&path))
            .await
            .expect("open");
        for i in 0..40 {
            let mut c = step(&format!("t{i:02}"), &format!("r{i}"), 0, 1, 1_000);
            c.messages
                .push(awaken_event::Message::user("x".repeat(4_000)));
            store.commit(&c).await.expect("commit");
        }
    }
    // Everything into the main file, then cut its second half off.
    let conn = rusqlite::Connection::open(&path).expect("open");
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
    let page_size: u64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .expect("page size");
    drop(conn);
    let len = std::fs::metadata(&path).expect("metadata").len();
    assert!(len > 64 * page_size, "a database of {len} bytes");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open the file");
    file.set_len(len / page_size / 2 * page_size)
        .expect("truncate");
    drop(file);

    let failure = match SqliteStore::open(SqliteConfig::file(&path)).await {
        Err(e) => e,
        Ok(store) => read_everything(&store)
            .await
            .expect_err("the second half of the pages is gone"),
    };
    assert!(failure.is_storage_failure(), "{failure:?}");
    assert_eq!(
        failure.database().and_then(|d| d.name()),
        Some(path.display().to_string().as_str())
    );
    expect_test::expect![[r#"
        Storage Some("<db>"): SQLite database <db>: database disk image is malformed"#]]
    .assert_eq(&rendered(&failure, &path));
}

/// Every thread's checkpoint, runs and events: the first error.
async fn read_everything(store: &SqliteStore) -> Result<(), StoreError> {
    for thread in store.list_threads().await? {
        store.load_checkpoint(&thread.thread_id).await?;
        store.list_runs(&thread.thread_id).await?;
        store.load_events(&thread.thread_id, 0).await?;
    }
    Ok(())
}

/// An open that finds the file locked by another connection past the busy timeout gives up
/// with a typed storage failure naming the file; once the lock is gone, the file opens.
#[tokio::test]
async fn an_open_kept_waiting_past_the_busy_timeout_is_a_typed_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("awaken.db");
    let other = rusqlite::Connection::open(&path).expect("open");
    other
        .execute_batch("BEGIN EXCLUSIVE; CREATE TABLE taken (x INTEGER);")
        .expect("an exclusive lock");
    let mut config = SqliteConfig::file(&path);
    config.busy_timeout = std::time::Duration::from_millis(200);
    let err = SqliteStore::open(config)
        .await
        .expect_err("the file stays locked");
    expect_test::expect![[r#"Storage Some("<db>"): SQLite database <db>: database is locked"#]]
        .assert_eq(&rendered(&err, &path));
    other.execute_batch("ROLLBACK").expect("lock released");
    drop(other);
    SqliteStore::open(SqliteConfig::file(&path))
        .await
        .expect("open once the lock is gone");
}

/// Found by the `sqlite_rows` fuzz target: each read of a thread that meets a damaged row of it
/// (a message, an event, a run record) fails with a `Corrupt` error naming the thread and the
/// database.
#[tokio::test]
async fn a_damaged_row_is_a_corrupt_error_naming_its_thread() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("awaken.db");
    let store = one_step(SqliteConfig::file(&path)).await;
    let conn = rusqlite::Connection::open(&path).expect("open");
    for damage in [
        "UPDATE messages SET body = '+' WHERE thread_id = 't1' AND idx = 0",
        "UPDATE events SET body = '{}' WHERE thread_id = 't1' AND seq = 2",
        "UPDATE runs SET usage = '[1]' WHERE run_id = 'r1'",
    ] {
        assert_eq!(conn.execute(damage, []).expect("damage"), 1, "{damage}");
    }
    let t1 = awaken_event::ThreadId::new("t1").expect("id");
    let errors = [
        store.load_checkpoint(&t1).await.map(drop),
        store.load_events(&t1, 0).await.map(drop),
        store.list_runs(&t1).await.map(drop),
    ]
    .map(|r| rendered(&r.expect_err("a damaged row"), &path));
    expect_test::expect![[r#"
        Storage Some("<db>"): stored message of thread t1 in <db> could not be read: expected value at line 1 column 1
        Storage Some("<db>"): stored event of thread t1 in <db> could not be read: missing field `type` at line 1 column 2
        Storage Some("<db>"): stored run record of thread t1 in <db> could not be read: invalid length 1, expected struct TokenUsage with 4 elements at line 1 column 3"#]]
    .assert_eq(&errors.join("\n"));
}

/// Found by the `sqlite_rows` fuzz target: a thread whose latest run is not stored with it (its
/// row renamed, or moved to another thread) read back as a thread without a run, losing the
/// calls the run waits on; it is a `Corrupt` error naming the thread, for the checkpoint and
/// for the latest run's record alone.
#[tokio::test]
async fn a_latest_run_not_stored_with_its_thread_is_a_corrupt_error() {
    let mut errors = Vec::new();
    for damage in [
        "UPDATE runs SET run_id = 'gone' WHERE run_id = 'r1'",
        "UPDATE runs SET thread_id = 't2' WHERE run_id = 'r1'",
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("awaken.db");
        let store = one_step(SqliteConfig::file(&path)).await;
        let conn = rusqlite::Connection::open(&path).expect("open");
        assert_eq!(conn.execute(damage, []).expect("damage"), 1, "{damage}");
        let t1 = awaken_event::ThreadId::new("t1").expect("id");
        let loaded = store.load_checkpoint(&t1).await;
        errors.push(rendered(&loaded.expect_err(damage), &path));
        // The latest run's record alone says the same.
        let latest = store.latest_run(&t1).await;
        errors.push(rendered(&latest.expect_err(damage), &path));
    }
    expect_test::expect![[r#"
        Storage Some("<db>"): stored run record of thread t1 in <db> could not be read: the latest run "r1" is not stored
        Storage Some("<db>"): stored run record of thread t1 in <db> could not be read: the latest run "r1" is not stored
        Storage Some("<db>"): stored run record of thread t1 in <db> could not be read: the latest run "r1" is not stored
        Storage Some("<db>"): stored run record of thread t1 in <db> could not be read: the latest run "r1" is not stored"#]]
    .assert_eq(&errors.join("\n"));
}
