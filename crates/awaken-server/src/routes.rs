//! The HTTP API: `/healthz`, `/readyz` and the `/v1` routes, with the layers every request
//! passes (authentication, header and body limits, CORS, compression, request tracing).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Poll;

use awaken_event::{ResumeDecision, ThreadId, ToolCallResume};
use awaken_runtime::{Resume, RunActivation, RunOutcome};
use awaken_spec::InferenceOverride;
use awaken_store::Checkpoint;
use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tower_http::compression::CompressionLayer;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};
use tower_http::trace::TraceLayer;

use crate::app::AgentServer;
use crate::error::ApiError;
use crate::live::{EventId, LiveRun, LiveSink};
use crate::sse::{Encoder, encoded_stream, event_stream};

type ApiResult<T = Response> = Result<T, ApiError>;

impl AgentServer {
    /// The router: `/healthz`, `/readyz` and the `/v1` API, with the configured limits,
    /// authentication, CORS, compression and request tracing.
    pub fn router(&self) -> Router {
        router(self.clone())
    }
}

fn router(server: AgentServer) -> Router {
    let config = &server.shared.config;
    let v1 = Router::new()
        .route("/agents", get(list_agents))
        .route("/agents/{agent}", get(get_agent))
        .route("/threads", get(list_threads))
        .route("/threads/{thread}", get(get_thread))
        .route("/threads/{thread}/events", get(thread_events))
        .route("/threads/{thread}/runs", post(start_run))
        .route("/threads/{thread}/decisions", post(decide))
        .route("/threads/{thread}/cancel", post(cancel))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(server.clone(), authenticate));
    let mut app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .nest("/v1", v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            server.clone(),
            limit_headers,
        ))
        // (Event streams are never compressed: the default predicate leaves them alone.)
        .layer(CompressionLayer::new());
    if !config.cors_origins.is_empty() {
        let origins = if config.cors_origins.iter().any(|o| o == "*") {
            AllowOrigin::from(Any)
        } else {
            AllowOrigin::list(
                config
                    .cors_origins
                    .iter()
                    .filter_map(|o| o.parse().ok())
                    .collect::<Vec<_>>(),
            )
        };
        app = app.layer(
            CorsLayer::new()
                .allow_origin(origins)
                .allow_methods([Method::GET, Method::POST])
                .allow_headers([
                    header::AUTHORIZATION,
                    header::CONTENT_TYPE,
                    "last-event-id".parse().unwrap_or(header::ACCEPT),
                ]),
        );
    }
    app.layer(TraceLayer::new_for_http()).with_state(server)
}

// ---- layers ----

/// Refuses a `/v1` request without the configured bearer token (compared in constant time).
async fn authenticate(State(server): State<AgentServer>, request: Request, next: Next) -> Response {
    if let Some(token) = &server.shared.config.auth_token {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| same_token(g, token)) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this server needs `Authorization: Bearer <token>`",
            )
            .into_response();
        }
    }
    next.run(request).await
}

/// Whether two tokens are equal, in time that does not depend on where they differ (their
/// digests are compared, so not on their lengths either).
fn same_token(given: &str, expected: &str) -> bool {
    let a = Sha256::digest(given.as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    a.as_slice().ct_eq(b.as_slice()).into()
}

/// Refuses a request whose headers together pass the configured size.
async fn limit_headers(
    State(server): State<AgentServer>,
    request: Request,
    next: Next,
) -> Response {
    let size: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if size > server.shared.config.max_header_bytes {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!(
                "the request's headers take {size} bytes; the limit is {}",
                server.shared.config.max_header_bytes
            ),
        )
        .into_response();
    }
    next.run(request).await
}

async fn not_found() -> ApiError {
    ApiError::not_found("not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}

// ---- health ----

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn readyz(State(server): State<AgentServer>) -> Response {
    if server.shared.closing.is_cancelled() {
        return ApiError::unavailable(
            "shutting_down",
            "the server is shutting down",
            server.shared.config.retry_after,
        )
        .into_response();
    }
    if !server.shared.ready.load(Ordering::Acquire) {
        return ApiError::unavailable(
            "starting",
            "the server is starting: recovery of unfinished runs has not begun",
            server.shared.config.retry_after,
        )
        .into_response();
    }
    Json(json!({"status": "ready"})).into_response()
}

// ---- request parsing ----

/// The thread named in the path, or 400.
pub(crate) fn thread_id(raw: &str) -> ApiResult<ThreadId> {
    ThreadId::new(raw).map_err(|e| {
        ApiError::bad_field(
            "invalid_thread_id",
            "thread",
            format!("invalid thread id: {e}"),
        )
    })
}

/// A JSON body, or 400 (malformed, wrong fields) or 413 (too large).
pub(crate) fn json_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> ApiResult<T> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                "the request body is over the server's limit",
            )
        } else {
            ApiError::bad_field("unreadable_body", "body", e.body_text())
        }
    })?;
    serde_json::from_slice(&body).map_err(|e| {
        if e.is_data() {
            ApiError::bad_field("invalid_body", "body", e.to_string())
        } else {
            ApiError::bad_field(
                "malformed_json",
                "body",
                format!("the body is not JSON: {e}"),
            )
        }
    })
}

