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
    /// Whether `chat` spans record message content (`with_span_content`).
    pub(crate) span_content: bool,
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

    /// Renews `lease` every third of its duration until stopped; a lost lease cancels the run
    /// (another worker owns it now: this one must stop writing). Dropping the returned guard
    /// without [`Heartbeat::stop`] (the run's future was dropped mid-run) stops the beat and
    /// gives the lease up, so another worker may continue the run at once.
    pub(crate) fn spawn_heartbeat(
        &self,
        lease: LeaseToken,
        duration: std::time::Duration,
        cancel: CancellationToken,
    ) -> Heartbeat {
        let mut heartbeat = self.lease_guard(lease);
        heartbeat.beat(self, duration, cancel, duration / 3);
        heartbeat
    }

    /// A [`Heartbeat`] that does not beat yet ([`Heartbeat::beat`] starts it): dropped, it
    /// gives `lease` up all the same.
    pub(crate) fn lease_guard(&self, lease: LeaseToken) -> Heartbeat {
        Heartbeat {
            task: None,
            lease: Some(lease),
            store: self.store.clone(),
            active: self.active.clone(),
        }
    }
}

/// A run's lease heartbeat. Stopped by [`Heartbeat::stop`] when the run gives its lease up
/// itself; dropped while armed, it stops the beat and releases the lease on a task that
/// `AgentRuntime::shutdown` waits for.
pub(crate) struct Heartbeat {
    task: Option<tokio::task::JoinHandle<()>>,
    lease: Option<LeaseToken>,
    store: Arc<dyn ThreadStore>,
    active: Arc<ActiveRuns>,
}

impl Heartbeat {
    /// Starts renewing the lease: first after `first`, then every third of `duration`.
    pub(crate) fn beat(
        &mut self,
        rt: &RuntimeInner,
        duration: std::time::Duration,
        cancel: CancellationToken,
        first: std::time::Duration,
    ) {
        let Some(lease) = self.lease.clone() else {
            return;
        };
        let store = rt.store.clone();
        let ids = rt.ids.clone();
        let every = (duration / 3).max(std::time::Duration::from_millis(1));
        let task = tokio::spawn(async move {
            let mut wait = first;
            loop {
                tokio::time::sleep(wait).await;
                wait = every;
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
        });
        if let Some(old) = self.task.replace(task) {
            old.abort();
        }
    }

    /// Stops the beat; the caller releases the lease (or its last commit did).
    pub(crate) fn stop(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.lease = None;
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let Some(lease) = self.lease.take() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return; // no runtime left to release on: the lease expires instead
        };
        let store = self.store.clone();
        let pending = self.active.releasing();
        handle.spawn(async move {
            if let Err(e) = store.release(&lease).await {
                tracing::warn!(run_id = %lease.run_id, error = %e, "releasing a dropped run's lease failed");
            }
            drop(pending);
        });
    }
}
