//! The phase engine: GATHER (hooks on one frozen snapshot, merged, with the serial fallback on
//! `Exclusive` conflicts, published as one commit), EXECUTE (scheduled actions in bounded
//! rounds), and effect dispatch after each commit.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use awaken_state::{
    Committed, KeyHandle, KeyRegistry, ParallelBatch, StateCommand, StateError, StateKey,
    StateStore, Transaction, panic_message,
};
use futures_util::FutureExt;
use futures_util::future::join_all;
use serde_json::Value;

use crate::abandon::Abandonable;
use crate::action::{EffectContext, HandlerFailure};
use crate::context::PhaseContext;
use crate::env::{PhaseEnv, RegisteredHook};
use crate::hook::HookError;
use crate::phase::Phase;
use crate::queue::{ActionQueueKey, DeadLetter, DeadLettersKey, QueueUpdate, QueuedAction};

/// How many EXECUTE rounds a phase may take before it fails with
/// `StateError::PhaseRunLoopExceeded`.
pub const DEFAULT_MAX_PHASE_ROUNDS: usize = 16;

/// Why a phase (or a submitted command) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PhaseError {
    /// Validation or commit failed (unknown key or handler, stale revision, a failing reducer,
    /// the round limit); nothing of the failing commit was written.
    #[error(transparent)]
    State(#[from] StateError),
    /// A hook returned an error; nothing of the phase's GATHER was published.
    #[error("hook `{hook}` of plugin `{plugin_id}` failed in {phase}: {source}")]
    HookFailed {
        /// The phase.
        phase: Phase,
        /// The hook's plugin.
        plugin_id: String,
        /// The hook's name.
        hook: String,
        /// Its error.
        #[source]
        source: HookError,
    },
    /// A hook panicked; nothing of the phase's GATHER was published.
    #[error("hook `{hook}` of plugin `{plugin_id}` panicked in {phase}: {message}")]
    HookPanicked {
        /// The phase.
        phase: Phase,
        /// The hook's plugin.
        plugin_id: String,
        /// The hook's name.
        hook: String,
        /// The panic message.
        message: String,
    },
    /// The run was cancelled before or during the phase.
    #[error("{phase} was cancelled")]
    Cancelled {
        /// The phase.
        phase: Phase,
    },
    /// `ToolGate` is driven through gate hooks, never through `run_phase`.
    #[error("tool_gate is not run through phase hooks")]
    ToolGatePhase,
}

/// Counts of effect dispatch, with the failures counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EffectStats {
    /// Effects handed to a handler.
    pub attempted: usize,
    /// Of those, how many failed (error, panic, undecodable payload, no handler).
    pub failed: usize,
    /// The failures `failed` counts, in dispatch order (empty, and unallocated, when none
    /// failed).
    pub failures: Vec<EffectFailure>,
}

impl EffectStats {
    fn add(&mut self, mut other: EffectStats) {
        self.attempted += other.attempted;
        self.failed += other.failed;
        if !other.failures.is_empty() {
            self.failures.append(&mut other.failures);
        }
    }
}

/// An effect whose handler failed. The commit that emitted it stands; the failure is only
/// reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectFailure {
    /// The effect's key.
    pub effect: String,
    /// The plugin whose handler failed (`None`: no handler is registered for the key).
    pub plugin_id: Option<Arc<str>>,
    /// Why: the handler's error, its panic, or why the payload did not decode.
    pub reason: String,
}

impl EffectFailure {
    /// The failure of `plugin_id`'s handler of `effect`, from the handler's outcome.
    fn of_handler(effect: &str, plugin_id: &Arc<str>, failure: HandlerFailure) -> Self {
        let reason = match failure {
            HandlerFailure::Handler { source, .. } => source.to_string(),
            HandlerFailure::Decode { source, .. } => {
                format!("the payload does not decode: {source}")
            }
            HandlerFailure::Panicked { message, .. } => format!("panicked: {message}"),
        };
        Self {
            effect: effect.to_owned(),
            plugin_id: Some(plugin_id.clone()),
            reason,
        }
    }
}

