//! A commit as one PostgreSQL transaction: it locks the thread row (`SELECT … FOR UPDATE`) and
//! the run row, so concurrent writers of a thread serialize and the checks hold until `COMMIT`;
//! then the writes, messages appended by index and only changed keys upserted.
//!
//! Every statement is prepared once per connection ([`Statements`]); the ones that lock are
//! sent together, and the writes (each table's rows from arrays) are one statement, so a
//! commit costs a handful of statements and round trips whatever it holds.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use awaken_event::{ProfileId, RunId};
use awaken_state::DeltaValues;
use tokio_postgres::Client;
use tokio_postgres::types::ToSql;

use super::pool::{End, PooledClient, Statements};

use crate::codec;
use crate::commit::{BatchWrite, RunStatus, ThreadCommit};
use crate::error::CommitError;
use crate::failpoint::{FailPoint, Failpoints};
use crate::lease;
use crate::one_run;
use crate::store::CommitReceipt;

/// Writes `c` in one transaction on `conn`, or nothing (`fp` may fail it between two writes).
pub(super) async fn write(
    conn: &mut PooledClient<'_>,
    c: &ThreadCommit,
    fp: &Failpoints,
) -> Result<CommitReceipt, CommitError> {
    let (client, statements) = conn.begin();
    match write_tx(client, statements, c, fp).await {
        Ok(receipt) => {
            conn.end(End::Commit).await?;
            Ok(receipt)
        }
        Err(e) => {
            if let Err(error) = conn.end(End::Rollback).await {
                tracing::warn!(%error, "postgres store: rollback failed");
            }
            Err(e)
        }
    }
}

pub(super) const ENSURE_THREAD: &str = "INSERT INTO threads (thread_id, message_count, \
         event_count, latest_run_id, state_revision, created_at, updated_at) \
     VALUES ($1, 0, 0, NULL, 0, $2, $2) ON CONFLICT (thread_id) DO NOTHING";
pub(super) const LOCK_THREAD: &str = "SELECT message_count, event_count, state_revision \
     FROM threads WHERE thread_id = $1 FOR UPDATE";
pub(super) const LOCK_RUN: &str = "SELECT thread_id, lease_owner, lease_epoch, batch, status \
     FROM runs WHERE run_id = $1 FOR UPDATE";
const LOCK_PROFILE_KEY: &str =
    "SELECT version FROM profile_state WHERE profile_id = $1 AND key = $2 FOR UPDATE";
/// The writes of a commit but the profile's, as one statement: the thread's counters and the
/// run's row, whose upsert returns nothing when the run is another thread's, then the rows of
/// the tables the commit has any for (messages, events, changed keys), each from arrays. A
/// table left out costs the statement nothing, where an empty array's insert would still be
/// planned and started; so a commit writes with one of sixteen statements, made once.
///
/// The parameters: `$1`–`$15` the run's row, `$16`–`$18` the thread's counters and revision,
/// `$19`–`$20` the lease a new run is created with, then two arrays per table written, in the
/// order of [`TABLE_CLAUSES`].
fn write_sql(written: [bool; 4]) -> &'static str {
    static FORMS: LazyLock<Vec<String>> = LazyLock::new(|| {
        (0..16usize)
            .map(|mask| {
                let mut sql = String::from("WITH ");
                let mut next = 20;
                for (i, clause) in TABLE_CLAUSES.iter().enumerate() {
                    if mask & (1 << i) != 0 {
                        let (a, b) = (format!("${}", next + 1), format!("${}", next + 2));
                        next += 2;
                        sql.push_str(&clause.replace("{a}", &a).replace("{b}", &b));
                    }
                }
                sql.push_str(WRITE_THREAD_AND_RUN);
                sql
            })
            .collect()
    });
    let mask = written
        .iter()
        .rev()
        .fold(0, |mask, w| mask << 1 | usize::from(*w));
    &FORMS[mask]
}

/// The write statements of a run's steps: its events, with or without messages and the run's
/// state (a thread's state is written by few runs).
pub(super) fn run_writes() -> impl Iterator<Item = &'static str> {
    [false, true]
        .into_iter()
        .flat_map(|messages| [false, true].map(|run_state| [messages, true, run_state, false]))
        .map(write_sql)
}

/// The clauses writing the tables a commit may write besides the thread's and the run's rows,
/// in the statement's order (`{a}` and `{b}` stand for the clause's two arrays' parameters).
const TABLE_CLAUSES: [&str; 4] = [
    "messages_written AS (INSERT INTO messages (thread_id, idx, body) \
     SELECT $2, m.idx, m.body FROM UNNEST({a}::BIGINT[], {b}::TEXT[]) AS m(idx, body)), ",
    "events_written AS (INSERT INTO events (thread_id, seq, run_id, body) \
     SELECT $2, e.seq, $1, e.body FROM UNNEST({a}::BIGINT[], {b}::TEXT[]) AS e(seq, body)), ",
    "run_state_written AS (INSERT INTO run_state (run_id, key, value) \
     SELECT $1, s.key, s.value FROM UNNEST({a}::TEXT[], {b}::TEXT[]) AS s(key, value) \
     ON CONFLICT (run_id, key) DO UPDATE SET value = excluded.value), ",
    "thread_state_written AS (INSERT INTO thread_state (thread_id, key, value) \
     SELECT $2, s.key, s.value FROM UNNEST({a}::TEXT[], {b}::TEXT[]) AS s(key, value) \
     ON CONFLICT (thread_id, key) DO UPDATE SET value = excluded.value), ",
];

