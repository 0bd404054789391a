//! Plugin configuration sections: section key → JSON, validated by the plugins that claim
//! them (against their JSON Schemas) at resolve time.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::duration::DurationSpec;
use crate::error::SpecError;

/// Config sections of an agent, keyed by section name.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Sections(BTreeMap<String, Value>);

impl Sections {
    /// No sections.
    pub fn new() -> Self {
        Self::default()
    }

    /// The raw value of a section.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key)
    }

    /// Sets a section, returning the previous value.
    pub fn insert(&mut self, key: impl Into<String>, value: Value) -> Option<Value> {
        self.0.insert(key.into(), value)
    }

    /// Decodes a section into its typed form; `Ok(None)` when it is absent.
    pub fn get_typed<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, SpecError> {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => T::deserialize(v)
                .map(Some)
                .map_err(|source| SpecError::Section {
                    section: key.to_owned(),
                    source,
                }),
        }
    }

    /// Section keys and values in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Section keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// Number of sections.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<(String, Value)> for Sections {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

/// The key of the section [`RetryConfig`] is read from (claimed by the resolver).
pub const RETRY_SECTION: &str = "retry";

/// The `retry` section: how the resolved model executor retries retryable errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Retries after the first attempt; 0 disables retrying.
    #[serde(default)]
    pub max_retries: u32,
    /// Backoff before the first retry.
    #[serde(default = "RetryConfig::default_initial_backoff")]
    pub initial_backoff: DurationSpec,
    /// The longest backoff.
    #[serde(default = "RetryConfig::default_max_backoff")]
    pub max_backoff: DurationSpec,
    /// Factor between consecutive backoffs, at least 1.
    #[serde(default = "RetryConfig::default_multiplier")]
    pub multiplier: f64,
    /// Whether to randomise each backoff (full jitter in its upper half).
    #[serde(default = "RetryConfig::default_jitter")]
    pub jitter: bool,
}

impl RetryConfig {
    fn default_initial_backoff() -> DurationSpec {
        DurationSpec::from_millis(500)
    }
    fn default_max_backoff() -> DurationSpec {
        DurationSpec::from_secs(30)
    }
    fn default_multiplier() -> f64 {
        2.0
    }
    fn default_jitter() -> bool {
        true
    }

    /// Checks the fields, naming them under `retry.`.
    pub fn validate(&self) -> Result<(), SpecError> {
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return Err(SpecError::invalid(
                "retry.multiplier",
                "must be a number ≥ 1",
            ));
        }
        if self.max_backoff < self.initial_backoff {
            return Err(SpecError::invalid(
                "retry.max_backoff",
                format!(
                    "{} is shorter than initial_backoff {}",
                    self.max_backoff, self.initial_backoff
                ),
            ));
        }
        Ok(())
    }
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_retries: 0,
            initial_backoff: Self::default_initial_backoff(),
            max_backoff: Self::default_max_backoff(),
            multiplier: Self::default_multiplier(),
            jitter: Self::default_jitter(),
        }
    }
}
