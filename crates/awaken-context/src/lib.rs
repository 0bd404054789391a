//! Context management for Awaken agents, as two plugins the runtime adds when an agent's policy
//! asks for them: a thread of any length keeps working because every request is fitted into
//! the model's budget.
//!
//! - [`TokenEstimator`] counts tokens (the documented [`DefaultEstimator`] heuristic), and
//!   [`Calibration`] corrects it by the prompt tokens providers report; counts are cached per
//!   message for the run, so a step costs work proportional to its new messages.
//! - [`ContextTransformPlugin`] (a request transform) keeps the system prompt, the latest user
//!   message and the newest whole turns that fit, drops the oldest first (never a tool call
//!   without its result), says so with an omission marker, and refuses a request whose minimum
//!   does not fit with a typed error naming the sizes.
//! - [`CompactionPlugin`] summarises the older part of a thread past a threshold, through a
//!   [`Summarizer`] ([`LlmSummarizer`] over any executor), in a scheduled action; the summary
//!   is committed once to the `Thread`-scoped [`CompactionKey`] with how many leading messages
//!   it stands for, and the transform sends it instead of them.
//! - Both are configured by the agent's `ContextPolicy` ([`ContextConfig::from_policy`],
//!   [`ContextPlugins::for_agent`]); the runtime adds them only when the policy is set.
//!
//! This crate must never know the agent loop, the resolver, storage engines or HTTP: it sees
//! requests, phase contexts and state, and reaches models only through an `LlmExecutor` it is
//! given. Guide: `docs/context.md`.

mod compaction;
mod config;
mod core;
mod counts;
mod estimate;
mod failpoint;
mod keys;
mod plugins;
mod summarize;
mod transform;

pub use compaction::{
    COMPACTION_PLUGIN, Compact, CompactRange, CompactionFellBack, CompactionPlugin,
};
pub use config::{CompactionConfig, ContextConfig, ContextConfigError, SUMMARY_PROMPT_RESERVE};
pub use core::{
    OMISSION_MARKER_PREFIX, SUMMARY_PREFIX, is_omission_marker, is_summary_message,
    omission_marker, summary_message,
};
pub use estimate::{
    Calibration, CalibrationKey, DefaultEstimator, TokenEstimator, UsageSample, json_tokens,
    text_tokens,
};
pub use keys::{
    COMPACTION_RETRY_AFTER_MESSAGES, CompactionKey, CompactionState, CompactionUpdate,
    FixedTokensKey,
};
pub use plugins::{ContextPlugins, SummaryModels};
pub use summarize::{
    DEFAULT_SUMMARY_INSTRUCTIONS, LlmSummarizer, Summarizer, SummaryError, SummaryRequest,
    transcript,
};
pub use transform::{CONTEXT_TRANSFORM, CONTEXT_TRANSFORM_PLUGIN, ContextTransformPlugin};