/// The end of every write statement: the thread's counters, then the run's row.
const WRITE_THREAD_AND_RUN: &str = "thread_written AS (UPDATE threads SET \
         message_count = $16, event_count = $17, latest_run_id = $1, state_revision = $18, \
         updated_at = $12 WHERE thread_id = $2) \
     INSERT INTO runs (run_id, thread_id, parent_run_id, agent_id, profile_id, status, \
         termination, steps, usage, spec_digest, created_at, updated_at, state_revision, batch, \
         lease_owner, lease_epoch, lease_expires_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, COALESCE($13::BIGINT, 0), $14, \
         $19::TEXT, CASE WHEN $19::TEXT IS NULL THEN 0 ELSE 1 END, $20::BIGINT) \
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
     WHERE runs.thread_id = excluded.thread_id";

/// A commit's rows, encoded for the write statement's arrays.
struct Rows<'a> {
    indexes: Vec<i64>,
    messages: Vec<String>,
    seqs: Vec<i64>,
    events: Vec<String>,
    run_keys: Vec<&'a str>,
    run_values: Vec<String>,
    thread_keys: Vec<&'a str>,
    thread_values: Vec<String>,
}

impl Rows<'_> {
    /// For each of [`TABLE_CLAUSES`]: whether the commit has rows for it, and its two arrays.
    fn tables(&self) -> [(bool, [&(dyn ToSql + Sync); 2]); 4] {
        [
            (!self.messages.is_empty(), [&self.indexes, &self.messages]),
            (!self.events.is_empty(), [&self.seqs, &self.events]),
            (
                !self.run_keys.is_empty(),
                [&self.run_keys, &self.run_values],
            ),
            (
                !self.thread_keys.is_empty(),
                [&self.thread_keys, &self.thread_values],
            ),
        ]
    }
}

/// A run lease's renewal and release, matched on its holder and epoch.
pub(super) const RENEW_RUN_LEASE: &str = "UPDATE runs SET lease_expires_at = $1 \
     WHERE run_id = $2 AND lease_owner = $3 AND lease_epoch = $4";
pub(super) const RELEASE_RUN_LEASE: &str = "UPDATE runs SET lease_owner = NULL, \
     lease_expires_at = NULL WHERE run_id = $1 AND lease_owner = $2 AND lease_epoch = $3";
pub(super) const RUN_THREAD: &str = "SELECT thread_id FROM runs WHERE run_id = $1";
const UPSERT_PROFILE_KEY: &str = "INSERT INTO profile_state (profile_id, key, value, version) \
     VALUES ($1, $2, $3, 1) \
     ON CONFLICT (profile_id, key) DO UPDATE SET value = excluded.value, \
         version = profile_state.version + 1 \
     WHERE profile_state.version = $4";

