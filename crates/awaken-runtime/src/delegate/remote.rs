//! Delegation to a remote agent (one with an endpoint, run by an execution backend). No child
//! run is kept here: the backend runs the task on the remote side under the child run's id and
//! thread, so a call run again after a crash sends the same request (an A2A message id the
//! remote side recognises). The remote agent's streamed text is the call's progress.
//!
//! A remote agent that asks for input suspends the parent's call with its question; the
//! remote side's handle on the waiting task is kept in the parent run's state
//! ([`RemoteWaitsKey`]). An approval's payload is the answer, sent into that task; a denial
//! cancels it.

use std::collections::BTreeMap;

use awaken_event::{
    AgentEvent, EventSink, Message, PendingCall, ResumeDecision, ResumeMode, SuspendTicket,
    TerminationReason, ToolResult,
};
use awaken_resolver::{BackendOutcome, BackendRequest, ResolvedBackendAgent};
use awaken_state::{StateCommand, StateError, StateKey};
use awaken_tool::{ToolCallContext, ToolError, ToolOutput, argument_digest};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::child::{child_run_id, child_thread_id, delegate_tool_id};

/// The delegate calls of a run whose remote agent waits for input, by call id. Run-scoped
/// (a resume or a recovery in any process finds them); calls write only their own entries,
/// so concurrent calls commute.
pub struct RemoteWaitsKey;

/// A remote agent's question a delegate call waits on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteWait {
    /// The backend's handle on the waiting remote task (an A2A task id).
    pub handle: String,
    /// The remote agent's question.
    pub question: String,
    /// How many answers the call has sent so far (each answer's request has an id of its own).
    pub answers: u32,
}

/// A change to [`RemoteWaitsKey`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum RemoteWaitUpdate {
    /// A call waits.
    Wait {
        /// The call's id.
        call: String,
        /// What it waits on.
        wait: RemoteWait,
    },
    /// A call no longer waits.
    Done {
        /// The call's id.
        call: String,
    },
}

impl StateKey for RemoteWaitsKey {
    const KEY: &'static str = "awaken.delegate.remote_waits";
    type Value = BTreeMap<String, RemoteWait>;
    type Update = RemoteWaitUpdate;

    fn apply(value: &mut Self::Value, update: RemoteWaitUpdate) -> Result<(), StateError> {
        match update {
            RemoteWaitUpdate::Wait { call, wait } => {
                value.insert(call, wait);
            }
            RemoteWaitUpdate::Done { call } => {
                value.remove(&call);
            }
        }
        Ok(())
    }
}

/// What the remote agent is asked: a task, or an answer to its question.
enum Ask {
    Task(String),
    Answer { wait: RemoteWait, text: String },
    Decline(RemoteWait),
}

/// Runs a delegate call on remote agent `remote`.
pub(super) async fn delegate(
    remote: &ResolvedBackendAgent,
    args: &Value,
    ctx: &ToolCallContext,
) -> Result<ToolOutput, ToolError> {
    let agent = remote.spec.id.as_str();
    let waiting = ctx
        .snapshot()
        .get::<RemoteWaitsKey>()
        .map_err(|e| ToolError::Execution {
            message: format!("the run's remote delegations could not be read: {e}"),
        })?
        .get(ctx.call_id().as_str())
        .cloned();
    let ask = match (waiting, ctx.resume()) {
        (None, _) => Ask::Task(args["task"].as_str().unwrap_or_default().to_owned()),
        // A re-run after a crash while the question was open: ask it again.
        (Some(wait), None) => return Ok(suspend(ctx, agent, args, wait)),
        (Some(wait), Some(d)) if d.decision == ResumeDecision::Deny => Ask::Decline(wait),
        (Some(wait), Some(d)) => match &d.payload {
            Some(Value::String(text)) => Ask::Answer {
                wait,
                text: text.clone(),
            },
            // An approval without an answer (the ticket's schema asks for one): the question
            // stands.
            _ => return Ok(suspend(ctx, agent, args, wait)),
        },
    };
    let (declined, waited) = (matches!(ask, Ask::Decline(_)), !matches!(ask, Ask::Task(_)));
    let key = ctx.idempotency_key().as_str();
    let first = child_run_id(key)?;
    let thread_id = child_thread_id(ctx.thread_id(), ctx.call_id(), &first)?;
    let (text, answering, answers, cancel) = match ask {
        Ask::Task(task) => (task, None, 0, ctx.cancel_token().clone()),
        Ask::Answer { wait, text } => {
            let cancel = ctx.cancel_token().clone();
            (text, Some(wait.handle), wait.answers + 1, cancel)
        }
        Ask::Decline(wait) => {
            // A request with its cancellation fired cancels the task it answers.
            let cancel = ctx.cancel_token().child_token();
            cancel.cancel();
            (String::new(), Some(wait.handle), wait.answers + 1, cancel)
        }
    };
    // Each answer is a request of its own: a run id (and so an A2A message id) of its own.
    let run_id = match answers {
        0 => first,
        n => child_run_id(&format!("{key}-{n}"))?,
    };
    let request = BackendRequest {
        thread_id,
        run_id,
        messages: vec![Message::user(text)],
        overrides: None,
        cancel,
        answering,
    };
    let outcome = remote
        .backend
        .run(&remote.spec, request, &Progress { ctx, agent })
        .await;
    let output = match outcome {
        _ if declined => ToolOutput::new(ToolResult::error(format!(
            "the user declined to answer `{agent}`'s question; its remote task was asked to cancel"
        ))),
        Err(e) => ToolOutput::new(ToolResult::error(format!(
            "the remote agent `{agent}` failed: {e}"
        ))),
        Ok(outcome) => answered(ctx, agent, args, outcome, answers)?,
    };
    // A call that waited drops its entry once it stops waiting.
    if waited && output.suspend.is_none() {
        let done = RemoteWaitUpdate::Done {
            call: ctx.call_id().to_string(),
        };
        return Ok(output.with_command(StateCommand::new().with_update::<RemoteWaitsKey>(done)));
    }
    Ok(output)
}

