//! The tool-call vocabulary shared by events, phases, tools and stores: descriptors, results,
//! the states of a call in a tool batch, suspension tickets and resume decisions.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::ToolCallId;

/// What running a tool does to the world outside the thread. Decides the default recovery
/// policy after a crash: only `ReadOnly` and `Idempotent` calls may ever be re-run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectClass {
    /// Reads only; running it twice is harmless.
    ReadOnly,
    /// Writes, but running it again with the same idempotency key has no further effect.
    Idempotent,
    /// Writes; running it twice may do the effect twice. The default.
    #[default]
    SideEffecting,
}

/// What the model is told about a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDescriptor {
    /// The registry identity of the tool (unique within a resolved agent).
    pub id: String,
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object. Shared: every run's copy of the descriptor (and
    /// every request listing the tool) holds the same schema.
    #[serde(deserialize_with = "crate::shared::arc_value")]
    pub parameters: Arc<Value>,
    /// Its effect class.
    #[serde(default)]
    pub effect: EffectClass,
}

impl ToolDescriptor {
    /// A descriptor whose name equals its id, with an object schema accepting anything and
    /// the default (`SideEffecting`) effect class.
    pub fn new(id: impl Into<String>, description: impl Into<String>) -> Self {
        let id = id.into();
        Self {
            name: id.clone(),
            id,
            description: description.into(),
            parameters: Arc::new(serde_json::json!({ "type": "object" })),
            effect: EffectClass::SideEffecting,
        }
    }

    /// Sets the model-facing name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the arguments' JSON Schema.
    pub fn with_parameters(mut self, schema: impl Into<Arc<Value>>) -> Self {
        self.parameters = schema.into();
        self
    }

    /// Sets the effect class.
    pub fn with_effect(mut self, effect: EffectClass) -> Self {
        self.effect = effect;
        self
    }
}

/// How a tool call came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolResultStatus {
    /// The tool did its work.
    Success,
    /// The call failed; the content says why (the model sees it).
    Error,
    /// The call is waiting for something outside the run (an approval, a long job).
    Pending,
}

/// The result of one tool call, as the model will see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// Success, error or pending.
    pub status: ToolResultStatus,
    /// The content: any JSON; a string is shown to the model as text. Shared: the tool batch,
    /// the tool message and the call's `ToolCallDone` event hold the same value.
    #[serde(deserialize_with = "crate::shared::arc_value")]
    pub content: Arc<Value>,
}

impl ToolResult {
    /// A successful result.
    pub fn success(content: impl Into<Arc<Value>>) -> Self {
        Self {
            status: ToolResultStatus::Success,
            content: content.into(),
        }
    }

    /// An error result with a message the model sees.
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            status: ToolResultStatus::Error,
            content: Arc::new(Value::String(message.into())),
        }
    }

    /// A pending result.
    pub fn pending(content: impl Into<Arc<Value>>) -> Self {
        Self {
            status: ToolResultStatus::Pending,
            content: content.into(),
        }
    }

    /// Whether the status is [`ToolResultStatus::Error`].
    pub fn is_error(&self) -> bool {
        self.status == ToolResultStatus::Error
    }
}

/// The state of one call in a step's tool batch; `awaken_tool::is_allowed_transition` says
/// which moves between states a call may make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallState {
    /// Durably recorded; not yet allowed by the gate.
    Requested,
    /// Allowed and durably marked as started; the tool may have had effects.
    Executing,
    /// Waiting for an external decision.
    Suspended,
    /// The tool ran and succeeded.
    Succeeded,
    /// The tool ran (or its arguments were rejected) and failed.
    Failed,
    /// A gate blocked the call.
    Blocked,
    /// A gate supplied the result; the tool did not run.
    ShortCircuited,
    /// The call was cancelled or denied.
    Cancelled,
    /// The call was executing when the process stopped, and its recovery policy closed it
    /// without knowing whether its effect happened.
    OutcomeUnknown,
}

impl ToolCallState {
    /// Every state, in declaration order.
    pub const ALL: [ToolCallState; 9] = [
        ToolCallState::Requested,
        ToolCallState::Executing,
        ToolCallState::Suspended,
        ToolCallState::Succeeded,
        ToolCallState::Failed,
        ToolCallState::Blocked,
        ToolCallState::ShortCircuited,
        ToolCallState::Cancelled,
        ToolCallState::OutcomeUnknown,
    ];

    /// Whether no transition leaves this state.
    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::Requested | Self::Executing | Self::Suspended)
    }

    /// The state's snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requested => "requested",
            Self::Executing => "executing",
            Self::Suspended => "suspended",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Blocked => "blocked",
            Self::ShortCircuited => "short_circuited",
            Self::Cancelled => "cancelled",
            Self::OutcomeUnknown => "outcome_unknown",
        }
    }
}

impl std::fmt::Display for ToolCallState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an approved suspended call continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeMode {
    /// Run the call as it was requested (after the gates allow it again).
    #[default]
    Replay,
    /// Use the decision's payload as the call's result; the tool does not run.
    UseDecisionAsResult,
    /// Run the tool, handing it the decision's payload.
    PassDecisionToTool,
}

/// The call a suspension waits on, as shown to the human.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    /// The call's id.
    pub call_id: ToolCallId,
    /// The tool's name.
    pub tool_name: String,
    /// The arguments the decision applies to.
    pub arguments: Value,
    /// Canonical digest of `arguments` (stable across processes and key order); a decision
    /// must name the same digest.
    pub argument_digest: String,
}

/// Why and how a call waits for an external decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuspendTicket {
    /// Identifies this suspension (a call suspended twice gets two ids).
    pub suspension_id: String,
    /// The waiting call.
    pub call: PendingCall,
    /// The question for the human.
    pub message: String,
    /// JSON Schema of the expected answer payload, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_schema: Option<Value>,
    /// What an approval does.
    #[serde(default)]
    pub resume_mode: ResumeMode,
}

/// A human's decision on a suspended call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeDecision {
    /// Go ahead.
    Approve,
    /// Do not; the call is closed as cancelled and the model is told.
    Deny,
}

/// A decision for one suspended call, as handed to `resume`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallResume {
    /// The call it answers.
    pub call_id: ToolCallId,
    /// The digest of the arguments the human saw; must match the suspended call's.
    pub argument_digest: String,
    /// Approve or deny.
    pub decision: ResumeDecision,
    /// An answer payload (validated against the ticket's schema, if it has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
}

impl ToolCallResume {
    /// Approves `call` as shown (its digest).
    pub fn approve(call: &PendingCall) -> Self {
        Self {
            call_id: call.call_id.clone(),
            argument_digest: call.argument_digest.clone(),
            decision: ResumeDecision::Approve,
            payload: None,
        }
    }

    /// Denies `call` as shown (its digest).
    pub fn deny(call: &PendingCall) -> Self {
        Self {
            decision: ResumeDecision::Deny,
            ..Self::approve(call)
        }
    }

    /// Adds an answer payload.
    pub fn with_payload(mut self, payload: Value) -> Self {
        self.payload = Some(payload);
        self
    }
}
