//! The HTTP API: `/healthz`, `/readyz`, the `/v1` routes and the A2A routes, with the layers
//! every request passes (authentication, header and body limits, CORS, compression, request
//! tracing).

use std::sync::atomic::Ordering;

use awaken_event::Message;
use awaken_runtime::{RunActivation, Steering};
use awaken_spec::InferenceOverride;
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
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tower_http::compression::CompressionLayer;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};
use tower_http::trace::TraceLayer;

use crate::app::AgentServer;
use crate::error::ApiError;
use crate::fleet::front::JobCancel;
use crate::live::EventId;
use crate::runs::{
    Answer, Decision, Job, json_body, launch, pick_agent, resume_of, store_failed, stored_thread,
    thread_id,
};
use crate::sse::event_stream;

type ApiResult<T = Response> = Result<T, ApiError>;

impl AgentServer {
    /// The router: `/healthz`, `/readyz`, the `/v1` API and the A2A binding (`/a2a/{agent}`,
    /// the host's agent card), with the configured limits, authentication, CORS, compression
    /// and request tracing.
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
        .route("/threads/{thread}/messages", post(steer))
        .merge(crate::agui::routes())
        .merge(crate::ai_sdk::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(server.clone(), authenticate));
    let a2a = crate::a2a::routes().layer(middleware::from_fn_with_state(
        server.clone(),
        authenticate_a2a,
    ));
    let mut app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .nest("/v1", v1)
        .merge(a2a);
    if config.chat_page {
        app = app.merge(crate::page::routes());
    }
    let mut app = app
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
                    "a2a-version".parse().unwrap_or(header::ACCEPT),
                ]),
        );
    }
    app.layer(TraceLayer::new_for_http()).with_state(server)
}

// ---- layers ----

/// Refuses a `/v1` request without the configured bearer token (compared in constant time).
async fn authenticate(State(server): State<AgentServer>, request: Request, next: Next) -> Response {
    if !authorized(&server, request.headers()) {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this server needs `Authorization: Bearer <token>`",
        )
        .into_response();
    }
    next.run(request).await
}

/// [`authenticate`] for the A2A routes, refusing with the A2A binding's error body.
async fn authenticate_a2a(
    State(server): State<AgentServer>,
    request: Request,
    next: Next,
) -> Response {
    if !authorized(&server, request.headers()) {
        return crate::a2a::unauthorized();
    }
    next.run(request).await
}

