//! What an activation starts from: a new run's request, a resume's decisions, or an unfinished
//! run to continue.

use awaken_event::{CancellationToken, RunId, ThreadId};
use awaken_store::{ClaimedRun, LeaseToken};

use crate::request::RunActivation;
use crate::resume::Resume;

/// An unfinished run to continue: claimed by `recover()` (with its lease) or found by a
/// delegate tool re-run after a crash (the parent's lease covers it).
pub(crate) struct Unfinished {
    pub(crate) thread_id: ThreadId,
    pub(crate) run_id: RunId,
    pub(crate) lease: Option<LeaseToken>,
}

impl From<ClaimedRun> for Unfinished {
    fn from(c: ClaimedRun) -> Self {
        Self {
            thread_id: c.thread_id,
            run_id: c.run.run_id,
            lease: Some(c.lease),
        }
    }
}

/// What an activation starts from.
pub(crate) enum Start {
    /// A new run with new messages.
    Fresh(RunActivation),
    /// The waiting run of a thread, with decisions.
    Resume(Resume),
    /// An unfinished run claimed by `recover()` (its lease held by this runtime) or continued
    /// by a delegate tool, with the token that cancels it.
    Recover(Unfinished, CancellationToken),
}

impl Start {
    /// The thread the activation runs on.
    pub(super) fn thread_id(&self) -> &ThreadId {
        match self {
            Start::Fresh(act) => &act.thread_id,
            Start::Resume(resume) => &resume.thread_id,
            Start::Recover(claimed, _) => &claimed.thread_id,
        }
    }

    /// The activation's span (its run id recorded once known, unless it already is).
    pub(super) fn span(&self) -> tracing::Span {
        match self {
            Start::Fresh(act) => tracing::info_span!(
                "run",
                thread_id = %act.thread_id,
                agent = %act.agent_id,
                run_id = tracing::field::Empty
            ),
            Start::Resume(resume) => tracing::info_span!(
                "resume",
                thread_id = %resume.thread_id,
                run_id = tracing::field::Empty
            ),
            Start::Recover(claimed, _) => tracing::info_span!(
                "recover",
                thread_id = %claimed.thread_id,
                run_id = %claimed.run_id
            ),
        }
    }

    /// The token that cancels the activation.
    pub(super) fn cancel(&self) -> &CancellationToken {
        match self {
            Start::Fresh(act) => &act.cancel,
            Start::Resume(resume) => &resume.cancel,
            Start::Recover(_, cancel) => cancel,
        }
    }
}
