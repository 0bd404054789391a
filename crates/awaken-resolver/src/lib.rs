//! Awaken's resolver: turns an agent id into a runnable plan, afresh for every run, in three
//! all-or-nothing stages — lookup (spec, model or model pool, executor, retry), plugin pipeline
//! (the agent's plugins, the runtime's built-ins, config sections, `ExecutionEnv`) and tool
//! pipeline (global, delegate and plugin tools, id conflicts, the catalog filter). Also the five
//! registries with deferred errors and the model pools built from them, validation of
//! everything registered (errors, and warnings such as delegation cycles), and the injection
//! points the runtime fills
//! ([`BuiltinPlugins`], [`DelegateToolFactory`], [`ExecutionBackend`]).
//!
//! This crate must never know the agent loop or storage engines, and does no IO.

mod catalog;
mod cycles;
mod error;
mod pools;
mod registries;
mod resolver;

pub use catalog::{CatalogOutcome, filter_catalog};
pub use error::{
    ModelPoolError, ModelResolveError, RegistrationError, ResolveError, ResolveWarning,
    ValidationFailed, ValidationProblem, ValidationWarning,
};
pub use pools::{PoolMembership, RecordedMember, ResolvedModel};
pub use registries::{
    AgentSpecRegistry, MapAgentSpecRegistry, MapModelRegistry, MapPluginSource,
    MapProviderRegistry, MapToolRegistry, ModelRegistry, PluginSource, ProviderRegistry,
    Registries, ToolRegistry,
};
pub use resolver::{
    BackendError, BackendOutcome, BackendRequest, BuiltinPlugins, DelegateToolFactory,
    ExecutionBackend, NoBuiltins, RESOLVER_PLUGIN_ID, ResolvedAgent, ResolvedBackendAgent,
    ResolvedRunPlan, ResolvedTool, Resolver, ToolSource,
};
