//! Announcing a worker's commits to the front ends following its runs, in batches.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use awaken_event::{CancellationToken, ThreadId};
use awaken_store::{FleetWake, RunQueue};
use tokio::sync::Notify;

/// The least time between two announcements of new events: the threads touched meanwhile go
/// in the next one. A front end following a run on another node sees its events up to this much
/// later (and the announcement's own time); the database is spared a transaction, and every
/// listener a wake-up, per commit.
const ANNOUNCE_GAP: Duration = Duration::from_millis(5);

/// Announces the threads with new commits, in batches: one statement for every thread touched
/// since the previous one, sent at once when none was sent in the last [`ANNOUNCE_GAP`]. Stops
/// when closed or when the last clone is dropped.
#[derive(Clone)]
pub(super) struct Notifier {
    inner: Arc<NotifierInner>,
}

struct NotifierInner {
    pending: Arc<Pending>,
    stop: CancellationToken,
    /// The task sending the announcements, until [`Notifier::close`] waits for it.
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The threads touched since the last announcement, and the wake-up of the task sending it.
#[derive(Default)]
struct Pending {
    threads: Mutex<HashSet<ThreadId>>,
    wake: Notify,
}

impl Pending {
    /// Announces the threads touched since the last announcement, if any.
    async fn announce(&self, queue: &RunQueue) {
        let threads: Vec<ThreadId> = self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        let Some(first) = threads.first() else {
            return;
        };
        // A lost announcement costs a follower one poll interval, nothing more.
        if let Err(e) = queue
            .notify(&FleetWake::Events(first.clone()), &threads)
            .await
        {
            tracing::debug!(error = %e, "cannot announce new events");
        }
    }
}

impl Drop for NotifierInner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Notifier {
    pub(super) fn start(queue: RunQueue) -> Self {
        let pending = Arc::new(Pending::default());
        let stop = CancellationToken::new();
        let (task_pending, task_stop) = (Arc::clone(&pending), stop.clone());
        let task = tokio::spawn(async move {
            loop {
                let stopping = tokio::select! {
                    () = task_pending.wake.notified() => false,
                    () = task_stop.cancelled() => true,
                };
                let sent = tokio::time::Instant::now();
                task_pending.announce(&queue).await;
                if stopping {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(sent + ANNOUNCE_GAP) => {}
                    // The threads touched in the last gap are still announced.
                    () = task_stop.cancelled() => {
                        task_pending.announce(&queue).await;
                        return;
                    }
                }
            }
        });
        Self {
            inner: Arc::new(NotifierInner {
                pending,
                stop,
                task: Mutex::new(Some(task)),
            }),
        }
    }

    /// Stops announcing once the threads touched so far are announced, and waits for that.
    pub(super) async fn close(&self) {
        self.inner.stop.cancel();
        let task = self
            .inner
            .task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = task
            && let Err(e) = task.await
            && e.is_panic()
        {
            tracing::error!(error = %e, "the task announcing new events failed");
        }
    }

    pub(super) fn touch(&self, thread: &ThreadId) {
        let pending = &self.inner.pending;
        let mut threads = pending.threads.lock().unwrap_or_else(|e| e.into_inner());
        if threads.insert(thread.clone()) && threads.len() == 1 {
            pending.wake.notify_one();
        }
    }
}
