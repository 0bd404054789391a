//! The committed-fact boundary: what each commit of a run carries, and that the store holds
//! the run's history and lifecycle events.

use std::sync::{Arc, Mutex};

use awaken_event::{ThreadId, VecSink, check_activation};
use awaken_llm::{ScriptTurn, ScriptedExecutor};
use awaken_runtime::{AgentRuntime, RunActivation, SequentialIds};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_store::{BatchWrite, MemoryStore, SqliteConfig, SqliteStore, ThreadStore};
use serde_json::json;

use crate::support::{Echo, Intercepted};

/// A memory store that writes down what every commit carries, in `log`.
fn recording(log: Arc<Mutex<Vec<String>>>) -> Intercepted {
    Intercepted::new(Arc::new(MemoryStore::new()), move |commit| {
        let events: Vec<&str> = commit.events.iter().map(|e| e.type_name()).collect();
        log.lock().expect("log").push(format!(
            "{} msgs+{} batch={} events={}",
            commit.run.status,
            commit.messages.len(),
            batch(&commit.batch),
            events.join(",")
        ));
        Ok(())
    })
}

fn batch(write: &BatchWrite) -> String {
    match write {
        BatchWrite::Keep => "keep".into(),
        BatchWrite::Clear => "clear".into(),
        BatchWrite::Set(b) => {
            let states: Vec<String> = b
                .calls()
                .iter()
                .map(|c| format!("{}:{}", c.id(), c.state()))
                .collect();
            format!("[{}]", states.join(","))
        }
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
    let log = Arc::new(Mutex::new(Vec::new()));
    let store = Arc::new(recording(log.clone()));
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
    .assert_eq(&log.lock().expect("log").join("\n"));

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
    let dir = crate::support::fresh_dir("durable-second-run");
    let path = dir.join("threads.db");
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
}

/// Every commit carries the run's counts as they are when it is made, and exactly the state
/// keys changed since the commit before: a commit made with the state unchanged (the call's
/// `Executing`, the run's end) carries no key and the counts of the one before.
#[tokio::test]
async fn each_commit_carries_the_counts_and_the_keys_changed_since_the_last() {
    // Both ways a commit is written carry the same: at once (the run's kept commit, its state
    // lists reused) and through the store's future (a copy of it).
    for immediate in [true, false] {
        let log = Arc::new(Mutex::new(Vec::new()));
        let written = log.clone();
        let store = Intercepted::new(Arc::new(MemoryStore::new()), move |commit| {
            written.lock().expect("log").push(format!(
                "steps={} out={} run[{}] thread[{}]",
                commit.run.steps,
                commit.run.usage.output_tokens,
                keys(&commit.run_state),
                keys(&commit.thread_state),
            ));
            Ok(())
        });
        let store = Arc::new(if immediate { store.immediate() } else { store });
        let usage = |output_tokens| awaken_event::TokenUsage {
            input_tokens: 10,
            output_tokens,
            ..Default::default()
        };
        let turns = vec![
            ScriptTurn::text("")
                .with_tool_call(
                    awaken_llm::ScriptToolCall::new("echo", json!({"text": "x"})).with_id("c1"),
                )
                .with_usage(usage(3)),
            ScriptTurn::text("done").with_usage(usage(5)),
        ];
        let rt = runtime(store, turns);
        rt.run_to_completion(
            RunActivation::new(ThreadId::new("t").expect("id"), "agent").with_user_message("go"),
        )
        .await
        .expect("run");
        expect_test::expect![[r#"
            steps=0 out=0 run[] thread[]
            steps=0 out=3 run[awaken.stop.run_stats] thread[]
            steps=0 out=3 run[] thread[]
            steps=1 out=3 run[awaken.stop.run_stats] thread[]
            steps=2 out=8 run[awaken.stop.run_stats] thread[]
            steps=2 out=8 run[] thread[]"#]]
        .assert_eq(&log.lock().expect("log").join("\n"));
    }
}

/// A delta's key names, sorted.
fn keys(delta: &awaken_state::StateDelta) -> String {
    let mut k: Vec<String> = delta.values.iter().map(|(k, _)| k.to_string()).collect();
    k.sort();
    k.join(",")
}

/// Runs the two-step agent against a memory store that refuses its `refused`-th commit (from
/// 0) once, on the immediate path; returns what each commit carried, what the store holds of
/// the thread, and the events the sink saw.
async fn refused_once(refused: usize) -> String {
    let log = Arc::new(Mutex::new(Vec::new()));
    let written = log.clone();
    let commits = std::sync::atomic::AtomicUsize::new(0);
    let store = Arc::new(
        Intercepted::new(Arc::new(MemoryStore::new()), move |commit| {
            let n = commits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let events: Vec<&str> = commit.events.iter().map(|e| e.type_name()).collect();
            written.lock().expect("log").push(format!(
                "{}{} msgs+{} run[{}] batch={} events={}",
                if n == refused { "refused: " } else { "" },
                commit.run.status,
                commit.messages.len(),
                keys(&commit.run_state),
                batch(&commit.batch),
                events.join(",")
            ));
            if n == refused {
                return Err(awaken_store::StoreError::Task {
                    detail: "refused once".into(),
                }
                .into());
            }
            Ok(())
        })
        .immediate(),
    );
    let rt = runtime(store.clone(), turns());
    let thread = ThreadId::new("t").expect("id");
    let sink = VecSink::new();
    let _ = rt
        .run(
            RunActivation::new(thread.clone(), "agent").with_user_message("go"),
            &sink,
        )
        .await;
    let checkpoint = store
        .load_checkpoint(&thread)
        .await
        .expect("load")
        .expect("thread");
    let stored = store.load_events(&thread, 0).await.expect("events");
    let kinds: Vec<&str> = stored.iter().map(|e| e.event.type_name()).collect();
    let held = format!(
        "{} messages, run {:?}, batch held: {}\n{}",
        checkpoint.messages.len(),
        checkpoint.run.map(|r| r.status),
        checkpoint.batch.is_some(),
        kinds.join(",")
    );
    let seen: Vec<&str> = sink.events().iter().map(|e| e.type_name()).collect();
    let carried = log.lock().expect("log").join("\n");
    format!("{carried}\nstored: {held}\nseen: {}", seen.join(","))
}

/// A commit the store refuses (here the second step's) leaves its messages and events with
/// the run: the run fails, and its last commit carries them once, before its own; the store
/// then holds each message and event once, and the sink saw each event once.
#[tokio::test]
async fn a_refused_commits_messages_and_events_are_written_once_by_the_next() {
    expect_test::expect![[r#"
        running msgs+1 run[] batch=keep events=run_start
        running msgs+1 run[awaken.stop.run_stats] batch=[c1:requested] events=step_start,tool_call_start,inference_complete
        running msgs+0 run[] batch=[c1:executing] events=tool_call_ready
        running msgs+1 run[awaken.stop.run_stats] batch=clear events=tool_call_done,step_end
        refused: running msgs+1 run[awaken.stop.run_stats] batch=keep events=step_start,inference_complete,step_end
        done msgs+1 run[awaken.stop.run_stats] batch=keep events=step_start,inference_complete,error,step_end,run_finish
        stored: 4 messages, run Some(Done), batch held: false
        run_start,step_start,tool_call_start,inference_complete,tool_call_ready,tool_call_done,step_end,step_start,inference_complete,error,step_end,run_finish
        seen: run_start,step_start,tool_call_start,tool_call_args_delta,inference_complete,tool_call_ready,tool_call_done,step_end,step_start,text_delta,inference_complete,error,step_end,run_finish"#]].assert_eq(&refused_once(4).await);
}

/// A refused commit that cleared the batch (the tool's result): the run's last commit clears
/// it (the store still held the call `Executing`, which a finished run may not keep), so the
/// run ends stored, with the result.
#[tokio::test]
async fn a_refused_batch_change_is_written_by_the_next_commit() {
    expect_test::expect![[r#"
        running msgs+1 run[] batch=keep events=run_start
        running msgs+1 run[awaken.stop.run_stats] batch=[c1:requested] events=step_start,tool_call_start,inference_complete
        running msgs+0 run[] batch=[c1:executing] events=tool_call_ready
        refused: running msgs+1 run[awaken.stop.run_stats] batch=clear events=tool_call_done,step_end
        done msgs+1 run[awaken.stop.run_stats] batch=clear events=error,tool_call_done,step_end,run_finish
        stored: 3 messages, run Some(Done), batch held: false
        run_start,step_start,tool_call_start,inference_complete,tool_call_ready,error,tool_call_done,step_end,run_finish
        seen: run_start,step_start,tool_call_start,tool_call_args_delta,inference_complete,tool_call_ready,error,tool_call_done,step_end,run_finish"#]].assert_eq(&refused_once(3).await);
}
