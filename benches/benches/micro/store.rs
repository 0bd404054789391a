//! `awaken-store`: the cost of one step's commit (2 messages, 3 changed keys, a 1-call batch,
//! 3 lifecycle events) to SQLite on disk, to SQLite when the thread already holds 10,000
//! messages (a commit's cost must not grow with the thread), and to the memory store. The keys
//! are what the runtime commits (typed values shared with a snapshot, names borrowed from the
//! registry); `store/memory_commit_step_json` commits them as JSON built by hand, which the
//! memory store copies.

use std::cell::Cell;
use std::hint::black_box;

use awaken_event::{
    AgentEvent, Message, RunId, ThreadId, TokenUsage, ToolCall, ToolCallId, ToolResult,
};
use awaken_state::{
    KeyOptions, KeyRegistry, KeyScope, PersistedState, StateDelta, StateError, StateKey, StateStore,
};
use awaken_store::Timestamp;
use awaken_store::{MemoryStore, RunRecord, SqliteConfig, SqliteStore, ThreadCommit, ThreadStore};
use awaken_tool::ToolBatch;
use criterion::{BatchSize, Criterion};
use serde_json::json;

/// Commits per thread in the step benches, so the thread stays short there.
const COMMITS_PER_THREAD: u64 = 64;

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
enum StepState {
    /// As the runtime exports them: the run's and the thread's changed keys of one snapshot.
    Typed(StateDelta, StateDelta),
    /// As JSON a caller builds by hand (names and values owned by the commit).
    Json,
}

impl StepState {
    fn typed() -> Self {
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

fn step_commit(thread: &str, expected: u64, step: u32, state: &StepState) -> ThreadCommit {
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
            stop_reason: awaken_event::StopReason::ToolCalls,
        },
        AgentEvent::StepEnd { step },
    ])
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

/// Commits one step per iteration into threads of at most `COMMITS_PER_THREAD` steps (or into
/// one thread prefilled elsewhere when `fixed` names it). The caller's commit is dropped inside
/// the measurement, as a runtime lets go of what it committed.
fn bench_commits(
    c: &mut Criterion,
    name: &str,
    fixed: Option<(&str, u64)>,
    state: &StepState,
    commit: impl Fn(&ThreadCommit),
) {
    let counter = Cell::new(0u64);
    let fixed_count = Cell::new(fixed.map_or(0, |(_, n)| n));
    c.bench_function(name, |b| {
        b.iter_batched(
            || {
                let i = counter.get();
                counter.set(i + 1);
                let step = u32::try_from(i % 1_000_000).unwrap_or(0) + 1;
                match fixed {
                    Some((thread, _)) => {
                        let expected = fixed_count.get();
                        fixed_count.set(expected + 2);
                        step_commit(thread, expected, step, state)
                    }
                    None => step_commit(
                        &format!("bench-{}", i / COMMITS_PER_THREAD),
                        (i % COMMITS_PER_THREAD) * 2,
                        step,
                        state,
                    ),
                }
            },
            |c| commit(black_box(&c)),
            BatchSize::SmallInput,
        );
    });
}

pub fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let typed = StepState::typed();

    let sqlite = rt
        .block_on(SqliteStore::open(SqliteConfig::file(
            dir.path().join("step.db"),
        )))
        .unwrap_or_else(|e| panic!("open sqlite: {e}"));
    bench_commits(c, "store/sqlite_commit_step", None, &typed, |commit| {
        rt.block_on(sqlite.commit(commit))
            .unwrap_or_else(|e| panic!("commit: {e}"));
    });

    // The same commit into a thread that already holds 10,000 messages.
    let long = rt
        .block_on(SqliteStore::open(SqliteConfig::file(
            dir.path().join("long.db"),
        )))
        .unwrap_or_else(|e| panic!("open sqlite: {e}"));
    let mut held = 0u64;
    for chunk in 0..10u32 {
        let messages = (0..1_000).map(|i| Message::user(format!("earlier message {chunk}/{i}")));
        let fill = step_commit("long", held, chunk + 1, &typed);
        let fill = ThreadCommit {
            messages: messages.collect(),
            ..fill
        };
        held = rt
            .block_on(long.commit(&fill))
            .unwrap_or_else(|e| panic!("prefill: {e}"))
            .message_count;
    }
    bench_commits(
        c,
        "store/sqlite_commit_at_10k_messages",
        Some(("long", held)),
        &typed,
        |commit| {
            rt.block_on(long.commit(commit))
                .unwrap_or_else(|e| panic!("commit: {e}"));
        },
    );

    let memory = MemoryStore::new();
    bench_commits(c, "store/memory_commit_step", None, &typed, |commit| {
        awaken_benches::block_on(memory.commit(commit)).unwrap_or_else(|e| panic!("commit: {e}"));
    });
    let memory = MemoryStore::new();
    bench_commits(
        c,
        "store/memory_commit_step_json",
        None,
        &StepState::Json,
        |commit| {
            awaken_benches::block_on(memory.commit(commit))
                .unwrap_or_else(|e| panic!("commit: {e}"));
        },
    );
}
