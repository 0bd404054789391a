//! What an activation runs, decided from what it starts from and the stored thread: a new run
//! (refused on a thread waiting for decisions, unless it supersedes the waiting calls), a
//! resume (every decision checked before any is applied) or the recovery of the run a claim
//! names.

use std::sync::Arc;

use awaken_event::{
    AgentEvent, CancellationToken, Message, ProfileId, RunId, TerminationReason, ThreadId,
    ToolResult, WarningKind,
};
use awaken_spec::InferenceOverride;
use awaken_state::PersistedState;
use awaken_store::{BatchWrite, LeaseToken, RunRecord, RunStatus, ThreadCommit};
use awaken_tool::ToolBatch;

use crate::activation::load::{Latest, Stored};
use crate::activation::start::Start;
use crate::error::RunError;
use crate::inner::RuntimeInner;
use crate::resume::{recorded_decisions, suspended_calls, validate_decisions};
use crate::run::Continue;
use crate::steering::Steering;

/// What an activation runs.
pub(super) struct Plan {
    pub(super) agent_id: Arc<str>,
    pub(super) profile_id: Option<ProfileId>,
    /// A new run's messages.
    pub(super) messages: Vec<Message>,
    pub(super) cancel: CancellationToken,
    /// Messages for the run while it is in flight (a recovered run's: an inbox nobody else
    /// holds).
    pub(super) steering: Steering,
    /// A new run's inference override (boxed: most runs have none).
    pub(super) inference: Option<Box<InferenceOverride>>,
    /// The run it continues, if it does (boxed: most activations start afresh).
    pub(super) continued: Option<Box<Continued>>,
    /// The run's id: the continued run's, or the one a new run was given (else the runtime's
    /// id source makes one).
    pub(super) run_id: Option<RunId>,
    /// The parent run of a delegate's child run.
    pub(super) parent_run_id: Option<RunId>,
    /// The lease a recovery's claim holds.
    pub(super) lease: Option<LeaseToken>,
}

/// The run an activation continues.
pub(super) struct Continued {
    pub(super) record: RunRecord,
    pub(super) batch: Option<ToolBatch>,
    pub(super) run_state: PersistedState,
    /// A human's resume with decisions, or a recovery after a crash.
    pub(super) how: Continue,
}

impl Plan {
    /// The plan of an activation that continues `continued`, as its record says.
    fn continuing(
        continued: Continued,
        cancel: CancellationToken,
        steering: Steering,
        lease: Option<LeaseToken>,
    ) -> Self {
        let record = &continued.record;
        Plan {
            agent_id: record.agent_id.clone(),
            profile_id: record.profile_id.clone(),
            messages: Vec::new(),
            cancel,
            steering,
            inference: None,
            run_id: Some(record.run_id.clone()),
            parent_run_id: record.parent_run_id.clone(),
            lease,
            continued: Some(Box::new(continued)),
        }
    }
}

/// Decides what the activation runs on `thread_id`, the thread `start` names. A new run on a
/// waiting thread that supersedes its calls closes them here, in a commit of their own (its
/// warning is added to `notes`, the closing messages to `stored`'s history).
pub(super) async fn decide(
    rt: &RuntimeInner,
    start: Start,
    thread_id: &ThreadId,
    stored: &mut Stored,
    notes: &mut Vec<AgentEvent>,
) -> Result<Plan, RunError> {
    match start {
        Start::Recover(claimed, cancel, steering) => {
            let latest = stored.latest.take();
            let Some(Latest::Unfinished {
                record,
                batch,
                run_state,
            }) = latest
            else {
                // A run left behind by a later run on its thread (stored before one run per
                // thread was enforced): closed once no other run is active, so that it is
                // not claimed again and again.
                if latest.is_none()
                    && let Some(lease) = &claimed.lease
                {
                    Box::pin(close_left_behind(
                        rt,
                        thread_id,
                        &claimed.run_id,
                        stored,
                        lease,
                    ))
                    .await?;
                }
                return Err(RunError::NotRecoverable {
                    thread_id: thread_id.clone(),
                    run_id: claimed.run_id,
                });
            };
            let continued = Continued {
                record,
                batch,
                run_state,
                how: Continue::Recover,
            };
            Ok(Plan::continuing(continued, cancel, steering, claimed.lease))
        }
        Start::Fresh(act) => {
            match stored.latest.take() {
                Some(Latest::Waiting { record, batch, .. }) => {
                    if !act.supersede {
                        return Err(RunError::ThreadWaiting {
                            thread_id: thread_id.clone(),
                            run_id: record.run_id,
                            calls: suspended_calls(&batch)
                                .into_iter()
                                .map(|(id, _)| id)
                                .collect(),
                        });
                    }
                    // Boxed: a rare path, whose state need not be part of every activation's.
                    let closed =
                        Box::pin(close_run(rt, thread_id, record, Some(batch), stored, None))
                            .await?;
                    notes.push(superseded_note("the waiting calls", &closed));
                }
                Some(Latest::Busy { record, batch }) => {
                    if !act.supersede {
                        return Err(busy(thread_id, record, false));
                    }
                    let what = format!("the unfinished run {}, closing its calls", record.run_id);
                    let closed =
                        Box::pin(supersede_stale(rt, thread_id, record, batch, stored)).await?;
                    notes.push(superseded_note(&what, &closed));
                }
                _ => {}
            }
            Ok(Plan {
                agent_id: Arc::from(act.agent_id),
                profile_id: act.profile_id,
                messages: act.messages,
                cancel: act.cancel,
                steering: act.steering,
                inference: act.inference.map(Box::new),
                continued: None,
                run_id: act.run_id,
                parent_run_id: act.parent_run_id,
                lease: None,
            })
        }
        Start::Resume(resume) => {
            let Some(Latest::Waiting {
                record,
                batch,
                run_state,
            }) = stored.latest.take()
            else {
                return Err(RunError::NotWaiting {
                    thread_id: thread_id.clone(),
                });
            };
            let recorded = recorded_decisions(&run_state).map_err(|e| RunError::StoredBatch {
                thread_id: thread_id.clone(),
                message: format!("the recorded decisions do not decode: {e}"),
            })?;
            validate_decisions(&batch, &recorded, &resume.decisions).map_err(|source| {
                RunError::Decision {
                    thread_id: thread_id.clone(),
                    source,
                }
            })?;
            let continued = Continued {
                record,
                batch: Some(batch),
                run_state,
                how: Continue::Decide(recorded, resume.decisions),
            };
            Ok(Plan::continuing(
                continued,
                resume.cancel,
                resume.steering,
                None,
            ))
        }
    }
}

