//! Awaken's tool contract: the [`Tool`] trait and its [`ToolCallContext`], argument validation
//! against each tool's JSON Schema with a validator compiled once per tool
//! ([`RegisteredTool`]), a typed helper for tools with serde argument and output structs
//! ([`TypedTool`]), tool-gate hooks and the priority that resolves their decisions
//! ([`ToolGateHook`], [`ToolPolicyHook`], [`resolve_gate_decisions`]), the canonical argument
//! digest that suspension tickets and resume decisions carry ([`argument_digest`]), the
//! [`ToolBatch`] whose calls move only as [`is_allowed_transition`] allows, and the
//! [`recovery_action`] that decides, as a pure function, what happens to an unfinished call
//! after a crash.
//!
//! This crate must never know the agent loop (it offers the pieces a runtime drives: validate,
//! gate, execute, record), plugins (gate hooks are plain trait objects handed in plugin order),
//! or storage engines (the batch is serde data a store persists). It does no IO and reads no
//! clock: ids, snapshots, cancellation, progress sinks and timeouts come in as values. A tool's
//! own `execute` may do IO; that is the tool's business, not this crate's.

mod batch;
mod context;
mod digest;
mod error;
mod execute;
mod gate;
mod recovery;
mod tool;
mod typed;
mod validate;

pub use batch::{BatchCall, BatchError, OUTCOME_UNKNOWN_MESSAGE, ToolBatch, is_allowed_transition};
pub use context::{IdempotencyKey, NullProgress, ProgressSink, ToolCallContext, ToolCallScope};
pub use digest::{DIGEST_PREFIX, DigestWriter, argument_digest, canonical_json, pending_call};
pub use error::{ToolError, ToolRegistrationError, Violation};
#[cfg(feature = "time")]
pub use execute::execute_with_timeout;
pub use execute::{execute_guarded, execute_guarded_with_timeout};
pub use gate::{
    FnGate, GateConflict, GateDecision, GateError, GateResolution, InterceptKind, PolicyDecision,
    PolicyGate, ToolGateHook, ToolInterceptPayload, ToolPolicyHook, call_digest, evaluate_gates,
    resolve_gate_decisions, suspension_id,
};
pub use recovery::{RecoveryAction, ToolRecoveryPolicy, recovery_action};
pub use tool::{Tool, ToolOutput, check_writes};
pub use typed::{TypedOutput, TypedTool, TypedToolAdapter};
pub use validate::{ArgumentValidator, RegisteredTool};

#[cfg(test)]
mod tests;
