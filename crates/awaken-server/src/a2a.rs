//! The A2A edge: every agent over the Agent2Agent protocol, v1.0, HTTP+JSON binding.
//!
//! - `GET /.well-known/agent-card.json`: the card of the default agent (the configured one,
//!   else the first); `GET /a2a/{agent}/.well-known/agent-card.json`: each agent's card, whose
//!   interface is `/a2a/{agent}`.
//! - `POST /a2a/{agent}/message:send` and `message:stream`: a message starts a run (a task) on
//!   the thread named by its `contextId` (one is made when absent), or, when that thread waits
//!   for decisions, answers its waiting calls and resumes the run (the same task).
//! - `GET /a2a/{agent}/tasks/{id}`, `GET /a2a/{agent}/tasks?contextId=…`,
//!   `POST /a2a/{agent}/tasks/{id}:cancel`, `GET|POST /a2a/{agent}/tasks/{id}:subscribe`.
//!
//! A task is a run (task id = run id) and its context is the run's thread. The runtime's
//! neutral events are translated here only; runs start and resume as the native routes do.

mod card;
mod encoder;
mod failure;
mod input;
mod task;

#[cfg(test)]
mod tests;

use awaken_a2a::{
    A2A_JSON_MEDIA_TYPE, A2aError, ListTasksRequest, ListTasksResponse, SendMessageRequest,
    SendMessageResponse, StreamResponse, Task, TaskState, VERSION_HEADER,
};
use awaken_event::{RunId, ThreadId};
use awaken_runtime::RunActivation;
use awaken_store::RunStatus;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde::Serialize;

use crate::app::AgentServer;
use crate::runs::{Job, resume_of, shutting_down, start};
use crate::sse::{data, encoded_stream};

use encoder::A2aEncoder;
pub(crate) use failure::unauthorized;
use failure::{A2aFailure, A2aResult, from_api, json_response, store_error};
use input::Input;

/// The A2A routes (at the root: the host's card and `/a2a/{agent}/...`).
pub(crate) fn routes() -> Router<AgentServer> {
    let agent = Router::new()
        .route("/.well-known/agent-card.json", get(agent_card))
        .route("/message:send", post(send))
        .route("/message:stream", post(stream))
        .route("/tasks", get(list))
        .route("/tasks/{task}", get(get_task).post(task_action))
        .fallback(no_route)
        .method_not_allowed_fallback(no_method);
    Router::new()
        .route("/.well-known/agent-card.json", get(host_card))
        .nest("/a2a/{agent}", agent)
}

async fn no_route(uri: Uri) -> A2aFailure {
    A2aError::MethodNotFound {
        what: format!("no A2A operation at `{}`", uri.path()),
    }
    .into()
}

async fn no_method(uri: Uri) -> A2aFailure {
    A2aError::UnsupportedOperation {
        operation: uri.path().to_owned(),
        reason: "this route does not take that method".to_owned(),
    }
    .into()
}

fn ok<T: Serialize>(value: &T) -> A2aResult {
    Ok(json_response(StatusCode::OK, value))
}

// ---- checks ----

/// Refuses a client that speaks another protocol version than 1.0 (`A2A-Version`; a request
/// without the header is taken as 1.0).
fn check_version(headers: &HeaderMap) -> A2aResult<()> {
    let Some(value) = headers.get(VERSION_HEADER) else {
        return Ok(());
    };
    let version = value.to_str().unwrap_or("").trim();
    let mut numbers = version.split('.');
    let major = numbers.next().and_then(|n| n.parse::<u32>().ok());
    let minor = numbers.next().map_or(Some(0), |n| n.parse::<u32>().ok());
    if major == Some(1) && minor == Some(0) && numbers.all(|n| n.parse::<u32>().is_ok()) {
        Ok(())
    } else {
        Err(A2aError::VersionNotSupported {
            version: version.to_owned(),
        }
        .into())
    }
}

