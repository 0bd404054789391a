//! Stop conditions: whether the run ends after a step, by a plugin's stop request, the round
//! limit or the agent's conditions (token budget, a tool that stops the run, consecutive
//! errors).

use std::sync::Arc;

use awaken_event::TerminationReason;
use awaken_spec::StopConditionSpec;
use awaken_state::Snapshot;

use crate::builtins::RunStats;
use crate::builtins::read_key;
use crate::run::Run;

impl Run<'_> {
    /// The first stop condition that holds now, with the tools of the step in progress
    /// (`last_step`: of the step before, once a step was counted), read in one look at the
    /// state.
    pub(super) fn stop_now(&self, last_step: bool) -> Option<TerminationReason> {
        self.engine.store().read(|s| {
            self.stats_in(s, |stats| {
                let tools = if last_step {
                    &stats.last_step_tools
                } else {
                    &stats.tools_in_step
                };
                self.stop_condition(s, stats, tools)
            })
        })
    }

    /// The first stop condition that holds for `stats`, with `step_tools` the tools of the step
    /// just ended.
    fn stop_condition(
        &self,
        snapshot: &Snapshot,
        stats: &RunStats,
        step_tools: &[Arc<str>],
    ) -> Option<TerminationReason> {
        if let Ok(Some(request)) = read_key(snapshot, self.stop_at) {
            return Some(TerminationReason::stopped(
                request.code.clone(),
                request.detail.clone(),
            ));
        }
        let max_rounds = self.resolved.spec.max_rounds;
        if stats.inferences >= max_rounds {
            return Some(TerminationReason::stopped(
                "max_rounds",
                format!("reached the limit of {max_rounds} inferences"),
            ));
        }
        for condition in &self.resolved.spec.stop_conditions {
            match condition {
                StopConditionSpec::TokenBudget { max_total_tokens }
                    if stats.usage.total() >= *max_total_tokens =>
                {
                    return Some(TerminationReason::stopped(
                        "token_budget",
                        format!("used {} of {max_total_tokens} tokens", stats.usage.total()),
                    ));
                }
                StopConditionSpec::StopOnTool { tool }
                    if step_tools.iter().any(|t| **t == **tool) =>
                {
                    return Some(TerminationReason::stopped(
                        "stop_tool",
                        format!("tool `{tool}` ran"),
                    ));
                }
                StopConditionSpec::ConsecutiveErrors { max }
                    if stats.consecutive_errors >= *max =>
                {
                    return Some(TerminationReason::stopped(
                        "consecutive_errors",
                        format!("{} tool calls failed in a row", stats.consecutive_errors),
                    ));
                }
                _ => {}
            }
        }
        None
    }
}
