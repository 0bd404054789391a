//! The stored thread as an activation finds it: its history and state, and its latest run when
//! the activation may continue it.

use awaken_event::{Message, RunId};
use awaken_state::PersistedState;
use awaken_store::{RunRecord, RunStatus, ThreadStore};
use awaken_tool::ToolBatch;

use crate::activation::start::Start;
use crate::error::RunError;

/// The thread as the store holds it (empty for a new thread).
#[derive(Default)]
pub(super) struct Stored {
    /// Its messages.
    pub(super) history: Vec<Message>,
    /// How many messages the store holds: the guard of the activation's first commit.
    pub(super) persisted: u64,
    /// The sequence number of its last stored event (0: none).
    pub(super) last_event_seq: u64,
    /// Its thread-scoped state.
    pub(super) thread_state: Option<PersistedState>,
    /// The id of its latest run (a new run must not take it).
    pub(super) last_run_id: Option<RunId>,
    /// Its latest run, when the activation may continue it.
    pub(super) latest: Option<Latest>,
}

/// A thread's latest run that an activation may continue.
pub(super) enum Latest {
    /// Waiting for decisions on the suspended calls of its batch (a resume continues it; a
    /// new run supersedes the calls or is refused).
    Waiting {
        record: RunRecord,
        batch: ToolBatch,
        run_state: PersistedState,
    },
    /// Still running: the unfinished run a recovery claimed, with the batch of the step it was
    /// in, if any.
    Unfinished {
        record: RunRecord,
        batch: Option<ToolBatch>,
        run_state: PersistedState,
    },
    /// Still running, and not the run this activation continues: another activation drives
    /// it, or drove it until its process went away (a new run is refused or supersedes it).
    Busy {
        record: RunRecord,
        batch: Option<ToolBatch>,
    },
}

/// Loads the thread `start` runs on and classifies its latest run. A new run given an id some
/// run of the thread has is refused (`RunError::RunIdTaken`).
pub(super) async fn load(store: &dyn ThreadStore, start: &Start) -> Result<Stored, RunError> {
    let thread_id = start.thread_id();
    // An id the caller chose may be any earlier run's (the id source's ids are checked against
    // the latest run's, in `build`; a delegate tool checks its child thread's runs itself).
    // Read before the checkpoint, so that no part of it is held across this read.
    if let Start::Fresh(act) = start
        && let Some(run_id) = &act.run_id
        && act.parent_run_id.is_none()
    {
        let taken = store.load_run(thread_id, run_id).await;
        if taken.map_err(RunError::Store)?.is_some() {
            return Err(RunError::RunIdTaken {
                thread_id: thread_id.clone(),
                run_id: run_id.clone(),
            });
        }
    }
    let Some(cp) = store
        .load_checkpoint(thread_id)
        .await
        .map_err(RunError::Store)?
    else {
        return Ok(Stored::default());
    };
    let persisted = cp.message_count();
    let last_event_seq = cp.last_event_seq;
    let last_run_id = cp.run.as_ref().map(|r| r.run_id.clone());
    let recovering = match start {
        Start::Recover(claimed, ..) => Some(&claimed.run_id),
        _ => None,
    };
    let latest = match cp.run {
        Some(record) if record.status == RunStatus::Running => {
            if recovering == Some(&record.run_id) {
                Some(Latest::Unfinished {
                    batch: cp.batch,
                    record,
                    run_state: cp.run_state,
                })
            } else {
                Some(Latest::Busy {
                    record,
                    batch: cp.batch,
                })
            }
        }
        Some(record) if record.status == RunStatus::Waiting => {
            let batch = cp.batch.ok_or_else(|| RunError::StoredBatch {
                thread_id: thread_id.clone(),
                message: "the waiting run has no tool batch".into(),
            })?;
            Some(Latest::Waiting {
                record,
                batch,
                run_state: cp.run_state,
            })
        }
        _ => None,
    };
    Ok(Stored {
        history: cp.messages,
        persisted,
        last_event_seq,
        thread_state: Some(cp.thread_state),
        last_run_id,
        latest,
    })
}
