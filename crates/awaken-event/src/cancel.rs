//! A runtime-agnostic cancellation token: a flag that can be set once, awaited, and cascaded
//! to child tokens (a delegated child run is cancelled with its parent).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};

#[derive(Default)]
struct Inner {
    cancelled: AtomicBool,
    /// The wakers of the futures waiting for the cancellation, each with how many waiting
    /// futures registered it (one task's several waiting futures share its entry). A future
    /// takes its registration back when it is dropped, so a token shared by many tasks holds
    /// only the wakers of those still waiting (a waker keeps its task's memory alive).
    wakers: Mutex<Vec<(Waker, usize)>>,
    children: Mutex<Vec<Weak<Inner>>>,
}

impl Inner {
    fn wakers(&self) -> std::sync::MutexGuard<'_, Vec<(Waker, usize)>> {
        self.wakers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `waker` for a waiting future whose registration is `slot` (moved from the
    /// waker it held, if another).
    fn register(&self, slot: &mut Option<Waker>, waker: &Waker) {
        if slot.as_ref().is_some_and(|held| held.will_wake(waker)) {
            return;
        }
        // Wakers let go of are dropped after the lock is released (dropping a task's last
        // waker may run code that waits on this token again).
        let old = slot.take();
        let _released = {
            let mut wakers = self.wakers();
            let released = old.as_ref().and_then(|old| release(&mut wakers, old));
            match wakers.iter_mut().find(|(w, _)| w.will_wake(waker)) {
                Some((_, futures)) => *futures += 1,
                None => wakers.push((waker.clone(), 1)),
            }
            released
        };
        *slot = Some(waker.clone());
    }

    /// Takes back the registration in `slot`, if any.
    fn deregister(&self, slot: &mut Option<Waker>) {
        if let Some(old) = slot.take() {
            // The guard is a temporary: released before either waker is dropped.
            let _released = release(&mut self.wakers(), &old);
        }
    }

    fn cancel(&self) {
        if self.cancelled.swap(true, Ordering::AcqRel) {
            return;
        }
        let wakers = std::mem::take(&mut *self.wakers.lock().unwrap_or_else(|e| e.into_inner()));
        for (w, _) in wakers {
            w.wake();
        }
        let children =
            std::mem::take(&mut *self.children.lock().unwrap_or_else(|e| e.into_inner()));
        for child in children.iter().filter_map(Weak::upgrade) {
            child.cancel();
        }
    }
}

/// Signals cancellation to everything holding a clone (or a child) of the token.
///
/// Cheap to clone; cancelling is idempotent; a token never becomes un-cancelled.
#[derive(Clone, Default)]
pub struct CancellationToken {
    inner: Arc<Inner>,
}

impl CancellationToken {
    /// A fresh, not cancelled token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels this token and every child token.
    pub fn cancel(&self) {
        self.inner.cancel();
    }

    /// Whether the token has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::Acquire)
    }

    /// A token cancelled when this one is (but whose own cancellation does not reach this one).
    pub fn child_token(&self) -> CancellationToken {
        let child = CancellationToken::new();
        {
            let mut children = self
                .inner
                .children
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            children.retain(|w| w.strong_count() > 0);
            children.push(Arc::downgrade(&child.inner));
        }
        if self.is_cancelled() {
            child.cancel();
        }
        child
    }

    /// Completes when the token is cancelled. While it waits, the token holds its task's
    /// waker; dropping the future takes it back.
    pub fn cancelled(&self) -> Cancelled<'_> {
        Cancelled {
            token: self,
            registered: None,
        }
    }

    /// As [`CancellationToken::cancelled`], holding its own handle to the token (for a struct
    /// that keeps waiting across polls).
    pub fn cancelled_owned(&self) -> CancelledOwned {
        CancelledOwned {
            token: self.clone(),
            registered: None,
        }
    }

    /// [`cancelled_owned`](Self::cancelled_owned), taking this handle instead of another one.
    pub fn into_cancelled(self) -> CancelledOwned {
        CancelledOwned {
            token: self,
            registered: None,
        }
    }

    /// How many tasks' wakers the token holds for futures still waiting on it (a diagnostic:
    /// it falls back to zero once every waiting future is dropped).
    pub fn waiting_tasks(&self) -> usize {
        self.inner.wakers().len()
    }
}

impl std::fmt::Debug for CancellationToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancellationToken")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

/// The future returned by [`CancellationToken::cancelled`].
#[derive(Debug)]
pub struct Cancelled<'a> {
    token: &'a CancellationToken,
    /// The waker this future registered, taken back when it is dropped.
    registered: Option<Waker>,
}

