//! [`AgentRuntime`]: the façade callers run agents through (run, resume, recover, take over,
//! start, shutdown, reload), over what its clones share.

use std::collections::BTreeMap;
use std::sync::Arc;

use awaken_event::{
    CancellationToken, EventSink, Message, NullSink, RunId, SuspendTicket, ThreadId,
};
use awaken_plugin::{
    HookStats, LifecycleEvent, LifecycleHook, PluginError, RegistryError, ReloadOutcome,
};
use awaken_resolver::Resolver;
use awaken_store::{ClaimedRun, RunRecord, RunStatus, StoreError, ThreadStore};

use crate::activation::{self, Start};
use crate::active::ShutdownMode;
use crate::error::RunError;
use crate::inner::RuntimeInner;
use crate::outcome::RunOutcome;
use crate::recovered::{RecoveredRun, Takeover};
use crate::request::{RecoverConfig, RunActivation};
use crate::resume::{Resume, recorded_decisions, suspended_calls};
use crate::steering::Steering;

/// Runs agents. Cheap to clone (clones share everything).
#[derive(Clone)]
pub struct AgentRuntime {
    inner: Arc<RuntimeInner>,
}

impl AgentRuntime {
    pub(crate) fn from_inner(inner: Arc<RuntimeInner>) -> Self {
        Self { inner }
    }
}

impl AgentRuntime {
    /// What the runtime's clones share, for the activation and the run.
    pub(crate) fn inner(&self) -> &RuntimeInner {
        &self.inner
    }
}

impl std::fmt::Debug for AgentRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRuntime").finish_non_exhaustive()
    }
}

impl AgentRuntime {
    /// The resolver (every run resolves its agent afresh through it).
    pub fn resolver(&self) -> &Resolver {
        &self.inner.resolver
    }

    /// The thread store.
    pub fn store(&self) -> &Arc<dyn ThreadStore> {
        &self.inner.store
    }

    /// Fires `on_runtime_start` of every plugin that implements it (`Plugin::lifecycle_hooks`;
    /// in the plugin source: plugins added directly, then those of the plugin registries), each
    /// within the lifecycle timeout; a failing
    /// hook is counted in [`AgentRuntime::lifecycle_stats`], not fatal.
    pub async fn start(&self) {
        let plugins = self.inner.resolver.registries().plugins();
        self.inner
            .lifecycle
            .dispatch(&plugins, LifecycleEvent::RuntimeStart)
            .await;
    }

    /// Shuts the runtime down: refuses new activations (`RunError::ShuttingDown`), waits for
    /// the active ones or cancels them first (`mode`), then fires `on_runtime_shutdown` of every
    /// plugin that implements it.
    pub async fn shutdown(&self, mode: ShutdownMode) {
        self.inner.active.close(mode);
        self.inner.active.idle().await;
        self.shutdown_hooks().await;
    }

    /// [`shutdown`](Self::shutdown), waiting at most `limit` for the activations (and the
    /// releases of dropped runs' leases) to end; the plugins' shutdown hooks run either way.
    /// Whether everything ended in time.
    pub async fn shutdown_within(&self, mode: ShutdownMode, limit: std::time::Duration) -> bool {
        self.inner.active.close(mode);
        let idle = tokio::time::timeout(limit, self.inner.active.idle())
            .await
            .is_ok();
        self.shutdown_hooks().await;
        idle
    }

    async fn shutdown_hooks(&self) {
        let plugins = self.inner.resolver.registries().plugins();
        self.inner
            .lifecycle
            .dispatch(&plugins, LifecycleEvent::RuntimeShutdown)
            .await;
    }

    /// The worker identity this runtime's runs hold their leases under, and the lease's
    /// duration (`None`: its runs hold no lease, so a recovery in this process could claim one
    /// of them while it runs).
    pub fn worker(&self) -> Option<(&str, std::time::Duration)> {
        self.inner
            .worker
            .as_ref()
            .map(|w| (w.id.as_str(), w.lease_duration))
    }

