//! Per-request inference parameters and their layered merge: agent default < run override <
//! step override, field by field, the last non-empty value winning.

use serde::{Deserialize, Serialize};

use crate::error::SpecError;

/// How much effort a reasoning model should spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningEffort {
    /// No reasoning, where the model allows it.
    None,
    /// Minimal.
    Minimal,
    /// Low.
    Low,
    /// Medium.
    Medium,
    /// High.
    High,
}

impl ReasoningEffort {
    /// The wire name (`low`, `medium`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Minimal => "minimal",
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
        }
    }
}

/// Inference parameters that may be set per agent, per run and per step. Every field is
/// optional; `None` means "not set here".
///
/// `upstream_model` renames the model within the resolved provider; it never switches provider.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InferenceOverride {
    /// The provider-side model name to use instead of the model spec's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_model: Option<String>,
    /// Sampling temperature, 0 to 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Maximum output tokens, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Nucleus sampling, 0 to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Reasoning effort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<ReasoningEffort>,
}

impl InferenceOverride {
    /// Layers `later` over `self`: each field takes `later`'s value when it is set (and, for
    /// `upstream_model`, not blank), else keeps `self`'s. Associative, with the empty
    /// override as identity on both sides.
    pub fn merge(&self, later: &InferenceOverride) -> InferenceOverride {
        let upstream_model = match &later.upstream_model {
            Some(m) if !m.trim().is_empty() => Some(m.clone()),
            _ => self.upstream_model.clone(),
        };
        InferenceOverride {
            upstream_model,
            temperature: later.temperature.or(self.temperature),
            max_tokens: later.max_tokens.or(self.max_tokens),
            top_p: later.top_p.or(self.top_p),
            reasoning_effort: later.reasoning_effort.or(self.reasoning_effort),
        }
    }

    /// Merges layers in order (first is the lowest precedence).
    pub fn merge_all<'a>(layers: impl IntoIterator<Item = &'a InferenceOverride>) -> Self {
        layers
            .into_iter()
            .fold(InferenceOverride::default(), |acc, l| acc.merge(l))
    }

    /// Whether no field is set.
    pub fn is_empty(&self) -> bool {
        self == &InferenceOverride::default()
    }

    /// Checks ranges, naming the field under `prefix` (`agent.inference`, ...).
    pub fn validate(&self, prefix: &str) -> Result<(), SpecError> {
        if let Some(m) = &self.upstream_model
            && m.trim().is_empty()
        {
            return Err(SpecError::invalid(
                format!("{prefix}.upstream_model"),
                "must not be blank (leave it out to keep the model's own name)",
            ));
        }
        if let Some(t) = self.temperature
            && !(0.0..=2.0).contains(&t)
        {
            return Err(SpecError::invalid(
                format!("{prefix}.temperature"),
                format!("{t} is outside 0.0..=2.0"),
            ));
        }
        if let Some(p) = self.top_p
            && !(0.0..=1.0).contains(&p)
        {
            return Err(SpecError::invalid(
                format!("{prefix}.top_p"),
                format!("{p} is outside 0.0..=1.0"),
            ));
        }
        if self.max_tokens == Some(0) {
            return Err(SpecError::invalid(
                format!("{prefix}.max_tokens"),
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// Sets `upstream_model`.
    pub fn with_upstream_model(mut self, model: impl Into<String>) -> Self {
        self.upstream_model = Some(model.into());
        self
    }

    /// Sets `temperature`.
    pub fn with_temperature(mut self, t: f64) -> Self {
        self.temperature = Some(t);
        self
    }

    /// Sets `max_tokens`.
    pub fn with_max_tokens(mut self, n: u32) -> Self {
        self.max_tokens = Some(n);
        self
    }

    /// Sets `top_p`.
    pub fn with_top_p(mut self, p: f64) -> Self {
        self.top_p = Some(p);
        self
    }

    /// Sets `reasoning_effort`.
    pub fn with_reasoning_effort(mut self, e: ReasoningEffort) -> Self {
        self.reasoning_effort = Some(e);
        self
    }
}
