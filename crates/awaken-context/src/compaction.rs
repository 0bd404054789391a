//! The compaction plugin: past a threshold, the older part of a thread is summarised once and
//! the summary stands for it in every later request.

use std::sync::Arc;

use async_trait::async_trait;
use awaken_phase::{
    ActionHandler, CommandExt, EffectContext, EffectHandler, EffectSpec, FnHook, HookError, Phase,
    PhaseContext, ScheduledActionSpec,
};
use awaken_plugin::{LifecycleHooks, Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_state::{KeyOptions, KeyScope, StateCommand};
use serde::{Deserialize, Serialize};

use crate::config::CompactionConfig;
use crate::core::{Core, PlanInput};
use crate::estimate::{Calibration, CalibrationKey};
use crate::keys::{CompactionKey, CompactionUpdate, FixedTokensKey};
use crate::summarize::{Summarizer, SummaryError, SummaryRequest};

/// Id of the compaction plugin.
pub const COMPACTION_PLUGIN: &str = "awaken.compaction";

/// The range a compaction summarises: messages `from..to`, on top of the summary of `0..from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactRange {
    /// What the current summary covers.
    pub from: u64,
    /// What the new one will cover.
    pub to: u64,
}

/// The compaction action: scheduled by the pure `BeforeInference` hook, handled in the same
/// phase's EXECUTE loop (the handler calls the summary model), so the request of that very
/// step already carries the summary.
pub struct Compact;

impl ScheduledActionSpec for Compact {
    const KEY: &'static str = "awaken.context.compact";
    const PHASE: Phase = Phase::BeforeInference;
    type Payload = CompactRange;
}

/// The effect a failed summary emits (its handler logs a warning; the state keeps the
/// count in [`CompactionState::fallbacks`](crate::CompactionState::fallbacks)).
pub struct CompactionFellBack;

impl EffectSpec for CompactionFellBack {
    const KEY: &'static str = "awaken.context.compaction_fell_back";
    type Payload = String;
}

/// Summarises the older part of a thread when it passes the threshold (configured by
/// `ContextPolicy::compaction_threshold`).
///
/// Its `BeforeInference` hook is pure: it counts the history (through the cache it shares with
/// the context transform) and, past the threshold, schedules one [`Compact`] action for the
/// range to summarise. The action's handler reads the state afresh, calls the
/// [`Summarizer`] only when the state still covers exactly the range's start, and commits the
/// summary to [`CompactionKey`] together with the action's removal. A failed call commits a
/// [`CompactionUpdate::FellBack`] instead, emits [`CompactionFellBack`], and the transform
/// keeps truncating; the next attempt waits until the history has grown (see
/// [`COMPACTION_RETRY_AFTER_MESSAGES`](crate::COMPACTION_RETRY_AFTER_MESSAGES)).
///
/// Which range: it never covers the newest unit (a message, or a call with its results), and
/// ends where a request may start; it reaches far enough that what remains takes at most half
/// the threshold (plus the summary), but no further than one summary call can read
/// ([`CompactionConfig::summary_input_budget`]), and it is made only when it covers more tokens
/// than the summary may take.
pub struct CompactionPlugin {
    manifest: PluginManifest,
    core: Arc<Core>,
    summarizer: Option<Arc<dyn Summarizer>>,
}

impl CompactionPlugin {
    pub(crate) fn new(core: Arc<Core>, summarizer: Option<Arc<dyn Summarizer>>) -> Self {
        Self {
            manifest: PluginManifest::new(COMPACTION_PLUGIN),
            core,
            summarizer,
        }
    }
}

impl Plugin for CompactionPlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }

    fn lifecycle_hooks(&self) -> LifecycleHooks {
        LifecycleHooks::NONE
    }

    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_key::<CompactionKey>(KeyOptions::new().with_scope(KeyScope::Thread))?;
        r.register_effect::<CompactionFellBack, _>(LogFallback)?;
        let (Some(config), Some(summarizer)) = (self.core.config.compaction, &self.summarizer)
        else {
            return Ok(());
        };
        r.register_scheduled_action::<Compact, _>(CompactHandler {
            summarizer: summarizer.clone(),
        })?;
        let core = self.core.clone();
        r.register_phase_hook(
            Phase::BeforeInference,
            "schedule_compaction",
            Arc::new(FnHook(move |ctx: &PhaseContext| {
                schedule(&core, &config, ctx)
            })),
        )
    }
}

