//! Tool progress: a call's `ctx.report_progress(json)` becomes a `ToolCallProgress` event,
//! emitted on the run's own task (as every event is) while the run waits for the call.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Mutex, PoisonError};

use awaken_event::{AgentEvent, EventSink, ToolCallId};
use awaken_tool::ProgressSink;
use futures_util::future::{Either, select};
use serde_json::Value;
use tokio::sync::Notify;

/// The progress reports of a run's calls not yet emitted, in the order they were made.
#[derive(Debug, Default)]
pub(crate) struct ProgressQueue {
    reports: Mutex<Vec<(ToolCallId, Value)>>,
    ready: Notify,
}

impl ProgressSink for ProgressQueue {
    fn report(&self, call_id: &ToolCallId, progress: Value) {
        self.reports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((call_id.clone(), progress));
        self.ready.notify_one();
    }
}

impl ProgressQueue {
    /// Emits the queued reports.
    fn emit_to(&self, sink: &dyn EventSink) {
        let reports =
            std::mem::take(&mut *self.reports.lock().unwrap_or_else(PoisonError::into_inner));
        for (call_id, progress) in reports {
            sink.emit(&AgentEvent::ToolCallProgress { call_id, progress });
        }
    }

    /// Awaits `call`, emitting the reports made meanwhile as they come, and those left when it
    /// ends (before the caller emits anything about the call's result). A call that finishes
    /// on its first poll costs no more than awaiting it.
    ///
    /// The call comes pinned by the caller: taken by value, it would be stored twice in the
    /// caller's future (the argument and its pinned copy), a few hundred bytes per run.
    pub(crate) async fn forward<F: Future>(
        &self,
        mut call: Pin<&mut F>,
        sink: &dyn EventSink,
    ) -> F::Output {
        loop {
            let ready = pin!(self.ready.notified());
            match select(call.as_mut(), ready).await {
                Either::Left((out, _)) => {
                    self.emit_to(sink);
                    return out;
                }
                Either::Right(((), _)) => self.emit_to(sink),
            }
        }
    }
}
