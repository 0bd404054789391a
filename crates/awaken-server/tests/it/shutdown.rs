//! Shutdown and recovery: open streams and waiting requests are told and end, `serve` returns
//! after the grace period, and a server with a worker identity started on the same SQLite store
//! finishes the run it stopped, its tools run once (one without recovers nothing); the
//! server's own recovery never takes over a run it drives.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use awaken_event::{AgentEvent, StopReason, TerminationReason};
use awaken_server::{EventId, ServerConfig};
use awaken_store::ThreadStore;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

/// A step that runs `count`, then an answer held after its first delta.
fn count_then_held() -> Vec<Vec<Piece>> {
    vec![
        call_turn("c1", "count", json!({})),
        vec![
            text("par"),
            Piece::Hold,
            text("tial"),
            stop(StopReason::EndTurn),
        ],
    ]
}

/// An answer held before its first delta.
fn held_answer() -> Vec<Piece> {
    vec![Piece::Hold, text("Done"), stop(StopReason::EndTurn)]
}

/// Starts the run of [`count_then_held`] on `t` in a server on the SQLite store in `dir`
/// (its runs holding leases under `worker`, if given), holds it mid-answer, shuts the server
/// down and checks the shutdown; the frames the client got.
async fn stopped_mid_run(
    dir: &std::path::Path,
    counted: &Arc<AtomicUsize>,
    worker: Option<&str>,
) -> Vec<Frame> {
    let mut rig = Rig::on(sqlite(dir).await, count_then_held()).counting(counted);
    if let Some(worker) = worker {
        rig = rig.with_worker(worker);
    }
    let mut server = TestServer::start(rig.runtime(), config()).await;
    let mut sse = server.start_run("t", "hi").await;
    let part = sse.until(|f| f.is_text("par")).await;
    rig.model.wait_holds(1).await;
    // A second client, attached from the start.
    let mut watcher = server.events_after("t", "0").await;
    assert_eq!(watcher.until(|f| f.is_text("par")).await, part);

    server.begin_shutdown();
    for stream in [sse, watcher] {
        let rest = stream.rest().await;
        assert_eq!(rest.len(), 1, "told, then ended: {rest:#?}");
        assert!(rest[0].is("shutdown") && rest[0].id.is_none(), "{rest:#?}");
    }
    server.stopped().await.expect("served");
    // Stopped where it was: not finished, its tool run once, its answer never completed.
    let record = rig.store.last_run("t").await;
    assert_eq!(record.status.as_str(), "running", "{record:?}");
    assert_eq!(counted.load(Ordering::SeqCst), 1);
    assert_eq!(rig.model.requests(), 2);
    part
}