/// Refuses a body that is not JSON by its `Content-Type` (`application/json` or
/// `application/a2a+json`; an absent one is taken as JSON).
fn check_content_type(headers: &HeaderMap) -> A2aResult<()> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let given = value.to_str().unwrap_or("");
    let essence = given.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json")
        || essence.eq_ignore_ascii_case(A2A_JSON_MEDIA_TYPE)
    {
        Ok(())
    } else {
        Err(A2aError::UnsupportedMediaType {
            content_type: given.to_owned(),
        }
        .into())
    }
}

/// The agent of the path, or 404.
fn known_agent(server: &AgentServer, agent: &str) -> A2aResult<()> {
    let registries = server.shared.runtime.resolver().registries();
    if registries.agent(agent).is_some() {
        Ok(())
    } else {
        Err(A2aError::MethodNotFound {
            what: format!(
                "no agent `{agent}` (this server has: {})",
                registries.agent_ids().join(", ")
            ),
        }
        .into())
    }
}

/// The body as a JSON value of `T`: 400 for malformed JSON or the wrong shape, 413 when over
/// the limit.
fn read_body<T: serde::de::DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> A2aResult<T> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            A2aFailure::from(A2aError::Refused {
                status: 413,
                code: "body_too_large".to_owned(),
                detail: "the request body is over the server's limit".to_owned(),
            })
        } else {
            A2aError::InvalidRequest {
                detail: e.body_text(),
            }
            .into()
        }
    })?;
    serde_json::from_slice(&body).map_err(|e| {
        if e.is_data() {
            A2aError::InvalidParams {
                field: "body".to_owned(),
                detail: e.to_string(),
            }
        } else {
            A2aError::InvalidRequest {
                detail: format!("the body is not JSON: {e}"),
            }
        }
        .into()
    })
}

// ---- cards ----

async fn host_card(State(server): State<AgentServer>, headers: HeaderMap) -> A2aResult {
    let Some(agent) = card::default_agent(&server) else {
        return Err(A2aError::MethodNotFound {
            what: "this server has no agent".to_owned(),
        }
        .into());
    };
    card_of(&server, &agent, &headers)
}

async fn agent_card(
    State(server): State<AgentServer>,
    Path(agent): Path<String>,
    headers: HeaderMap,
) -> A2aResult {
    known_agent(&server, &agent)?;
    card_of(&server, &agent, &headers)
}

fn card_of(server: &AgentServer, agent: &str, headers: &HeaderMap) -> A2aResult {
    let base = card::base_url(headers).ok_or_else(|| A2aError::InvalidRequest {
        detail: "the request's `Host` header is missing or not a host name".to_owned(),
    })?;
    let card = card::card(server, agent, &base).ok_or_else(|| A2aError::MethodNotFound {
        what: format!("no agent `{agent}`"),
    })?;
    ok(&card)
}

// ---- send ----

/// What a send request led to.
enum Sent {
    /// A task started or resumed, whose live run the client follows.
    Begun(Begun),
    /// The message was sent before (its id on its context): the task it started, not run again.
    Repeated(task::Located),
}

/// A started or resumed task whose live run a client follows.
struct Begun {
    live: std::sync::Arc<crate::live::LiveRun>,
    thread: ThreadId,
    task_id: RunId,
    resumed: bool,
    /// The client's message, as the task's history shows it.
    message: awaken_a2a::Message,
    return_immediately: bool,
}