impl std::fmt::Display for EffectFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.plugin_id {
            Some(plugin_id) => write!(
                f,
                "the handler of effect `{}` (plugin `{plugin_id}`) failed: {}",
                self.effect, self.reason
            ),
            None => write!(f, "effect `{}` failed: {}", self.effect, self.reason),
        }
    }
}

/// What one `run_phase` did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PhaseReport {
    /// Whether GATHER published a commit (it does not when no hook wrote anything).
    pub gather_committed: bool,
    /// Whether the conflict fallback ran.
    pub fallback: bool,
    /// Hooks re-run serially because of a conflict, as `plugin/hook`, in order.
    pub deferred_hooks: Vec<String>,
    /// EXECUTE rounds that processed at least one action.
    pub rounds: usize,
    /// Actions whose handler succeeded.
    pub actions_processed: usize,
    /// Actions dead-lettered during this phase.
    pub dead_lettered: Vec<DeadLetter>,
    /// Actions still queued for other phases when the phase ended.
    pub actions_left: usize,
    /// Effect dispatch over the phase's commits.
    pub effects: EffectStats,
    /// The store's revision when the phase ended.
    pub revision: u64,
}

/// What `submit_command` did.
#[derive(Debug, Clone)]
pub struct SubmitReport {
    /// The commit.
    pub committed: Committed,
    /// Effect dispatch after it.
    pub effects: EffectStats,
}

/// What [`PhaseEngine::submit_now`] did with a command.
#[derive(Debug)]
#[must_use]
pub enum SubmitNow {
    /// The command had no effects and is committed.
    Committed(Committed),
    /// The command has effects to dispatch, so nothing was done: it comes back unchanged, for
    /// [`PhaseEngine::submit_command`].
    HasEffects(StateCommand),
}

/// Runs phases and submits commands against one state store and one environment.
/// Cheap to clone (shared).
#[derive(Clone)]
pub struct PhaseEngine {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<StateStore>,
    env: Arc<PhaseEnv>,
    /// Where the store's registry holds the action queue (read before every phase).
    queue_at: Option<KeyHandle<ActionQueueKey>>,
    /// The store's revision at which the queue was last seen empty (`u64::MAX`: not known). A
    /// state at that revision is that state: [`PhaseEngine::is_idle`] then needs no look at
    /// it (every change of the state advances the revision).
    queue_empty_at: AtomicU64,
}

impl std::fmt::Debug for PhaseEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhaseEngine")
            .field("store", &self.inner.store)
            .finish_non_exhaustive()
    }
}

/// Actions a command scheduled, as queue entries.
fn take_actions(cmd: &mut StateCommand) -> Vec<(String, String, Value)> {
    cmd.take_actions()
        .into_iter()
        .map(|a| (a.phase, a.key, a.payload))
        .collect()
}

impl PhaseEngine {
    /// An engine over `store` (whose registry must hold the engine's keys, see
    /// [`crate::register_engine_keys`]) and `env`.
    pub fn new(store: Arc<StateStore>, env: Arc<PhaseEnv>) -> Self {
        Self {
            inner: Arc::new(Inner {
                queue_at: store.registry().handle::<ActionQueueKey>(),
                queue_empty_at: AtomicU64::new(u64::MAX),
                store,
                env,
            }),
        }
    }

    /// The state store.
    pub fn store(&self) -> &Arc<StateStore> {
        &self.inner.store
    }

    /// Commits one typed update of `K` ([`StateStore::update`]) and returns the new revision.
    /// What the engine knows of its action queue stays known: a write of another key leaves a
    /// queue that was empty just before it empty, so [`is_idle`](Self::is_idle) need not look
    /// at the state again.
    pub fn update<K: StateKey>(&self, update: K::Update) -> Result<u64, StateError> {
        let revision = self.inner.store.update::<K>(update)?;
        Ok(self.updated::<K>(revision))
    }

    /// [`update`](Self::update) through a handle on `K` found once
    /// ([`KeyRegistry::handle`]).
    pub fn update_by<K: StateKey>(
        &self,
        key: KeyHandle<K>,
        update: K::Update,
    ) -> Result<u64, StateError> {
        let revision = self.inner.store.update_by(key, update)?;
        Ok(self.updated::<K>(revision))
    }

