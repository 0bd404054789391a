//! Crash recovery: a child process (this test binary, re-run on one test) drives a scripted
//! agent against SQLite and kills itself with SIGKILL at a named durable boundary (the
//! `failpoints` feature), after writing a marker proving it got there; then a fresh runtime
//! in this process recovers the run.
//!
//! The agent: step 1 calls `append` (side-effecting: appends a line to a file), step 2 calls
//! `ledger` (idempotent: records its idempotency key), step 3 answers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{EffectClass, Message, Role, ThreadId, ToolDescriptor};
use awaken_llm::{ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken_runtime::{AgentRuntime, RunActivation, SequentialIds};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_store::{SqliteConfig, SqliteStore, ThreadStore};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use crate::support::{append_line, fresh_dir, kill_child_at, lines, recover_the_run};

/// Appends `{"text": ..}` as a line to `<dir>/append.log`.
struct Append(PathBuf);

#[async_trait]
impl Tool for Append {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("append", "Appends a line").with_effect(EffectClass::SideEffecting)
    }
    async fn execute(&self, args: &Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        append_line(
            &self.0.join("append.log"),
            args["text"].as_str().unwrap_or_default(),
        );
        Ok(ToolOutput::success(json!("appended")))
    }
}

/// Records its idempotency key as a line of `<dir>/ledger.log` (a ledger that deduplicates by
/// key would apply it once).
struct Ledger(PathBuf);

#[async_trait]
impl Tool for Ledger {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("ledger", "Books an entry").with_effect(EffectClass::Idempotent)
    }
    async fn execute(&self, _args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        append_line(&self.0.join("ledger.log"), ctx.idempotency_key().as_str());
        Ok(ToolOutput::success(json!("booked")))
    }
}

fn script() -> Vec<ScriptTurn> {
    vec![
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("append", json!({"text": "one"})).with_id("c1")),
        ScriptTurn::text("").with_tool_call(ScriptToolCall::new("ledger", json!({})).with_id("c2")),
        ScriptTurn::text("done"),
    ]
}

async fn runtime(dir: &Path, turns: Vec<ScriptTurn>) -> AgentRuntime {
    let store: Arc<dyn ThreadStore> = Arc::new(
        SqliteStore::open(SqliteConfig::file(dir.join("threads.db")))
            .await
            .expect("sqlite"),
    );
    let executor = Arc::new(ScriptedExecutor::from_turns(turns).expect("script"));
    AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_store(store)
        .with_model(ModelSpec::new("model", "scripted", "upstream"))
        .with_provider("scripted", executor)
        .with_tool(Arc::new(Append(dir.to_owned())))
        .with_tool(Arc::new(Ledger(dir.to_owned())))
        .with_agent_spec(AgentSpec::new("agent", "model"))
        .build()
        .expect("runtime")
}

/// The child: runs the agent until the failpoint kills it. In the parent's test run (without
/// `AWAKEN_CRASH_DIR`) it has nothing to do.
#[tokio::test]
async fn crash_child() {
    let Some(dir) = std::env::var_os("AWAKEN_CRASH_DIR") else {
        return;
    };
    let rt = runtime(Path::new(&dir), script()).await;
    let outcome = rt
        .run_to_completion(
            RunActivation::new(ThreadId::new("t").expect("id"), "agent").with_user_message("go"),
        )
        .await;
    panic!("the failpoint should have killed this process; the run ended: {outcome:?}");
}

fn render(history: &[Message]) -> String {
    history
        .iter()
        .map(|m| match m.role {
            Role::Tool => format!(
                "tool {} {}",
                m.tool_call_id.as_ref().map_or("-", |c| c.as_str()),
                serde_json::to_string(&m.content).expect("json")
            ),
            Role::Assistant if !m.tool_calls.is_empty() => format!(
                "assistant calls {}",
                m.tool_calls
                    .iter()
                    .map(|c| c.id.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            _ => format!("{:?} {}", m.role, m.text()),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Crashes a child at `at`, recovers here with the script from turn `resume_from`, and
/// returns the recovered history, the append log and the ledger.
async fn crash_and_recover(at: &str, resume_from: usize) -> (String, Vec<String>, Vec<String>) {
    let dir = fresh_dir(&format!("crash-{}", at.replace(':', "-")));
    kill_child_at("crash::crash_child", "AWAKEN_CRASH_DIR", &dir, at);

    let rt = runtime(&dir, script().split_off(resume_from)).await;
    recover_the_run(&rt).await;
    let history = rt
        .history(&ThreadId::new("t").expect("id"))
        .await
        .expect("history");
    (
        render(&history),
        lines(&dir.join("append.log")),
        lines(&dir.join("ledger.log")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_batch_commit_repeats_the_inference() {
    let (history, appended, ledger) = crash_and_recover("before_requested", 0).await;
    expect_test::expect![[r#"
        User go
        assistant calls c1
        tool c1 [{"type":"text","text":"appended"}]
        assistant calls c2
        tool c2 [{"type":"text","text":"booked"}]
        Assistant done"#]]
    .assert_eq(&history);
    assert_eq!(appended, ["one"]);
    assert_eq!(ledger.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_requested_gates_and_runs_the_call_once() {
    let (history, appended, _) = crash_and_recover("after_requested", 1).await;
    assert_eq!(history.matches("tool c1").count(), 1, "{history}");
    assert!(
        history.contains("tool c1 [{\"type\":\"text\",\"text\":\"appended\"}]"),
        "{history}"
    );
    assert_eq!(appended, ["one"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_effecting_call_interrupted_while_executing_is_closed_as_outcome_unknown() {
    let (history, appended, _) = crash_and_recover("after_executing:c1", 1).await;
    expect_test::expect![[r#"
        User go
        assistant calls c1
        tool c1 [{"type":"text","text":"error: outcome unknown: the call was interrupted while it was executing, so its effect may or may not have happened; check before calling it again"}]
        assistant calls c2
        tool c2 [{"type":"text","text":"booked"}]
        Assistant done"#]]
    .assert_eq(&history);
    // It ran once (before the crash) and was never run again.
    assert_eq!(appended, ["one"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_call_interrupted_while_executing_reruns_with_the_same_key() {
    let (history, appended, ledger) = crash_and_recover("after_executing:c2", 2).await;
    let key = awaken_tool::IdempotencyKey::derive(
        &ThreadId::new("t").expect("id"),
        &awaken_event::RunId::new("run-1").expect("id"),
        &awaken_event::ToolCallId::new("c2").expect("id"),
    );
    assert_eq!(
        ledger,
        [key.as_str(), key.as_str()],
        "run twice, with one key"
    );
    assert_eq!(appended, ["one"]);
    assert_eq!(history.matches("tool c2").count(), 1, "{history}");
    assert!(history.contains("tool c2 [{\"type\":\"text\",\"text\":\"booked\"}]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_result_loses_and_repeats_nothing() {
    let (history, appended, ledger) = crash_and_recover("after_result:c1", 1).await;
    assert_eq!(history.matches("tool c1").count(), 1, "{history}");
    assert_eq!(history.matches("User go").count(), 1, "{history}");
    assert_eq!(appended, ["one"]);
    assert_eq!(ledger.len(), 1);
}
