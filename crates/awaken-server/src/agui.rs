//! The AG-UI edge: `POST /v1/ag-ui/agents/{agent}/run` takes an AG-UI 1.0 `RunAgentInput` and
//! answers with the run's events as AG-UI events over Server-Sent Events.
//!
//! The thread is the input's `threadId`. Without `resume` entries, the text of the last `user`
//! message of `messages` starts a new run (the thread's history is the server's, so the other
//! messages are not read). With `resume` entries, each answers the interrupt of one waiting
//! tool call (its id is the call's): `resolved` approves it, `cancelled` denies it, and a
//! `resolved` payload `{"approved": false}` denies it too; the payload goes with the decision.
//! The resumed stream opens with a `MESSAGES_SNAPSHOT` of the thread. `state`, `context`,
//! `tools` and `forwardedProps` are read for their shape and otherwise not used: the thread's
//! state and the agent's instructions and tools are the server's (docs/frontends.md says why).

mod translate;

#[cfg(test)]
mod tests;

use awaken_event::{ResumeDecision, ThreadId};
use awaken_runtime::RunActivation;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use serde_json::{Map, Value};

use crate::app::AgentServer;
use crate::error::ApiError;
use crate::runs::{Answer, Decision, Job, json_body, launch, resume_of};

pub(crate) use translate::{AguiEncoder, RunContext};

type ApiResult<T = Response> = Result<T, ApiError>;

/// The AG-UI routes, nested under `/v1`.
pub(crate) fn routes() -> Router<AgentServer> {
    Router::new().route("/ag-ui/agents/{agent}/run", post(run))
}

async fn run(
    State(server): State<AgentServer>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    accepts_event_stream(&headers)?;
    let registries = server.shared.runtime.resolver().registries();
    if registries.agent(&agent).is_none() {
        return Err(ApiError::not_found(
            "unknown_agent",
            format!(
                "no agent `{agent}` (this server has: {})",
                registries.agent_ids().join(", ")
            ),
        ));
    }
    let input = RunInput::parse(json_body(body)?)?;
    let thread = ThreadId::new(&input.thread_id).map_err(|e| {
        ApiError::bad_field(
            "invalid_thread_id",
            "threadId",
            format!("invalid thread id: {e}"),
        )
    })?;
    let mut ctx = RunContext {
        thread_id: input.thread_id.clone(),
        run_id: input.run_id.clone(),
        parent_run_id: input.parent_run_id.clone(),
        ..RunContext::default()
    };
    if input.resume.is_empty() {
        let Some(text) = input.user_text else {
            return Err(ApiError::bad_field(
                "no_user_message",
                "messages",
                "`messages` has no `user` message with text to run, and there is no `resume`",
            ));
        };
        let activation = RunActivation::new(thread.clone(), agent).with_user_message(text);
        let cancel = activation.cancel.clone();
        let encoder = Box::new(AguiEncoder::new(ctx));
        return launch(
            &server,
            &thread,
            cancel,
            Job::Run(activation),
            Answer::Encoded(encoder),
        )
        .await;
    }
    let decided: Vec<String> = input.resume.iter().map(|d| d.call_id.clone()).collect();
    // (The checks name the native API's `decisions`; here they are the input's `resume`.)
    let resume = resume_of(&server, &thread, input.resume)
        .await
        .map_err(|mut e| {
            if e.field == Some("decisions") {
                e.field = Some("resume");
            }
            e
        })?;
    let runtime = &server.shared.runtime;
    let waiting = runtime
        .waiting_calls(&thread)
        .await
        .map_err(ApiError::from)?;
    let checkpoint = runtime
        .store()
        .load_checkpoint(&thread)
        .await
        .map_err(|e| ApiError::internal("store_failed", format!("the thread store failed: {e}")))?;
    if let Some(run) = checkpoint.as_ref().and_then(|c| c.run.as_ref())
        && *run.agent_id != *agent
    {
        return Err(ApiError::conflict(
            "other_agent",
            format!(
                "thread `{thread}` waits in a run of agent `{}`, not `{agent}`",
                run.agent_id
            ),
        ));
    }
    let waiting_ids: Vec<String> = waiting.iter().map(|t| t.call.call_id.to_string()).collect();
    ctx.snapshot = checkpoint
        .map(|c| translate::messages_snapshot(&input.thread_id, &c.messages, &waiting_ids));
    ctx.announced = waiting_ids;
    ctx.waiting = waiting
        .into_iter()
        .filter(|t| !decided.iter().any(|d| d == t.call.call_id.as_str()))
        .collect();
    let cancel = resume.cancel.clone();
    let encoder = Box::new(AguiEncoder::new(ctx));
    launch(
        &server,
        &thread,
        cancel,
        Job::Resume(resume),
        Answer::Encoded(encoder),
    )
    .await
}

/// 406 unless the request accepts `text/event-stream` (an absent `Accept` accepts it).
fn accepts_event_stream(headers: &HeaderMap) -> ApiResult<()> {
    let mut accepts = headers.get_all(header::ACCEPT).iter().peekable();
    if accepts.peek().is_none() {
        return Ok(());
    }
    let ok = accepts
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|range| range.split(';').next().unwrap_or("").trim())
        .any(|range| {
            range.eq_ignore_ascii_case("text/event-stream")
                || range == "*/*"
                || range.eq_ignore_ascii_case("text/*")
        });
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            "not_acceptable",
            "this route answers with `text/event-stream` only",
        ))
    }
}