    /// Keeps the idle mark across a one-key update of `K` that made `revision`.
    fn updated<K: StateKey>(&self, revision: u64) -> u64 {
        let inner = &*self.inner;
        // The update is one commit of `K` alone, one revision after the state it changed. The
        // mark is a fact about one revision, so a racing writer can at worst leave an older
        // true one (and the next `is_idle` looks again); plain loads and stores, no lock.
        if std::any::TypeId::of::<K>() != std::any::TypeId::of::<ActionQueueKey>()
            && revision > 0
            && inner.queue_empty_at.load(Ordering::Acquire) == revision - 1
        {
            inner.queue_empty_at.store(revision, Ordering::Release);
        }
        revision
    }

    /// Whether running `phase` now would do nothing: no hook is registered for it and no
    /// action is queued for it. Such a run reads nothing of its context and changes nothing, so
    /// a caller may skip it (and building its context); the caller keeps the cancellation check
    /// [`run_phase`](Self::run_phase) would have made.
    pub fn is_idle(&self, phase: Phase) -> bool {
        let inner = &*self.inner;
        if !inner.env.hooks(phase).is_empty() {
            return false;
        }
        // Nothing changed since the queue was last seen empty: no look at the state (its lock
        // is two atomic operations, a few times a step).
        if inner.queue_empty_at.load(Ordering::Acquire) == inner.store.revision() {
            return true;
        }
        inner.store.read(|state| {
            inner
                .queue_at
                .map_or_else(|| state.get::<ActionQueueKey>(), |at| state.get_by(at))
                .is_ok_and(|queue| {
                    if queue.items.is_empty() {
                        inner
                            .queue_empty_at
                            .store(state.revision(), Ordering::Release);
                        return true;
                    }
                    queue.for_phase(phase.as_str()).next().is_none()
                })
        })
    }

    /// The environment.
    pub fn env(&self) -> &Arc<PhaseEnv> {
        &self.inner.env
    }

    /// Checks every scheduled action and effect of `cmd` has a handler and a valid phase.
    pub fn validate(&self, cmd: &StateCommand) -> Result<(), StateError> {
        let env = &self.inner.env;
        for action in cmd.actions() {
            let phase: Phase =
                action
                    .phase
                    .parse()
                    .map_err(|_| StateError::InvalidActionPhase {
                        phase: action.phase.clone(),
                        key: action.key.clone(),
                    })?;
            let handler = env.action(&action.key).ok_or_else(|| {
                StateError::UnknownScheduledActionHandler {
                    key: action.key.clone(),
                }
            })?;
            if phase == Phase::ToolGate || handler.handler.phase() != phase {
                return Err(StateError::InvalidActionPhase {
                    phase: action.phase.clone(),
                    key: action.key.clone(),
                });
            }
        }
        for effect in cmd.effects() {
            if env.effect(&effect.key).is_none() {
                return Err(StateError::UnknownEffectHandler {
                    key: effect.key.clone(),
                });
            }
        }
        Ok(())
    }

    /// Validates `cmd` (handlers, phases; nothing is written if it fails), commits it with its
    /// scheduled actions queued, then dispatches its effects.
    pub async fn submit_command(&self, cmd: StateCommand) -> Result<SubmitReport, PhaseError> {
        let committed = self.commit_command(cmd)?;
        let effects = self.dispatch_effects(&committed).await;
        Ok(SubmitReport { committed, effects })
    }

    /// [`submit_command`](Self::submit_command) for a command without effects, at once and
    /// without a future. A command with effects comes back as [`SubmitNow::HasEffects`].
    pub fn submit_now(&self, cmd: StateCommand) -> Result<SubmitNow, PhaseError> {
        if !cmd.effects().is_empty() {
            return Ok(SubmitNow::HasEffects(cmd));
        }
        self.commit_command(cmd).map(SubmitNow::Committed)
    }

    /// Validates and commits `cmd`, its scheduled actions queued.
    fn commit_command(&self, mut cmd: StateCommand) -> Result<Committed, PhaseError> {
        self.validate(&cmd)?;
        let actions = take_actions(&mut cmd);
        if !actions.is_empty() {
            cmd.update::<ActionQueueKey>(QueueUpdate::Enqueue { actions });
        }
        Ok(self.inner.store.commit(cmd)?)
    }

