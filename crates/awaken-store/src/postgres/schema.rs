//! The PostgreSQL schema and its migrations, applied on connect under an advisory lock and
//! recorded in `awaken_schema_version`.

use crate::error::{Database, StoreError};

use super::pool::Pool;

/// The schema, one entry per version; never edit a released entry, append a new one. Version 2
/// is the run queue: its hot table keeps only queued and claimed jobs (a finished job's row is
/// deleted, a dead one moved out), with room on each page for the lease updates to stay
/// heap-only, and vacuumed after a few hundred dead rows rather than a fraction of the table.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE threads (
    thread_id      TEXT PRIMARY KEY,
    message_count  BIGINT NOT NULL,
    event_count    BIGINT NOT NULL,
    latest_run_id  TEXT,
    state_revision BIGINT NOT NULL,
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL
);
CREATE TABLE messages (
    thread_id TEXT NOT NULL,
    idx       BIGINT NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (thread_id, idx)
);
CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    thread_id        TEXT NOT NULL,
    parent_run_id    TEXT,
    agent_id         TEXT NOT NULL,
    profile_id       TEXT,
    status           TEXT NOT NULL,
    termination      TEXT,
    steps            BIGINT NOT NULL,
    usage            TEXT NOT NULL,
    spec_digest      TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    state_revision   BIGINT NOT NULL,
    batch            TEXT,
    lease_owner      TEXT,
    lease_epoch      BIGINT NOT NULL DEFAULT 0,
    lease_expires_at BIGINT
);
CREATE INDEX runs_by_thread ON runs (thread_id, created_at);
CREATE INDEX runs_unfinished ON runs (updated_at) WHERE status <> 'done';
CREATE TABLE run_state (
    run_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE TABLE thread_state (
    thread_id TEXT NOT NULL,
    key       TEXT NOT NULL,
    value     TEXT NOT NULL,
    PRIMARY KEY (thread_id, key)
);
CREATE TABLE profile_state (
    profile_id TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    version    BIGINT NOT NULL,
    PRIMARY KEY (profile_id, key)
);
CREATE TABLE events (
    thread_id TEXT NOT NULL,
    seq       BIGINT NOT NULL,
    run_id    TEXT NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (thread_id, seq)
);
"#,
    r#"
CREATE TABLE run_queue (
    job_id           BIGSERIAL PRIMARY KEY,
    thread_id        TEXT NOT NULL UNIQUE,
    run_id           TEXT NOT NULL,
    agent_id         TEXT NOT NULL,
    payload          TEXT NOT NULL,
    priority         INTEGER NOT NULL,
    not_before       BIGINT NOT NULL,
    enqueued_at      BIGINT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    claims           INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    lease_owner      TEXT,
    lease_expires_at BIGINT,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    last_error       TEXT
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);
CREATE INDEX run_queue_order ON run_queue (priority DESC, job_id);
CREATE TABLE run_queue_dead (
    job_id      BIGINT PRIMARY KEY,
    thread_id   TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    agent_id    TEXT NOT NULL,
    payload     TEXT NOT NULL,
    priority    INTEGER NOT NULL,
    attempts    INTEGER NOT NULL,
    enqueued_at BIGINT NOT NULL,
    died_at     BIGINT NOT NULL,
    last_error  TEXT NOT NULL
);
CREATE INDEX run_queue_dead_by_thread ON run_queue_dead (thread_id, job_id);
"#,
    // Every commit rewrites its run's row: with no index on a column a commit changes (the
    // unfinished runs' index was on `updated_at`), the update stays in the row's page and adds
    // no index entries, and the room left in each page gives it space there.
    r#"
DROP INDEX runs_unfinished;
CREATE INDEX runs_unfinished ON runs (run_id) WHERE status <> 'done';
ALTER TABLE runs SET (fillfactor = 70);
"#,
    // Where a job's events start: a follower of a job that continues an earlier run tells its
    // activation's end from that run's earlier ones.
    r#"
ALTER TABLE run_queue ADD COLUMN after_event BIGINT NOT NULL DEFAULT 0;
"#,
    // Steering messages for queued or claimed jobs, until their senders read the answers.
    r#"
CREATE TABLE run_steering (
    steer_id        BIGSERIAL PRIMARY KEY,
    job_id          BIGINT NOT NULL,
    thread_id       TEXT NOT NULL,
    message         TEXT NOT NULL,
    sent_at         BIGINT NOT NULL,
    delivered_claim INTEGER,
    state           TEXT NOT NULL DEFAULT 'waiting',
    step            INTEGER,
    answered_at     BIGINT
);
CREATE INDEX run_steering_by_job ON run_steering (job_id);
"#,
];

/// Advisory lock key of schema migrations (any constant shared by every build).
const MIGRATION_LOCK: i64 = 0x6177_616b_656e;

/// Creates the schema if needed and brings it to the newest version this build knows, in one
/// transaction; `SchemaTooNew` if the database was written by a newer build.
pub(super) async fn migrate(pool: &Pool) -> Result<(), StoreError> {
    let mut conn = pool.get().await?;
    let tx = conn.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    if let Some(schema) = &pool.schema {
        tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
            .await?;
    }
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS awaken_schema_version (version BIGINT PRIMARY KEY)",
    )
    .await?;
    let found: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0)::BIGINT FROM awaken_schema_version",
            &[],
        )
        .await?
        .try_get(0)?;
    let supported = MIGRATIONS.len() as i64;
    if found > supported {
        return Err(StoreError::SchemaTooNew {
            found,
            supported,
            database: Database::default(),
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.batch_execute(sql).await?;
        let version = i as i64 + 1;
        tx.execute(
            "INSERT INTO awaken_schema_version (version) VALUES ($1)",
            &[&version],
        )
        .await?;
        tracing::info!(version, "postgres store: schema migrated");
    }
    tx.commit().await?;
    Ok(())
}
