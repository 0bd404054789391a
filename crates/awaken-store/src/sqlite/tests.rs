use awaken_event::{Message, RunId, ThreadId};
use awaken_state::{
    KeyOptions, KeyRegistry, KeyScope, StateDelta, StateError, StateKey, StateStore,
};

use super::*;

fn step(n: u64) -> ThreadCommit {
    let run = RunRecord::new(
        RunId::new("r1").expect("id"),
        "agent",
        Timestamp::from_unix_millis(1),
    );
    ThreadCommit::new(ThreadId::new("t1").expect("id"), run, n)
        .with_messages([Message::user(format!("message {n}"))])
}

async fn open(dir: &tempfile::TempDir, config: fn(PathBuf) -> SqliteConfig) -> SqliteStore {
    SqliteStore::open(config(dir.path().join("awaken.db")))
        .await
        .expect("open")
}

#[tokio::test]
async fn a_commit_runs_inline_only_when_allowed_and_the_connection_is_free() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(&dir, SqliteConfig::file).await;
    let receipt = store
        .commit_now(&step(0))
        .expect("inline")
        .expect("written");
    assert_eq!(receipt.message_count, 1);
    // Busy (another commit or read holds the connection): left unchanged, not waited for
    // on the caller's thread.
    let held = store.conn.lock().expect("lock");
    let back = step(1);
    assert!(store.commit_now(&back).is_none(), "not written at once");
    drop(held);
    store.commit(&back).await.expect("written on the pool");
    // Not allowed: asked not to, or every commit waits for the disk.
    for config in [
        |p: PathBuf| SqliteConfig::file(p).with_inline_commits(false),
        |p: PathBuf| SqliteConfig::file(p).with_synchronous(Synchronous::Full),
    ] {
        let dir = tempfile::tempdir().expect("dir");
        let store = open(&dir, config).await;
        assert!(store.commit_now(&step(0)).is_none(), "not written at once");
        assert!(
            store.list_threads().await.expect("listed").is_empty(),
            "nothing written"
        );
    }
}

#[tokio::test]
async fn an_inline_commit_never_waits_for_another_processs_write_lock() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(&dir, SqliteConfig::file).await;
    store
        .commit_now(&step(0))
        .expect("inline")
        .expect("written");
    // Another connection (as another process would) holds the write lock, and lets it go
    // a moment later: a commit that waited for it (the store's busy timeout is 5 s) would
    // then be written inline; one that does not wait writes nothing at once.
    let other = Connection::open(dir.path().join("awaken.db")).expect("open");
    other.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        other.execute_batch("COMMIT").expect("released");
    });
    let back = step(1);
    assert!(
        store.commit_now(&back).is_none(),
        "not written, not waited for"
    );
    releaser.join().expect("releaser");
    // The pool path writes it (waiting for the lock, were it still held).
    let receipt = store.commit(&back).await.expect("written on the pool");
    assert_eq!(receipt.message_count, 2);
}

#[tokio::test]
async fn every_write_counts_towards_the_next_checkpoint() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(&dir, SqliteConfig::file).await;
    let checkpoints = store.checkpoints.clone().expect("own checkpoints");
    for n in 0..u64::from(WRITES_PER_CHECKPOINT - 1) {
        store
            .commit_now(&step(n))
            .expect("inline")
            .expect("written");
    }
    assert_eq!(
        checkpoints.writes.load(Ordering::Relaxed),
        WRITES_PER_CHECKPOINT - 1
    );
    // A write that is not a commit (here, deleting a thread) starts the checkpoint.
    let other = ThreadId::new("other").expect("id");
    store.delete_thread(&other).await.expect("deleted");
    assert_eq!(checkpoints.writes.load(Ordering::Relaxed), 0);
    // Reads do not count.
    store.list_threads().await.expect("listed");
    assert_eq!(checkpoints.writes.load(Ordering::Relaxed), 0);
}

