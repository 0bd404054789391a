//! The committed-fact boundary: what each commit of a run carries, and that the store holds
//! the run's history and lifecycle events.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use awaken_event::{ProfileId, ThreadId, VecSink, check_activation};
use awaken_llm::{ScriptTurn, ScriptedExecutor};
use awaken_runtime::{AgentRuntime, RunActivation, SequentialIds};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_store::{
    BatchWrite, Checkpoint, ClaimedRun, CommitReceipt, LeaseToken, MemoryStore, ProfileState,
    RunRecord, SqliteConfig, SqliteStore, StoreError, StoredEvent, ThreadCommit, ThreadStore,
    ThreadSummary, Timestamp,
};
use serde_json::json;

use crate::support::Echo;

/// A memory store that writes down what every commit carries.
#[derive(Default)]
struct Recording {
    inner: MemoryStore,
    log: Mutex<Vec<String>>,
}

fn batch(write: &BatchWrite) -> String {
    match write {
        BatchWrite::Keep => "keep".into(),
        BatchWrite::Clear => "clear".into(),
        BatchWrite::Set(v) => {
            let calls = v["calls"].as_array().cloned().unwrap_or_default();
            let states: Vec<String> = calls
                .iter()
                .map(|c| {
                    format!(
                        "{}:{}",
                        c["call"]["id"].as_str().unwrap_or("?"),
                        c["state"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            format!("[{}]", states.join(","))
        }
    }
}

#[async_trait]
impl ThreadStore for Recording {
    async fn commit(&self, commit: ThreadCommit) -> Result<CommitReceipt, StoreError> {
        let events: Vec<&str> = commit.events.iter().map(|e| e.type_name()).collect();
        let line = format!(
            "{} msgs+{} batch={} events={}",
            commit.run.status,
            commit.messages.len(),
            batch(&commit.batch),
            events.join(",")
        );
        self.log.lock().expect("log").push(line);
        self.inner.commit(commit).await
    }
    async fn load_checkpoint(&self, t: &ThreadId) -> Result<Option<Checkpoint>, StoreError> {
        self.inner.load_checkpoint(t).await
    }
    async fn load_profile(&self, p: &ProfileId) -> Result<ProfileState, StoreError> {
        self.inner.load_profile(p).await
    }
    async fn list_threads(&self) -> Result<Vec<ThreadSummary>, StoreError> {
        self.inner.list_threads().await
    }
    async fn list_runs(&self, t: &ThreadId) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.list_runs(t).await
    }
    async fn load_events(&self, t: &ThreadId, since: u64) -> Result<Vec<StoredEvent>, StoreError> {
        self.inner.load_events(t, since).await
    }
    async fn delete_thread(&self, t: &ThreadId) -> Result<bool, StoreError> {
        self.inner.delete_thread(t).await
    }
    async fn claim_runnable(
        &self,
        w: &str,
        d: std::time::Duration,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<ClaimedRun>, StoreError> {
        self.inner.claim_runnable(w, d, now, limit).await
    }
    async fn heartbeat(
        &self,
        l: &LeaseToken,
        d: std::time::Duration,
        now: Timestamp,
    ) -> Result<Timestamp, StoreError> {
        self.inner.heartbeat(l, d, now).await
    }
    async fn release(&self, l: &LeaseToken) -> Result<bool, StoreError> {
        self.inner.release(l).await
    }
    async fn claim_run(
        &self,
        run_id: &awaken_event::RunId,
        worker: &str,
        lease: std::time::Duration,
        now: Timestamp,
    ) -> Result<Option<ClaimedRun>, StoreError> {
        self.inner.claim_run(run_id, worker, lease, now).await
    }
}

fn runtime(store: Arc<dyn ThreadStore>, turns: Vec<ScriptTurn>) -> AgentRuntime {
    AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_store(store)
        .with_model(ModelSpec::new("model", "scripted", "upstream"))
        .with_provider(
            "scripted",
            Arc::new(ScriptedExecutor::from_turns(turns).expect("script")),
        )
        .with_tool(Arc::new(Echo))
        .with_agent_spec(AgentSpec::new("agent", "model"))
        .build()
        .expect("runtime")
}

fn turns() -> Vec<ScriptTurn> {
    vec![
        ScriptTurn::text("").with_tool_call(
            awaken_llm::ScriptToolCall::new("echo", json!({"text": "x"})).with_id("c1"),
        ),
        ScriptTurn::text("done"),
    ]
}

#[tokio::test]
async fn each_durable_boundary_is_one_commit() {
    let store = Arc::new(Recording::default());
    let rt = runtime(store.clone(), turns());
    let thread = ThreadId::new("t").expect("id");
    let sink = VecSink::new();
    rt.run(
        RunActivation::new(thread.clone(), "agent").with_user_message("go"),
        &sink,
    )
    .await
    .expect("run");
    expect_test::expect![[r#"
        running msgs+1 batch=keep events=run_start
        running msgs+1 batch=[c1:requested] events=step_start,tool_call_start,inference_complete
        running msgs+0 batch=[c1:executing] events=tool_call_ready
        running msgs+1 batch=clear events=tool_call_done,step_end
        running msgs+1 batch=keep events=step_start,inference_complete,step_end
        done msgs+0 batch=keep events=run_finish"#]]
    .assert_eq(&store.log.lock().expect("log").join("\n"));

    // The store holds the history and a well-formed activation of lifecycle events.
    let history = rt.history(&thread).await.expect("history");
    assert_eq!(history.len(), 4);
    let stored: Vec<_> = store
        .load_events(&thread, 0)
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.event)
        .collect();
    assert!(check_activation(&stored).is_ok(), "{stored:?}");
    assert_eq!(
        stored.len(),
        sink.events().iter().filter(|e| e.is_lifecycle()).count()
    );
}

#[tokio::test]
async fn a_second_run_continues_the_stored_thread_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("awaken-runtime-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("threads.db");
    let _ = std::fs::remove_file(&path);
    let store: Arc<dyn ThreadStore> = Arc::new(
        SqliteStore::open(SqliteConfig::file(&path))
            .await
            .expect("sqlite"),
    );
    let thread = ThreadId::new("t").expect("id");
    let first = runtime(store.clone(), vec![ScriptTurn::text("one")]);
    first
        .run_to_completion(RunActivation::new(thread.clone(), "agent").with_user_message("a"))
        .await
        .expect("run");
    // A fresh runtime (its own ids) on the same file sees the thread and appends to it.
    let executor =
        Arc::new(ScriptedExecutor::from_turns(vec![ScriptTurn::text("two")]).expect("script"));
    let second = AgentRuntime::builder()
        .with_store(store.clone())
        .with_model(ModelSpec::new("model", "scripted", "upstream"))
        .with_provider("scripted", executor.clone())
        .with_agent_spec(AgentSpec::new("agent", "model"))
        .build()
        .expect("runtime");
    second
        .run_to_completion(RunActivation::new(thread.clone(), "agent").with_user_message("b"))
        .await
        .expect("run");
    let texts: Vec<String> = second
        .history(&thread)
        .await
        .expect("history")
        .iter()
        .map(|m| m.text())
        .collect();
    assert_eq!(texts, vec!["a", "one", "b", "two"]);
    assert_eq!(
        executor.requests()[0].messages.len(),
        3,
        "the second run's request carries the stored history"
    );
    assert_eq!(store.list_runs(&thread).await.expect("runs").len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}
