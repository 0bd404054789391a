//! A run of the memory store: its row as the commits carried it while the run can change, and
//! archived once a commit has finished it (read back when a later commit writes to it).

use awaken_event::{RunId, ThreadId};
use awaken_state::PersistedState;
use awaken_tool::ToolBatch;

use crate::commit::{LeaseToken, RunRecord, RunStatus, Timestamp};
use crate::compact::Malformed;
use crate::error::StoreError;
use crate::lease;
use crate::store::ClaimedRun;

use super::archive::{self, ArchivedRun, Digests};
use super::maps::{StateMap, persisted};

/// A run's row: as the commits carried it while the run can change, and in [`crate::compact`]'s
/// form once a commit has finished it (written out, it takes less than half the heap of a boxed
/// row and its state map; see ADR 0009). A later write to a finished run reads it back first; a
/// read decodes it.
#[derive(Debug)]
pub(super) enum RunSlot {
    Live(Box<RunRow>),
    /// A finished run holding no lease and no batch, as [`archive::write_run`] wrote it.
    Done(Box<[u8]>),
}

#[derive(Debug)]
pub(super) struct RunRow {
    pub(super) thread_id: ThreadId,
    pub(super) record: RunRecord,
    pub(super) state_revision: u64,
    /// As the commit carried it (never serialized).
    pub(super) batch: Option<ToolBatch>,
    /// The lease held on it, if any (boxed: most runs kept are done and hold none).
    pub(super) lease: Option<Box<Lease>>,
    /// How many times it was claimed (kept when a lease ends: a token of an earlier claim
    /// never matches again).
    pub(super) lease_epoch: u64,
    /// The run's state, as the commits carried it.
    pub(super) state: StateMap,
}

/// A lease held on a run.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Lease {
    pub(super) owner: String,
    pub(super) expires_at: Timestamp,
}

impl RunRow {
    /// Whether `lease` holds the run ([`lease::holds`]).
    pub(super) fn held_by(&self, lease: &LeaseToken) -> bool {
        lease::holds(
            self.lease.as_ref().map(|l| l.owner.as_str()),
            self.lease_epoch,
            lease,
        )
    }

    /// Whether the run can be claimed at `now` ([`lease::claimable`]).
    pub(super) fn claimable(&self, now: Timestamp) -> bool {
        lease::claimable(
            self.record.status,
            self.lease.as_ref().map(|l| l.expires_at),
            now,
        )
    }

    /// Gives the run's lease to `worker_id` until `expires_at` (a new epoch).
    pub(super) fn claim(&mut self, worker_id: &str, expires_at: Timestamp) -> ClaimedRun {
        self.lease = Some(Box::new(Lease {
            owner: worker_id.to_owned(),
            expires_at,
        }));
        self.lease_epoch += 1;
        ClaimedRun {
            thread_id: self.thread_id.clone(),
            run: self.record.clone(),
            lease: LeaseToken {
                run_id: self.record.run_id.clone(),
                worker_id: worker_id.to_owned(),
                epoch: self.lease_epoch,
            },
            expires_at,
        }
    }
}

/// A run's record, state and batch as a load returns them.
pub(super) struct LoadedRun {
    pub(super) record: RunRecord,
    pub(super) state: PersistedState,
    pub(super) batch: Option<ToolBatch>,
}

/// A finished run's row read back from `bytes` (see [`RunSlot::Done`]); its state's values
/// are JSON values.
fn read_row(bytes: &[u8], run_id: &RunId, digests: &Digests) -> Result<RunRow, StoreError> {
    let ArchivedRun {
        thread_id,
        record,
        state_revision,
        lease_epoch,
        state,
    } = archive::read_run(bytes, run_id, digests)?;
    Ok(RunRow {
        thread_id,
        record,
        state_revision,
        batch: None,
        lease: None,
        lease_epoch,
        state,
    })
}

impl RunSlot {
    /// The row, to write to: a finished run's is read back first (a commit to a finished run
    /// is rare).
    pub(super) fn live(
        &mut self,
        run_id: &RunId,
        digests: &Digests,
    ) -> Result<&mut RunRow, StoreError> {
        if let RunSlot::Done(bytes) = self {
            *self = RunSlot::Live(Box::new(read_row(bytes, run_id, digests)?));
        }
        self.live_row()
    }

    /// The row of a run whose finished row was read back already ([`RunSlot::live`]).
    pub(super) fn live_row(&mut self) -> Result<&mut RunRow, StoreError> {
        match self {
            RunSlot::Live(row) => Ok(row),
            RunSlot::Done(_) => Err(StoreError::corrupt(
                "run",
                Malformed("a finished run's row was not read back".to_owned()),
            )),
        }
    }

    /// The row if it can change (a finished run's holds no lease and is never claimable).
    pub(super) fn if_live(&mut self) -> Option<&mut RunRow> {
        match self {
            RunSlot::Live(row) => Some(row),
            RunSlot::Done(_) => None,
        }
    }

    /// Whether the run is on `thread_id`.
    pub(super) fn is_on(&self, thread_id: &ThreadId) -> Result<bool, StoreError> {
        match self {
            RunSlot::Live(row) => Ok(row.thread_id == *thread_id),
            RunSlot::Done(bytes) => archive::run_is_on(bytes, thread_id),
        }
    }

    /// The run's record.
    pub(super) fn record(
        &self,
        run_id: &RunId,
        digests: &Digests,
    ) -> Result<RunRecord, StoreError> {
        match self {
            RunSlot::Live(row) => Ok(row.record.clone()),
            RunSlot::Done(bytes) => archive::run_record(bytes, run_id, digests),
        }
    }

    /// The run's record, state and batch as a load returns them.
    pub(super) fn load(&self, run_id: &RunId, digests: &Digests) -> Result<LoadedRun, StoreError> {
        let done;
        let row = match self {
            RunSlot::Live(row) => &**row,
            RunSlot::Done(bytes) => {
                done = read_row(bytes, run_id, digests)?;
                &done
            }
        };
        Ok(LoadedRun {
            record: row.record.clone(),
            state: persisted("run state", row.state_revision, &row.state)?,
            batch: row.batch.clone(),
        })
    }

    /// Writes a finished run's row in compact form, if it holds no lease and no batch and
    /// each of its state's values has JSON text that reads back (not nested deeper than
    /// `serde_json` parses). Hands back the row it replaced, to be dropped after the locks are
    /// released.
    pub(super) fn freeze(&mut self, digests: &Digests) -> Option<Box<RunRow>> {
        let RunSlot::Live(row) = self else {
            return None;
        };
        if row.record.status != RunStatus::Done || row.lease.is_some() || row.batch.is_some() {
            return None;
        }
        let bytes = archive::write_run(
            &row.thread_id,
            &row.record,
            row.state_revision,
            row.lease_epoch,
            &row.state,
            digests,
        )?;
        match std::mem::replace(self, RunSlot::Done(bytes)) {
            RunSlot::Live(row) => Some(row),
            RunSlot::Done(_) => None,
        }
    }
}
