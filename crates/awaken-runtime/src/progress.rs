//! Tool progress: a call's `ctx.report_progress(json)` becomes a `ToolCallProgress` event,
//! emitted on the run's own task (as every event is) while the run waits for the call.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Mutex, MutexGuard, PoisonError};

use awaken_event::{AgentEvent, EventSink, ToolCallId};
use awaken_tool::ProgressSink;
use futures_util::future::{Either, select};
use serde_json::Value;
use tokio::sync::Notify;

/// The progress reports of a run's calls not yet emitted, in the order they were made.
#[derive(Debug, Default)]
pub(crate) struct ProgressQueue {
    queue: Mutex<Queue>,
    ready: Notify,
}

#[derive(Debug, Default)]
struct Queue {
    /// The calls being awaited. A report of any other call (one that already returned, its
    /// context kept by a task it spawned) is dropped: it would come after the call's result.
    open: Vec<ToolCallId>,
    reports: Vec<(ToolCallId, Value)>,
}

impl ProgressSink for ProgressQueue {
    fn report(&self, call_id: &ToolCallId, progress: Value) {
        let mut queue = self.lock();
        if !queue.open.contains(call_id) {
            tracing::debug!(call_id = %call_id, "progress of a call no longer running: dropped");
            return;
        }
        queue.reports.push((call_id.clone(), progress));
        drop(queue);
        self.ready.notify_one();
    }
}

/// Closes a call's reporting when its awaiting ends, however it ends.
struct Open<'q> {
    queue: &'q ProgressQueue,
    call_id: &'q ToolCallId,
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        let mut queue = self.queue.lock();
        if let Some(i) = queue.open.iter().position(|id| id == self.call_id) {
            queue.open.swap_remove(i);
        }
    }
}

impl ProgressQueue {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Emits the queued reports.
    fn emit_to(&self, sink: &dyn EventSink) {
        let reports = std::mem::take(&mut self.lock().reports);
        for (call_id, progress) in reports {
            sink.emit(&AgentEvent::ToolCallProgress { call_id, progress });
        }
    }

    /// Awaits `call` (of call `call_id`), emitting the reports made meanwhile as they come, and
    /// those left when it ends (before the caller emits anything about the call's result). A
    /// call that finishes on its first poll costs no more than awaiting it.
    ///
    /// The call comes pinned by the caller: taken by value, it would be stored twice in the
    /// caller's future (the argument and its pinned copy), a few hundred bytes per run.
    pub(crate) async fn forward<F: Future>(
        &self,
        call_id: &ToolCallId,
        mut call: Pin<&mut F>,
        sink: &dyn EventSink,
    ) -> F::Output {
        self.lock().open.push(call_id.clone());
        let open = Open {
            queue: self,
            call_id,
        };
        let out = loop {
            let ready = pin!(self.ready.notified());
            match select(call.as_mut(), ready).await {
                Either::Left((out, _)) => break out,
                Either::Right(((), _)) => self.emit_to(sink),
            }
        };
        drop(open);
        self.emit_to(sink);
        out
    }
}
