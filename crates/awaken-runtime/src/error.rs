//! [`RunError`]: why a run could not start, be resumed or be recovered, or could not record
//! its end.

use awaken_event::{RunId, ThreadId};
use awaken_resolver::ResolveError;
use awaken_state::StateError;
use awaken_store::{CommitError, RunStatus, StoreError};

use crate::outcome::RunOutcome;
use crate::resume::DecisionError;

/// Why a run could not start (or could not write its first commit or its last).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The agent did not resolve.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// A resume or recovery of an endpoint-backed agent's run: its backend owns that run.
    #[error(
        "agent `{agent_id}` runs on execution backend `{backend}`, which owns its runs: resume or recover them there"
    )]
    BackendPlan {
        /// The agent.
        agent_id: String,
        /// The backend.
        backend: String,
    },
    /// The execution backend of an endpoint-backed agent failed.
    #[error(transparent)]
    Backend(awaken_resolver::BackendError),
    /// The thread's last run waits for decisions on suspended tool calls (resume it, or
    /// supersede the calls).
    #[error(
        "thread `{thread_id}` is waiting: run `{run_id}` has suspended tool calls that need a decision: {}",
        calls.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    ThreadWaiting {
        /// The thread.
        thread_id: ThreadId,
        /// The waiting run.
        run_id: RunId,
        /// The calls waiting for a decision.
        calls: Vec<awaken_event::ToolCallId>,
    },
    /// The thread's last run is still running: one run at a time per thread. A new run may
    /// supersede it (closing it as cancelled) once the process that drove it is gone: its
    /// lease expired, or it never held one.
    #[error(
        "thread `{thread_id}` is busy: run `{run_id}` is {status}{}",
        if *lease_held {
            " and a live worker holds its lease (its process is still driving it)"
        } else {
            ""
        }
    )]
    ThreadBusy {
        /// The thread.
        thread_id: ThreadId,
        /// The run that holds it.
        run_id: RunId,
        /// That run's status.
        status: RunStatus,
        /// Whether a supersede was refused because the run's lease is held.
        lease_held: bool,
    },
    /// The thread's waiting run has no stored tool batch, or its recorded decisions do not
    /// decode.
    #[error("the stored tool batch of thread `{thread_id}` cannot be used: {message}")]
    StoredBatch {
        /// The thread.
        thread_id: ThreadId,
        /// Why.
        message: String,
    },
    /// `recover()` claimed a run the thread no longer holds as its unfinished run.
    #[error("run `{run_id}` of thread `{thread_id}` is not an unfinished run of the thread")]
    NotRecoverable {
        /// The thread.
        thread_id: ThreadId,
        /// The claimed run.
        run_id: RunId,
    },
    /// The runtime is shutting down and starts no activation.
    #[error("the runtime is shutting down")]
    ShuttingDown,
    /// Another worker holds the run's lease (it resumes or recovers the run): before the
    /// activation wrote anything, or at its end, when its last commit found the lease taken
    /// over (its events up to `RunFinish` were emitted).
    #[error("run `{run_id}` of thread `{thread_id}` is held by another worker")]
    TakenOver {
        /// The thread.
        thread_id: ThreadId,
        /// The run.
        run_id: RunId,
    },
    /// A new run was given the id of the thread's latest run (ids must be unique).
    #[error("thread `{thread_id}` already has a run `{run_id}`; a new run needs a new id")]
    RunIdTaken {
        /// The thread.
        thread_id: ThreadId,
        /// The id.
        run_id: RunId,
    },
    /// `resume` on a thread that is not waiting for decisions.
    #[error("thread `{thread_id}` has no run waiting for decisions")]
    NotWaiting {
        /// The thread.
        thread_id: ThreadId,
    },
    /// A decision was refused; none was applied.
    #[error("the decisions for thread `{thread_id}` were refused: {source}")]
    Decision {
        /// The thread.
        thread_id: ThreadId,
        /// Why.
        #[source]
        source: DecisionError,
    },
    /// The store failed: a read, or a claim of the run's lease.
    #[error("the thread store failed: {0}")]
    Store(#[source] StoreError),
    /// The stored state does not fit the agent's keys: the thread's, or its run's profile as
    /// reloaded after a conflict.
    #[error("the stored state of thread `{thread_id}` cannot be restored: {source}")]
    State {
        /// The thread.
        thread_id: ThreadId,
        /// Why.
        #[source]
        source: StateError,
    },
    /// The activation's first commit (the run's start, or the commit closing the superseded
    /// calls of a waiting run) was not written; nothing of the run was. A refusal
    /// ([`CommitError::is_refusal`]) says the thread or the run changed under the activation
    /// (a conflict, a lost lease) or the commit was invalid; `CommitError::Backend` that the
    /// store failed.
    #[error("the first commit of a run on thread `{thread_id}` was not written: {source}")]
    Commit {
        /// The thread.
        thread_id: ThreadId,
        /// Why.
        #[source]
        source: CommitError,
    },
    /// The run ended (`outcome`, its events emitted up to its `RunFinish`) but its last
    /// commit was not written: the store holds the run unfinished at its last checkpoint, where
    /// a recovery or a take-over continues it. `source` is why the commit failed. (A last
    /// commit refused because another worker took the run's lease over is
    /// [`RunError::TakenOver`]: that worker continues the run.)
    #[error(
        "run `{}` of thread `{thread_id}` ended ({}) but the store holds it unfinished at its \
         last checkpoint: {source}",
        outcome.run_id,
        outcome.termination
    )]
    EndNotWritten {
        /// The thread.
        thread_id: ThreadId,
        /// How the run ended in this process.
        outcome: Box<RunOutcome>,
        /// Why the last commit failed.
        #[source]
        source: CheckpointError,
    },
}

/// Why a commit of the run failed (nothing of it was written).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The store refused the commit, or failed.
    #[error("the commit was not written: {0}")]
    Commit(#[from] CommitError),
    /// After a profile conflict: the profile could not be reloaded.
    #[error("the profile could not be reloaded after a conflict: {0}")]
    Store(#[from] StoreError),
    /// After a profile conflict: the run's profile writes could not be redone on the fresh
    /// values.
    #[error("the profile writes could not be redone after a conflict: {0}")]
    State(#[from] StateError),
}