    /// A new run id from the runtime's id source, for a run started later with
    /// [`RunActivation::with_run_id`] (a queued run, whose id is known when it is enqueued).
    pub fn next_run_id(&self) -> RunId {
        self.inner.ids.next_run_id()
    }

    /// How many activations are running now.
    pub fn active_runs(&self) -> usize {
        self.inner.active.count()
    }

    /// Calls, failures and timeouts of every plugin's lifecycle hooks so far.
    pub fn lifecycle_stats(&self) -> BTreeMap<(String, LifecycleHook), HookStats> {
        self.inner.lifecycle.all_stats()
    }

    /// The last failure of a plugin's lifecycle hook: its error, or its caught panic as
    /// `PluginError::Panicked` (`None` if it never failed).
    pub fn lifecycle_failure(
        &self,
        plugin_id: &str,
        hook: LifecycleHook,
    ) -> Option<Arc<PluginError>> {
        self.inner.lifecycle.last_failure(plugin_id, hook)
    }

    /// Rebuilds every plugin registry of the runtime from its sources: the next run sees the
    /// new plugins and agent definitions; runs in progress keep the resolution they started
    /// with. A repeated `reload_id` is a no-op. A registry one of whose plugins refuses the
    /// reload (an `on_reload` error or panic) keeps its plugins, and the error is returned.
    pub async fn reload(&self, reload_id: &str) -> Result<Vec<ReloadOutcome>, RegistryError> {
        let mut outcomes = Vec::new();
        for registry in self.inner.resolver.registries().plugin_registries() {
            outcomes.push(registry.reload(reload_id).await?);
        }
        Ok(outcomes)
    }

    /// The thread's stored history (empty for an unknown thread).
    pub async fn history(&self, thread_id: &ThreadId) -> Result<Vec<Message>, StoreError> {
        Ok(self
            .inner
            .store
            .load_checkpoint(thread_id)
            .await?
            .map(|c| c.messages)
            .unwrap_or_default())
    }

