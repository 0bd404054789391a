//! [`Steering`]: messages for a run in flight. The run takes the waiting ones before its next
//! step starts and commits them to the thread, so that step's inference sees them; a run whose model answers without calls while a message waits goes on with another
//! step instead of ending. Every message is either taken (its sender learns the step) or
//! refused once the run has ended: none is dropped unseen.

use std::sync::{Arc, Mutex};

use awaken_event::Message;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

/// A steering message's receipt and the step that took the message (see
/// [`Steering::send_with_receipt`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SteeringReceipt {
    /// The receipt it came with.
    pub receipt: Arc<str>,
    /// The step that took it.
    pub step: u32,
}

impl SteeringReceipt {
    /// The step that took the message of `receipt`, among `receipts`.
    pub fn step_in(receipts: &[SteeringReceipt], receipt: &str) -> Option<u32> {
        receipts
            .iter()
            .find(|r| &*r.receipt == receipt)
            .map(|r| r.step)
    }
}

/// Where a steering message went: the step whose start took it, committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// The step (the run's numbering, as its `step_start` events count).
    pub step: u32,
}

/// Why a steering message was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotTaken {
    /// The run ended before a step took the message (or before a commit stored it).
    #[error("the run ended before a step took the message")]
    Ended,
}

/// Where a steering message's sender learns what became of it.
pub(crate) type Reply = oneshot::Sender<Result<Taken, NotTaken>>;

/// A run's inbox of steering messages, shared by the run and whoever steers it (clone it:
/// clones share the inbox). A new one is open; the run closes it as it ends.
#[derive(Clone, Default)]
pub struct Steering {
    inner: Arc<Mutex<Inbox>>,
}

#[derive(Default)]
struct Inbox {
    waiting: Vec<Waiting>,
    closed: bool,
    /// The receipts the run took before this activation, with their steps: a message sent
    /// again with one of them is answered at once, not taken twice.
    earlier: Vec<SteeringReceipt>,
}

/// A message waiting for the run's next step: its receipt, if it came with one, and where
/// its sender learns what became of it.
pub(crate) struct Waiting {
    pub(crate) message: Message,
    pub(crate) receipt: Option<Arc<str>>,
    pub(crate) reply: Reply,
}

impl std::fmt::Debug for Steering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inbox = self.lock();
        f.debug_struct("Steering")
            .field("waiting", &inbox.waiting.len())
            .field("closed", &inbox.closed)
            .finish()
    }
}

