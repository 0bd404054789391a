//! Model pools: several models served as one model id, with their weights, the members tried
//! only after the others, and the circuit breaker each member sits behind.

use serde::{Deserialize, Serialize};

use crate::duration::DurationSpec;
use crate::error::{SpecError, parse_json, parse_toml};

/// How many failures in a row open a member's breaker when a pool says nothing.
pub const DEFAULT_FAILURES_TO_OPEN: u32 = 5;

/// How long an open breaker skips its member when a pool says nothing (30 s).
pub const DEFAULT_COOL_DOWN: DurationSpec = DurationSpec(std::time::Duration::from_secs(30));

fn default_weight() -> u32 {
    1
}

fn default_failures_to_open() -> u32 {
    DEFAULT_FAILURES_TO_OPEN
}

fn default_cool_down() -> DurationSpec {
    DEFAULT_COOL_DOWN
}

/// One member of a [`ModelPoolSpec`]: a model id (of a model, never of another pool).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolMemberSpec {
    /// The member's model id.
    pub model: String,
    /// Its share of the threads against the other members that take traffic first (weight
    /// over the sum of their weights); at least 1. Default 1.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Whether it is tried only after every other member, in declared order. Default false.
    #[serde(default)]
    pub fallback_only: bool,
}

impl PoolMemberSpec {
    /// Model `model` with weight 1, taking traffic first.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            weight: 1,
            fallback_only: false,
        }
    }

    /// Sets the weight.
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// Makes the member fallback-only.
    pub fn fallback_only(mut self) -> Self {
        self.fallback_only = true;
        self
    }
}

/// A pool's circuit breaker, the same for every member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolBreakerSpec {
    /// Failures in a row that open a member's breaker (at least 1). Default 5.
    #[serde(default = "default_failures_to_open")]
    pub failures_to_open: u32,
    /// How long an open breaker skips its member before one trial request. Default 30 s.
    #[serde(default = "default_cool_down")]
    pub cool_down: DurationSpec,
}

impl Default for PoolBreakerSpec {
    fn default() -> Self {
        Self {
            failures_to_open: DEFAULT_FAILURES_TO_OPEN,
            cool_down: DEFAULT_COOL_DOWN,
        }
    }
}

/// A model pool: an id agents name like a model id, served by its member models with
/// per-thread affinity, failover and a circuit breaker per member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPoolSpec {
    /// The id agents use (it shares the namespace of model ids).
    pub id: String,
    /// The members, in declared order (the order fallback-only members are tried in).
    pub members: Vec<PoolMemberSpec>,
    /// The breaker of every member (default: 5 failures open it for 30 s).
    #[serde(default)]
    pub breaker: PoolBreakerSpec,
}

impl ModelPoolSpec {
    /// A pool `id` over `members`, with the default breaker.
    pub fn new(id: impl Into<String>, members: impl IntoIterator<Item = PoolMemberSpec>) -> Self {
        Self {
            id: id.into(),
            members: members.into_iter().collect(),
            breaker: PoolBreakerSpec::default(),
        }
    }

    /// Sets the breaker.
    pub fn with_breaker(mut self, breaker: PoolBreakerSpec) -> Self {
        self.breaker = breaker;
        self
    }

    /// Checks what a pool needs of itself, naming fields under `model_pool.`: an id that is
    /// not blank, at least one member, no blank or repeated member model, no weight of 0, at
    /// least one member that is not fallback-only, and a `breaker.failures_to_open` of at
    /// least one. Whether each member names a registered model is checked where models are
    /// registered.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.id.trim().is_empty() {
            return Err(SpecError::invalid("model_pool.id", "must not be blank"));
        }
        if self.members.is_empty() {
            return Err(SpecError::invalid(
                "model_pool.members",
                "must list at least one member",
            ));
        }
        for (i, member) in self.members.iter().enumerate() {
            if member.model.trim().is_empty() {
                return Err(SpecError::invalid(
                    format!("model_pool.members[{i}].model"),
                    "must not be blank",
                ));
            }
            if let Some(first) = self.members[..i]
                .iter()
                .position(|m| m.model == member.model)
            {
                return Err(SpecError::invalid(
                    format!("model_pool.members[{i}].model"),
                    format!(
                        "`{}` is listed already (members[{first}]); a model is a member once",
                        member.model
                    ),
                ));
            }
            if member.weight == 0 {
                return Err(SpecError::invalid(
                    format!("model_pool.members[{i}].weight"),
                    "must be at least 1",
                ));
            }
        }
        if self.members.iter().all(|m| m.fallback_only) {
            return Err(SpecError::invalid(
                "model_pool.members",
                "every member is fallback_only; at least one must take traffic first",
            ));
        }
        if self.breaker.failures_to_open == 0 {
            return Err(SpecError::invalid(
                "model_pool.breaker.failures_to_open",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// Parses and validates a pool from TOML.
    pub fn from_toml_str(text: &str) -> Result<Self, SpecError> {
        let spec: Self = parse_toml(text)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parses and validates a pool from JSON.
    pub fn from_json_str(text: &str) -> Result<Self, SpecError> {
        let spec: Self = parse_json(text)?;
        spec.validate()?;
        Ok(spec)
    }
}