    /// Runs `activation` to its end, streaming events to `sink`.
    ///
    /// (Not an `async fn`, and the same to await: the activation is boxed when the future is
    /// made, so an in-flight run's future does not carry it by value for its whole life.)
    pub fn run<'a>(
        &'a self,
        activation: RunActivation,
        sink: &'a dyn EventSink,
    ) -> impl Future<Output = Result<RunOutcome, RunError>> + Send + 'a {
        activation::activate(&self.inner, Start::Fresh(activation), sink)
    }

    /// Runs `activation` to its end without streaming.
    pub fn run_to_completion(
        &self,
        activation: RunActivation,
    ) -> impl Future<Output = Result<RunOutcome, RunError>> + Send + '_ {
        self.run(activation, &NullSink)
    }

    /// Continues the run waiting on `resume.thread_id` with decisions on its suspended calls,
    /// streaming the new activation's events to `sink`. Every decision is checked before any
    /// is applied; while some suspended call has no decision the run keeps waiting (the
    /// decisions given are recorded) and the activation ends `Suspended` again.
    pub async fn resume(
        &self,
        resume: Resume,
        sink: &dyn EventSink,
    ) -> Result<RunOutcome, RunError> {
        activation::activate(&self.inner, Start::Resume(resume), sink).await
    }

    /// [`AgentRuntime::resume`] without streaming.
    pub async fn resume_to_completion(&self, resume: Resume) -> Result<RunOutcome, RunError> {
        self.resume(resume, &NullSink).await
    }

    /// Continues unfinished runs after a crash: claims up to `config.limit` runs whose lease is
    /// free or expired (a run still written by a live worker holds its lease), keeps each lease
    /// with a heartbeat while the run is driven, and releases it at the end. A `Requested` call
    /// is gated again; an `Executing` call with no result follows its tool's recovery policy
    /// and is never silently re-run. Runs waiting for a human are left waiting. Each recovered
    /// run streams its activation to `sink`, one after another; the first takes its steering
    /// messages from `config.steering` when that is set.
    pub async fn recover(
        &self,
        config: &RecoverConfig,
        sink: &dyn EventSink,
    ) -> Result<Vec<RecoveredRun>, RunError> {
        let now = self.inner.ids.timestamp();
        let claims = self
            .inner
            .store
            .claim_runnable(&config.worker_id, config.lease_duration, now, config.limit)
            .await
            .map_err(RunError::Store)?;
        let mut recovered = Vec::with_capacity(claims.len());
        let mut steering = config.steering.clone();
        for claimed in claims {
            let foreign = config
                .agents
                .as_ref()
                .is_some_and(|a| !a.iter().any(|id| **id == *claimed.run.agent_id));
            // A run `continuable` leaves out is released at once; another worker serves a
            // foreign agent; a cancelled recovery starts nothing.
            if !continuable(&claimed.run) || foreign || config.cancel.is_cancelled() {
                self.inner.release(&claimed.lease).await;
                continue;
            }
            let steering = steering.take().unwrap_or_default();
            recovered.push(self.continue_claimed(claimed, config, steering, sink).await);
        }
        Ok(recovered)
    }

    /// Continues the unfinished run of one thread whose worker is gone, the way `recover`
    /// continues a run it claimed: for a worker that takes over a queued job naming the thread.
    ///
    /// When the thread's latest run is `Running` (not waiting for decisions, not a delegate's
    /// child run), claims its lease for `config.worker_id`; once claimed, keeps the lease with a
    /// heartbeat while the run is driven from its last checkpoint (streamed to `sink`), releases
    /// it at the end, and returns [`Takeover::Recovered`]. While another worker holds the lease
    /// (the run is live, or its worker died and the lease has not expired) nothing is run:
    /// [`Takeover::Held`], to try again later. Anything else is [`Takeover::Nothing`] with the
    /// latest run's record. `config.limit`, `config.agents` and `config.steering` do not apply
    /// (the caller names the thread; [`take_over_steered`](Self::take_over_steered) takes an
    /// inbox). A cancelled `config.cancel` ends the claimed run `Cancelled` with its
    /// checkpoint, before its next step when it was cancelled before the claim: a cancel of
    /// the run is never left with the run still `Running` for a later recovery to go on with.
    pub async fn take_over(
        &self,
        thread_id: &ThreadId,
        config: &RecoverConfig,
        sink: &dyn EventSink,
    ) -> Result<Takeover, RunError> {
        self.take_over_with(thread_id, config, None, sink).await
    }

    /// [`take_over`](Self::take_over) for the caller's run `run_id`: that run, when it is the
    /// one continued, takes its steering messages from `steering` (its activation closes the
    /// inbox as it ends). Another unfinished run of the thread (one an earlier job gave up on,
    /// or a stopped process left) is not continued but ended `Cancelled` at its checkpoint, as
    /// under a cancelled `config.cancel`: the caller's run comes after it, and nobody waits for
    /// it any more. The inbox is left open then, for the caller's next activation.
    pub async fn take_over_steered(
        &self,
        thread_id: &ThreadId,
        config: &RecoverConfig,
        run_id: &RunId,
        steering: Steering,
        sink: &dyn EventSink,
    ) -> Result<Takeover, RunError> {
        self.take_over_with(thread_id, config, Some((run_id, steering)), sink)
            .await
    }

    async fn take_over_with(
        &self,
        thread_id: &ThreadId,
        config: &RecoverConfig,
        steered: Option<(&RunId, Steering)>,
        sink: &dyn EventSink,
    ) -> Result<Takeover, RunError> {
        Ok(match self.claim_to_take_over(thread_id, config).await? {
            Ok(claimed) => {
                let ended;
                let (config, steering) = match steered {
                    Some((run_id, steering)) if claimed.run.run_id == *run_id => (config, steering),
                    Some(_) => {
                        let cancel = CancellationToken::new();
                        cancel.cancel();
                        ended = config.clone().with_cancel(cancel);
                        (&ended, Steering::new())
                    }
                    None => (config, Steering::new()),
                };
                Takeover::Recovered(self.continue_claimed(claimed, config, steering, sink).await)
            }
            Err(takeover) => takeover,
        })
    }

    /// The lease of the thread's unfinished run, for `take_over`; otherwise what it answers.
    async fn claim_to_take_over(
        &self,
        thread_id: &ThreadId,
        config: &RecoverConfig,
    ) -> Result<Result<ClaimedRun, Takeover>, RunError> {
        let latest = self.latest_run(thread_id).await?;
        let run_id = match &latest {
            Some(run) if continuable(run) => run.run_id.clone(),
            _ => return Ok(Err(Takeover::Nothing { latest })),
        };
        let claimed = self
            .inner
            .store
            .claim_run(
                &run_id,
                &config.worker_id,
                config.lease_duration,
                self.inner.ids.timestamp(),
            )
            .await
            .map_err(RunError::Store)?;
        match claimed {
            // The run's worker suspended it (or it was superseded) since it was read.
            Some(claimed) if !continuable(&claimed.run) => {
                self.inner.release(&claimed.lease).await;
                Ok(Err(Takeover::Nothing {
                    latest: Some(claimed.run),
                }))
            }
            Some(claimed) => Ok(Ok(claimed)),
            None => {
                // Refused: another worker holds the lease, or the run ended since it was read.
                let latest = self.latest_run(thread_id).await?;
                Ok(Err(match latest {
                    Some(run) if run.run_id == run_id && continuable(&run) => {
                        Takeover::Held { run_id }
                    }
                    latest => Takeover::Nothing { latest },
                }))
            }
        }
    }

    /// The tickets of the calls the thread's run still waits on: suspended and not decided by
    /// an earlier partial resume (empty when it waits on nothing).
    pub async fn waiting_calls(
        &self,
        thread_id: &ThreadId,
    ) -> Result<Vec<SuspendTicket>, RunError> {
        let Some(cp) = self
            .inner
            .store
            .load_checkpoint(thread_id)
            .await
            .map_err(RunError::Store)?
        else {
            return Ok(Vec::new());
        };
        if cp
            .run
            .as_ref()
            .is_none_or(|r| r.status != RunStatus::Waiting)
        {
            return Ok(Vec::new());
        }
        // Calls an earlier (partial) resume already decided do not wait any more.
        let decided = recorded_decisions(&cp.run_state).unwrap_or_default();
        Ok(cp
            .batch
            .map(|b| {
                suspended_calls(&b)
                    .into_iter()
                    .filter(|(id, _)| !decided.iter().any(|d| d.call_id == *id))
                    .map(|(_, t)| t)
                    .collect()
            })
            .unwrap_or_default())
    }
}

