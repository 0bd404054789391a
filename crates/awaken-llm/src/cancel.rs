//! Ending an inference stream when a run's cancellation token fires.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use awaken_event::{CancellationToken, CancelledOwned};
use futures_core::Stream;

use crate::error::InferenceExecutionError;
use crate::event::{LlmEventStream, LlmStreamEvent};

/// Wraps `stream` so that it ends with [`InferenceExecutionError::Cancelled`] as soon as
/// `token` is cancelled: the inner stream is dropped at that moment (which aborts an HTTP
/// request and closes its connection, or ends a scripted `wait_for_cancel` turn). A token
/// already cancelled yields `Cancelled` without polling the inner stream, so no request is
/// sent. Events that were already delivered stay delivered.
///
/// This is the cancellation protocol for callers that hold an `awaken_event::CancellationToken`;
/// dropping the stream does the same without the final `Cancelled` item.
pub fn with_cancellation(stream: LlmEventStream, token: CancellationToken) -> LlmEventStream {
    Box::pin(CancellableStream::new(stream, token))
}

/// [`with_cancellation`]'s stream, unboxed (for a caller that polls it in place: one
/// allocation less per inference).
pub struct CancellableStream {
    inner: Option<LlmEventStream>,
    /// The token, and the wait for it while the inner stream is pending (its waker registered
    /// at the first wait, let go when the stream ends unless the wait was lent).
    waiting: CancelledOwned,
    /// Lent by the caller ([`with_waiter`](Self::with_waiter)): its registration outlives
    /// the stream, handed back by [`into_waiter`](Self::into_waiter).
    lent: bool,
}

impl std::fmt::Debug for CancellableStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancellableStream")
            .field("ended", &self.inner.is_none())
            .field("token", self.waiting.token())
            .finish()
    }
}

impl CancellableStream {
    /// `stream`, ended with [`InferenceExecutionError::Cancelled`] once `token` is cancelled
    /// (see [`with_cancellation`]).
    pub fn new(stream: LlmEventStream, token: CancellationToken) -> Self {
        Self {
            inner: Some(stream),
            waiting: token.into_cancelled(),
            lent: false,
        }
    }

    /// As [`new`](Self::new), waiting for `waiting`'s token through `waiting` itself, whose
    /// waker stays registered when the stream ends: a caller that makes one stream after
    /// another on one task (a run's inferences) registers once, not once per stream. Take it
    /// back with [`into_waiter`](Self::into_waiter).
    pub fn with_waiter(stream: LlmEventStream, waiting: CancelledOwned) -> Self {
        Self {
            inner: Some(stream),
            waiting,
            lent: true,
        }
    }

    /// The wait the stream was made with (the inner stream dropped, if it had not ended).
    pub fn into_waiter(self) -> CancelledOwned {
        self.waiting
    }

    /// Drops the inner stream and stops waiting for the token (a lent wait stays registered).
    fn end(&mut self) {
        self.inner = None;
        if !self.lent {
            self.waiting.release();
        }
    }
}

impl Stream for CancellableStream {
    type Item = Result<LlmStreamEvent, InferenceExecutionError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if this.waiting.token().is_cancelled() {
            this.end();
            return Poll::Ready(Some(Err(InferenceExecutionError::Cancelled)));
        }
        if let Poll::Ready(item) = inner.as_mut().poll_next(cx) {
            if item.is_none() {
                this.end();
            }
            return Poll::Ready(item);
        }
        // Pending: be woken by the token too.
        if Pin::new(&mut this.waiting).poll(cx).is_ready() {
            this.end();
            return Poll::Ready(Some(Err(InferenceExecutionError::Cancelled)));
        }
        Poll::Pending
    }
}
