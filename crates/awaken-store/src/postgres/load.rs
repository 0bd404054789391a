//! Reads of the PostgreSQL store: a checkpoint in one repeatable-read transaction, and the
//! listings.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use awaken_event::{ProfileId, RunId, ThreadId};
use awaken_state::PersistedState;
use tokio_postgres::{Client, GenericClient, IsolationLevel, Row, Transaction};

use super::pool::{Prepared, Statements};

use crate::codec::{self, RUN_COLUMNS, RawRun};
use crate::commit::{RunRecord, Timestamp};
use crate::error::StoreError;
use crate::store::{Checkpoint, ProfileState, StoredEvent, ThreadSummary};

/// The run record columns of `row` from column `at` on ([`RUN_COLUMNS`]' order).
pub(super) fn raw_run(row: &Row, at: usize) -> Result<RawRun, tokio_postgres::Error> {
    Ok(RawRun {
        run_id: row.try_get(at)?,
        parent_run_id: row.try_get(at + 1)?,
        agent_id: row.try_get(at + 2)?,
        profile_id: row.try_get(at + 3)?,
        status: row.try_get(at + 4)?,
        termination: row.try_get(at + 5)?,
        steps: row.try_get(at + 6)?,
        usage: row.try_get(at + 7)?,
        spec_digest: row.try_get(at + 8)?,
        created_at: row.try_get(at + 9)?,
        updated_at: row.try_get(at + 10)?,
    })
}

/// A state's keys and values, read by `sql` for `id` (`what` names it in the error).
async fn state_map(
    tx: &mut Prepared<'_, Transaction<'_>>,
    sql: &str,
    id: &str,
    what: &'static str,
) -> Result<BTreeMap<String, serde_json::Value>, StoreError> {
    let mut out = BTreeMap::new();
    for row in tx.query(sql, &[&id]).await? {
        let k: String = row.try_get(0)?;
        let v: String = row.try_get(1)?;
        out.insert(k, codec::value(what, &v)?);
    }
    Ok(out)
}

/// See `ThreadStore::load_profile`.
pub(super) async fn profile<C: GenericClient + Sync>(
    client: &mut Prepared<'_, C>,
    profile_id: &ProfileId,
) -> Result<ProfileState, StoreError> {
    let mut keys = BTreeMap::new();
    let rows = client
        .query(
            "SELECT key, value, version FROM profile_state WHERE profile_id = $1",
            &[&profile_id.as_str()],
        )
        .await?;
    for row in rows {
        let k: String = row.try_get(0)?;
        let v: String = row.try_get(1)?;
        let version: i64 = row.try_get(2)?;
        keys.insert(k, codec::profile_entry(&v, version)?);
    }
    Ok(ProfileState {
        profile_id: profile_id.clone(),
        keys,
    })
}

/// See `ThreadStore::load_checkpoint`: one read-only, repeatable-read transaction.
pub(super) async fn checkpoint(
    client: &mut Client,
    statements: &mut Statements,
    thread_id: &ThreadId,
) -> Result<Option<Checkpoint>, StoreError> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let checkpoint = checkpoint_tx(
        &mut Prepared {
            client: &tx,
            statements,
        },
        thread_id,
    )
    .await?;
    tx.commit().await?;
    Ok(checkpoint)
}

// A checkpoint's statements: the thread's row, its messages and state, then its latest run's
// row and state.
pub(super) const THREAD_ROW: &str =
    "SELECT latest_run_id, state_revision, event_count FROM threads WHERE thread_id = $1";
pub(super) const MESSAGES: &str = "SELECT body FROM messages WHERE thread_id = $1 ORDER BY idx";
pub(super) const THREAD_STATE: &str = "SELECT key, value FROM thread_state WHERE thread_id = $1";
pub(super) static RUN_ROW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {RUN_COLUMNS}, state_revision, batch FROM runs WHERE run_id = $1 AND thread_id = $2"
    )
});
pub(super) const RUN_STATE: &str = "SELECT key, value FROM run_state WHERE run_id = $1";
/// A thread's runs, oldest first.
static RUNS: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT {RUN_COLUMNS} FROM runs WHERE thread_id = $1 ORDER BY created_at, run_id")
});
/// A run of a thread, by its id.
pub(super) static RUN: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1 AND thread_id = $2")
});
/// The thread's row and its latest run's, in one statement.
pub(super) static LATEST_RUN: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT t.latest_run_id, r.* FROM threads t LEFT JOIN LATERAL \
             (SELECT {RUN_COLUMNS} FROM runs \
              WHERE run_id = t.latest_run_id AND thread_id = t.thread_id) r ON true \
         WHERE t.thread_id = $1"
    )
});

