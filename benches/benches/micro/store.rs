//! `awaken-store`: the cost of one step's commit (2 messages, 3 changed keys, a 1-call batch,
//! 3 lifecycle events) to SQLite on disk, to SQLite when the thread already holds 10,000
//! messages (a commit's cost must not grow with the thread), and to the memory store. The keys
//! are what the runtime commits (typed values shared with a snapshot, names borrowed from the
//! registry); `store/memory_commit_step_json` commits them as JSON built by hand, which the
//! memory store copies. The commits come from `awaken_benches::step_commit`, which the fleet
//! program's PostgreSQL commit figure shares.

use std::cell::Cell;
use std::hint::black_box;

use awaken_benches::step_commit::{StepState, nth_step_commit, step_commit};
use awaken_event::Message;
use awaken_store::{MemoryStore, SqliteConfig, SqliteStore, ThreadCommit, ThreadStore};
use criterion::{BatchSize, Criterion};

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
                match fixed {
                    Some((thread, _)) => {
                        let expected = fixed_count.get();
                        fixed_count.set(expected + 2);
                        let step = u32::try_from(i % 1_000_000).unwrap_or(0) + 1;
                        step_commit(thread, expected, step, state)
                    }
                    None => nth_step_commit("bench", i, state),
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