    /// Runs `ctx.phase` with [`DEFAULT_MAX_PHASE_ROUNDS`].
    pub async fn run_phase(&self, ctx: &PhaseContext) -> Result<PhaseReport, PhaseError> {
        self.run_phase_with(ctx, DEFAULT_MAX_PHASE_ROUNDS).await
    }

    /// Runs `ctx.phase`: GATHER, then EXECUTE with at most `max_rounds` processing rounds.
    /// `ctx.snapshot` is ignored: the engine reads the store's current state.
    ///
    /// The phase's working state is boxed for the time it runs: a caller awaiting phases keeps
    /// a pointer in its own future, not the ~1 KiB of a phase's state (a run awaits phases at
    /// many points, and its future is memory it holds for its whole life).
    pub async fn run_phase_with(
        &self,
        ctx: &PhaseContext,
        max_rounds: usize,
    ) -> Result<PhaseReport, PhaseError> {
        Box::pin(self.run_phase_boxed(ctx, max_rounds)).await
    }

    async fn run_phase_boxed(
        &self,
        ctx: &PhaseContext,
        max_rounds: usize,
    ) -> Result<PhaseReport, PhaseError> {
        let phase = ctx.phase;
        if phase == Phase::ToolGate {
            return Err(PhaseError::ToolGatePhase);
        }
        if ctx.cancel.is_cancelled() {
            return Err(PhaseError::Cancelled { phase });
        }
        let mut report = PhaseReport::default();
        self.gather(ctx, &mut report).await?;
        if ctx.cancel.is_cancelled() {
            return Err(PhaseError::Cancelled { phase });
        }
        self.execute(ctx, max_rounds, &mut report).await?;
        Ok(report)
    }

    fn hook_failed(
        phase: Phase,
        hook: &RegisteredHook,
        outcome: std::thread::Result<Result<StateCommand, HookError>>,
    ) -> Result<StateCommand, PhaseError> {
        match outcome {
            Ok(Ok(cmd)) => Ok(cmd),
            Ok(Err(source)) => Err(Self::hook_error(phase, hook, Ok(source))),
            Err(panic) => Err(Self::hook_error(phase, hook, Err(panic))),
        }
    }

    /// The phase error for a hook that returned `Ok(error)` or panicked (`Err(payload)`).
    fn hook_error(
        phase: Phase,
        hook: &RegisteredHook,
        failure: std::thread::Result<HookError>,
    ) -> PhaseError {
        match failure {
            Ok(source) => PhaseError::HookFailed {
                phase,
                plugin_id: hook.plugin_id.to_string(),
                hook: hook.name.to_string(),
                source,
            },
            Err(panic) => PhaseError::HookPanicked {
                phase,
                plugin_id: hook.plugin_id.to_string(),
                hook: hook.name.to_string(),
                message: panic_message(&*panic),
            },
        }
    }

    /// Runs a hook's synchronous path, if it has one (no future is made).
    fn run_hook_sync(
        phase: Phase,
        hook: &RegisteredHook,
        ctx: &PhaseContext,
    ) -> Option<Result<StateCommand, PhaseError>> {
        match std::panic::catch_unwind(AssertUnwindSafe(|| hook.hook.run_sync(ctx))) {
            Ok(None) => None,
            Ok(Some(Ok(cmd))) => Some(Ok(cmd)),
            Ok(Some(Err(e))) => Some(Err(Self::hook_error(phase, hook, Ok(e)))),
            Err(panic) => Some(Err(Self::hook_error(phase, hook, Err(panic)))),
        }
    }