/// The pure hook: past the threshold, schedules the compaction of the chosen range.
fn schedule(
    core: &Core,
    config: &CompactionConfig,
    ctx: &PhaseContext,
) -> Result<StateCommand, HookError> {
    let mut cmd = StateCommand::new();
    let state = ctx
        .snapshot
        .get::<CompactionKey>()
        .cloned()
        .unwrap_or_default();
    let calibration = ctx
        .snapshot
        .get::<CalibrationKey>()
        .copied()
        .unwrap_or_else(|_| Calibration::default());
    let n = ctx.messages.len();
    if state.retry_at.is_some_and(|at| (n as u64) < at) {
        return Ok(cmd);
    }
    let summary = state.summary_for(n);
    let covers = summary.map_or(0, |(c, _)| c);
    let estimator = &*core.estimator;
    let mut cache = core.cache(&ctx.run.run_id);
    cache.counts.sync(&ctx.messages, estimator);
    let summary_tokens = summary.map_or(0, |(c, text)| cache.summary_tokens(c, text, estimator));
    let budget = core.config.budget as f64;
    let threshold = calibration.raw_budget((config.threshold * budget).floor() as u64);
    let keep = calibration.raw_budget((config.threshold * budget / 2.0).floor() as u64);
    let plan = PlanInput {
        counts: &cache.counts,
        covers,
        // Before this run's first request the cache knows nothing of the fixed part: the
        // thread's last known count stands in.
        base: fixed_tokens(cache.fixed, &ctx.snapshot) + summary_tokens,
        raw_budget: threshold,
        marker_bound: 0,
        may_drop: true,
        stable: false,
    };
    let Some(to) = plan.compaction_end(
        keep.saturating_sub(u64::from(config.summary_max_tokens)),
        config.summary_input_budget.saturating_sub(summary_tokens),
        u64::from(config.summary_max_tokens),
    ) else {
        return Ok(cmd);
    };
    cmd.schedule_action::<Compact>(CompactRange {
        from: covers as u64,
        to: to as u64,
    })?;
    Ok(cmd)
}

struct CompactHandler {
    summarizer: Arc<dyn Summarizer>,
}

#[async_trait]
impl ActionHandler<Compact> for CompactHandler {
    async fn handle(
        &self,
        ctx: &PhaseContext,
        range: CompactRange,
    ) -> Result<StateCommand, HookError> {
        let state = ctx
            .snapshot
            .get::<CompactionKey>()
            .cloned()
            .unwrap_or_default();
        let n = ctx.messages.len();
        let (Ok(from), Ok(to)) = (usize::try_from(range.from), usize::try_from(range.to)) else {
            return Ok(StateCommand::new());
        };
        // Already summarised, or planned on a state that has moved on: nothing to do (the hook
        // plans again on the next step). A range is never summarised twice.
        if state.covers != range.from || to <= from || to > n {
            return Ok(StateCommand::new());
        }
        let request = SummaryRequest {
            previous: state.summary.as_deref(),
            messages: &ctx.messages[from..to],
            first_index: from,
            cancel: &ctx.cancel,
        };
        let failure = match self.summarizer.summarize(request).await {
            Ok(text) if !text.trim().is_empty() => {
                // Crash tests: the summary exists, but only here (not in the state or store).
                crate::failpoint::hit("compaction_summarized");
                tracing::info!(from, to, "compaction committed a summary");
                return Ok(StateCommand::new().with_update::<CompactionKey>(
                    CompactionUpdate::Commit {
                        from: range.from,
                        to: range.to,
                        text,
                    },
                ));
            }
            Ok(_) => SummaryError::Empty,
            Err(SummaryError::Cancelled) => {
                // The run is ending; nothing to record (the action is dead-lettered).
                return Err(HookError::failed("the summary call was cancelled"));
            }
            Err(e) => e,
        };
        let error = format!(
            "compaction of messages {from}..{to} failed, falling back to truncation: {failure}"
        );
        let mut cmd =
            StateCommand::new().with_update::<CompactionKey>(CompactionUpdate::FellBack {
                messages: n as u64,
                error: error.clone(),
            });
        cmd.emit::<CompactionFellBack>(error)?;
        Ok(cmd)
    }
}

struct LogFallback;

#[async_trait]
impl EffectHandler<CompactionFellBack> for LogFallback {
    async fn handle(&self, _ctx: &EffectContext, detail: String) -> Result<(), HookError> {
        tracing::warn!(%detail, "compaction fell back to truncation");
        Ok(())
    }
}

/// The fixed part's tokens: this run's count, or the thread's last known one before it has any.
fn fixed_tokens(cached: u64, snapshot: &awaken_state::Snapshot) -> u64 {
    if cached > 0 {
        return cached;
    }
    snapshot.get::<FixedTokensKey>().copied().unwrap_or(0)
}
