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
            let v = b.to_json().unwrap_or_default();
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
    let log = Arc::new(Mutex::new(Vec::new()));
    let written = log.clone();
    let store = Arc::new(Intercepted::new(
        Arc::new(MemoryStore::new()),
        move |commit| {
            let keys = |d: &awaken_state::StateDelta| {
                let mut k: Vec<String> = d.values.iter().map(|(k, _)| k.to_string()).collect();
                k.sort();
                k.join(",")
            };
            written.lock().expect("log").push(format!(
                "steps={} out={} run[{}] thread[{}]",
                commit.run.steps,
                commit.run.usage.output_tokens,
                keys(&commit.run_state),
                keys(&commit.thread_state),
            ));
            Ok(())
        },
    ));
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
