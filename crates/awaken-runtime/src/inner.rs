//! What an `AgentRuntime` shares between its clones, and what every activation reaches through
//! it: the resolver, the id source, the store, the lifecycle hooks, the active runs and the
//! worker identity that leases are held for.

use std::sync::Arc;

use awaken_event::CancellationToken;
use awaken_plugin::LifecycleDispatcher;
use awaken_resolver::Resolver;
use awaken_store::{LeaseError, LeaseToken, ThreadStore};

use crate::active::ActiveRuns;
use crate::ids::IdSource;

/// What an `AgentRuntime` shares between its clones.
pub(crate) struct RuntimeInner {
    pub(crate) resolver: Resolver,
    pub(crate) ids: Arc<dyn IdSource>,
    /// Where threads are kept.
    pub(crate) store: Arc<dyn ThreadStore>,
    /// Lifecycle hooks of every run and of the runtime, with their statistics.
    pub(crate) lifecycle: LifecycleDispatcher,
    /// The active activations (for `shutdown`).
    pub(crate) active: Arc<ActiveRuns>,
    /// This runtime's worker identity: set, every run it drives holds a lease.
    pub(crate) worker: Option<Worker>,
}

/// A worker identity for leases.
#[derive(Debug, Clone)]
pub(crate) struct Worker {
    pub(crate) id: String,
    pub(crate) lease_duration: std::time::Duration,
}

impl RuntimeInner {
    /// Gives `lease` up; a failure is logged (the lease then expires).
    pub(crate) async fn release(&self, lease: &LeaseToken) {
        if let Err(e) = self.store.release(lease).await {
            tracing::warn!(run_id = %lease.run_id, error = %e, "releasing a run's lease failed");
        }
    }

    /// Renews `lease` every third of its duration until aborted; a lost lease cancels the run
    /// (another worker owns it now: this one must stop writing).
    pub(crate) fn spawn_heartbeat(
        &self,
        lease: LeaseToken,
        duration: std::time::Duration,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let store = self.store.clone();
        let ids = self.ids.clone();
        tokio::spawn(async move {
            let every = (duration / 3).max(std::time::Duration::from_millis(1));
            loop {
                tokio::time::sleep(every).await;
                let now = ids.timestamp();
                match store.heartbeat(&lease, duration, now).await {
                    Ok(_) => {}
                    Err(LeaseError::Lost { .. }) => {
                        tracing::warn!(run_id = %lease.run_id, "lease lost: cancelling the run");
                        cancel.cancel();
                        return;
                    }
                    // The store failed: the lease may still be held; the next beat tries again.
                    Err(e) => {
                        tracing::warn!(run_id = %lease.run_id, error = %e, "heartbeat failed")
                    }
                }
            }
        })
    }
}