/// The call's output for the remote run's `outcome`: its answer, its failure, or (a question)
/// the call suspended with the waiting task recorded.
fn answered(
    ctx: &ToolCallContext,
    agent: &str,
    args: &Value,
    outcome: BackendOutcome,
    answers: u32,
) -> Result<ToolOutput, ToolError> {
    Ok(match outcome {
        BackendOutcome {
            termination: TerminationReason::Suspended,
            response,
            waiting: Some(handle),
            ..
        } => {
            let wait = RemoteWait {
                handle,
                question: response.unwrap_or_default(),
                answers,
            };
            let update = RemoteWaitUpdate::Wait {
                call: ctx.call_id().to_string(),
                wait: wait.clone(),
            };
            suspend(ctx, agent, args, wait)
                .with_command(StateCommand::new().with_update::<RemoteWaitsKey>(update))
        }
        BackendOutcome {
            termination: TerminationReason::Suspended,
            ..
        } => ToolOutput::new(ToolResult::error(format!(
            "the remote agent `{agent}` asked for input without a task to answer"
        ))),
        BackendOutcome {
            termination: TerminationReason::Cancelled,
            ..
        } => {
            return Err(ToolError::Cancelled {
                tool_id: delegate_tool_id(agent),
            });
        }
        BackendOutcome {
            termination: TerminationReason::Error { message },
            ..
        } => ToolOutput::new(ToolResult::error(format!(
            "the remote agent `{agent}` failed: {message}"
        ))),
        BackendOutcome { response, .. } => ToolOutput::success(json!({
            "agent": agent,
            "answer": response.unwrap_or_default(),
        })),
    })
}

/// The parent call's ticket for the remote agent's question: the call as it was made, its
/// answer a string the tool sends on.
fn suspend(ctx: &ToolCallContext, agent: &str, args: &Value, wait: RemoteWait) -> ToolOutput {
    let call = PendingCall {
        call_id: ctx.call_id().clone(),
        tool_name: delegate_tool_id(agent),
        arguments: args.clone(),
        argument_digest: argument_digest(args),
    };
    ToolOutput::suspended(SuspendTicket {
        suspension_id: format!("delegate-{}:{}", ctx.call_id(), wait.answers),
        call,
        message: format!("[{agent}] {}", wait.question),
        response_schema: Some(json!({
            "type": "string",
            "minLength": 1,
            "description": format!("The answer sent to `{agent}`."),
        })),
        resume_mode: ResumeMode::PassDecisionToTool,
    })
}

/// The remote run's events as the call's progress: its streamed text.
struct Progress<'a> {
    ctx: &'a ToolCallContext,
    agent: &'a str,
}

impl EventSink for Progress<'_> {
    fn emit(&self, event: &AgentEvent) {
        if let AgentEvent::TextDelta { delta } = event {
            self.ctx
                .report_progress(json!({"agent": self.agent, "text": delta}));
        }
    }
}