#[test]
fn a_checkpoint_dropped_unrun_does_not_stop_the_next_ones() {
    let checkpoints = Arc::new(Checkpoints::default());
    checkpoints.running.store(true, Ordering::Release);
    // What a runtime shutting down does to a queued blocking task: drops it unrun.
    drop(CheckpointDone(Arc::clone(&checkpoints)));
    assert!(!checkpoints.running.load(Ordering::Acquire));
}

#[tokio::test]
async fn an_in_memory_database_runs_commits_inline_without_checkpoints() {
    let store = SqliteStore::open(SqliteConfig::in_memory())
        .await
        .expect("open");
    assert!(store.checkpoints.is_none());
    store
        .commit_now(&step(0))
        .expect("inline")
        .expect("written");
}

/// A state value whose serialization panics (a bug in a key's `Serialize`).
#[derive(Clone, Default, serde::Deserialize)]
struct Broken;

impl serde::Serialize for Broken {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("serializing a broken value")
    }
}

struct BrokenKey;

impl StateKey for BrokenKey {
    const KEY: &'static str = "test.broken";
    type Value = Broken;
    type Update = ();
    fn apply(_: &mut Broken, (): ()) -> Result<(), StateError> {
        Ok(())
    }
}

/// Run-scoped state whose one changed key panics when the store serializes it.
fn broken_run_state() -> StateDelta {
    let mut registry = KeyRegistry::new();
    registry
        .register_key::<BrokenKey>(KeyOptions::new().with_scope(KeyScope::Run))
        .expect("key");
    let state = StateStore::new(registry);
    state.update::<BrokenKey>(()).expect("update");
    let [run] = state.snapshot().export_changed_in_each([KeyScope::Run], 0);
    run
}

#[tokio::test]
async fn a_panic_inside_an_inline_commit_is_a_typed_error_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(&dir, SqliteConfig::file).await;
    store
        .commit_now(&step(0))
        .expect("inline")
        .expect("written");
    let broken = step(1).with_run_state(broken_run_state());
    let err = store
        .commit_now(&broken)
        .expect("inline")
        .expect_err("panicked");
    assert!(
        matches!(&err, CommitError::Backend(StoreError::Task { detail }) if detail.contains("serializing a broken value")),
        "{err:?}"
    );
    let thread = ThreadId::new("t1").expect("id");
    let stored = store
        .load_checkpoint(&thread)
        .await
        .expect("load")
        .expect("thread");
    assert_eq!(
        stored.messages.len(),
        1,
        "the panicked commit wrote nothing"
    );
    // The connection still works, inline.
    let receipt = store
        .commit_now(&step(1))
        .expect("inline")
        .expect("written");
    assert_eq!(receipt.message_count, 2);
}

