//! What an activation starts from: a new run's request, a resume's decisions, or an unfinished
//! run to continue.

use awaken_event::{CancellationToken, RunId, ThreadId};
use awaken_store::{ClaimedRun, LeaseToken};

use crate::request::RunActivation;
use crate::resume::Resume;
use crate::steering::Steering;

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
    /// by a delegate tool, with the token that cancels it and its steering inbox (a run
    /// `take_over` continues can have its caller's).
    Recover(Unfinished, CancellationToken, Steering),
}

impl Start {
    /// The thread the activation runs on.
    pub(super) fn thread_id(&self) -> &ThreadId {
        match self {
            Start::Fresh(act) => &act.thread_id,
            Start::Resume(resume) => &resume.thread_id,
            Start::Recover(claimed, ..) => &claimed.thread_id,
        }
    }

    /// The activation's span, `invoke_agent` with the OpenTelemetry GenAI attributes (the run
    /// id, and the agent of a resumed or recovered run, recorded once the run is built).
    pub(super) fn span(&self) -> tracing::Span {
        let (activation, agent) = match self {
            Start::Fresh(act) => ("run", Some(&*act.agent_id)),
            Start::Resume(_) => ("resume", None),
            Start::Recover(..) => ("recover", None),
        };
        tracing::info_span!(
            "invoke_agent",
            otel.name = agent.map(|a| tracing::field::display(format!("invoke_agent {a}"))),
            gen_ai.operation.name = "invoke_agent",
            gen_ai.agent.name = agent,
            gen_ai.conversation.id = %self.thread_id(),
            awaken.activation = activation,
            run_id = tracing::field::Empty,
        )
    }

    /// The token that cancels the activation.
    pub(super) fn cancel(&self) -> &CancellationToken {
        match self {
            Start::Fresh(act) => &act.cancel,
            Start::Resume(resume) => &resume.cancel,
            Start::Recover(_, cancel, _) => cancel,
        }
    }

    /// The activation's steering inbox.
    pub(super) fn steering(&self) -> &Steering {
        match self {
            Start::Fresh(act) => &act.steering,
            Start::Resume(resume) => &resume.steering,
            Start::Recover(_, _, steering) => steering,
        }
    }
}