    async fn run_hook(
        phase: Phase,
        hook: &RegisteredHook,
        ctx: &PhaseContext,
    ) -> Result<StateCommand, PhaseError> {
        if let Some(result) = Self::run_hook_sync(phase, hook, ctx) {
            return result;
        }
        // The future is made inside the caught one: a hook panicking while making it is caught;
        // one abandoned (a cancelled run) is dropped under a guard.
        let outcome = AssertUnwindSafe(async {
            Abandonable::new(hook.hook.run(ctx), &hook.plugin_id, &hook.name).await
        })
        .catch_unwind()
        .await;
        Self::hook_failed(phase, hook, outcome)
    }
    /// Applies `cmd` to the transaction, moving its actions to `pending`.
    fn stage(
        &self,
        tx: &mut Transaction<'_>,
        mut cmd: StateCommand,
        pending: &mut Vec<(String, String, Value)>,
    ) -> Result<(), StateError> {
        self.validate(&cmd)?;
        let actions = take_actions(&mut cmd);
        tx.apply(cmd)?;
        pending.extend(actions);
        Ok(())
    }

    /// Runs `hooks` on the frozen context (those with a synchronous path right away, the others
    /// driven together) and offers their commands to one [`ParallelBatch`] in registration
    /// order. Returns the batch and the indexes of the hooks whose command did not join it (to
    /// be re-run, their first output discarded). The first failure in registration order fails
    /// the phase.
    async fn run_hooks(
        phase: Phase,
        hooks: &[RegisteredHook],
        frozen: &PhaseContext,
        registry: &KeyRegistry,
    ) -> Result<(StateCommand, Vec<usize>), PhaseError> {
        let mut batch = ParallelBatch::with_capacity(registry, hooks.len());
        let mut deferred = Vec::new();
        let mut failed: Option<(usize, PhaseError)> = None;
        // Hooks that must be awaited, and every output from the first of them on: those join
        // the batch (in order) once the waiting is over.
        let mut waiting = Vec::new();
        let mut held: Vec<Option<StateCommand>> = Vec::new();
        for (i, hook) in hooks.iter().enumerate() {
            // The hook's own result, matched here rather than through `run_hook_sync`: most
            // commands go straight to the batch without being moved through a wrapper.
            let failure =
                match std::panic::catch_unwind(AssertUnwindSafe(|| hook.hook.run_sync(frozen))) {
                    Ok(Some(Ok(cmd))) => {
                        if !waiting.is_empty() {
                            held.push(Some(cmd));
                        } else if !batch.offer(cmd) {
                            deferred.push(i);
                        }
                        continue;
                    }
                    Ok(None) => {
                        waiting.push(i);
                        held.push(None);
                        continue;
                    }
                    Ok(Some(Err(e))) => Ok(e),
                    Err(panic) => Err(panic),
                };
            failed.get_or_insert_with(|| (i, Self::hook_error(phase, hook, failure)));
            if !waiting.is_empty() {
                held.push(None);
            }
        }
        if let Some(&first) = waiting.first() {
            let done = join_all(waiting.iter().map(|&i| async move {
                let hook = &hooks[i];
                let outcome = AssertUnwindSafe(async {
                    Abandonable::new(hook.hook.run(frozen), &hook.plugin_id, &hook.name).await
                })
                .catch_unwind()
                .await;
                Self::hook_failed(phase, &hooks[i], outcome)
            }))
            .await;
            for (&i, result) in waiting.iter().zip(done) {
                match result {
                    Ok(cmd) => held[i - first] = Some(cmd),
                    Err(e) if failed.as_ref().is_none_or(|(f, _)| i < *f) => failed = Some((i, e)),
                    Err(_) => {}
                }
            }
            if failed.is_none() {
                for (k, cmd) in held.into_iter().enumerate() {
                    if let Some(cmd) = cmd
                        && !batch.offer(cmd)
                    {
                        deferred.push(first + k);
                    }
                }
            }
        }
        match failed {
            Some((_, e)) => Err(e), // the first failure in registration order
            None => Ok((batch.into_command(), deferred)),
        }
    }

