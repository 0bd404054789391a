//! Context policy: how a long thread is fitted into the model's context window.

use serde::{Deserialize, Serialize};

use crate::error::SpecError;
use crate::model::ModelSpec;

/// What the context transform does when the history does not fit the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TruncationStrategy {
    /// Drop the oldest turns first (a tool call is never separated from its result) and tell
    /// the model that earlier context was omitted.
    #[default]
    DropOldest,
    /// Never drop anything: a request over the budget ends the run with a typed error.
    Fail,
}

fn default_output_reserve() -> u64 {
    4_096
}

/// How an agent's context is managed. Setting it adds the context-transform and compaction
/// plugins to the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextPolicy {
    /// Token budget for a request. Default: the model's context window minus
    /// `output_reserve_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<u64>,
    /// Tokens kept free for the response when the budget defaults from the window.
    #[serde(default = "default_output_reserve")]
    pub output_reserve_tokens: u64,
    /// What to do when the history does not fit.
    #[serde(default)]
    pub truncation: TruncationStrategy,
    /// Fraction of the budget (0 < f ≤ 1) at which older history is summarised; unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_threshold: Option<f64>,
    /// Model id used for summaries (default: the agent's own model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_model: Option<String>,
    /// Keep the request's prefix byte-stable across steps so providers can cache it.
    #[serde(default)]
    pub stable_prefix: bool,
}

impl Default for ContextPolicy {
    fn default() -> Self {
        Self {
            budget_tokens: None,
            output_reserve_tokens: default_output_reserve(),
            truncation: TruncationStrategy::default(),
            compaction_threshold: None,
            summary_model: None,
            stable_prefix: false,
        }
    }
}

impl ContextPolicy {
    /// Checks the fields, naming them under `context_policy.`.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.budget_tokens == Some(0) {
            return Err(SpecError::invalid(
                "context_policy.budget_tokens",
                "must be at least 1",
            ));
        }
        if let Some(t) = self.compaction_threshold
            && !(t > 0.0 && t <= 1.0)
        {
            return Err(SpecError::invalid(
                "context_policy.compaction_threshold",
                format!("{t} is outside (0, 1]"),
            ));
        }
        if let Some(m) = &self.summary_model
            && m.trim().is_empty()
        {
            return Err(SpecError::invalid(
                "context_policy.summary_model",
                "must not be blank",
            ));
        }
        Ok(())
    }

    /// The request budget for `model`: `budget_tokens` if set, else the model's context
    /// window minus the output reserve.
    pub fn effective_budget(&self, model: &ModelSpec) -> Result<u64, SpecError> {
        if let Some(b) = self.budget_tokens {
            return Ok(b);
        }
        let window = model.context_window.ok_or_else(|| {
            SpecError::invalid(
                "context_policy.budget_tokens",
                format!(
                    "not set, and model `{}` declares no context_window to derive it from",
                    model.id
                ),
            )
        })?;
        window
            .checked_sub(self.output_reserve_tokens)
            .filter(|b| *b > 0)
            .ok_or_else(|| {
                SpecError::invalid(
                    "context_policy.output_reserve_tokens",
                    format!(
                        "{} leaves no room in model `{}`'s context window of {window}",
                        self.output_reserve_tokens, model.id
                    ),
                )
            })
    }
}
