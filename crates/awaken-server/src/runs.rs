//! Starting and resuming runs, shared by the native routes and the protocol edges: request
//! parsing, decisions checked against the waiting calls, and `launch`, which drives a run on its
//! own task and answers natively, with its outcome, or through an encoder.

use std::sync::Arc;
use std::task::Poll;

use awaken_event::{ResumeDecision, ThreadId, ToolCallResume};
use awaken_runtime::{DecisionError, Resume, RunOutcome};
use awaken_store::{Checkpoint, RunStatus};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::app::AgentServer;
use crate::error::ApiError;
pub(crate) use crate::error::store_failed;
pub(crate) use crate::job::Job;
use crate::live::{LiveRun, LiveSink};
use crate::sse::{Encoder, encoded_stream, event_stream};

type ApiResult<T = Response> = Result<T, ApiError>;

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

/// The thread as stored, or 404.
pub(crate) async fn stored_thread(
    server: &AgentServer,
    thread: &ThreadId,
) -> ApiResult<Checkpoint> {
    server
        .shared
        .runtime
        .store()
        .load_checkpoint(thread)
        .await
        .map_err(store_failed)?
        .ok_or_else(|| ApiError::not_found("unknown_thread", format!("no thread `{thread}`")))
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
    let stored = stored_thread(server, thread).await?;
    let tickets = runtime
        .waiting_calls(thread)
        .await
        .map_err(ApiError::from)?;
    // A call suspended while other calls of its step still run waits only once its run ends.
    if tickets.is_empty()
        && stored
            .run
            .as_ref()
            .is_some_and(|r| r.status == RunStatus::Running)
    {
        return Err(ApiError::conflict(
            "thread_busy",
            format!(
                "thread `{thread}`'s run is still in flight: decide its suspended calls once it has ended (its `run_finish`)"
            ),
        ));
    }
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
            // Refused here as the runtime would refuse it: a queued resume is checked by its
            // worker only once claimed, too late to answer the request with why.
            if digest != ticket.call.argument_digest {
                let refused = DecisionError::ArgumentsDiffer {
                    call_id: ticket.call.call_id.clone(),
                    expected: ticket.call.argument_digest.clone(),
                    given: digest,
                };
                return Err(ApiError::bad_field(
                    "invalid_decision",
                    "decisions",
                    refused.to_string(),
                ));
            }
            decision.argument_digest = digest;
        }
        if let Some(payload) = d.payload {
            decision = decision.with_payload(payload);
        }
        resume = resume.with_decision(decision);
    }
    Ok(resume)
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
    let live = start(server, thread, cancel, job).await?;
    let shared = &server.shared;
    match answer {
        Answer::Outcome => tokio::select! {
            ended = live.ended() => ended.map(|v| Json(v).into_response()),
            () = shared.closing.cancelled() => Err(shutting_down(server, thread)),
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

/// 503: the server shuts down while a client waits on `thread`'s run.
pub(crate) fn shutting_down(server: &AgentServer, thread: &ThreadId) -> ApiError {
    ApiError::unavailable(
        "shutting_down",
        format!(
            "the server is shutting down; the run goes on from its last checkpoint when it starts again (GET /v1/threads/{thread} shows it)"
        ),
        server.shared.config.retry_after,
    )
}

/// 409: the thread has a run in flight here.
fn busy(thread: &ThreadId) -> ApiError {
    ApiError::conflict(
        "thread_busy",
        format!("thread `{thread}` has a run in flight in this server"),
    )
}

/// Waits until `closing` (a run that sent its `run_finish`, or one cancelled to supersede it)
/// has ended: busy if it has not by `deadline`, 503 if the server shuts down meanwhile.
async fn finished(
    server: &AgentServer,
    thread: &ThreadId,
    closing: &LiveRun,
    deadline: tokio::time::Instant,
) -> ApiResult<()> {
    tokio::select! {
        _ = closing.ended() => Ok(()),
        () = tokio::time::sleep_until(deadline) => Err(busy(thread)),
        () = server.shared.closing.cancelled() => Err(shutting_down(server, thread)),
    }
}

/// Cancels `running`, the thread's run a start asks to supersede, and waits until it ended
/// with its checkpoint: busy if it has not within the cancel's wait (the cancel stands), 503
/// if the server shuts down meanwhile.
async fn superseded(server: &AgentServer, thread: &ThreadId, running: &LiveRun) -> ApiResult<()> {
    running.cancel();
    let deadline = tokio::time::Instant::now() + server.shared.config.cancel_wait;
    finished(server, thread, running, deadline).await
}

/// Starts `job` on its own task (it goes on whatever its client does) and returns its live run
/// once it emitted its first event; a run that could not start answers with why.
pub(crate) async fn start(
    server: &AgentServer,
    thread: &ThreadId,
    cancel: awaken_event::CancellationToken,
    job: Job,
) -> ApiResult<Arc<LiveRun>> {
    let shared = &server.shared;
    if shared.closing.is_cancelled() {
        return Err(ApiError::unavailable(
            "shutting_down",
            "the server is shutting down",
            shared.config.retry_after,
        ));
    }
    // A run that sent its `run_finish` has only its lifecycle hook and its lease's release
    // left: a client starting the next run at once waits for it to close (before taking a
    // place among the runs in flight, which that run still holds).
    let deadline = tokio::time::Instant::now() + crate::live::FINISHING_WAIT;
    let supersede = matches!(&job, Job::Run(activation) if activation.supersede);
    match shared.live.get(thread) {
        Some(closing) if closing.is_finishing() => {
            finished(server, thread, &closing, deadline).await?;
        }
        // A run superseded ends first, for the same reason: its place among the runs in
        // flight is the new one's.
        Some(running) if supersede && !running.is_ended() => {
            superseded(server, thread, &running).await?;
        }
        // Busy before full: a thread's run in flight answers the same however loaded the
        // server is.
        Some(running) if !running.is_ended() => return Err(busy(thread)),
        _ => {}
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
    // The inbox of a run this server drives (a fleet front end's follower has none).
    let steering = match (&job, &shared.front) {
        (_, Some(_)) => None,
        (Job::Run(activation), None) => Some(activation.steering()),
        (Job::Resume(resume), None) => Some(resume.steering()),
    };
    let live = loop {
        match shared
            .live
            .begin(thread, Some(cancel.clone()), steering.as_ref())
        {
            Ok(live) => break live,
            Err(closing) if closing.is_finishing() => {
                finished(server, thread, &closing, deadline).await?;
            }
            Err(running) if supersede => superseded(server, thread, &running).await?,
            Err(_) => return Err(busy(thread)),
        }
    };
    if let Some(front) = &shared.front {
        // On a task of its own: a client going away while the job is queued drops only the
        // wait for it, and the live run still ends or gets its follower.
        let (owner, front, queued) = (server.clone(), Arc::clone(front), Arc::clone(&live));
        let enqueued = tokio::spawn(async move {
            let enqueued =
                crate::fleet::front::enqueue(&owner, &front, &queued, permit, cancel, job).await;
            if let Err(e) = &enqueued {
                queued.end(Err(e.clone()));
                owner.shared.live.remove(&queued);
            }
            enqueued
        });
        match enqueued.await {
            Ok(enqueued) => enqueued?,
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            // The runtime is shutting down.
            Err(_) => return Err(shutting_down(server, thread)),
        }
    } else {
        // The run's first steps run here, up to where it first waits, so its first events are
        // buffered before the answer starts (no trip through the scheduler); the rest runs on
        // its own task. Nothing awaits between the two, so a client going away cannot drop the
        // run.
        let mut run = Box::pin(drive(server.clone(), Arc::clone(&live), permit, job));
        if std::future::poll_fn(|cx| Poll::Ready(run.as_mut().poll(cx).is_pending())).await {
            live.set_task(tokio::spawn(run));
        }
    }
    tokio::select! {
        started = live.started() => if let Some(Err(e)) = started {
            return Err(e);
        },
        () = shared.closing.cancelled() => return Err(shutting_down(server, thread)),
    }
    Ok(live)
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