    async fn gather(&self, ctx: &PhaseContext, report: &mut PhaseReport) -> Result<(), PhaseError> {
        let phase = ctx.phase;
        let hooks = self.inner.env.hooks(phase);
        if hooks.is_empty() {
            return Ok(());
        }
        let store = &*self.inner.store;
        let registry = store.registry();
        let mut tx = store.transaction();
        // The caller's context usually holds this very state already; reuse it then.
        let fresh;
        let frozen = if ctx.snapshot.revision() == tx.base_revision() && !ctx.snapshot.is_staged() {
            ctx
        } else {
            fresh = ctx.with_snapshot(tx.snapshot());
            &fresh
        };
        let (batch, deferred) = Self::run_hooks(phase, hooks, frozen, registry).await?;
        let mut pending = Vec::new();
        self.stage(&mut tx, batch, &mut pending)?;
        if !deferred.is_empty() {
            report.fallback = true;
            for i in deferred {
                let hook = &hooks[i];
                report
                    .deferred_hooks
                    .push(format!("{}/{}", hook.plugin_id, hook.name));
                let fresh = ctx.with_snapshot(tx.snapshot());
                let cmd = Self::run_hook(phase, hook, &fresh).await?;
                self.stage(&mut tx, cmd, &mut pending)?;
            }
        }
        if !pending.is_empty() {
            tx.apply(
                StateCommand::new()
                    .with_update::<ActionQueueKey>(QueueUpdate::Enqueue { actions: pending }),
            )?;
        }
        if tx.is_empty() {
            return Ok(());
        }
        let committed = tx.commit()?;
        report.gather_committed = true;
        let stats = self.dispatch_effects(&committed).await;
        report.effects.add(stats);
        Ok(())
    }

    async fn execute(
        &self,
        ctx: &PhaseContext,
        max_rounds: usize,
        report: &mut PhaseReport,
    ) -> Result<(), PhaseError> {
        let phase = ctx.phase;
        let name = phase.as_str();
        let store = &*self.inner.store;
        let mut round = 0usize;
        loop {
            let snapshot = store.snapshot();
            let queue = snapshot.get::<ActionQueueKey>()?;
            let batch: Vec<QueuedAction> = queue.for_phase(name).cloned().collect();
            if batch.is_empty() {
                report.actions_left = queue.items.len();
                report.revision = snapshot.revision();
                break;
            }
            if round == max_rounds {
                return Err(StateError::PhaseRunLoopExceeded {
                    phase: name.to_owned(),
                    max_rounds,
                }
                .into());
            }
            round += 1;
            for action in batch {
                if ctx.cancel.is_cancelled() {
                    return Err(PhaseError::Cancelled { phase });
                }
                // Boxed: most phases process no action, and their future need not hold room
                // for one.
                match Box::pin(self.process_action(ctx, &action)).await? {
                    Ok(stats) => {
                        report.actions_processed += 1;
                        report.effects.add(stats);
                    }
                    Err(reason) => {
                        let letters = self.dead_letter(vec![action], &reason)?;
                        report.dead_lettered.extend(letters);
                    }
                }
            }
        }
        report.rounds = round;
        Ok(())
    }

    /// Runs one action's handler and commits its command with the action's removal. The outer
    /// `Err` is an engine failure; the inner `Err` is a reason to dead-letter the action.
    async fn process_action(
        &self,
        ctx: &PhaseContext,
        action: &QueuedAction,
    ) -> Result<Result<EffectStats, String>, PhaseError> {
        let Some(registered) = self.inner.env.action(&action.key) else {
            return Ok(Err(format!(
                "no handler is registered for scheduled action `{}`",
                action.key
            )));
        };
        let fresh = ctx.with_snapshot(self.inner.store.snapshot());
        let handled = AssertUnwindSafe(async {
            Abandonable::new(
                registered.handler.handle_json(&fresh, &action.payload),
                &registered.plugin_id,
                &action.key,
            )
            .await
        })
        .catch_unwind()
        .await;
        // A failure names the handler's plugin, as an effect handler's does.
        let mut cmd = match handled {
            Ok(Ok(cmd)) => cmd,
            Ok(Err(failure)) => {
                return Ok(Err(format!("plugin `{}`: {failure}", registered.plugin_id)));
            }
            Err(panic) => {
                let failure = HandlerFailure::Panicked {
                    key: action.key.clone(),
                    message: panic_message(&*panic),
                };
                return Ok(Err(format!("plugin `{}`: {failure}", registered.plugin_id)));
            }
        };
        if let Err(e) = self.validate(&cmd) {
            return Ok(Err(format!(
                "handler of `{}` returned an invalid command: {e}",
                action.key
            )));
        }
        let actions = take_actions(&mut cmd);
        cmd.update::<ActionQueueKey>(QueueUpdate::Remove {
            ids: vec![action.id],
        });
        if !actions.is_empty() {
            cmd.update::<ActionQueueKey>(QueueUpdate::Enqueue { actions });
        }
        match self.inner.store.commit(cmd) {
            Ok(committed) => Ok(Ok(self.dispatch_effects(&committed).await)),
            Err(e) => Ok(Err(format!(
                "command of `{}` did not commit: {e}",
                action.key
            ))),
        }
    }

