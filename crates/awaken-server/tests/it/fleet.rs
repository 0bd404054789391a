//! A fleet on PostgreSQL in one process: front ends (`AgentServer::queued`) on loopback ports
//! and workers on runtimes of their own, each over its own connections to one schema per test.
//! A run posted to a front end is driven by a worker and streamed from the store; a client
//! reconnects across front ends; decisions, cancels and refusals go through the queue; a job
//! that cannot run is dead-lettered; a dead worker's run is taken over and a draining worker's
//! run is given back, and another worker finishes each; steering messages reach the run on its
//! worker, and one a dead worker's run took is answered taken, never taken twice.
//!
//! Skipped (with one note) unless `AWAKEN_TEST_POSTGRES_URL` is set; `AWAKEN_REQUIRE_POSTGRES=1`
//! makes a missing server a failure.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use awaken_event::{AgentEvent, Message, Role, StopReason, SuspendTicket, TerminationReason};
use awaken_server::{EventId, QueueConfig, Worker, WorkerConfig, WorkerReport};
use awaken_store::{
    FleetWake, JobState, PostgresConfig, PostgresStore, QueueDepth, RunQueue, RunStatus,
    SteerAnswer, SteerId, ThreadStore, Timestamp,
};
use expect_test::expect;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::support::*;

/// The lease of a worker that dies or drains in a test: short, so another worker takes its
/// run over soon after.
const SHORT_LEASE: Duration = Duration::from_secs(2);

/// The lease of the other workers: long enough that none expires within a test.
const WORKER_LEASE: Duration = Duration::from_secs(30);

/// The URL of the test server; `None` (the test is skipped) when it is not configured and not
/// required.
fn postgres_url() -> Option<String> {
    let required = std::env::var("AWAKEN_REQUIRE_POSTGRES").is_ok_and(|v| v == "1");
    match std::env::var("AWAKEN_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            assert!(
                !required,
                "AWAKEN_REQUIRE_POSTGRES=1 but AWAKEN_TEST_POSTGRES_URL is not set"
            );
            use std::io::Write as _;
            static ONCE: std::sync::Once = std::sync::Once::new();
            // Written to the stderr handle directly, so the harness does not capture it.
            ONCE.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "awaken-server: fleet tests SKIPPED (AWAKEN_TEST_POSTGRES_URL is not set); \
                     set AWAKEN_REQUIRE_POSTGRES=1 to make a missing server fail"
                );
            });
            None
        }
    }
}

/// One test's fleet: a fresh schema that its front ends and workers share.
struct Fleet {
    url: String,
    schema: String,
}

/// A front end on a loopback port, with the rig of its runtime (whose store is the fleet's).
struct FrontEnd {
    server: TestServer,
    rig: Rig,
    queue: RunQueue,
}

/// A worker running on its own task until stopped.
struct RunningWorker {
    rig: Rig,
    worker: Arc<Worker>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<WorkerReport>>,
}

/// A worker in a runtime of its own, as in a process of its own: killing it stops its tasks
/// where they are (no more heartbeats, commits or notifications).
struct Process {
    rig: Rig,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Fleet {
    /// A connection of its own to the fleet's schema.
    async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        client
            .batch_execute(&format!("SET search_path TO \"{}\"", self.schema))
            .await
            .expect("search path");
        client
    }

