//! The memory store's undo log: what each change of a commit replaced, so that a commit that
//! fails between two of its changes is taken back whole (its cost proportional to what it
//! wrote).

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use awaken_event::{ProfileId, RunId, ThreadId};
use awaken_state::StateValue;
use awaken_tool::ToolBatch;

use crate::commit::{RunRecord, RunStatus, ThreadCommit, Timestamp};
use crate::store::ProfileEntry;

use super::maps::{Profiles, StateKeyName};
use super::runs::{Lease, RunSlot};
use super::shards::Shard;
use super::thread::{LogMark, ThreadRow};

/// One change to undo if a later write of the same commit fails. The log is a worker thread's,
/// reused from commit to commit (no allocation per commit); an entry is small (a run's old
/// record, a few hundred bytes, is kept beside the log, not in every entry).
pub(super) enum Undo {
    /// Where the thread's messages and events stood before the commit.
    Log(LogMark),
    /// The commit created the run's row.
    RunCreated,
    /// The commit changed the run's row in place; what it held before is the commit's
    /// [`RunUndo`].
    RunUpdated,
    /// The thread row a commit replaced (`None`: the commit created it).
    Thread(Option<ThreadRow>),
    /// What a commit of the thread's latest run changed in its row (kept in place).
    ThreadTimes {
        state_revision: u64,
        updated_at: Timestamp,
    },
    ThreadKey(StateKeyName, Option<StateValue>),
    RunKey(StateKeyName, Option<StateValue>),
    ProfileKey(String, Option<ProfileEntry>),
}

/// What a commit changed in an existing run's row, to put back if it fails: the row is updated
/// in place (no new row per commit).
#[derive(Debug)]
pub(super) struct RunUndo {
    pub(super) record: RecordUndo,
    pub(super) state_revision: u64,
    /// The batch before, if the commit set or cleared it.
    pub(super) batch: Option<Option<ToolBatch>>,
    /// The lease before, if the commit (finishing the run) cleared it.
    pub(super) lease: Option<Option<Box<Lease>>>,
}

/// What a commit replaced of a run's record, to put back if it fails.
#[derive(Debug)]
pub(super) enum RecordUndo {
    /// What a run's commits move on (the record's shared strings and ids were the commit's
    /// own, and were kept).
    Progress {
        status: RunStatus,
        termination: Option<awaken_event::TerminationReason>,
        steps: u32,
        usage: awaken_event::TokenUsage,
        updated_at: Timestamp,
    },
    /// The whole record (the commit brought other ones).
    Whole(RunRecord),
}

impl RecordUndo {
    fn put_back(self, record: &mut RunRecord) {
        match self {
            Self::Whole(old) => *record = old,
            Self::Progress {
                status,
                termination,
                steps,
                usage,
                updated_at,
            } => {
                record.status = status;
                record.termination = termination;
                record.steps = steps;
                record.usage = usage;
                record.updated_at = updated_at;
            }
        }
    }
}

/// Writes `new` over a run's `stored` record (its creation time kept), and returns what it
/// replaced. A commit of the same run carries the same shared strings (the runtime's copies of
/// one record): then only what moves on is written, and no reference count changes.
pub(super) fn write_record(stored: &mut RunRecord, new: &RunRecord) -> RecordUndo {
    // Every field, named: a new one is a compile error here until it is written.
    let RunRecord {
        run_id,
        parent_run_id,
        agent_id,
        profile_id,
        status,
        termination,
        steps,
        usage,
        spec_digest,
        created_at: _,
        updated_at,
    } = new;
    let same = Arc::ptr_eq(&stored.agent_id, agent_id)
        && Arc::ptr_eq(&stored.spec_digest, spec_digest)
        && stored.run_id == *run_id
        && stored.parent_run_id == *parent_run_id
        && stored.profile_id == *profile_id;
    if !same {
        let created_at = stored.created_at;
        return RecordUndo::Whole(std::mem::replace(
            stored,
            RunRecord {
                created_at,
                ..new.clone()
            },
        ));
    }
    RecordUndo::Progress {
        status: std::mem::replace(&mut stored.status, *status),
        termination: std::mem::replace(&mut stored.termination, termination.clone()),
        steps: std::mem::replace(&mut stored.steps, *steps),
        usage: std::mem::replace(&mut stored.usage, *usage),
        updated_at: std::mem::replace(&mut stored.updated_at, *updated_at),
    }
}

