//! [`AgentServer`]: the state every request shares (the runtime, the live runs, the admission
//! limit, the shutdown signal). Its router is made in `routes`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use awaken_event::CancellationToken;
use awaken_runtime::AgentRuntime;
use tokio::sync::Semaphore;

use awaken_store::RunQueue;

use crate::config::ServerConfig;
use crate::fleet::queued::{Front, QueueConfig};
use crate::live::LiveRuns;
use crate::sse::StreamContext;

/// An HTTP server of a runtime's agents. Cheap to clone (clones share everything).
#[derive(Clone)]
pub struct AgentServer {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) runtime: AgentRuntime,
    pub(crate) config: ServerConfig,
    pub(crate) live: Arc<LiveRuns>,
    /// One permit per run in flight.
    pub(crate) admission: Arc<Semaphore>,
    /// Cancelled when shutdown begins: streams end, new runs are refused.
    pub(crate) closing: CancellationToken,
    /// Set once recovery of unfinished runs has been started.
    pub(crate) ready: AtomicBool,
    /// The run queue, for a front end of a fleet: activations are queued, not driven here.
    pub(crate) front: Option<Arc<Front>>,
}

impl std::fmt::Debug for AgentServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentServer").finish_non_exhaustive()
    }
}

impl AgentServer {
    /// A server of `runtime`'s agents.
    pub fn new(runtime: AgentRuntime, config: ServerConfig) -> Self {
        Self::with_front(runtime, config, None)
    }

    /// A front end of a fleet: runs are queued in `queue` for the workers, and each one's
    /// stored events are streamed to its clients from the store, whichever worker drives it.
    /// `runtime` resolves the agents and reads the store (the queue's); it drives no run but a
    /// job cancelled before any worker claimed it, when it has a worker identity.
    pub fn queued(
        runtime: AgentRuntime,
        config: ServerConfig,
        queue: RunQueue,
        queue_config: QueueConfig,
    ) -> Self {
        Self::with_front(
            runtime,
            config,
            Some(Arc::new(Front::new(queue, queue_config))),
        )
    }

    fn with_front(runtime: AgentRuntime, config: ServerConfig, front: Option<Arc<Front>>) -> Self {
        Self {
            shared: Arc::new(Shared {
                live: Arc::new(LiveRuns::new(&config)),
                admission: Arc::new(Semaphore::new(config.max_runs_in_flight)),
                runtime,
                config,
                closing: CancellationToken::new(),
                ready: AtomicBool::new(false),
                front,
            }),
        }
    }

    /// Whether runs are queued for a fleet's workers rather than driven here.
    pub fn is_queued(&self) -> bool {
        self.shared.front.is_some()
    }

    /// The runtime.
    pub fn runtime(&self) -> &AgentRuntime {
        &self.shared.runtime
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.shared.config
    }

    /// Marks the server ready (`/readyz` answers 200): its store is open and recovery of
    /// unfinished runs has been started. [`crate::serve`] does this itself.
    pub fn set_ready(&self) {
        self.shared.ready.store(true, Ordering::Release);
    }

    /// How many runs are in flight in this server.
    pub fn runs_in_flight(&self) -> usize {
        self.shared.live.running().len()
    }

    /// Begins shutdown: new runs are refused (503) and every open stream is told and ended.
    /// Runs in flight go on; [`crate::serve`] then gives them the grace period.
    pub fn begin_shutdown(&self) {
        self.shared.closing.cancel();
    }

    pub(crate) fn stream_context(&self) -> StreamContext {
        StreamContext {
            store: self.shared.runtime.store().clone(),
            keep_alive: self.shared.config.keep_alive,
            closing: self.shared.closing.clone(),
        }
    }
}
