//! Awaken, a Rust runtime for LLM agents: state that changes only through validated commits,
//! a phase engine for plugins, durable tool-call checkpoints and a neutral event stream.
//!
//! This umbrella crate re-exports each layer as a module (`awaken::event`, `awaken::spec`,
//! `awaken::state`, ...) plus a short [`prelude`]. Depend on it, or on a single sub-crate when
//! you need only one layer. It adds nothing of its own.

pub use awaken_event as event;
pub use awaken_spec as spec;
pub use awaken_state as state;

/// The names most programs need.
pub mod prelude {
    pub use awaken_event::{
        AgentEvent, EventSink, Message, RunId, TerminationReason, ThreadId, ToolCall, ToolCallId,
        ToolDescriptor, ToolResult,
    };
    pub use awaken_spec::{AgentSpec, ContextPolicy, InferenceOverride, ModelSpec};
}

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
