//! `take_over` of one thread's run (a queued run whose worker may be gone) and the caller-chosen
//! run id a queued run starts with. A cut-short run continued by `take_over` at each of its
//! commits: `recovery.rs`.

use std::sync::Arc;

use awaken_event::{
    CancellationToken, RunId, TerminationReason, ThreadId, VecSink, check_activation,
};
use awaken_runtime::{RecoverConfig, RunActivation, RunError, Takeover};
use awaken_store::{MemoryStore, RunStatus, ThreadStore};

use crate::leases::{notifies, worker_runtime};
use crate::lifecycle::Gate;
use crate::recovery::{dead_lease_expired, runtime, thread};
use crate::support::Intercepted;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_runs_lease_is_held_and_take_over_runs_nothing() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    let (entered, release) = notifies();
    let live = worker_runtime(
        store.clone(),
        "live",
        Gate(entered.clone(), release.clone()),
        false,
    );
    let run = {
        let live = live.clone();
        tokio::spawn(async move {
            live.run_to_completion(RunActivation::new(thread(), "agent").with_user_message("go"))
                .await
        })
    };
    // The live run is inside its tool, holding its lease.
    entered.notified().await;
    let before = store.load_checkpoint(&thread()).await.expect("load");
    let live_run = before
        .as_ref()
        .and_then(|c| c.run.clone())
        .expect("the live run");
    let (e2, r2) = notifies();
    let other = worker_runtime(store.clone(), "other", Gate(e2, r2), false);
    let sink = VecSink::new();
    let taken = other
        .take_over(&thread(), &RecoverConfig::new("other"), &sink)
        .await
        .expect("take over");
    let Takeover::Held { run_id, .. } = taken else {
        panic!("the live run's lease is held: {taken:?}");
    };
    assert_eq!(run_id, live_run.run_id);
    assert!(sink.events().is_empty(), "{:?}", sink.events());
    assert_eq!(
        store.load_checkpoint(&thread()).await.expect("load"),
        before,
        "nothing was written"
    );
    release.notify_one();
    let out = run.await.expect("joined").expect("run");
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
    assert_eq!(out.run_id, live_run.run_id);
}

#[tokio::test]
async fn a_finished_a_waiting_or_an_unknown_thread_has_nothing_to_take_over() {
    let config = RecoverConfig::new("w");
    let sink = VecSink::new();
    // Finished.
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    let rt = runtime(store.clone());
    let done = rt
        .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("go"))
        .await
        .expect("run");
    let taken = rt
        .take_over(&thread(), &config, &sink)
        .await
        .expect("take over");
    let Takeover::Nothing {
        latest: Some(latest),
    } = taken
    else {
        panic!("a finished run is not taken over: {taken:?}");
    };
    assert_eq!(latest.run_id, done.run_id);
    assert_eq!(latest.status, RunStatus::Done);
    assert_eq!(latest.termination, Some(TerminationReason::NaturalEnd));
    // Unknown.
    let unknown = ThreadId::new("nobody").expect("id");
    let taken = rt
        .take_over(&unknown, &config, &sink)
        .await
        .expect("take over");
    assert!(
        matches!(taken, Takeover::Nothing { latest: None }),
        "{taken:?}"
    );
    // Waiting for a decision (a resume continues it).
    let (entered, release) = notifies();
    let asks = worker_runtime(store.clone(), "w", Gate(entered, release), true);
    let waiting = ThreadId::new("waiting").expect("id");
    let suspended = asks
        .run_to_completion(RunActivation::new(waiting.clone(), "agent").with_user_message("go"))
        .await
        .expect("run");
    assert_eq!(suspended.termination, TerminationReason::Suspended);
    let taken = asks
        .take_over(&waiting, &config, &sink)
        .await
        .expect("take over");
    let Takeover::Nothing {
        latest: Some(latest),
    } = taken
    else {
        panic!("a waiting run is not taken over: {taken:?}");
    };
    assert_eq!(latest.run_id, suspended.run_id);
    assert_eq!(latest.status, RunStatus::Waiting);
    assert!(sink.events().is_empty(), "{:?}", sink.events());
}

