//! The runtime every part of the soak builds the same way (in process, the children of the
//! kill part, the parent recovering them): the two agents, their models, the tools, run ids
//! with a prefix of the builder's choosing, and the sink that records an activation's events.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use awaken_event::{AgentEvent, CancellationToken, EventSink, RunId};
use awaken_runtime::{AgentRuntime, IdSource};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_store::ThreadStore;
use serde_json::json;

use crate::model::{LoopModel, ProviderFaults};
use crate::plan::{MAX_RETRIES, Shape};
use crate::tools::{Echo, Effect, Ledger};

/// Run ids `<prefix><n>` (unique across the processes sharing a file when their prefixes
/// differ), and the system clock.
struct SoakIds {
    prefix: String,
    next: AtomicU64,
}

impl IdSource for SoakIds {
    fn next_run_id(&self) -> RunId {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        RunId::new(format!("{}{n}", self.prefix))
            .unwrap_or_else(|e| unreachable!("the soak's run ids are short and plain: {e}"))
    }

    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A runtime over `store` with the loop-5 and loop-50 agents (their models injecting the
/// faults armed in `faults`), `effect` recording in `ledger`, and run ids `<run_prefix><n>`.
/// The agents retry a retryable provider error [`MAX_RETRIES`] times without a pause.
pub(crate) fn runtime(
    store: Arc<dyn ThreadStore>,
    faults: &Arc<ProviderFaults>,
    ledger: Arc<Ledger>,
    run_prefix: &str,
) -> anyhow::Result<AgentRuntime> {
    let mut builder = AgentRuntime::builder()
        .with_ids(Arc::new(SoakIds {
            prefix: run_prefix.to_owned(),
            next: AtomicU64::new(1),
        }))
        .with_store(store)
        .with_tool(Arc::new(Effect(ledger)))
        .with_tool(Arc::new(Echo));
    for shape in Shape::ALL {
        let model = format!("{}-model", shape.agent());
        builder = builder
            .with_model(ModelSpec::new(&model, shape.agent(), "loop"))
            .with_provider(
                shape.agent(),
                Arc::new(LoopModel::new(shape.steps(), Arc::clone(faults))),
            )
            .with_agent_spec(
                AgentSpec::new(shape.agent(), model)
                    .with_system_prompt("Call the tools, then say done.")
                    .with_max_rounds(shape.steps() + 1)
                    .with_section(
                        "retry",
                        json!({
                            "max_retries": MAX_RETRIES,
                            "initial_backoff": "0ms",
                            "max_backoff": "0ms",
                            "jitter": false
                        }),
                    ),
            );
    }
    builder.build().context("building the soak's runtime")
}

/// Records an activation's events; cancels a token when a chosen event arrives.
#[derive(Default)]
pub(crate) struct Recorder {
    state: Mutex<Recording>,
}

#[derive(Default)]
struct Recording {
    events: Vec<AgentEvent>,
    /// Cancel this token when the sink holds this many events.
    cancel_at: Option<(usize, CancellationToken)>,
}

impl Recorder {
    /// Forgets the events recorded (keeping their room) and sets what to cancel when.
    pub(crate) fn reset(&self, cancel_at: Option<(usize, CancellationToken)>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.events.clear();
        state.cancel_at = cancel_at;
    }

    /// Reads the events recorded so far.
    pub(crate) fn with_events<T>(&self, f: impl FnOnce(&[AgentEvent]) -> T) -> T {
        f(&self.state.lock().unwrap_or_else(|e| e.into_inner()).events)
    }
}

impl EventSink for Recorder {
    fn emit(&self, event: &AgentEvent) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.events.push(event.clone());
        if let Some((at, token)) = &state.cancel_at
            && state.events.len() == *at
        {
            token.cancel();
        }
    }
}
