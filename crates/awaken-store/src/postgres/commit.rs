//! A commit as one PostgreSQL transaction: it locks the thread row (`SELECT … FOR UPDATE`) and
//! the run row, so concurrent writers of a thread serialize and the checks hold until `COMMIT`;
//! then the writes, messages appended by index and only changed keys upserted.

use std::collections::BTreeMap;

use awaken_event::{ProfileId, RunId};
use tokio_postgres::{Client, Transaction};

use crate::codec;
use crate::commit::{BatchWrite, RunStatus, ThreadCommit};
use crate::error::CommitError;
use crate::failpoint::{FailPoint, Failpoints};
use crate::lease;
use crate::one_run;
use crate::store::CommitReceipt;

/// Writes `c` in one transaction on `client`, or nothing (`fp` may fail it between two writes).
pub(super) async fn write(
    client: &mut Client,
    c: &ThreadCommit,
    fp: &Failpoints,
) -> Result<CommitReceipt, CommitError> {
    let tx = client.transaction().await?;
    match write_tx(&tx, c, fp).await {
        Ok(receipt) => {
            tx.commit().await?;
            Ok(receipt)
        }
        Err(e) => {
            if let Err(error) = tx.rollback().await {
                tracing::warn!(%error, "postgres store: rollback failed");
            }
            Err(e)
        }
    }
}

