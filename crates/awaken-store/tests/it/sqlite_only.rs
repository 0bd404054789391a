//! SQLite-specific checks: durability across reopening the file, the schema version table.

use awaken_store::{SqliteConfig, SqliteStore, ThreadStore};

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
        matches!(err, awaken_store::StoreError::SchemaTooNew { found: 99, supported } if supported == SqliteStore::schema_version()),
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