/// The warning a new run notes after it superseded `what`, naming the calls it closed.
fn superseded_note(what: &str, closed: &[Message]) -> AgentEvent {
    AgentEvent::Warning {
        kind: WarningKind::Other,
        detail: format!(
            "superseded {what} {}",
            closed
                .iter()
                .filter_map(|m| m.tool_call_id.as_ref().map(ToString::to_string))
                .collect::<Vec<_>>()
                .join(", ")
        )
        .trim_end()
        .to_owned(),
    }
}

/// The refusal of a new run on a thread whose run `record` is still running.
fn busy(thread_id: &ThreadId, record: RunRecord, lease_held: bool) -> RunError {
    RunError::ThreadBusy {
        thread_id: thread_id.clone(),
        run_id: record.run_id,
        status: record.status,
        lease_held,
    }
}

/// Ends the running run `record` whose process is gone: takes its lease (only when it is free
/// or expired: a live lease refuses) and closes it with its open calls (a call that never ran
/// as cancelled, one that was executing as outcome unknown) in one commit carrying the lease.
async fn supersede_stale(
    rt: &RuntimeInner,
    thread_id: &ThreadId,
    record: RunRecord,
    batch: Option<ToolBatch>,
    stored: &mut Stored,
) -> Result<Vec<Message>, RunError> {
    let (worker, duration) = match &rt.worker {
        Some(w) => (w.id.clone(), w.lease_duration),
        None => (
            format!("supersede-{}", record.run_id),
            std::time::Duration::from_secs(30),
        ),
    };
    let claimed = rt
        .store
        .claim_run(&record.run_id, &worker, duration, rt.ids.timestamp())
        .await
        .map_err(RunError::Store)?;
    let Some(claimed) = claimed else {
        return Err(busy(thread_id, record, true));
    };
    let lease = claimed.lease;
    let closed = close_run(rt, thread_id, record, batch, stored, Some(lease.clone())).await;
    if closed.is_err() {
        rt.release(&lease).await;
    }
    closed
}

/// Ends the unfinished run `run_id` that is not its thread's latest run, as cancelled, with
/// the lease its recovery claimed; nothing is added to the thread's history.
async fn close_left_behind(
    rt: &RuntimeInner,
    thread_id: &ThreadId,
    run_id: &RunId,
    stored: &mut Stored,
    lease: &LeaseToken,
) -> Result<(), RunError> {
    let record = rt.store.load_run(thread_id, run_id).await;
    let Some(record) = record.map_err(RunError::Store)? else {
        return Ok(());
    };
    if record.status == RunStatus::Done {
        return Ok(());
    }
    close_run(rt, thread_id, record, None, stored, Some(lease.clone())).await?;
    Ok(())
}

/// Ends `record` as cancelled with every open call of `batch` closed ("superseded by a new
/// message"), their tool messages appended to the thread in call order, in one commit (with
/// `lease`, when one is held). The messages join `stored`'s history.
async fn close_run(
    rt: &RuntimeInner,
    thread_id: &ThreadId,
    mut record: RunRecord,
    batch: Option<ToolBatch>,
    stored: &mut Stored,
    lease: Option<LeaseToken>,
) -> Result<Vec<Message>, RunError> {
    let mut messages = Vec::new();
    let mut events = Vec::new();
    if let Some(mut batch) = batch {
        for id in batch.close("superseded by a new message") {
            let Some(call) = batch.get(&id) else { continue };
            let result = call
                .result()
                .cloned()
                .unwrap_or_else(|| ToolResult::error("not executed: superseded by a new message"));
            messages.push(Message::tool(id.clone(), &result));
            // A waiting run's activation ended; its closing is stored with it. A running
            // run's stored events stop where its process did: nothing is added to them.
            if record.status == RunStatus::Waiting {
                events.push(AgentEvent::ToolCallDone {
                    call_id: id,
                    result: result.into(),
                    state: call.state(),
                });
            }
        }
    }
    record.status = RunStatus::Done;
    record.termination = Some(TerminationReason::Cancelled);
    record.updated_at = rt.ids.timestamp();
    let mut commit = ThreadCommit::new(thread_id.clone(), record, stored.persisted)
        .with_messages(messages.iter().cloned())
        .with_events(events);
    commit.batch = BatchWrite::Clear;
    commit.lease = lease;
    let receipt = rt
        .store
        .commit(&commit)
        .await
        .map_err(|source| RunError::Commit {
            thread_id: thread_id.clone(),
            source,
        })?;
    stored.persisted += messages.len() as u64;
    stored.last_event_seq = receipt.last_event_seq;
    stored.history.extend(messages.iter().cloned());
    Ok(messages)
}
