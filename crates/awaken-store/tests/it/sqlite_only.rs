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