    /// The fleet of `test`, in schema `awaken_fleet_<test>` dropped first; `None` when the
    /// test is skipped.
    async fn new(test: &str) -> Option<Self> {
        let url = postgres_url()?;
        let schema = format!("awaken_fleet_{test}");
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("AWAKEN_TEST_POSTGRES_URL is set but unreachable: {e}"));
        let conn = tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .await
            .expect("drop the test schema");
        drop(client);
        let _ = conn.await;
        Some(Self { url, schema })
    }

    /// A store of its own on the fleet's schema.
    async fn store(&self) -> PostgresStore {
        PostgresStore::connect(
            PostgresConfig::new(self.url.clone())
                .with_schema(self.schema.clone())
                .with_max_connections(4),
        )
        .await
        .expect("connect the postgres store")
    }

    /// A front end: a server whose runtime has no worker identity and drives nothing.
    async fn front(&self) -> FrontEnd {
        self.front_with(QueueConfig::default().max_attempts).await
    }

    /// A front end whose runtime has the worker identity `id`, as `awaken serve --queue`
    /// builds it: it ends a job no worker has claimed when the job is cancelled.
    async fn front_named(&self, id: &str) -> FrontEnd {
        self.front_of(QueueConfig::default().max_attempts, Some(id), None)
            .await
    }

    /// [`front_named`](Self::front_named), serving agent `agent` alone.
    async fn front_serving(&self, id: &str, agent: &str) -> FrontEnd {
        self.front_of(QueueConfig::default().max_attempts, Some(id), Some(agent))
            .await
    }

    /// A front end queueing jobs dead-lettered after `max_attempts` claims.
    async fn front_with(&self, max_attempts: u32) -> FrontEnd {
        self.front_of(max_attempts, None, None).await
    }

    async fn front_of(&self, max_attempts: u32, id: Option<&str>, agent: Option<&str>) -> FrontEnd {
        let store = self.store().await;
        let queue = store.queue();
        let mut rig = Rig::on(Arc::new(store), Vec::new());
        if let Some(id) = id {
            rig = rig.with_worker(id);
        }
        if let Some(agent) = agent {
            rig = rig.with_agent(agent);
        }
        let queue_config = QueueConfig {
            poll_interval: Duration::from_millis(200),
            max_attempts,
        };
        let server = TestServer::queued(rig.runtime(), config(), queue.clone(), queue_config).await;
        FrontEnd { server, rig, queue }
    }

    /// A worker `id` whose model answers `turns`, with `rig` adjusting its runtime.
    async fn worker_with(
        &self,
        id: &str,
        turns: Vec<Vec<Piece>>,
        worker_config: WorkerConfig,
        rig: impl FnOnce(Rig) -> Rig,
    ) -> RunningWorker {
        let store = self.store().await;
        let queue = store.queue();
        let rig = rig(Rig::on(Arc::new(store), turns)
            .with_worker(id)
            .with_lease(WORKER_LEASE));
        let worker = Arc::new(Worker::new(rig.runtime(), queue, worker_config).expect("a worker"));
        let (stop, stopped) = oneshot::channel::<()>();
        let running = Arc::clone(&worker);
        let task = tokio::spawn(async move {
            running
                .run(async move {
                    let _ = stopped.await;
                })
                .await
        });
        RunningWorker {
            rig,
            worker,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// A worker `id` whose model answers `turns`.
    async fn worker(&self, id: &str, turns: Vec<Vec<Piece>>) -> RunningWorker {
        self.worker_with(id, turns, worker_config(), |rig| rig)
            .await
    }

    /// A worker `id` whose model answers `turns`, with a short lease, in a runtime of its own.
    async fn process(
        &self,
        id: &str,
        turns: Vec<Vec<Piece>>,
        counted: &Arc<AtomicUsize>,
    ) -> Process {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        // Connected from the process's runtime: its connections go when it is killed.
        let config = PostgresConfig::new(self.url.clone())
            .with_schema(self.schema.clone())
            .with_max_connections(4);
        let store = runtime
            .spawn(PostgresStore::connect(config))
            .await
            .expect("connecting ran")
            .expect("connect the postgres store");
        let queue = store.queue();
        let rig = Rig::on(Arc::new(store), turns)
            .with_worker(id)
            .with_lease(SHORT_LEASE)
            .counting(counted);
        let worker = Worker::new(rig.runtime(), queue, worker_config()).expect("a worker");
        runtime.spawn(async move { worker.run(std::future::pending()).await });
        Process {
            rig,
            runtime: Some(runtime),
        }
    }
}

/// How the workers of the tests claim: often, with quick retries.
fn worker_config() -> WorkerConfig {
    WorkerConfig {
        concurrency: 4,
        poll_interval: Duration::from_millis(100),
        retry_backoff: Duration::from_millis(20),
        ..WorkerConfig::default()
    }
}

impl RunningWorker {
    /// Stops claiming, drains, and returns what the worker did.
    async fn stop(mut self) -> WorkerReport {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take().expect("running");
        guarded("the worker to stop", task)
            .await
            .expect("the worker ran")
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl Process {
    /// Stops the process's tasks where they are, as a crash would.
    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

impl FrontEnd {
    /// Posts `body` to `path` on a task of its own: its answer comes once a worker drives the
    /// run.
    fn post_later(&self, path: &str, body: Value) -> tokio::task::JoinHandle<reqwest::Response> {
        self.server.post_later(path, body)
    }
}

/// Listens to the fleet's notifications (from when this returns).
async fn listening(queue: &RunQueue) -> awaken_store::FleetListener {
    let mut listener = queue.listen(awaken_store::Hear::Jobs);
    guarded("the listener", listener.ready()).await;
    listener
}

/// Waits for a `FleetWake::Job` (a job was queued or given back).
async fn job_announced(listener: &mut awaken_store::FleetListener) {
    guarded("a job to be announced", async {
        while listener.recv().await != FleetWake::Job {}
    })
    .await;
}

/// The termination of the activation `frames` end with.
/// The ticket of the suspended call among `events`.
fn ticket(events: &[(EventId, AgentEvent)]) -> SuspendTicket {
    events
        .iter()
        .find_map(|(_, e)| match e {
            AgentEvent::ToolCallSuspended { ticket, .. } => Some((**ticket).clone()),
            _ => None,
        })
        .expect("a suspended call")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_drives_a_posted_run_and_the_front_end_streams_its_stored_events() {
    let Some(fleet) = Fleet::new("stream").await else {
        return;
    };
    let front = fleet.front().await;
    let worker = fleet
        .worker(
            "w1",
            vec![
                call_turn("c1", "echo", json!({"text": "a"})),
                text_turn(&["Hel", "lo"]),
                text_turn(&["the outcome"]),
            ],
        )
        .await;

    let frames = front.server.start_run("t", "hi").await.rest().await;
    let events = checked_activation(&frames);
    // Only stored events, each under its number in the store.
    assert_eq!(events, front.rig.store.stored("t").await);
    expect![[r#"
        1 run_start resumed=false
        2 step_start 1
        3 tool_call_start c1 echo
        4 inference_complete
        5 tool_call_ready c1 {"text":"a"}
        6 tool_call_done c1 succeeded {"echoed":"a"}
        7 step_end 1
        8 step_start 2
        9 inference_complete
        10 step_end 2
        11 run_finish natural_end response=Some("Hello")
    "#]]
    .assert_eq(&render(&events));
    let record = front.rig.store.last_run("t").await;
    assert_eq!(record.status, RunStatus::Done);
    assert_eq!(record.termination, Some(TerminationReason::NaturalEnd));

    // `?stream=false` answers the outcome when the run ends.
    let response = front
        .server
        .post("/v1/threads/u/runs?stream=false", json!({"message": "hi"}))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let outcome: Value = response.json().await.expect("JSON");
    let record = front.rig.store.last_run("u").await;
    assert_eq!(outcome["run_id"], record.run_id.as_str(), "{outcome}");
    assert_eq!(outcome["termination"]["kind"], "natural_end", "{outcome}");
    assert_eq!(outcome["response"], "the outcome", "{outcome}");
    assert_eq!(record.status, RunStatus::Done);

    assert_eq!(worker.rig.model.requests(), 3);
    assert_eq!(worker.worker.claim_to_start_ms().len(), 2);
    let report = worker.stop().await;
    assert_eq!(
        report,
        WorkerReport {
            completed: 2,
            ..WorkerReport::default()
        }
    );
    assert_eq!(
        front.queue.depth(Timestamp::now()).await.expect("depth"),
        QueueDepth::default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reconnects_to_another_front_end_and_gets_every_stored_event_once() {
    let Some(fleet) = Fleet::new("reconnect").await else {
        return;
    };
    let a = fleet.front().await;
    let b = fleet.front().await;
    let mut first = vec![Piece::Hold];
    first.extend(call("c1", "echo", json!({"text": "a"})));
    first.push(stop(StopReason::ToolCalls));
    let worker = fleet
        .worker(
            "w1",
            vec![
                first,
                vec![Piece::Hold, text("Done"), stop(StopReason::EndTurn)],
            ],
        )
        .await;

    let mut leaving = a.server.start_run("t", "hi").await;
    // A client attached from the start, staying to the end.
    let stayed = a.server.events_after("t", "0").await;
    // While the model is held, only the run's start is stored.
    let part = leaving.until(|f| f.is("run_start")).await;
    worker.rig.model.wait_holds(1).await;
    drop(leaving);
    let last = part.last().and_then(|f| f.id.clone()).expect("an id");

    // Front end B follows the thread from the client's position at once, though nothing new
    // is stored until the model goes on.
    let mut back = b.server.reconnect("t", &last).await;
    worker.rig.model.release(1);
    let missed = back.until(|f| f.is("step_end")).await;
    worker.rig.model.wait_holds(2).await;
    drop(back);
    let last = missed.last().and_then(|f| f.id.clone()).expect("an id");

    // And back to front end A, which still follows the run it started.
    let again = a.server.reconnect("t", &last).await;
    worker.rig.model.release(1);
    let tail = again.rest().await;

    let joined: Vec<Frame> = part.iter().chain(&missed).chain(&tail).cloned().collect();
    let events = checked_activation(&joined);
    assert_eq!(
        events,
        a.rig.store.stored("t").await,
        "no gap, no duplicate"
    );
    assert_eq!(stayed.rest().await, joined);
    assert_eq!(termination(&joined), TerminationReason::NaturalEnd);

    // After the end, either front end answers the same events after the same position.
    for front in [&a, &b] {
        assert_eq!(front.server.reconnect("t", &last).await.rest().await, tail);
    }
    assert_eq!(worker.stop().await.completed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_posted_to_another_front_end_continues_the_run_on_another_worker() {
    let Some(fleet) = Fleet::new("decide").await else {
        return;
    };
    let a = fleet.front().await;
    let b = fleet.front().await;
    let w1 = fleet
        .worker("w1", vec![call_turn("c1", "guarded", json!({"text": "a"}))])
        .await;
    let frames = a.server.start_run("t", "hi").await.rest().await;
    let events = checked_activation(&frames);
    assert_eq!(termination(&frames), TerminationReason::Suspended);
    let stored = a.rig.store.stored("t").await;
    assert_eq!(events, stored);
    let ticket = ticket(&events);
    assert_eq!(w1.stop().await.completed, 1);

    // Refused: a call that does not wait, a digest other than the one shown, a new run on the
    // waiting thread without `supersede`. Nothing of them is queued.
    let unknown = b
        .server
        .post(
            "/v1/threads/t/decisions",
            json!({"decisions": [{"call_id": "nope", "decision": "approve"}]}),
        )
        .await;
    assert_eq!(
        refusal(unknown).await,
        (
            StatusCode::BAD_REQUEST,
            "unknown_call".into(),
            Some("decisions".into())
        )
    );
    let digest = b
        .server
        .post(
            "/v1/threads/t/decisions",
            json!({"decisions": [{"call_id": "c1", "decision": "approve", "argument_digest": "other"}]}),
        )
        .await;
    assert_eq!(refusal(digest).await.1, "invalid_decision");
    let waiting = b
        .server
        .post("/v1/threads/t/runs", json!({"message": "again"}))
        .await;
    assert_eq!(
        refusal(waiting).await,
        (StatusCode::CONFLICT, "thread_waiting".into(), None)
    );
    assert_eq!(b.queue.job_of_thread(&tid("t")).await.expect("job"), None);
    assert_eq!(
        b.queue.depth(Timestamp::now()).await.expect("depth"),
        QueueDepth::default()
    );
    assert_eq!(a.rig.store.stored("t").await, stored);

    // Another worker continues the run with the decision, streamed by front end B.
    let w2 = fleet
        .worker(
            "w2",
            vec![vec![
                Piece::Hold,
                text("approved"),
                stop(StopReason::EndTurn),
            ]],
        )
        .await;
    let response = b
        .server
        .post(
            "/v1/threads/t/decisions",
            json!({"decisions": [{
                "call_id": "c1",
                "decision": "approve",
                "argument_digest": ticket.call.argument_digest,
            }]}),
        )
        .await;
    let mut resumed = Sse::new(response).await;
    let first = resumed.until(|f| f.is("step_start")).await;
    w2.rig.model.wait_holds(1).await;
    // Front end A, which did not queue the decision, follows the resumed run from the thread's
    // start and from a position before the suspension: past the first activation's end.
    let from_start = a.server.events_after("t", "0").await;
    let from_before = a.server.reconnect("t", "3").await;
    w2.rig.model.release(1);
    let frames: Vec<Frame> = first.into_iter().chain(resumed.rest().await).collect();
    let all = a.rig.store.stored("t").await;
    assert_eq!(agent_events(&from_start.rest().await), all);
    assert_eq!(agent_events(&from_before.rest().await), all[3..]);
    let events = checked_activation(&frames);
    assert_eq!(events, all[stored.len()..]);
    expect![[r#"
        9 run_start resumed=true
        10 step_start 2
        11 tool_call_resumed c1 Approve
        12 tool_call_ready c1 {"text":"a"}
        13 tool_call_done c1 succeeded {"echoed":"a"}
        14 step_end 2
        15 step_start 3
        16 inference_complete
        17 step_end 3
        18 run_finish natural_end response=Some("approved")
    "#]]
    .assert_eq(&render(&events));
    let record = a.rig.store.last_run("t").await;
    assert_eq!(record.status, RunStatus::Done);
    assert_eq!(w2.rig.model.requests(), 1);
    assert_eq!(w2.stop().await.completed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_supersedes_a_run_held_on_a_worker_cancels_it_first() {
    let Some(fleet) = Fleet::new("supersede_held").await else {
        return;
    };
    let a = fleet.front().await;
    let b = fleet.front().await;
    let worker = fleet
        .worker("w1", vec![held(), held(), text_turn(&["instead"])])
        .await;
    let body = json!({"message": "instead", "supersede": true});
    let mut first = a.server.start_run("t", "hi").await;
    let first_part = first.until(|f| f.is("run_start")).await;
    worker.rig.model.wait_holds(1).await;

    // On the front end that follows the run and on one that does not: busy without
    // `supersede`.
    for front in [&a, &b] {
        let busy = front
            .server
            .post("/v1/threads/t/runs", json!({"message": "again"}))
            .await;
        assert_eq!(
            refusal(busy).await,
            (StatusCode::CONFLICT, "thread_busy".into(), None)
        );
    }
    // With it, on the front end following the held run: that run ends cancelled, the new one
    // runs (and is held in turn).
    let response = a.server.post("/v1/threads/t/runs", body.clone()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut second = Sse::new(response).await;
    let second_part = second.until(|f| f.is("run_start")).await;
    worker.rig.model.wait_holds(2).await;
    // And on a front end that follows none.
    let response = b.server.post("/v1/threads/t/runs", body).await;
    assert_eq!(response.status(), StatusCode::OK);
    let third = Sse::new(response).await.rest().await;

    let first: Vec<Frame> = first_part.into_iter().chain(first.rest().await).collect();
    let second: Vec<Frame> = second_part.into_iter().chain(second.rest().await).collect();
    for (frames, ended) in [
        (&first, TerminationReason::Cancelled),
        (&second, TerminationReason::Cancelled),
        (&third, TerminationReason::NaturalEnd),
    ] {
        checked_activation(frames);
        assert_eq!(termination(frames), ended);
    }
    let joined: Vec<Frame> = [first, second, third].concat();
    assert_eq!(agent_events(&joined), a.rig.store.stored("t").await);
    assert_eq!(worker.rig.model.requests(), 3);
    assert_eq!(worker.stop().await.completed, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_on_the_front_end_ends_a_run_held_on_a_worker() {
    let Some(fleet) = Fleet::new("cancel_held").await else {
        return;
    };
    // With a worker identity of its own, as `awaken serve --queue` has: a claimed job is
    // still cancelled by its worker.
    let front = fleet.front_named("front-a").await;
    let worker = fleet.worker("w1", vec![held()]).await;
    let mut sse = front.server.start_run("t", "hi").await;
    let part = sse.until(|f| f.is("run_start")).await;
    worker.rig.model.wait_holds(1).await;
    // A message waiting for the run as it is cancelled: not taken.
    let steered = front.post_later("/v1/threads/t/messages", json!({"message": "also"}));
    steering_delivered(&fleet, 1).await;

    let response = front.server.post("/v1/threads/t/cancel", json!({})).await;
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.expect("JSON");
    assert_eq!(answer["cancelled"], true, "{answer}");
    assert_eq!(
        answer["outcome"]["termination"]["kind"], "cancelled",
        "{answer}"
    );

    let frames: Vec<Frame> = part.into_iter().chain(sse.rest().await).collect();
    let events = checked_activation(&frames);
    assert_eq!(termination(&frames), TerminationReason::Cancelled);
    assert_eq!(events, front.rig.store.stored("t").await);
    let record = front.rig.store.last_run("t").await;
    assert_eq!(record.status, RunStatus::Done);
    assert_eq!(record.termination, Some(TerminationReason::Cancelled));
    assert_eq!(answer["outcome"]["run_id"], record.run_id.as_str());
    refused_not_taken(steered).await;
    assert!(
        !stored_messages(&front, "t")
            .await
            .iter()
            .any(|(_, text)| text == "also")
    );
    assert_eq!(worker.rig.model.requests(), 1);
    assert_eq!(worker.stop().await.completed, 1);
}

/// Waits until `n` steering messages were handed to a worker's claim.
async fn steering_delivered(fleet: &Fleet, n: i64) {
    steering_rows(fleet, n, "delivered_claim IS NOT NULL").await;
}

/// Waits until `n` steering messages for which `condition` holds are stored.
async fn steering_rows(fleet: &Fleet, n: i64, condition: &str) {
    let client = fleet.client().await;
    let count = format!("SELECT COUNT(*) FROM run_steering WHERE {condition}");
    guarded("the steering messages", async {
        loop {
            let row = client.query_one(count.as_str(), &[]).await.expect("count");
            if row.get::<_, i64>(0) >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// The thread's stored messages, as (role, text).
async fn stored_messages(front: &FrontEnd, thread: &str) -> Vec<(Role, String)> {
    front
        .rig
        .store
        .load_checkpoint(&tid(thread))
        .await
        .expect("load")
        .map(|cp| cp.messages)
        .unwrap_or_default()
        .iter()
        .map(|m| (m.role, m.text()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_posted_to_any_front_end_reaches_the_run_on_its_worker() {
    let Some(fleet) = Fleet::new("steer_held").await else {
        return;
    };
    let a = fleet.front().await;
    let b = fleet.front().await;
    let no_job = b
        .server
        .post("/v1/threads/t/messages", json!({"message": "early"}))
        .await;
    assert_eq!(
        refusal(no_job).await,
        (StatusCode::CONFLICT, "not_running".into(), None)
    );

    // Sent while the run is queued, to a front end that does not follow it: the worker hands
    // it over before the first step, which takes it.
    let mut listener = a.queue.listen(awaken_store::Hear::All);
    guarded("the listener", listener.ready()).await;
    let first = a.post_later("/v1/threads/t/runs", json!({"message": "hi"}));
    job_announced(&mut listener).await;
    let early = b.post_later("/v1/threads/t/messages", json!({"message": "and tea"}));
    guarded("the message to be stored", async {
        while listener.recv().await != FleetWake::Steer(tid("t")) {}
    })
    .await;
    let mut call_then_held = call_turn("c1", "echo", json!({"text": "a"}));
    call_then_held.insert(2, Piece::Hold);
    let worker = fleet
        .worker(
            "w1",
            vec![
                text_turn(&["Tea too."]),
                call_then_held,
                text_turn(&["Eggs too."]),
            ],
        )
        .await;
    let answer = guarded("the steering answer", early).await.expect("posted");
    assert_eq!(answer.status(), StatusCode::OK);
    let answer: Value = answer.json().await.expect("JSON");
    assert_eq!(answer, json!({"taken": true, "step": 1}));
    let response = guarded("the run's answer", first).await.expect("posted");
    let frames = Sse::new(response).await.rest().await;
    checked_activation(&frames);
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);

    // Sent while the worker's model holds, to the front end that does not follow the run:
    // taken at the next step, after the call's result.
    let mut sse = a.server.start_run("t", "milk").await;
    let part = sse.until(|f| f.is("run_start")).await;
    worker.rig.model.wait_holds(1).await;
    let steered = b.post_later("/v1/threads/t/messages", json!({"message": "eggs"}));
    steering_delivered(&fleet, 1).await;
    // Both front ends show it waiting for the run.
    for front in [&a, &b] {
        let shown: Value = front
            .server
            .get("/v1/threads/t")
            .await
            .json()
            .await
            .expect("JSON");
        assert_eq!(shown["messages_waiting"], 1, "{shown}");
    }
    worker.rig.model.release(1);
    let answer = guarded("the steering answer", steered)
        .await
        .expect("posted");
    assert_eq!(answer.status(), StatusCode::OK);
    let answer: Value = answer.json().await.expect("JSON");
    assert_eq!(answer, json!({"taken": true, "step": 2}));
    let frames: Vec<Frame> = part.into_iter().chain(sse.rest().await).collect();
    checked_activation(&frames);
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    let user = |t: &str| (Role::User, t.to_owned());
    let stored = stored_messages(&a, "t").await;
    assert_eq!(
        stored
            .iter()
            .filter(|(r, _)| *r == Role::User)
            .cloned()
            .collect::<Vec<_>>(),
        [user("hi"), user("and tea"), user("milk"), user("eggs")]
    );
    assert_eq!(stored[stored.len() - 2], user("eggs"), "{stored:?}");
    assert_eq!(worker.rig.model.requests(), 3);
    let shown: Value = b
        .server
        .get("/v1/threads/t")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(shown["messages_waiting"], 0, "{shown}");
    // Read once: the table keeps nothing of answered messages.
    let client = fleet.client().await;
    let left: i64 = client
        .query_one("SELECT COUNT(*) FROM run_steering", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(left, 0);
    assert_eq!(worker.stop().await.completed, 2);
}

/// The state and step of steering message `id`, as stored.
async fn steering_row(client: &tokio_postgres::Client, id: SteerId) -> (String, Option<i32>) {
    let row = client
        .query_one(
            "SELECT state, step FROM run_steering WHERE steer_id = $1",
            &[&id.0],
        )
        .await
        .expect("the message's row");
    (row.get(0), row.get(1))
}

/// A run of `milk` on thread `t`, posted to `front`, on a worker process `w1` whose model
/// calls `echo` and holds, then answers `then`; "eggs" sent for the run through the queue and
/// handed to the worker while the model holds. The worker, the stream and its frames so far,
/// and the message's id.
async fn steered_on_a_worker_process(
    fleet: &Fleet,
    front: &FrontEnd,
    then: Vec<Piece>,
) -> (Process, Sse, Vec<Frame>, SteerId) {
    let counted = Arc::new(AtomicUsize::new(0));
    let mut call_then_held = call_turn("c1", "echo", json!({"text": "a"}));
    call_then_held.insert(2, Piece::Hold);
    let w1 = fleet
        .process("w1", vec![call_then_held, then], &counted)
        .await;
    let mut sse = front.server.start_run("t", "milk").await;
    let part = sse.until(|f| f.is("run_start")).await;
    w1.rig.model.wait_holds(1).await;
    let id = front
        .queue
        .steer(&tid("t"), &Message::user("eggs"), Timestamp::now())
        .await
        .expect("steer")
        .expect("the thread has a job");
    steering_delivered(fleet, 1).await;
    (w1, sse, part, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_taken_by_a_dead_worker_is_not_taken_again_by_the_next() {
    let Some(fleet) = Fleet::new("steer_takeover").await else {
        return;
    };
    let front = fleet.front().await;
    let (mut w1, sse, part, id) = steered_on_a_worker_process(&fleet, &front, held()).await;
    w1.rig.model.release(1);
    // Step 2 took it and its answer was recorded; the worker then dies with its run held in
    // that step. Made unrecorded again, as if it had died between the run's commit and the
    // record.
    let client = fleet.client().await;
    guarded("the answer to be recorded", async {
        while steering_row(&client, id).await.0 != "taken" {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    w1.rig.model.wait_holds(2).await;
    client
        .execute(
            "UPDATE run_steering SET state = 'waiting', step = NULL, answered_at = NULL \
             WHERE steer_id = $1",
            &[&id.0],
        )
        .await
        .expect("unrecord");
    w1.kill();

    // The next worker is handed the message again with the job; the run it takes over holds
    // the message's receipt, so the message is answered as taken at step 2, not taken twice.
    let w2 = fleet
        .worker("w2", vec![text_turn(&["Eggs and milk."])])
        .await;
    let frames: Vec<Frame> = part.into_iter().chain(sse.rest().await).collect();
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    assert_eq!(
        steering_row(&client, id).await,
        ("taken".to_owned(), Some(2))
    );
    assert_eq!(
        front.queue.steer_answer(id).await.expect("answer"),
        SteerAnswer::Taken { step: 2 }
    );
    let users: Vec<String> = stored_messages(&front, "t")
        .await
        .into_iter()
        .filter(|(r, _)| *r == Role::User)
        .map(|(_, t)| t)
        .collect();
    assert_eq!(users, ["milk", "eggs"]);
    assert_eq!(w2.rig.model.requests(), 1);
    assert_eq!(w2.stop().await.completed, 1);
}

/// How many statements ending a job wait for `locker`'s lock.
async fn job_ends_waiting(locker: &tokio_postgres::Client) -> i64 {
    locker
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid)) \
             AND query LIKE 'DELETE FROM run_queue WHERE job_id%'",
            &[],
        )
        .await
        .expect("the waiting backends")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_a_finished_run_took_is_answered_by_the_worker_that_ends_its_job() {
    let Some(fleet) = Fleet::new("steer_unrecorded").await else {
        return;
    };
    let front = fleet.front().await;
    let (mut w1, sse, part, id) =
        steered_on_a_worker_process(&fleet, &front, text_turn(&["Done."])).await;

    // The run takes the message at step 2 and finishes, but its worker dies before the job
    // ends (held up by a lock on the queue) and before the answer is recorded (undone here).
    let locker = lock_the_queue(&fleet).await;
    w1.rig.model.release(1);
    let client = fleet.client().await;
    guarded("the run to end and its job's end to wait", async {
        while steering_row(&client, id).await.0 != "taken" || job_ends_waiting(&locker).await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    client
        .execute(
            "UPDATE run_steering SET state = 'waiting', step = NULL, answered_at = NULL \
             WHERE steer_id = $1",
            &[&id.0],
        )
        .await
        .expect("unrecord");
    w1.kill();
    locker
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid)) \
             AND query LIKE 'DELETE FROM run_queue WHERE job_id%'",
            &[],
        )
        .await
        .expect("end the dead worker's statement");
    locker.batch_execute("ROLLBACK").await.expect("unlock");
    let frames: Vec<Frame> = part.into_iter().chain(sse.rest().await).collect();
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);

    // The next worker finds the run finished, and answers the message from its receipts
    // before it ends the job.
    let w2 = fleet.worker("w2", vec![]).await;
    guarded("the job to end", async {
        while front
            .queue
            .job_of_thread(&tid("t"))
            .await
            .expect("job")
            .is_some()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(
        front.queue.steer_answer(id).await.expect("answer"),
        SteerAnswer::Taken { step: 2 }
    );
    assert_eq!(w2.rig.model.requests(), 0);
    assert_eq!(w2.stop().await.completed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_right_after_a_run_ended_waits_for_its_job_to_leave_the_queue() {
    let Some(fleet) = Fleet::new("start_after_end").await else {
        return;
    };
    let front = fleet.front().await;
    let worker = fleet
        .worker("w1", vec![held(), text_turn(&["Again."])])
        .await;
    let mut sse = front.server.start_run("t", "hi").await;
    let part = sse.until(|f| f.is("run_start")).await;
    worker.rig.model.wait_holds(1).await;
    // The job's row locked: the run ends, but its worker's word to the queue waits.
    let locker = fleet.client().await;
    locker
        .batch_execute("BEGIN; SELECT job_id FROM run_queue WHERE thread_id = 't' FOR UPDATE")
        .await
        .expect("lock the job");
    worker.rig.model.release(1);
    let frames: Vec<Frame> = part.into_iter().chain(sse.rest().await).collect();
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    waits_for(&locker, "the job's end to wait for its row").await;

    // The next start waits for the job to leave the queue instead of being refused busy.
    let next = front.post_later("/v1/threads/t/runs", json!({"message": "again"}));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !next.is_finished(),
        "answered while the job was still queued"
    );
    locker.batch_execute("ROLLBACK").await.expect("unlock");
    let response = guarded("the next run's answer", next)
        .await
        .expect("posted");
    let frames = Sse::new(response).await.rest().await;
    checked_activation(&frames);
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    assert_eq!(worker.stop().await.completed, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cancelled_before_any_worker_claims_it_ends_cancelled() {
    let Some(fleet) = Fleet::new("cancel_queued").await else {
        return;
    };
    let a = fleet.front().await;
    let b = fleet.front().await;
    let mut listener = listening(&a.queue).await;
    let posted = a.post_later("/v1/threads/t/runs", json!({"message": "hi"}));
    job_announced(&mut listener).await;
    assert!(
        a.queue
            .job_of_thread(&tid("t"))
            .await
            .expect("job")
            .is_some()
    );

    // Front end B does not follow the run: it asks the queue.
    let response = b.server.post("/v1/threads/t/cancel", json!({})).await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let answer: Value = response.json().await.expect("JSON");
    assert_eq!(answer, json!({"cancelled": true, "outcome": null}));

    let worker = fleet.worker("w1", vec![text_turn(&["never"])]).await;
    // The worker starts the run and it ends at once, cancelled, its model never asked; the
    // client's stream ends with it.
    ended_at_its_start(&a, "t", posted).await;
    let completed = WorkerReport {
        completed: 1,
        ..WorkerReport::default()
    };
    ended_cancelled_unasked(&a, worker, completed, QueueDepth::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_end_ends_a_job_no_worker_has_claimed_when_it_is_cancelled() {
    let Some(fleet) = Fleet::new("cancel_unclaimed").await else {
        return;
    };
    let a = fleet.front_named("front-a").await;
    let b = fleet.front_named("front-b").await;
    let mut listener = listening(&a.queue).await;
    let on_t = a.post_later("/v1/threads/t/runs", json!({"message": "hi"}));
    job_announced(&mut listener).await;
    let on_u = a.post_later("/v1/threads/u/runs", json!({"message": "hello"}));
    job_announced(&mut listener).await;
    // A message for t's queued run, waiting with its job.
    let steered = b.post_later("/v1/threads/t/messages", json!({"message": "also"}));
    steering_rows(&fleet, 1, "state = 'waiting'").await;

    // A front end that does not serve the job's agent only asks the queue: the job waits on.
    let other = fleet.front_serving("front-c", "other").await;
    let response = other.server.post("/v1/threads/t/cancel", json!({})).await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let depth = a.queue.depth(Timestamp::now()).await.expect("depth");
    assert_eq!((depth.queued, depth.claimed), (2, 0));

    // No worker runs: front end B, which does not follow t's job, ends it itself at once.
    let response = b.server.post("/v1/threads/t/cancel", json!({})).await;
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.expect("JSON");
    assert_eq!(answer["cancelled"], true);
    assert_eq!(
        answer["outcome"]["termination"],
        json!({"kind": "cancelled"})
    );
    // Front end A, whose client follows u's job, does the same.
    let response = a.server.post("/v1/threads/u/cancel", json!({})).await;
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.expect("JSON");
    assert_eq!(
        answer["outcome"]["termination"],
        json!({"kind": "cancelled"})
    );

    // Each client's stream ends with its run, cancelled at its start with the message stored.
    for (thread, posted, message) in [("t", on_t, "hi"), ("u", on_u, "hello")] {
        ended_at_its_start(&a, thread, posted).await;
        assert_eq!(
            stored_messages(&a, thread).await,
            [(Role::User, message.to_owned())]
        );
    }
    // The run took no message: the one waiting is refused.
    refused_not_taken(steered).await;
    assert_eq!(
        a.queue.depth(Timestamp::now()).await.expect("depth"),
        QueueDepth::default()
    );
    // A worker started later finds nothing to run.
    let worker = fleet.worker("w1", vec![text_turn(&["never"])]).await;
    ended_cancelled_unasked(&a, worker, WorkerReport::default(), QueueDepth::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_superseding_a_job_no_worker_has_claimed_does_not_wait_for_a_worker() {
    let Some(fleet) = Fleet::new("supersede_unclaimed").await else {
        return;
    };
    let a = fleet.front_named("front-a").await;
    let mut listener = listening(&a.queue).await;
    let queued = a.post_later("/v1/threads/t/runs", json!({"message": "first"}));
    job_announced(&mut listener).await;
    // With no worker, the superseding start ends the queued job and queues its own at once.
    let superseding = a.post_later(
        "/v1/threads/t/runs",
        json!({"message": "second", "supersede": true}),
    );
    let first = answered("the first run's answer", queued).await;
    assert_eq!(termination(&first), TerminationReason::Cancelled);
    job_announced(&mut listener).await;
    let worker = fleet
        .worker("w1", vec![text_turn(&["second answer"])])
        .await;
    let second = answered("the second run's answer", superseding).await;
    checked_activation(&second);
    assert_eq!(termination(&second), TerminationReason::NaturalEnd);
    assert_eq!(
        stored_messages(&a, "t").await,
        [
            (Role::User, "first".to_owned()),
            (Role::User, "second".to_owned()),
            (Role::Assistant, "second answer".to_owned()),
        ]
    );
    assert_eq!(worker.rig.model.requests(), 1);
    let report = worker.stop().await;
    assert_eq!(report.completed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_racing_a_workers_claims_end_every_job_once() {
    let Some(fleet) = Fleet::new("cancel_race").await else {
        return;
    };
    const RUNS: usize = 16;
    let a = fleet.front_named("front-a").await;
    let b = fleet.front_named("front-b").await;
    let mut listener = listening(&a.queue).await;
    let mut posted = Vec::new();
    for i in 0..RUNS {
        let body = json!({"message": format!("run {i}")});
        posted.push(a.post_later(&format!("/v1/threads/r{i}/runs"), body));
        job_announced(&mut listener).await;
    }
    // A worker claims the jobs (its model holds each run) while front end B cancels them all:
    // each job is ended once, by the front end before any claim or by the worker after one.
    let worker = fleet
        .worker("w1", (0..RUNS).map(|_| held()).collect())
        .await;
    // Once it holds as many runs as it drives at once: those are cancelled through the queue,
    // and it claims more as they end, while the front end ends the others.
    worker.rig.model.wait_holds(4).await;
    let cancels: Vec<_> = (0..RUNS)
        .map(|i| b.post_later(&format!("/v1/threads/r{i}/cancel"), json!({})))
        .collect();
    let mut ended_here = 0;
    for cancel in cancels {
        let response = guarded("a cancel", cancel).await.expect("cancel");
        match response.status() {
            StatusCode::OK => ended_here += 1,
            StatusCode::ACCEPTED => {}
            other => panic!("a cancel answered {other}"),
        }
    }
    for (i, posted) in posted.into_iter().enumerate() {
        let thread = format!("r{i}");
        let frames = answered("a run's answer", posted).await;
        assert_eq!(
            termination(&frames),
            TerminationReason::Cancelled,
            "{thread}"
        );
        assert_eq!(
            checked_activation(&frames),
            a.rig.store.stored(&thread).await
        );
        let runs = a.rig.store.list_runs(&tid(&thread)).await.expect("runs");
        assert_eq!(runs.len(), 1, "{thread}: {runs:?}");
        assert_eq!(
            stored_messages(&a, &thread).await.first(),
            Some(&(Role::User, format!("run {i}"))),
        );
    }
    assert_eq!(
        a.queue.depth(Timestamp::now()).await.expect("depth"),
        QueueDepth::default()
    );
    let report = worker.stop().await;
    // Every job the front end did not end, the worker did; none failed.
    assert_eq!(
        report.completed as usize + ended_here,
        RUNS,
        "{ended_here} ended by the front end; the worker: {report:?}"
    );
    assert_eq!((report.dead, report.lost), (0, 0), "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_following_a_queued_job_from_the_start_does_not_hold_up_a_superseding_start() {
    let Some(fleet) = Fleet::new("supersede_queued").await else {
        return;
    };
    let a = fleet.front().await;
    let b = fleet.front().await;
    // A first run of the thread, ended.
    let w1 = fleet.worker("w1", vec![text_turn(&["first"])]).await;
    let first = a.server.start_run("t", "hi").await.rest().await;
    assert_eq!(termination(&first), TerminationReason::NaturalEnd);
    assert_eq!(w1.stop().await.completed, 1);
    // A second one queued on front end B, with no worker to claim it.
    let mut listener = listening(&a.queue).await;
    let queued = b.post_later("/v1/threads/t/runs", json!({"message": "again"}));
    job_announced(&mut listener).await;
    // A client follows the thread on front end A from its start: the first run's
    // `run_finish` comes by, and is not the queued job's end.
    let mut watching = a.server.events_after("t", "0").await;
    let history = watching.until(|f| f.is("run_finish")).await;
    assert_eq!(history, first);

    // A start without `supersede` is refused at once, not after waiting for a run to close.
    let asked = std::time::Instant::now();
    let busy = a
        .server
        .post("/v1/threads/t/runs", json!({"message": "third"}))
        .await;
    assert_eq!(
        refusal(busy).await,
        (StatusCode::CONFLICT, "thread_busy".into(), None)
    );
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );
    // With it, the queued job is cancelled once a worker claims it, and the new run runs.
    let w2 = fleet.worker("w2", vec![text_turn(&["third"])]).await;
    let response = a
        .server
        .post(
            "/v1/threads/t/runs",
            json!({"message": "third", "supersede": true}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let third = Sse::new(response).await.rest().await;
    checked_activation(&third);
    assert_eq!(termination(&third), TerminationReason::NaturalEnd);
    let second = answered("the queued run's answer", queued).await;
    assert_eq!(termination(&second), TerminationReason::Cancelled);
    // The watching client saw the cancelled job to its end.
    let rest = watching.rest().await;
    assert_eq!(rest, second);
    assert_eq!(w2.rig.model.requests(), 1);
    assert_eq!(w2.stop().await.completed, 2);
}

/// Checks that the steering message posted with `post_later` was refused (409 `not_taken`).
async fn refused_not_taken(steered: tokio::task::JoinHandle<reqwest::Response>) {
    let steered = guarded("the steering answer", steered)
        .await
        .expect("posted");
    assert_eq!(
        refusal(steered).await,
        (StatusCode::CONFLICT, "not_taken".into(), None)
    );
}

/// Checks that the run posted with `post_later` on `thread` ended `Cancelled` at its start:
/// its client's stream and the store hold its start and its end, nothing between.
async fn ended_at_its_start(
    front: &FrontEnd,
    thread: &str,
    posted: tokio::task::JoinHandle<reqwest::Response>,
) {
    let frames = answered("the run's answer", posted).await;
    let events = checked_activation(&frames);
    expect![[r#"
        1 run_start resumed=false
        2 run_finish cancelled response=None
    "#]]
    .assert_eq(&render(&events));
    assert_eq!(events, front.rig.store.stored(thread).await);
}

/// The whole stream answering a request posted with `post_later`.
async fn answered(what: &str, posted: tokio::task::JoinHandle<reqwest::Response>) -> Vec<Frame> {
    let response = guarded(what, posted).await.expect("posted");
    Sse::new(response).await.rest().await
}

/// Checks that thread `t`'s last run ended `Cancelled` with `worker`'s model never asked,
/// then stops the worker: it reports `report`, and the queue is left as `left`.
async fn ended_cancelled_unasked(
    front: &FrontEnd,
    worker: RunningWorker,
    report: WorkerReport,
    left: QueueDepth,
) {
    let record = front.rig.store.last_run("t").await;
    assert_eq!(record.status, RunStatus::Done);
    assert_eq!(record.termination, Some(TerminationReason::Cancelled));
    assert_eq!(worker.rig.model.requests(), 0);
    assert_eq!(worker.stop().await, report);
    assert_eq!(
        front.queue.depth(Timestamp::now()).await.expect("depth"),
        left
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_with_a_queued_job_refuses_another_run() {
    let Some(fleet) = Fleet::new("busy").await else {
        return;
    };
    let a = fleet.front().await;
    let b = fleet.front().await;
    let mut listener = listening(&a.queue).await;
    let posted = a.post_later("/v1/threads/t/runs", json!({"message": "hi"}));
    job_announced(&mut listener).await;

    for front in [&a, &b] {
        let again = front
            .server
            .post("/v1/threads/t/runs", json!({"message": "again"}))
            .await;
        assert_eq!(
            refusal(again).await,
            (StatusCode::CONFLICT, "thread_busy".into(), None)
        );
    }
    assert_eq!(
        a.queue.depth(Timestamp::now()).await.expect("depth"),
        QueueDepth {
            queued: 1,
            ..QueueDepth::default()
        }
    );

    // The queued run goes on once a worker runs.
    let worker = fleet.worker("w1", vec![text_turn(&["first"])]).await;
    let frames = answered("the run's answer", posted).await;
    checked_activation(&frames);
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    assert_eq!(worker.rig.model.requests(), 1);
    assert_eq!(worker.stop().await.completed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_no_worker_can_run_is_dead_lettered_and_its_client_told() {
    let Some(fleet) = Fleet::new("dead").await else {
        return;
    };
    let front = fleet.front().await;
    // The worker serves another agent than the front end's.
    let worker = fleet
        .worker_with("w1", Vec::new(), worker_config(), |rig| {
            rig.with_agent("other")
        })
        .await;
    let response = front
        .server
        .post("/v1/threads/t/runs", json!({"message": "hi"}))
        .await;
    assert_eq!(
        refusal(response).await,
        (StatusCode::INTERNAL_SERVER_ERROR, "run_failed".into(), None)
    );
    let response = front
        .server
        .post("/v1/threads/u/runs?stream=false", json!({"message": "hi"}))
        .await;
    assert_eq!(
        refusal(response).await,
        (StatusCode::INTERNAL_SERVER_ERROR, "run_failed".into(), None)
    );
    let dead = front.queue.dead_letters(10).await.expect("dead letters");
    let mut threads: Vec<&str> = dead.iter().map(|j| j.thread_id.as_str()).collect();
    threads.sort_unstable();
    assert_eq!(threads, ["t", "u"], "{dead:#?}");
    for job in &dead {
        // Not retried: the failure is the same every time.
        assert_eq!(job.attempts, 1, "{job:?}");
        assert_eq!(job.error, "agent `agent` is not registered", "{job:?}");
    }
    let report = worker.stop().await;
    assert_eq!(
        report,
        WorkerReport {
            dead: 2,
            ..WorkerReport::default()
        }
    );
    assert_eq!(
        front.queue.depth(Timestamp::now()).await.expect("depth"),
        QueueDepth {
            dead: 2,
            ..QueueDepth::default()
        }
    );
}

/// A step that runs `count`, then an answer held before its first delta.
fn count_then_held() -> Vec<Vec<Piece>> {
    vec![
        call_turn("c1", "count", json!({})),
        vec![Piece::Hold, text("never"), stop(StopReason::EndTurn)],
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_worker_takes_over_the_run_of_a_dead_one() {
    let Some(fleet) = Fleet::new("takeover").await else {
        return;
    };
    let front = fleet.front().await;
    let counted = Arc::new(AtomicUsize::new(0));
    let mut w1 = fleet.process("w1", count_then_held(), &counted).await;
    let mut sse = front.server.start_run("t", "hi").await;
    let part = sse.until(|f| f.is("tool_call_done")).await;
    w1.rig.model.wait_holds(1).await;
    assert_eq!(
        job_of_t(&front).await,
        JobState::Pending {
            attempts: 1,
            claimed_by: Some("w1".into()),
            last_error: None
        }
    );
    // The new worker claims the job once the dead one's lease expired (its heartbeats
    // stopped), then continues the run from its last checkpoint.
    w1.kill();

    let w2 = fleet
        .worker_with("w2", vec![text_turn(&["Done"])], worker_config(), |rig| {
            rig.counting(&counted)
        })
        .await;
    let frames: Vec<Frame> = part.into_iter().chain(sse.rest().await).collect();
    let events = agent_events(&frames);
    assert_eq!(events, front.rig.store.stored("t").await);
    let resumed = events
        .iter()
        .position(|(_, e)| matches!(e, AgentEvent::RunStart { resumed: true, .. }))
        .unwrap_or_else(|| panic!("the recovered activation: {frames:#?}"));
    checked_activation(&frames[resumed..]);
    assert_ids_increase(&events);
    expect![[r#"
        1 run_start resumed=false
        2 step_start 1
        3 tool_call_start c1 count
        4 inference_complete
        5 tool_call_ready c1 {}
        6 tool_call_done c1 succeeded {"count":1}
        7 step_end 1
        8 run_start resumed=true
        9 step_start 2
        10 inference_complete
        11 step_end 2
        12 run_finish natural_end response=Some("Done")
    "#]]
    .assert_eq(&render(&events));
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    // The tool ran once in all; the dead worker asked twice, the new one once.
    assert_eq!(counted.load(Ordering::SeqCst), 1);
    assert_eq!(w1.rig.model.requests(), 2);
    assert_eq!(w2.rig.model.requests(), 1);
    assert_eq!(front.rig.store.last_run("t").await.status, RunStatus::Done);
    assert_eq!(
        w2.stop().await,
        WorkerReport {
            completed: 1,
            ..WorkerReport::default()
        }
    );
    assert_eq!(
        front.queue.depth(Timestamp::now()).await.expect("depth"),
        QueueDepth::default()
    );
}

/// The state of the job of thread `t`, which `front`'s queue must hold.
async fn job_of_t(front: &FrontEnd) -> JobState {
    let job = front
        .queue
        .job_of_thread(&tid("t"))
        .await
        .expect("job")
        .expect("a job");
    front.queue.job_state(job.job_id).await.expect("job state")
}

/// A worker `w1` that drains quickly, holding a run of thread `t` (posted to `front`) on its
/// second inference, after its tool ran; the stream with the frames read so far.
async fn held_by_a_draining_worker(
    fleet: &Fleet,
    front: &FrontEnd,
    counted: &Arc<AtomicUsize>,
) -> (RunningWorker, Sse, Vec<Frame>) {
    let w1 = fleet
        .worker_with(
            "w1",
            count_then_held(),
            WorkerConfig {
                drain_grace: Duration::from_millis(100),
                ..worker_config()
            },
            |rig| rig.with_lease(SHORT_LEASE).counting(counted),
        )
        .await;
    let mut sse = front.server.start_run("t", "hi").await;
    let part = sse.until(|f| f.is("tool_call_done")).await;
    w1.rig.model.wait_holds(1).await;
    (w1, sse, part)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_whose_store_does_not_answer_still_stops() {
    let Some(fleet) = Fleet::new("drain_hung").await else {
        return;
    };
    let front = fleet.front().await;
    let (w1, _sse, _) = held_by_a_draining_worker(&fleet, &front, &Arc::default()).await;
    // The stopped run's lease release never comes back: the drain gives up on it.
    w1.rig.store.close_releases();
    stops_soon(
        w1,
        WorkerReport {
            released: 1,
            ..WorkerReport::default()
        },
    )
    .await;
}

/// Stops `worker`, which must report `report` and stop within seconds.
async fn stops_soon(worker: RunningWorker, report: WorkerReport) {
    let started = std::time::Instant::now();
    assert_eq!(worker.stop().await, report);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A worker whose queue does not answer (its table held by another connection) still drains:
/// its waiting look for jobs is given up, the job it cannot give back is abandoned after the
/// grace period and counts as lost, and another worker finishes the run with the tool run
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_whose_queue_does_not_answer_abandons_the_job() {
    let Some(fleet) = Fleet::new("drain_abandon").await else {
        return;
    };
    let front = fleet.front().await;
    let counted = Arc::new(AtomicUsize::new(0));
    let (w1, sse, part) = held_by_a_draining_worker(&fleet, &front, &counted).await;
    let locker = lock_the_queue(&fleet).await;
    // The worker looks at the queue every 100 ms: by now its look waits for the table too.
    waits_for(&locker, "a statement to wait for the queue's table").await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let model = Arc::clone(&w1.rig.model);
    stops_soon(
        w1,
        WorkerReport {
            lost: 1,
            ..WorkerReport::default()
        },
    )
    .await;
    locker.batch_execute("ROLLBACK").await.expect("unlock");

    // The job is given back if w1's abandoned release reached the database, or stays w1's
    // until its lease expires; either way w2 takes it and continues the run.
    finished_by_another(&fleet, &front, (sse, part), &counted, &model).await;
}

/// A connection of its own holding the queue's table of `fleet` in a transaction, until it
/// rolls back.
async fn lock_the_queue(fleet: &Fleet) -> tokio_postgres::Client {
    let (locker, connection) = tokio_postgres::connect(&fleet.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    locker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE \"{}\".run_queue IN ACCESS EXCLUSIVE MODE",
            fleet.schema
        ))
        .await
        .expect("lock the queue");
    locker
}

/// Waits until some statement waits for the lock `locker` holds (`what` names it if it never
/// does).
async fn waits_for(locker: &tokio_postgres::Client, what: &str) {
    guarded(what, async {
        loop {
            let waiting: i64 = locker
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))",
                    &[],
                )
                .await
                .expect("the waiting backends")
                .get(0);
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// A worker `w2` continues the run of `t` that the stream (with its frames so far) follows,
/// which `w1`'s `model` left after asking twice, and finishes it, its tool run once in all.
async fn finished_by_another(
    fleet: &Fleet,
    front: &FrontEnd,
    (sse, part): (Sse, Vec<Frame>),
    counted: &Arc<AtomicUsize>,
    model: &Held,
) {
    let w2 = fleet
        .worker_with("w2", vec![text_turn(&["Done"])], worker_config(), |rig| {
            rig.counting(counted)
        })
        .await;
    let frames: Vec<Frame> = part.into_iter().chain(sse.rest().await).collect();
    let events = agent_events(&frames);
    assert_eq!(events, front.rig.store.stored("t").await);
    let resumed = events
        .iter()
        .position(|(_, e)| matches!(e, AgentEvent::RunStart { resumed: true, .. }))
        .unwrap_or_else(|| panic!("the continued activation: {frames:#?}"));
    checked_activation(&frames[resumed..]);
    assert_ids_increase(&events);
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    assert_eq!(counted.load(Ordering::SeqCst), 1);
    assert_eq!(model.requests(), 2);
    assert_eq!(w2.rig.model.requests(), 1);
    assert_eq!(w2.stop().await.completed, 1);
    assert_eq!(
        front.queue.depth(Timestamp::now()).await.expect("depth"),
        QueueDepth::default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_gives_its_held_run_back_and_another_finishes_it() {
    let Some(fleet) = Fleet::new("drain").await else {
        return;
    };
    let front = fleet.front().await;
    let counted = Arc::new(AtomicUsize::new(0));
    let (w1, sse, part) = held_by_a_draining_worker(&fleet, &front, &counted).await;
    let model = Arc::clone(&w1.rig.model);
    assert_eq!(
        w1.stop().await,
        WorkerReport {
            released: 1,
            ..WorkerReport::default()
        }
    );
    // The job is queued again at once, the attempt not counted.
    assert_eq!(
        job_of_t(&front).await,
        JobState::Pending {
            attempts: 0,
            claimed_by: None,
            last_error: None
        }
    );

    finished_by_another(&fleet, &front, (sse, part), &counted, &model).await;
}

/// A run on thread `t` whose worker died inside its model, after the run's tool ran: the
/// front end following it, the stream so far, and the dead worker.
async fn a_run_whose_worker_died(
    fleet: &Fleet,
    max_attempts: u32,
    counted: &Arc<AtomicUsize>,
) -> (FrontEnd, Vec<Frame>, Sse, Process) {
    let front = fleet.front_with(max_attempts).await;
    let mut w1 = fleet.process("w1", count_then_held(), counted).await;
    let mut sse = front.server.start_run("t", "hi").await;
    let part = sse.until(|f| f.is("tool_call_done")).await;
    w1.rig.model.wait_holds(1).await;
    w1.kill();
    (front, part, sse, w1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_while_its_worker_is_dead_ends_cancelled_on_the_next() {
    let Some(fleet) = Fleet::new("cancel_dead").await else {
        return;
    };
    let counted = Arc::new(AtomicUsize::new(0));
    let (front, part, sse, _w1) = a_run_whose_worker_died(&fleet, 3, &counted).await;
    // The cancel reaches the queue while no worker holds the job.
    assert!(
        front
            .queue
            .request_cancel(&tid("t"))
            .await
            .expect("request the cancel")
            .is_some()
    );
    let w2 = fleet
        .worker_with("w2", vec![text_turn(&["never"])], worker_config(), |rig| {
            rig.counting(&counted)
        })
        .await;
    // The next worker ends the dead one's run cancelled at its checkpoint, asking nothing.
    let frames: Vec<Frame> = part.into_iter().chain(sse.rest().await).collect();
    assert_eq!(termination(&frames), TerminationReason::Cancelled);
    let events = agent_events(&frames);
    assert_eq!(events, front.rig.store.stored("t").await);
    let resumed = events
        .iter()
        .position(|(_, e)| matches!(e, AgentEvent::RunStart { resumed: true, .. }))
        .unwrap_or_else(|| panic!("the ending activation: {frames:#?}"));
    checked_activation(&frames[resumed..]);
    assert_eq!(counted.load(Ordering::SeqCst), 1);
    let completed = WorkerReport {
        completed: 1,
        ..WorkerReport::default()
    };
    ended_cancelled_unasked(&front, w2, completed, QueueDepth::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_attempts_ends_its_run_before_it_is_dead_lettered() {
    let Some(fleet) = Fleet::new("gave_up").await else {
        return;
    };
    let counted = Arc::new(AtomicUsize::new(0));
    // One attempt allowed: the dead worker's claim was it.
    let (front, _part, _sse, _w1) = a_run_whose_worker_died(&fleet, 1, &counted).await;
    let w2 = fleet
        .worker_with("w2", vec![text_turn(&["never"])], worker_config(), |rig| {
            rig.counting(&counted)
        })
        .await;
    let dead = guarded("the job to be dead-lettered", async {
        loop {
            let dead = front.queue.dead_letters(10).await.expect("dead letters");
            if !dead.is_empty() {
                return dead;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert!(
        dead[0].error.starts_with("gave up after 1 attempts"),
        "{:?}",
        dead[0].error
    );
    assert_eq!(counted.load(Ordering::SeqCst), 1);
    let frames = front.server.events_after("t", "0").await.rest().await;
    assert_eq!(termination(&frames), TerminationReason::Cancelled);
    let resumed = agent_events(&frames)
        .iter()
        .position(|(_, e)| matches!(e, AgentEvent::RunStart { resumed: true, .. }))
        .unwrap_or_else(|| panic!("the ending activation: {frames:#?}"));
    checked_activation(&frames[resumed..]);
    // The run is not left `Running` for a later run of the thread to go on with.
    let dead = WorkerReport {
        dead: 1,
        ..WorkerReport::default()
    };
    let left = QueueDepth {
        dead: 1,
        ..QueueDepth::default()
    };
    ended_cancelled_unasked(&front, w2, dead, left).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_its_run_is_queued_leaves_the_thread_usable() {
    let Some(fleet) = Fleet::new("gone_queued").await else {
        return;
    };
    let front = fleet.front().await;
    // Another connection holds the queue's table, so the run's job waits to be queued.
    let locker = lock_the_queue(&fleet).await;
    // The client gives up once its run's job waits for the table, and closes its connection.
    let post = front.post_later("/v1/threads/t/runs", json!({"message": "hi"}));
    waits_for(&locker, "the job to wait for the queue's table").await;
    post.abort();
    assert!(post.await.is_err_and(|e| e.is_cancelled()));
    // The server sees the connection closed before the queue takes the job.
    tokio::time::sleep(Duration::from_millis(100)).await;
    locker.batch_execute("ROLLBACK").await.expect("unlock");

    // The job was queued all the same: a worker runs it, and the thread's stream follows it
    // to its end.
    let worker = fleet
        .worker("w1", vec![text_turn(&["first"]), text_turn(&["second"])])
        .await;
    let frames = guarded(
        "the queued run's stream",
        front.server.events_after("t", "0").await.rest(),
    )
    .await;
    checked_activation(&frames);
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    // The thread takes the next run once its front end has seen the first one end (its
    // stream may read the stored end first).
    let response = guarded("the thread to take the next run", async {
        loop {
            let response = front
                .server
                .post(
                    "/v1/threads/t/runs?stream=false",
                    json!({"message": "again"}),
                )
                .await;
            if response.status() != StatusCode::CONFLICT {
                return response;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(worker.stop().await.completed, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_end_streams_the_threads_latest_job_however_its_clients_attach() {
    let Some(fleet) = Fleet::new("latest").await else {
        return;
    };
    let a = fleet.front().await;
    let b = fleet.front().await;
    let worker = fleet
        .worker(
            "w1",
            vec![
                text_turn(&["one"]),
                vec![Piece::Hold, text("two"), stop(StopReason::EndTurn)],
                text_turn(&["three"]),
            ],
        )
        .await;
    // The thread's first run, through A, which keeps it ended for reconnecting clients.
    let first = a.server.start_run("t", "hi").await.rest().await;
    checked_activation(&first);
    let first_last = first
        .iter()
        .rev()
        .find_map(|f| f.id.clone())
        .expect("an id");

    // The next, through B, held in its model. On A, a client from the thread's start follows
    // it from there; the AI SDK's resume route (no position) streams the job's run alone.
    let second = b.server.start_run("t", "again").await;
    worker.rig.model.wait_holds(1).await;
    let from_start = a.server.events_after("t", "0").await;
    let resumed = a.server.get("/v1/ai-sdk/chat/t/stream").await;
    assert_eq!(resumed.status(), StatusCode::OK);
    let resumed = Sse::new(resumed).await;
    worker.rig.model.release(1);
    let second = checked_activation(&second.rest().await);
    let stored = a.rig.store.stored("t").await;
    assert_eq!(stored_only(&agent_events(&from_start.rest().await)), stored);
    let Some((_, AgentEvent::RunStart { run_id, .. })) = second.first() else {
        panic!("the second run's start: {second:?}");
    };
    let resumed = resumed.rest().await;
    assert!(
        resumed[0].data.contains(&format!(r#""runId":"{run_id}""#)),
        "{resumed:#?}"
    );
    assert_eq!(resumed.last().map(|f| f.data.as_str()), Some("[DONE]"));

    // A third run, through B, ends. A client of A reconnecting from the first run's end gets
    // every event stored since, though A may still keep the first run (or the second's
    // follower) ended.
    let third = b.server.start_run("t", "more").await.rest().await;
    checked_activation(&third);
    let since: Vec<_> = a
        .rig
        .store
        .stored("t")
        .await
        .into_iter()
        .filter(|(id, _)| id.seq > EventId::parse(&first_last).expect("id").seq)
        .collect();
    let back = a.server.reconnect("t", &first_last).await.rest().await;
    assert_eq!(stored_only(&agent_events(&back)), since);
    assert_eq!(worker.stop().await.completed, 3);
}

/// A worker told to drain while its claim waits for the queue gives the claim up, and the job
/// counts no attempt: the next worker runs it though one attempt is all it may have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_cut_short_by_a_drain_leaves_its_job_uncounted() {
    let Some(fleet) = Fleet::new("drain_claim").await else {
        return;
    };
    let front = fleet.front_with(1).await;
    let mut listener = listening(&front.queue).await;
    let posted = front.post_later("/v1/threads/t/runs", json!({"message": "hi"}));
    job_announced(&mut listener).await;
    let locker = lock_the_queue(&fleet).await;
    let config = WorkerConfig {
        drain_grace: Duration::from_secs(5),
        ..worker_config()
    };
    let w1 = fleet
        .worker_with("w1", vec![text_turn(&["never"])], config, |rig| rig)
        .await;
    waits_for(&locker, "the worker's claim to wait for the queue's table").await;
    let model = Arc::clone(&w1.rig.model);
    let stopping = tokio::spawn(w1.stop());
    // Time for the drain to begin while the claim still waits.
    tokio::time::sleep(Duration::from_millis(250)).await;
    locker.batch_execute("ROLLBACK").await.expect("unlock");
    assert_eq!(stopping.await.expect("joined"), WorkerReport::default());
    assert_eq!(model.requests(), 0);

    let w2 = fleet.worker("w2", vec![text_turn(&["done"])]).await;
    let frames = Sse::new(posted.await.expect("answered")).await.rest().await;
    checked_activation(&frames);
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    assert_eq!(w2.stop().await.completed, 1);
    assert!(
        front
            .queue
            .dead_letters(10)
            .await
            .expect("dead letters")
            .is_empty()
    );
}

/// A cancel's notification names a thread, and may come late: a worker holding a later job
/// of the thread than the one cancelled goes on with it, as that job's own cancel flag is not
/// set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_cancel_notification_leaves_the_threads_next_job_running() {
    let Some(fleet) = Fleet::new("late_cancel").await else {
        return;
    };
    let front = fleet.front().await;
    let worker = fleet
        .worker(
            "w1",
            vec![vec![Piece::Hold, text("done"), stop(StopReason::EndTurn)]],
        )
        .await;
    let sse = front.server.start_run("t", "hi").await;
    worker.rig.model.wait_holds(1).await;
    let (notifier, connection) = tokio_postgres::connect(&fleet.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let wake = format!("{}\tcancel\tt", fleet.schema);
    notifier
        .execute("SELECT pg_notify('awaken_fleet_jobs', $1)", &[&wake])
        .await
        .expect("notify");
    // Time for the worker to hear it and look at the job.
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.rig.model.release(1);
    let frames = sse.rest().await;
    checked_activation(&frames);
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    assert_eq!(worker.stop().await.completed, 1);
}
