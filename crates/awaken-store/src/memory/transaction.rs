//! The memory store's commit transaction: every check runs before the first change, then the
//! changes are applied with an undo log, and taken back from it if a later one fails. A run's
//! end then archives its thread's log and its row.

use std::collections::BTreeMap;

use awaken_event::{RunId, ThreadId};
use awaken_state::StateValue;
use hashbrown::hash_map::RawEntryMut as Entry;

use crate::commit::{BatchWrite, RunStatus, ThreadCommit};
use crate::error::{CommitError, StoreError};
use crate::failpoint::{FailPoint, Failpoints};
use crate::one_run;
use crate::store::{CommitReceipt, ProfileEntry};

use super::maps::{HashMap, MapHasher, Profiles, StateKeyName, StateMap, lock};
use super::runs::{Lease, RunRow, RunSlot};
use super::shards::{Shard, Tables};
use super::thread::{ThreadData, ThreadRow};
use super::undo::{CommitIds, RunUndo, Undo, write_record};

/// How a store writes its commits.
#[derive(Debug)]
pub(super) struct WriteOptions {
    /// Whether a run's end compacts its thread (`MemoryStore::without_compaction`).
    pub(super) compact: bool,
    /// The failpoint a test armed.
    pub(super) failpoints: Failpoints,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self {
            compact: true,
            failpoints: Failpoints::default(),
        }
    }
}

/// The most undo entries a worker thread's reused log keeps room for between commits.
const UNDO_LOG_KEPT: usize = 64;

thread_local! {
    /// The undo log of the commits made on this OS thread, kept between them (emptied, with
    /// room for up to `UNDO_LOG_KEPT` entries).
    static UNDO_LOG: std::cell::Cell<Vec<Undo>> = const { std::cell::Cell::new(Vec::new()) };
}

/// What a commit finds of its thread and run in their shard (each looked up once).
type ThreadEntry<'a> = Entry<'a, ThreadId, Box<ThreadData>, MapHasher>;
type RunEntry<'a> = Entry<'a, RunId, RunSlot, MapHasher>;