impl Steering {
    /// An open inbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues `message` (the user's) for the run; resolves when a step took it (committed to
    /// the thread) or the run ended without taking it. A run whose future is dropped mid-way
    /// answers neither: wait on the run's end as well.
    pub fn send(
        &self,
        message: Message,
    ) -> impl Future<Output = Result<Taken, NotTaken>> + Send + 'static {
        self.queue(message, None)
    }

    /// [`send`](Self::send) with a receipt: the step that takes the message records
    /// `receipt` and the step's number in the run's statistics
    /// ([`RunStats::steering_receipts`](crate::RunStats::steering_receipts)), in the commit
    /// that stores the message. Whoever continues the run after its process stopped can then
    /// tell a message the run took from one it did not, though no answer came.
    pub fn send_with_receipt(
        &self,
        message: Message,
        receipt: impl Into<Arc<str>>,
    ) -> impl Future<Output = Result<Taken, NotTaken>> + Send + 'static {
        self.queue(message, Some(receipt.into()))
    }

    fn queue(
        &self,
        message: Message,
        receipt: Option<Arc<str>>,
    ) -> impl Future<Output = Result<Taken, NotTaken>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        {
            let mut inbox = self.lock();
            if let Some(step) = receipt
                .as_ref()
                .and_then(|r| SteeringReceipt::step_in(&inbox.earlier, r))
            {
                let _ = reply.send(Ok(Taken { step }));
            } else if inbox.closed {
                let _ = reply.send(Err(NotTaken::Ended));
            } else {
                inbox.waiting.push(Waiting {
                    message,
                    receipt,
                    reply,
                });
            }
        }
        async move { answer.await.unwrap_or(Err(NotTaken::Ended)) }
    }

    /// Whether the run has ended (later messages are refused).
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// How many messages wait for the run's next step.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Records the receipts the run took before (in an earlier activation, whose process may
    /// have stopped before answering): a message waiting, or sent later, with one of them is
    /// answered as taken at that step, and not taken again.
    pub(crate) fn taken_before(&self, receipts: &[SteeringReceipt]) {
        let answered = {
            let mut inbox = self.lock();
            inbox.earlier = receipts.to_vec();
            let (answered, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut inbox.waiting)
                .into_iter()
                .partition(|w| {
                    w.receipt
                        .as_ref()
                        .is_some_and(|r| SteeringReceipt::step_in(receipts, r).is_some())
                });
            inbox.waiting = waiting;
            answered
        };
        for w in answered {
            let step = w
                .receipt
                .as_ref()
                .and_then(|r| SteeringReceipt::step_in(receipts, r))
                .unwrap_or_default();
            let _ = w.reply.send(Ok(Taken { step }));
        }
    }

    /// The waiting messages, for the step about to take them.
    pub(crate) fn take(&self) -> Vec<Waiting> {
        std::mem::take(&mut self.lock().waiting)
    }

    /// Closes the inbox unless a message waits (the run then goes on to take it); whether it
    /// closed. One lock: a message sent meanwhile is either seen here or refused.
    pub(crate) fn close_unless_waiting(&self) -> bool {
        let mut inbox = self.lock();
        if inbox.waiting.is_empty() {
            inbox.closed = true;
        }
        inbox.closed
    }

    /// Closes the inbox: later messages are refused, and so are the waiting ones. The run
    /// closes it as it ends; whoever gave it a run whose future may be dropped before its end
    /// closes it as well, so that no sender waits on a run that is gone.
    pub fn close(&self) {
        let waiting = {
            let mut inbox = self.lock();
            inbox.closed = true;
            std::mem::take(&mut inbox.waiting)
        };
        for w in waiting {
            let _ = w.reply.send(Err(NotTaken::Ended));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inbox> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Tells each sender its message was taken at `step`.
pub(crate) fn taken(replies: impl IntoIterator<Item = Reply>, step: u32) {
    for reply in replies {
        let _ = reply.send(Ok(Taken { step }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_message_is_taken_or_refused_never_dropped() {
        let steering = Steering::new();
        let first = steering.send(Message::user("one"));
        let taken_now = steering.take();
        assert_eq!(taken_now.len(), 1);
        assert_eq!(taken_now[0].message.text(), "one");
        assert_eq!(taken_now[0].receipt, None);
        taken(taken_now.into_iter().map(|w| w.reply), 3);
        assert_eq!(first.await, Ok(Taken { step: 3 }));

        // A message waiting keeps the inbox open; once taken, it closes.
        let second = steering.send(Message::user("two"));
        assert!(!steering.close_unless_waiting());
        let replies: Vec<_> = steering.take().into_iter().map(|w| w.reply).collect();
        assert!(steering.close_unless_waiting());
        assert!(steering.is_closed());
        taken(replies, 4);
        assert_eq!(second.await, Ok(Taken { step: 4 }));
        // After it closed, refused at once.
        assert_eq!(
            steering.send(Message::user("late")).await,
            Err(NotTaken::Ended)
        );

        // A run that ends with messages waiting refuses them; one that dropped the replies
        // of messages it took (its future dropped mid-commit) too.
        let open = Steering::new();
        let waiting = open.send(Message::user("left"));
        let dropped = open.send_with_receipt(Message::user("lost commit"), "r-1");
        let mut taken_then_failed = open.take();
        assert_eq!(taken_then_failed[1].receipt.as_deref(), Some("r-1"));
        let left = open.send(Message::user("after"));
        open.close();
        taken_then_failed.clear();
        assert_eq!(waiting.await, Err(NotTaken::Ended));
        assert_eq!(dropped.await, Err(NotTaken::Ended));
        assert_eq!(left.await, Err(NotTaken::Ended));
    }

    #[tokio::test]
    async fn a_receipt_the_run_took_before_is_answered_not_taken_again() {
        let steering = Steering::new();
        let waiting = steering.send_with_receipt(Message::user("again"), "7");
        let other = steering.send_with_receipt(Message::user("new"), "8");
        steering.taken_before(&[SteeringReceipt {
            receipt: "7".into(),
            step: 4,
        }]);
        assert_eq!(waiting.await, Ok(Taken { step: 4 }));
        let left = steering.take();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].receipt.as_deref(), Some("8"));
        // Sent again later, even once the inbox closed: answered the same.
        steering.close();
        assert_eq!(
            steering
                .send_with_receipt(Message::user("again"), "7")
                .await,
            Ok(Taken { step: 4 })
        );
        drop(other);
    }
}