impl Future for Cancelled<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        poll_cancelled(&this.token.inner, &mut this.registered, cx)
    }
}

impl Drop for Cancelled<'_> {
    fn drop(&mut self) {
        self.token.inner.deregister(&mut self.registered);
    }
}

/// [`CancellationToken::cancelled_owned`]'s future: [`Cancelled`] holding its own handle to the
/// token, for a struct that keeps waiting across polls.
#[derive(Debug)]
pub struct CancelledOwned {
    token: CancellationToken,
    registered: Option<Waker>,
}

impl CancelledOwned {
    /// The token it waits for.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Stops waiting for now: the task's waker is let go (a later poll registers it again).
    pub fn release(&mut self) {
        self.token.inner.deregister(&mut self.registered);
    }
}

impl Future for CancelledOwned {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        poll_cancelled(&this.token.inner, &mut this.registered, cx)
    }
}

impl Drop for CancelledOwned {
    fn drop(&mut self) {
        self.token.inner.deregister(&mut self.registered);
    }
}

fn poll_cancelled(inner: &Inner, registered: &mut Option<Waker>, cx: &Context<'_>) -> Poll<()> {
    if inner.cancelled.load(Ordering::Acquire) {
        return Poll::Ready(());
    }
    inner.register(registered, cx.waker());
    // Re-check after registering, so a cancel between the first check and the push is seen.
    if inner.cancelled.load(Ordering::Acquire) {
        Poll::Ready(())
    } else {
        Poll::Pending
    }
}

/// Takes one waiting future's registration of `waker` out of `wakers`; returns the entry's
/// waker when that was its last (for the caller to drop once the lock is released).
fn release(wakers: &mut Vec<(Waker, usize)>, waker: &Waker) -> Option<Waker> {
    let i = wakers.iter().position(|(w, _)| w.will_wake(waker))?;
    wakers[i].1 -= 1;
    (wakers[i].1 == 0).then(|| wakers.swap_remove(i).0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Wake, Waker};

    use super::CancellationToken;

    struct CountWake(AtomicUsize);
    impl Wake for CountWake {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<CountWake>, Waker) {
        let counter = Arc::new(CountWake(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        (counter, waker)
    }

    #[test]
    fn a_dropped_waiter_leaves_no_waker_behind() {
        let token = CancellationToken::new();
        // A hundred tasks (each its own waker) waited once and went away.
        for _ in 0..100 {
            let (_, waker) = counting();
            let mut fut = Box::pin(token.cancelled());
            assert!(
                fut.as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            );
            let mut owned = Box::pin(token.cancelled_owned());
            assert!(
                owned
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_pending()
            );
            assert_eq!(token.waiting_tasks(), 1, "one task, one waker");
        }
        assert_eq!(token.waiting_tasks(), 0);
        // Two waiting futures of one task share its entry: dropping one keeps the other's.
        let (counter, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        let mut first = Box::pin(token.cancelled());
        let mut second = Box::pin(token.cancelled());
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        drop(first);
        assert_eq!(token.waiting_tasks(), 1);
        // A future polled by another task moves its registration there.
        let (other_counter, other) = counting();
        assert!(
            second
                .as_mut()
                .poll(&mut Context::from_waker(&other))
                .is_pending()
        );
        assert_eq!(token.waiting_tasks(), 1);
        token.cancel();
        assert_eq!(
            counter.0.load(Ordering::SeqCst),
            0,
            "its entry was taken back"
        );
        assert_eq!(other_counter.0.load(Ordering::SeqCst), 1);
        assert_eq!(second.as_mut().poll(&mut cx), Poll::Ready(()));
        drop(second);
        assert_eq!(token.waiting_tasks(), 0);
    }

    #[test]
    fn cancel_wakes_waiters_and_children() {
        let token = CancellationToken::new();
        let child = token.child_token();
        let grandchild = child.child_token();
        let counter = Arc::new(CountWake(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        let mut fut = Box::pin(grandchild.cancelled());
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(
            fut.as_mut().poll(&mut cx),
            Poll::Pending,
            "polling twice registers once"
        );
        child.cancel();
        assert!(grandchild.is_cancelled());
        assert!(!token.is_cancelled(), "a child does not cancel its parent");
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(()));
        token.cancel();
        token.cancel();
        assert!(
            token.child_token().is_cancelled(),
            "a child of a cancelled token starts cancelled"
        );
    }
}
