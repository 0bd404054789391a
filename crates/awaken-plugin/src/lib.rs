//! Awaken's plugin system: the [`Plugin`] trait with its
//! [`PluginManifest`] and [`CapabilityBound`], the [`PluginRegistrar`] (structural parts always
//! installed, behavioural parts only for active plugins), tool-gate hooks with the typed
//! policy hook and the runner that resolves a call's gates in plugin order ([`ToolGateHook`],
//! [`ToolPolicyHook`], [`evaluate_gates`]), [`InferenceRequestTransform`]s, [`ExecutionEnv`]
//! built in the one plugin order, config schemas, the lifecycle dispatcher, the
//! [`PluginRegistry`] with its agent definitions, loading (list, configurator, directory of
//! declarative manifests) and atomic reload. Every call into a plugin's code is isolated: a
//! panic comes back as the typed error of that entry point ([`isolate`], [`isolate_async`]).
//!
//! This crate must never know the agent loop, storage engines or HTTP; it may read plugin
//! directories (the loader) and use timers (lifecycle-hook timeouts).

mod config;
mod declarative;
mod env;
mod error;
mod gate;
mod hooks;
mod isolate;
mod lifecycle;
mod manifest;
mod order;
mod plugin;
mod registrar;
mod registry;
mod transform;

pub use config::{
    ConfigSchema, ConfigSchemaError, SectionReport, SectionStatus, SectionViolation,
    validate_sections,
};
pub use declarative::{DECLARATIVE_TRANSFORM, DeclarativePlugin, Reminder, load_dir};
pub use env::{ExecutionEnv, PluginTool, RegisteredGateHook};
pub use error::{ContributionKind, EnvError, LoadError, PluginError, RegistryError};
pub use gate::{FnGate, GateError, PolicyGate, ToolGateHook, ToolPolicyHook, evaluate_gates};
pub use hooks::{LifecycleHook, LifecycleHooks};
pub use isolate::{isolate, isolate_async};
pub use lifecycle::{DEFAULT_LIFECYCLE_TIMEOUT, HookStats, LifecycleDispatcher, LifecycleEvent};
pub use manifest::{CapabilityBound, PluginManifest};
pub use order::execution_order;
pub use plugin::{
    AgentBuildContext, AgentDefinition, DelegateCall, HookFuture, OnConflict, Plugin, RunLifecycle,
};
pub use registrar::PluginRegistrar;
pub use registry::{
    AgentConfigs, Configurator, PluginRegistry, PluginSet, RegisteredAgent, RegistrySnapshot,
    ReloadOutcome,
};
pub use transform::{
    InferenceRequestTransform, RegisteredTransform, TokenCounts, TransformContext, TransformError,
    TransformFailure, apply_transforms,
};
