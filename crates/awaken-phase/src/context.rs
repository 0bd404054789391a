//! What a hook, an action handler or a gate sees: the phase, a frozen snapshot and the run.

use std::sync::Arc;

use awaken_event::{
    CancellationToken, History, InferenceResponse, ProfileId, RunId, ThreadId, ToolCall,
    ToolCallResume, ToolResult,
};
use awaken_spec::Sections;
use awaken_state::Snapshot;

use crate::phase::Phase;

/// Who is running: the thread, run, agent, step and profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIdentity {
    /// The thread.
    pub thread_id: ThreadId,
    /// The run.
    pub run_id: RunId,
    /// The agent's id.
    pub agent_id: std::sync::Arc<str>,
    /// The profile, when the run has one.
    pub profile_id: Option<ProfileId>,
}

/// The tool call a tool-level phase is about.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPhaseInfo {
    /// The call (id, tool name, arguments).
    pub call: ToolCall,
    /// The result (`AfterToolExecute` only).
    pub result: Option<ToolResult>,
    /// A human's decision on this call, when it was suspended and resumed.
    pub resume: Option<ToolCallResume>,
    /// Whether the question `resume` answers was asked while the call ran (by its tool, such
    /// as a delegate relaying its child's question, or by recovery after a crash): the gates
    /// had let the call run before it waited, and the answer is about something else than
    /// their question.
    pub asked_while_running: bool,
}

/// The read-only context of one phase. Cheap to clone: everything is shared.
///
/// The snapshot is frozen: hooks of one GATHER all see the same one, and a hook's writes are
/// visible only after the phase commits. The engine replaces the snapshot (through
/// [`PhaseContext::with_snapshot`]) for deferred hooks and action handlers.
#[derive(Debug, Clone)]
pub struct PhaseContext {
    /// The phase.
    pub phase: Phase,
    /// The state this phase reads.
    pub snapshot: Snapshot,
    /// The agent's config sections.
    pub sections: Arc<Sections>,
    /// The run's identity.
    pub run: Arc<RunIdentity>,
    /// The current step (0 before the first).
    pub step: u32,
    /// The thread's history as the run sees it (shared, never copied per hook).
    pub messages: History,
    /// The call, for tool-level phases.
    pub tool: Option<Arc<ToolPhaseInfo>>,
    /// The model's response, for `AfterInference`.
    pub response: Option<Arc<InferenceResponse>>,
    /// Cancellation of the run.
    pub cancel: CancellationToken,
}

impl PhaseContext {
    /// A context for `phase` with no messages, tool or response.
    pub fn new(phase: Phase, snapshot: Snapshot, run: Arc<RunIdentity>) -> Self {
        Self {
            phase,
            snapshot,
            sections: Arc::new(Sections::new()),
            run,
            step: 0,
            messages: History::new(),
            tool: None,
            response: None,
            cancel: CancellationToken::new(),
        }
    }

    /// The same context for another phase.
    pub fn with_phase(mut self, phase: Phase) -> Self {
        self.phase = phase;
        self
    }

    /// The same context over another snapshot.
    pub fn with_snapshot(&self, snapshot: Snapshot) -> Self {
        // Field by field: `..self.clone()` would clone the old snapshot only to drop it.
        Self {
            phase: self.phase,
            snapshot,
            sections: self.sections.clone(),
            run: self.run.clone(),
            step: self.step,
            messages: self.messages.clone(),
            tool: self.tool.clone(),
            response: self.response.clone(),
            cancel: self.cancel.clone(),
        }
    }

    /// With the agent's sections.
    pub fn with_sections(mut self, sections: Arc<Sections>) -> Self {
        self.sections = sections;
        self
    }

    /// With the history.
    pub fn with_messages(mut self, messages: impl Into<History>) -> Self {
        self.messages = messages.into();
        self
    }

    /// With the step number.
    pub fn with_step(mut self, step: u32) -> Self {
        self.step = step;
        self
    }

    /// With the tool call (tool-level phases).
    pub fn with_tool(mut self, tool: ToolPhaseInfo) -> Self {
        self.tool = Some(Arc::new(tool));
        self
    }

    /// With the model's response (`AfterInference`).
    pub fn with_response(mut self, response: Arc<InferenceResponse>) -> Self {
        self.response = Some(response);
        self
    }

    /// With a cancellation token.
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }
}
