//! Tools that come and go while the process runs: a [`ToolProvider`] is asked for its tools at
//! each resolution of an agent.

use std::sync::Arc;

use crate::validate::RegisteredTool;

/// A set of tools that may change while the process runs, such as the tools an MCP server
/// offers. The resolver asks for them at every resolution, so a change applies to the next run
/// while a run in progress keeps the list it was resolved with.
///
/// The tools take part in resolution like global ones: their ids must not clash with any other
/// tool of the agent, and the agent's catalog filters and permission rules apply to them.
pub trait ToolProvider: Send + Sync + 'static {
    /// The provider's id; resolution errors name the source of its tools `provider:{id}`.
    fn id(&self) -> &str;

    /// The tools offered now. Called at every resolution, possibly from many threads at once:
    /// it must not block or do IO (keep a snapshot and hand out a shared copy of it).
    fn tools(&self) -> Arc<[RegisteredTool]>;
}
