//! What a caller asks of a runtime: [`RunActivation`], a run of an agent on a thread, and
//! [`RecoverConfig`], how `recover` and `take_over` claim unfinished runs.

use awaken_event::{CancellationToken, Message, ProfileId, RunId, ThreadId};
use awaken_spec::InferenceOverride;

use crate::handle::RunHandle;
use crate::steering::Steering;

/// A request to run an agent on a thread.
#[derive(Debug, Clone)]
pub struct RunActivation {
    /// The thread.
    pub thread_id: ThreadId,
    /// The agent.
    pub agent_id: String,
    /// New messages (usually one user message).
    pub messages: Vec<Message>,
    /// The profile whose profile-scoped state the run sees.
    pub profile_id: Option<ProfileId>,
    /// A run-level inference override (between the agent's default and step overrides).
    pub inference: Option<InferenceOverride>,
    /// Cancels the run when cancelled.
    pub cancel: CancellationToken,
    /// Messages for the run while it is in flight, taken at its next step.
    pub steering: Steering,
    /// On a thread waiting for decisions: close its suspended calls as cancelled and start
    /// this run instead of refusing it.
    pub supersede: bool,
    /// The run's id, when the caller chose it (`with_run_id`) or derives it (a delegate's child
    /// run); else the id source's.
    pub(crate) run_id: Option<RunId>,
    /// The parent run of a delegate's child run.
    pub(crate) parent_run_id: Option<RunId>,
    /// How many delegations below its root run a delegate's child run is (0: a root run).
    pub(crate) delegation_depth: u32,
}

impl RunActivation {
    /// A run of `agent_id` on `thread_id` with no new messages.
    pub fn new(thread_id: ThreadId, agent_id: impl Into<String>) -> Self {
        Self {
            thread_id,
            agent_id: agent_id.into(),
            messages: Vec::new(),
            profile_id: None,
            inference: None,
            cancel: CancellationToken::new(),
            steering: Steering::new(),
            supersede: false,
            run_id: None,
            parent_run_id: None,
            delegation_depth: 0,
        }
    }

    /// Adds a user message.
    pub fn with_user_message(mut self, text: impl Into<String>) -> Self {
        self.messages.push(Message::user(text));
        self
    }

    /// Adds a message.
    pub fn with_message(mut self, message: Message) -> Self {
        self.messages.push(message);
        self
    }

    /// Sets the profile.
    pub fn with_profile(mut self, profile_id: ProfileId) -> Self {
        self.profile_id = Some(profile_id);
        self
    }

    /// Sets the run-level inference override.
    pub fn with_inference(mut self, inference: InferenceOverride) -> Self {
        self.inference = Some(inference);
        self
    }

    /// Supersedes the suspended calls of a waiting thread (they are closed as cancelled).
    pub fn with_supersede(mut self) -> Self {
        self.supersede = true;
        self
    }

    /// Gives the run `run_id` instead of an id from the runtime's id source, for a caller that
    /// must know the run's id before it starts (a queued run, whose id is chosen when it is
    /// enqueued; [`AgentRuntime::next_run_id`](crate::AgentRuntime::next_run_id) makes one).
    /// An id some run of the thread already has is refused with `RunError::RunIdTaken`; one a
    /// run of another thread has, by the store (`RunError::Commit`). An endpoint-backed agent's
    /// run gets the id too.
    pub fn with_run_id(mut self, run_id: RunId) -> Self {
        self.run_id = Some(run_id);
        self
    }

    /// A handle that cancels this run.
    pub fn handle(&self) -> RunHandle {
        RunHandle::new(self.cancel.clone())
    }

    /// The run's steering inbox: messages sent there while it is in flight are taken at its
    /// next step (see [`Steering`]).
    pub fn steering(&self) -> Steering {
        self.steering.clone()
    }

    /// Gives the run `steering` as its inbox (one the caller made beforehand).
    pub fn with_steering(mut self, steering: Steering) -> Self {
        self.steering = steering;
        self
    }
}

/// How `AgentRuntime::recover` and `AgentRuntime::take_over` claim runs.
#[derive(Debug, Clone)]
pub struct RecoverConfig {
    /// This worker's id (names the lease holder).
    pub worker_id: String,
    /// How long a claim lasts without a heartbeat (default 30 s).
    pub lease_duration: std::time::Duration,
    /// At most this many runs per call (default 64).
    pub limit: usize,
    /// Only runs of these agents (none: every agent); another agent's run is released at
    /// once, for a worker that has it.
    pub agents: Option<Vec<String>>,
    /// Cancels the recovered runs (each ends `Cancelled` with its checkpoint) and stops
    /// claiming more.
    pub cancel: CancellationToken,
    /// The inbox the first run a `recover` call continues takes its steering messages from,
    /// for a caller that recovers a run at a time and lets clients steer it (none: each run
    /// gets an inbox nobody else holds, as every later run of the call does). The run closes
    /// it as it ends: a config used for another call needs a new one.
    pub steering: Option<Steering>,
}

impl RecoverConfig {
    /// Defaults for `worker_id`.
    pub fn new(worker_id: impl Into<String>) -> Self {
        Self {
            worker_id: worker_id.into(),
            lease_duration: std::time::Duration::from_secs(30),
            limit: 64,
            agents: None,
            cancel: CancellationToken::new(),
            steering: None,
        }
    }

    /// Recovers only runs of these agents.
    pub fn with_agents(mut self, agents: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.agents = Some(agents.into_iter().map(Into::into).collect());
        self
    }

    /// Sets the token that cancels the recovery.
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }

    /// Sets the lease duration.
    pub fn with_lease_duration(mut self, duration: std::time::Duration) -> Self {
        self.lease_duration = duration;
        self
    }

    /// Sets the number of runs claimed per call.
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Sets the inbox of the first run a `recover` call continues.
    pub fn with_steering(mut self, steering: Steering) -> Self {
        self.steering = Some(steering);
        self
    }
}
