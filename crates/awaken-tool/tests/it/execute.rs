//! Running a call: panics, undeclared writes, cancellation, timeouts, progress and the
//! idempotency key.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use awaken_event::{CancellationToken, ToolCallId, ToolCallState, ToolDescriptor};
use awaken_state::{StateCommand, StateKey};
use awaken_tool::{
    RegisteredTool, Tool, ToolBatch, ToolCallContext, ToolError, ToolOutput, check_writes,
    execute_with_timeout,
};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::support::{Behaviour, Hits, Notes, Owner, Scripted, call, registry, tool_ctx};

/// Runs `tool` the way the runtime does — batch `Executing`, invoke, close the call with the
/// result or the error — and returns the batch.
async fn run_in_batch(tool: &RegisteredTool, args: Value) -> ToolBatch {
    let mut batch = ToolBatch::new([call("c1", tool.id(), args.clone())]).expect("batch");
    let id = ToolCallId::new("c1").expect("id");
    batch.start(&id).expect("executing");
    match tool.invoke(&args, &tool_ctx("c1"), &registry()).await {
        Ok(out) => batch.succeed(&id, out.result).expect("succeeded"),
        Err(e) => batch.fail_with(&id, &e).expect("closed"),
    }
    batch
}

fn closing(batch: &ToolBatch) -> (ToolCallState, String) {
    let c = &batch.calls()[0];
    let text = c
        .result()
        .map(|r| r.content.as_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    (c.state(), text)
}

#[tokio::test]
async fn a_panicking_tool_fails_its_call_and_the_process_goes_on() {
    let tool = RegisteredTool::from_tool(Scripted::new("explode", Behaviour::Panic)).expect("tool");
    let err = tool
        .invoke(&json!({}), &tool_ctx("c1"), &registry())
        .await
        .expect_err("panics");
    assert_eq!(
        err,
        ToolError::Panicked {
            tool_id: "explode".into(),
            message: "the scripted tool panics".into()
        }
    );
    let (state, text) = closing(&run_in_batch(&tool, json!({})).await);
    assert_eq!(state, ToolCallState::Failed);
    assert_eq!(text, "tool `explode` panicked: the scripted tool panics");
}

#[tokio::test]
async fn a_tool_writing_an_undeclared_exclusive_key_fails_its_call() {
    let tool = RegisteredTool::from_tool(
        Scripted::new(
            "scribe",
            Behaviour::Write(|| {
                StateCommand::new()
                    .with_update::<Notes>("n".into())
                    .with_update::<Owner>("me".into())
            }),
        )
        .with_writes(&[Notes::KEY]),
    )
    .expect("tool");
    let (state, text) = closing(&run_in_batch(&tool, json!({})).await);
    assert_eq!(state, ToolCallState::Failed);
    assert_eq!(
        text,
        "tool `scribe` wrote the state key `test.owner`, which it does not declare in writes()"
    );
}

#[tokio::test]
async fn declared_exclusive_and_any_commutative_writes_pass() {
    let tool = RegisteredTool::from_tool(
        Scripted::new(
            "scribe",
            Behaviour::Write(|| {
                StateCommand::new()
                    .with_update::<Notes>("n".into())
                    .with_update::<Hits>(1)
            }),
        )
        .with_writes(&[Notes::KEY]),
    )
    .expect("tool");
    let out = tool
        .invoke(&json!({}), &tool_ctx("c1"), &registry())
        .await
        .expect("declared writes");
    assert!(out.command.is_some());
}

#[test]
fn check_writes_treats_unregistered_keys_as_exclusive() {
    let mut cmd = StateCommand::new();
    cmd.update_json("nobody.registered", json!(1));
    cmd.update_json(Hits::KEY, json!(1));
    assert_eq!(
        check_writes("t", &cmd, &[], &registry()),
        Err(ToolError::UndeclaredStateWrite {
            tool_id: "t".into(),
            key: "nobody.registered".into()
        })
    );
    assert_eq!(
        check_writes("t", &cmd, &["nobody.registered"], &registry()),
        Ok(())
    );
}

#[tokio::test]
async fn an_execution_error_is_the_message_the_model_sees() {
    let tool = RegisteredTool::from_tool(Scripted::new("svc", Behaviour::Fail)).expect("tool");
    let (state, text) = closing(&run_in_batch(&tool, json!({})).await);
    assert_eq!(
        (state, text.as_str()),
        (ToolCallState::Failed, "the service said no")
    );
}

/// Signals when it starts, then waits until it is dropped (or told to finish).
struct Waits {
    started: Mutex<Option<oneshot::Sender<()>>>,
    finish: Mutex<Option<oneshot::Receiver<()>>>,
}

impl Waits {
    fn new() -> (Self, oneshot::Receiver<()>, oneshot::Sender<()>) {
        let (started_tx, started_rx) = oneshot::channel();
        let (finish_tx, finish_rx) = oneshot::channel();
        (
            Self {
                started: Mutex::new(Some(started_tx)),
                finish: Mutex::new(Some(finish_rx)),
            },
            started_rx,
            finish_tx,
        )
    }
}

#[async_trait]
impl Tool for Waits {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("waits", "waits")
    }

    async fn execute(&self, _args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        ctx.report_progress(json!({"phase": "started"}));
        let started = self.started.lock().expect("lock").take();
        let finish = self.finish.lock().expect("lock").take();
        if let Some(tx) = started {
            let _ = tx.send(());
        }
        if let Some(rx) = finish {
            let _ = rx.await;
        }
        ctx.report_progress(json!({"phase": "done"}));
        Ok(ToolOutput::success(json!("finished")))
    }
}

