//! The nine phases one run drives, in order.

use serde::{Deserialize, Serialize};

/// A point in a run where plugins act. Run-level: `RunStart`, `RunEnd`; per step:
/// `StepStart`, `BeforeInference`, `AfterInference`, `StepEnd`; per tool call: `ToolGate`,
/// `BeforeToolExecute`, `AfterToolExecute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Once, when an activation starts (after `on_activate`).
    RunStart,
    /// At the start of every step.
    StepStart,
    /// Before the request goes to the model (actions here shape the request).
    BeforeInference,
    /// After the model's response is in.
    AfterInference,
    /// Per tool call: the gate decides allow / block / suspend / set result. Driven through
    /// gate hooks, never through phase hooks or actions.
    ToolGate,
    /// Per tool call, once, after the final allow and before the tool runs.
    BeforeToolExecute,
    /// Per tool call, after its result.
    AfterToolExecute,
    /// At the end of every step.
    StepEnd,
    /// Once, when the run ends (not when it suspends).
    RunEnd,
}

/// A phase name that is not one of the nine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown phase {name:?}; expected one of run_start, step_start, before_inference, after_inference, tool_gate, before_tool_execute, after_tool_execute, step_end, run_end"
)]
pub struct UnknownPhase {
    /// The name given.
    pub name: String,
}

impl Phase {
    /// Every phase, in the order a run drives them.
    pub const ALL: [Phase; 9] = [
        Phase::RunStart,
        Phase::StepStart,
        Phase::BeforeInference,
        Phase::AfterInference,
        Phase::ToolGate,
        Phase::BeforeToolExecute,
        Phase::AfterToolExecute,
        Phase::StepEnd,
        Phase::RunEnd,
    ];

    /// The snake_case name (as in serde and in scheduled actions).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::RunStart => "run_start",
            Phase::StepStart => "step_start",
            Phase::BeforeInference => "before_inference",
            Phase::AfterInference => "after_inference",
            Phase::ToolGate => "tool_gate",
            Phase::BeforeToolExecute => "before_tool_execute",
            Phase::AfterToolExecute => "after_tool_execute",
            Phase::StepEnd => "step_end",
            Phase::RunEnd => "run_end",
        }
    }

    /// `RunStart` and `RunEnd`.
    pub fn is_run_level(self) -> bool {
        matches!(self, Phase::RunStart | Phase::RunEnd)
    }

    /// Every phase that runs once or more per step (all but the run-level ones).
    pub fn is_step_level(self) -> bool {
        !self.is_run_level()
    }

    /// The three per-tool-call phases.
    pub fn is_tool_level(self) -> bool {
        matches!(
            self,
            Phase::ToolGate | Phase::BeforeToolExecute | Phase::AfterToolExecute
        )
    }
}

impl std::str::FromStr for Phase {
    type Err = UnknownPhase;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Phase::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownPhase { name: s.to_owned() })
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