/// The store failed: 500, with its message.
fn store_failed(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal("store_failed", format!("the thread store failed: {e}"))
}

// ---- agents ----

async fn list_agents(State(server): State<AgentServer>) -> Json<Value> {
    let registries = server.shared.runtime.resolver().registries();
    let agents: Vec<Value> = registries
        .agent_ids()
        .iter()
        .filter_map(|id| agent_json(&server, id))
        .collect();
    Json(json!({"agents": agents}))
}

async fn get_agent(State(server): State<AgentServer>, Path(id): Path<String>) -> ApiResult {
    agent_json(&server, &id)
        .map(|a| Json(a).into_response())
        .ok_or_else(|| ApiError::not_found("unknown_agent", format!("no agent `{id}`")))
}

/// An agent's id, description, model and tools (as it resolves now).
fn agent_json(server: &AgentServer, id: &str) -> Option<Value> {
    let resolver = server.shared.runtime.resolver();
    let spec = resolver.registries().agent(id)?;
    let mut agent = json!({
        "id": spec.id,
        "description": spec.description,
        "model": spec.model,
    });
    match resolver.resolve(id) {
        Ok(resolved) => {
            agent["tools"] = resolved
                .tools
                .iter()
                .map(|t| {
                    let d = t.tool.descriptor();
                    json!({"id": d.id, "name": d.name, "description": d.description, "effect": d.effect})
                })
                .collect();
        }
        Err(e) => {
            agent["tools"] = json!([]);
            agent["error"] = e.to_string().into();
        }
    }
    Some(agent)
}

// ---- threads ----

async fn list_threads(State(server): State<AgentServer>) -> ApiResult<Json<Value>> {
    let threads = server
        .shared
        .runtime
        .store()
        .list_threads()
        .await
        .map_err(store_failed)?;
    let threads: Vec<Value> = threads
        .iter()
        .map(|t| {
            json!({
                "thread_id": t.thread_id,
                "message_count": t.message_count,
                "latest_run_id": t.latest_run_id,
                "created_at": t.created_at,
                "updated_at": t.updated_at,
                "live": server.shared.live.get(&t.thread_id).is_some_and(|r| !r.is_ended()),
            })
        })
        .collect();
    Ok(Json(json!({"threads": threads})))
}

async fn get_thread(
    State(server): State<AgentServer>,
    Path(raw): Path<String>,
) -> ApiResult<Json<Value>> {
    let thread = thread_id(&raw)?;
    let runtime = &server.shared.runtime;
    let store = runtime.store();
    // The runs first, then the checkpoint, whose latest run record was read with its messages
    // in one transaction and replaces the listed one: a commit between the two reads cannot
    // show new messages beside an old record of the same run.
    let mut runs = store.list_runs(&thread).await.map_err(store_failed)?;
    let checkpoint = stored_thread(&server, &thread).await?;
    if let Some(latest) = &checkpoint.run {
        match runs.iter_mut().find(|r| r.run_id == latest.run_id) {
            Some(listed) => *listed = latest.clone(),
            None => runs.push(latest.clone()),
        }
    }
    let waiting = runtime
        .waiting_calls(&thread)
        .await
        .map_err(ApiError::from)?;
    Ok(Json(json!({
        "thread_id": thread,
        "messages": checkpoint.messages,
        "runs": runs,
        "state": checkpoint.thread_state,
        "waiting": waiting,
        "last_event_seq": checkpoint.last_event_seq,
        "live": server.shared.live.get(&thread).is_some_and(|r| !r.is_ended()),
    })))
}

