//! A plugin's future the engine may abandon (its phase dropped when the run is cancelled):
//! dropped under a guard, so a panic in the plugin's cleanup is logged with the plugin and the
//! entry point instead of unwinding through the run.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

use awaken_state::panic_message;

/// `future` (a boxed plugin future: `Unpin`), of `plugin_id`'s `entry_point`.
pub(crate) struct Abandonable<'a, F> {
    future: Option<F>,
    plugin_id: &'a str,
    entry_point: &'a str,
}

impl<'a, F> Abandonable<'a, F> {
    pub(crate) fn new(future: F, plugin_id: &'a str, entry_point: &'a str) -> Self {
        Self {
            future: Some(future),
            plugin_id,
            entry_point,
        }
    }
}

impl<F: Future + Unpin> Future for Abandonable<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(future) = self.future.as_mut() else {
            return Poll::Pending;
        };
        let output = std::task::ready!(Pin::new(future).poll(cx));
        // Finished: dropped here, where a panic is the entry point's, caught by its caller.
        self.future = None;
        Poll::Ready(output)
    }
}

impl<F> Drop for Abandonable<'_, F> {
    fn drop(&mut self) {
        let Some(future) = self.future.take() else {
            return;
        };
        if let Err(panic) = catch_unwind(AssertUnwindSafe(move || drop(future))) {
            tracing::warn!(
                plugin = self.plugin_id,
                entry_point = self.entry_point,
                panic = %panic_message(&*panic),
                "a plugin's abandoned future panicked when dropped"
            );
        }
    }
}