#[tokio::test]
async fn cancellation_while_running_ends_the_call_as_cancelled() {
    let (tool, started, _finish) = Waits::new();
    let tool = RegisteredTool::from_tool(tool).expect("tool");
    let token = CancellationToken::new();
    let ctx = tool_ctx("c1").with_cancel(token.clone());
    let registry = registry();
    let args = json!({});
    let (result, ()) = tokio::join!(tool.invoke(&args, &ctx, &registry), async {
        started.await.expect("the tool started");
        token.cancel();
    });
    let err = result.expect_err("cancelled");
    assert_eq!(
        err,
        ToolError::Cancelled {
            tool_id: "waits".into()
        }
    );
    assert_eq!(err.closing_state(), ToolCallState::Cancelled);
}

#[tokio::test]
async fn a_call_whose_run_is_already_cancelled_does_not_start() {
    let scripted = Scripted::new("echo", Behaviour::Echo);
    let calls = scripted.calls.clone();
    let tool = RegisteredTool::from_tool(scripted).expect("tool");
    let token = CancellationToken::new();
    token.cancel();
    let err = tool
        .invoke(&json!({}), &tool_ctx("c1").with_cancel(token), &registry())
        .await
        .expect_err("cancelled");
    assert!(matches!(err, ToolError::Cancelled { .. }));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_timeout_future_abandons_the_call() {
    let (tool, started, _finish) = Waits::new();
    let tool = RegisteredTool::from_tool(tool).expect("tool");
    let registry = registry();
    let ctx = tool_ctx("c1");
    let (fire, timer) = oneshot::channel::<()>();
    let timeout = async {
        let _ = timer.await;
    };
    let args = json!({});
    let (result, ()) = tokio::join!(
        tool.invoke_with_timeout(&args, &ctx, &registry, timeout),
        async {
            started.await.expect("the tool started");
            let _ = fire.send(());
        }
    );
    assert_eq!(
        result.expect_err("timed out"),
        ToolError::Timeout {
            tool_id: "waits".into(),
            after: None
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_duration_timeout_fires_on_the_paused_clock() {
    let (tool, _started, _finish) = Waits::new();
    let err = execute_with_timeout(
        &tool,
        "waits",
        &json!({}),
        &tool_ctx("c1"),
        Duration::from_secs(30),
    )
    .await
    .expect_err("timed out");
    assert_eq!(
        err,
        ToolError::Timeout {
            tool_id: "waits".into(),
            after: Some(Duration::from_secs(30))
        }
    );
    assert_eq!(err.to_string(), "tool `waits` timed out after 30s");
}

#[tokio::test]
async fn progress_reports_reach_the_sink_with_the_call_id() {
    let (tool, _started, finish) = Waits::new();
    let _ = finish.send(());
    let reports: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
    let sink = reports.clone();
    let ctx = tool_ctx("c9").with_progress(Arc::new(move |id: &ToolCallId, p: Value| {
        sink.lock().expect("lock").push((id.to_string(), p));
    }));
    let out = RegisteredTool::from_tool(tool)
        .expect("tool")
        .invoke(&json!({}), &ctx, &registry())
        .await
        .expect("finishes");
    assert_eq!(*out.result.content, json!("finished"));
    assert_eq!(
        *reports.lock().expect("lock"),
        vec![
            ("c9".to_owned(), json!({"phase": "started"})),
            ("c9".to_owned(), json!({"phase": "done"})),
        ]
    );
}

#[tokio::test]
async fn every_attempt_of_a_call_sees_the_same_idempotency_key() {
    let tool = RegisteredTool::from_tool(Scripted::new("echo", Behaviour::Echo)).expect("tool");
    let registry = registry();
    let key = |out: ToolOutput| {
        out.result.content["key"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    // Two attempts (a retry, or a re-run in another process) build fresh contexts.
    let first = key(tool
        .invoke(&json!({}), &tool_ctx("c1"), &registry)
        .await
        .expect("run"));
    let again = key(tool
        .invoke(&json!({}), &tool_ctx("c1"), &registry)
        .await
        .expect("run"));
    let other = key(tool
        .invoke(&json!({}), &tool_ctx("c2"), &registry)
        .await
        .expect("run"));
    assert!(
        first.starts_with("awk1-") && first.len() == 5 + 64,
        "{first}"
    );
    assert_eq!(first, again);
    assert_ne!(first, other);
    assert_eq!(first, tool_ctx("c1").idempotency_key().as_str());
}

/// Progress reports with the call they came from.
#[derive(Default)]
struct Reports(Mutex<Vec<(String, Value)>>);

impl awaken_tool::ProgressSink for Reports {
    fn report(&self, call_id: &ToolCallId, progress: Value) {
        self.0
            .lock()
            .expect("reports")
            .push((call_id.to_string(), progress));
    }
}

#[test]
fn a_runs_calls_share_its_scope_and_a_changed_context_leaves_the_others_alone() {
    let token = CancellationToken::new();
    let reports = Arc::new(Reports::default());
    let scope = awaken_tool::ToolCallScope::new(
        awaken_event::ThreadId::new("thread-1").expect("thread"),
        awaken_event::RunId::new("run-1").expect("run"),
        token.clone(),
    )
    .with_progress(reports.clone());
    let snapshot = tool_ctx("c0").snapshot().clone();
    let c1 = scope.context(ToolCallId::new("c1").expect("id"), snapshot.clone());
    let c2 = scope.context(ToolCallId::new("c2").expect("id"), snapshot);
    // The same ids, key and progress as a context made whole.
    assert_eq!(
        (c1.thread_id().as_str(), c1.run_id().as_str()),
        ("thread-1", "run-1")
    );
    assert_eq!(c1.idempotency_key(), tool_ctx("c1").idempotency_key());
    c1.report_progress(json!(1));
    c2.report_progress(json!(2));
    assert_eq!(
        *reports.0.lock().expect("reports"),
        [("c1".to_owned(), json!(1)), ("c2".to_owned(), json!(2))]
    );
    // One call's own token and sink change that call only.
    let own = CancellationToken::new();
    let c2 = c2
        .with_cancel(own.clone())
        .with_progress(Arc::new(awaken_tool::NullProgress));
    own.cancel();
    assert!(c2.is_cancelled() && !c1.is_cancelled());
    c2.report_progress(json!(3));
    c1.report_progress(json!(4));
    assert_eq!(reports.0.lock().expect("reports").len(), 3);
    // The run's cancellation reaches every context made from the scope.
    token.cancel();
    assert!(c1.is_cancelled());
    assert!(
        scope
            .context(ToolCallId::new("c3").expect("id"), c1.snapshot().clone())
            .is_cancelled()
    );
}

/// Panics when dropped: stands for cleanup code in a tool that panics.
struct PanicsWhenDropped;

impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        panic!("cleanup failed");
    }
}

/// Waits forever holding a [`PanicsWhenDropped`]: abandoning the call drops it.
struct LeavesAMess;

#[async_trait]
impl Tool for LeavesAMess {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("mess", "panics when abandoned")
    }

    async fn execute(
        &self,
        _args: &Value,
        _ctx: &ToolCallContext,
    ) -> Result<ToolOutput, ToolError> {
        let _guard = PanicsWhenDropped;
        std::future::pending::<()>().await;
        Ok(ToolOutput::success(json!("never")))
    }
}

#[tokio::test]
async fn a_tool_that_panics_while_it_is_abandoned_still_ends_its_call_with_an_error() {
    let tool = RegisteredTool::from_tool(LeavesAMess).expect("tool");
    let registry = registry();
    let args = json!({});
    // A timeout, then a cancellation: each drops the tool's future, whose drop panics.
    let timed_out = tool
        .invoke_with_timeout(&args, &tool_ctx("c1"), &registry, async {})
        .await;
    let token = CancellationToken::new();
    let ctx = tool_ctx("c2").with_cancel(token.clone());
    let (cancelled, ()) = tokio::join!(tool.invoke(&args, &ctx, &registry), async {
        tokio::task::yield_now().await;
        token.cancel();
    });
    let panicked = ToolError::Panicked {
        tool_id: "mess".into(),
        message: "cleanup failed".into(),
    };
    assert_eq!(timed_out.expect_err("abandoned"), panicked);
    assert_eq!(cancelled.expect_err("abandoned"), panicked);
}
