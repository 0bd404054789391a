//! Awaken, a Rust runtime for LLM agents: state that changes only through validated commits,
//! a phase engine for plugins, durable tool-call checkpoints and a neutral event stream.
//!
//! This umbrella crate re-exports each layer as a module (`awaken::event`, `awaken::spec`,
//! `awaken::state`, `awaken::phase`, `awaken::tool`, `awaken::llm`, `awaken::plugin`,
//! `awaken::context`, `awaken::resolver`, `awaken::store`, `awaken::runtime`) plus a
//! [`prelude`] with which an agent, a plugin, a durable run and a resume are written without
//! naming a sub-crate. It adds nothing of its own.
//!
//! Features: `openai` (default; the OpenAI-compatible executor), `anthropic` (the Anthropic
//! Messages executor), `sqlite` (default; the
//! embedded [`store::SqliteStore`]) and `postgres` ([`store::PostgresStore`], several workers on
//! one database), `server` (`awaken::server`: the HTTP server with its `/v1` API and resumable
//! event streams), `mcp` (`awaken::mcp`: the tools of MCP servers, registered with
//! `AgentRuntimeBuilder::with_tool_provider`), `a2a` (`awaken::a2a`: remote agents over the
//! Agent2Agent protocol, registered with `AgentRuntimeBuilder::with_backend`). Without a store
//! feature, runs are kept in [`store::MemoryStore`].
//!
//! # A plugin with a key and a hook
//!
//! A plugin declares state keys and phase hooks through its registrar. Hooks read a frozen
//! snapshot and return a [`StateCommand`](state::StateCommand); the runtime commits it.
//!
//! ```
//! use std::sync::Arc;
//!
//! use awaken::prelude::*;
//! use serde_json::json;
//!
//! /// How many steps the thread's runs have taken.
//! struct StepsTaken;
//!
//! impl StateKey for StepsTaken {
//!     const KEY: &'static str = "notes.steps_taken";
//!     type Value = u64;
//!     type Update = u64;
//!     fn apply(value: &mut u64, update: u64) -> Result<(), StateError> {
//!         *value += update;
//!         Ok(())
//!     }
//! }
//!
//! struct StepCounter(PluginManifest);
//!
//! impl Plugin for StepCounter {
//!     fn manifest(&self) -> &PluginManifest {
//!         &self.0
//!     }
//!     fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
//!         r.register_key::<StepsTaken>(KeyOptions::new().with_scope(KeyScope::Thread))?;
//!         r.register_phase_hook(
//!             Phase::StepEnd,
//!             "count",
//!             Arc::new(FnHook(|_ctx: &PhaseContext| {
//!                 Ok(StateCommand::new().with_update::<StepsTaken>(1))
//!             })),
//!         )
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = AgentRuntime::builder()
//!     .with_model(ModelSpec::new("default", "scripted", "scripted-1"))
//!     .with_provider("scripted", Arc::new(ScriptedExecutor::from_turns([ScriptTurn::text("Hi.")])?))
//!     .with_plugin(Arc::new(StepCounter(PluginManifest::new("step-counter"))))
//!     .with_agent_spec(AgentSpec::new("assistant", "default").with_plugin("step-counter"))
//!     .build()?;
//! let thread = ThreadId::new("thread-1")?;
//! runtime
//!     .run_to_completion(RunActivation::new(thread.clone(), "assistant").with_user_message("Hello"))
//!     .await?;
//!
//! // The thread-scoped key was committed with the run.
//! let stored = runtime.store().load_checkpoint(&thread).await?.expect("a stored thread");
//! assert_eq!(stored.thread_state.values["notes.steps_taken"], json!(1));
//! # Ok(())
//! # }
//! ```
//!
//! # A durable run on SQLite, resumed in another process
//!
//! With a [`store::SqliteStore`], every checkpoint of a run is committed to one file. Here the
//! standard permission plugin asks before `echo` runs, so the run ends waiting; a second
//! runtime on the same file (another process, say, after a restart) reads the waiting call and
//! resumes the run with the human's approval.
//!
//! ```
//! use std::sync::Arc;
//!
//! use async_trait::async_trait;
//! use awaken::prelude::*;
//! use serde_json::{Value, json};
//!
//! struct Echo;
//!
//! #[async_trait]
//! impl Tool for Echo {
//!     fn descriptor(&self) -> ToolDescriptor {
//!         ToolDescriptor::new("echo", "Repeat the text back")
//!     }
//!     async fn execute(&self, args: &Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
//!         Ok(ToolOutput::success(json!({"echoed": args["text"]})))
//!     }
//! }
//!
//! /// A runtime over the SQLite file at `path` whose model answers with `turns`.
//! async fn runtime(
//!     path: &std::path::Path,
//!     turns: Vec<ScriptTurn>,
//! ) -> Result<AgentRuntime, Box<dyn std::error::Error>> {
//!     let model = ScriptedExecutor::from_turns(turns)?;
//!     let store = SqliteStore::open(SqliteConfig::file(path)).await?;
//!     Ok(AgentRuntime::builder()
//!         .with_store(Arc::new(store))
//!         .with_model(ModelSpec::new("default", "scripted", "scripted-1"))
//!         .with_provider("scripted", Arc::new(model))
//!         .with_tool(Arc::new(Echo))
//!         .with_agent_spec(
//!             AgentSpec::new("assistant", "default")
//!                 .with_plugin(PERMISSION_PLUGIN)
//!                 .with_section("permission", json!({"default": "ask"})),
//!         )
//!         .build()?)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos();
//! # let dir = std::env::temp_dir().join(format!("awaken-doc-{}-{nanos}", std::process::id()));
//! # let _ = std::fs::remove_dir_all(&dir);
//! # std::fs::create_dir_all(&dir)?;
//! let path = dir.join("threads.db");
//! let thread = ThreadId::new("thread-1")?;
//!
//! let first = runtime(&path, vec![ScriptTurn::tool_call("echo", json!({"text": "hello"}))]).await?;
//! let run = RunActivation::new(thread.clone(), "assistant").with_user_message("Say hello");
//! let outcome = first.run_to_completion(run).await?;
//! assert_eq!(outcome.termination, TerminationReason::Suspended);
//! drop(first);
//!
//! let second = runtime(&path, vec![ScriptTurn::text("Done.")]).await?;
//! let waiting = second.waiting_calls(&thread).await?;
//! assert_eq!(waiting.len(), 1);
//! let approval = ToolCallResume::approve(&waiting[0].call);
//! let sink = VecSink::new();
//! let outcome = second
//!     .resume(Resume::new(thread.clone()).with_decision(approval), &sink)
//!     .await?;
//! assert_eq!(outcome.termination, TerminationReason::NaturalEnd);
//! assert_eq!(outcome.response.as_deref(), Some("Done."));
//! assert!(awaken::event::check_activation(&sink.events()).is_ok());
//! # drop(second);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "a2a")]
pub use awaken_a2a as a2a;
pub use awaken_context as context;
pub use awaken_event as event;
pub use awaken_llm as llm;
#[cfg(feature = "mcp")]
pub use awaken_mcp as mcp;
#[cfg(feature = "net")]
pub use awaken_net as net;
pub use awaken_phase as phase;
pub use awaken_plugin as plugin;
pub use awaken_resolver as resolver;
pub use awaken_runtime as runtime;
#[cfg(feature = "server")]
pub use awaken_server as server;
pub use awaken_spec as spec;
pub use awaken_state as state;
pub use awaken_store as store;
pub use awaken_tool as tool;

