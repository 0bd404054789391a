//! The model pool a run starts on, recorded with the run, so that a resume or a recovery of
//! the run (in any process) runs on the same members even when the pool has changed since
//! (`awaken_resolver::Resolver::plan_with_pool`).

use std::sync::Arc;

use awaken_resolver::PoolMembership;
use awaken_state::{PersistedState, StateError, StateKey};

/// The state key holding the membership of the model pool a run started on (its members'
/// ids, upstream models, weights and fallback flags): written with the run's first commit
/// when the agent's model is a pool, never for a model. Run-scoped, so the run's every
/// checkpoint carries it; a resume or recovery reads it before resolving the agent.
pub struct ModelPoolKey;

impl StateKey for ModelPoolKey {
    const KEY: &'static str = "awaken.loop.model_pool";
    type Value = Option<PoolMembership>;
    type Update = PoolMembership;

    fn apply(
        value: &mut Option<PoolMembership>,
        membership: PoolMembership,
    ) -> Result<(), StateError> {
        *value = Some(membership);
        Ok(())
    }
}

/// The membership a stored run recorded, if it recorded one.
pub(crate) fn recorded_pool(
    run_state: &PersistedState,
) -> Result<Option<PoolMembership>, StateError> {
    match run_state.values.get(ModelPoolKey::KEY) {
        None => Ok(None),
        Some(value) => {
            serde_json::from_value(value.clone()).map_err(|e| StateError::ValueDeserialize {
                key: ModelPoolKey::KEY.to_owned(),
                source: Arc::new(e),
            })
        }
    }
}