/// The thread as stored, or 404.
async fn stored_thread(server: &AgentServer, thread: &ThreadId) -> ApiResult<Checkpoint> {
    server
        .shared
        .runtime
        .store()
        .load_checkpoint(thread)
        .await
        .map_err(store_failed)?
        .ok_or_else(|| ApiError::not_found("unknown_thread", format!("no thread `{thread}`")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    after: Option<String>,
}

/// The position a client asks for: `?after=` or else `Last-Event-ID`.
fn position(after: Option<&str>, headers: &HeaderMap) -> ApiResult<Option<EventId>> {
    if let Some(a) = after {
        return EventId::parse(a).map(Some).ok_or_else(|| {
            ApiError::bad_field(
                "invalid_event_id",
                "after",
                format!("`{a}` is not an event id (SEQ or SEQ.N)"),
            )
        });
    }
    match headers.get("last-event-id") {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(EventId::parse)
            .map(Some)
            .ok_or_else(|| {
                ApiError::bad_field(
                    "invalid_event_id",
                    "Last-Event-ID",
                    "the Last-Event-ID header is not an event id (SEQ or SEQ.N)",
                )
            }),
    }
}

async fn thread_events(
    State(server): State<AgentServer>,
    Path(raw): Path<String>,
    query: Result<Query<EventsQuery>, QueryRejection>,
    headers: HeaderMap,
) -> ApiResult {
    let thread = thread_id(&raw)?;
    let Query(query) =
        query.map_err(|e| ApiError::bad_field("invalid_query", "query", e.body_text()))?;
    let after = position(query.after.as_deref(), &headers)?.unwrap_or_default();
    let live = server.shared.live.get(&thread);
    if live.is_none() {
        stored_thread(&server, &thread).await?;
    }
    event_stream(server.stream_context(), thread, live, Some(after))
        .await
        .map_err(store_failed)
}

// ---- runs ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartRun {
    /// The user's message.
    message: String,
    /// The agent (required when the server has several).
    #[serde(default)]
    agent: Option<String>,
    /// A run-level inference override.
    #[serde(default)]
    inference: Option<InferenceOverride>,
    /// Close a waiting thread's suspended calls as cancelled and start anyway.
    #[serde(default)]
    supersede: bool,
    /// The profile whose profile-scoped state the run sees.
    #[serde(default)]
    profile: Option<String>,
}

/// `?stream=false`: answer the outcome when the run ends instead of its event stream.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamQuery {
    stream: Option<bool>,
}

/// Whether the request asks for the event stream (the default).
fn streams(query: Result<Query<StreamQuery>, QueryRejection>) -> ApiResult<bool> {
    let Query(query) =
        query.map_err(|e| ApiError::bad_field("invalid_query", "stream", e.body_text()))?;
    Ok(query.stream != Some(false))
}

async fn start_run(
    State(server): State<AgentServer>,
    Path(raw): Path<String>,
    query: Result<Query<StreamQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let thread = thread_id(&raw)?;
    let stream = streams(query)?;
    let request: StartRun = json_body(body)?;
    if request.message.trim().is_empty() {
        return Err(ApiError::bad_field(
            "empty_message",
            "message",
            "the message is empty",
        ));
    }
    let agent = pick_agent(&server, request.agent.as_deref())?;
    let mut activation =
        RunActivation::new(thread.clone(), agent).with_user_message(request.message);
    if let Some(inference) = request.inference {
        activation = activation.with_inference(inference);
    }
    if request.supersede {
        activation = activation.with_supersede();
    }
    if let Some(profile) = request.profile {
        let profile = awaken_event::ProfileId::new(&profile).map_err(|e| {
            ApiError::bad_field(
                "invalid_profile",
                "profile",
                format!("invalid profile id: {e}"),
            )
        })?;
        activation = activation.with_profile(profile);
    }
    let cancel = activation.cancel.clone();
    launch(&server, &thread, cancel, Job::Run(activation), answer(stream)).await
}

/// The native answer: the event stream, or the outcome when the run ends.
fn answer(stream: bool) -> Answer {
    if stream { Answer::Native } else { Answer::Outcome }
}