/// The transaction's statements, from its `BEGIN` (sent with the locks) to its last write.
async fn write_tx(
    tx: &Client,
    st: &mut Statements,
    c: &ThreadCommit,
    fp: &Failpoints,
) -> Result<CommitReceipt, CommitError> {
    let tid = c.thread_id.as_str();
    let rid = c.run.run_id.as_str();
    let now = c.run.updated_at.as_unix_millis();

    // Begin, lock the thread row, then the run's; the statements go out together and run in
    // this order. A thread's first commit (none of its messages expected) first creates a
    // placeholder row to lock, which the rollback removes on failure; any later commit finds
    // the row, and a missing one is a thread with no messages, as the count check says.
    let lock_thread = st.get(tx, LOCK_THREAD).await?;
    let lock_run = st.get(tx, LOCK_RUN).await?;
    let thread_params: [&(dyn ToSql + Sync); 1] = [&tid];
    let run_params: [&(dyn ToSql + Sync); 1] = [&rid];
    let (row, run) = if c.expected_message_count == 0 {
        let ensure_thread = st.get(tx, ENSURE_THREAD).await?;
        let ensure_params: [&(dyn ToSql + Sync); 2] = [&tid, &now];
        // Biased: polled in this order, the first failure reported is the first statement's
        // (those after it fail only because the transaction was aborted).
        let (_, _, row, run) = tokio::try_join!(
            biased;
            tx.batch_execute("BEGIN"),
            tx.execute(&ensure_thread, &ensure_params),
            tx.query_one(&lock_thread, &thread_params),
            tx.query_opt(&lock_run, &run_params),
        )?;
        (row, run)
    } else {
        let (_, row, run) = tokio::try_join!(
            biased;
            tx.batch_execute("BEGIN"),
            tx.query_opt(&lock_thread, &thread_params),
            tx.query_opt(&lock_run, &run_params),
        )?;
        let Some(row) = row else {
            return Err(CommitError::VersionConflict {
                expected: c.expected_message_count,
                actual: 0,
            });
        };
        (row, run)
    };
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
    if let Some(lease) = c.lease_to_check(run.is_some()) {
        let held = match &run {
            Some(run) => {
                let owner: Option<String> = run.try_get(1)?;
                let epoch: i64 = run.try_get(2)?;
                u64::try_from(epoch)
                    .is_ok_and(|epoch| lease::holds(owner.as_deref(), epoch, &lease))
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
        let holder = st.get(tx, one_run::HOLDER_QUERY).await?;
        if let Some(holder) = tx.query_opt(&holder, &[&tid]).await? {
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
        let stmt = st.get(tx, LOCK_PROFILE_KEY).await?;
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
    let message_rows = c
        .messages
        .iter()
        .map(|m| codec::to_json("message", m))
        .collect::<Result<Vec<_>, _>>()?;
    let seq = event_count + c.events.len() as i64;
    let event_rows = c
        .events
        .iter()
        .map(|e| codec::to_json("event", e))
        .collect::<Result<Vec<_>, _>>()?;
    let (run_keys, run_values) = state_rows("run state", &c.run_state.values)?;
    let (thread_keys, thread_values) = state_rows("thread state", &c.thread_state.values)?;
    let rows = Rows {
        indexes: (message_count..).take(c.messages.len()).collect(),
        messages: message_rows,
        seqs: (event_count + 1..=seq).collect(),
        events: event_rows,
        run_keys,
        run_values,
        thread_keys,
        thread_values,
    };
    let thread_revision = if c.thread_state.values.is_empty() {
        thread_revision
    } else {
        codec::int(c.thread_state.revision)
    };
    let new_count = codec::int(c.message_count_after());
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
    let (agent_id, status, spec_digest) =
        (&*c.run.agent_id, c.run.status.as_str(), &*c.run.spec_digest);
    let new_lease = c.lease_to_create();
    let lease_owner = new_lease.map(|l| l.worker_id.as_str());
    let lease_expires_at = new_lease.map(|l| l.expires_at.as_unix_millis());
    let tables = rows.tables();
    let write = st
        .get(tx, write_sql(tables.map(|(written, _)| written)))
        .await?;
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![
        &rid,
        &tid,
        &parent,
        &agent_id,
        &profile_id,
        &status,
        &enc.termination,
        &steps,
        &enc.usage,
        &spec_digest,
        &created,
        &now,
        &run_revision,
        &batch,
        &batch_mode,
        &new_count,
        &seq,
        &thread_revision,
        &lease_owner,
        &lease_expires_at,
    ];
    for (written, arrays) in tables {
        if written {
            params.extend(arrays);
        }
    }
    let written = tx.execute(&write, &params).await?;
    if written == 0 {
        // The run was not there when checked, and another transaction has since put it on
        // another thread (the check's row lock cannot lock a row that does not exist yet).
        let run_thread = st.get(tx, RUN_THREAD).await?;
        let stored: String = tx.query_one(&run_thread, &[&rid]).await?.try_get(0)?;
        return Err(CommitError::RunOnOtherThread {
            run_id: c.run.run_id.clone(),
            thread_id: c.thread_id.clone(),
            stored_thread_id: codec::thread_id(&stored)?,
        });
    }
    // The writes above are one statement: a failure injected after any of them is one after
    // all, and the rollback takes them back alike.
    fp.check(FailPoint::AfterMessages)?;
    fp.check(FailPoint::AfterRun)?;

    let mut profile_versions = BTreeMap::new();
    if let Some(pid) = profile_id
        && !c.profile_state.values.is_empty()
    {
        // The version condition also catches a concurrent first insert of the same key, which
        // the `FOR UPDATE` above cannot lock.
        let stmt = st.get(tx, UPSERT_PROFILE_KEY).await?;
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
    fp.check(FailPoint::AfterEvents)?;
    Ok(CommitReceipt {
        message_count: c.message_count_after(),
        last_event_seq: codec::count("event count", seq)?,
        profile_versions,
    })
}

/// A state write's keys and encoded values, as two arrays for one statement.
fn state_rows<'a>(
    what: &'static str,
    values: &'a DeltaValues,
) -> Result<(Vec<&'a str>, Vec<String>), CommitError> {
    let mut keys = Vec::with_capacity(values.len());
    let mut encoded = Vec::with_capacity(values.len());
    for (k, v) in values.iter() {
        keys.push(&**k);
        encoded.push(codec::state_text(what, v)?);
    }
    Ok((keys, encoded))
}
