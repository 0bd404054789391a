//! Run leases in the memory store: claims, heartbeats and releases over its shards, by the
//! rules every backend keeps ([`crate::lease`]).

use std::sync::MutexGuard;
use std::time::Duration;

use awaken_event::RunId;

use crate::commit::{LeaseToken, RunStatus, Timestamp};
use crate::error::{LeaseError, StoreError};
use crate::lease;
use crate::store::ClaimedRun;

use super::maps::lock;
use super::runs::{RunRow, RunSlot};
use super::shards::{Shard, Tables};

impl Tables {
    /// See `ThreadStore::claim_runnable`.
    pub(super) fn claim_runnable(
        &self,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<ClaimedRun>, StoreError> {
        lease::check_worker(worker_id)?;
        // Every shard, locked in order, so the claims follow one order over the whole store.
        let mut shards: Vec<MutexGuard<'_, Shard>> = self.shards.iter().map(lock).collect();
        let mut free: Vec<&mut RunRow> = shards
            .iter_mut()
            .flat_map(|shard| shard.runs.values_mut())
            .filter_map(RunSlot::if_live)
            // A waiting run waits for a decision; its resume claims it (`claim_run`).
            .filter(|r| {
                r.record.status == RunStatus::Running
                    && r.record.parent_run_id.is_none()
                    && r.claimable(now)
            })
            .collect();
        free.sort_by(|a, b| {
            lease::claim_order(&a.record, a.lease_epoch)
                .cmp(&lease::claim_order(&b.record, b.lease_epoch))
        });
        let expires_at = now.saturating_add(lease_duration);
        Ok(free
            .into_iter()
            .take(limit)
            .map(|r| r.claim(worker_id, expires_at))
            .collect())
    }

    /// See `ThreadStore::claim_run`.
    pub(super) fn claim_run(
        &self,
        run_id: &RunId,
        worker_id: &str,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Option<ClaimedRun>, StoreError> {
        lease::check_worker(worker_id)?;
        let Some(mut shard) = self.run_shard(run_id) else {
            return Ok(None);
        };
        Ok(shard
            .runs
            .get_mut(run_id)
            .and_then(RunSlot::if_live)
            .filter(|r| r.claimable(now))
            .map(|r| r.claim(worker_id, now.saturating_add(lease_duration))))
    }

    /// See `ThreadStore::heartbeat`.
    pub(super) fn heartbeat(
        &self,
        lease: &LeaseToken,
        lease_duration: Duration,
        now: Timestamp,
    ) -> Result<Timestamp, LeaseError> {
        let mut shard = self.run_shard(&lease.run_id);
        let Some(run) = held(shard.as_deref_mut(), lease) else {
            return Err(LeaseError::Lost {
                run_id: lease.run_id.clone(),
            });
        };
        let expires_at = now.saturating_add(lease_duration);
        if let Some(held) = &mut run.lease {
            held.expires_at = expires_at;
        }
        Ok(expires_at)
    }

    /// See `ThreadStore::release`.
    pub(super) fn release(&self, lease: &LeaseToken) -> Result<bool, StoreError> {
        let mut shard = self.run_shard(&lease.run_id);
        let Some(run) = held(shard.as_deref_mut(), lease) else {
            return Ok(false);
        };
        run.lease = None;
        Ok(true)
    }
}

/// The row of the run `lease` holds, in `shard` (the run's shard, if the run exists).
fn held<'s>(shard: Option<&'s mut Shard>, lease: &LeaseToken) -> Option<&'s mut RunRow> {
    shard?
        .runs
        .get_mut(&lease.run_id)
        .and_then(RunSlot::if_live)
        .filter(|r| r.held_by(lease))
}
