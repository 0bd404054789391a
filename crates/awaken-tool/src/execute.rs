//! Running a tool so that a panic, a cancellation or a timeout becomes a failed call, never a
//! crashed process or a hung run.

use std::any::Any;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use awaken_state::panic_message;
use futures_util::FutureExt as _;
use serde_json::Value;

use crate::context::ToolCallContext;
use crate::error::ToolError;
use crate::tool::{Tool, ToolOutput};

/// Runs `tool.execute(args, ctx)` with a panic caught as [`ToolError::Panicked`] (one while
/// making its future, polling it, or dropping it once abandoned), and stops waiting with
/// [`ToolError::Cancelled`] when `ctx`'s cancellation token fires (the tool's future is
/// dropped). A call whose token is already cancelled does not start. The arguments
/// are not validated here (see [`crate::RegisteredTool::invoke`]).
///
/// # Errors
/// The tool's own error, or `Panicked` / `Cancelled`.
pub async fn execute_guarded(
    tool: &dyn Tool,
    tool_id: &str,
    args: &Value,
    ctx: &ToolCallContext,
) -> Result<ToolOutput, ToolError> {
    execute_guarded_with_timeout(tool, tool_id, args, ctx, std::future::pending(), None).await
}

/// As [`execute_guarded`], and abandons the call with [`ToolError::Timeout`] when `timeout`
/// completes first. The timer is any future, so this works on any executor (and on a paused
/// clock in tests); `after` is only reported in the error. When the tool, the cancellation and
/// the timeout are ready in the same poll, the tool's result wins, then the cancellation.
///
/// # Errors
/// The tool's own error, or `Panicked` / `Cancelled` / `Timeout`.
pub async fn execute_guarded_with_timeout<T>(
    tool: &dyn Tool,
    tool_id: &str,
    args: &Value,
    ctx: &ToolCallContext,
    timeout: T,
    after: Option<Duration>,
) -> Result<ToolOutput, ToolError>
where
    T: Future<Output = ()>,
{
    let cancelled = || ToolError::Cancelled {
        tool_id: tool_id.to_owned(),
    };
    if ctx.is_cancelled() {
        return Err(cancelled());
    }
    let panicked = |payload: Box<dyn Any + Send>| ToolError::Panicked {
        tool_id: tool_id.to_owned(),
        message: panic_message(payload.as_ref()),
    };
    let future = catch_unwind(AssertUnwindSafe(|| tool.execute(args, ctx))).map_err(panicked)?;
    // The tool's future is boxed (the trait's), so it can be dropped under the guard below.
    let mut run = AssertUnwindSafe(future).catch_unwind();
    let mut cancel = pin!(ctx.cancel_token().cancelled());
    let mut timeout = pin!(timeout);
    let outcome = poll_fn(|cx| {
        if let Poll::Ready(out) = run.poll_unpin(cx) {
            return Poll::Ready(out.unwrap_or_else(|payload| Err(panicked(payload))));
        }
        if cancel.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(cancelled()));
        }
        if timeout.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(ToolError::Timeout {
                tool_id: tool_id.to_owned(),
                after,
            }));
        }
        Poll::Pending
    })
    .await;
    // An abandoned call (cancelled, timed out) drops the tool's future here, running the
    // tool's cleanup: a panic in it is the tool's, and the call fails with it.
    match catch_unwind(AssertUnwindSafe(move || drop(run))) {
        Ok(()) => outcome,
        Err(payload) => Err(panicked(payload)),
    }
}

/// As [`execute_guarded_with_timeout`] with a timer from `tokio::time` (cargo feature `time`;
/// needs a tokio runtime with the time driver).
///
/// # Errors
/// The tool's own error, or `Panicked` / `Cancelled` / `Timeout`.
#[cfg(feature = "time")]
pub async fn execute_with_timeout(
    tool: &dyn Tool,
    tool_id: &str,
    args: &Value,
    ctx: &ToolCallContext,
    after: Duration,
) -> Result<ToolOutput, ToolError> {
    execute_guarded_with_timeout(
        tool,
        tool_id,
        args,
        ctx,
        tokio::time::sleep(after),
        Some(after),
    )
    .await
}
