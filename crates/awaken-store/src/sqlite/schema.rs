//! The SQLite schema and its migrations, recorded in `awaken_schema_version`.

use rusqlite::{Connection, TransactionBehavior};

use crate::error::{Database, StoreError};

/// The schema, one entry per version; never edit a released entry, append a new one.
pub(super) const MIGRATIONS: &[&str] = &[r#"
CREATE TABLE threads (
    thread_id      TEXT PRIMARY KEY,
    message_count  INTEGER NOT NULL,
    event_count    INTEGER NOT NULL,
    latest_run_id  TEXT,
    state_revision INTEGER NOT NULL,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL
);
CREATE TABLE messages (
    thread_id TEXT NOT NULL,
    idx       INTEGER NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (thread_id, idx)
) WITHOUT ROWID;
CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    thread_id        TEXT NOT NULL,
    parent_run_id    TEXT,
    agent_id         TEXT NOT NULL,
    profile_id       TEXT,
    status           TEXT NOT NULL,
    termination      TEXT,
    steps            INTEGER NOT NULL,
    usage            TEXT NOT NULL,
    spec_digest      TEXT NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    state_revision   INTEGER NOT NULL,
    batch            TEXT,
    lease_owner      TEXT,
    lease_epoch      INTEGER NOT NULL DEFAULT 0,
    lease_expires_at INTEGER
);
CREATE INDEX runs_by_thread ON runs (thread_id, created_at);
CREATE INDEX runs_unfinished ON runs (updated_at) WHERE status <> 'done';
CREATE TABLE run_state (
    run_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
) WITHOUT ROWID;
CREATE TABLE thread_state (
    thread_id TEXT NOT NULL,
    key       TEXT NOT NULL,
    value     TEXT NOT NULL,
    PRIMARY KEY (thread_id, key)
) WITHOUT ROWID;
CREATE TABLE profile_state (
    profile_id TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    version    INTEGER NOT NULL,
    PRIMARY KEY (profile_id, key)
) WITHOUT ROWID;
CREATE TABLE events (
    thread_id TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    run_id    TEXT NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (thread_id, seq)
) WITHOUT ROWID;
"#];

/// Brings the schema to the newest version this build knows, in one transaction; `SchemaTooNew`
/// if the file was written by a newer build.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS awaken_schema_version (version INTEGER NOT NULL PRIMARY KEY)",
    )?;
    let found: i64 = tx.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM awaken_schema_version",
        [],
        |r| r.get(0),
    )?;
    let supported = MIGRATIONS.len() as i64;
    if found > supported {
        return Err(StoreError::SchemaTooNew {
            found,
            supported,
            database: Database::default(),
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO awaken_schema_version (version) VALUES (?1)",
            [i as i64 + 1],
        )?;
        tracing::info!(version = i + 1, "sqlite store: schema migrated");
    }
    tx.commit()?;
    Ok(())
}
