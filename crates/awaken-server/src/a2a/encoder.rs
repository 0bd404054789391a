//! The A2A stream: a run's activation as `StreamResponse` events over Server-Sent Events.
//!
//! The task comes first (as it stands when the stream begins), then a `TASK_STATE_WORKING`
//! status update; each step's text streams as pieces of the task's answer artifact (a step's
//! first piece replaces what an earlier step streamed); when the run ends, the whole answer
//! as the artifact's last piece (for a completed task), then exactly one final status update
//! (completed, input required, canceled or failed), and the stream ends.

use std::collections::VecDeque;

use awaken_a2a::{
    A2aError, Message, StreamResponse, Task, TaskArtifactUpdateEvent, TaskState, TaskStatus,
    TaskStatusUpdateEvent,
};
use awaken_event::{AgentEvent, SuspendTicket};
use axum::body::Bytes;

use crate::live::Frame;
use crate::sse::{Encoder, data};

use super::task::{answer_artifact, state_of_termination, status};

/// Writes one task's activation as A2A stream responses.
pub(crate) struct A2aEncoder {
    context_id: String,
    task_id: String,
    /// The task's state as the stream's first event gives it.
    initial: TaskState,
    /// The client's message, for the first event's history.
    history: Vec<Message>,
    /// Whether the task was sent.
    opened: bool,
    /// Whether the current step streamed text yet.
    step_text: bool,
    /// The calls suspended in this activation and not decided since.
    waiting: Vec<SuspendTicket>,
    /// Whether the final status was sent.
    done: bool,
}

impl A2aEncoder {
    /// The stream of task `task_id` in context `context_id`, opening with the task in state
    /// `initial` (with `history`, the client's message, if any).
    pub(crate) fn new(
        context_id: &str,
        task_id: &str,
        initial: TaskState,
        history: Vec<Message>,
    ) -> Self {
        Self {
            context_id: context_id.to_owned(),
            task_id: task_id.to_owned(),
            initial,
            history,
            opened: false,
            step_text: false,
            waiting: Vec::new(),
            done: false,
        }
    }

    fn send(&self, response: &StreamResponse, out: &mut VecDeque<Bytes>) {
        match serde_json::to_value(response) {
            Ok(v) => out.push_back(data(&v)),
            Err(e) => out.push_back(error_event(&A2aError::Internal {
                detail: format!("unserialisable stream response: {e}"),
            })),
        }
    }

    fn status_update(&self, status: TaskStatus, out: &mut VecDeque<Bytes>) {
        let update = StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            status,
            metadata: None,
        });
        self.send(&update, out);
    }

    fn artifact_update(&self, text: &str, append: bool, last: bool, out: &mut VecDeque<Bytes>) {
        let update = StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
            task_id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            artifact: answer_artifact(&self.task_id, text),
            append,
            last_chunk: last,
            metadata: None,
        });
        self.send(&update, out);
    }

    /// The task, then the working status (once, before anything else).
    fn open(&mut self, out: &mut VecDeque<Bytes>) {
        if std::mem::replace(&mut self.opened, true) {
            return;
        }
        let task = StreamResponse::Task(Task {
            id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            status: TaskStatus {
                state: self.initial,
                ..TaskStatus::default()
            },
            history: std::mem::take(&mut self.history),
            ..Task::default()
        });
        self.send(&task, out);
        self.status_update(
            TaskStatus {
                state: TaskState::Working,
                ..TaskStatus::default()
            },
            out,
        );
    }
}

impl Encoder for A2aEncoder {
    fn frame(&mut self, frame: &Frame, out: &mut VecDeque<Bytes>) {
        let Some(event) = frame.event() else {
            return;
        };
        self.open(out);
        match event {
            AgentEvent::StepStart { .. } => self.step_text = false,
            AgentEvent::TextDelta { delta } if !delta.is_empty() => {
                let append = std::mem::replace(&mut self.step_text, true);
                self.artifact_update(&delta, append, false, out);
            }
            AgentEvent::ToolCallSuspended { ticket, .. } => {
                self.waiting
                    .retain(|t| t.call.call_id != ticket.call.call_id);
                self.waiting.push(*ticket);
            }
            AgentEvent::ToolCallResumed { call_id, .. }
            | AgentEvent::ToolCallDone { call_id, .. } => {
                self.waiting.retain(|t| t.call.call_id != call_id);
            }
            AgentEvent::RunFinish {
                termination,
                response,
                ..
            } => {
                let state = state_of_termination(&termination);
                let answer = response.as_deref().filter(|r| !r.is_empty());
                if let (TaskState::Completed, Some(text)) = (state, answer) {
                    self.artifact_update(text, false, true, out);
                }
                let final_status = status(
                    (&self.context_id, &self.task_id),
                    state,
                    Some(&termination),
                    response.as_deref(),
                    &self.waiting,
                    None,
                );
                self.status_update(final_status, out);
                self.done = true;
            }
            _ => {}
        }
    }

    fn notice(&mut self, kind: &str, data: &serde_json::Value, out: &mut VecDeque<Bytes>) {
        // (A lagging client gets the stored events next: nothing to say.)
        if kind == "lagged" {
            return;
        }
        let detail = data
            .get("message")
            .and_then(serde_json::Value::as_str)
            .unwrap_or(kind)
            .to_owned();
        let error = if kind == "shutdown" {
            A2aError::Refused {
                status: 503,
                code: "shutting_down".to_owned(),
                detail,
            }
        } else {
            A2aError::Internal { detail }
        };
        out.push_back(error_event(&error));
        self.done = true;
    }

    fn complete(&self) -> bool {
        self.done
    }
}

/// An SSE `error` event carrying the binding's error body.
pub(crate) fn error_event(error: &A2aError) -> Bytes {
    let body = serde_json::to_string(&error.body()).unwrap_or_else(|_| "{}".to_owned());
    Bytes::from(format!("event: error\ndata: {body}\n\n"))
}
