//! One step's commit as the store benchmarks measure it on every backend: 2 messages, 3 changed
//! keys, a 1-call batch, 3 lifecycle events. The keys are what the runtime commits (typed values
//! shared with a snapshot, names borrowed from the registry), or JSON built by hand.

use awaken_event::{
    AgentEvent, Message, RunId, StopReason, ThreadId, TokenUsage, ToolCall, ToolCallId, ToolResult,
};
use awaken_state::{
    KeyOptions, KeyRegistry, KeyScope, PersistedState, StateDelta, StateError, StateKey, StateStore,
};
use awaken_store::{RunRecord, ThreadCommit, Timestamp};
use awaken_tool::ToolBatch;
use serde_json::json;

/// Commits per thread in a sequence of step commits ([`nth_step_commit`]), so the thread stays
/// short.
pub const COMMITS_PER_THREAD: u64 = 64;

/// A key whose update replaces its value.
macro_rules! set_key {
    ($name:ident, $key:literal, $value:ty) => {
        struct $name;
        impl StateKey for $name {
            const KEY: &'static str = $key;
            type Value = $value;
            type Update = $value;
            fn apply(value: &mut $value, update: $value) -> Result<(), StateError> {
                *value = update;
                Ok(())
            }
        }
    };
}

set_key!(Round, "loop.round", u32);
set_key!(Approved, "permission.approved", Vec<String>);
set_key!(Notes, "memory.notes", serde_json::Value);

/// The step's changed keys.
pub enum StepState {
    /// As the runtime exports them: the run's and the thread's changed keys of one snapshot.
    Typed(StateDelta, StateDelta),
    /// As JSON a caller builds by hand (names and values owned by the commit).
    Json,
}

impl StepState {
    /// The keys as the runtime exports them.
    pub fn typed() -> Self {
        let mut registry = KeyRegistry::new();
        let run = KeyOptions::new().with_scope(KeyScope::Run);
        let thread = KeyOptions::new().with_scope(KeyScope::Thread);
        let registered = registry
            .register_key::<Round>(run)
            .and_then(|()| registry.register_key::<Approved>(run))
            .and_then(|()| registry.register_key::<Notes>(thread));
        registered.unwrap_or_else(|e| panic!("{e}"));
        let state = StateStore::new(registry);
        let updated = state
            .update::<Round>(1)
            .and_then(|_| state.update::<Approved>(vec!["search".to_owned()]))
            .and_then(|_| state.update::<Notes>(json!({"city": "Berlin", "n": 1})));
        updated.unwrap_or_else(|e| panic!("{e}"));
        let [run, thread] = state
            .snapshot()
            .export_changed_in_each([KeyScope::Run, KeyScope::Thread], 0);
        StepState::Typed(run, thread)
    }

    /// The run's and the thread's deltas of step `step`.
    fn deltas(&self, step: u32) -> (StateDelta, StateDelta) {
        let revision = u64::from(step);
        match self {
            StepState::Typed(run, thread) => {
                let (mut run, mut thread) = (run.clone(), thread.clone());
                run.revision = revision;
                thread.revision = revision;
                (run, thread)
            }
            StepState::Json => (
                PersistedState {
                    revision,
                    values: [
                        ("loop.round".to_owned(), json!(step)),
                        ("permission.approved".to_owned(), json!(["search"])),
                    ]
                    .into(),
                }
                .into(),
                PersistedState {
                    revision,
                    values: [(
                        "memory.notes".to_owned(),
                        json!({"city": "Berlin", "n": step}),
                    )]
                    .into(),
                }
                .into(),
            ),
        }
    }
}

/// Step `step` of run `<thread>-run` on `thread`, which holds `expected` messages before it.
pub fn step_commit(thread: &str, expected: u64, step: u32, state: &StepState) -> ThreadCommit {
    let now = Timestamp::from_unix_millis(1_000 + i64::from(step));
    let mut run = RunRecord::new(
        RunId::new(format!("{thread}-run")).unwrap_or_else(|e| panic!("{e}")),
        "assistant",
        Timestamp::from_unix_millis(1_000),
    );
    run.updated_at = now;
    run.steps = step;
    run.spec_digest = "sha256:0123456789abcdef".into();
    run.usage = TokenUsage {
        input_tokens: 1_200,
        output_tokens: 80,
        ..TokenUsage::default()
    };
    let (run_state, thread_state) = state.deltas(step);
    ThreadCommit::new(
        ThreadId::new(thread).unwrap_or_else(|e| panic!("{e}")),
        run,
        expected,
    )
    .with_messages([
        Message::assistant("Let me look that up for you."),
        Message::user("Thanks, and what about tomorrow's weather in Berlin?"),
    ])
    .with_run_state(run_state)
    .with_thread_state(thread_state)
    .with_batch(weather_batch(step))
    .with_events([
        AgentEvent::StepStart { step },
        AgentEvent::InferenceComplete {
            model: "scripted".into(),
            usage: TokenUsage::default(),
            duration_ms: 120,
            stop_reason: StopReason::ToolCalls,
        },
        AgentEvent::StepEnd { step },
    ])
}

/// The `i`-th commit (from 0) of a sequence into threads `<prefix>-0`, `<prefix>-1`, … of
/// [`COMMITS_PER_THREAD`] steps each.
pub fn nth_step_commit(prefix: &str, i: u64, state: &StepState) -> ThreadCommit {
    let step = u32::try_from(i % 1_000_000).unwrap_or(0) + 1;
    step_commit(
        &format!("{prefix}-{}", i / COMMITS_PER_THREAD),
        (i % COMMITS_PER_THREAD) * 2,
        step,
        state,
    )
}

/// The step's batch: one `weather` call, run and succeeded.
fn weather_batch(step: u32) -> ToolBatch {
    let id = ToolCallId::new(format!("call-{step}")).unwrap_or_else(|e| panic!("{e}"));
    let mut batch = ToolBatch::new([ToolCall::new(
        id.clone(),
        "weather",
        json!({"city": "Berlin"}),
    )])
    .unwrap_or_else(|e| panic!("{e}"));
    batch.start(&id).unwrap_or_else(|e| panic!("{e}"));
    batch
        .succeed(&id, ToolResult::success(json!("12°C, cloudy")))
        .unwrap_or_else(|e| panic!("{e}"));
    batch
}