/// Writes `commit` into `tables` at once (nothing in it waits), copying what the store keeps of
/// it.
pub(super) fn write(
    tables: &Tables,
    options: &WriteOptions,
    commit: &ThreadCommit,
) -> Result<CommitReceipt, CommitError> {
    commit
        .validate()
        .map_err(|v| CommitError::invalid(&commit.thread_id, v))?;
    let mut inner = tables.shard(&commit.thread_id);
    // A run new to this shard: the index says whether it is on another thread, and stays
    // locked until the commit has put it there.
    let Shard { threads, runs } = &mut *inner;
    // The thread and the run, each found once: checked, then written through the same
    // entries (a vacant one left unused inserts nothing).
    let thread = threads.raw_entry_mut().from_key(&commit.thread_id);
    let holder = match &thread {
        Entry::Occupied(t) => holder(t.get(), runs, &commit.run.run_id),
        Entry::Vacant(_) => None,
    };
    let mut run = runs.raw_entry_mut().from_key(&commit.run.run_id);
    let mut run_threads = None;
    if matches!(run, Entry::Vacant(_)) {
        let index = tables.run_index(&commit.run.run_id);
        if let Some(stored) = index.get(&commit.run.run_id)
            && *stored != commit.thread_id
        {
            return Err(CommitError::RunOnOtherThread {
                run_id: commit.run.run_id.clone(),
                thread_id: commit.thread_id.clone(),
                stored_thread_id: stored.clone(),
            });
        }
        run_threads = Some(index);
    }
    let mut profiles = commit
        .run
        .profile_id
        .is_some()
        .then(|| lock(&tables.profiles));
    let was_done = matches!(&run, Entry::Occupied(r) if matches!(r.get(), RunSlot::Done(_)));
    let checked = check(
        match &thread {
            Entry::Occupied(t) => Some(&**t.get()),
            Entry::Vacant(_) => None,
        },
        match &mut run {
            // (A finished run's row is read back here, before anything changes.)
            Entry::Occupied(r) => Some(&*r.get_mut().live(&commit.run.run_id, &tables.digests)?),
            Entry::Vacant(_) => None,
        },
        holder,
        commit,
        profiles.as_deref(),
    );
    if let Err(e) = checked {
        // A refused commit leaves a finished run's row written out, as it found it.
        if was_done && let Entry::Occupied(r) = &mut run {
            r.get_mut().freeze(&tables.digests);
        }
        return Err(e);
    }
    // Room for every change the commit can make, in this thread's reused log (after the
    // first commits, no allocation at all).
    let mut undo = UNDO_LOG.take();
    undo.reserve(
        5 + commit.run_state.values.len()
            + commit.thread_state.values.len()
            + commit.profile_state.values.len(),
    );
    // What the commit replaced in its run's row: put back on failure, freed after the locks
    // are released on success.
    let mut run_undo = None;
    let finishing = commit.run.status == RunStatus::Done;
    let result = apply(
        thread,
        run,
        commit,
        options,
        &mut undo,
        &mut run_undo,
        profiles.as_deref_mut(),
    );
    let ids = CommitIds::of(commit);
    // A finished run's thread is compacted once the commit is in, under the shard's lock
    // only.
    let compact = options.compact && finishing && result.is_ok();
    match (&result, run_threads.as_mut()) {
        (Err(_), _) => {
            inner.rollback(&ids, &mut undo, run_undo.take(), profiles.as_deref_mut());
        }
        (Ok(_), Some(index)) => {
            index.insert(ids.run_id.clone(), ids.thread_id.clone());
        }
        (Ok(_), None) => {}
    }
    drop(profiles);
    drop(run_threads);
    // (The state's values serialize here, after the index and profile locks are released.)
    let compacted = compact.then(|| {
        let row = inner
            .runs
            .get_mut(ids.run_id)
            .and_then(|r| r.freeze(&tables.digests));
        (
            row,
            inner
                .threads
                .get_mut(ids.thread_id)
                .and_then(|t| t.compact()),
        )
    });
    // The replaced rows and values, and a compacted thread's shared form, are freed after
    // the locks are released.
    drop(inner);
    // (`run_undo` is dropped where it lies, at the end, after the locks too: a
    // `drop(run_undo)` would first copy its 232 bytes.)
    drop(compacted);
    undo.clear();
    // A commit of very many keys does not pin its log's room on this thread for good.
    undo.shrink_to(UNDO_LOG_KEPT);
    // (`with`: `LocalKey::set` first checks whether the thread's slot needs its initial
    // value, which a constant-initialized slot never does.)
    UNDO_LOG.with(|log| log.set(undo));
    result
}

/// The run holding `thread` other than `run_id`, with its status: the thread's latest run while
/// it is unfinished (the one-run rule keeps an unfinished run the latest one).
fn holder<'a>(
    thread: &'a ThreadData,
    runs: &HashMap<RunId, RunSlot>,
    run_id: &RunId,
) -> Option<(&'a RunId, RunStatus)> {
    let latest = &thread.row.as_ref()?.latest_run_id;
    if latest == run_id {
        return None;
    }
    match runs.get(latest)? {
        RunSlot::Live(row) if one_run::holds(row.record.status) => {
            Some((latest, row.record.status))
        }
        // (A row written out is a finished run's.)
        _ => None,
    }
}