/// Frames in the WAL (read through a second connection: a passive checkpoint that finds
/// nothing to copy reports the log's size).
fn wal_frames(path: &std::path::Path) -> i64 {
    let conn = Connection::open(path).expect("open");
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))
        .expect("checkpoint")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn inline_commits_keep_the_wal_short_with_checkpoints_on_the_blocking_pool() {
    wal_stays_short(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn commits_on_the_blocking_pool_count_towards_checkpoints_too() {
    wal_stays_short(false).await;
}

/// Commits `4 * WRITES_PER_CHECKPOINT` steps (through `commit_now` if `inline`, else
/// through `commit`) and checks the WAL was checkpointed along the way.
async fn wal_stays_short(inline: bool) {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(&dir, SqliteConfig::file).await;
    let checkpoints = store.checkpoints.clone().expect("inline commits");
    let commits = 4 * WRITES_PER_CHECKPOINT;
    let mut frames_after_first_commits = 0;
    for n in 0..u64::from(commits) {
        if inline {
            store
                .commit_now(&step(n))
                .expect("inline")
                .expect("written");
        } else {
            store.commit(&step(n)).await.expect("written");
        }
        if n == 9 {
            frames_after_first_commits = wal_frames(&dir.path().join("awaken.db"));
        }
        // Let a scheduled checkpoint finish (it holds the connection meanwhile; a commit
        // finding it busy would go to the blocking pool).
        while checkpoints.running.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    // Without checkpoints (SQLite's automatic ones are off) the WAL would hold every
    // commit's frames: about `commits / 10` times the first ten commits'.
    let frames = wal_frames(&dir.path().join("awaken.db"));
    assert!(frames_after_first_commits > 0);
    assert!(
        frames < frames_after_first_commits * i64::from(WRITES_PER_CHECKPOINT) / 5,
        "{frames} frames in the WAL after {commits} commits ({frames_after_first_commits} after 10)"
    );
}

/// Sets the connection's page limit (`PRAGMA max_page_count`), returning its page count.
fn limit_pages(store: &SqliteStore, room: i64) -> i64 {
    let conn = store.conn.lock().expect("lock");
    let pages: i64 = conn
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .expect("page count");
    let limit: i64 = conn
        .query_row(
            &format!("PRAGMA max_page_count = {}", pages + room),
            [],
            |r| r.get(0),
        )
        .expect("page limit");
    assert_eq!(limit, pages + room);
    pages
}

/// A full database (its page limit reached) fails a commit with a typed storage failure naming
/// the file, through `commit_now` and `commit`, writes nothing of it, and stays readable with
/// the last commit whole; with room again, the same commit goes through.
#[tokio::test]
async fn a_full_database_fails_the_commit_and_keeps_the_last_one() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("awaken.db");
    let store = open(&dir, SqliteConfig::file).await;
    let big = |expected: u64| {
        let run = RunRecord::new(
            RunId::new("r1").expect("id"),
            "agent",
            Timestamp::from_unix_millis(1),
        );
        ThreadCommit::new(ThreadId::new("t1").expect("id"), run, expected)
            .with_messages([Message::user(format!("{expected} {}", "x".repeat(8_000)))])
    };
    store.commit(&big(0)).await.expect("room for one");
    limit_pages(&store, 4);
    let mut written = 1;
    let (full, err) = loop {
        let c = big(written);
        match store.commit(&c).await {
            Ok(_) => written += 1,
            Err(e) => break (c, e),
        }
        assert!(written < 20, "the database never filled up");
    };
    let render = |e: &CommitError| match e {
        CommitError::Backend(e @ StoreError::Sqlite { source, .. }) => format!(
            "{:?} {:?} {:?}: {}",
            e.kind(),
            source.sqlite_error_code(),
            e.database().and_then(Database::name) == Some(&*path.display().to_string()),
            e.to_string().replace(&path.display().to_string(), "<db>")
        ),
        other => format!("another error: {other:?}"),
    };
    let inline = store
        .commit_now(&full)
        .expect("the connection is free")
        .expect_err("still full");
    expect_test::expect![[r#"
        Storage Some(DiskFull) true: SQLite database <db>: database or disk is full
        Storage Some(DiskFull) true: SQLite database <db>: database or disk is full"#]]
    .assert_eq(&format!("{}\n{}", render(&err), render(&inline)));

    let messages = |store: &SqliteStore| {
        let store = store.clone();
        async move {
            store
                .load_checkpoint(&ThreadId::new("t1").expect("id"))
                .await
                .expect("readable")
                .expect("the thread")
                .messages
        }
    };
    let kept = messages(&store).await;
    assert_eq!(kept.len() as u64, written);
    assert!(
        kept[kept.len() - 1]
            .text()
            .starts_with(&format!("{} x", written - 1))
    );
    assert_eq!(store.list_threads().await.expect("listed").len(), 1);

    limit_pages(&store, 1_000);
    store.commit(&full).await.expect("room again");
    assert_eq!(messages(&store).await.len() as u64, written + 1);
}
