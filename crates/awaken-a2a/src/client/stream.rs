//! One run on a remote agent: the last user message sent with `message:stream`, the task's
//! stream read event by event and translated into one activation's neutral events
//! (`RunStart`, one step holding the answer's text, `RunFinish`), and the outcome.
//!
//! Completed is the answer (the artifacts' text, else the final status message's); input or
//! authentication required suspends the run with the remote agent's question as its response
//! and the task's id as its handle (a request answering it sends its message into that task);
//! failed, rejected, an HTTP error or a stream that is not well-formed is a [`BackendError`]
//! saying what and where. A cancelled run asks the remote host to cancel the task (the one it
//! answers, when it was cancelled before its message went out).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{
    AgentEvent, CancellationToken, EventSink, Role as EventRole, TerminationReason, TokenUsage,
};
use awaken_resolver::{BackendError, BackendOutcome, BackendRequest, ExecutionBackend};
use awaken_spec::{AgentSpec, EndpointSpec};
use futures_util::StreamExt;
use futures_util::future::{Either, select};
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use tracing::Instrument;

use super::sse::{SseDecoder, SseError};
use super::{
    A2A_BACKEND_ID, A2A_ENDPOINT_PROTOCOL, A2aBackend, MAX_BODY_BYTES, SHORT_CALL_TIMEOUT,
    base_url, chain, read_prefix,
};
use crate::error::ErrorBody;
use crate::message::{Message, Part, PartContent};
use crate::request::{SendMessageRequest, StreamResponse};
use crate::task::{Artifact, TaskState, TaskStatus};
use crate::{PROTOCOL_VERSION, VERSION_HEADER};

/// The one step a remote run's text is streamed in.
const STEP: u32 = 1;

/// Why a remote run failed, with the call it failed in.
#[derive(Debug, thiserror::Error)]
enum RunFailure {
    #[error("the agent has no endpoint")]
    NoEndpoint,
    #[error("the run has no user message to send")]
    NoUserMessage,
    #[error("its bearer token variable `{variable}` is not set or holds no valid token")]
    MissingCredential { variable: String },
    #[error("the request could not be encoded: {source}")]
    Encode {
        #[source]
        source: serde_json::Error,
    },
    #[error("POST {url} failed: {}", chain(source))]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("POST {url} answered HTTP {status}: {message}")]
    Status {
        url: String,
        status: u16,
        message: String,
    },
    #[error("POST {url} answered `{content_type}`, not an event stream")]
    NotEventStream { url: String, content_type: String },
    #[error("the stream of POST {url} broke off: {}", chain(source))]
    Read {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the stream of POST {url} is malformed: {source}")]
    Sse {
        url: String,
        #[source]
        source: SseError,
    },
    #[error("event {event} of the stream of POST {url} is no A2A stream response: {source}")]
    Malformed {
        url: String,
        event: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("event {event} of the stream of POST {url} is an error ({status}): {message}")]
    RemoteError {
        url: String,
        event: usize,
        status: String,
        message: String,
    },
    #[error("remote task `{task_id}` ended {}: {message}", state.as_str())]
    TaskFailed {
        task_id: String,
        state: TaskState,
        message: String,
    },
    #[error("the remote agent asked for input ({}) without naming its task", state.as_str())]
    NoTaskId { state: TaskState },
    #[error("the stream of POST {url} ended before the task finished (last state: {})",
        last.map_or("none", TaskState::as_str))]
    EndedEarly {
        url: String,
        last: Option<TaskState>,
    },
}

/// How the remote exchange ended, short of a failure.
enum Ended {
    /// The task completed (or the agent answered directly) with this text.
    Completed(String),
    /// The task waits for the client: its id and the agent's question.
    Interrupted { task_id: String, question: String },
    /// The task was canceled (by this run's cancellation or by the remote side).
    Canceled,
}

/// Runs `request` on the remote agent of `agent`, its events to `sink`.
pub(super) async fn run(
    backend: &A2aBackend,
    agent: &AgentSpec,
    request: BackendRequest,
    sink: &dyn EventSink,
) -> Result<BackendOutcome, BackendError> {
    let span = tracing::info_span!(
        "a2a.run",
        agent = %agent.id,
        run_id = %request.run_id,
        thread_id = %request.thread_id,
    );
    run_in_span(backend, agent, request, sink)
        .instrument(span)
        .await
}

