//! The one-run rule every backend keeps inside a commit's write: while a run of a thread is
//! unfinished (`Running` or `Waiting`) it holds the thread, and a commit of any other run to the
//! thread is refused with [`CommitError::ThreadBusy`]. The holder's own commits go through; once
//! one of them is `Done`, another run may start.
//!
//! A backend finds the holder while it holds the thread for its write, so two first commits of
//! two new runs cannot both find the thread free. Every backend looks at the thread's latest run:
//! the rule keeps an unfinished run the latest one (the SQL stores through [`HOLDER_QUERY`]). A
//! run an older build left unfinished behind a later one does not hold the thread; the recovery
//! that claims it closes it.

use awaken_event::{RunId, ThreadId};

use crate::commit::RunStatus;
use crate::error::CommitError;

/// Whether a run of `status` holds its thread.
#[inline]
pub(crate) fn holds(status: RunStatus) -> bool {
    status != RunStatus::Done
}

/// Whether a commit of a run stored on the commit's thread with `stored` status (`None`: the run
/// is new to the thread) must look for another run holding the thread: every commit but one of
/// an unfinished run, which holds the thread itself.
#[inline]
pub(crate) fn must_check(stored: Option<RunStatus>) -> bool {
    !stored.is_some_and(holds)
}

/// The refusal of a commit to `thread_id` while run `holder`, of `status`, holds it.
pub(crate) fn busy(thread_id: &ThreadId, holder: RunId, status: RunStatus) -> CommitError {
    CommitError::ThreadBusy {
        thread_id: thread_id.clone(),
        run_id: holder,
        status,
    }
}

/// The SQL stores' query for the run holding thread `$1`: its latest run, when unfinished (its
/// id and status). Two key lookups, through the thread row's `latest_run_id`: no index to keep
/// up on every run's start and end.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) const HOLDER_QUERY: &str = "SELECT r.run_id, r.status FROM threads t \
     JOIN runs r ON r.run_id = t.latest_run_id \
     WHERE t.thread_id = $1 AND r.status <> 'done'";
