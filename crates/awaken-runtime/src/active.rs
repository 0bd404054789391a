//! The runtime's active activations: counted so `shutdown` can wait for them or cancel them,
//! and closed to new ones once shutdown begins.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use awaken_event::CancellationToken;

/// What `shutdown` does with activations still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShutdownMode {
    /// Wait until every active activation has ended by itself.
    #[default]
    Wait,
    /// Cancel every active activation (each ends `Cancelled` with its checkpoint), then wait.
    Cancel,
}

/// The active activations of one runtime.
#[derive(Default)]
pub(crate) struct ActiveRuns {
    runs: Mutex<HashMap<u64, CancellationToken>>,
    /// Leases of dropped runs still being released.
    releasing: AtomicU64,
    next: AtomicU64,
    closed: AtomicBool,
    idle: tokio::sync::Notify,
}

/// Removes its activation from the active set when dropped.
pub(crate) struct ActiveGuard<'a> {
    active: &'a ActiveRuns,
    id: u64,
}

impl ActiveRuns {
    /// Registers an activation, unless shutdown has begun.
    pub(crate) fn enter(&self, cancel: &CancellationToken) -> Option<ActiveGuard<'_>> {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if self.closed.load(Ordering::SeqCst) {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        runs.insert(id, cancel.clone());
        Some(ActiveGuard { active: self, id })
    }

    /// Refuses new activations; with `Cancel`, cancels the active ones.
    pub(crate) fn close(&self, mode: ShutdownMode) {
        let runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        self.closed.store(true, Ordering::SeqCst);
        if mode == ShutdownMode::Cancel {
            for token in runs.values() {
                token.cancel();
            }
        }
    }

    /// The number of active activations.
    pub(crate) fn count(&self) -> usize {
        self.runs.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Counts a lease release in progress until the returned guard drops.
    pub(crate) fn releasing(self: &std::sync::Arc<Self>) -> Releasing {
        self.releasing.fetch_add(1, Ordering::AcqRel);
        Releasing(self.clone())
    }

    /// Waits until no activation is active and no dropped run's lease is being released.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count() == 0 && self.releasing.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// A lease release in progress (see [`ActiveRuns::releasing`]).
pub(crate) struct Releasing(std::sync::Arc<ActiveRuns>);

impl Drop for Releasing {
    fn drop(&mut self) {
        if self.0.releasing.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        let empty = {
            let mut runs = self.active.runs.lock().unwrap_or_else(|e| e.into_inner());
            runs.remove(&self.id);
            runs.is_empty()
        };
        if empty {
            self.active.idle.notify_waiters();
        }
    }
}
