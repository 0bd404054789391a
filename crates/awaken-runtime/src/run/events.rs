//! What the run records: events emitted now or held back until their commit, the calls opened
//! and not yet closed, the run's messages, and its checkpoints.

use awaken_event::{AgentEvent, Message, TerminationReason, ToolCallId, ToolCallState, ToolResult};

use crate::durable::{BatchChange, CheckpointError};
use crate::run::{Failure, Run};
use crate::shown::ChangesFirst;

impl Run<'_> {
    /// An event emitted now (stored with the next commit when it is a lifecycle event).
    pub(super) fn note(&mut self, event: AgentEvent) {
        if self.visible.is_some() {
            self.show_changes();
        }
        self.durable.note(event, self.sink);
    }

    /// An event about a fact of the next commit, emitted after it.
    pub(super) fn fact(&mut self, event: AgentEvent) {
        self.durable.fact(event);
    }

    /// A `ToolCallStart` or `ToolCallResumed` event for the call: it is open.
    pub(super) fn opened(&mut self, call_id: &ToolCallId) {
        // Once, even when a model opens one id twice (it is closed once).
        if !self.open_calls.contains(call_id) {
            self.open_calls.push(call_id.clone());
        }
    }

    /// A `ToolCallDone` or `ToolCallSuspended` event for the call: it is closed.
    pub(super) fn closed(&mut self, call_id: &ToolCallId) {
        if let Some(i) = self.open_calls.iter().position(|open| open == call_id) {
            self.open_calls.remove(i);
        }
    }

    /// Closes the calls still open when a step fails (announced, but the step ended before
    /// they had a result: a call that has one has its result event already), each with a
    /// cancelled result saying why, as the calls of a failed inference are closed.
    pub(super) fn close_open_calls(&mut self, failure: &Failure) {
        let why = failure.call_reason();
        for call_id in std::mem::take(&mut self.open_calls) {
            self.note(AgentEvent::ToolCallDone {
                call_id,
                result: ToolResult::error(why).into(),
                state: ToolCallState::Cancelled,
            });
        }
    }

    /// Closes the calls of the run's batch that a run ending by `termination` (not waiting)
    /// will never finish, each with its closing result in the batch and as a tool message of
    /// the run's last commit, in call order: `Requested` and `Suspended` calls were not
    /// executed ("not executed: the run was cancelled", "... failed", "... ended"), an
    /// `Executing` one is closed outcome unknown. No event is emitted: the run is between
    /// steps, and each such call was closed by `ToolCallSuspended` or never announced by this
    /// activation (an announced call gets its `ToolCallDone` in its step).
    pub(super) fn close_batch(&mut self, termination: &TerminationReason) {
        let Some(batch) = self.batch.as_mut() else {
            return;
        };
        if batch.is_closed() || *termination == TerminationReason::Suspended {
            return;
        }
        let reason = match termination {
            TerminationReason::Cancelled => "the run was cancelled",
            TerminationReason::Error { .. } => "the run failed",
            _ => "the run ended",
        };
        let closed = batch.close(reason);
        let results: Vec<Message> = closed
            .into_iter()
            .filter_map(|id| {
                let result = batch.get(&id)?.result()?;
                Some(Message::tool(id, result))
            })
            .collect();
        for message in results {
            self.push_message(message);
        }
    }

    /// A message of the run: in the history at once, in the store with the next commit.
    pub(super) fn push_message(&mut self, message: Message) {
        self.history.push(message.clone());
        self.durable.push_message(message);
    }

    /// Commits what happened since the last commit, with `batch` of the run's batch, then emits
    /// the events about it.
    pub(super) async fn checkpoint(&mut self, batch: BatchChange) -> Result<(), Failure> {
        self.commit(batch)
            .await
            .map_err(|e| Failure::Error(e.to_string()))
    }

    /// [`checkpoint`](Self::checkpoint) with the commit's own error (the activation's first
    /// commit reports it as the run's): the run's state, statistics and batch handed to
    /// `Durable::commit`, which builds, writes and retries the commit.
    pub(super) async fn commit(&mut self, batch: BatchChange) -> Result<(), CheckpointError> {
        // With visible keys, the state's changes are shown before the commit's events.
        let changes_first;
        let sink: &dyn awaken_event::EventSink = match self.visible.as_deref() {
            None => self.sink,
            Some(visible) => {
                visible.emit_changes(self.sink, &mut self.durable);
                changes_first = ChangesFirst::new(self.sink, visible);
                &changes_first
            }
        };
        self.durable
            .commit(
                self.engine.store(),
                self.stats_at,
                batch,
                &mut self.batch,
                sink,
            )
            .await
    }
}
