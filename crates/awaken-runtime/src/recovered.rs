//! What recovery continued: [`RecoveredRun`] for each run `recover` or `take_over`
//! continued, and [`Takeover`], what `take_over` found on its thread.

use awaken_event::{RunId, ThreadId};
use awaken_store::RunRecord;

use crate::error::RunError;
use crate::outcome::RunOutcome;

/// A run `AgentRuntime::recover` or `AgentRuntime::take_over` continued, and how its
/// continuation ended.
#[derive(Debug)]
pub struct RecoveredRun {
    /// Its thread.
    pub thread_id: ThreadId,
    /// The run.
    pub run_id: RunId,
    /// The continued activation's outcome.
    pub outcome: Result<RunOutcome, RunError>,
}

/// What [`AgentRuntime::take_over`](crate::AgentRuntime::take_over) did with the latest run of
/// its thread.
#[derive(Debug)]
#[non_exhaustive]
pub enum Takeover {
    /// The run was unfinished and its lease free or expired: this worker claimed it and
    /// continued it from its last checkpoint.
    Recovered(RecoveredRun),
    /// The run is unfinished, but another worker holds its lease: it drives the run, or its
    /// process died and the lease has not expired yet (it lasts the holder's lease duration
    /// past its last heartbeat). Nothing was run; try again later.
    Held {
        /// The run.
        run_id: RunId,
    },
    /// Nothing was continued: the thread has no run (`None`), or its latest run is finished,
    /// waiting for decisions (a resume continues it) or a delegate's child run (its parent's
    /// call continues it); or the take-over was cancelled before it claimed the run.
    Nothing {
        /// The thread's latest run.
        latest: Option<RunRecord>,
    },
}
