//! The run lease rules every backend keeps: who may hold a lease, when a run can be claimed,
//! when a token still holds its run, and in what order claims hand runs out. The memory store
//! applies them to its rows; the SQL stores apply [`holds`] to a commit's lease and state the
//! claim rules in their `UPDATE … RETURNING` statements (unfinished, lease free or expired,
//! `ORDER BY lease_epoch, updated_at, run_id`), then sort what they claimed with [`sort_claims`].

use awaken_event::RunId;

use crate::commit::{LeaseToken, RunRecord, RunStatus, Timestamp};
use crate::error::StoreError;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::store::ClaimedRun;

/// Refuses a blank worker id: a lease names the worker holding it.
pub(crate) fn check_worker(worker_id: &str) -> Result<(), StoreError> {
    if worker_id.trim().is_empty() {
        return Err(StoreError::Config {
            detail: "worker id is blank".to_owned(),
        });
    }
    Ok(())
}

/// Whether a run whose lease is held by `owner` (`None`: free) at claim `epoch` is held by
/// `lease`: the same worker, and no claim since.
#[inline]
pub(crate) fn holds(owner: Option<&str>, epoch: u64, lease: &LeaseToken) -> bool {
    owner == Some(lease.worker_id.as_str()) && epoch == lease.epoch
}

/// Whether a run of `status` whose lease expires at `expires_at` (`None`: no lease) can be
/// claimed at `now`: it is unfinished and its lease is free or expired.
pub(crate) fn claimable(status: RunStatus, expires_at: Option<Timestamp>, now: Timestamp) -> bool {
    status != RunStatus::Done && expires_at.is_none_or(|at| at <= now)
}

/// The order claims hand runs out in: the run claimed fewest times first (its lease `epoch`),
/// then the oldest update, then by run id. A run whose continuation fails before it writes
/// keeps its update time; its growing epoch puts it behind the others rather than first in
/// every round.
pub(crate) fn claim_order(run: &RunRecord, epoch: u64) -> (u64, Timestamp, &RunId) {
    (epoch, run.updated_at, &run.run_id)
}

/// Puts `claims` in [`claim_order`] (each claim's epoch one more than the run had, for all).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn sort_claims(claims: &mut [ClaimedRun]) {
    claims.sort_by(|a, b| {
        claim_order(&a.run, a.lease.epoch).cmp(&claim_order(&b.run, b.lease.epoch))
    });
}