async fn write_tx(
    tx: &Transaction<'_>,
    c: &ThreadCommit,
    fp: &Failpoints,
) -> Result<CommitReceipt, CommitError> {
    let tid = c.thread_id.as_str();
    let rid = c.run.run_id.as_str();
    let now = c.run.updated_at.as_unix_millis();

    // Lock the thread row (creating a placeholder that the rollback removes on failure).
    tx.execute(
        "INSERT INTO threads (thread_id, message_count, event_count, latest_run_id, \
             state_revision, created_at, updated_at) VALUES ($1, 0, 0, NULL, 0, $2, $2) \
         ON CONFLICT (thread_id) DO NOTHING",
        &[&tid, &now],
    )
    .await?;
    let row = tx
        .query_one(
            "SELECT message_count, event_count, state_revision FROM threads \
             WHERE thread_id = $1 FOR UPDATE",
            &[&tid],
        )
        .await?;
    let message_count: i64 = row.try_get(0)?;
    let event_count: i64 = row.try_get(1)?;
    let thread_revision: i64 = row.try_get(2)?;
    let actual = codec::count("message count", message_count)?;
    if actual != c.expected_message_count {
        return Err(CommitError::VersionConflict {
            expected: c.expected_message_count,
            actual,
        });
    }
    let run = tx
        .query_opt(
            "SELECT thread_id, lease_owner, lease_epoch, batch, status FROM runs \
             WHERE run_id = $1 FOR UPDATE",
            &[&rid],
        )
        .await?;
    if let Some(run) = &run {
        let stored_tid: String = run.try_get(0)?;
        if stored_tid != tid {
            return Err(CommitError::RunOnOtherThread {
                run_id: c.run.run_id.clone(),
                thread_id: c.thread_id.clone(),
                stored_thread_id: codec::thread_id(&stored_tid)?,
            });
        }
    }
    if let Some(lease) = &c.lease {
        let held = match &run {
            Some(run) => {
                let owner: Option<String> = run.try_get(1)?;
                let epoch: i64 = run.try_get(2)?;
                u64::try_from(epoch).is_ok_and(|epoch| lease::holds(owner.as_deref(), epoch, lease))
            }
            None => false,
        };
        if !held {
            return Err(CommitError::LeaseLost {
                run_id: c.run.run_id.clone(),
            });
        }
    }
    let stored_status = match &run {
        Some(run) => Some(codec::run_status(run.try_get(4)?)?),
        None => None,
    };
    if one_run::must_check(stored_status) {
        // Every commit of the thread locked its row above, and READ COMMITTED reads what was
        // committed before this statement: a run another commit started or finished is seen.
        if let Some(holder) = tx.query_opt(one_run::HOLDER_QUERY, &[&tid]).await? {
            return Err(one_run::busy(
                &c.thread_id,
                codec::run_id(holder.try_get(0)?)?,
                codec::run_status(holder.try_get(1)?)?,
            ));
        }
    }
    if c.run.status == RunStatus::Done
        && matches!(c.batch, BatchWrite::Keep)
        && let Some(run) = &run
        && let Some(batch) = run.try_get::<_, Option<String>>(3)?
    {
        crate::commit::check_batch(&codec::batch(&batch)?, RunStatus::Done)
            .map_err(|v| CommitError::invalid(&c.thread_id, v))?;
    }
    let profile_id = c.run.profile_id.as_ref().map(ProfileId::as_str);
    if let Some(pid) = profile_id
        && !c.profile_versions.is_empty()
    {
        let stmt = tx
            .prepare(
                "SELECT version FROM profile_state WHERE profile_id = $1 AND key = $2 FOR UPDATE",
            )
            .await?;
        for (key, read) in &c.profile_versions {
            let current: i64 = match tx.query_opt(&stmt, &[&pid, key]).await? {
                Some(row) => row.try_get(0)?,
                None => 0,
            };
            if current != codec::int(*read) {
                return Err(CommitError::ProfileConflict { key: key.clone() });
            }
        }
    }

    // Writes.
    if !c.messages.is_empty() {
        let stmt = tx
            .prepare("INSERT INTO messages (thread_id, idx, body) VALUES ($1, $2, $3)")
            .await?;
        for (i, m) in c.messages.iter().enumerate() {
            let body = codec::to_json("message", m)?;
            let idx = message_count + i as i64;
            tx.execute(&stmt, &[&tid, &idx, &body]).await?;
        }
    }
    fp.check(FailPoint::AfterMessages)?;

    let enc = codec::encode_run(&c.run)?;
    let (batch_mode, batch): (i64, Option<String>) = match &c.batch {
        BatchWrite::Keep => (0, None),
        BatchWrite::Set(b) => (1, Some(codec::batch_text(b)?)),
        BatchWrite::Clear => (2, None),
    };
    let run_revision = (!c.run_state.values.is_empty()).then(|| codec::int(c.run_state.revision));
    let parent = c.run.parent_run_id.as_ref().map(RunId::as_str);
    let steps = i64::from(c.run.steps);
    let created = c.run.created_at.as_unix_millis();
    let written = tx.execute(
        "INSERT INTO runs (run_id, thread_id, parent_run_id, agent_id, profile_id, status, \
             termination, steps, usage, spec_digest, created_at, updated_at, state_revision, batch) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, COALESCE($13::BIGINT, 0), $14) \
         ON CONFLICT (run_id) DO UPDATE SET \
             parent_run_id = excluded.parent_run_id, agent_id = excluded.agent_id, \
             profile_id = excluded.profile_id, status = excluded.status, \
             termination = excluded.termination, steps = excluded.steps, usage = excluded.usage, \
             spec_digest = excluded.spec_digest, updated_at = excluded.updated_at, \
             state_revision = COALESCE($13::BIGINT, runs.state_revision), \
             batch = CASE $15::BIGINT WHEN 0 THEN runs.batch WHEN 1 THEN excluded.batch \
                 ELSE NULL END, \
             lease_owner = CASE WHEN excluded.status = 'done' THEN NULL \
                 ELSE runs.lease_owner END, \
             lease_expires_at = CASE WHEN excluded.status = 'done' THEN NULL \
                 ELSE runs.lease_expires_at END \
         WHERE runs.thread_id = excluded.thread_id",
        &[
            &rid,
            &tid,
            &parent,
            &&*c.run.agent_id,
            &profile_id,
            &c.run.status.as_str(),
            &enc.termination,
            &steps,
            &enc.usage,
            &&*c.run.spec_digest,
            &created,
            &now,
            &run_revision,
            &batch,
            &batch_mode,
        ],
    )
    .await?;
    if written == 0 {
        // The run was not there when checked, and another transaction has since put it on
        // another thread (the check's row lock cannot lock a row that does not exist yet).
        let stored: String = tx
            .query_one("SELECT thread_id FROM runs WHERE run_id = $1", &[&rid])
            .await?
            .try_get(0)?;
        return Err(CommitError::RunOnOtherThread {
            run_id: c.run.run_id.clone(),
            thread_id: c.thread_id.clone(),
            stored_thread_id: codec::thread_id(&stored)?,
        });
    }
    fp.check(FailPoint::AfterRun)?;

    if !c.run_state.values.is_empty() {
        let stmt = tx
            .prepare(
                "INSERT INTO run_state (run_id, key, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value",
            )
            .await?;
        for (k, v) in &c.run_state.values {
            let v = codec::state_text("run state", v)?;
            tx.execute(&stmt, &[&rid, k, &v]).await?;
        }
    }
    if !c.thread_state.values.is_empty() {
        let stmt = tx
            .prepare(
                "INSERT INTO thread_state (thread_id, key, value) VALUES ($1, $2, $3) \
                 ON CONFLICT (thread_id, key) DO UPDATE SET value = excluded.value",
            )
            .await?;
        for (k, v) in &c.thread_state.values {
            let v = codec::state_text("thread state", v)?;
            tx.execute(&stmt, &[&tid, k, &v]).await?;
        }
    }
    let mut profile_versions = BTreeMap::new();
    if let Some(pid) = profile_id
        && !c.profile_state.values.is_empty()
    {
        // The version condition also catches a concurrent first insert of the same key, which
        // the `FOR UPDATE` above cannot lock.
        let stmt = tx
            .prepare(
                "INSERT INTO profile_state (profile_id, key, value, version) \
                 VALUES ($1, $2, $3, 1) \
                 ON CONFLICT (profile_id, key) DO UPDATE SET value = excluded.value, \
                     version = profile_state.version + 1 \
                 WHERE profile_state.version = $4",
            )
            .await?;
        // In key order, like the `FOR UPDATE` above: two commits writing the same new keys of
        // one profile take their row locks in one order (a conflict, retried, not a deadlock).
        let mut written: Vec<_> = c.profile_state.values.iter().collect();
        written.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (k, v) in written {
            let v = codec::state_text("profile state", v)?;
            let read = c.profile_versions.get(k.as_ref()).copied().unwrap_or(0);
            let n = tx.execute(&stmt, &[&pid, k, &v, &codec::int(read)]).await?;
            if n != 1 {
                return Err(CommitError::ProfileConflict { key: k.to_string() });
            }
            profile_versions.insert(k.to_string(), read + 1);
        }
    }
    fp.check(FailPoint::AfterState)?;

    let mut seq = event_count;
    if !c.events.is_empty() {
        let stmt = tx
            .prepare("INSERT INTO events (thread_id, seq, run_id, body) VALUES ($1, $2, $3, $4)")
            .await?;
        for e in c.events.iter() {
            seq += 1;
            let body = codec::to_json("event", e)?;
            tx.execute(&stmt, &[&tid, &seq, &rid, &body]).await?;
        }
    }
    fp.check(FailPoint::AfterEvents)?;

    let thread_revision = if c.thread_state.values.is_empty() {
        thread_revision
    } else {
        codec::int(c.thread_state.revision)
    };
    let new_count = codec::int(c.message_count_after());
    tx.execute(
        "UPDATE threads SET message_count = $2, event_count = $3, latest_run_id = $4, \
             state_revision = $5, updated_at = $6 WHERE thread_id = $1",
        &[&tid, &new_count, &seq, &rid, &thread_revision, &now],
    )
    .await?;
    Ok(CommitReceipt {
        message_count: c.message_count_after(),
        last_event_seq: codec::count("event count", seq)?,
        profile_versions,
    })
}
