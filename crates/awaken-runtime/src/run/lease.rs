//! The run's lease, for a runtime with a worker identity: claimed and kept alive by a heartbeat
//! while the run is driven, given up at its end.

use awaken_store::NewLease;

use crate::error::RunError;
use crate::inner::{Heartbeat, RuntimeInner};
use crate::run::Run;

impl Run<'_> {
    /// Claims the run's lease for the runtime's worker (when it has one) and keeps it with a
    /// heartbeat; another worker holding it is `RunError::TakenOver`.
    pub(super) async fn hold_lease(
        &mut self,
        rt: &RuntimeInner,
    ) -> Result<Option<Heartbeat>, RunError> {
        let Some(worker) = &rt.worker else {
            return Ok(None);
        };
        let claimed = rt
            .store
            .claim_run(
                &self.identity.run_id,
                &worker.id,
                worker.lease_duration,
                rt.ids.timestamp(),
            )
            .await
            .map_err(RunError::Store)?;
        let Some(claimed) = claimed else {
            return Err(RunError::TakenOver {
                thread_id: self.identity.thread_id.clone(),
                run_id: self.identity.run_id.clone(),
            });
        };
        self.durable.set_lease(Some(claimed.lease.clone()));
        Ok(Some(rt.spawn_heartbeat(
            claimed.lease,
            worker.lease_duration,
            self.cancel.clone(),
        )))
    }

    /// The lease a new run's first commit creates it with, for the runtime's worker (when it
    /// has one), and the lease's duration.
    pub(super) fn new_lease(&self, rt: &RuntimeInner) -> Option<(NewLease, std::time::Duration)> {
        let worker = rt.worker.as_ref()?;
        let lease = NewLease {
            worker_id: worker.id.clone(),
            expires_at: rt.ids.timestamp().saturating_add(worker.lease_duration),
        };
        Some((lease, worker.lease_duration))
    }

    /// Stops the heartbeat and gives the lease up (a finished run's last commit already did).
    pub(super) async fn release_lease(&self, rt: &RuntimeInner, heartbeat: Option<Heartbeat>) {
        if let Some(h) = heartbeat {
            h.stop();
            if let Some(lease) = self.durable.lease() {
                rt.release(lease).await;
            }
        }
    }
}
