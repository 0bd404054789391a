//! The Vercel AI SDK edge: `useChat`'s requests (`DefaultChatTransport`) mapped to runs and
//! decisions, and the runs' events written as the AI SDK's UI message stream.
//!
//! - `POST /v1/ai-sdk/chat`: the chat `id` is the thread; a last user message starts a run with
//!   its text; a last assistant message whose tool parts carry approval responses decides the
//!   thread's waiting calls and resumes the run. The answer streams the activation.
//! - `GET /v1/ai-sdk/chat/{id}/stream`: the thread's live activation from its start, or 204
//!   when none is in flight.

mod encoder;

use std::collections::HashSet;

use awaken_event::ResumeDecision;
use awaken_runtime::RunActivation;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::Value;

use crate::app::AgentServer;
use crate::error::ApiError;
use crate::runs::{Answer, Decision, Job, json_body, launch, pick_agent, resume_of, thread_id};
use crate::sse::encoded_stream;

pub(crate) use encoder::UiMessageEncoder;
use encoder::{STREAM_HEADER, STREAM_VERSION};

type ApiResult<T = Response> = Result<T, ApiError>;

/// The AI SDK routes (nested under `/v1`).
pub(crate) fn routes() -> Router<AgentServer> {
    Router::new()
        .route("/ai-sdk/chat", post(chat))
        .route("/ai-sdk/chat/{id}/stream", get(resume_stream))
}

/// The body `DefaultChatTransport` posts (with any fields of the transport's `body` option).
#[derive(Deserialize)]
struct ChatRequest {
    /// The chat's id: the thread.
    id: String,
    /// The chat's UI messages, the new one last.
    #[serde(default)]
    messages: Vec<UiMessage>,
    /// `submit-message` or `regenerate-message`.
    #[serde(default)]
    trigger: Option<String>,
    /// The agent (from the transport's `body` option; required when the server has several).
    #[serde(default)]
    agent: Option<String>,
}

/// A UI message as the client sends it: only what the server reads of it.
#[derive(Deserialize)]
struct UiMessage {
    role: String,
    #[serde(default)]
    parts: Vec<Value>,
}

async fn chat(State(server): State<AgentServer>, body: Result<Bytes, BytesRejection>) -> ApiResult {
    let request: ChatRequest = json_body(body)?;
    let thread = thread_id(&request.id).map_err(|e| ApiError {
        field: Some("id"),
        ..e
    })?;
    match request.trigger.as_deref() {
        None | Some("submit-message") => {}
        Some("regenerate-message") => {
            return Err(ApiError::bad_field(
                "regenerate_unsupported",
                "trigger",
                "regenerating a message is not supported: a thread's history is never rewritten; send a new message instead",
            ));
        }
        Some(other) => {
            return Err(ApiError::bad_field(
                "invalid_trigger",
                "trigger",
                format!("unknown trigger `{other}` (expected submit-message)"),
            ));
        }
    }
    let Some(last) = request.messages.last() else {
        return Err(ApiError::bad_field(
            "no_messages",
            "messages",
            "the request has no message",
        ));
    };
    let (job, cancel, encoder) = match last.role.as_str() {
        "user" => {
            let text = user_text(last);
            if text.trim().is_empty() {
                return Err(ApiError::bad_field(
                    "empty_message",
                    "messages",
                    "the last user message has no text part with text",
                ));
            }
            let agent = pick_agent(&server, request.agent.as_deref())?;
            let activation = RunActivation::new(thread.clone(), agent).with_user_message(text);
            let cancel = activation.cancel.clone();
            (Job::Run(activation), cancel, UiMessageEncoder::new())
        }
        "assistant" => {
            let decisions = approval_responses(last)?;
            if decisions.is_empty() {
                return Err(ApiError::bad_field(
                    "no_approval_responses",
                    "messages",
                    "the last message is an assistant message without tool approval responses (state `approval-responded`)",
                ));
            }
            let resume = resume_of(&server, &thread, decisions).await?;
            let cancel = resume.cancel.clone();
            let known = tool_call_ids(last);
            (
                Job::Resume(resume),
                cancel,
                UiMessageEncoder::continuing(known),
            )
        }
        other => {
            return Err(ApiError::bad_field(
                "invalid_last_message",
                "messages",
                format!(
                    "the last message's role is `{other}`: expected a user message or an assistant message with approval responses"
                ),
            ));
        }
    };
    let response = launch(
        &server,
        &thread,
        cancel,
        job,
        Answer::Encoded(Box::new(encoder)),
    )
    .await?;
    Ok(marked(response))
}

async fn resume_stream(State(server): State<AgentServer>, Path(raw): Path<String>) -> ApiResult {
    let thread = thread_id(&raw)?;
    let Some(live) = server.shared.live.get(&thread).filter(|r| !r.is_ended()) else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let response = encoded_stream(
        server.stream_context(),
        thread,
        Some(live),
        None,
        UiMessageEncoder::new(),
    )
    .await
    .map_err(|e| ApiError::internal("store_failed", format!("the thread store failed: {e}")))?;
    Ok(marked(response))
}

/// Marks `response` as a UI message stream.
fn marked(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(STREAM_HEADER, HeaderValue::from_static(STREAM_VERSION));
    response
}

/// The text of a user message: its text parts, one per line.
fn user_text(message: &UiMessage) -> String {
    message
        .parts
        .iter()
        .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `part` is a tool part (`tool-NAME` or `dynamic-tool`).
fn is_tool_part(part: &Value) -> bool {
    part.get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| t.starts_with("tool-") || t == "dynamic-tool")
}

/// The calls the message's tool parts show.
fn tool_call_ids(message: &UiMessage) -> HashSet<String> {
    message
        .parts
        .iter()
        .filter(|p| is_tool_part(p))
        .filter_map(|p| p.get("toolCallId").and_then(Value::as_str))
        .map(str::to_owned)
        .collect()
}

/// The decisions of the message's tool parts in state `approval-responded`: the approval's id
/// is the waiting call's id; a denial's reason goes to the call as its answer.
fn approval_responses(message: &UiMessage) -> ApiResult<Vec<Decision>> {
    let mut decisions = Vec::new();
    for part in message.parts.iter().filter(|p| is_tool_part(p)) {
        if part.get("state").and_then(Value::as_str) != Some("approval-responded") {
            continue;
        }
        let approval = part.get("approval");
        let call_id = approval
            .and_then(|a| a.get("id"))
            .or_else(|| part.get("toolCallId"))
            .and_then(Value::as_str);
        let approved = approval
            .and_then(|a| a.get("approved"))
            .and_then(Value::as_bool);
        let (Some(call_id), Some(approved)) = (call_id, approved) else {
            return Err(ApiError::bad_field(
                "invalid_approval",
                "messages",
                format!(
                    "a tool part in state `approval-responded` lacks `approval.id` or `approval.approved`: {part}"
                ),
            ));
        };
        let reason = approval
            .and_then(|a| a.get("reason"))
            .and_then(Value::as_str)
            .map(|r| Value::String(r.to_owned()));
        decisions.push(Decision {
            call_id: call_id.to_owned(),
            decision: if approved {
                ResumeDecision::Approve
            } else {
                ResumeDecision::Deny
            },
            argument_digest: None,
            payload: if approved { None } else { reason },
        });
    }
    Ok(decisions)
}
