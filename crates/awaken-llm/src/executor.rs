//! The executor contract every provider implements.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use awaken_event::InferenceResponse;

use crate::error::InferenceExecutionError;
use crate::event::{LlmEventStream, collect_stream};
use crate::request::InferenceRequest;

/// The future `LlmExecutor::execute` returns (`'static`, like the stream).
pub type LlmResponseFuture =
    Pin<Box<dyn Future<Output = Result<InferenceResponse, InferenceExecutionError>> + Send>>;

/// A model provider: turns an [`InferenceRequest`] into a stream of [`crate::LlmStreamEvent`]s.
///
/// Calling protocol:
/// - `execute_stream` does no work until the stream is first polled; it never blocks.
/// - The stream follows the grammar documented on [`crate::LlmStreamEvent`]. An `Err` item is
///   the last item; its [`crate::ErrorClass`] says whether calling again may help.
/// - Dropping the stream (or the `execute` future) cancels the call: an HTTP request is
///   aborted and its connection closed. This is how the runtime cancels inference.
/// - A call may run more than once for the same request (`RetryingExecutor` calls again after
///   a retryable error that came before the first event); executors keep no per-request state
///   between calls.
pub trait LlmExecutor: Send + Sync {
    /// A short name for logs and errors (`"openai"`, `"scripted"`, ...).
    fn name(&self) -> &str;

    /// Starts the call and returns its event stream.
    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream;

    /// Runs the call to completion and returns the collected response. The default collects
    /// [`LlmExecutor::execute_stream`] with [`crate::ResponseCollector`].
    fn execute(&self, request: InferenceRequest) -> LlmResponseFuture {
        Box::pin(collect_stream(self.execute_stream(request)))
    }
}

impl<E: LlmExecutor + ?Sized> LlmExecutor for Arc<E> {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        (**self).execute_stream(request)
    }

    fn execute(&self, request: InferenceRequest) -> LlmResponseFuture {
        (**self).execute(request)
    }
}