/// Stops a server mid-run (its runs holding leases under `worker`, if given), then starts
/// another on the same store with a worker identity: it recovers the run, which a client
/// attached from the thread's start follows to its end.
async fn restart_finishes_the_run(worker: Option<&str>) {
    let dir = tempfile::tempdir().expect("dir");
    let counted = Arc::new(AtomicUsize::new(0));
    stopped_mid_run(dir.path(), &counted, worker).await;

    let rig = Rig::on(sqlite(dir.path()).await, vec![held_answer()])
        .counting(&counted)
        .with_worker("again");
    let server = TestServer::start(rig.runtime(), config()).await;
    rig.model.wait_holds(1).await;
    let mut sse = server.events_after("t", "0").await;
    rig.model.release(1);
    let frames = sse.until(|f| f.is("run_finish")).await;
    let events = agent_events(&frames);
    assert_ids_increase(&events);
    // The stored log, then the recovered activation, which is whole.
    let resumed = events
        .iter()
        .position(|(_, e)| matches!(e, AgentEvent::RunStart { resumed: true, .. }))
        .unwrap_or_else(|| panic!("the recovered activation: {frames:#?}"));
    assert_eq!(
        frames[..resumed],
        untagged(&frames[..resumed]),
        "the stopped activation's events come from the store"
    );
    checked_live(&frames[resumed..]);
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    assert_eq!(stored_only(&events), rig.store.stored("t").await);
    // The tool ran once in all; the recovered run asked the model once.
    assert_eq!(counted.load(Ordering::SeqCst), 1);
    assert_eq!(rig.model.requests(), 1);
    let record = rig.store.last_run("t").await;
    assert_eq!(record.status.as_str(), "done");
    assert_eq!(record.termination, Some(TerminationReason::NaturalEnd));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_the_streams_and_a_restart_finishes_the_run() {
    restart_finishes_the_run(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_the_leases_and_a_restart_finishes_the_run() {
    restart_finishes_the_run(Some("first")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_a_worker_identity_recovers_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let counted = Arc::new(AtomicUsize::new(0));
    let part = stopped_mid_run(dir.path(), &counted, None).await;
    let last = part.last().and_then(|f| f.id.clone()).expect("an id");
    let stored = {
        let rig = Rig::on(sqlite(dir.path()).await, vec![held_answer()]).counting(&counted);
        let server = TestServer::start(rig.runtime(), config()).await;
        assert_eq!(server.get("/readyz").await.status(), StatusCode::OK);
        // The client of the stopped run gets nothing the store does not hold, and its stream
        // ends: no run goes on.
        assert_eq!(server.reconnect("t", &last).await.rest().await, []);
        let thread: Value = server
            .get("/v1/threads/t")
            .await
            .json()
            .await
            .expect("JSON");
        assert_eq!(thread["live"], false, "{thread}");
        server.stop().await;
        // Recovery never looked for unfinished runs, and the run stayed where it stopped.
        assert_eq!(rig.store.scans(), 0);
        assert_eq!(rig.model.requests(), 0);
        assert_eq!(rig.store.last_run("t").await.status.as_str(), "running");
        rig.store.stored("t").await
    };

    // A server with one finishes the run.
    assert_eq!(
        Rig::on(sqlite(dir.path()).await, Vec::new())
            .store
            .stored("t")
            .await,
        stored,
        "nothing was added meanwhile"
    );
    let (_rig, server) = recovered_to_its_end(dir.path(), &counted, "w", config()).await;
    assert_eq!(counted.load(Ordering::SeqCst), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reconnecting_across_a_restart_gets_each_stored_event_once() {
    let dir = tempfile::tempdir().expect("dir");
    let counted = Arc::new(AtomicUsize::new(0));
    let part = stopped_mid_run(dir.path(), &counted, None).await;
    let last = part.last().and_then(|f| f.id.clone()).expect("an id");
    // The client last saw a delta after a step's start, neither of them stored.
    let seen = EventId::parse(&last).expect("an event id");
    assert_eq!(seen.activation, Some(1), "{last}");
    let stopped_at = sqlite(dir.path())
        .await
        .load_events(&tid("t"), 0)
        .await
        .expect("events")
        .len() as u64;
    assert!(stopped_at < seen.seq, "{last} was never stored");

    // A new server on the same store recovers the run: the number the client last saw goes to
    // the recovering activation's first event. The client reconnects with its last id.
    let rig = Rig::on(sqlite(dir.path()).await, vec![held_answer()])
        .counting(&counted)
        .with_worker("again");
    let server = TestServer::start(rig.runtime(), config()).await;
    rig.model.wait_holds(1).await;
    let mut back = server.reconnect("t", &last).await;
    rig.model.release(1);
    let rest = back.until(|f| f.is("run_finish")).await;
    assert_eq!(termination(&rest), TerminationReason::NaturalEnd);
    let stored = rig.store.stored("t").await;
    let recovering = stored
        .iter()
        .position(|(_, e)| matches!(e, AgentEvent::RunStart { resumed: true, .. }))
        .expect("the recovering activation");
    assert_eq!(
        stored[recovering].0.seq, seen.seq,
        "the number was given again"
    );
    // The reconnect resumes just before the recovering activation: each of its stored events
    // once, the activation whole.
    let after = checked_live(&rest);
    assert_eq!(stored_only(&after), stored[recovering..]);
    // The events the client got before the stop that the store holds, then those after the
    // reconnect, are the stored log once, in order: no gap, no duplicate, no event the store
    // never held. The others it got before the stop name the stopped activation.
    let before = agent_events(&part);
    let (kept, lost): (Vec<_>, Vec<_>) =
        before.into_iter().partition(|(id, _)| id.seq <= stopped_at);
    assert!(
        lost.iter().all(|(id, _)| id.activation == Some(1)),
        "{lost:#?}"
    );
    let got: Vec<_> = stored_only(&kept)
        .into_iter()
        .chain(stored_only(&after))
        .collect();
    assert_eq!(render(&got), render(&stored));
    server.stop().await;

    // A server that never held the recovered run answers the same id from the store alone.
    let rig = Rig::on(sqlite(dir.path()).await, Vec::new());
    let other = TestServer::start(rig.runtime(), config()).await;
    assert_eq!(
        other.reconnect("t", &last).await.rest().await,
        stored_frames(&rest)
    );
    other.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_run_survives_the_shutdown_of_the_server_that_recovered_it() {
    let dir = tempfile::tempdir().expect("dir");
    let counted = Arc::new(AtomicUsize::new(0));
    stopped_mid_run(dir.path(), &counted, None).await;

    // A second server recovers the run and is shut down while the run is held.
    {
        let rig = Rig::on(sqlite(dir.path()).await, vec![held_answer()])
            .counting(&counted)
            .with_worker("second");
        let server = TestServer::start(rig.runtime(), config()).await;
        rig.model.wait_holds(1).await;
        server.stop().await;
        let record = rig.store.last_run("t").await;
        assert_eq!(
            (record.status.as_str(), record.termination),
            ("running", None),
            "stopped at its last checkpoint, to be continued"
        );
    }

    // A third finishes it.
    let (rig, server) = recovered_to_its_end(dir.path(), &counted, "third", config()).await;
    assert_eq!(counted.load(Ordering::SeqCst), 1);
    assert_eq!(
        rig.store.last_run("t").await.termination,
        Some(TerminationReason::NaturalEnd)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_an_outcome_does_not_hold_up_shutdown() {
    let rig = Rig::memory(vec![held_answer()]);
    let mut server = TestServer::start(rig.runtime(), config()).await;
    let request = server
        .client
        .post(server.url("/v1/threads/t/runs?stream=false"))
        .json(&json!({"message": "hi"}))
        .send();
    let pending = tokio::spawn(request);
    rig.model.wait_holds(1).await;
    server.begin_shutdown();
    server.stopped().await.expect("served");
    // The request was answered that the server is shutting down (the run never ended).
    let response = guarded("the pending request", pending)
        .await
        .expect("the request task")
        .expect("an answer");
    assert_eq!(
        refusal(response).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down".into(),
            None
        )
    );
    assert_eq!(rig.store.last_run("t").await.status.as_str(), "running");
}

/// Posts a run on `t` whose first commit `rig`'s store holds back, once it is held: the
/// request's task, its answer not yet given.
async fn start_held(
    rig: &Rig,
    server: &TestServer,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    rig.store.close_commits();
    let request = server
        .client
        .post(server.url("/v1/threads/t/runs"))
        .json(&json!({"message": "hi"}))
        .send();
    let pending = tokio::spawn(request);
    rig.store.wait_held_commits(1).await;
    pending
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_waiting_for_its_first_event_is_told_of_the_shutdown() {
    let rig = Rig::memory(vec![held_answer()]);
    let mut server = TestServer::start(rig.runtime(), config()).await;
    // The store holds the run's first commit back: its start waits for the first event.
    let pending = start_held(&rig, &server).await;
    server.begin_shutdown();
    let response = guarded("the pending request", pending)
        .await
        .expect("the request task")
        .expect("an answer");
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(
        refusal(response).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down".into(),
            None
        )
    );
    server.stopped().await.expect("served");
    // Nothing of the run was stored, and the model was never asked.
    assert_eq!(rig.store.stored("t").await, []);
    assert_eq!(rig.model.requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_never_takes_over_a_run_in_flight() {
    // Runs hold leases, so recovery looks for unfinished runs every `recover_interval`.
    let rig = Rig::memory(vec![held_answer()]).with_worker("w");
    let server = TestServer::start(rig.runtime(), config()).await;
    let mut sse = server.start_run("t", "hi").await;
    rig.model.wait_holds(1).await;
    assert_eq!(server.server.runs_in_flight(), 1);
    // Recovery looks for unfinished runs a few times while the run is held.
    let scans = rig.store.scans();
    rig.store.wait_scans(scans + 3).await;
    rig.model.release(1);
    let frames = sse.until(|f| f.is("run_finish")).await;
    checked_live(&frames);
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    // One activation drove it: the model was asked once, the store holds one run start.
    assert_eq!(rig.model.requests(), 1);
    let starts = rig
        .store
        .stored("t")
        .await
        .iter()
        .filter(|(_, e)| matches!(e, AgentEvent::RunStart { .. }))
        .count();
    assert_eq!(starts, 1);
    server.stop().await;
}

/// Starts a server with the worker identity `worker` on the SQLite store in `dir`, whose
/// recovery continues the run [`stopped_mid_run`] left on `t` and ends it; the server and its
/// rig.
async fn recovered_to_its_end(
    dir: &std::path::Path,
    counted: &Arc<AtomicUsize>,
    worker: &str,
    config: ServerConfig,
) -> (Rig, TestServer) {
    let rig = Rig::on(sqlite(dir).await, vec![held_answer()])
        .counting(counted)
        .with_worker(worker);
    let server = TestServer::start(rig.runtime(), config).await;
    rig.model.wait_holds(1).await;
    let mut sse = server.events_after("t", "0").await;
    rig.model.release(1);
    let frames = sse.until(|f| f.is("run_finish")).await;
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    (rig, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_is_not_held_up_by_a_waiting_thread() {
    // A thread left waiting for a decision (its run the older one), then a run stopped
    // mid-answer on another thread.
    let dir = tempfile::tempdir().expect("dir");
    {
        let rig = Rig::on(
            sqlite(dir.path()).await,
            vec![call_turn("c1", "guarded", json!({"text": "a"}))],
        );
        let server = TestServer::start(rig.runtime(), config()).await;
        let frames = server.start_run("waiting", "hi").await.rest().await;
        assert_eq!(termination(&frames), TerminationReason::Suspended);
        server.stop().await;
    }
    let counted = Arc::new(AtomicUsize::new(0));
    stopped_mid_run(dir.path(), &counted, None).await;

    // Recovery claims one run at a time: the stopped one, not the waiting one.
    let (rig, server) = recovered_to_its_end(dir.path(), &counted, "w", config()).await;
    // The waiting thread still waits.
    assert_eq!(
        rig.store.last_run("waiting").await.status.as_str(),
        "waiting"
    );
    server.stop().await;
}

/// An unfinished run on thread `orphan` of an agent no server here serves, so its
/// continuation fails before writing anything.
async fn orphan_run(dir: &std::path::Path) {
    let store = sqlite(dir).await;
    let run = awaken_store::RunRecord::new(
        awaken_event::RunId::new("r-gone").expect("id"),
        "gone",
        awaken_store::Timestamp::from_unix_millis(1_000),
    );
    let commit = awaken_store::ThreadCommit::new(tid("orphan"), run, 0)
        .with_messages([awaken_event::Message::user("hi")]);
    store.commit(&commit).await.expect("the orphan's run");
}

/// Recovery resting an hour between its rounds.
fn resting() -> ServerConfig {
    ServerConfig {
        recover_interval: Duration::from_secs(3_600),
        ..config()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_cannot_continue_does_not_hold_recovery_up() {
    // The oldest unfinished run cannot continue; then a run stopped mid-answer.
    let dir = tempfile::tempdir().expect("dir");
    orphan_run(dir.path()).await;
    let counted = Arc::new(AtomicUsize::new(0));
    stopped_mid_run(dir.path(), &counted, None).await;

    // Recovery claims one run at a time: the orphan's first, which fails and goes behind the
    // other, then at once (not after the interval) the stopped run, which ends.
    let (rig, server) = recovered_to_its_end(dir.path(), &counted, "w", resting()).await;
    assert_eq!(counted.load(Ordering::SeqCst), 1);
    let orphan = rig.store.last_run("orphan").await;
    assert_eq!(
        (orphan.status.as_str(), orphan.updated_at.as_unix_millis()),
        ("running", 1_000)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_cannot_continue_is_claimed_twice_a_round() {
    // Alone, it is claimed, fails, is claimed again (every other run has had its turn), fails
    // again, and recovery rests: no loop of claims.
    let dir = tempfile::tempdir().expect("dir");
    orphan_run(dir.path()).await;
    let rig = Rig::on(sqlite(dir.path()).await, vec![]).with_worker("w");
    let server = TestServer::start(rig.runtime(), resting()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.stop().await;
    let later = awaken_store::Timestamp::from_unix_millis(i64::MAX / 2);
    let claimed = rig
        .store
        .claim_runnable("check", Duration::from_secs(5), later, 1)
        .await
        .expect("claim");
    let epochs: Vec<u64> = claimed.iter().map(|c| c.lease.epoch).collect();
    // The server's two claims, then this one.
    assert_eq!(epochs, [3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_run_can_be_cancelled() {
    let dir = tempfile::tempdir().expect("dir");
    let counted = Arc::new(AtomicUsize::new(0));
    stopped_mid_run(dir.path(), &counted, None).await;
    let rig = Rig::on(sqlite(dir.path()).await, vec![held_answer()])
        .counting(&counted)
        .with_worker("w");
    let server = TestServer::start(rig.runtime(), config()).await;
    rig.model.wait_holds(1).await;
    let mut sse = server.events_after("t", "0").await;
    let response = server.post("/v1/threads/t/cancel", json!({})).await;
    assert_eq!(response.status(), StatusCode::OK);
    let frames = sse.until(|f| f.is("run_finish")).await;
    assert_eq!(termination(&frames), TerminationReason::Cancelled);
    let record = rig.store.last_run("t").await;
    assert_eq!(
        (record.status.as_str(), record.termination),
        ("done", Some(TerminationReason::Cancelled))
    );
    assert_eq!(counted.load(Ordering::SeqCst), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_run_takes_a_message() {
    let dir = tempfile::tempdir().expect("dir");
    let counted = Arc::new(AtomicUsize::new(0));
    stopped_mid_run(dir.path(), &counted, None).await;
    let rig = Rig::on(
        sqlite(dir.path()).await,
        vec![held_answer(), text_turn(&["Counted, and noted."])],
    )
    .counting(&counted)
    .with_worker("w");
    let server = TestServer::start(rig.runtime(), config()).await;
    rig.model.wait_holds(1).await;
    let mut sse = server.events_after("t", "0").await;

    // Sent while the recovered run's model holds its answer: the run goes on for a step
    // that takes it.
    let answer = steered_while_held(&server, &rig, "Count once more?").await;
    assert_eq!(answer, json!({"taken": true, "step": 3}));
    let frames = sse.until(|f| f.is("run_finish")).await;
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    let expected = [
        ("user", "hi"),
        ("assistant", ""),
        ("tool", ""),
        ("assistant", "Done"),
        ("user", "Count once more?"),
        ("assistant", "Counted, and noted."),
    ]
    .map(|(role, text)| (role.to_owned(), text.to_owned()));
    assert_eq!(messages(&server, "t").await, expected);
    assert_eq!(counted.load(Ordering::SeqCst), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_first_recovery_never_takes_over_a_run_started_meanwhile() {
    // The store answers recovery's first claim, asked before any run, only once a run is in
    // flight (and holds its lease).
    let rig = Rig::memory(vec![held_answer()]).with_worker("w");
    rig.store.close_claims();
    let server = TestServer::start(rig.runtime(), config()).await;
    let mut sse = server.start_run("t", "hi").await;
    rig.model.wait_holds(1).await;
    rig.store.open_claims();
    rig.store.wait_scans(1).await;
    rig.model.release(1);
    let frames = sse.until(|f| f.is("run_finish")).await;
    checked_live(&frames);
    assert_eq!(termination(&frames), TerminationReason::NaturalEnd);
    // One activation drove it.
    assert_eq!(rig.model.requests(), 1);
    let starts = rig
        .store
        .stored("t")
        .await
        .iter()
        .filter(|(_, e)| matches!(e, AgentEvent::RunStart { .. }))
        .count();
    assert_eq!(starts, 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_body_never_comes_does_not_hold_up_shutdown() {
    use tokio::io::AsyncWriteExt as _;
    let rig = Rig::memory(Vec::new());
    let mut server = TestServer::start(rig.runtime(), config()).await;
    // A client sends a request's head and the start of its body, then nothing more.
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    tcp.write_all(
        b"POST /v1/threads/t/runs HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
          content-length: 100\r\n\r\n{\"mess",
    )
    .await
    .expect("write the start of a request");
    // Time for the server to read the head (had it not, the shutdown would close the idle
    // connection, and the test prove nothing); the ready probe on another connection is
    // answered after.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let ready = server
        .client
        .get(server.url("/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(ready.status(), StatusCode::OK);
    let started = std::time::Instant::now();
    server.begin_shutdown();
    server.stopped().await.expect("served");
    // The grace period (100 ms in these tests) bounds the wait, not the client.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // The connection did not outlive the server: it was closed, with no answer.
    use tokio::io::AsyncReadExt as _;
    let mut rest = Vec::new();
    let read = guarded("the connection's close", tcp.read_to_end(&mut rest)).await;
    assert!(
        read.is_err() || rest.is_empty(),
        "{read:?} {:?}",
        String::from_utf8_lossy(&rest)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_waiting_for_its_runs_first_event_is_told_of_the_shutdown() {
    // The follower's request must be in the server before the shutdown begins, which nothing
    // shows: it is given longer each time it came too late (its connection closed unanswered).
    for attempt in 1..=3u32 {
        let rig = Rig::memory(vec![held_answer()]);
        let mut server = TestServer::start(rig.runtime(), config()).await;
        // The store holds the run's first commit back: the run has no event yet.
        let start = start_held(&rig, &server).await;
        // A second client follows the thread, waiting for the run's first event.
        let follow = server.client.get(server.url("/v1/threads/t/events")).send();
        let follow = tokio::spawn(follow);
        tokio::time::sleep(std::time::Duration::from_millis(100) * attempt).await;
        server.begin_shutdown();
        let answer = guarded("the follower's answer", follow)
            .await
            .expect("the follower's task");
        let response = match answer {
            Ok(response) => response,
            // Came too late: again, with more time.
            Err(_) if attempt < 3 => continue,
            Err(e) => panic!("the follower was never answered: {e}"),
        };
        assert_eq!(response.status(), StatusCode::OK);
        let body = guarded("the follower's stream", response.text())
            .await
            .expect("the stream's body");
        assert!(
            body.contains("event: shutdown"),
            "told of the shutdown: {body:?}"
        );
        let start = guarded("the start's answer", start)
            .await
            .expect("the start's task")
            .expect("an answer");
        assert_eq!(start.status(), StatusCode::SERVICE_UNAVAILABLE);
        server.stopped().await.expect("served");
        return;
    }
}