/// Reads a send request and starts its run, or resumes the run it answers; a message sent again
/// finds the task it started.
async fn begin(
    server: &AgentServer,
    agent: &str,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> A2aResult<Sent> {
    check_version(headers)?;
    known_agent(server, agent)?;
    check_content_type(headers)?;
    let request: SendMessageRequest = read_body(body)?;
    let configuration = request.configuration.unwrap_or_default();
    if configuration.task_push_notification_config.is_some() {
        return Err(A2aError::PushNotificationNotSupported.into());
    }
    let mut message = request.message;
    let input = Input::read(&message)?;
    let runtime = &server.shared.runtime;

    // The thread: the task's, else the context's, else a new one.
    let task_at = match message.task_id.as_deref().filter(|t| !t.is_empty()) {
        Some(task_id) => Some(task::locate(server, agent, task_id).await?),
        None => None,
    };
    let context = message.context_id.clone().filter(|c| !c.is_empty());
    let thread = match (&task_at, context) {
        (Some(at), Some(c)) if c != at.thread.as_str() => {
            return Err(A2aError::InvalidParams {
                field: "message.contextId".to_owned(),
                detail: format!(
                    "task `{}` belongs to context `{}`, not `{c}`",
                    at.record.run_id, at.thread
                ),
            }
            .into());
        }
        (Some(at), _) => at.thread.clone(),
        (None, Some(c)) => ThreadId::new(&c).map_err(|e| A2aError::InvalidParams {
            field: "message.contextId".to_owned(),
            detail: format!("invalid context id: {e}"),
        })?,
        (None, None) => ThreadId::new(format!("a2a-{}", runtime.next_run_id())).map_err(|e| {
            A2aError::Internal {
                detail: format!("a new context id: {e}"),
            }
        })?,
    };

    let waiting = runtime
        .waiting_calls(&thread)
        .await
        .map_err(|e| from_api(e.into()))?;
    let (job, cancel, task_id, resumed) = if waiting.is_empty() {
        if let Some(at) = &task_at {
            return Err(A2aError::UnsupportedOperation {
                operation: "message:send".to_owned(),
                reason: format!(
                    "task `{}` waits for no input (it is {}); send the message without `taskId` to start a new task in context `{thread}`",
                    at.record.run_id,
                    at.record.status.as_str()
                ),
            }
            .into());
        }
        if !input.decisions.is_empty() {
            return Err(A2aError::InvalidParams {
                field: "message.parts".to_owned(),
                detail: format!("context `{thread}` has no call waiting for a decision"),
            }
            .into());
        }
        if input.text.trim().is_empty() {
            return Err(A2aError::InvalidParams {
                field: "message.parts".to_owned(),
                detail: "the message has no text".to_owned(),
            }
            .into());
        }
        let run_id = task::run_of_message(&thread, &message.message_id);
        if let Some(at) = task::find(server, &run_id).await? {
            if *at.record.agent_id != *agent || at.thread != thread {
                return Err(A2aError::InvalidParams {
                    field: "message.messageId".to_owned(),
                    detail: format!(
                        "message `{}` was sent before, to another agent or context",
                        message.message_id
                    ),
                }
                .into());
            }
            return Ok(Sent::Repeated(at));
        }
        let activation = RunActivation::new(thread.clone(), agent)
            .with_user_message(input.text)
            .with_run_id(run_id.clone());
        let cancel = activation.cancel.clone();
        (Job::Run(activation), cancel, run_id, false)
    } else {
        // The waiting run: the thread's latest.
        let latest = runtime
            .store()
            .latest_run(&thread)
            .await
            .map_err(store_error)?;
        let Some(run) = latest else {
            return Err(A2aError::Internal {
                detail: format!("context `{thread}` waits but has no run record"),
            }
            .into());
        };
        if *run.agent_id != *agent {
            return Err(A2aError::Refused {
                status: 409,
                code: "other_agent".to_owned(),
                detail: format!(
                    "context `{thread}` waits in a task of agent `{}`, not `{agent}`",
                    run.agent_id
                ),
            }
            .into());
        }
        if let Some(at) = &task_at
            && at.record.run_id != run.run_id
        {
            return Err(A2aError::UnsupportedOperation {
                operation: "message:send".to_owned(),
                reason: format!(
                    "task `{}` waits for no input; task `{}` of its context does",
                    at.record.run_id, run.run_id
                ),
            }
            .into());
        }
        let mut decisions = input.decisions.clone();
        if decisions.is_empty() {
            match input.decision_on(&waiting) {
                Some(decision) => decisions.push(decision),
                None => {
                    let calls: Vec<String> = waiting
                        .iter()
                        .map(|t| format!("`{}` ({})", t.call.call_id, t.call.tool_name))
                        .collect();
                    return Err(A2aError::InvalidParams {
                        field: "message.parts".to_owned(),
                        detail: format!(
                            "task `{}` waits for a decision on {}: answer with a data part {{\"decisions\": [{{\"call_id\": \"…\", \"approve\": true}}]}}{}",
                            run.run_id,
                            calls.join(", "),
                            if waiting.len() == 1 { ", or with the text yes or no" } else { "" }
                        ),
                    }
                    .into());
                }
            }
        }
        let resume = resume_of(server, &thread, decisions)
            .await
            .map_err(|mut e| {
                if e.field == Some("decisions") {
                    e.field = Some("message.parts");
                }
                from_api(e)
            })?;
        let cancel = resume.cancel.clone();
        (Job::Resume(resume), cancel, run.run_id.clone(), true)
    };
    message.context_id = Some(thread.to_string());
    message.task_id = Some(task_id.to_string());
    let live = start(server, &thread, cancel, job)
        .await
        .map_err(from_api)?;
    Ok(Sent::Begun(Begun {
        live,
        thread,
        task_id,
        resumed,
        message,
        return_immediately: configuration.return_immediately,
    }))
}

async fn send(
    State(server): State<AgentServer>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> A2aResult {
    let begun = match begin(&server, &agent, &headers, body).await? {
        Sent::Begun(begun) => begun,
        Sent::Repeated(at) => {
            return ok(&SendMessageResponse::Task(task::load(&server, &at).await?));
        }
    };
    if !begun.return_immediately {
        let ended = tokio::select! {
            ended = begun.live.ended() => ended,
            () = server.shared.closing.cancelled() => {
                return Err(from_api(shutting_down(&server, &begun.thread)));
            }
        };
        // A run whose activation failed outside the run (its commit) may have left no end. (One
        // whose end was not written, or that another worker took over, is answered as stored:
        // it is unfinished there, for a recovery or that worker to end.)
        if let Err(e) = ended {
            let mut task = current_task(&server, &begun).await?;
            if !matches!(e.code, "end_not_written" | "thread_busy")
                && !task.status.state.is_terminal()
                && !task.status.state.is_interrupted()
            {
                task.status = task::status(
                    (begun.thread.as_str(), begun.task_id.as_str()),
                    TaskState::Failed,
                    Some(&awaken_event::TerminationReason::Error { message: e.message }),
                    None,
                    &[],
                    task.status.timestamp.take(),
                );
            }
            return ok(&SendMessageResponse::Task(with_history(task, &begun)));
        }
    }
    let task = if begun.return_immediately {
        // (The task as it stands once its run started, without a trip to the store.)
        Task {
            id: begun.task_id.to_string(),
            context_id: begun.thread.to_string(),
            status: awaken_a2a::TaskStatus {
                state: TaskState::Working,
                message: None,
                timestamp: None,
            },
            ..Task::default()
        }
    } else {
        current_task(&server, &begun).await?
    };
    ok(&SendMessageResponse::Task(with_history(task, &begun)))
}

/// The begun task as the store has it now.
async fn current_task(server: &AgentServer, begun: &Begun) -> A2aResult<Task> {
    // The task's thread is known: its runs are read without the index.
    let Some(at) = task::on_thread(server, begun.thread.clone(), &begun.task_id).await? else {
        return Err(A2aError::TaskNotFound {
            task_id: begun.task_id.to_string(),
        }
        .into());
    };
    task::load(server, &at).await
}

/// `task` with the client's message as its history.
fn with_history(mut task: Task, begun: &Begun) -> Task {
    task.history.push(begun.message.clone());
    task
}

async fn stream(
    State(server): State<AgentServer>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> A2aResult {
    let begun = match begin(&server, &agent, &headers, body).await? {
        Sent::Begun(begun) => begun,
        // The task's live run from where it is, or the task as it ended.
        Sent::Repeated(at) => return follow(&server, at).await,
    };
    let initial = if begun.resumed {
        TaskState::Working
    } else {
        TaskState::Submitted
    };
    let encoder = A2aEncoder::new(
        begun.thread.as_str(),
        begun.task_id.as_str(),
        initial,
        vec![begun.message.clone()],
    );
    encoded_stream(
        server.stream_context(),
        begun.thread.clone(),
        Some(begun.live),
        None,
        encoder,
    )
    .await
    .map_err(store_error)
}

// ---- tasks ----

async fn get_task(
    State(server): State<AgentServer>,
    Path((agent, task_id)): Path<(String, String)>,
    headers: HeaderMap,
) -> A2aResult {
    check_version(&headers)?;
    known_agent(&server, &agent)?;
    match task_id.rsplit_once(':') {
        None => {}
        // (A subscription may be a GET as well as a POST.)
        Some((task_id, "subscribe")) => return subscribe(&server, &agent, task_id).await,
        Some((_, action)) => {
            return Err(A2aError::UnsupportedOperation {
                operation: format!("GET tasks/{{id}}:{action}"),
                reason: "`:cancel` is POSTed".to_owned(),
            }
            .into());
        }
    }
    let at = task::locate(&server, &agent, &task_id).await?;
    ok(&task::load(&server, &at).await?)
}

/// `POST /tasks/{id}:cancel` and `POST /tasks/{id}:subscribe` (the action follows the id).
async fn task_action(
    State(server): State<AgentServer>,
    Path((agent, target)): Path<(String, String)>,
    headers: HeaderMap,
) -> A2aResult {
    check_version(&headers)?;
    known_agent(&server, &agent)?;
    match target.rsplit_once(':') {
        Some((task_id, "cancel")) => cancel(&server, &agent, task_id).await,
        Some((task_id, "subscribe")) => subscribe(&server, &agent, task_id).await,
        _ => Err(A2aError::MethodNotFound {
            what: format!("no task action `{target}` (POST tasks/{{id}}:cancel or :subscribe)"),
        }
        .into()),
    }
}

async fn cancel(server: &AgentServer, agent: &str, task_id: &str) -> A2aResult {
    let at = task::locate(server, agent, task_id).await?;
    let not_cancelable = |reason: String| A2aError::TaskNotCancelable {
        task_id: task_id.to_owned(),
        reason,
    };
    match at.record.status {
        RunStatus::Running => {}
        RunStatus::Waiting => {
            return Err(not_cancelable(
                "it waits for a decision: deny its calls with a message on the task".to_owned(),
            )
            .into());
        }
        RunStatus::Done => {
            let task = task::load(server, &at).await?;
            return Err(not_cancelable(format!("it is {}", task.status.state.as_str())).into());
        }
    }
    if let Some(live) = server.shared.live.get(&at.thread)
        && live.cancel()
    {
        // (The outcome is read back from the store; a run still ending is answered as it is.)
        let _ = tokio::time::timeout(server.shared.config.cancel_wait, live.ended()).await;
        let at = task::refresh(server, &at).await?;
        return ok(&task::load(server, &at).await?);
    }
    if let Some(front) = &server.shared.front
        && crate::fleet::front::cancel_job(server, front, &at.thread)
            .await
            .map_err(store_error)?
            .is_some()
    {
        let at = task::refresh(server, &at).await?;
        return ok(&task::load(server, &at).await?);
    }
    Err(A2aError::Refused {
        status: 409,
        code: "thread_busy".to_owned(),
        detail: format!("task `{task_id}` runs in another process"),
    }
    .into())
}

async fn subscribe(server: &AgentServer, agent: &str, task_id: &str) -> A2aResult {
    let at = task::locate(server, agent, task_id).await?;
    match live_task(server, &at) {
        Some(live) => stream_live(server, at, live).await,
        None => {
            let task = task::load(server, &at).await?;
            Err(A2aError::UnsupportedOperation {
                operation: "tasks/{id}:subscribe".to_owned(),
                reason: format!(
                    "task `{task_id}` is {}: nothing streams (GET tasks/{task_id} shows it)",
                    task.status.state.as_str()
                ),
            }
            .into())
        }
    }
}

/// The stream answering a message sent again: its task's live run from where it is, or the
/// task as it stands, alone.
async fn follow(server: &AgentServer, at: task::Located) -> A2aResult {
    if let Some(live) = live_task(server, &at) {
        return stream_live(server, at, live).await;
    }
    let task = task::load(server, &at).await?;
    let frame =
        serde_json::to_value(StreamResponse::Task(task)).map_err(|e| A2aError::Internal {
            detail: format!("a task that does not serialize: {e}"),
        })?;
    Ok(([(header::CONTENT_TYPE, "text/event-stream")], data(&frame)).into_response())
}

/// The live run of a located task, while it runs.
fn live_task(
    server: &AgentServer,
    at: &task::Located,
) -> Option<std::sync::Arc<crate::live::LiveRun>> {
    server
        .shared
        .live
        .get(&at.thread)
        .filter(|l| !l.is_ended() && at.record.status == RunStatus::Running)
}

/// A running task's stream from where its run is.
async fn stream_live(
    server: &AgentServer,
    at: task::Located,
    live: std::sync::Arc<crate::live::LiveRun>,
) -> A2aResult {
    let encoder = A2aEncoder::new(
        at.thread.as_str(),
        at.record.run_id.as_str(),
        TaskState::Working,
        Vec::new(),
    );
    encoded_stream(
        server.stream_context(),
        at.thread,
        Some(live),
        None,
        encoder,
    )
    .await
    .map_err(store_error)
}

/// The most tasks one page lists.
const MAX_PAGE_SIZE: u32 = 100;
/// The page size when the client gives none.
const DEFAULT_PAGE_SIZE: u32 = 50;

async fn list(
    State(server): State<AgentServer>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    query: Result<Query<ListTasksRequest>, QueryRejection>,
) -> A2aResult {
    check_version(&headers)?;
    known_agent(&server, &agent)?;
    let Query(request) = query.map_err(|e| A2aError::InvalidParams {
        field: "query".to_owned(),
        detail: e.body_text(),
    })?;
    let page_size = match request.page_size {
        None | Some(0) => DEFAULT_PAGE_SIZE,
        Some(n) => n.min(MAX_PAGE_SIZE),
    };
    let offset: usize = match request.page_token.as_deref().filter(|t| !t.is_empty()) {
        None => 0,
        Some(t) => t.parse().map_err(|_| A2aError::InvalidParams {
            field: "pageToken".to_owned(),
            detail: format!("`{t}` is not a page token of this server"),
        })?,
    };
    let store = server.shared.runtime.store();
    let threads: Vec<ThreadId> = match request.context_id.as_deref().filter(|c| !c.is_empty()) {
        Some(c) => vec![ThreadId::new(c).map_err(|e| A2aError::InvalidParams {
            field: "contextId".to_owned(),
            detail: format!("invalid context id: {e}"),
        })?],
        None => store
            .list_threads()
            .await
            .map_err(store_error)?
            .into_iter()
            .map(|t| t.thread_id)
            .collect(),
    };
    let mut tasks = Vec::new();
    for thread in threads {
        let runs = store.list_runs(&thread).await.map_err(store_error)?;
        if !runs.iter().any(|r| *r.agent_id == *agent) {
            continue;
        }
        let events = store.load_events(&thread, 0).await.map_err(store_error)?;
        let mut summaries = task::summaries(&events);
        for record in runs.into_iter().filter(|r| *r.agent_id == *agent) {
            let summary = summaries.remove(&record.run_id).unwrap_or_default();
            let mut task = task::task_of(&thread, &record, &summary, None);
            if request.status.is_some_and(|s| s != task.status.state) {
                continue;
            }
            if request.include_artifacts != Some(true) {
                task.artifacts.clear();
            }
            tasks.push((record.updated_at, task));
        }
    }
    // The most recently updated first.
    tasks.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
    let total = tasks.len();
    let page: Vec<Task> = tasks
        .into_iter()
        .skip(offset)
        .take(page_size as usize)
        .map(|(_, t)| t)
        .collect();
    let next = offset + page.len();
    ok(&ListTasksResponse {
        tasks: page,
        next_page_token: if next < total {
            next.to_string()
        } else {
            String::new()
        },
        page_size,
        total_size: u32::try_from(total).unwrap_or(u32::MAX),
    })
}
