//! One run at a time per thread: a new run on a thread whose run is still running is refused,
//! naming that run; superseding closes it only once its process is gone (its lease free or
//! expired), with its open calls closed in call order; and a run left behind by a later run is
//! closed by the recovery that claims it, so it is not claimed for ever.

use std::sync::Arc;
use std::time::Duration;

use awaken_event::{
    AgentEvent, EffectClass, NullSink, Role, RunId, TerminationReason, ThreadId, ToolDescriptor,
    VecSink, check_activation,
};
use awaken_llm::{ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken_runtime::{
    AgentRuntime, RecoverConfig, RunActivation, RunError, SequentialIds, SystemIds,
};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_store::{
    MemoryStore, RunStatus, SqliteConfig, SqliteStore, ThreadCommit, ThreadStore, Timestamp,
};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use crate::support::{Echo, Intercepted};

/// A side-effecting tool that does nothing (its calls are what the test looks at).
struct Book;

#[async_trait::async_trait]
impl Tool for Book {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("book", "Books").with_effect(EffectClass::SideEffecting)
    }
    async fn execute(&self, _: &Value, _: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::success(json!("booked")))
    }
}

fn runtime(store: Arc<dyn ThreadStore>, turns: Vec<ScriptTurn>) -> AgentRuntime {
    AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_store(store)
        .with_model(ModelSpec::new("model", "p", "up"))
        .with_provider(
            "p",
            Arc::new(ScriptedExecutor::from_turns(turns).expect("script")),
        )
        .with_tool(Arc::new(Echo))
        .with_tool(Arc::new(Book))
        .with_agent_spec(AgentSpec::new("agent", "model"))
        .build()
        .expect("runtime")
}

fn thread() -> ThreadId {
    ThreadId::new("t").expect("id")
}

/// A thread whose run died after `alive` commits (its record left `Running`, no lease held):
/// the model asked for `echo` then `book` in one step.
async fn left_running(store: &Arc<dyn ThreadStore>, alive: usize) {
    let dying: Arc<dyn ThreadStore> = Arc::new(Intercepted::dies_after(store.clone(), alive));
    let turns = vec![
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": "a"})).with_id("c1"))
            .with_tool_call(ScriptToolCall::new("book", json!({})).with_id("c2")),
    ];
    let out = crate::support::unwritten_end(
        runtime(dying, turns)
            .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("first"))
            .await,
    );
    assert!(matches!(out, TerminationReason::Error { .. }));
    let runs = store.list_runs(&thread()).await.expect("runs");
    assert_eq!(runs.last().map(|r| r.status), Some(RunStatus::Running));
}

#[tokio::test]
async fn a_new_run_on_a_running_thread_is_refused_and_names_the_run() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    left_running(&store, 1).await;
    let rt = runtime(store.clone(), vec![ScriptTurn::text("second")]);
    let refused = rt
        .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("second"))
        .await;
    match refused {
        Err(RunError::ThreadBusy {
            run_id,
            status,
            lease_held,
            ..
        }) => {
            assert_eq!(run_id.as_str(), "run-1");
            assert_eq!(status, RunStatus::Running);
            assert!(!lease_held);
        }
        other => panic!("expected ThreadBusy, got {other:?}"),
    }
    let cp = store
        .load_checkpoint(&thread())
        .await
        .expect("load")
        .expect("thread");
    assert_eq!(
        cp.messages.len(),
        1,
        "nothing of the refused run was written"
    );
}

#[tokio::test]
async fn superseding_a_dead_run_closes_its_calls_in_order_and_the_next_request_is_well_formed() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    // The calls were committed `Requested`, then the process died.
    left_running(&store, 2).await;
    let model = Arc::new(
        ScriptedExecutor::from_turns(vec![ScriptTurn::text("fresh start")]).expect("script"),
    );
    let rt = AgentRuntime::builder()
        .with_ids(Arc::new(SystemIds::default()))
        .with_store(store.clone())
        .with_model(ModelSpec::new("model", "p", "up"))
        .with_provider("p", model.clone())
        .with_tool(Arc::new(Echo))
        .with_tool(Arc::new(Book))
        .with_agent_spec(AgentSpec::new("agent", "model"))
        .build()
        .expect("runtime");
    let sink = VecSink::default();
    let out = rt
        .run(
            RunActivation::new(thread(), "agent")
                .with_user_message("second")
                .with_supersede(),
            &sink,
        )
        .await
        .expect("superseded");
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
    let events = sink.take();
    check_activation(&events).expect("grammar");
    assert!(events.iter().any(|e| matches!(
        e,
        AgentEvent::Warning { detail, .. } if detail.contains("superseded the unfinished run run-1")
    )));
    let runs = store.list_runs(&thread()).await.expect("runs");
    assert_eq!(runs[0].status, RunStatus::Done);
    assert_eq!(runs[0].termination, Some(TerminationReason::Cancelled));
    let requests = model.requests();
    let roles: Vec<Role> = requests[0]
        .messages
        .iter()
        .filter(|m| m.role != Role::System)
        .map(|m| m.role)
        .collect();
    assert_eq!(
        roles,
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::User
        ]
    );
    let results: Vec<String> = requests[0]
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| format!("{}: {}", m.tool_call_id.as_ref().expect("id"), m.text()))
        .collect();
    assert_eq!(results.len(), 2);
    assert!(results[0].starts_with("c1: ") && results[1].starts_with("c2: "));
    assert!(
        results.iter().all(|r| r.contains("superseded")),
        "{results:?}"
    );
}

