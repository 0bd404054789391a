//! Reads of the SQLite store: a checkpoint in one read transaction, and the listings.

use std::collections::BTreeMap;

use awaken_event::{ProfileId, RunId, ThreadId};
use awaken_state::PersistedState;
use rusqlite::{Connection, OptionalExtension, params};

use crate::codec::{self, RUN_COLUMNS, RawRun};
use crate::commit::{RunRecord, Timestamp};
use crate::error::StoreError;
use crate::store::{Checkpoint, ProfileState, StoredEvent, ThreadSummary};

/// The run record columns of `r` from column `at` on ([`RUN_COLUMNS`]' order).
pub(super) fn raw_run(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<RawRun> {
    Ok(RawRun {
        run_id: r.get(at)?,
        parent_run_id: r.get(at + 1)?,
        agent_id: r.get(at + 2)?,
        profile_id: r.get(at + 3)?,
        status: r.get(at + 4)?,
        termination: r.get(at + 5)?,
        steps: r.get(at + 6)?,
        usage: r.get(at + 7)?,
        spec_digest: r.get(at + 8)?,
        created_at: r.get(at + 9)?,
        updated_at: r.get(at + 10)?,
    })
}

/// A state's keys and values, read by `stmt` for `id` (`what` names it in the error).
fn state_map(
    stmt: &mut rusqlite::CachedStatement<'_>,
    id: &str,
    what: &'static str,
) -> Result<BTreeMap<String, serde_json::Value>, StoreError> {
    let rows = stmt.query_map([id], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut out = BTreeMap::new();
    for row in rows {
        let (k, v) = row?;
        out.insert(k, codec::value(what, &v)?);
    }
    Ok(out)
}

/// See `ThreadStore::load_profile`.
pub(super) fn profile(
    conn: &Connection,
    profile_id: &ProfileId,
) -> Result<ProfileState, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT key, value, version FROM profile_state WHERE profile_id = ?1")?;
    let rows = stmt.query_map([profile_id.as_str()], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut keys = BTreeMap::new();
    for row in rows {
        let (k, v, version) = row?;
        keys.insert(k, codec::profile_entry(&v, version)?);
    }
    Ok(ProfileState {
        profile_id: profile_id.clone(),
        keys,
    })
}

/// See `ThreadStore::load_checkpoint`: one read transaction.
pub(super) fn checkpoint(
    conn: &mut Connection,
    thread_id: &ThreadId,
) -> Result<Option<Checkpoint>, StoreError> {
    let tx = conn.transaction()?;
    let tid = thread_id.as_str();
    let Some((latest_run, thread_revision, event_count)) = thread_row(&tx, tid)? else {
        return Ok(None);
    };
    let mut messages = Vec::new();
    {
        let mut stmt =
            tx.prepare_cached("SELECT body FROM messages WHERE thread_id = ?1 ORDER BY idx")?;
        let rows = stmt.query_map([tid], |r| r.get::<_, String>(0))?;
        for body in rows {
            messages.push(codec::message(&body?)?);
        }
    }
    let thread_state = PersistedState {
        revision: codec::count("state revision", thread_revision)?,
        values: state_map(
            &mut tx.prepare_cached("SELECT key, value FROM thread_state WHERE thread_id = ?1")?,
            tid,
            "thread state",
        )?,
    };
    let mut checkpoint = Checkpoint {
        thread_id: thread_id.clone(),
        messages,
        thread_state,
        run: None,
        run_state: PersistedState::default(),
        profile: None,
        batch: None,
        last_event_seq: codec::count("event count", event_count)?,
    };
    if let Some(rid) = latest_run {
        let (raw, run_revision, batch) = latest_run_row(&tx, &rid, tid)?;
        let run = raw.decode()?;
        checkpoint.run_state = PersistedState {
            revision: codec::count("state revision", run_revision)?,
            values: state_map(
                &mut tx.prepare_cached("SELECT key, value FROM run_state WHERE run_id = ?1")?,
                &rid,
                "run state",
            )?,
        };
        checkpoint.batch = batch.as_deref().map(codec::batch).transpose()?;
        if let Some(pid) = &run.profile_id {
            checkpoint.profile = Some(profile(&tx, pid)?);
        }
        checkpoint.run = Some(run);
    }
    tx.commit()?;
    Ok(Some(checkpoint))
}

/// See `ThreadStore::list_threads`.
pub(super) fn threads(conn: &Connection) -> Result<Vec<ThreadSummary>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT thread_id, message_count, latest_run_id, created_at, updated_at \
         FROM threads ORDER BY thread_id",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, Option<String>>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, i64>(4)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (tid, count, latest, created, updated) = row?;
        out.push(ThreadSummary {
            thread_id: codec::thread_id(&tid)?,
            message_count: codec::count("message count", count)?,
            latest_run_id: latest.as_deref().map(codec::run_id).transpose()?,
            created_at: Timestamp::from_unix_millis(created),
            updated_at: Timestamp::from_unix_millis(updated),
        });
    }
    Ok(out)
}

