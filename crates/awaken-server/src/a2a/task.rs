//! Tasks as the server's runs: a task is a run (task id = run id) and its context is the run's
//! thread. A task's state, answer and waiting calls are read from the run's record and its
//! stored events; the stream encoder builds its final status with the same functions.

use std::collections::HashMap;

use awaken_a2a::{A2aError, Artifact, Message, Part, Task, TaskState, TaskStatus, timestamp};
use awaken_event::{AgentEvent, RunId, SuspendTicket, TerminationReason, ThreadId};
use awaken_store::{RunRecord, RunStatus};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::app::AgentServer;

use super::failure::{A2aResult, from_api, store_error};

/// What a run's stored events say of it.
#[derive(Debug, Default, Clone)]
pub(crate) struct RunSummary {
    /// How its latest activation ended.
    pub(crate) termination: Option<TerminationReason>,
    /// Its latest activation's final text.
    pub(crate) response: Option<String>,
    /// The calls its latest activation suspended and no later event decided.
    pub(crate) waiting: Vec<SuspendTicket>,
}

/// The summaries of every run of a thread's stored events, by run.
pub(crate) fn summaries(events: &[awaken_store::StoredEvent]) -> HashMap<RunId, RunSummary> {
    let mut runs: HashMap<RunId, RunSummary> = HashMap::new();
    for e in events {
        let run = runs.entry(e.run_id.clone()).or_default();
        match &e.event {
            AgentEvent::RunStart { .. } => *run = RunSummary::default(),
            AgentEvent::ToolCallSuspended { ticket, .. } => {
                run.waiting
                    .retain(|t| t.call.call_id != ticket.call.call_id);
                run.waiting.push((**ticket).clone());
            }
            AgentEvent::ToolCallResumed { call_id, .. }
            | AgentEvent::ToolCallDone { call_id, .. } => {
                run.waiting.retain(|t| t.call.call_id != *call_id);
            }
            AgentEvent::RunFinish {
                termination,
                response,
                ..
            } => {
                run.termination = Some((**termination).clone());
                run.response = response.clone();
            }
            _ => {}
        }
    }
    runs
}

/// The A2A state of a run's record and summary.
pub(crate) fn state_of(record: &RunRecord, summary: &RunSummary) -> TaskState {
    match record.status {
        RunStatus::Running => TaskState::Working,
        RunStatus::Waiting => TaskState::InputRequired,
        RunStatus::Done => summary
            .termination
            .as_ref()
            .or(record.termination.as_ref())
            .map_or(TaskState::Completed, state_of_termination),
    }
}

/// The A2A state a run that ended with `termination` is in.
pub(crate) fn state_of_termination(termination: &TerminationReason) -> TaskState {
    match termination {
        TerminationReason::NaturalEnd | TerminationReason::Stopped { .. } => TaskState::Completed,
        TerminationReason::Suspended => TaskState::InputRequired,
        TerminationReason::Cancelled => TaskState::Canceled,
        TerminationReason::Error { .. } => TaskState::Failed,
        // (A reason added later ends the run like a natural end until it is mapped.)
        _ => TaskState::Completed,
    }
}

/// The id of a task's answer artifact (one per task).
pub(crate) fn answer_artifact_id(task_id: &str) -> String {
    format!("{task_id}-answer")
}

/// The answer artifact of `text`.
pub(crate) fn answer_artifact(task_id: &str, text: &str) -> Artifact {
    Artifact {
        artifact_id: answer_artifact_id(task_id),
        name: Some("answer".to_owned()),
        parts: vec![Part::text(text)],
        ..Artifact::default()
    }
}