/// What a rollback needs to know about the commit it undoes.
pub(super) struct CommitIds<'c> {
    pub(super) thread_id: &'c ThreadId,
    pub(super) run_id: &'c RunId,
    profile_id: Option<&'c ProfileId>,
}

impl<'c> CommitIds<'c> {
    pub(super) fn of(c: &'c ThreadCommit) -> Self {
        Self {
            thread_id: &c.thread_id,
            run_id: &c.run.run_id,
            profile_id: c.run.profile_id.as_ref(),
        }
    }
}

impl Shard {
    /// Undoes a failed commit's changes, emptying `undo` (its capacity is kept).
    pub(super) fn rollback(
        &mut self,
        ids: &CommitIds<'_>,
        undo: &mut Vec<Undo>,
        mut run_undo: Option<RunUndo>,
        mut profiles: Option<&mut Profiles>,
    ) {
        let (tid, rid) = (ids.thread_id, ids.run_id);
        for op in undo.drain(..).rev() {
            match op {
                Undo::Log(mark) => {
                    if let Some(t) = self.threads.get_mut(tid) {
                        t.reset_log(&mark);
                    }
                }
                Undo::RunCreated => {
                    self.runs.remove(rid);
                }
                Undo::RunUpdated => {
                    if let Some(old) = run_undo.take()
                        && let Some(row) = self.runs.get_mut(rid).and_then(RunSlot::if_live)
                    {
                        old.record.put_back(&mut row.record);
                        row.state_revision = old.state_revision;
                        if let Some(batch) = old.batch {
                            row.batch = batch;
                        }
                        if let Some(lease) = old.lease {
                            row.lease = lease;
                        }
                    }
                }
                Undo::Thread(old) => {
                    if let Some(t) = self.threads.get_mut(tid) {
                        t.row = old;
                    }
                }
                Undo::ThreadTimes {
                    state_revision,
                    updated_at,
                } => {
                    if let Some(row) = self.threads.get_mut(tid).and_then(|t| t.row.as_mut()) {
                        row.state_revision = state_revision;
                        row.updated_at = updated_at;
                    }
                }
                Undo::RunKey(k, old) => {
                    if let Some(row) = self.runs.get_mut(rid).and_then(RunSlot::if_live) {
                        restore(&mut row.state, &k, old);
                    }
                }
                Undo::ThreadKey(k, old) => {
                    if let Some(state) = self.threads.get_mut(tid).and_then(|t| t.state.as_mut()) {
                        restore(&mut **state, &k, old);
                    }
                }
                Undo::ProfileKey(k, old) => {
                    if let Some(m) = ids
                        .profile_id
                        .zip(profiles.as_deref_mut())
                        .and_then(|(p, profiles)| profiles.get_mut(p))
                    {
                        restore(m, &k, old);
                    }
                }
            }
        }
        // A thread whose first commit failed does not exist.
        if self.threads.get(tid).is_some_and(|t| t.row.is_none()) {
            self.threads.remove(tid);
        }
    }
}

/// A map a rollback puts a key back into: a profile's ordered keys, or a hashed state.
trait MapLike<K, V> {
    fn put(&mut self, k: K, v: V);
    fn del(&mut self, k: &K);
}

impl<K: Ord, V> MapLike<K, V> for BTreeMap<K, V> {
    fn put(&mut self, k: K, v: V) {
        self.insert(k, v);
    }
    fn del(&mut self, k: &K) {
        self.remove(k);
    }
}

impl<K: std::hash::Hash + Eq, V, S: BuildHasher> MapLike<K, V> for hashbrown::HashMap<K, V, S> {
    fn put(&mut self, k: K, v: V) {
        self.insert(k, v);
    }
    fn del(&mut self, k: &K) {
        self.remove(k);
    }
}

/// Puts `key` back as it was before the commit: `old`, or absent.
fn restore<K: Clone, V>(map: &mut impl MapLike<K, V>, key: &K, old: Option<V>) {
    match old {
        Some(v) => map.put(key.clone(), v),
        None => map.del(key),
    }
}