async fn run_in_span(
    backend: &A2aBackend,
    agent: &AgentSpec,
    request: BackendRequest,
    sink: &dyn EventSink,
) -> Result<BackendOutcome, BackendError> {
    sink.emit(&AgentEvent::RunStart {
        thread_id: request.thread_id.clone(),
        run_id: request.run_id.clone(),
        agent_id: Arc::from(agent.id.as_str()),
        parent_run_id: None,
        resumed: false,
    });
    sink.emit(&AgentEvent::StepStart { step: STEP });
    let ended = exchange(backend, agent, &request, sink).await;
    sink.emit(&AgentEvent::StepEnd { step: STEP });
    let (termination, response, result) = match ended {
        Ok(Ended::Completed(text)) => (TerminationReason::NaturalEnd, Some(text), Ok(None)),
        Ok(Ended::Interrupted { task_id, question }) => (
            TerminationReason::Suspended,
            Some(question),
            Ok(Some(task_id)),
        ),
        Ok(Ended::Canceled) => (TerminationReason::Cancelled, None, Ok(None)),
        Err(failure) => {
            let message = format!("agent `{}`: {failure}", agent.id);
            tracing::warn!(agent = %agent.id, run_id = %request.run_id, "{message}");
            sink.emit(&AgentEvent::Error {
                message: message.clone(),
            });
            (
                TerminationReason::error(message.clone()),
                None,
                Err(message),
            )
        }
    };
    sink.emit(&AgentEvent::RunFinish {
        thread_id: request.thread_id.clone(),
        run_id: request.run_id.clone(),
        termination: Box::new(termination.clone()),
        response: response.clone(),
        usage: Box::default(),
    });
    match result {
        Ok(waiting) => Ok(BackendOutcome {
            termination,
            response,
            usage: TokenUsage::default(),
            waiting,
        }),
        Err(message) => Err(BackendError {
            backend: A2A_BACKEND_ID.to_owned(),
            message,
        }),
    }
}

/// Sends the message and follows the task's stream to its end, its cancellation or a failure.
/// Dropped before then with its cancellation fired (a runtime drops the future of a call it
/// cancels), it has the remote task cancelled in the background. Dropped otherwise (a process
/// stopping its runs at their last checkpoint), the task goes on for the run's recovery to
/// find again.
async fn exchange(
    backend: &A2aBackend,
    agent: &AgentSpec,
    request: &BackendRequest,
    sink: &dyn EventSink,
) -> Result<Ended, RunFailure> {
    let mut abandoned = Abandoned {
        backend,
        agent,
        cancel: &request.cancel,
        task_id: request.answering.clone(),
    };
    let ended = follow(backend, agent, request, sink, &mut abandoned.task_id).await;
    // Finished: nothing to cancel when the guard goes.
    abandoned.task_id = None;
    ended
}

/// The remote task of an exchange in flight, cancelled if the exchange is dropped unfinished
/// after its run's cancellation.
struct Abandoned<'a> {
    backend: &'a A2aBackend,
    agent: &'a AgentSpec,
    cancel: &'a CancellationToken,
    /// The task, once known (the answered one, or the one the stream names); cleared when the
    /// exchange finished.
    task_id: Option<String>,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if !self.cancel.is_cancelled() {
            return;
        }
        let (Some(task_id), Some(endpoint), Ok(runtime)) = (
            self.task_id.take(),
            self.agent.endpoint.as_ref(),
            tokio::runtime::Handle::try_current(),
        ) else {
            return;
        };
        let (backend, agent) = (self.backend.clone(), self.agent.clone());
        let base = base_url(endpoint).to_owned();
        runtime.spawn(async move { cancel_remote(&backend, &agent, &base, Some(&task_id)).await });
    }
}