#[tokio::test]
async fn superseding_a_run_whose_lease_is_alive_is_refused() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    left_running(&store, 1).await;
    // Another process holds the run's lease, and renews it.
    let run_id = store.list_runs(&thread()).await.expect("runs")[0]
        .run_id
        .clone();
    let far = Timestamp::from_unix_millis(i64::MAX / 2);
    let held = store
        .claim_run(&run_id, "elsewhere", Duration::from_secs(3600), far)
        .await
        .expect("claim")
        .expect("claimed");
    let rt = runtime(store.clone(), vec![ScriptTurn::text("second")]);
    let refused = rt
        .run_to_completion(
            RunActivation::new(thread(), "agent")
                .with_user_message("second")
                .with_supersede(),
        )
        .await;
    assert!(
        matches!(
            refused,
            Err(RunError::ThreadBusy {
                lease_held: true,
                ..
            })
        ),
        "{refused:?}"
    );
    // Its holder can still write it.
    let runs = store.list_runs(&thread()).await.expect("runs");
    let mut record = runs[0].clone();
    record.status = RunStatus::Done;
    record.termination = Some(TerminationReason::Cancelled);
    let cp = store
        .load_checkpoint(&thread())
        .await
        .expect("load")
        .expect("thread");
    store
        .commit(&ThreadCommit::new(thread(), record, cp.message_count()).with_lease(held.lease))
        .await
        .expect("the holder's commit");
}

#[tokio::test]
async fn recovering_a_run_left_behind_by_a_later_run_closes_it_once() {
    // A database written before one run per thread was enforced: run-1 still `running`, and
    // a later run ended on its thread (made here by reopening run-1 behind the store's back).
    let dir = crate::support::fresh_dir("left-behind");
    let path = dir.join("threads.db");
    let store: Arc<dyn ThreadStore> = Arc::new(
        SqliteStore::open(SqliteConfig::file(&path))
            .await
            .expect("sqlite"),
    );
    left_running(&store, 1).await;
    let stale = store.list_runs(&thread()).await.expect("runs")[0].clone();
    let cp = store
        .load_checkpoint(&thread())
        .await
        .expect("load")
        .expect("thread");
    let mut done = stale.clone();
    done.status = RunStatus::Done;
    done.termination = Some(TerminationReason::Cancelled);
    store
        .commit(&ThreadCommit::new(thread(), done, cp.message_count()))
        .await
        .expect("run-1 ended");
    let mut later = stale.clone();
    later.run_id = RunId::new("later").expect("id");
    later.status = RunStatus::Done;
    later.termination = Some(TerminationReason::NaturalEnd);
    store
        .commit(&ThreadCommit::new(thread(), later, cp.message_count()))
        .await
        .expect("the later run");
    rusqlite::Connection::open(&path)
        .expect("open")
        .execute(
            "UPDATE runs SET status = 'running', termination = NULL WHERE run_id = 'run-1'",
            [],
        )
        .expect("reopen run-1");

    let rt = runtime(store.clone(), vec![ScriptTurn::text("unused")]);
    let first = rt
        .recover(&RecoverConfig::new("w1"), &NullSink)
        .await
        .expect("recover");
    assert_eq!(first.len(), 1);
    assert!(
        matches!(first[0].outcome, Err(RunError::NotRecoverable { .. })),
        "{:?}",
        first[0].outcome
    );
    let again = rt
        .recover(&RecoverConfig::new("w2"), &NullSink)
        .await
        .expect("recover");
    assert!(
        again.is_empty(),
        "the left-behind run is closed, not claimed again"
    );
    let runs = store.list_runs(&thread()).await.expect("runs");
    assert!(runs.iter().all(|r| r.status == RunStatus::Done), "{runs:?}");
    let cp = store
        .load_checkpoint(&thread())
        .await
        .expect("load")
        .expect("thread");
    assert_eq!(cp.messages.len(), 1, "nothing was added to the history");
}