/// Checks a commit against its thread and run as stored (`None`: not stored yet), and the run
/// holding the thread if another one does.
fn check(
    thread: Option<&ThreadData>,
    run: Option<&RunRow>,
    holder: Option<(&RunId, RunStatus)>,
    c: &ThreadCommit,
    profiles: Option<&Profiles>,
) -> Result<(), CommitError> {
    let actual = thread.map_or(0, |t| t.message_count as u64);
    if actual != c.expected_message_count {
        return Err(CommitError::VersionConflict {
            expected: c.expected_message_count,
            actual,
        });
    }
    if let Some(run) = run
        && run.thread_id != c.thread_id
    {
        return Err(CommitError::RunOnOtherThread {
            run_id: c.run.run_id.clone(),
            thread_id: c.thread_id.clone(),
            stored_thread_id: run.thread_id.clone(),
        });
    }
    if let Some(lease) = c.lease_to_check(run.is_some()) {
        let held = run.is_some_and(|r| r.held_by(&lease));
        if !held {
            return Err(CommitError::LeaseLost {
                run_id: c.run.run_id.clone(),
            });
        }
    }
    if one_run::must_check(run.map(|r| r.record.status))
        && let Some((holder, status)) = holder
    {
        return Err(one_run::busy(&c.thread_id, holder.clone(), status));
    }
    if c.run.status == RunStatus::Done
        && matches!(c.batch, BatchWrite::Keep)
        && let Some(batch) = run.and_then(|r| r.batch.as_ref())
    {
        crate::commit::check_batch(batch, RunStatus::Done)
            .map_err(|v| CommitError::invalid(&c.thread_id, v))?;
    }
    if let Some(profile_id) = &c.run.profile_id {
        let stored = profiles.and_then(|p| p.get(profile_id));
        for (key, read) in &c.profile_versions {
            let current = stored.and_then(|p| p.get(key)).map_or(0, |e| e.version);
            if current != *read {
                return Err(CommitError::ProfileConflict { key: key.clone() });
            }
        }
    }
    Ok(())
}