/// [`exchange`]'s work; `known` is kept up to date with the remote task's id.
async fn follow(
    backend: &A2aBackend,
    agent: &AgentSpec,
    request: &BackendRequest,
    sink: &dyn EventSink,
    known: &mut Option<String>,
) -> Result<Ended, RunFailure> {
    let Some(endpoint) = agent.endpoint.as_ref() else {
        // The resolver hands a backend only agents with an endpoint.
        return Err(RunFailure::NoEndpoint);
    };
    let base = base_url(endpoint);
    let text = request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == EventRole::User)
        .map(awaken_event::Message::content_as_text)
        .ok_or(RunFailure::NoUserMessage)?;
    let mut message = Message::user_text(A2aBackend::message_id(&request.run_id), text);
    message.context_id = Some(A2aBackend::context_id(&request.thread_id));
    message.task_id.clone_from(&request.answering);
    let body = serde_json::to_vec(&SendMessageRequest {
        message,
        ..SendMessageRequest::default()
    })
    .map_err(|source| RunFailure::Encode { source })?;

    let url = format!("{base}/message:stream");
    let call = backend
        .http
        .post(&url)
        .header(VERSION_HEADER, PROTOCOL_VERSION)
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "text/event-stream")
        .body(body);
    let call = backend
        .authorize(agent, call)
        .map_err(|variable| RunFailure::MissingCredential { variable })?;
    // A cancelled request sends nothing; one answering a waiting task cancels that task.
    if request.cancel.is_cancelled() {
        cancel_remote(backend, agent, base, request.answering.as_deref()).await;
        return Ok(Ended::Canceled);
    }
    let Some(response) = or_cancel(&request.cancel, call.send()).await else {
        cancel_remote(backend, agent, base, request.answering.as_deref()).await;
        return Ok(Ended::Canceled);
    };
    let response = response.map_err(|source| RunFailure::Unreachable {
        url: url.clone(),
        source,
    })?;
    let status = response.status();
    if !status.is_success() {
        let body = read_prefix(response, MAX_BODY_BYTES)
            .await
            .unwrap_or_default();
        return Err(RunFailure::Status {
            url,
            status: status.as_u16(),
            message: error_message(&body),
        });
    }
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if !content_type
        .to_ascii_lowercase()
        .starts_with("text/event-stream")
    {
        return Err(RunFailure::NotEventStream { url, content_type });
    }

    let mut bytes = response.bytes_stream();
    let mut decoder = SseDecoder::default();
    let mut task = TaskProgress::default();
    let mut events = Vec::new();
    let mut seen = 0usize;
    loop {
        let Some(next) = or_cancel(&request.cancel, bytes.next()).await else {
            let task_id = task.id.as_deref().or(request.answering.as_deref());
            cancel_remote(backend, agent, base, task_id).await;
            return Ok(Ended::Canceled);
        };
        let Some(chunk) = next else {
            if decoder.has_partial_event() {
                return Err(RunFailure::Sse {
                    url,
                    source: SseError::Truncated,
                });
            }
            return Err(RunFailure::EndedEarly {
                url,
                last: task.state,
            });
        };
        let chunk = chunk.map_err(|source| RunFailure::Read {
            url: url.clone(),
            source,
        })?;
        decoder
            .feed(&chunk, &mut events)
            .map_err(|source| RunFailure::Sse {
                url: url.clone(),
                source,
            })?;
        for data in events.drain(..) {
            seen += 1;
            let event = parse_event(&data).map_err(|e| match e {
                Parsed::Error(body) => RunFailure::RemoteError {
                    url: url.clone(),
                    event: seen,
                    status: body.error.status,
                    message: body.error.message,
                },
                Parsed::Malformed(source) => RunFailure::Malformed {
                    url: url.clone(),
                    event: seen,
                    source,
                },
            })?;
            let ended = task.apply(event, sink)?;
            if known.is_none() {
                known.clone_from(&task.id);
            }
            if let Some(ended) = ended {
                return Ok(ended);
            }
        }
    }
}

/// What an event's data is when it is no stream response.
enum Parsed {
    /// The binding's error body.
    Error(ErrorBody),
    /// Neither a stream response nor an error body.
    Malformed(serde_json::Error),
}

fn parse_event(data: &str) -> Result<StreamResponse, Parsed> {
    serde_json::from_str::<StreamResponse>(data).map_err(|source| {
        match serde_json::from_str::<ErrorBody>(data) {
            Ok(body) => Parsed::Error(body),
            Err(_) => Parsed::Malformed(source),
        }
    })
}

/// What the stream said of the task so far.
#[derive(Debug, Default)]
struct TaskProgress {
    /// The remote task's id, once the stream named it.
    id: Option<String>,
    /// Its last state.
    state: Option<TaskState>,
    /// Artifact id → its text so far, in the order the artifacts came.
    artifacts: Vec<(String, String)>,
}

impl TaskProgress {
    /// Applies one stream response; `Some` once the exchange has ended.
    fn apply(
        &mut self,
        event: StreamResponse,
        sink: &dyn EventSink,
    ) -> Result<Option<Ended>, RunFailure> {
        match event {
            StreamResponse::Task(task) => {
                self.id = Some(task.id);
                for artifact in task.artifacts {
                    self.artifact(artifact, false, sink);
                }
                self.status(task.status, sink)
            }
            StreamResponse::Message(message) => {
                // A direct answer with no task: the exchange's end.
                let text = parts_text(&message.parts);
                emit_text(sink, &text);
                Ok(Some(Ended::Completed(text)))
            }
            StreamResponse::StatusUpdate(update) => {
                self.id.get_or_insert(update.task_id);
                self.status(update.status, sink)
            }
            StreamResponse::ArtifactUpdate(update) => {
                self.id.get_or_insert(update.task_id);
                self.artifact(update.artifact, update.append, sink);
                Ok(None)
            }
        }
    }

    fn artifact(&mut self, artifact: Artifact, append: bool, sink: &dyn EventSink) {
        let text = parts_text(&artifact.parts);
        emit_text(sink, &text);
        match self
            .artifacts
            .iter_mut()
            .find(|(id, _)| *id == artifact.artifact_id)
        {
            Some((_, so_far)) if append => so_far.push_str(&text),
            Some((_, so_far)) => *so_far = text,
            None => self.artifacts.push((artifact.artifact_id, text)),
        }
    }