async fn checkpoint_tx(
    tx: &mut Prepared<'_, Transaction<'_>>,
    thread_id: &ThreadId,
) -> Result<Option<Checkpoint>, StoreError> {
    let tid = thread_id.as_str();
    let Some(row) = tx.query_opt(THREAD_ROW, &[&tid]).await? else {
        return Ok(None);
    };
    let latest_run: Option<String> = row.try_get(0)?;
    let thread_revision: i64 = row.try_get(1)?;
    let event_count: i64 = row.try_get(2)?;
    let mut messages = Vec::new();
    for row in tx.query(MESSAGES, &[&tid]).await? {
        messages.push(codec::message(row.try_get::<_, &str>(0)?)?);
    }
    let thread_state = PersistedState {
        revision: codec::count("state revision", thread_revision)?,
        values: state_map(tx, THREAD_STATE, tid, "thread state").await?,
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
        // The commit that names a thread's latest run writes it: without its row, the run
        // (and the calls it waits on) would vanish from the checkpoint unnoticed.
        let row = tx
            .query_opt(&RUN_ROW, &[&rid, &tid])
            .await?
            .ok_or_else(|| codec::latest_run_missing(&rid))?;
        let run = raw_run(&row, 0)?.decode()?;
        let run_revision: i64 = row.try_get(11)?;
        let batch: Option<String> = row.try_get(12)?;
        checkpoint.run_state = PersistedState {
            revision: codec::count("state revision", run_revision)?,
            values: state_map(tx, RUN_STATE, &rid, "run state").await?,
        };
        checkpoint.batch = batch.as_deref().map(codec::batch).transpose()?;
        if let Some(pid) = &run.profile_id {
            checkpoint.profile = Some(profile(tx, pid).await?);
        }
        checkpoint.run = Some(run);
    }
    Ok(Some(checkpoint))
}

/// See `ThreadStore::list_threads`.
pub(super) async fn threads(
    client: &mut Prepared<'_, Client>,
) -> Result<Vec<ThreadSummary>, StoreError> {
    let rows = client
        .query(
            "SELECT thread_id, message_count, latest_run_id, created_at, updated_at \
             FROM threads ORDER BY thread_id",
            &[],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let latest: Option<&str> = row.try_get(2)?;
        out.push(ThreadSummary {
            thread_id: codec::thread_id(row.try_get(0)?)?,
            message_count: codec::count("message count", row.try_get(1)?)?,
            latest_run_id: latest.map(codec::run_id).transpose()?,
            created_at: Timestamp::from_unix_millis(row.try_get(3)?),
            updated_at: Timestamp::from_unix_millis(row.try_get(4)?),
        });
    }
    Ok(out)
}

/// See `ThreadStore::list_runs`.
pub(super) async fn runs(
    client: &mut Prepared<'_, Client>,
    thread_id: &ThreadId,
) -> Result<Vec<RunRecord>, StoreError> {
    let rows = client.query(&RUNS, &[&thread_id.as_str()]).await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        out.push(raw_run(&row, 0)?.decode()?);
    }
    Ok(out)
}

/// See `ThreadStore::load_run`.
pub(super) async fn run(
    client: &mut Prepared<'_, Client>,
    thread_id: &ThreadId,
    run_id: &RunId,
) -> Result<Option<RunRecord>, StoreError> {
    let row = client
        .query_opt(&RUN, &[&run_id.as_str(), &thread_id.as_str()])
        .await?;
    row.map(|row| raw_run(&row, 0)?.decode()).transpose()
}

/// See `ThreadStore::latest_run`: the thread's row and its latest run's, in one statement.
pub(super) async fn latest_run(
    client: &mut Prepared<'_, Client>,
    thread_id: &ThreadId,
) -> Result<Option<RunRecord>, StoreError> {
    let row = client
        .query_opt(&LATEST_RUN, &[&thread_id.as_str()])
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let Some(rid) = row.try_get::<_, Option<String>>(0)? else {
        return Ok(None);
    };
    if row.try_get::<_, Option<String>>(1)?.is_none() {
        return Err(codec::latest_run_missing(&rid));
    }
    Ok(Some(raw_run(&row, 1)?.decode()?))
}

/// See `ThreadStore::load_events`.
pub(super) async fn events(
    client: &mut Prepared<'_, Client>,
    thread_id: &ThreadId,
    since: u64,
) -> Result<Vec<StoredEvent>, StoreError> {
    let rows = client
        .query(
            "SELECT seq, run_id, body FROM events WHERE thread_id = $1 AND seq > $2 \
             ORDER BY seq",
            &[&thread_id.as_str(), &codec::int(since)],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        out.push(StoredEvent {
            seq: codec::count("event seq", row.try_get(0)?)?,
            run_id: codec::run_id(row.try_get(1)?)?,
            event: codec::event(row.try_get(2)?)?,
        });
    }
    Ok(out)
}