/// Whether the request carries the configured bearer token (any request does when none is
/// configured).
fn authorized(server: &AgentServer, headers: &HeaderMap) -> bool {
    let Some(token) = &server.shared.config.auth_token else {
        return true;
    };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .is_some_and(|(_, given)| same_token(given.trim_start_matches(' '), token))
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
    let live = server.shared.live.get(&thread).filter(|r| !r.is_ended());
    // Messages sent to the run in flight that no step has taken yet (in the fleet's queue, for
    // a front end).
    let steering_waiting = match &server.shared.front {
        Some(front) => front
            .queue
            .steering_waiting(&thread)
            .await
            .map_err(store_failed)?,
        None => live
            .as_ref()
            .and_then(|r| r.steering().map(Steering::waiting))
            .unwrap_or(0) as u64,
    };
    Ok(Json(json!({
        "thread_id": thread,
        "messages": checkpoint.messages,
        "runs": runs,
        "state": checkpoint.thread_state,
        "waiting": waiting,
        "last_event_seq": checkpoint.last_event_seq,
        "live": live.is_some(),
        "messages_waiting": steering_waiting,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    after: Option<String>,
}

/// The position a client asks for: `Last-Event-ID`, else `?after=` (a browser's `EventSource`
/// opened with `?after=` reconnects to the same URL with the header, its latest position).
fn position(after: Option<&str>, headers: &HeaderMap) -> ApiResult<Option<EventId>> {
    let after = after
        .map(|a| {
            EventId::parse(a).ok_or_else(|| {
                ApiError::bad_field(
                    "invalid_event_id",
                    "after",
                    format!("`{a}` is not an event id (SEQ or SEQ.N)"),
                )
            })
        })
        .transpose()?;
    let last = headers
        .get("last-event-id")
        .map(|v| {
            v.to_str().ok().and_then(EventId::parse).ok_or_else(|| {
                ApiError::bad_field(
                    "invalid_event_id",
                    "Last-Event-ID",
                    "the Last-Event-ID header is not an event id (SEQ or SEQ.N)",
                )
            })
        })
        .transpose()?;
    Ok(last.or(after))
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
    let live = crate::fleet::live_or_follow(&server, &thread, after.seq).await?;
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
    /// Start anyway: a waiting thread's suspended calls are closed as cancelled, a run in
    /// flight is cancelled at its checkpoint first.
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
        inference
            .validate("inference")
            .map_err(|e| ApiError::bad_field("invalid_inference", "inference", e.to_string()))?;
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
    launch(
        &server,
        &thread,
        cancel,
        Job::Run(activation),
        answer(stream),
    )
    .await
}

/// The native answer: the event stream, or the outcome when the run ends.
fn answer(stream: bool) -> Answer {
    if stream {
        Answer::Native
    } else {
        Answer::Outcome
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecisionsBody {
    decisions: Vec<Decision>,
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
    launch(
        &server,
        &thread,
        cancel,
        Job::Resume(resume),
        answer(stream),
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SteerBody {
    /// The user's message for the run in flight.
    message: String,
}

/// Steers the thread's run in flight here: the message is committed at the run's next step,
/// before the inference that sees it, and the answer says which step took it; 409 when no
/// run here can take it.
async fn steer(
    State(server): State<AgentServer>,
    Path(raw): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let thread = thread_id(&raw)?;
    let request: SteerBody = json_body(body)?;
    if request.message.trim().is_empty() {
        return Err(ApiError::bad_field(
            "empty_message",
            "message",
            "the message is empty",
        ));
    }
    let not_taken = || {
        ApiError::conflict(
            "not_taken",
            format!(
                "thread `{thread}`'s run ended (finished, waiting for a decision, cancelled or stopped) before a step took the message"
            ),
        )
    };
    // A front end of the fleet: the message goes through the queue to the run's worker.
    if let Some(front) = &server.shared.front {
        let message = Message::user(request.message);
        return match crate::fleet::front::steer(&server, front, &thread, message).await? {
            Some(step) => Ok(Json(json!({"taken": true, "step": step})).into_response()),
            None => Err(not_taken()),
        };
    }
    // Every run this server drives (started, resumed or recovered here) has an inbox.
    let Some((live, steering)) = server
        .shared
        .live
        .get(&thread)
        .filter(|r| !r.is_ended())
        .and_then(|r| Some((r.clone(), r.steering()?.clone())))
    else {
        stored_thread(&server, &thread).await?;
        return Err(ApiError::conflict(
            "not_running",
            format!("thread `{thread}` has no run in flight here: start a run with the message"),
        ));
    };
    let sent = steering.send(Message::user(request.message));
    tokio::select! {
        // First: a message taken as its run ends is answered as taken.
        biased;
        taken = sent => match taken {
            Ok(taken) => Ok(Json(json!({"taken": true, "step": taken.step})).into_response()),
            Err(_) => Err(not_taken()),
        },
        // A run stopped without closing its inbox (its task dropped at a shutdown).
        _ = live.ended() => Err(not_taken()),
        () = server.shared.closing.cancelled() => Err(ApiError::unavailable(
            "shutting_down",
            "the server is shutting down: the run may still take the message at its next step before it stops (the thread's messages show whether it did)",
            server.shared.config.retry_after,
        )),
    }
}

/// 202: the cancel stands, and the run has not ended yet (or ends elsewhere).
fn cancel_pending() -> Response {
    (
        StatusCode::ACCEPTED,
        Json(json!({"cancelled": true, "outcome": null})),
    )
        .into_response()
}

async fn cancel(State(server): State<AgentServer>, Path(raw): Path<String>) -> ApiResult {
    let thread = thread_id(&raw)?;
    if let Some(live) = server.shared.live.get(&thread)
        && live.cancel()
    {
        let wait = server.shared.config.cancel_wait;
        return Ok(match tokio::time::timeout(wait, live.ended()).await {
            Ok(outcome) => {
                let outcome = outcome?;
                // A run that ended on its own as the cancel came says so.
                let cancelled = outcome["termination"]["kind"] == "cancelled";
                Json(json!({"cancelled": cancelled, "outcome": outcome})).into_response()
            }
            Err(_) => cancel_pending(),
        });
    }
    // A queued or claimed job this front end does not follow: one no worker has claimed ends
    // here at once; the queue tells the worker of any other.
    if let Some(front) = &server.shared.front {
        match crate::fleet::front::cancel_job(&server, front, &thread)
            .await
            .map_err(store_failed)?
        {
            Some(JobCancel::Ended(run_id)) => {
                let record = server
                    .shared
                    .runtime
                    .store()
                    .load_run(&thread, &run_id)
                    .await
                    .ok()
                    .flatten();
                let outcome = record.map(|r| {
                    json!({
                        "run_id": r.run_id,
                        "termination": r.termination,
                        "response": null,
                        "steps": r.steps,
                        "usage": r.usage,
                    })
                });
                return Ok(Json(json!({"cancelled": true, "outcome": outcome})).into_response());
            }
            Some(JobCancel::Asked) => return Ok(cancel_pending()),
            None => {}
        }
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