/// The names most programs need: to build and run an agent, write a tool or a plugin, keep
/// runs in a store and resume them.
pub mod prelude {
    pub use awaken_event::{
        AgentEvent, EventSink, Message, ProfileId, RunId, SuspendTicket, TerminationReason,
        ThreadId, ToolCall, ToolCallId, ToolCallResume, ToolDescriptor, ToolResult, VecSink,
    };
    pub use awaken_llm::{LlmExecutor, ScriptToolCall, ScriptTurn, ScriptedExecutor};
    pub use awaken_phase::{FnHook, Phase, PhaseContext};
    pub use awaken_plugin::{Plugin, PluginError, PluginManifest, PluginRegistrar};
    pub use awaken_runtime::{
        AgentRuntime, AgentRuntimeBuilder, PERMISSION_PLUGIN, RecoverConfig, Resume, RunActivation,
        RunError, RunHandle, RunOutcome,
    };
    pub use awaken_spec::{AgentSpec, ContextPolicy, InferenceOverride, ModelSpec};
    pub use awaken_state::{KeyOptions, KeyScope, StateCommand, StateError, StateKey};
    pub use awaken_store::{MemoryStore, ThreadStore};
    #[cfg(feature = "postgres")]
    pub use awaken_store::{PostgresConfig, PostgresStore};
    #[cfg(feature = "sqlite")]
    pub use awaken_store::{SqliteConfig, SqliteStore};
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
