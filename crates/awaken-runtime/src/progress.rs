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

/// Closes a call's reporting when its awaiting ends, however it ends (unless `forward`
/// closed it already, with the same lock that took its last reports).
struct Open<'q> {
    queue: &'q ProgressQueue,
    call_id: &'q ToolCallId,
    closed: bool,
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if !self.closed {
            self.queue.lock().close(self.call_id);
        }
    }
}

impl Queue {
    /// `call_id`'s reporting ends: its later reports are dropped.
    fn close(&mut self, call_id: &ToolCallId) {
        if let Some(i) = self.open.iter().position(|id| id == call_id) {
            self.open.swap_remove(i);
        }
    }
}

impl ProgressQueue {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Emits the queued reports.
    fn emit_to(&self, sink: &dyn EventSink) {
        emit(std::mem::take(&mut self.lock().reports), sink);
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
        let mut open = Open {
            queue: self,
            call_id,
            closed: false,
        };
        let out = loop {
            let ready = pin!(self.ready.notified());
            match select(call.as_mut(), ready).await {
                Either::Left((out, _)) => break out,
                Either::Right(((), _)) => self.emit_to(sink),
            }
        };
        // The call's reporting ends and its last reports are taken under one lock (a report
        // made after that is dropped, as one made after the call's close always was).
        let reports = {
            let mut queue = self.lock();
            queue.close(call_id);
            std::mem::take(&mut queue.reports)
        };
        open.closed = true;
        emit(reports, sink);
        out
    }
}

/// Emits `reports` in order.
fn emit(reports: Vec<(ToolCallId, Value)>, sink: &dyn EventSink) {
    for (call_id, progress) in reports {
        sink.emit(&AgentEvent::ToolCallProgress { call_id, progress });
    }
}
