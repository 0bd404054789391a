//! Errors of tool calls and of tool registration.

use std::fmt;
use std::time::Duration;

use awaken_event::{EffectClass, ToolCallState, ToolResult};
use serde::{Deserialize, Serialize};

use crate::recovery::ToolRecoveryPolicy;

/// One way the arguments break the tool's schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// JSON Pointer (RFC 6901) of the offending value inside the arguments; `""` is the
    /// arguments object itself.
    pub path: String,
    /// What is wrong, as the validator words it.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "(root)"
        } else {
            &self.path
        };
        write!(f, "at {path}: {}", self.message)
    }
}

/// Why a tool call failed. Every variant closes the call: [`ToolError::to_result`] is the
/// error result the model sees, [`ToolError::closing_state`] the batch state it ends in.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The arguments do not match the tool's schema (or its argument type); the tool did not
    /// run.
    #[error(
        "invalid arguments for tool `{tool_id}`: {}",
        render_violations(violations)
    )]
    InvalidArguments {
        /// The tool.
        tool_id: String,
        /// Every violation found, each with its JSON path.
        violations: Vec<Violation>,
    },
    /// The tool ran and failed; the message is shown to the model.
    #[error("{message}")]
    Execution {
        /// What went wrong, in words the model may see.
        message: String,
    },
    /// The call did not finish in time; it was abandoned (its effect may or may not have
    /// happened).
    #[error("tool `{tool_id}` timed out{}", after.map(|d| format!(" after {d:?}")).unwrap_or_default())]
    Timeout {
        /// The tool.
        tool_id: String,
        /// The limit, when it was given as a duration.
        after: Option<Duration>,
    },
    /// The run was cancelled while the call ran.
    #[error("tool `{tool_id}` was cancelled")]
    Cancelled {
        /// The tool.
        tool_id: String,
    },
    /// The tool panicked; the panic was caught and the call fails.
    #[error("tool `{tool_id}` panicked: {message}")]
    Panicked {
        /// The tool.
        tool_id: String,
        /// The panic payload when it was a string, else a placeholder.
        message: String,
    },
    /// The tool's command writes an `Exclusive` state key that its `writes()` does not declare.
    #[error("tool `{tool_id}` wrote the state key `{key}`, which it does not declare in writes()")]
    UndeclaredStateWrite {
        /// The tool.
        tool_id: String,
        /// The first undeclared key, in key-name order.
        key: String,
    },
}

impl ToolError {
    /// An [`ToolError::Execution`] error with a message the model sees.
    pub fn execution(message: impl Into<String>) -> Self {
        ToolError::Execution {
            message: message.into(),
        }
    }

    /// The error result the model sees for this failure (its text is the error's `Display`).
    pub fn to_result(&self) -> ToolResult {
        ToolResult::error(self.to_string())
    }

    /// The state the call's batch entry closes in: `Cancelled` for a cancelled call, `Failed`
    /// for everything else.
    pub fn closing_state(&self) -> ToolCallState {
        match self {
            ToolError::Cancelled { .. } => ToolCallState::Cancelled,
            _ => ToolCallState::Failed,
        }
    }
}

/// Why a tool cannot be registered. Raised once, when a [`crate::RegisteredTool`] is built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolRegistrationError {
    /// The descriptor's `parameters` is not a valid JSON Schema (or references something that
    /// cannot be resolved without IO).
    #[error("tool `{tool_id}` has an invalid argument schema at {schema_path}: {message}")]
    InvalidSchema {
        /// The tool.
        tool_id: String,
        /// JSON Pointer inside the schema where the problem is (`""` for the root).
        schema_path: String,
        /// The validator's message.
        message: String,
    },
    /// The declared recovery policy is not allowed for the tool's effect class (re-running a
    /// `SideEffecting` tool could do its effect twice).
    #[error(
        "tool `{tool_id}` declares recovery policy {policy:?}, which is not allowed for effect class {effect:?}"
    )]
    PolicyNotAllowed {
        /// The tool.
        tool_id: String,
        /// Its effect class.
        effect: EffectClass,
        /// The rejected policy.
        policy: ToolRecoveryPolicy,
    },
}

pub(crate) fn render_violations(violations: &[Violation]) -> String {
    let mut out = String::new();
    for (i, v) in violations.iter().enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        out.push_str(&v.to_string());
    }
    out
}
