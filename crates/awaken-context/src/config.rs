//! The resolved configuration of the context plugins, built from an agent's `ContextPolicy`.

use awaken_spec::{ContextPolicy, ModelSpec, SpecError, TruncationStrategy};

/// Tokens kept free, in a summary model's window, for the summary instructions.
pub const SUMMARY_PROMPT_RESERVE: u64 = 512;

/// What the context transform enforces on every request.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextConfig {
    /// Most tokens a request may take, by the corrected estimate.
    pub budget: u64,
    /// What to do when the history does not fit.
    pub truncation: TruncationStrategy,
    /// Drop in coarse chunks (a quarter of the room for messages at a time) so the kept
    /// prefix stays byte-stable across steps and a provider's prompt cache keeps hitting.
    pub stable_prefix: bool,
    /// Compaction, when the policy sets a threshold.
    pub compaction: Option<CompactionConfig>,
}

/// When and how much the compaction plugin summarises.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompactionConfig {
    /// Fraction of the budget (0 < f ≤ 1) past which older history is summarised.
    pub threshold: f64,
    /// Most raw tokens (previous summary plus messages) handed to one summary call.
    pub summary_input_budget: u64,
    /// Most tokens a summary may take (the summary call's `max_tokens`).
    pub summary_max_tokens: u32,
}

impl CompactionConfig {
    /// The summary length for `threshold` of `budget`: a quarter of the threshold's tokens, at
    /// least 64 and at most 4,096, so a summary never fills the room it was made to free.
    pub fn default_summary_max_tokens(threshold: f64, budget: u64) -> u32 {
        let quarter = (threshold * budget as f64 / 4.0).floor() as u64;
        u32::try_from(quarter.clamp(64, 4_096)).unwrap_or(4_096)
    }
}

/// Why a context policy cannot be put to work. Each error names the policy field to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ContextConfigError {
    /// A field of the policy is invalid, or the budget cannot be derived from the model.
    #[error(transparent)]
    Policy(#[from] SpecError),
    /// The summary model is not in the model registry.
    #[error("context_policy.summary_model: model `{model_id}` is not registered")]
    SummaryModelNotFound {
        /// The model id.
        model_id: String,
    },
    /// The summary model's provider is not registered.
    #[error(
        "context_policy.summary_model: provider `{provider_id}` of model `{model_id}` is not registered"
    )]
    SummaryProviderNotFound {
        /// The model id.
        model_id: String,
        /// Its provider id.
        provider_id: String,
    },
    /// The summary model's window cannot hold a summary call.
    #[error(
        "context_policy.summary_model: model `{model_id}`'s context window of {window} tokens leaves no room for a summary of {summary_max_tokens} tokens"
    )]
    SummaryWindowTooSmall {
        /// The model id.
        model_id: String,
        /// Its context window.
        window: u64,
        /// The summary's length.
        summary_max_tokens: u32,
    },
    /// Compaction is configured but nothing can make summaries.
    #[error("context_policy.compaction_threshold: compaction is on but no summarizer was given")]
    MissingSummarizer,
}

impl ContextConfigError {
    /// The policy field the error is about (`context_policy.…`).
    pub fn field(&self) -> &str {
        match self {
            Self::Policy(SpecError::Invalid { field, .. }) => field,
            Self::Policy(_) => "context_policy",
            Self::SummaryModelNotFound { .. }
            | Self::SummaryProviderNotFound { .. }
            | Self::SummaryWindowTooSmall { .. } => "context_policy.summary_model",
            Self::MissingSummarizer => "context_policy.compaction_threshold",
        }
    }
}

impl ContextConfig {
    /// A configuration enforcing `budget` by dropping the oldest turns, without compaction.
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            truncation: TruncationStrategy::DropOldest,
            stable_prefix: false,
            compaction: None,
        }
    }

    /// Sets the truncation strategy.
    pub fn with_truncation(mut self, truncation: TruncationStrategy) -> Self {
        self.truncation = truncation;
        self
    }

    /// Sets `stable_prefix`.
    pub fn with_stable_prefix(mut self, stable: bool) -> Self {
        self.stable_prefix = stable;
        self
    }

    /// Turns compaction on.
    pub fn with_compaction(mut self, compaction: CompactionConfig) -> Self {
        self.compaction = Some(compaction);
        self
    }

    /// The configuration `policy` asks for, for an agent on `model`, summarising with
    /// `summary_model` (the agent's own model when the policy names none). Validates the
    /// policy; every error names its field.
    pub fn from_policy(
        policy: &ContextPolicy,
        model: &ModelSpec,
        summary_model: &ModelSpec,
    ) -> Result<Self, ContextConfigError> {
        policy.validate()?;
        let budget = policy.effective_budget(model)?;
        let compaction = match policy.compaction_threshold {
            None => None,
            Some(threshold) => {
                let mut summary_max_tokens =
                    CompactionConfig::default_summary_max_tokens(threshold, budget);
                if let Some(out) = summary_model.max_output_tokens {
                    summary_max_tokens =
                        summary_max_tokens.min(u32::try_from(out).unwrap_or(u32::MAX));
                }
                let summary_input_budget = match summary_model.context_window {
                    Some(window) => window
                        .checked_sub(u64::from(summary_max_tokens) + SUMMARY_PROMPT_RESERVE)
                        .filter(|room| *room > 0)
                        .ok_or_else(|| ContextConfigError::SummaryWindowTooSmall {
                            model_id: summary_model.id.clone(),
                            window,
                            summary_max_tokens,
                        })?,
                    None => budget,
                };
                Some(CompactionConfig {
                    threshold,
                    summary_input_budget,
                    summary_max_tokens,
                })
            }
        };
        Ok(Self {
            budget,
            truncation: policy.truncation,
            stable_prefix: policy.stable_prefix,
            compaction,
        })
    }
}
