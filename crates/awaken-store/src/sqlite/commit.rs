//! A commit as one `IMMEDIATE` SQLite transaction: every check first (the transaction holds
//! the write lock, so they stay true until `COMMIT`), then the writes, messages appended by index
//! and only changed keys upserted.

use std::collections::BTreeMap;

use awaken_event::{ProfileId, RunId};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::codec;
use crate::commit::{BatchWrite, RunStatus, ThreadCommit};
use crate::error::CommitError;
use crate::failpoint::{FailPoint, Failpoints};
use crate::lease;
use crate::one_run;
use crate::store::CommitReceipt;

/// Writes `c` in one transaction on `conn`, or nothing (`fp` may fail it between two writes).
pub(super) fn write(
    conn: &mut Connection,
    c: &ThreadCommit,
    fp: &Failpoints,
) -> Result<CommitReceipt, CommitError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let tid = c.thread_id.as_str();
    let rid = c.run.run_id.as_str();

    // Checks first (the transaction holds the write lock, so they stay true until COMMIT).
    let thread: Option<(i64, i64, i64)> = tx
        .prepare_cached(
            "SELECT message_count, event_count, state_revision FROM threads WHERE thread_id = ?1",
        )?
        .query_row([tid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let (message_count, event_count, thread_revision) = thread.unwrap_or((0, 0, 0));
    let actual = codec::count("message count", message_count)?;
    if actual != c.expected_message_count {
        return Err(CommitError::VersionConflict {
            expected: c.expected_message_count,
            actual,
        });
    }
    let run: Option<(String, Option<String>, i64, Option<String>, String)> = tx
        .prepare_cached(
            "SELECT thread_id, lease_owner, lease_epoch, batch, status FROM runs \
             WHERE run_id = ?1",
        )?
        .query_row([rid], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .optional()?;
    if let Some((stored_tid, ..)) = &run
        && stored_tid != tid
    {
        return Err(CommitError::RunOnOtherThread {
            run_id: c.run.run_id.clone(),
            thread_id: c.thread_id.clone(),
            stored_thread_id: codec::thread_id(stored_tid)?,
        });
    }
    if let Some(lease) = c.lease_to_check(run.is_some()) {
        let held = run.as_ref().is_some_and(|(_, owner, epoch, ..)| {
            u64::try_from(*epoch).is_ok_and(|epoch| lease::holds(owner.as_deref(), epoch, &lease))
        });
        if !held {
            return Err(CommitError::LeaseLost {
                run_id: c.run.run_id.clone(),
            });
        }
    }
    let stored_status = run
        .as_ref()
        .map(|(.., status)| codec::run_status(status))
        .transpose()?;
    if one_run::must_check(stored_status) {
        // The write lock is held, so no other run can start or finish before COMMIT.
        let holder: Option<(String, String)> = tx
            .prepare_cached(one_run::HOLDER_QUERY)?
            .query_row([tid], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        if let Some((holder, status)) = holder {
            return Err(one_run::busy(
                &c.thread_id,
                codec::run_id(&holder)?,
                codec::run_status(&status)?,
            ));
        }
    }
    if c.run.status == RunStatus::Done
        && matches!(c.batch, BatchWrite::Keep)
        && let Some((_, _, _, Some(batch), _)) = &run
    {
        crate::commit::check_batch(&codec::batch(batch)?, RunStatus::Done)
            .map_err(|v| CommitError::invalid(&c.thread_id, v))?;
    }
    let profile_id = c.run.profile_id.as_ref().map(ProfileId::as_str);
    if let Some(pid) = profile_id {
        let mut stmt = tx.prepare_cached(
            "SELECT version FROM profile_state WHERE profile_id = ?1 AND key = ?2",
        )?;
        for (key, read) in &c.profile_versions {
            let current: Option<i64> =
                stmt.query_row(params![pid, key], |r| r.get(0)).optional()?;
            if current.unwrap_or(0) != codec::int(*read) {
                return Err(CommitError::ProfileConflict { key: key.clone() });
            }
        }
    }

    // Writes.
    {
        let mut stmt =
            tx.prepare_cached("INSERT INTO messages (thread_id, idx, body) VALUES (?1, ?2, ?3)")?;
        for (i, m) in c.messages.iter().enumerate() {
            let body = codec::to_json("message", m)?;
            stmt.execute(params![tid, message_count + i as i64, body])?;
        }
    }
    fp.check(FailPoint::AfterMessages)?;

    let enc = codec::encode_run(&c.run)?;
    let (batch_mode, batch) = match &c.batch {
        BatchWrite::Keep => (0, None),
        BatchWrite::Set(b) => (1, Some(codec::batch_text(b)?)),
        BatchWrite::Clear => (2, None),
    };
    let run_revision = (!c.run_state.values.is_empty()).then(|| codec::int(c.run_state.revision));
    let new_lease = c.lease_to_create();
    tx.prepare_cached(
        "INSERT INTO runs (run_id, thread_id, parent_run_id, agent_id, profile_id, status, \
             termination, steps, usage, spec_digest, created_at, updated_at, state_revision, batch, \
             lease_owner, lease_epoch, lease_expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, COALESCE(?13, 0), ?14, \
             ?16, ?16 IS NOT NULL, ?17) \
         ON CONFLICT (run_id) DO UPDATE SET \
             parent_run_id = excluded.parent_run_id, agent_id = excluded.agent_id, \
             profile_id = excluded.profile_id, status = excluded.status, \
             termination = excluded.termination, steps = excluded.steps, usage = excluded.usage, \
             spec_digest = excluded.spec_digest, updated_at = excluded.updated_at, \
             state_revision = COALESCE(?13, runs.state_revision), \
             batch = CASE ?15 WHEN 0 THEN runs.batch WHEN 1 THEN excluded.batch ELSE NULL END, \
             lease_owner = CASE WHEN excluded.status = 'done' THEN NULL ELSE runs.lease_owner END, \
             lease_expires_at = CASE WHEN excluded.status = 'done' THEN NULL \
                 ELSE runs.lease_expires_at END",
    )?
    .execute(params![
        rid,
        tid,
        c.run.parent_run_id.as_ref().map(RunId::as_str),
        c.run.agent_id,
        profile_id,
        c.run.status.as_str(),
        enc.termination,
        i64::from(c.run.steps),
        enc.usage,
        c.run.spec_digest,
        c.run.created_at.as_unix_millis(),
        c.run.updated_at.as_unix_millis(),
        run_revision,
        batch,
        batch_mode,
        new_lease.map(|l| l.worker_id.as_str()),
        new_lease.map(|l| l.expires_at.as_unix_millis()),
    ])?;
    fp.check(FailPoint::AfterRun)?;

    if !c.run_state.values.is_empty() {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO run_state (run_id, key, value) VALUES (?1, ?2, ?3) \
             ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value",
        )?;
        for (k, v) in &c.run_state.values {
            stmt.execute(params![rid, k, codec::state_text("run state", v)?])?;
        }
    }
    if !c.thread_state.values.is_empty() {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO thread_state (thread_id, key, value) VALUES (?1, ?2, ?3) \
             ON CONFLICT (thread_id, key) DO UPDATE SET value = excluded.value",
        )?;
        for (k, v) in &c.thread_state.values {
            stmt.execute(params![tid, k, codec::state_text("thread state", v)?])?;
        }
    }
    let mut profile_versions = BTreeMap::new();
    if let Some(pid) = profile_id
        && !c.profile_state.values.is_empty()
    {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO profile_state (profile_id, key, value, version) VALUES (?1, ?2, ?3, 1) \
             ON CONFLICT (profile_id, key) DO UPDATE SET value = excluded.value, \
                 version = profile_state.version + 1",
        )?;
        for (k, v) in &c.profile_state.values {
            stmt.execute(params![pid, k, codec::state_text("profile state", v)?])?;
            let read = c.profile_versions.get(k.as_ref()).copied().unwrap_or(0);
            profile_versions.insert(k.to_string(), read + 1);
        }
    }
    fp.check(FailPoint::AfterState)?;

    let mut seq = event_count;
    if !c.events.is_empty() {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO events (thread_id, seq, run_id, body) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for e in c.events.iter() {
            seq += 1;
            stmt.execute(params![tid, seq, rid, codec::to_json("event", e)?])?;
        }
    }
    fp.check(FailPoint::AfterEvents)?;

    let thread_revision = if c.thread_state.values.is_empty() {
        thread_revision
    } else {
        codec::int(c.thread_state.revision)
    };
    let new_count = codec::int(c.message_count_after());
    tx.prepare_cached(
        "INSERT INTO threads (thread_id, message_count, event_count, latest_run_id, \
             state_revision, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) \
         ON CONFLICT (thread_id) DO UPDATE SET message_count = excluded.message_count, \
             event_count = excluded.event_count, latest_run_id = excluded.latest_run_id, \
             state_revision = excluded.state_revision, updated_at = excluded.updated_at",
    )?
    .execute(params![
        tid,
        new_count,
        seq,
        rid,
        thread_revision,
        c.run.updated_at.as_unix_millis()
    ])?;
    tx.commit()?;
    Ok(CommitReceipt {
        message_count: c.message_count_after(),
        last_event_seq: codec::count("event count", seq)?,
        profile_versions,
    })
}
