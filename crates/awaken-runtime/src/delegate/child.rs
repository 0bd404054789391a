//! Which child run a delegate call is: the tool id an agent calls a delegate by, the child
//! run's id (derived from the call's idempotency key, so a re-run after a crash finds the same
//! child) and thread, how many delegations below its root run it is, and the delegate call the
//! lifecycle hooks are told about.

use std::sync::Arc;

use awaken_event::{RunId, ThreadId, ToolCall, ToolCallId};
use awaken_phase::RunIdentity;
use awaken_plugin::DelegateCall;
use awaken_resolver::{ResolvedTool, ToolSource};
use awaken_state::{StateError, StateKey};
use awaken_tool::{IdempotencyKey, ToolError};

/// The tool id under which an agent calls `delegate`.
pub fn delegate_tool_id(delegate: &str) -> String {
    format!("delegate_{delegate}")
}

/// The state key holding how many delegations below its root run a run is: 0 (never written)
/// for a run a caller started, its parent's depth + 1 for a delegate's child run, written with
/// the child's first commit. Run-scoped, so a child continued after a crash or resumed after a
/// decision, in any process, keeps its depth.
pub struct DelegationDepthKey;

impl StateKey for DelegationDepthKey {
    const KEY: &'static str = "awaken.loop.delegation_depth";
    type Value = u32;
    type Update = u32;

    fn apply(value: &mut u32, depth: u32) -> Result<(), StateError> {
        *value = depth;
        Ok(())
    }
}

/// The child run's id for the delegate call with idempotency key `key`.
pub(crate) fn child_run_id(key: &str) -> Result<RunId, ToolError> {
    RunId::new(format!("child-{key}")).map_err(|e| ToolError::Execution {
        message: format!("no child run id: {e}"),
    })
}

/// The child run's thread for a parent thread's call: `<thread>/<call>` (or, when that is no
/// valid id, the child run's id).
pub(crate) fn child_thread_id(
    parent: &ThreadId,
    call: &ToolCallId,
    run: &RunId,
) -> Result<ThreadId, ToolError> {
    ThreadId::new(format!("{parent}/{call}"))
        .or_else(|_| ThreadId::new(run.as_str()))
        .map_err(|e| ToolError::Execution {
            message: format!("no child thread id: {e}"),
        })
}

/// The delegate call a call of `tool` is, if `tool` is a delegate tool.
/// (The call's idempotency key, a hash, is derived only for a delegate's call.)
pub(crate) fn delegate_call(
    identity: &Arc<RunIdentity>,
    tool: &ResolvedTool,
    call: &ToolCall,
) -> Option<DelegateCall> {
    let ToolSource::Delegate(agent_id) = &tool.source else {
        return None;
    };
    let key = IdempotencyKey::derive(&identity.thread_id, &identity.run_id, &call.id);
    Some(DelegateCall {
        parent: identity.clone(),
        call_id: call.id.clone(),
        agent_id: agent_id.clone(),
        child_run_id: child_run_id(key.as_str()).ok()?,
    })
}
