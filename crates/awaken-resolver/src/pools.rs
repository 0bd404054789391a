//! Model pools in the registries: a pool id resolves like a model id, to one [`ModelPool`] per
//! pool for the registries' lifetime (so its breakers outlive each run) and a model spec
//! derived from its members; and a pool rebuilt from the membership a run recorded, for the
//! run's resume or recovery.

use std::sync::{Arc, OnceLock};

use awaken_llm::{BreakerPolicy, LlmExecutor, ModelPool, PoolMember, pool_context_window};
use awaken_spec::{ModelPoolSpec, ModelSpec};
use serde::{Deserialize, Serialize};

use crate::error::ModelPoolError;

/// One member of a pool as a run started with it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RecordedMember {
    /// The member's model id (the pool member's id).
    pub model: String,
    /// The provider-side model its requests carried.
    pub upstream_model: String,
    /// Its weight.
    pub weight: u32,
    /// Whether it was tried only after the others.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fallback_only: bool,
}

fn is_false(b: &bool) -> bool {
    !b
}

/// A pool's membership as a run started with it: the pool id and its members in declared
/// order. The runtime records it with the run, and a resumed or recovered run is resolved on a
/// pool of exactly these members when the pool has changed since (see
/// [`crate::Resolver::plan_with_pool`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolMembership {
    /// The pool's id.
    pub pool: String,
    /// The members, in declared order.
    pub members: Vec<RecordedMember>,
}

/// What a model id resolves to: a model's spec and its provider's executor, or a pool's
/// derived spec and the pool.
#[derive(Clone)]
pub struct ResolvedModel {
    /// The model's spec; for a pool, the spec derived from its members (see
    /// `docs/resolver.md`).
    pub spec: Arc<ModelSpec>,
    /// The executor, unwrapped: the provider's, or the pool (callers add their retries
    /// around it).
    pub executor: Arc<dyn LlmExecutor>,
    /// The pool's membership, when the id names a pool.
    pub pool: Option<Arc<PoolMembership>>,
}

impl std::fmt::Debug for ResolvedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedModel")
            .field("spec", &self.spec.id)
            .field("executor", &self.executor.name())
            .field("pool", &self.pool)
            .finish()
    }
}

/// A registered pool: its spec, and the pool built from it on first use.
#[derive(Clone)]
pub(crate) struct PoolEntry {
    pub(crate) spec: Arc<ModelPoolSpec>,
    pub(crate) built: OnceLock<BuiltPool>,
}

/// A pool made of live members: the executor, the derived spec and the membership.
#[derive(Clone)]
pub(crate) struct BuiltPool {
    pub(crate) executor: Arc<ModelPool>,
    pub(crate) spec: Arc<ModelSpec>,
    pub(crate) membership: Arc<PoolMembership>,
}

impl BuiltPool {
    /// The pool as a resolved model.
    pub(crate) fn resolved(&self) -> ResolvedModel {
        ResolvedModel {
            spec: Arc::clone(&self.spec),
            executor: Arc::clone(&self.executor) as Arc<dyn LlmExecutor>,
            pool: Some(Arc::clone(&self.membership)),
        }
    }
}

/// One member ready to build: as recorded, with its model's spec and provider executor.
pub(crate) struct MemberParts {
    pub(crate) recorded: RecordedMember,
    pub(crate) model: Arc<ModelSpec>,
    pub(crate) executor: Arc<dyn LlmExecutor>,
}

/// Builds pool `spec.id` (with `spec`'s breaker) over `members`.
pub(crate) fn build_pool(
    spec: &ModelPoolSpec,
    members: Vec<MemberParts>,
) -> Result<BuiltPool, ModelPoolError> {
    let pool_id = spec.id.clone();
    let derived = derived_spec(&pool_id, members.iter().map(|m| &*m.model))?;
    let membership = PoolMembership {
        pool: pool_id.clone(),
        members: members.iter().map(|m| m.recorded.clone()).collect(),
    };
    let policy = BreakerPolicy::default()
        .with_failures_to_open(spec.breaker.failures_to_open)
        .with_cool_down(spec.breaker.cool_down.get());
    let pool_members = members.into_iter().map(|m| {
        let member = PoolMember::new(m.recorded.model, m.executor, m.recorded.upstream_model)
            .with_weight(m.recorded.weight);
        if m.recorded.fallback_only {
            member.fallback_only()
        } else {
            member
        }
    });
    let executor = ModelPool::new(pool_id.as_str(), pool_members, policy)
        .map_err(|source| ModelPoolError::Build { pool_id, source })?;
    Ok(BuiltPool {
        executor: Arc::new(executor),
        spec: Arc::new(derived),
        membership: Arc::new(membership),
    })
}

