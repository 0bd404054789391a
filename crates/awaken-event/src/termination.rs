//! Why an activation ended.

use serde::{Deserialize, Serialize};

/// Why an activation ended. Typed, never a bare string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum TerminationReason {
    /// The model finished without asking for more tool calls.
    NaturalEnd,
    /// A stop condition or a plugin ended the run.
    Stopped {
        /// Machine-readable code (`max_rounds`, `token_budget`, `stop_tool`, ...).
        code: String,
        /// Human-readable detail.
        detail: String,
    },
    /// A tool call waits for an external decision; the run can be resumed.
    Suspended,
    /// The run was cancelled.
    Cancelled,
    /// The run failed.
    Error {
        /// What went wrong.
        message: String,
    },
}

impl TerminationReason {
    /// A `Stopped` reason.
    pub fn stopped(code: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::Stopped {
            code: code.into(),
            detail: detail.into(),
        }
    }

    /// An `Error` reason.
    pub fn error(message: impl Into<String>) -> Self {
        Self::Error {
            message: message.into(),
        }
    }

    /// Short name of the kind (`natural_end`, `stopped`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NaturalEnd => "natural_end",
            Self::Stopped { .. } => "stopped",
            Self::Suspended => "suspended",
            Self::Cancelled => "cancelled",
            Self::Error { .. } => "error",
        }
    }
}

impl std::fmt::Display for TerminationReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stopped { code, detail } => write!(f, "stopped ({code}): {detail}"),
            Self::Error { message } => write!(f, "error: {message}"),
            other => f.write_str(other.kind()),
        }
    }
}
