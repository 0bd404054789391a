//! The context-transform plugin: fits every request into the budget.

use std::sync::Arc;

use awaken_phase::{FnHook, HookError, Phase, PhaseContext};
use awaken_plugin::{
    InferenceRequestTransform, LifecycleHooks, Plugin, PluginError, PluginManifest,
    PluginRegistrar, TransformContext, TransformError,
};
use awaken_spec::TruncationStrategy;
use awaken_state::{KeyOptions, KeyScope, StateCommand};

use awaken_llm::InferenceRequest;

use crate::core::{Core, PlanInput, assemble, summary_message};
use crate::estimate::{Calibration, CalibrationKey, UsageSample};
use crate::keys::{CompactionKey, FixedTokensKey};

/// Id of the context-transform plugin.
pub const CONTEXT_TRANSFORM_PLUGIN: &str = "awaken.context_transform";
/// Name of its request transform.
pub const CONTEXT_TRANSFORM: &str = "context_window";

/// Fits each request into the budget (a request transform), and learns the estimator's
/// correction from the usage providers report (an `AfterInference` hook writing
/// [`CalibrationKey`]).
///
/// A request keeps, in this order: the system prompt and tools (always), the compaction
/// summary standing for the messages it covers (when there is one), the omission marker
/// (when anything was dropped), the latest user message (always, even when it is older than
/// what is kept or covered by the summary), then the newest messages that fit. Messages are
/// dropped oldest first and by whole units — a message, or an assistant message with all of its
/// tool calls' results — so a call is never separated from its result; the newest unit is
/// always kept. When even that minimum is over the budget (or the policy says
/// `truncation = "fail"` and the request does not fit), the transform fails with
/// [`TransformError::ContextOverflow`] naming both sizes, which ends the run.
pub struct ContextTransformPlugin {
    manifest: PluginManifest,
    core: Arc<Core>,
}

impl ContextTransformPlugin {
    pub(crate) fn new(core: Arc<Core>) -> Self {
        Self {
            manifest: PluginManifest::new(CONTEXT_TRANSFORM_PLUGIN),
            core,
        }
    }
}

impl Plugin for ContextTransformPlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }

    fn lifecycle_hooks(&self) -> LifecycleHooks {
        LifecycleHooks::NONE
    }

    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_key::<CalibrationKey>(KeyOptions::new().with_scope(KeyScope::Thread))?;
        r.register_key::<FixedTokensKey>(KeyOptions::new().with_scope(KeyScope::Thread))?;
        let core = self.core.clone();
        r.register_phase_hook(
            Phase::AfterInference,
            "calibrate",
            Arc::new(FnHook(move |ctx: &PhaseContext| calibrate(&core, ctx))),
        )?;
        r.register_request_transform(Arc::new(ContextWindow {
            core: self.core.clone(),
        }));
        Ok(())
    }
}

/// Records the reported prompt tokens beside the estimate of the request that was sent.
fn calibrate(core: &Core, ctx: &PhaseContext) -> Result<StateCommand, HookError> {
    let Some(response) = &ctx.response else {
        return Ok(StateCommand::new());
    };
    let reported = response.usage.input_tokens;
    let cache = core.cache(&ctx.run.run_id);
    let mut cmd = match cache.last_sent {
        Some((step, estimated)) if step == ctx.step && reported > 0 => {
            StateCommand::new().with_update::<CalibrationKey>(UsageSample {
                estimated,
                reported,
            })
        }
        _ => StateCommand::new(),
    };
    // The tokens every request carries besides messages, for the compaction hook of a later
    // run or process (whose cache starts empty): written when they change.
    let known = ctx.snapshot.get::<FixedTokensKey>().copied().unwrap_or(0);
    if cache.fixed > 0 && cache.fixed != known {
        cmd = cmd.with_update::<FixedTokensKey>(cache.fixed);
    }
    Ok(cmd)
}

struct ContextWindow {
    core: Arc<Core>,
}

impl InferenceRequestTransform for ContextWindow {
    fn name(&self) -> &str {
        CONTEXT_TRANSFORM
    }

    fn transform(
        &self,
        mut request: InferenceRequest,
        ctx: &TransformContext<'_>,
    ) -> Result<InferenceRequest, TransformError> {
        let core = &*self.core;
        let estimator = &*core.estimator;
        let calibration = ctx
            .snapshot
            .get::<CalibrationKey>()
            .copied()
            .unwrap_or_else(|_| Calibration::default());
        let n = request.messages.len();
        let summary = ctx
            .snapshot
            .get::<CompactionKey>()
            .ok()
            .and_then(|s| s.summary_for(n));
        let mut cache = core.cache(&ctx.run.run_id);
        cache.counts.sync(&request.messages, estimator);
        let fixed = cache.fixed_tokens(&request, estimator);
        let summary_tokens = summary.map_or(0, |(covers, text)| {
            cache.summary_tokens(covers, text, estimator)
        });
        let marker_bound = cache.marker_bound(estimator);
        let budget = core.config.budget;
        let plan = PlanInput {
            counts: &cache.counts,
            covers: summary.map_or(0, |(covers, _)| covers),
            base: fixed + summary_tokens,
            raw_budget: calibration.raw_budget(budget),
            marker_bound,
            may_drop: core.config.truncation == TruncationStrategy::DropOldest,
            stable: core.config.stable_prefix,
        }
        .plan(|omitted| estimator.message_tokens(&crate::core::omission_marker(omitted)));
        let fit = match plan {
            Ok(fit) => fit,
            Err(raw_required) => {
                return Err(TransformError::ContextOverflow {
                    required: calibration.correct(raw_required),
                    budget,
                });
            }
        };
        cache.last_sent = Some((ctx.step, fit.raw_total));
        drop(cache);
        let reordered = fit.pinned_user.is_some_and(|u| u < fit.cut);
        if summary.is_none() && fit.cut == 0 && !reordered {
            return Ok(request);
        }
        let summary = summary.map(|(covers, text)| summary_message(covers, text));
        request.messages = assemble(&request.messages, &fit, summary).into();
        Ok(request)
    }
}
