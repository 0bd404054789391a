//! Putting the two plugins together, from a configuration or from an agent's policy.

use std::sync::Arc;

use awaken_llm::{LlmExecutor, RetryingExecutor};
use awaken_plugin::Plugin;
use awaken_spec::{AgentSpec, ModelSpec};

use crate::compaction::CompactionPlugin;
use crate::config::{ContextConfig, ContextConfigError};
use crate::core::Core;
use crate::estimate::{DefaultEstimator, TokenEstimator};
use crate::summarize::{LlmSummarizer, Summarizer};
use crate::transform::ContextTransformPlugin;

/// Where the summary model and its executor are found (the runtime implements it over its
/// registries).
pub trait SummaryModels {
    /// The model registered as `id` (for a model pool's id, the spec the pool is resolved
    /// to).
    fn model(&self, id: &str) -> Option<ModelSpec>;
    /// The executor that serves `model`: its provider's (`None` when that provider is not
    /// registered), or, for a model pool's spec, the pool.
    fn executor(&self, model: &ModelSpec) -> Option<Arc<dyn LlmExecutor>>;
}

/// Builds the context-transform and compaction plugins of one agent. They share a cache of
/// token counts, so build a fresh pair for every run (resolution does).
pub struct ContextPlugins {
    config: ContextConfig,
    estimator: Arc<dyn TokenEstimator>,
    summarizer: Option<Arc<dyn Summarizer>>,
}

impl ContextPlugins {
    /// The plugins for `config`, with the [`DefaultEstimator`] and no summarizer.
    pub fn new(config: ContextConfig) -> Self {
        Self {
            config,
            estimator: Arc::new(DefaultEstimator),
            summarizer: None,
        }
    }

    /// Sets the estimator.
    pub fn with_estimator(mut self, estimator: Arc<dyn TokenEstimator>) -> Self {
        self.estimator = estimator;
        self
    }

    /// Sets the summarizer (needed when the configuration has compaction).
    pub fn with_summarizer(mut self, summarizer: Arc<dyn Summarizer>) -> Self {
        self.summarizer = Some(summarizer);
        self
    }

    /// The two plugins. Fails when compaction is configured without a summarizer.
    pub fn build(self) -> Result<(ContextTransformPlugin, CompactionPlugin), ContextConfigError> {
        if self.config.compaction.is_some() && self.summarizer.is_none() {
            return Err(ContextConfigError::MissingSummarizer);
        }
        let core = Arc::new(Core::new(self.config, self.estimator));
        Ok((
            ContextTransformPlugin::new(core.clone()),
            CompactionPlugin::new(core, self.summarizer),
        ))
    }

    /// The two plugins as the resolver takes them: transform first, then compaction.
    pub fn into_plugins(self) -> Result<Vec<Arc<dyn Plugin>>, ContextConfigError> {
        let (transform, compaction) = self.build()?;
        Ok(vec![Arc::new(transform), Arc::new(compaction)])
    }

    /// The plugins `spec.context_policy` asks for on `model` (none without a policy): the
    /// budget from the policy or the model's window, and, with a compaction threshold, an
    /// [`LlmSummarizer`] on the summary model (the agent's own by default) found in `models`,
    /// behind a [`RetryingExecutor`] when the agent's `retry` section asks for retries.
    /// Errors name the policy field.
    pub fn for_agent(
        spec: &AgentSpec,
        model: &ModelSpec,
        models: &dyn SummaryModels,
        estimator: Arc<dyn TokenEstimator>,
    ) -> Result<Vec<Arc<dyn Plugin>>, ContextConfigError> {
        let Some(policy) = &spec.context_policy else {
            return Ok(Vec::new());
        };
        policy.validate()?;
        if policy.compaction_threshold.is_none() {
            let config = ContextConfig::from_policy(policy, model, model)?;
            return Self::new(config).with_estimator(estimator).into_plugins();
        }
        let summary_model = match policy.summary_model.as_deref() {
            None => model.clone(),
            Some(id) if id == model.id => model.clone(),
            Some(id) => {
                models
                    .model(id)
                    .ok_or_else(|| ContextConfigError::SummaryModelNotFound {
                        model_id: id.to_owned(),
                    })?
            }
        };
        let config = ContextConfig::from_policy(policy, model, &summary_model)?;
        let mut executor = models.executor(&summary_model).ok_or_else(|| {
            ContextConfigError::SummaryProviderNotFound {
                model_id: summary_model.id.clone(),
                provider_id: summary_model.provider.clone(),
            }
        })?;
        let retry = spec.retry()?;
        if retry.max_retries > 0 {
            executor = Arc::new(RetryingExecutor::new(executor, &retry));
        }
        let max_tokens = config.compaction.map_or(u32::MAX, |c| c.summary_max_tokens);
        let summarizer = LlmSummarizer::new(executor, summary_model.upstream_model.clone())
            .with_max_tokens(max_tokens);
        Self::new(config)
            .with_estimator(estimator)
            .with_summarizer(Arc::new(summarizer))
            .into_plugins()
    }
}
