//! SQLite-specific checks: durability across reopening the file, the schema version table.

use awaken_store::{SqliteConfig, SqliteStore, ThreadStore};

use crate::conformance::{dump_all, step};

#[tokio::test]
async fn reopened_file_holds_the_last_commit_and_schema_version() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("awaken.db");
    let before = {
        let store = SqliteStore::open(SqliteConfig::file(&path))
            .await
            .expect("open");
        store
            .commit(step("t1", "r1", 0, 1, 1_000))
            .await
            .expect("commit");
        store
            .commit(step("t1", "r1", 2, 2, 2_000))
            .await
            .expect("commit");
        dump_all(&store).await
    };
    let store = SqliteStore::open(SqliteConfig::file(&path))
        .await
        .expect("reopen");
    assert_eq!(dump_all(&store).await, before);
    store
        .commit(step("t1", "r1", 4, 3, 3_000))
        .await
        .expect("commit after reopen");
    let conn = rusqlite_version(&path);
    assert_eq!(conn, (SqliteStore::schema_version(), "wal".to_owned()));
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
    let store = SqliteStore::open(SqliteConfig::file(&path).with_synchronous(Synchronous::Full))
        .await
        .expect("open");
    store
        .commit(step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("commit");
    let in_memory = SqliteStore::open(SqliteConfig::in_memory())
        .await
        .expect("in memory");
    in_memory
        .commit(step("t1", "r1", 0, 1, 1_000))
        .await
        .expect("commit");
    assert_eq!(dump_all(&in_memory).await, dump_all(&store).await);
}
