//! The run an activation builds: the agent resolved (an endpoint-backed agent's activation runs
//! on its backend instead), the run's state restored (thread, continued run, profile), its
//! history repaired, its record and commit writer made, and the [`Run`] boxed. That box is the
//! activation's one stage boundary: everything after it borrows the run where it lies, so the
//! activation's future holds a pointer to the run, not the run, for the run's whole life.

use std::collections::HashSet;
use std::sync::Arc;

use awaken_event::{AgentEvent, EventSink, ToolCallId, WarningKind};
use awaken_phase::{PhaseEngine, RunIdentity};
use awaken_resolver::{BackendRequest, ResolvedRunPlan};
use awaken_state::{KeyScope, StateStore, UnknownKeyPolicy};
use awaken_store::{RunRecord, RunStatus};

use crate::activation::decide::{Continued, Plan, decide};
use crate::activation::load::load;
use crate::activation::start::Start;
use crate::delegate::child::DelegationDepthKey;
use crate::durable::Durable;
use crate::durable::profile::ProfileJournal;
use crate::error::RunError;
use crate::inner::RuntimeInner;
use crate::outcome::RunOutcome;
use crate::pool::{ModelPoolKey, recorded_pool};
use crate::repair::repair_history;
use crate::run::lifecycle::Opening;
use crate::run::{Run, RunParts};

/// What an activation built.
pub(super) enum Built<'a> {
    /// An endpoint-backed agent's activation, run to its end on its backend.
    Done(RunOutcome),
    /// The local run, with what its opening needs.
    Run(Box<Run<'a>>, Opening),
}

