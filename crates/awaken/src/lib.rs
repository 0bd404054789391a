//! Awaken, a Rust runtime for LLM agents: state that changes only through validated commits,
//! a phase engine for plugins, durable tool-call checkpoints and a neutral event stream.
//!
//! This umbrella crate re-exports each layer as a module (`awaken::event`, `awaken::spec`,
//! `awaken::state`, `awaken::phase`, `awaken::tool`, `awaken::llm`, `awaken::plugin`,
//! `awaken::context`, `awaken::resolver`, `awaken::runtime`) plus a short [`prelude`]. Depend
//! on it, or on a single sub-crate when you need only one layer. It adds nothing of its own.

pub use awaken_context as context;
pub use awaken_event as event;
pub use awaken_llm as llm;
pub use awaken_phase as phase;
pub use awaken_plugin as plugin;
pub use awaken_resolver as resolver;
pub use awaken_runtime as runtime;
pub use awaken_spec as spec;
pub use awaken_state as state;
pub use awaken_tool as tool;

/// The names most programs need.
pub mod prelude {
    pub use awaken_event::{
        AgentEvent, EventSink, Message, RunId, TerminationReason, ThreadId, ToolCall, ToolCallId,
        ToolDescriptor, ToolResult, VecSink,
    };
    pub use awaken_llm::{LlmExecutor, ScriptTurn, ScriptedExecutor};
    pub use awaken_plugin::{Plugin, PluginManifest, PluginRegistrar};
    pub use awaken_runtime::{AgentRuntime, AgentRuntimeBuilder, RunActivation, RunOutcome};
    pub use awaken_spec::{AgentSpec, ContextPolicy, InferenceOverride, ModelSpec};
    pub use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
}

// The README's Rust code blocks are compiled and run as doc tests, so the quickstart stays true.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::prelude::*;

    #[test]
    fn prelude_builds_an_agent_spec_and_events() {
        let spec = AgentSpec::new("assistant", "scripted").with_system_prompt("Be brief.");
        assert!(spec.validate().is_ok());
        let event = AgentEvent::TextDelta { delta: "hi".into() };
        assert_eq!(event.type_name(), "text_delta");
        assert_eq!(Message::user("hi").text(), "hi");
    }
}