/// The status of a task in `state`, with the agent's message about it: the answer, the error,
/// or the waiting calls (as a data part, with how to answer them).
pub(crate) fn status(
    ids: (&str, &str),
    state: TaskState,
    termination: Option<&TerminationReason>,
    response: Option<&str>,
    waiting: &[SuspendTicket],
    at: Option<String>,
) -> TaskStatus {
    let (context_id, task_id) = ids;
    let parts = match (state, termination) {
        (TaskState::InputRequired, _) => waiting_parts(waiting),
        (TaskState::Failed, Some(TerminationReason::Error { message })) => {
            vec![Part::text(message.clone())]
        }
        (TaskState::Canceled, _) => vec![Part::text("the run was cancelled")],
        (TaskState::Completed, Some(TerminationReason::Stopped { code, detail }))
            if response.is_none_or(str::is_empty) =>
        {
            vec![Part::text(format!("the run stopped ({code}): {detail}"))]
        }
        (TaskState::Completed, _) => response
            .filter(|r| !r.is_empty())
            .map(|r| vec![Part::text(r)])
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    let message = (!parts.is_empty()).then(|| {
        Message::agent(format!("{task_id}-{}", state_slug(state)), parts)
            .in_task(context_id, task_id)
    });
    TaskStatus {
        state,
        message,
        timestamp: at,
    }
}

/// A short name of a state for message ids (`completed`, `input-required`).
fn state_slug(state: TaskState) -> String {
    state
        .as_str()
        .trim_start_matches("TASK_STATE_")
        .to_ascii_lowercase()
        .replace('_', "-")
}

/// The parts that ask about waiting calls: their questions as text, then a data part naming
/// each call (tool, arguments, digest) and the decision data that answers them.
fn waiting_parts(waiting: &[SuspendTicket]) -> Vec<Part> {
    let question = if waiting.is_empty() {
        "the run waits for a decision".to_owned()
    } else {
        waiting
            .iter()
            .map(|t| {
                format!(
                    "{} (call `{}` of `{}`)",
                    t.message, t.call.call_id, t.call.tool_name
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let calls: Vec<Value> = waiting
        .iter()
        .map(|t| {
            json!({
                "call_id": t.call.call_id,
                "tool": t.call.tool_name,
                "arguments": t.call.arguments,
                "argument_digest": t.call.argument_digest,
                "message": t.message,
            })
        })
        .collect();
    let answer: Vec<Value> = waiting
        .iter()
        .map(|t| json!({"call_id": t.call.call_id, "approve": true}))
        .collect();
    vec![
        Part::text(question),
        Part::data(json!({"waiting": calls, "answer_with": {"decisions": answer}})),
    ]
}

/// The task of `record` on `thread`, from the run's summary.
pub(crate) fn task_of(
    thread: &ThreadId,
    record: &RunRecord,
    summary: &RunSummary,
    waiting_now: Option<&[SuspendTicket]>,
) -> Task {
    let task_id = record.run_id.as_str();
    let context_id = thread.as_str();
    let state = state_of(record, summary);
    let termination = summary.termination.as_ref().or(record.termination.as_ref());
    let response = summary.response.as_deref();
    let waiting = waiting_now.unwrap_or(&summary.waiting);
    let at = Some(timestamp(record.updated_at.as_unix_millis()));
    let artifacts = match (state, response) {
        (TaskState::Completed, Some(text)) if !text.is_empty() => {
            vec![answer_artifact(task_id, text)]
        }
        _ => Vec::new(),
    };
    Task {
        id: task_id.to_owned(),
        context_id: context_id.to_owned(),
        status: status(
            (context_id, task_id),
            state,
            termination,
            response,
            waiting,
            at,
        ),
        artifacts,
        ..Task::default()
    }
}

/// Where a task is: its thread and its run's record.
pub(crate) struct Located {
    pub(crate) thread: ThreadId,
    pub(crate) record: RunRecord,
}

/// Finds task `task_id` of `agent`: the run of that id, through the store's index of runs.
/// Another agent's run is not found.
pub(crate) async fn locate(server: &AgentServer, agent: &str, task_id: &str) -> A2aResult<Located> {
    let not_found = || A2aError::TaskNotFound {
        task_id: task_id.to_owned(),
    };
    let Ok(run_id) = RunId::new(task_id) else {
        return Err(not_found().into());
    };
    match find(server, &run_id).await? {
        Some(at) if *at.record.agent_id == *agent => Ok(at),
        _ => Err(not_found().into()),
    }
}

/// The run a message starts on `thread`: named after the message's id on its context, so the
/// same message sent again (a client retrying after a lost answer or a crash) finds its task
/// instead of running again.
pub(crate) fn run_of_message(thread: &ThreadId, message_id: &str) -> RunId {
    let digest = Sha256::new()
        .chain_update(thread.as_str())
        .chain_update([0])
        .chain_update(message_id)
        .finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    // Hex digits after a fixed prefix: always a valid id.
    RunId::new(format!("a2a-{hex}")).unwrap_or_else(|_| unreachable!())
}

/// The task of run `run_id`, if the store has it (of whichever agent).
pub(crate) async fn find(server: &AgentServer, run_id: &RunId) -> A2aResult<Option<Located>> {
    let store = server.shared.runtime.store();
    match store.run_thread(run_id).await.map_err(store_error)? {
        Some(thread) => on_thread(server, thread, run_id).await,
        None => Ok(None),
    }
}

/// The task of run `run_id` on `thread`, if the thread has that run.
pub(crate) async fn on_thread(
    server: &AgentServer,
    thread: ThreadId,
    run_id: &RunId,
) -> A2aResult<Option<Located>> {
    let store = server.shared.runtime.store();
    let runs = store.list_runs(&thread).await.map_err(store_error)?;
    Ok(runs
        .into_iter()
        .find(|r| r.run_id == *run_id)
        .map(|record| Located { thread, record }))
}

/// The task of a located run as it stands now (its waiting calls from the runtime when it is
/// its thread's waiting run).
pub(crate) async fn load(server: &AgentServer, at: &Located) -> A2aResult<Task> {
    let runtime = &server.shared.runtime;
    let events = runtime
        .store()
        .load_events(&at.thread, 0)
        .await
        .map_err(store_error)?;
    let summary = summaries(&events)
        .remove(&at.record.run_id)
        .unwrap_or_default();
    let waiting_now = if at.record.status == RunStatus::Waiting {
        Some(
            runtime
                .waiting_calls(&at.thread)
                .await
                .map_err(|e| from_api(e.into()))?,
        )
    } else {
        None
    };
    Ok(task_of(
        &at.thread,
        &at.record,
        &summary,
        waiting_now.as_deref(),
    ))
}

/// Re-reads a located run's record (after it moved on).
pub(crate) async fn refresh(server: &AgentServer, at: &Located) -> A2aResult<Located> {
    let found = on_thread(server, at.thread.clone(), &at.record.run_id).await?;
    Ok(found.unwrap_or_else(|| Located {
        thread: at.thread.clone(),
        record: at.record.clone(),
    }))
}