/// Loads the thread `start` names, decides what runs, resolves the agent and builds the run,
/// with its `RunStart` fact pending for the first commit.
pub(super) async fn build<'a>(
    rt: &RuntimeInner,
    start: Box<Start>,
    sink: &'a dyn EventSink,
) -> Result<Built<'a>, RunError> {
    let thread_id = start.thread_id().clone();
    // A delegate's child run starts one level below its parent; a continued run keeps the depth
    // its state holds.
    let delegation_depth = match &*start {
        Start::Fresh(act) => act.delegation_depth,
        _ => 0,
    };
    let mut stored = load(&*rt.store, &start).await?;
    let mut notes = Vec::new();
    let Plan {
        agent_id,
        profile_id,
        messages,
        cancel,
        steering,
        inference,
        continued,
        run_id,
        parent_run_id,
        lease,
    } = decide(rt, *start, &thread_id, &mut stored, &mut notes).await?;
    // A continued run keeps the model pool members it started with; a run that has none
    // recorded records the members it resolves to. (In a block: the recorded members are not
    // held across the activation's awaits.)
    let (plan, records_pool) = {
        let recorded = match &continued {
            Some(c) => recorded_pool(&c.run_state).map_err(|source| RunError::State {
                thread_id: thread_id.clone(),
                source,
            })?,
            None => None,
        };
        let plan = rt.resolver.plan_with_pool(&agent_id, recorded.as_ref())?;
        (plan, recorded.is_none())
    };
    let resolved = match plan {
        ResolvedRunPlan::Local(agent) => agent,
        ResolvedRunPlan::Backend(b) if continued.is_none() => {
            // An endpoint-backed agent: its backend runs the activation (and keeps its thread).
            let run_id = run_id.unwrap_or_else(|| rt.ids.next_run_id());
            let request = BackendRequest {
                thread_id,
                run_id: run_id.clone(),
                messages,
                overrides: inference.map(|i| *i),
                cancel,
                answering: None,
            };
            let outcome = b
                .backend
                .run(&b.spec, request, sink)
                .await
                .map_err(RunError::Backend)?;
            return Ok(Built::Done(RunOutcome {
                run_id,
                termination: outcome.termination,
                response: outcome.response,
                steps: 0,
                usage: outcome.usage,
            }));
        }
        ResolvedRunPlan::Backend(b) => {
            return Err(RunError::BackendPlan {
                agent_id: agent_id.to_string(),
                backend: b.backend.id().to_owned(),
            });
        }
    };
    let run_id = run_id.unwrap_or_else(|| rt.ids.next_run_id());
    if continued.is_none() && stored.last_run_id.as_ref() == Some(&run_id) {
        // A new run must never be written into an earlier run's record.
        return Err(RunError::RunIdTaken { thread_id, run_id });
    }
    let identity = Arc::new(RunIdentity {
        thread_id: thread_id.clone(),
        run_id,
        agent_id: agent_id.clone(),
        profile_id: profile_id.clone(),
    });
    // A run with a profile journals its profile writes, to redo them after a conflict.
    let state = Arc::new(match &profile_id {
        Some(_) => StateStore::with_journal(resolved.env.shared_keys().clone(), KeyScope::Profile),
        None => StateStore::new(resolved.env.shared_keys().clone()),
    });
    let restore_error = |e| RunError::State {
        thread_id: thread_id.clone(),
        source: e,
    };
    if let Some(thread_state) = &stored.thread_state {
        state
            .restore(thread_state, UnknownKeyPolicy::Skip)
            .map_err(restore_error)?;
    }
    if let Some(c) = &continued {
        state
            .restore(&c.run_state, UnknownKeyPolicy::Skip)
            .map_err(restore_error)?;
    }
    // The profile's keys, as they are now, with the versions they were read at.
    let mut journal = None;
    if let Some(profile) = &profile_id {
        let profile = rt
            .store
            .load_profile(profile)
            .await
            .map_err(RunError::Store)?;
        state
            .restore(&profile.to_persisted(), UnknownKeyPolicy::Skip)
            .map_err(restore_error)?;
        journal = Some(ProfileJournal::read(&profile));
    }
    // A history with unpaired calls or results never reaches a provider.
    // Calls still open in the batch are answered by this activation, not by the repair.
    let open: HashSet<ToolCallId> = continued
        .as_ref()
        .and_then(|c| c.batch.as_ref())
        .map(|b| b.open_calls().map(|c| c.id().clone()).collect())
        .unwrap_or_default();
    for repair in repair_history(&mut stored.history, &open) {
        notes.push(AgentEvent::Warning {
            kind: WarningKind::HistoryRepaired,
            detail: repair,
        });
    }
    let resumed = continued.is_some();
    let (record, batch, how) = match continued.map(|c| *c) {
        None => {
            let mut record = RunRecord::new(
                identity.run_id.clone(),
                agent_id.clone(),
                rt.ids.timestamp(),
            );
            record.profile_id = profile_id;
            // The resolver's digest, shared by every run of the agent (the record is copied
            // into every commit).
            record.spec_digest = Arc::clone(&resolved.spec_digest);
            record.parent_run_id = parent_run_id.clone();
            (record, None, None)
        }
        Some(Continued {
            mut record,
            batch,
            how,
            ..
        }) => {
            if record.spec_digest != resolved.spec_digest {
                notes.push(AgentEvent::Warning {
                    kind: WarningKind::SpecChanged,
                    detail: format!(
                        "agent `{agent_id}` changed while the run waited (spec digest {} → {})",
                        record.spec_digest, resolved.spec_digest
                    ),
                });
                record.spec_digest = Arc::clone(&resolved.spec_digest);
            }
            record.status = RunStatus::Running;
            record.termination = None;
            (record, batch, Some(how))
        }
    };
    let mut durable = Durable::new(
        rt.store.clone(),
        rt.ids.clone(),
        thread_id,
        record,
        stored.persisted,
        stored.last_event_seq,
        state.revision(),
    )
    .with_profile(journal);
    durable.set_lease(lease);
    if delegation_depth > 0 {
        // After the commit writer's baseline: the run's first commit writes it.
        state
            .update::<DelegationDepthKey>(delegation_depth)
            .map_err(|source| RunError::State {
                thread_id: identity.thread_id.clone(),
                source,
            })?;
    }
    if records_pool && let Some(pool) = &resolved.pool {
        // After the commit writer's baseline too: the run's next commit records the members.
        state
            .update::<ModelPoolKey>((**pool).clone())
            .map_err(|source| RunError::State {
                thread_id: identity.thread_id.clone(),
                source,
            })?;
    }
    let engine = PhaseEngine::new(state, resolved.env.phase_env().clone());
    if resumed {
        // Actions queued before the wait whose handler the re-resolved agent no longer has.
        match engine
            .dead_letter_unhandled("its handler is gone: the agent changed while the run waited")
        {
            Ok(letters) => {
                notes.extend(letters.into_iter().map(|l| AgentEvent::ActionDeadLettered {
                    action: l.action.key,
                    phase: l.action.phase,
                    reason: l.reason,
                }))
            }
            Err(e) => notes.push(AgentEvent::Error {
                message: e.to_string(),
            }),
        }
    }
    // The one box of the activation (see the module's documentation).
    let run = Box::new(Run::new(RunParts {
        sink,
        resolved,
        engine,
        identity,
        cancel,
        steering,
        history: stored.history,
        messages,
        run_override: inference,
        lifecycle: rt.lifecycle.clone(),
        span_content: rt.span_content,
        durable,
        batch,
        resume: how,
        parent_run_id: parent_run_id.clone(),
    }));
    Ok(Built::Run(
        run,
        Opening {
            notes,
            resumed,
            parent_run_id,
        },
    ))
}
