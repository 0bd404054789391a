//! Phases and commands on the run's state: a phase's context, running a phase (or skipping an
//! idle one), submitting a command, counting in the run's statistics, and reporting what a
//! phase dead-lettered or which effect handlers failed.

use awaken_event::{AgentEvent, WarningKind};
use awaken_phase::{EffectFailure, Phase, PhaseContext, PhaseError, PhaseReport, SubmitNow};
use awaken_state::{Snapshot, StateCommand};

use crate::builtins::{RunStats, RunStatsKey, StatsUpdate, stats_at_in};
use crate::run::{Failure, Run};

impl Run<'_> {
    /// A context for `phase` at the current step.
    pub(super) fn ctx(&self, phase: Phase) -> PhaseContext {
        // Built whole: `PhaseContext::new` would allocate defaults replaced at once.
        PhaseContext {
            phase,
            snapshot: self.engine.store().snapshot(),
            sections: self.sections.clone(),
            run: self.identity.clone(),
            step: self.step,
            messages: self.history.clone(),
            tool: None,
            response: None,
            cancel: self.cancel.clone(),
        }
    }

    /// Reports what a phase dead-lettered and which of its effect handlers failed.
    pub(super) fn report(&mut self, report: &PhaseReport) -> Result<(), Failure> {
        for letter in &report.dead_lettered {
            self.note(AgentEvent::ActionDeadLettered {
                action: letter.action.key.clone(),
                phase: letter.action.phase.clone(),
                reason: letter.reason.clone(),
            });
        }
        if !report.effects.failures.is_empty() {
            self.effects_failed(&report.effects.failures)?;
        }
        Ok(())
    }

    /// Reports effect handlers that failed; the run goes on. Each failure is a `HandlerFailed`
    /// warning naming the effect, the handler's plugin and the error, and all of them are
    /// counted in the run's statistics. Called only when some failed.
    #[cold]
    pub(super) fn effects_failed(&mut self, failures: &[EffectFailure]) -> Result<(), Failure> {
        for failure in failures {
            self.note(AgentEvent::Warning {
                kind: WarningKind::HandlerFailed,
                detail: failure.to_string(),
            });
        }
        let count = u32::try_from(failures.len()).unwrap_or(u32::MAX);
        self.count(StatsUpdate::HandlersFailed { count })
    }

    /// Runs a phase; a cancellation while one of its hooks or actions is awaiting ends it at
    /// once (nothing of an unfinished GATHER is published; an action whose handler did not
    /// finish stays queued).
    pub(super) async fn phase_with(&mut self, ctx: PhaseContext) -> Result<(), Failure> {
        let report = {
            let phase = std::pin::pin!(self.engine.run_phase(&ctx));
            let cancelled = std::pin::pin!(ctx.cancel.cancelled());
            match futures_util::future::select(phase, cancelled).await {
                futures_util::future::Either::Left((report, _)) => report?,
                futures_util::future::Either::Right(((), _)) => return Err(Failure::Cancelled),
            }
        };
        if self.visible.is_some() {
            self.show_changes();
        }
        self.report(&report)
    }

    /// Runs `phase`, unless it is idle.
    pub(super) async fn phase(&mut self, phase: Phase) -> Result<(), Failure> {
        if self.skip_idle(phase)? {
            return Ok(());
        }
        self.phase_with(self.ctx(phase)).await
    }

    /// Whether `phase` has nothing to run (no hook, no queued action), so it is skipped and no
    /// context is built for it (nor the history shared); a cancelled run still stops here, as
    /// the engine would have stopped it.
    pub(super) fn skip_idle(&self, phase: Phase) -> Result<bool, Failure> {
        if !self.engine.is_idle(phase) {
            return Ok(false);
        }
        self.check_cancelled()?;
        Ok(true)
    }

    /// `Cancelled` once the run's cancellation was requested.
    pub(super) fn check_cancelled(&self) -> Result<(), Failure> {
        if self.cancel.is_cancelled() {
            Err(Failure::Cancelled)
        } else {
            Ok(())
        }
    }

    /// Submits a command to the run's state.
    pub(super) async fn submit(&mut self, cmd: StateCommand) -> Result<(), Failure> {
        // A command without effects (the run's statistics, every step) commits at once.
        let cmd = match self.engine.submit_now(cmd)? {
            SubmitNow::Committed(_) => return Ok(()),
            SubmitNow::HasEffects(cmd) => cmd,
        };
        // One with effects awaits their dispatch, boxed: the futures of the many places that
        // submit need not hold room for it.
        let report = Box::pin(self.engine.submit_command(cmd)).await?;
        if !report.effects.failures.is_empty() {
            self.effects_failed(&report.effects.failures)?;
        }
        Ok(())
    }

    /// Counts in the run's statistics: a typed commit of their key, no command built (it
    /// carries no actions or effects).
    pub(super) fn count(&self, update: StatsUpdate) -> Result<(), Failure> {
        match self.stats_at {
            Some(key) => self.engine.update_by(key, update),
            None => self.engine.update::<RunStatsKey>(update),
        }
        .map_err(|e| Failure::from(PhaseError::from(e)))?;
        Ok(())
    }

    /// `f` of the statistics, read in place (no copy of their tool list, no snapshot taken).
    /// `f` must not read the store itself: it runs under the store's read lock.
    pub(super) fn read_stats<T>(&self, f: impl FnOnce(&RunStats) -> T) -> T {
        self.engine.store().read(|s| self.stats_in(s, f))
    }

    /// `f` of the statistics as `snapshot` holds them.
    pub(super) fn stats_in<T>(&self, snapshot: &Snapshot, f: impl FnOnce(&RunStats) -> T) -> T {
        stats_at_in(snapshot, self.stats_at, f)
    }
}
