//! The memory store's tables and their locks: threads and their runs in shards by a hash of the
//! thread id, the index of which thread each run is on, the profiles, and the finished runs'
//! spec digests.

use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};

use awaken_event::{RunId, ThreadId};

use crate::error::StoreError;

use super::archive::Digests;
use super::maps::{HashMap, Profiles, lock};
use super::runs::RunSlot;
use super::thread::ThreadData;

/// How many shards a store has.
const SHARDS: usize = 16;

/// Every table of a store, each behind its own lock(s). Locks are taken in one order: a
/// thread's shard, then a run index shard, then the profiles, then the digests.
#[derive(Debug)]
pub(super) struct Tables {
    pub(super) shards: Box<[Mutex<Shard>]>,
    /// The thread each run is on, sharded by run id (every new run's first commit holds its
    /// entry's lock while it is written): finds a run's shard, and refuses a run id on two
    /// threads.
    pub(super) run_threads: Box<[Mutex<HashMap<RunId, ThreadId>>]>,
    pub(super) profiles: Mutex<Profiles>,
    /// The finished runs' spec digests (taken after a shard's lock, last of all).
    pub(super) digests: Digests,
}

impl Default for Tables {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            run_threads: (0..SHARDS).map(|_| Mutex::default()).collect(),
            profiles: Mutex::default(),
            digests: Digests::default(),
        }
    }
}

/// One shard: the threads whose id hashes to it, and their runs.
#[derive(Debug, Default)]
pub(super) struct Shard {
    /// Boxed: a table's slot is a pointer, not a thread's 170 bytes (a table has room for up
    /// to twice as many threads as it holds).
    pub(super) threads: HashMap<ThreadId, Box<ThreadData>>,
    pub(super) runs: HashMap<RunId, RunSlot>,
}

impl Tables {
    /// The shard of `thread_id`, locked.
    pub(super) fn shard(&self, thread_id: &ThreadId) -> MutexGuard<'_, Shard> {
        lock(&self.shards[shard_of(thread_id)])
    }

    /// The run index shard that holds `run_id`'s entry, locked.
    pub(super) fn run_index(&self, run_id: &RunId) -> MutexGuard<'_, HashMap<RunId, ThreadId>> {
        lock(&self.run_threads[shard_of(run_id)])
    }

    /// The shard holding `run_id`, locked, if the run exists.
    pub(super) fn run_shard(&self, run_id: &RunId) -> Option<MutexGuard<'_, Shard>> {
        // The index lock is released before the shard's is taken (shard first, always).
        let thread_id = self.run_index(run_id).get(run_id).cloned()?;
        Some(self.shard(&thread_id))
    }

    /// Removes `thread_id` with its runs; `false` if there was no such thread.
    pub(super) fn delete_thread(&self, thread_id: &ThreadId) -> Result<bool, StoreError> {
        let mut shard = self.shard(thread_id);
        // (Its runs are found first: a row that does not read back fails the delete before
        // anything is removed.)
        let mut runs: Vec<RunId> = Vec::new();
        for (run_id, slot) in &shard.runs {
            if slot.is_on(thread_id)? {
                runs.push(run_id.clone());
            }
        }
        let existed = shard
            .threads
            .remove(thread_id)
            .is_some_and(|t| t.row.is_some());
        for run in runs {
            shard.runs.remove(&run);
            self.run_index(&run).remove(&run);
        }
        Ok(existed)
    }
}

/// The shard of `key` among [`SHARDS`].
fn shard_of(key: &impl std::hash::Hash) -> usize {
    let h = foldhash::fast::FixedState::default().hash_one(key);
    usize::try_from(h % SHARDS as u64).unwrap_or(0)
}