#[tokio::test]
async fn a_run_gets_the_id_it_was_given_and_a_taken_id_is_refused() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    let rt = runtime(store.clone());
    let job = RunId::new("job-7").expect("id");
    let out = rt
        .run_to_completion(
            RunActivation::new(thread(), "agent")
                .with_user_message("go")
                .with_run_id(job.clone()),
        )
        .await
        .expect("run");
    assert_eq!(out.run_id, job);
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
    let history = rt.history(&thread()).await.expect("history").len();
    let again = |id: &RunId| {
        rt.run_to_completion(
            RunActivation::new(thread(), "agent")
                .with_user_message("again")
                .with_run_id(id.clone()),
        )
    };
    let refused = again(&job).await;
    assert!(
        matches!(&refused, Err(RunError::RunIdTaken { run_id, .. }) if *run_id == job),
        "{refused:?}"
    );
    // The id source was not asked for the given id: its first id goes to the next run.
    let next = rt.next_run_id();
    assert_eq!(next.as_str(), "run-1");
    let second = again(&next).await.expect("a new id");
    assert_eq!(second.run_id, next);
    let history = history + 2;
    assert_eq!(rt.history(&thread()).await.expect("history").len(), history);
    // An earlier run's id is refused too, not only the latest's.
    let refused = again(&job).await;
    assert!(
        matches!(&refused, Err(RunError::RunIdTaken { run_id, .. }) if *run_id == job),
        "{refused:?}"
    );
    assert_eq!(
        rt.history(&thread()).await.expect("history").len(),
        history,
        "nothing written"
    );
    // So is a run of another thread's id, by the store.
    let elsewhere = rt
        .run_to_completion(
            RunActivation::new(ThreadId::new("elsewhere").expect("id"), "agent")
                .with_user_message("go")
                .with_run_id(job.clone()),
        )
        .await;
    assert!(
        matches!(
            &elsewhere,
            Err(RunError::Commit {
                source: awaken_store::CommitError::RunOnOtherThread { .. },
                ..
            })
        ),
        "{elsewhere:?}"
    );
    let runs: Vec<String> = store
        .list_runs(&thread())
        .await
        .expect("runs")
        .iter()
        .map(|r| format!("{} {:?}", r.run_id, r.status))
        .collect();
    assert_eq!(runs, ["job-7 Done", "run-1 Done"]);
}

/// A run of `store` left `Running` by a process whose writes stopped after its first two
/// commits, its lease expired.
async fn left_running(store: &Arc<dyn ThreadStore>) -> awaken_store::RunRecord {
    let dying = Arc::new(Intercepted::dies_after(store.clone(), 2));
    let _ = runtime(dying)
        .run(
            RunActivation::new(thread(), "agent").with_user_message("go"),
            &VecSink::new(),
        )
        .await;
    let run = dead_lease_expired(store.as_ref()).await;
    assert_eq!(run.status, RunStatus::Running);
    run
}

/// Checks that `taken` ended `left` `Cancelled`, as `sink` and `store` show it; its events.
async fn ended_cancelled(
    taken: Takeover,
    left: &awaken_store::RunRecord,
    store: &Arc<dyn ThreadStore>,
    sink: &VecSink,
) -> Vec<awaken_event::AgentEvent> {
    let Takeover::Recovered(recovered) = taken else {
        panic!("the unfinished run is taken over to be ended: {taken:?}");
    };
    assert_eq!(recovered.run_id, left.run_id);
    let out = recovered.outcome.expect("ended");
    assert_eq!(out.termination, TerminationReason::Cancelled);
    let events = sink.events();
    if let Err(v) = check_activation(&events) {
        panic!("the ended run's events: {v}");
    }
    let stored = store.load_run(&thread(), &left.run_id).await.expect("load");
    let stored = stored.expect("the left run");
    assert_eq!(stored.status, RunStatus::Done);
    assert_eq!(stored.termination, Some(TerminationReason::Cancelled));
    events
}

/// A run left unfinished by a dead process, taken over by a caller whose cancel came first
/// (a queued run cancelled while no worker held it): the run ends `Cancelled` with its
/// checkpoint, and no step of it runs again.
#[tokio::test]
async fn a_cancelled_take_over_ends_the_unfinished_run_cancelled() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    let run = left_running(&store).await;

    let cancel = CancellationToken::new();
    cancel.cancel();
    let sink = VecSink::new();
    let taken = runtime(store.clone())
        .take_over(
            &thread(),
            &RecoverConfig::new("w2").with_cancel(cancel),
            &sink,
        )
        .await
        .expect("take over");
    ended_cancelled(taken, &run, &store, &sink).await;
    // Nothing is left for a later run to continue.
    let again = runtime(store.clone())
        .take_over(&thread(), &RecoverConfig::new("w3"), &VecSink::new())
        .await
        .expect("take over");
    assert!(matches!(again, Takeover::Nothing { .. }), "{again:?}");
}

/// A caller taking over for its own run (a queued job) finds another run of the thread left
/// unfinished (a job given up on, a stopped process): that run is ended `Cancelled` at its
/// checkpoint, with no step of it run again, and the caller's run can start after it.
#[tokio::test]
async fn a_take_over_for_another_run_ends_the_unfinished_one_cancelled() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    let left = left_running(&store).await;

    let rt = runtime(store.clone());
    let job = RunId::new("job-2").expect("id");
    let sink = VecSink::new();
    let taken = rt
        .take_over_steered(
            &thread(),
            &RecoverConfig::new("w2"),
            &job,
            awaken_runtime::Steering::new(),
            &sink,
        )
        .await
        .expect("take over");
    let events = ended_cancelled(taken, &left, &store, &sink).await;
    // Its step opens and closes on the cancel: no model call, no tool.
    let kinds: Vec<&str> = events.iter().map(|e| e.type_name()).collect();
    assert_eq!(
        kinds,
        ["run_start", "step_start", "step_end", "run_finish"],
        "{events:?}"
    );
    // The caller's run starts after it.
    let out = rt
        .run_to_completion(
            RunActivation::new(thread(), "agent")
                .with_user_message("next")
                .with_run_id(job.clone()),
        )
        .await
        .expect("the caller's run");
    assert_eq!(out.run_id, job);
    assert_eq!(out.termination, TerminationReason::NaturalEnd);
}