    fn status(
        &mut self,
        status: TaskStatus,
        sink: &dyn EventSink,
    ) -> Result<Option<Ended>, RunFailure> {
        self.state = Some(status.state);
        let said = status
            .message
            .as_ref()
            .map(|m| parts_text(&m.parts))
            .unwrap_or_default();
        match status.state {
            TaskState::Completed => {
                let answer = if self.artifacts.is_empty() {
                    emit_text(sink, &said);
                    said
                } else {
                    self.artifacts
                        .iter()
                        .map(|(_, text)| text.as_str())
                        .collect::<Vec<_>>()
                        .join("\n")
                };
                Ok(Some(Ended::Completed(answer)))
            }
            TaskState::InputRequired | TaskState::AuthRequired => {
                emit_text(sink, &said);
                let Some(task_id) = self.id.clone() else {
                    return Err(RunFailure::NoTaskId {
                        state: status.state,
                    });
                };
                Ok(Some(Ended::Interrupted {
                    task_id,
                    question: said,
                }))
            }
            TaskState::Canceled => Ok(Some(Ended::Canceled)),
            TaskState::Failed | TaskState::Rejected => Err(RunFailure::TaskFailed {
                task_id: self.id.clone().unwrap_or_default(),
                state: status.state,
                message: if said.is_empty() {
                    "(no message)".to_owned()
                } else {
                    said
                },
            }),
            TaskState::Submitted | TaskState::Working | TaskState::Unspecified => {
                if !said.is_empty() {
                    tracing::debug!(state = status.state.as_str(), "remote status: {said}");
                }
                Ok(None)
            }
        }
    }
}

/// The text of `parts`: text parts as they are, data parts as JSON; files are left out.
fn parts_text(parts: &[Part]) -> String {
    let mut out = String::new();
    for part in parts {
        match &part.content {
            PartContent::Text(text) => out.push_str(text),
            PartContent::Data(value) => out.push_str(&value.to_string()),
            PartContent::Raw(_) | PartContent::Url(_) => {}
        }
    }
    out
}

fn emit_text(sink: &dyn EventSink, text: &str) {
    if !text.is_empty() {
        sink.emit(&AgentEvent::TextDelta {
            delta: text.to_owned(),
        });
    }
}

/// The message of an error body (the binding's, else the body's text).
fn error_message(body: &[u8]) -> String {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(body) => format!("{} ({})", body.error.message, body.error.status),
        Err(_) if body.is_empty() => "(empty body)".to_owned(),
        Err(_) => String::from_utf8_lossy(body).chars().take(500).collect(),
    }
}

/// Asks the remote host to cancel task `task_id` (when the stream named one). Best effort: the
/// run is cancelled whatever the host answers.
async fn cancel_remote(backend: &A2aBackend, agent: &AgentSpec, base: &str, task_id: Option<&str>) {
    let Some(task_id) = task_id else {
        return;
    };
    let url = format!("{base}/tasks/{task_id}:cancel");
    let call = backend
        .http
        .post(&url)
        .timeout(SHORT_CALL_TIMEOUT)
        .header(VERSION_HEADER, PROTOCOL_VERSION)
        .header(CONTENT_TYPE, "application/json")
        .body("{}");
    let call = match backend.authorize(agent, call) {
        Ok(call) => call,
        Err(variable) => {
            tracing::warn!(agent = %agent.id, %url, "no cancel sent: `{variable}` is not set");
            return;
        }
    };
    match call.send().await {
        Ok(r) if r.status().is_success() => {}
        Ok(r) => {
            tracing::warn!(agent = %agent.id, %url, status = r.status().as_u16(), "cancel refused")
        }
        Err(e) => tracing::warn!(agent = %agent.id, %url, "cancel failed: {}", chain(&e)),
    }
}

/// `fut`'s output, or `None` once `cancel` fires first.
async fn or_cancel<F: Future>(cancel: &CancellationToken, fut: F) -> Option<F::Output> {
    match select(pin!(fut), pin!(cancel.cancelled())).await {
        Either::Left((output, _)) => Some(output),
        Either::Right(_) => None,
    }
}

#[async_trait]
impl ExecutionBackend for A2aBackend {
    fn id(&self) -> &str {
        A2A_BACKEND_ID
    }

    fn claims(&self, endpoint: &EndpointSpec) -> bool {
        endpoint
            .protocol
            .as_deref()
            .is_some_and(|p| p.eq_ignore_ascii_case(A2A_ENDPOINT_PROTOCOL))
    }

    async fn run(
        &self,
        agent: &AgentSpec,
        request: BackendRequest,
        sink: &dyn EventSink,
    ) -> Result<BackendOutcome, BackendError> {
        run(self, agent, request, sink).await
    }
}
