//! The PostgreSQL schema migrations.

/// The schema, one entry per version; never edit a released entry, append a new one.
pub(super) const MIGRATIONS: &[&str] = &[r#"
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
"#];