/// See `ThreadStore::list_runs`.
pub(super) fn runs(conn: &Connection, thread_id: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE thread_id = ?1 ORDER BY created_at, run_id"
    ))?;
    let rows = stmt.query_map([thread_id.as_str()], |r| raw_run(r, 0))?;
    let mut out = Vec::new();
    for row in rows {
        out.push(row?.decode()?);
    }
    Ok(out)
}

/// See `ThreadStore::load_run`.
pub(super) fn run(
    conn: &Connection,
    thread_id: &ThreadId,
    run_id: &RunId,
) -> Result<Option<RunRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?1 AND thread_id = ?2"
    ))?;
    let raw = stmt
        .query_row(params![run_id.as_str(), thread_id.as_str()], |r| {
            raw_run(r, 0)
        })
        .optional()?;
    raw.map(|raw| raw.decode()).transpose()
}

/// See `ThreadStore::latest_run`: the thread's row and its latest run's, with the
/// checkpoint's statements, in one read transaction.
pub(super) fn latest_run(
    conn: &mut Connection,
    thread_id: &ThreadId,
) -> Result<Option<RunRecord>, StoreError> {
    let tx = conn.transaction()?;
    let tid = thread_id.as_str();
    let Some((Some(rid), ..)) = thread_row(&tx, tid)? else {
        return Ok(None);
    };
    let (raw, ..) = latest_run_row(&tx, &rid, tid)?;
    tx.commit()?;
    raw.decode().map(Some)
}

/// The thread row of `tid`: its latest run, state revision and event count.
fn thread_row(
    tx: &rusqlite::Transaction<'_>,
    tid: &str,
) -> Result<Option<(Option<String>, i64, i64)>, StoreError> {
    Ok(tx
        .prepare_cached(
            "SELECT latest_run_id, state_revision, event_count FROM threads WHERE thread_id = ?1",
        )?
        .query_row([tid], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?)
}

/// The row of `rid`, the latest run of thread `tid`, with its state revision and batch. The
/// commit that names a thread's latest run writes it: without its row, the run (and the calls
/// it waits on) would vanish unnoticed, so a missing one is `Corrupt`.
fn latest_run_row(
    tx: &rusqlite::Transaction<'_>,
    rid: &str,
    tid: &str,
) -> Result<(RawRun, i64, Option<String>), StoreError> {
    tx.prepare_cached(&format!(
        "SELECT {RUN_COLUMNS}, state_revision, batch FROM runs \
         WHERE run_id = ?1 AND thread_id = ?2"
    ))?
    .query_row(params![rid, tid], |r| {
        Ok((raw_run(r, 0)?, r.get(11)?, r.get(12)?))
    })
    .optional()?
    .ok_or_else(|| codec::latest_run_missing(rid))
}

/// See `ThreadStore::load_events`.
pub(super) fn events(
    conn: &Connection,
    thread_id: &ThreadId,
    since: u64,
) -> Result<Vec<StoredEvent>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq, run_id, body FROM events WHERE thread_id = ?1 AND seq > ?2 \
         ORDER BY seq",
    )?;
    let rows = stmt.query_map(params![thread_id.as_str(), codec::int(since)], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (seq, rid, body) = row?;
        out.push(StoredEvent {
            seq: codec::count("event seq", seq)?,
            run_id: codec::run_id(&rid)?,
            event: codec::event(&body)?,
        });
    }
    Ok(out)
}

/// See `ThreadStore::run_thread`.
pub(super) fn run_thread(
    conn: &Connection,
    run_id: &RunId,
) -> Result<Option<ThreadId>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT thread_id FROM runs WHERE run_id = ?1")?;
    let thread: Option<String> = stmt
        .query_row([run_id.as_str()], |row| row.get(0))
        .optional()?;
    thread.as_deref().map(codec::thread_id).transpose()
}