/// Applies a checked commit to its thread's and run's entries: the state's values and the
/// batch copied (shared values, shared calls), the record written in place when it can be, the
/// messages and events read (written in the compact form, or copied when they cannot be).
fn apply(
    thread: ThreadEntry<'_>,
    run: RunEntry<'_>,
    c: &ThreadCommit,
    options: &WriteOptions,
    undo: &mut Vec<Undo>,
    run_undo: &mut Option<RunUndo>,
    profiles: Option<&mut Profiles>,
) -> Result<CommitReceipt, CommitError> {
    let ThreadCommit {
        thread_id: tid,
        run: record,
        messages: new_messages,
        events: new_events,
        run_state: run_delta,
        thread_state: thread_delta,
        profile_state: profile_delta,
        batch: batch_write,
        ..
    } = c;
    let new_lease = c.lease_to_create();
    let rid = &record.run_id;
    let now = record.updated_at;
    let status = record.status;
    let profile_id = &record.profile_id;

    let thread = match thread {
        Entry::Occupied(t) => t.into_mut(),
        Entry::Vacant(t) => t.insert(tid.clone(), Box::default()).1,
    };
    undo.push(Undo::Log(thread.log_mark()));
    // (Written with the events, after them: see `ThreadData::append`.)
    thread.message_count += new_messages.len();
    let message_count = thread.message_count as u64;
    options.failpoints.check(FailPoint::AfterMessages)?;

    // The row is updated in place; what it held before is the undo.
    let row = match run {
        Entry::Occupied(slot) => {
            let row = slot.into_mut().live_row()?;
            let old_record = write_record(&mut row.record, record);
            let batch = match batch_write {
                BatchWrite::Keep => None,
                BatchWrite::Set(b) => Some(row.batch.replace(b.clone())),
                BatchWrite::Clear => Some(row.batch.take()),
            };
            let lease = (status == RunStatus::Done).then(|| row.lease.take());
            *run_undo = Some(RunUndo {
                record: old_record,
                state_revision: row.state_revision,
                batch,
                lease,
            });
            undo.push(Undo::RunUpdated);
            row
        }
        Entry::Vacant(slot) => {
            let batch = match batch_write {
                BatchWrite::Set(b) => Some(b.clone()),
                BatchWrite::Keep | BatchWrite::Clear => None,
            };
            undo.push(Undo::RunCreated);
            let (_, slot) = slot.insert(
                rid.clone(),
                RunSlot::Live(Box::new(RunRow {
                    thread_id: tid.clone(),
                    record: record.clone(),
                    state_revision: 0,
                    batch,
                    lease: new_lease.map(|l| {
                        Box::new(Lease {
                            owner: l.worker_id.clone(),
                            expires_at: l.expires_at,
                        })
                    }),
                    lease_epoch: u64::from(new_lease.is_some()),
                    state: StateMap::default(),
                })),
            );
            slot.live_row()?
        }
    };
    if !run_delta.values.is_empty() {
        row.state_revision = run_delta.revision;
    }
    options.failpoints.check(FailPoint::AfterRun)?;

    for (k, v) in run_delta.values.iter() {
        let old = upsert(&mut row.state, k, v);
        undo.push(Undo::RunKey(k.clone(), old));
    }
    let thread_revision = (!thread_delta.values.is_empty()).then_some(thread_delta.revision);
    for (k, v) in thread_delta.values.iter() {
        let old = upsert(thread.state.get_or_insert_default(), k, v);
        undo.push(Undo::ThreadKey(k.clone(), old));
    }
    let mut profile_versions = BTreeMap::new();
    if let Some(pid) = profile_id
        && let Some(profiles) = profiles
        && !profile_delta.values.is_empty()
    {
        let profile = profiles.entry(pid.clone()).or_default();
        for (k, value) in profile_delta.values.iter() {
            let value = match value.to_json() {
                Ok(value) => value,
                Err(source) => {
                    return Err(StoreError::StateValue {
                        what: "profile state",
                        source,
                    }
                    .into());
                }
            };
            let k = String::from(k.as_ref());
            let version = profile.get(&k).map_or(0, |e| e.version) + 1;
            profile_versions.insert(k.clone(), version);
            let old = profile.insert(k.clone(), ProfileEntry { value, version });
            undo.push(Undo::ProfileKey(k, old));
        }
    }
    options.failpoints.check(FailPoint::AfterState)?;

    // (Written in the compact form as they come when the store compacts.)
    thread.append(rid, new_messages, new_events, options.compact);
    let seq = thread.last_event_seq();
    options.failpoints.check(FailPoint::AfterEvents)?;

    // The thread row is written last, after every failpoint: no rollback reaches it (its undo
    // entries keep a rollback correct should a failpoint be added after it).
    match &mut thread.row {
        // The same run's next commit: the row changes in place (its run id is kept, not
        // replaced by an equal copy).
        Some(row) if row.latest_run_id == *rid => {
            undo.push(Undo::ThreadTimes {
                state_revision: row.state_revision,
                updated_at: row.updated_at,
            });
            row.state_revision = thread_revision.unwrap_or(row.state_revision);
            row.updated_at = now;
        }
        row => {
            // A new thread is created now, at state revision 0.
            let (created_at, state_revision) = row
                .as_ref()
                .map_or((now, 0), |old| (old.created_at, old.state_revision));
            let next = ThreadRow {
                state_revision: thread_revision.unwrap_or(state_revision),
                latest_run_id: rid.clone(),
                created_at,
                updated_at: now,
            };
            undo.push(Undo::Thread(row.replace(next)));
        }
    }

    Ok(CommitReceipt {
        message_count,
        last_event_seq: seq,
        profile_versions,
    })
}

/// Writes a copy of `value` (a shared reference) at `key` in `map` and returns what it replaced.
/// A stored key keeps its name; a new one takes a copy of the commit's (free for a name borrowed
/// from the registry).
fn upsert(map: &mut StateMap, key: &StateKeyName, value: &StateValue) -> Option<StateValue> {
    match map.raw_entry_mut().from_key(key) {
        Entry::Occupied(mut stored) => Some(stored.insert(value.clone())),
        Entry::Vacant(slot) => {
            slot.insert(key.clone(), value.clone());
            None
        }
    }
}
