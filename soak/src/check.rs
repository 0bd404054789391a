//! The invariants checked after every run: its events follow the grammar with exactly one
//! `RunFinish`; the store holds the thread finished (every run `Done`, no call of the stored
//! batch left `Requested` or `Executing`, every tool call answered exactly once); a store
//! fault lost nothing committed before it. Each check returns what is wrong, in words.

use std::collections::HashMap;

use awaken_event::{AgentEvent, Role, RunId, TerminationReason, ToolCallState, check_activation};
use awaken_store::{RunStatus, ThreadStore};

use crate::store::Holding;

/// Checks one activation's events and returns the termination its `RunFinish` reports.
pub(crate) fn activation(events: &[AgentEvent]) -> Result<TerminationReason, String> {
    check_activation(events).map_err(|v| format!("event grammar: {v}"))?;
    let mut finishes = events.iter().filter_map(|e| match e {
        AgentEvent::RunFinish { termination, .. } => Some(termination),
        _ => None,
    });
    let (Some(termination), None) = (finishes.next(), finishes.next()) else {
        return Err("not exactly one run_finish".into());
    };
    Ok((**termination).clone())
}

/// Splits a stream of several activations (a recovery's) at each `RunStart`.
pub(crate) fn activations(events: &[AgentEvent]) -> Vec<&[AgentEvent]> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, e) in events.iter().enumerate() {
        if i > start && matches!(e, AgentEvent::RunStart { .. }) {
            out.push(&events[start..i]);
            start = i;
        }
    }
    if start < events.len() {
        out.push(&events[start..]);
    }
    out
}

/// Reads `thread_id` back (its events too when `events` says so) and checks that it is
/// finished: every run `Done`, no call of the stored batch `Requested` or `Executing`, every
/// call in the history answered by exactly one result and every result answering a call. A
/// thread never committed passes.
pub(crate) async fn finished_thread(
    store: &dyn ThreadStore,
    thread_id: &awaken_event::ThreadId,
    events: bool,
) -> Result<Holding, String> {
    let holding = Holding::read(store, thread_id, events)
        .await
        .map_err(|e| format!("reading the thread back: {e}"))?;
    let Some(cp) = &holding.checkpoint else {
        return Ok(holding);
    };
    for run in &holding.runs {
        if run.status != RunStatus::Done {
            return Err(format!(
                "run {} is left {} ({:?})",
                run.run_id,
                run.status.as_str(),
                run.termination
            ));
        }
    }
    if let Some(batch) = &cp.batch {
        for call in batch.calls() {
            if matches!(
                call.state(),
                ToolCallState::Requested | ToolCallState::Executing
            ) {
                return Err(format!(
                    "call {} of the stored batch is left {:?}",
                    call.id(),
                    call.state()
                ));
            }
        }
    }
    // Every call answered once, every result answering a call made before it.
    let mut answers: HashMap<&str, u32> = HashMap::new();
    for m in &cp.messages {
        match m.role {
            Role::Assistant => {
                for call in m.tool_calls.iter() {
                    if answers.insert(call.id.as_str(), 0).is_some() {
                        return Err(format!("call id {} is used twice", call.id));
                    }
                }
            }
            Role::Tool => {
                let id = m.tool_call_id.as_ref().map_or("", |c| c.as_str());
                match answers.get_mut(id) {
                    Some(n) => *n += 1,
                    None => return Err(format!("result for {id:?} answers no earlier call")),
                }
            }
            _ => {}
        }
    }
    if let Some((id, n)) = answers.iter().find(|(_, n)| **n != 1) {
        return Err(format!("call {id} has {n} results"));
    }
    Ok(holding)
}

/// Checks that what `before` held is still in `after`, but for the run `current` (whose
/// record the run's later commits change): the messages and events as a prefix, every other
/// run's record unchanged.
pub(crate) fn kept(
    before: &Holding,
    after: &Holding,
    current: Option<&RunId>,
) -> Result<(), String> {
    let messages = |h: &Holding| h.checkpoint.as_ref().map_or(0, |c| c.messages.len());
    if let Some(b) = &before.checkpoint {
        let a = after
            .checkpoint
            .as_ref()
            .map_or(&[][..], |c| &c.messages[..]);
        if !a.starts_with(&b.messages) {
            return Err(format!(
                "lost commit: {} messages were committed, {} read back, or they differ",
                messages(before),
                messages(after)
            ));
        }
    }
    if !after.events.starts_with(&before.events) {
        return Err(format!(
            "lost commit: {} events were stored, {} read back, or they differ",
            before.events.len(),
            after.events.len()
        ));
    }
    for run in before.runs.iter().filter(|r| Some(&r.run_id) != current) {
        if !after.runs.contains(run) {
            return Err(format!(
                "lost commit: run {} changed or vanished",
                run.run_id
            ));
        }
    }
    Ok(())
}