/// The model spec of pool `pool_id` over `members`: what a request must respect to suit every
/// member it may go to.
///
/// - `id`, `provider` and `upstream_model` are the pool id: the pool serves itself, and each
///   request it forwards carries the answering member's own `upstream_model`.
/// - `context_window`: the smallest a member declares (`pool_context_window`);
///   `max_output_tokens`: the smallest a member declares, at most that window.
/// - `modalities`: those every member supports (none in common is an error).
/// - `knowledge_cutoff`: the earliest, when every member declares one (else none).
/// - `prices`: the members' when they all declare the same prices, else none (a step costs
///   what its answering member charges, which the pool's spec cannot say in advance).
fn derived_spec<'a>(
    pool_id: &str,
    members: impl Iterator<Item = &'a ModelSpec> + Clone,
) -> Result<ModelSpec, ModelPoolError> {
    let context_window = pool_context_window(members.clone().map(|m| m.context_window));
    let max_output_tokens = members
        .clone()
        .filter_map(|m| m.max_output_tokens)
        .min()
        .map(|out| context_window.map_or(out, |window| out.min(window)));
    let mut all = members.clone();
    let first = all.next();
    let modalities: Vec<_> = first
        .map(|f| {
            f.modalities
                .iter()
                .copied()
                .filter(|m| members.clone().all(|o| o.modalities.contains(m)))
                .collect()
        })
        .unwrap_or_default();
    if modalities.is_empty() {
        return Err(ModelPoolError::NoCommonModality {
            pool_id: pool_id.to_owned(),
        });
    }
    let knowledge_cutoff = members
        .clone()
        .map(|m| m.knowledge_cutoff)
        .collect::<Option<Vec<_>>>()
        .and_then(|cutoffs| cutoffs.into_iter().min());
    let prices = first
        .and_then(|f| f.prices)
        .filter(|p| members.clone().all(|m| m.prices.as_ref() == Some(p)));
    let mut spec = ModelSpec::new(pool_id, pool_id, pool_id);
    spec.context_window = context_window;
    spec.max_output_tokens = max_output_tokens;
    spec.modalities = modalities;
    spec.knowledge_cutoff = knowledge_cutoff;
    spec.prices = prices;
    Ok(spec)
}

/// The digest's lines for a pool's membership: the pool, then each member with its upstream
/// model, weight and fallback flag, in declared order.
pub(crate) fn digest_lines(membership: &PoolMembership, w: &mut Vec<u8>) {
    w.extend_from_slice(b"\npool ");
    w.extend_from_slice(membership.pool.as_bytes());
    for m in &membership.members {
        w.extend_from_slice(b"\nmember ");
        w.extend_from_slice(m.model.as_bytes());
        w.push(b' ');
        w.extend_from_slice(m.upstream_model.as_bytes());
        w.push(b' ');
        w.extend_from_slice(m.weight.to_string().as_bytes());
        if m.fallback_only {
            w.extend_from_slice(b" fallback");
        }
    }
}

#[cfg(test)]
mod tests {
    use awaken_spec::{KnowledgeCutoff, Modality, TokenPrices};

    use super::*;

    #[test]
    fn a_pools_spec_is_what_every_member_can_take() {
        let prices = TokenPrices {
            input_per_mtok: 1.0,
            output_per_mtok: 2.0,
            cached_input_per_mtok: None,
        };
        let cutoff = |text| KnowledgeCutoff::parse(text).expect("date");
        let mut a = ModelSpec::new("a", "pa", "up-a")
            .with_context_window(128_000)
            .with_max_output_tokens(16_000)
            .with_knowledge_cutoff(cutoff("2024-06"))
            .with_prices(prices);
        a.modalities = vec![Modality::Text, Modality::Image];
        let b = ModelSpec::new("b", "pb", "up-b")
            .with_context_window(8_000)
            .with_knowledge_cutoff(cutoff("2023-10"))
            .with_prices(prices);
        let c = ModelSpec::new("c", "pc", "up-c");
        let spec = derived_spec("smart", [&a, &b].into_iter()).expect("derived");
        assert_eq!(
            (
                spec.id.as_str(),
                spec.provider.as_str(),
                spec.upstream_model.as_str()
            ),
            ("smart", "smart", "smart")
        );
        assert_eq!(spec.context_window, Some(8_000));
        // 16 000 output tokens do not fit the pool's window of 8 000.
        assert_eq!(spec.max_output_tokens, Some(8_000));
        assert_eq!(spec.modalities, [Modality::Text]);
        assert_eq!(spec.knowledge_cutoff, Some(cutoff("2023-10")));
        assert_eq!(spec.prices, Some(prices));
        spec.validate().expect("a valid model spec");

        // A member that declares nothing: no cutoff, no prices, the others' window.
        let spec = derived_spec("smart", [&a, &b, &c].into_iter()).expect("derived");
        assert_eq!(spec.context_window, Some(8_000));
        assert_eq!((spec.knowledge_cutoff, spec.prices), (None, None));

        let mut images = ModelSpec::new("i", "pi", "up-i");
        images.modalities = vec![Modality::Image];
        let err = derived_spec("smart", [&b, &images].into_iter()).expect_err("no modality");
        assert_eq!(
            err.to_string(),
            "model pool `smart`: its members support no modality in common"
        );
    }
}
