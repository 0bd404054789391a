//! What users configure, as serde data: [`AgentSpec`], [`ModelSpec`], [`ModelPoolSpec`],
//! [`ContextPolicy`], [`McpServerSpec`], [`InferenceOverride`] with its layered merge, stop conditions, tool
//! catalog rules, [`PermissionConfig`] (the `permission` section's typed form), [`RetryConfig`]
//! and config [`Sections`]. Every struct rejects unknown fields; validation names the field
//! that is wrong. TOML and JSON both parse.
//!
//! This crate must never execute anything or do IO: it is data, parsing and validation.

mod agent;
mod context;
mod duration;
mod error;
mod glob;
mod inference;
mod mcp;
mod model;
mod permission;
mod pool;
mod sections;

pub use agent::{AgentSpec, DEFAULT_MAX_ROUNDS, EndpointSpec, StopConditionSpec};
pub use context::{ContextPolicy, TruncationStrategy};
pub use duration::DurationSpec;
pub use error::{SpecError, SpecFormat, parse_json, parse_toml};
pub use glob::Glob;
pub use inference::{InferenceOverride, ReasoningEffort};
pub use mcp::{DEFAULT_MCP_TIMEOUT, McpServerSpec, McpTransportSpec};
pub use model::{KnowledgeCutoff, Modality, ModelSpec, TokenPrices};
pub use permission::{
    ArgMatcher, Comparison, PERMISSION_SECTION, PermissionConfig, PermissionDecision,
    PermissionRule, json_equal,
};
pub use pool::{
    DEFAULT_COOL_DOWN, DEFAULT_FAILURES_TO_OPEN, ModelPoolSpec, PoolBreakerSpec, PoolMemberSpec,
};
pub use sections::{RETRY_SECTION, RetryConfig, Sections};