    /// Removes `actions` from the queue and records them as dead letters, in one commit.
    fn dead_letter(
        &self,
        actions: Vec<QueuedAction>,
        reason: &str,
    ) -> Result<Vec<DeadLetter>, PhaseError> {
        if actions.is_empty() {
            return Ok(Vec::new());
        }
        for a in &actions {
            tracing::warn!(action = %a.key, phase = %a.phase, reason, "scheduled action dead-lettered");
        }
        let letters: Vec<DeadLetter> = actions
            .into_iter()
            .map(|action| DeadLetter {
                action,
                reason: reason.to_owned(),
            })
            .collect();
        let mut cmd = StateCommand::new();
        cmd.update::<ActionQueueKey>(QueueUpdate::Remove {
            ids: letters.iter().map(|l| l.action.id).collect(),
        });
        cmd.update::<DeadLettersKey>(letters.clone());
        self.inner.store.commit(cmd)?;
        Ok(letters)
    }

    /// Dead-letters every action still queued (for phases that will not run again), with
    /// `reason`. The runtime calls this when a run ends.
    pub fn dead_letter_remaining(&self, reason: &str) -> Result<Vec<DeadLetter>, PhaseError> {
        let queue = self
            .inner
            .store
            .snapshot()
            .get::<ActionQueueKey>()?
            .items
            .clone();
        self.dead_letter(queue, reason)
    }

    /// Dead-letters queued actions that no handler of this environment can process (a resumed
    /// run resolved a different plugin set), with `reason`.
    pub fn dead_letter_unhandled(&self, reason: &str) -> Result<Vec<DeadLetter>, PhaseError> {
        let env = &self.inner.env;
        let orphans: Vec<QueuedAction> = self
            .inner
            .store
            .snapshot()
            .get::<ActionQueueKey>()?
            .items
            .iter()
            .filter(|a| {
                env.action(&a.key)
                    .is_none_or(|h| h.handler.phase().as_str() != a.phase)
            })
            .cloned()
            .collect();
        self.dead_letter(orphans, reason)
    }

    /// Dispatches a commit's effects in emission order, each handler seeing that commit's
    /// snapshot. Failures are logged, counted and returned in the stats, never propagated.
    pub async fn dispatch_effects(&self, committed: &Committed) -> EffectStats {
        let mut stats = EffectStats::default();
        if committed.effects.is_empty() {
            return stats;
        }
        let ctx = EffectContext {
            snapshot: committed.snapshot.clone(),
            engine: self.clone(),
        };
        for effect in &committed.effects {
            stats.attempted += 1;
            let Some(registered) = self.inner.env.effect(&effect.key) else {
                stats.failed += 1;
                tracing::error!(effect = %effect.key, "effect has no handler");
                stats.failures.push(EffectFailure {
                    effect: effect.key.clone(),
                    plugin_id: None,
                    reason: "no handler is registered".to_owned(),
                });
                continue;
            };
            let outcome = AssertUnwindSafe(registered.handler.handle_json(&ctx, &effect.payload))
                .catch_unwind()
                .await;
            let failure = match outcome {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e,
                Err(panic) => HandlerFailure::Panicked {
                    key: effect.key.clone(),
                    message: panic_message(&*panic),
                },
            };
            let failure = EffectFailure::of_handler(&effect.key, &registered.plugin_id, failure);
            stats.failed += 1;
            tracing::warn!(effect = %effect.key, plugin = %registered.plugin_id, failure = %failure.reason, "effect handler failed");
            stats.failures.push(failure);
        }
        stats
    }
}
