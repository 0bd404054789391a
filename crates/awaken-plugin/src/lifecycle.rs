//! Dispatching the observational lifecycle hooks: plugin order, a timeout per call, failures
//! (errors and caught panics) and timeouts logged and counted per plugin and hook, never
//! stopping the others.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use awaken_event::TerminationReason;

use crate::error::PluginError;
use crate::hooks::LifecycleHook;
use crate::isolate::{catch_panic, catch_panic_async};
use crate::plugin::{DelegateCall, Plugin, RunLifecycle};

/// The longest wait when a timeout is too long to add to now (about 30 years, as tokio's own
/// far-future deadline).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// Default time a lifecycle hook may take.
pub const DEFAULT_LIFECYCLE_TIMEOUT: Duration = Duration::from_secs(5);

/// One lifecycle moment with its arguments.
#[derive(Debug, Clone, Copy)]
pub enum LifecycleEvent<'a> {
    /// The runtime started.
    RuntimeStart,
    /// The runtime is shutting down.
    RuntimeShutdown,
    /// An activation started.
    RunStart(&'a RunLifecycle),
    /// An activation ended normally.
    RunComplete(&'a RunLifecycle, &'a TerminationReason),
    /// An activation failed.
    RunError(&'a RunLifecycle, &'a str),
    /// An activation was cancelled.
    RunCancel(&'a RunLifecycle),
    /// A delegate call starts.
    DelegateCallStart(&'a DelegateCall),
    /// A delegate call completed with a response.
    DelegateCallComplete(&'a DelegateCall, &'a str),
    /// A delegate call failed.
    DelegateCallError(&'a DelegateCall, &'a str),
    /// A delegate's result is being returned.
    DelegateReturnStart(&'a DelegateCall),
    /// A delegate's result was returned.
    DelegateReturnComplete(&'a DelegateCall),
    /// Returning a delegate's result failed.
    DelegateReturnError(&'a DelegateCall, &'a str),
}

impl LifecycleEvent<'_> {
    /// Which hook this event calls.
    pub fn hook(&self) -> LifecycleHook {
        match self {
            Self::RuntimeStart => LifecycleHook::RuntimeStart,
            Self::RuntimeShutdown => LifecycleHook::RuntimeShutdown,
            Self::RunStart(_) => LifecycleHook::RunStart,
            Self::RunComplete(..) => LifecycleHook::RunComplete,
            Self::RunError(..) => LifecycleHook::RunError,
            Self::RunCancel(_) => LifecycleHook::RunCancel,
            Self::DelegateCallStart(_) => LifecycleHook::DelegateCallStart,
            Self::DelegateCallComplete(..) => LifecycleHook::DelegateCallComplete,
            Self::DelegateCallError(..) => LifecycleHook::DelegateCallError,
            Self::DelegateReturnStart(_) => LifecycleHook::DelegateReturnStart,
            Self::DelegateReturnComplete(_) => LifecycleHook::DelegateReturnComplete,
            Self::DelegateReturnError(..) => LifecycleHook::DelegateReturnError,
        }
    }

    async fn call(&self, plugin: &dyn Plugin) -> Result<(), PluginError> {
        match *self {
            Self::RuntimeStart => plugin.on_runtime_start().await,
            Self::RuntimeShutdown => plugin.on_runtime_shutdown().await,
            Self::RunStart(r) => plugin.on_run_start(r).await,
            Self::RunComplete(r, t) => plugin.on_run_complete(r, t).await,
            Self::RunError(r, e) => plugin.on_run_error(r, e).await,
            Self::RunCancel(r) => plugin.on_run_cancel(r).await,
            Self::DelegateCallStart(c) => plugin.on_delegate_call_start(c).await,
            Self::DelegateCallComplete(c, s) => plugin.on_delegate_call_complete(c, s).await,
            Self::DelegateCallError(c, e) => plugin.on_delegate_call_error(c, e).await,
            Self::DelegateReturnStart(c) => plugin.on_delegate_return_start(c).await,
            Self::DelegateReturnComplete(c) => plugin.on_delegate_return_complete(c).await,
            Self::DelegateReturnError(c, e) => plugin.on_delegate_return_error(c, e).await,
        }
    }
}

/// Polls the future in `slot`; an emptied slot never finishes.
fn poll_slot<F: Future>(slot: Pin<&mut Option<F>>, cx: &mut Context<'_>) -> Poll<F::Output> {
    match slot.as_pin_mut() {
        Some(future) => future.poll(cx),
        None => Poll::Pending,
    }
}

/// Counters of one plugin's one hook.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HookStats {
    /// Calls made.
    pub calls: u64,
    /// Calls that returned an error or panicked.
    pub failures: u64,
    /// Calls that did not finish within the timeout.
    pub timeouts: u64,
    /// Time spent in the hook, in total.
    pub total_time: Duration,
}

/// Calls lifecycle hooks on plugins in order and keeps statistics. Cheap to clone (shared
/// statistics).
#[derive(Clone)]
pub struct LifecycleDispatcher {
    timeout: Duration,
    stats: Arc<Mutex<Tables>>,
}

/// Each plugin's counters, one per hook (indexed by `LifecycleHook as usize`). Keyed by the
/// plugin id and found by a borrowed id: counting a call allocates nothing after a plugin's
/// first.
type StatsTable =
    HashMap<String, [HookStats; LifecycleHook::ALL.len()], foldhash::fast::RandomState>;

/// The counters, and the last failure of each plugin's hook that ever failed (written only
/// when one fails).
#[derive(Default)]
struct Tables {
    counters: StatsTable,
    last_failures: BTreeMap<(String, LifecycleHook), Arc<PluginError>>,
}

/// One hook call's outcome, counted after the calls of one dispatch.
struct Outcome<'a> {
    plugin: &'a Arc<dyn Plugin>,
    /// The call's error, or its caught panic as [`PluginError::Panicked`].
    failure: Option<PluginError>,
    timed_out: bool,
    elapsed: Duration,
}

impl Default for LifecycleDispatcher {
    fn default() -> Self {
        Self::new(DEFAULT_LIFECYCLE_TIMEOUT)
    }
}

impl std::fmt::Debug for LifecycleDispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LifecycleDispatcher")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl LifecycleDispatcher {
    /// A dispatcher giving each hook call at most `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            stats: Arc::default(),
        }
    }

    /// Calls the event's hook on every plugin that implements it
    /// ([`Plugin::lifecycle_hooks`]), in order. Needs a tokio runtime with timers. Never fails
    /// and never panics: each failure (an error, or a panic of the hook — its future's drop at
    /// a timeout included — or of its plugin's `lifecycle_hooks`, caught as
    /// [`PluginError::Panicked`]) or timeout is logged and counted, and the last failure is
    /// kept ([`last_failure`](Self::last_failure)).
    pub async fn dispatch(&self, plugins: &[Arc<dyn Plugin>], event: LifecycleEvent<'_>) {
        let hook = event.hook();
        // Only the plugins implementing the hook are called and counted (each asked once; the
        // outcome names the plugin it counts for): a dispatch none of them implements reads no
        // clock, allocates nothing and takes no lock.
        let mut outcomes = Vec::new();
        // One clock reading per call: a call's end is the next one's start (read at the first
        // call).
        let mut clock = None;
        for plugin in plugins {
            let id = plugin.manifest().id.as_str();
            match catch_panic(|| plugin.lifecycle_hooks().contains(hook)) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(message) => {
                    // Whether it implements the hook is unknown: counted as a failed call.
                    let e = PluginError::panicked(id, "lifecycle_hooks", message);
                    tracing::warn!(plugin = id, hook = hook.as_str(), error = %e, "lifecycle hook failed");
                    outcomes.push(Outcome {
                        plugin,
                        failure: Some(e),
                        timed_out: false,
                        elapsed: Duration::ZERO,
                    });
                    continue;
                }
            }
            let started = *clock.get_or_insert_with(Instant::now);
            // In a slot, so that it is dropped in place under the guard below.
            let mut call = std::pin::pin!(Some(catch_panic_async(event.call(plugin.as_ref()))));
            // Polled once first: a hook that is done at once (most are) needs no timer. One
            // that waits is then raced against its deadline, counted from its start.
            let first = std::future::poll_fn(|cx| Poll::Ready(poll_slot(call.as_mut(), cx))).await;
            let outcome = match first {
                Poll::Ready(done) => Ok(done),
                Poll::Pending => {
                    // A timeout too long to add ("no timeout") waits as long as tokio can.
                    let deadline = started
                        .checked_add(self.timeout)
                        .unwrap_or_else(|| started + FAR_FUTURE);
                    let rest = std::future::poll_fn(|cx| poll_slot(call.as_mut(), cx));
                    tokio::time::timeout_at(deadline, rest).await
                }
            };
            // A hook abandoned at its timeout is dropped here: a panic in its cleanup is the
            // hook's failure.
            let dropped = catch_panic(|| call.as_mut().set(None));
            let ended = Instant::now();
            let elapsed = ended.saturating_duration_since(started);
            clock = Some(ended);
            let (mut failure, timed_out) = match outcome {
                Ok(Ok(Ok(()))) => (None, false),
                Ok(Ok(Err(e))) => (Some(e), false),
                Ok(Err(message)) => (
                    Some(PluginError::panicked(id, hook.as_str(), message)),
                    false,
                ),
                Err(_elapsed) => {
                    tracing::warn!(plugin = id, hook = hook.as_str(), timeout = ?self.timeout, "lifecycle hook timed out");
                    (None, true)
                }
            };
            if let Err(message) = dropped {
                failure = Some(PluginError::panicked(id, hook.as_str(), message));
            }
            if let Some(e) = &failure {
                tracing::warn!(plugin = id, hook = hook.as_str(), error = %e, "lifecycle hook failed");
            }
            outcomes.push(Outcome {
                plugin,
                failure,
                timed_out,
                elapsed,
            });
        }
        if outcomes.is_empty() {
            return;
        }
        // One lock for the whole dispatch (the table is shared by every run).
        let mut tables = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        let Tables {
            counters: stats,
            last_failures,
        } = &mut *tables;
        for outcome in outcomes {
            let id = outcome.plugin.manifest().id.as_str();
            let counters = match stats.get_mut(id) {
                Some(c) => c,
                None => stats.entry(id.to_owned()).or_default(),
            };
            let entry = &mut counters[hook as usize];
            entry.calls += 1;
            entry.failures += u64::from(outcome.failure.is_some());
            entry.timeouts += u64::from(outcome.timed_out);
            entry.total_time += outcome.elapsed;
            if let Some(e) = outcome.failure {
                last_failures.insert((id.to_owned(), hook), Arc::new(e));
            }
        }
    }

    /// Statistics of one plugin's hook.
    pub fn stats(&self, plugin_id: &str, hook: LifecycleHook) -> HookStats {
        let tables = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        tables
            .counters
            .get(plugin_id)
            .map(|c| c[hook as usize])
            .unwrap_or_default()
    }

    /// The last failure of one plugin's hook: the error it returned, or its caught panic as
    /// [`PluginError::Panicked`] (`None` if it never failed; a timeout is only counted).
    pub fn last_failure(&self, plugin_id: &str, hook: LifecycleHook) -> Option<Arc<PluginError>> {
        let tables = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        tables
            .last_failures
            .get(&(plugin_id.to_owned(), hook))
            .cloned()
    }

    /// Every statistic, by plugin and hook (hooks never called are left out).
    pub fn all_stats(&self) -> BTreeMap<(String, LifecycleHook), HookStats> {
        let tables = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        tables
            .counters
            .iter()
            .flat_map(|(id, counters)| {
                LifecycleHook::ALL
                    .iter()
                    .zip(counters)
                    .filter(|(_, c)| c.calls > 0)
                    .map(|(hook, c)| ((id.clone(), *hook), *c))
            })
            .collect()
    }
}