impl AgentRuntime {
    /// Continues the run whose lease `claimed` holds, from its last checkpoint: keeps the
    /// lease with a heartbeat while the run is driven, and releases it at the end.
    async fn continue_claimed(
        &self,
        claimed: ClaimedRun,
        config: &RecoverConfig,
        steering: Steering,
        sink: &dyn EventSink,
    ) -> RecoveredRun {
        let lease = claimed.lease.clone();
        let thread_id = claimed.thread_id.clone();
        let run_id = claimed.run.run_id.clone();
        let cancel = config.cancel.child_token();
        let heartbeat =
            self.inner
                .spawn_heartbeat(lease.clone(), config.lease_duration, cancel.clone());
        let start = Start::Recover(claimed.into(), cancel, steering);
        let outcome = activation::activate(&self.inner, start, sink).await;
        heartbeat.stop();
        // A finished run's last commit released the lease; a waiting or failed one did not.
        self.inner.release(&lease).await;
        RecoveredRun {
            thread_id,
            run_id,
            outcome,
        }
    }

    /// The thread's latest run (`None`: the thread has none, or is unknown).
    async fn latest_run(&self, thread_id: &ThreadId) -> Result<Option<RunRecord>, RunError> {
        self.inner
            .store
            .latest_run(thread_id)
            .await
            .map_err(RunError::Store)
    }
}

/// Whether a recovery continues the unfinished run `run`: it is `Running`, not waiting for a
/// human's decision (a resume continues that), and not a delegate's child run (its parent's
/// call continues it, the delegate tool re-run with the same key).
fn continuable(run: &RunRecord) -> bool {
    run.status == RunStatus::Running && run.parent_run_id.is_none()
}