/// The agent a request names, else the configured default, else the server's only agent.
pub(crate) fn pick_agent(server: &AgentServer, named: Option<&str>) -> ApiResult<String> {
    let registries = server.shared.runtime.resolver().registries();
    match named {
        Some(id) if registries.agent(id).is_some() => Ok(id.to_owned()),
        Some(id) => Err(ApiError::bad_field(
            "unknown_agent",
            "agent",
            format!(
                "no agent `{id}` (this server has: {})",
                registries.agent_ids().join(", ")
            ),
        )),
        None if server.shared.config.default_agent.is_some() => Ok(server
            .shared
            .config
            .default_agent
            .clone()
            .unwrap_or_default()),
        None => match registries.agent_ids().as_slice() {
            [only] => Ok(only.clone()),
            ids => Err(ApiError::bad_field(
                "agent_required",
                "agent",
                format!("name the agent: this server has {}", ids.join(", ")),
            )),
        },
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionsBody {
    decisions: Vec<Decision>,
}

/// A decision on a waiting call, as a client gives it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Decision {
    pub(crate) call_id: String,
    pub(crate) decision: ResumeDecision,
    /// The digest of the arguments the decision was made on (from the call's suspension
    /// event); when given, a call whose arguments differ is refused.
    #[serde(default)]
    pub(crate) argument_digest: Option<String>,
    /// An answer, checked against the ticket's response schema.
    #[serde(default)]
    pub(crate) payload: Option<Value>,
}

async fn decide(
    State(server): State<AgentServer>,
    Path(raw): Path<String>,
    query: Result<Query<StreamQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let thread = thread_id(&raw)?;
    let stream = streams(query)?;
    let request: DecisionsBody = json_body(body)?;
    let resume = resume_of(&server, &thread, request.decisions).await?;
    let cancel = resume.cancel.clone();
    launch(&server, &thread, cancel, Job::Resume(resume), answer(stream)).await
}

/// The resume of `thread`'s waiting calls with `decisions`, checked: 400 for none, a duplicate
/// or a call that does not wait; 404 for an unknown thread; 409 when nothing waits.
pub(crate) async fn resume_of(
    server: &AgentServer,
    thread: &ThreadId,
    decisions: Vec<Decision>,
) -> ApiResult<Resume> {
    if decisions.is_empty() {
        return Err(ApiError::bad_field(
            "no_decisions",
            "decisions",
            "give a decision for at least one waiting call",
        ));
    }
    let runtime = &server.shared.runtime;
    stored_thread(server, thread).await?;
    let tickets = runtime
        .waiting_calls(thread)
        .await
        .map_err(ApiError::from)?;
    if tickets.is_empty() {
        return Err(ApiError::conflict(
            "not_waiting",
            format!("thread `{thread}` has no call waiting for a decision"),
        ));
    }
    let waiting = || {
        tickets
            .iter()
            .map(|t| t.call.call_id.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut resume = Resume::new(thread.clone());
    for d in decisions {
        if resume
            .decisions
            .iter()
            .any(|r| r.call_id.as_str() == d.call_id)
        {
            return Err(ApiError::bad_field(
                "duplicate_decision",
                "decisions",
                format!("call {} has two decisions", d.call_id),
            ));
        }
        let Some(ticket) = tickets
            .iter()
            .find(|t| t.call.call_id.as_str() == d.call_id)
        else {
            return Err(ApiError::bad_field(
                "unknown_call",
                "decisions",
                format!(
                    "call {} is not waiting for a decision on thread `{thread}` (waiting: {})",
                    d.call_id,
                    waiting()
                ),
            ));
        };
        let mut decision = match d.decision {
            ResumeDecision::Approve => ToolCallResume::approve(&ticket.call),
            ResumeDecision::Deny => ToolCallResume::deny(&ticket.call),
        };
        if let Some(digest) = d.argument_digest {
            decision.argument_digest = digest;
        }
        if let Some(payload) = d.payload {
            decision = decision.with_payload(payload);
        }
        resume = resume.with_decision(decision);
    }
    Ok(resume)
}

async fn cancel(State(server): State<AgentServer>, Path(raw): Path<String>) -> ApiResult {
    let thread = thread_id(&raw)?;
    if let Some(live) = server.shared.live.get(&thread)
        && live.cancel()
    {
        let wait = server.shared.config.cancel_wait;
        return Ok(match tokio::time::timeout(wait, live.ended()).await {
            Ok(outcome) => Json(json!({"cancelled": true, "outcome": outcome?})).into_response(),
            Err(_) => (
                StatusCode::ACCEPTED,
                Json(json!({"cancelled": true, "outcome": null})),
            )
                .into_response(),
        });
    }
    let checkpoint = stored_thread(&server, &thread).await?;
    let status = checkpoint.run.as_ref().map(|r| r.status.to_string());
    Err(match status.as_deref() {
        Some("waiting") => ApiError::conflict(
            "not_running",
            format!(
                "thread `{thread}` waits for decisions: deny its calls, or start a run with `supersede`"
            ),
        ),
        Some("running") => ApiError::conflict(
            "thread_busy",
            format!("thread `{thread}`'s run is driven by another process"),
        ),
        _ => ApiError::conflict(
            "not_running",
            format!("thread `{thread}` has no run in flight"),
        ),
    })
}

/// What a launched task runs.
pub(crate) enum Job {
    Run(RunActivation),
    Resume(Resume),
}

/// How a launched job is answered.
pub(crate) enum Answer {
    /// The native event stream.
    Native,
    /// The outcome, when the run ends.
    Outcome,
    /// The activation's events (from its start to its end) as this encoder writes them.
    Encoded(Box<dyn Encoder>),
}

/// Starts `job` on its own task (it goes on whatever its client does) and answers as asked; a
/// run that could not start answers with why.
pub(crate) async fn launch(
    server: &AgentServer,
    thread: &ThreadId,
    cancel: awaken_event::CancellationToken,
    job: Job,
    answer: Answer,
) -> ApiResult {
    let shared = &server.shared;
    if shared.closing.is_cancelled() {
        return Err(ApiError::unavailable(
            "shutting_down",
            "the server is shutting down",
            shared.config.retry_after,
        ));
    }
    let permit = shared.admission.clone().try_acquire_owned().map_err(|_| {
        ApiError::unavailable(
            "too_many_runs",
            format!(
                "the server already runs {} runs, its limit",
                shared.config.max_runs_in_flight
            ),
            shared.config.retry_after,
        )
    })?;
    let live = shared.live.begin(thread, Some(cancel)).map_err(|_| {
        ApiError::conflict(
            "thread_busy",
            format!("thread `{thread}` has a run in flight in this server"),
        )
    })?;
    // The run's first steps run here, up to where it first waits, so its first events are
    // buffered before the answer starts (no trip through the scheduler); the rest runs on its
    // own task. Nothing awaits between the two, so a client going away cannot drop the run.
    let mut run = Box::pin(drive(server.clone(), Arc::clone(&live), permit, job));
    if std::future::poll_fn(|cx| Poll::Ready(run.as_mut().poll(cx).is_pending())).await {
        live.set_task(tokio::spawn(run));
    }
    let closing = &shared.closing;
    let shutting_down = || {
        ApiError::unavailable(
            "shutting_down",
            format!(
                "the server is shutting down; the run goes on from its last checkpoint when it starts again (GET /v1/threads/{thread} shows it)"
            ),
            shared.config.retry_after,
        )
    };
    tokio::select! {
        started = live.started() => if let Some(Err(e)) = started {
            return Err(e);
        },
        () = closing.cancelled() => return Err(shutting_down()),
    }
    match answer {
        Answer::Outcome => tokio::select! {
            ended = live.ended() => ended.map(|v| Json(v).into_response()),
            () = closing.cancelled() => Err(shutting_down()),
        },
        Answer::Native => event_stream(server.stream_context(), thread.clone(), Some(live), None)
            .await
            .map_err(store_failed),
        Answer::Encoded(encoder) => encoded_stream(
            server.stream_context(),
            thread.clone(),
            Some(live),
            None,
            encoder,
        )
        .await
        .map_err(store_failed),
    }
}

/// Runs `job` to its end, writing its events to `live`.
async fn drive(
    server: AgentServer,
    live: Arc<LiveRun>,
    permit: tokio::sync::OwnedSemaphorePermit,
    job: Job,
) {
    let sink = LiveSink(Arc::clone(&live));
    let runtime = &server.shared.runtime;
    let result = match job {
        Job::Run(activation) => runtime.run(activation, &sink).await,
        Job::Resume(resume) => runtime.resume(resume, &sink).await,
    };
    drop(permit);
    let failed_unseen = result.is_err() && !live.has_events();
    live.end(result.map(|o| outcome_json(&o)).map_err(ApiError::from));
    if !failed_unseen {
        server.shared.live.linger(&live);
    } else {
        server.shared.live.remove(&live);
    }
}

/// A run's outcome as answered to `?stream=false`.
pub(crate) fn outcome_json(o: &RunOutcome) -> Value {
    json!({
        "run_id": o.run_id,
        "termination": o.termination,
        "response": o.response,
        "steps": o.steps,
        "usage": o.usage,
    })
}
