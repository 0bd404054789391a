//! Shared helpers of the benches.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Drives a future that never waits on IO to completion on the current thread, without a
/// runtime: it is polled with a no-op waker until ready (yielding the thread between polls).
/// For benches of engine code whose futures complete without external wake-ups.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::yield_now();
    }
}
