//! Models: which provider serves them, under what name, with what limits and prices.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{SpecError, parse_json, parse_toml};

/// An input or output modality a model supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Modality {
    /// Text.
    Text,
    /// Images.
    Image,
    /// Audio.
    Audio,
}

/// A model's knowledge cutoff, written `YYYY-MM` or `YYYY-MM-DD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KnowledgeCutoff {
    /// Year (1900..=9999).
    pub year: u16,
    /// Month (1..=12).
    pub month: u8,
    /// Day, when given (valid for the month).
    pub day: Option<u8>,
}

impl KnowledgeCutoff {
    /// Parses `YYYY-MM` or `YYYY-MM-DD`, checking month and day ranges (leap years included).
    pub fn parse(text: &str) -> Result<Self, SpecError> {
        let bad = |why: &str| {
            SpecError::invalid(
                "model.knowledge_cutoff",
                format!("{text:?} {why}; expected YYYY-MM or YYYY-MM-DD"),
            )
        };
        let parts: Vec<&str> = text.split('-').collect();
        if !(parts.len() == 2 || parts.len() == 3) {
            return Err(bad("has the wrong shape"));
        }
        let num = |s: &str, len: usize| -> Option<u16> {
            (s.len() == len && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        let year = num(parts[0], 4).ok_or_else(|| bad("has no four-digit year"))?;
        if year < 1900 {
            return Err(bad("has a year before 1900"));
        }
        let month = num(parts[1], 2).ok_or_else(|| bad("has no two-digit month"))?;
        if !(1..=12).contains(&month) {
            return Err(bad("has a month outside 01..=12"));
        }
        let month = month as u8;
        let day = match parts.get(2) {
            None => None,
            Some(d) => {
                let d = num(d, 2).ok_or_else(|| bad("has no two-digit day"))?;
                if d == 0 || d > u16::from(days_in_month(year, month)) {
                    return Err(bad("has a day that month does not have"));
                }
                Some(d as u8)
            }
        };
        Ok(Self { year, month, day })
    }
}

fn days_in_month(year: u16, month: u8) -> u8 {
    match month {
        2 if (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

impl std::fmt::Display for KnowledgeCutoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04}-{:02}", self.year, self.month)?;
        if let Some(d) = self.day {
            write!(f, "-{d:02}")?;
        }
        Ok(())
    }
}

impl Serialize for KnowledgeCutoff {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for KnowledgeCutoff {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        KnowledgeCutoff::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Prices in a currency unit per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenPrices {
    /// Per million input tokens.
    pub input_per_mtok: f64,
    /// Per million output tokens.
    pub output_per_mtok: f64,
    /// Per million cached input tokens, when the provider discounts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_per_mtok: Option<f64>,
}

fn default_modalities() -> Vec<Modality> {
    vec![Modality::Text]
}

/// A model an agent can name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// The id agents use.
    pub id: String,
    /// The provider (executor) id that serves it.
    pub provider: String,
    /// The provider-side model name.
    pub upstream_model: String,
    /// Context window in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// Maximum output tokens per response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    /// Supported modalities (default: text).
    #[serde(default = "default_modalities")]
    pub modalities: Vec<Modality>,
    /// Knowledge cutoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub knowledge_cutoff: Option<KnowledgeCutoff>,
    /// Token prices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<TokenPrices>,
}

impl ModelSpec {
    /// A text model served by `provider` under `upstream_model`.
    pub fn new(
        id: impl Into<String>,
        provider: impl Into<String>,
        upstream_model: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            provider: provider.into(),
            upstream_model: upstream_model.into(),
            context_window: None,
            max_output_tokens: None,
            modalities: default_modalities(),
            knowledge_cutoff: None,
            prices: None,
        }
    }

    /// Sets the context window.
    pub fn with_context_window(mut self, tokens: u64) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// Sets the maximum output tokens.
    pub fn with_max_output_tokens(mut self, tokens: u64) -> Self {
        self.max_output_tokens = Some(tokens);
        self
    }

    /// Sets the knowledge cutoff.
    pub fn with_knowledge_cutoff(mut self, cutoff: KnowledgeCutoff) -> Self {
        self.knowledge_cutoff = Some(cutoff);
        self
    }

    /// Sets the prices.
    pub fn with_prices(mut self, prices: TokenPrices) -> Self {
        self.prices = Some(prices);
        self
    }

    /// Checks the fields, naming them under `model.`.
    pub fn validate(&self) -> Result<(), SpecError> {
        for (field, value) in [
            ("model.id", &self.id),
            ("model.provider", &self.provider),
            ("model.upstream_model", &self.upstream_model),
        ] {
            if value.trim().is_empty() {
                return Err(SpecError::invalid(field, "must not be blank"));
            }
        }
        if self.context_window == Some(0) {
            return Err(SpecError::invalid(
                "model.context_window",
                "must be at least 1",
            ));
        }
        if let (Some(window), Some(out)) = (self.context_window, self.max_output_tokens)
            && out > window
        {
            return Err(SpecError::invalid(
                "model.max_output_tokens",
                format!("{out} exceeds the context window {window}"),
            ));
        }
        if self.modalities.is_empty() {
            return Err(SpecError::invalid(
                "model.modalities",
                "must list at least one modality",
            ));
        }
        if let Some(p) = &self.prices {
            let all = [
                Some(p.input_per_mtok),
                Some(p.output_per_mtok),
                p.cached_input_per_mtok,
            ];
            if all.iter().flatten().any(|v| !v.is_finite() || *v < 0.0) {
                return Err(SpecError::invalid(
                    "model.prices",
                    "prices must be finite and ≥ 0",
                ));
            }
        }
        Ok(())
    }

    /// Parses and validates a model from TOML.
    pub fn from_toml_str(text: &str) -> Result<Self, SpecError> {
        let spec: Self = parse_toml(text)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parses and validates a model from JSON.
    pub fn from_json_str(text: &str) -> Result<Self, SpecError> {
        let spec: Self = parse_json(text)?;
        spec.validate()?;
        Ok(spec)
    }
}
