//! A run whose future is dropped mid-run (its task aborted, as a server does when a shutdown's
//! grace period ends) gives its lease up: another worker claims the run at once instead of
//! waiting for the lease to expire, and `shutdown` waits for that release.

use std::sync::Arc;
use std::time::Duration;

use awaken_event::{NullSink, ThreadId};
use awaken_llm::{InferenceRequest, LlmEventStream, LlmExecutor};
use awaken_runtime::{AgentRuntime, IdSource, RunActivation, ShutdownMode, SystemIds};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_store::{MemoryStore, RunStatus, ThreadStore};
use tokio::sync::Notify;

/// A model that tells when it is asked, then never answers.
struct Silent(Arc<Notify>);

impl LlmExecutor for Silent {
    fn name(&self) -> &str {
        "silent"
    }

    fn execute_stream(&self, _request: InferenceRequest) -> LlmEventStream {
        self.0.notify_one();
        Box::pin(futures_util::stream::pending())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_run_releases_its_lease() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    let asked = Arc::new(Notify::new());
    let runtime = AgentRuntime::builder()
        .with_worker("w1", Duration::from_secs(600))
        .with_store(store.clone())
        .with_model(ModelSpec::new("m", "silent", "silent"))
        .with_provider("silent", Arc::new(Silent(asked.clone())))
        .with_agent_spec(AgentSpec::new("a", "m"))
        .build()
        .expect("runtime");
    let thread = ThreadId::new("t").expect("id");
    let task = tokio::spawn({
        let runtime = runtime.clone();
        let thread = thread.clone();
        async move {
            let _ = runtime
                .run(
                    RunActivation::new(thread, "a").with_user_message("hi"),
                    &NullSink,
                )
                .await;
        }
    });
    tokio::time::timeout(Duration::from_secs(10), asked.notified())
        .await
        .expect("the model is asked");
    let run = store
        .load_checkpoint(&thread)
        .await
        .expect("load")
        .and_then(|c| c.run)
        .expect("the run's first commit");
    assert_eq!(run.status, RunStatus::Running);
    let now = SystemIds::default().timestamp();
    assert!(
        store
            .claim_run(&run.run_id, "w2", Duration::from_secs(60), now)
            .await
            .expect("claim")
            .is_none(),
        "the live run holds its lease"
    );
    task.abort();
    let _ = task.await;
    tokio::time::timeout(
        Duration::from_secs(10),
        runtime.shutdown(ShutdownMode::Wait),
    )
    .await
    .expect("shutdown waits for the release, then ends");
    let claimed = store
        .claim_run(
            &run.run_id,
            "w2",
            Duration::from_secs(60),
            SystemIds::default().timestamp(),
        )
        .await
        .expect("claim");
    assert!(
        claimed.is_some(),
        "the dropped run's lease was released: another worker takes the run at once"
    );
}
