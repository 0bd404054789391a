//! [`Front`]: the run queue a front end hands its activations to, and the wake-ups of the
//! queued runs it follows, from the queue's notifications.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use awaken_event::{CancellationToken, ThreadId};
use awaken_store::{FleetWake, Hear, RunQueue};
use dashmap::DashMap;
use tokio::sync::Notify;

/// How a front end queues runs.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Claims after which a job that keeps failing is dead-lettered (default 3).
    pub max_attempts: u32,
    /// How often a followed run's events and job are read when no notification came
    /// (default 1 s).
    pub poll_interval: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            poll_interval: Duration::from_secs(1),
        }
    }
}

/// The queue a server front end hands its activations to, and the wake-ups of the runs it
/// follows (one per thread).
pub(crate) struct Front {
    pub(crate) queue: RunQueue,
    pub(super) config: QueueConfig,
    pub(super) waiters: DashMap<ThreadId, Arc<Notify>>,
    /// The wake-ups of the requests waiting for a steering message's answer, by thread (all of
    /// a thread's are woken at once).
    pub(super) steered: DashMap<ThreadId, Arc<Notify>>,
    listening: OnceLock<()>,
}

impl Front {
    pub(crate) fn new(queue: RunQueue, config: QueueConfig) -> Self {
        Self {
            queue,
            config,
            waiters: DashMap::new(),
            steered: DashMap::new(),
            listening: OnceLock::new(),
        }
    }

    /// The wake-up of `thread`'s follower; starts listening to the queue's notifications on
    /// first use.
    pub(super) fn waiter(
        self: &Arc<Self>,
        thread: &ThreadId,
        closing: &CancellationToken,
    ) -> Arc<Notify> {
        self.listen(closing);
        self.waiters.entry(thread.clone()).or_default().clone()
    }

    /// The wake-up of the requests waiting for an answer to a steering message of `thread`
    /// (woken with `notify_waiters`: register before looking); starts listening as `waiter`.
    pub(super) fn steered_waiter(
        self: &Arc<Self>,
        thread: &ThreadId,
        closing: &CancellationToken,
    ) -> Arc<Notify> {
        self.listen(closing);
        self.steered.entry(thread.clone()).or_default().clone()
    }

    fn listen(self: &Arc<Self>, closing: &CancellationToken) {
        self.listening.get_or_init(|| {
            tokio::spawn(listen(Arc::downgrade(self), closing.clone()));
        });
    }
}

impl Front {
    /// Wakes every follower and every request waiting for a steering answer.
    fn wake_all(&self) {
        self.waiters.iter().for_each(|w| w.notify_one());
        self.steered.iter().for_each(|w| w.notify_waiters());
    }
}

/// Wakes the followers of the threads the queue's notifications name, and the requests
/// waiting for their steering answers (all of them after a lost connection), until the server
/// closes or the front end is gone.
async fn listen(front: Weak<Front>, closing: CancellationToken) {
    let Some(mut listener) = front.upgrade().map(|f| f.queue.listen(Hear::Runs)) else {
        return;
    };
    // What was announced before the listening began is read by a look now.
    tokio::select! {
        () = listener.ready() => {}
        () = closing.cancelled() => return,
    }
    if let Some(front) = front.upgrade() {
        front.wake_all();
    }
    loop {
        let wake = tokio::select! {
            wake = listener.recv() => wake,
            () = closing.cancelled() => return,
        };
        let Some(front) = front.upgrade() else {
            return;
        };
        match wake {
            FleetWake::Events(thread) | FleetWake::Done(thread) => {
                if let Some(waiter) = front.waiters.get(&thread) {
                    waiter.notify_one();
                }
            }
            FleetWake::Steered(thread) => {
                if let Some(waiter) = front.steered.get(&thread) {
                    waiter.notify_waiters();
                }
            }
            FleetWake::Lost => front.wake_all(),
            _ => {}
        }
    }
}