/// What the server reads of a `RunAgentInput`.
#[derive(Debug)]
struct RunInput {
    thread_id: String,
    run_id: String,
    parent_run_id: Option<String>,
    /// The text of the last `user` message.
    user_text: Option<String>,
    /// The resume entries as decisions.
    resume: Vec<Decision>,
}

impl RunInput {
    /// Reads and checks the input, naming the field at fault.
    fn parse(body: Value) -> ApiResult<Self> {
        let Value::Object(input) = body else {
            return Err(ApiError::bad_field(
                "invalid_body",
                "body",
                "the body is not a JSON object (an AG-UI RunAgentInput)",
            ));
        };
        let thread_id = required_string(&input, "threadId")?;
        let run_id = required_string(&input, "runId")?;
        let parent_run_id = optional_string(&input, "parentRunId")?;
        let messages = match input.get("messages") {
            Some(Value::Array(m)) => m,
            Some(_) => return Err(wrong_type("messages", "an array of messages")),
            None => return Err(missing("messages")),
        };
        let user_text = user_text(messages)?;
        for (field, what) in [("tools", "tool"), ("context", "context entry")] {
            if let Some(list) = input.get(field).filter(|v| !v.is_null()) {
                let Some(list) = list.as_array() else {
                    return Err(wrong_type(field, "an array"));
                };
                if let Some(at) = list.iter().position(|e| !e.is_object()) {
                    return Err(ApiError::bad_field(
                        "invalid_field",
                        field,
                        format!("`{field}[{at}]` is not a {what} object"),
                    ));
                }
            }
        }
        let resume = match input.get("resume") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(entries)) => entries
                .iter()
                .enumerate()
                .map(|(at, e)| decision(at, e))
                .collect::<ApiResult<_>>()?,
            Some(_) => return Err(wrong_type("resume", "an array of resume entries")),
        };
        Ok(Self {
            thread_id,
            run_id,
            parent_run_id,
            user_text,
            resume,
        })
    }
}

fn missing(field: &'static str) -> ApiError {
    ApiError::bad_field(
        "missing_field",
        field,
        format!("the input has no `{field}`"),
    )
}

fn wrong_type(field: &'static str, what: &str) -> ApiError {
    ApiError::bad_field("invalid_field", field, format!("`{field}` must be {what}"))
}

fn required_string(input: &Map<String, Value>, field: &'static str) -> ApiResult<String> {
    optional_string(input, field)?.ok_or_else(|| missing(field))
}

fn optional_string(input: &Map<String, Value>, field: &'static str) -> ApiResult<Option<String>> {
    match input.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(wrong_type(field, "a non-empty string")),
    }
}

/// The text of the last `user` message: its string content, or its text parts concatenated
/// (other parts are left out). `None` when there is no user message or its text is blank.
fn user_text(messages: &[Value]) -> ApiResult<Option<String>> {
    for (at, m) in messages.iter().enumerate() {
        if !m.get("role").is_some_and(Value::is_string) {
            return Err(ApiError::bad_field(
                "invalid_message",
                "messages",
                format!("`messages[{at}]` is not a message object with a string `role`"),
            ));
        }
    }
    let Some((at, last)) = messages
        .iter()
        .enumerate()
        .rev()
        .find(|(_, m)| m["role"] == "user")
    else {
        return Ok(None);
    };
    let text = match last.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (p, part) in parts.iter().enumerate() {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => match part.get("text") {
                        Some(Value::String(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::bad_field(
                                "invalid_message",
                                "messages",
                                format!(
                                    "`messages[{at}].content[{p}]` is a text part without a string `text`"
                                ),
                            ));
                        }
                    },
                    Some(_) => {}
                    None => {
                        return Err(ApiError::bad_field(
                            "invalid_message",
                            "messages",
                            format!("`messages[{at}].content[{p}]` has no string `type`"),
                        ));
                    }
                }
            }
            text
        }
        _ => {
            return Err(ApiError::bad_field(
                "invalid_message",
                "messages",
                format!("`messages[{at}].content` must be a string or an array of content parts"),
            ));
        }
    };
    Ok((!text.trim().is_empty()).then_some(text))
}

/// A resume entry as a decision on the waiting call it names.
fn decision(at: usize, entry: &Value) -> ApiResult<Decision> {
    let bad = |what: &str| {
        ApiError::bad_field("invalid_resume", "resume", format!("`resume[{at}]` {what}"))
    };
    let Some(call_id) = entry.get("interruptId").and_then(Value::as_str) else {
        return Err(bad("has no string `interruptId`"));
    };
    let payload = entry.get("payload").filter(|p| !p.is_null()).cloned();
    let decision = match entry.get("status").and_then(Value::as_str) {
        Some("cancelled") => ResumeDecision::Deny,
        Some("resolved")
            if payload
                .as_ref()
                .and_then(|p| p.get("approved"))
                .is_some_and(|a| a == false) =>
        {
            ResumeDecision::Deny
        }
        Some("resolved") => ResumeDecision::Approve,
        _ => return Err(bad("has no `status` of `resolved` or `cancelled`")),
    };
    let argument_digest = entry
        .get("metadata")
        .and_then(|m| m.get("argumentDigest"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(Decision {
        call_id: call_id.to_owned(),
        decision,
        argument_digest,
        payload,
    })
}
