//! Awaken's tool contract: the [`Tool`] trait and its [`ToolCallContext`], argument validation
//! against each tool's JSON Schema with a validator compiled once per tool
//! ([`RegisteredTool`]), a typed helper for tools with serde argument and output structs
//! ([`TypedTool`]), sets of tools that change while the process runs ([`ToolProvider`]),
//! tool-gate decisions and the priority that resolves them ([`ToolInterceptPayload`],
//! [`PolicyDecision`], [`resolve_gate_decisions`]), the canonical
//! argument digest that suspension tickets and resume decisions carry ([`argument_digest`]),
//! the [`ToolBatch`] whose calls move only as [`is_allowed_transition`] allows, and the
//! [`recovery_action`] that decides, as a pure function, what happens to an unfinished call
//! after a crash.
//!
//! This crate must never know the phase engine, the agent loop (it offers the pieces a runtime
//! drives: validate, gate, execute, record), plugins (the gate hooks that make decisions take a
//! phase context and live in `awaken-plugin`), or storage engines (a store keeps the batch as
//! it is or writes its serde form). It does no IO and reads no clock: ids, snapshots,
//! cancellation, progress sinks and timeouts come in as values. A tool's own `execute` may do
//! IO; that is the tool's business, not this crate's.

mod batch;
mod context;
mod digest;
mod error;
mod execute;
mod gate;
mod provider;
mod recovery;
mod schema_cost;
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
    GateConflict, GateDecision, GateResolution, InterceptKind, PolicyDecision,
    ToolInterceptPayload, call_digest, resolve_gate_decisions, suspension_id,
};
pub use provider::ToolProvider;
pub use recovery::{RecoveryAction, ToolRecoveryPolicy, recovery_action};
pub use tool::{Tool, ToolOutput, check_writes};
pub use typed::{TypedOutput, TypedTool, TypedToolAdapter};
pub use validate::{ArgumentValidator, RegisteredTool};

#[cfg(test)]
mod tests;
