//! A client that disconnects mid-run and reconnects with its last id gets every event it
//! missed once, then the live tail; the run goes on without it.

use awaken_event::{AgentEvent, StopReason, TerminationReason};
use serde_json::json;

use awaken_server::EventId;

use crate::support::*;

/// A step held after its first delta that calls `echo`, then an answer held after its first
/// delta.
fn held_twice() -> Vec<Vec<Piece>> {
    let mut first = vec![text("Look"), Piece::Hold, text("ing")];
    first.extend(call("c1", "echo", json!({"text": "a"})));
    first.push(stop(StopReason::ToolCalls));
    vec![
        first,
        vec![
            text("Do"),
            Piece::Hold,
            text("ne"),
            stop(StopReason::EndTurn),
        ],
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnecting_client_gets_the_missed_events_once_then_the_live_tail() {
    let rig = Rig::memory(held_twice());
    let server = TestServer::start(rig.runtime(), config()).await;
    let mut leaving = server.start_run("t", "hi").await;
    let part = leaving.until(|f| f.is_text("Look")).await;
    // A client that stays attached for the whole run.
    let stayed = server.events_after("t", "0").await;
    // The first client goes away mid-run; the run goes on to its second hold without it.
    drop(leaving);
    rig.model.release(1);
    rig.model.wait_holds(2).await;
    let last = part.last().and_then(|f| f.id.clone()).expect("an id");
    assert_eq!(
        EventId::parse(&last),
        Some(EventId {
            seq: 2,
            sub: 1,
            activation: Some(1)
        }),
        "the last event was a delta after an event not yet stored: {last}"
    );

    let mut back = server.reconnect("t", &last).await;
    let missed = back.until(|f| f.is_text("Do")).await;
    assert!(
        missed.iter().any(|f| f.is("tool_call_done")),
        "the events of the stretch without a client: {missed:#?}"
    );
    rig.model.release(1);
    let tail = back.rest().await;
    let full = stayed.rest().await;

    let joined: Vec<Frame> = part.iter().chain(&missed).chain(&tail).cloned().collect();
    assert_eq!(
        joined, full,
        "first part + reconnect = the stream of a client that stayed"
    );
    let events = checked_live(&full);
    let Some((_, AgentEvent::RunFinish { termination, .. })) = events.last() else {
        panic!("the run finished: {full:#?}")
    };
    assert_eq!(
        **termination,
        TerminationReason::NaturalEnd,
        "not cancelled"
    );
    let record = rig.store.last_run("t").await;
    assert_eq!(record.status.as_str(), "done");
    assert_eq!(record.termination, Some(TerminationReason::NaturalEnd));
    assert_eq!(stored_only(&events), rig.store.stored("t").await);

    // After the run ended, `?after=` the same id gets the same events.
    let after_end = server.events_after("t", &last).await.rest().await;
    let after: Vec<Frame> = missed.iter().chain(&tail).cloned().collect();
    assert_eq!(after_end, after);
    // A browser's `EventSource` opened on `?after=0` reconnects to the same URL with
    // `Last-Event-ID`, its latest position, which counts.
    let reopened = server.reconnect_to("/v1/threads/t/events?after=0", &last);
    assert_eq!(reopened.await.rest().await, after);
    let header_first = format!("/v1/threads/t/events?after={last}");
    assert_eq!(
        server.reconnect_to(&header_first, "1").await.rest().await,
        server.reconnect("t", "1").await.rest().await
    );
    // A server that never held the run (a restart on the same store) answers the stored events
    // after it, untagged.
    let other = TestServer::start(Rig::on(rig.store.clone(), Vec::new()).runtime(), config()).await;
    assert_eq!(
        other.reconnect("t", &last).await.rest().await,
        stored_frames(&after)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_attaching_mid_run_gets_the_run_from_its_start() {
    let rig = Rig::memory(held_twice());
    let server = TestServer::start(rig.runtime(), config()).await;
    let mut first = server.start_run("t", "hi").await;
    let part = first.until(|f| f.is_text("Look")).await;
    rig.model.wait_holds(1).await;
    // No position: the live run's activation from its start (its buffered events), then live.
    let response = server.get("/v1/threads/t/events").await;
    let mut late = Sse::new(response).await;
    let seen = late.until(|f| f.is_text("Look")).await;
    assert_eq!(seen, part);
    rig.model.release(2);
    let rest = late.rest().await;
    let full: Vec<Frame> = part.iter().chain(&rest).cloned().collect();
    assert_eq!(full, [part.clone(), first.rest().await].concat());
    checked_live(&full);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_behind_the_replay_buffer_is_told_and_gets_every_stored_event() {
    let mut first_step = vec![Piece::Hold, text("a"), text("b"), text("c")];
    first_step.extend(call("c1", "echo", json!({"text": "x"})));
    first_step.push(stop(StopReason::ToolCalls));
    let rig = Rig::memory(vec![
        first_step,
        vec![text("d"), Piece::Hold, text("e"), stop(StopReason::EndTurn)],
    ]);
    let config = awaken_server::ServerConfig {
        replay_events: 2,
        ..config()
    };
    let server = TestServer::start(rig.runtime(), config).await;
    // A client attached while the buffer still holds the activation's start stays to the end.
    let mut first = server.start_run("t", "hi").await;
    rig.model.release(1);
    let part = first.until(|f| f.is_text("d")).await;
    rig.model.wait_holds(2).await;
    // The first step is stored, so the buffer kept only the last frames of it: a client from
    // the start is told it missed deltas, and gets the stored events instead.
    let mut late = server.events_after("t", "0").await;
    let notice = late.next().await.expect("a notice");
    assert!(notice.is("lagged") && notice.id.is_none(), "{notice:?}");
    let notice: serde_json::Value = serde_json::from_str(&notice.data).expect("JSON");
    let resumed_at = notice["resumed_at"]
        .as_str()
        .expect("where the deltas resume");
    assert_eq!(notice["after"], "0");
    rig.model.release(1);
    let frames = late.until(|f| f.is("run_finish")).await;
    let events = agent_events(&frames);
    assert_ids_increase(&events);
    assert_eq!(
        render(&stored_only(&events)),
        render(&rig.store.stored("t").await),
        "every stored event, once"
    );
    // The deltas of the first step are gone; those from where the buffer reaches back came.
    let deltas: Vec<String> = events
        .iter()
        .filter_map(|(_, e)| match e {
            AgentEvent::TextDelta { delta } => Some(delta.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, ["d", "e"], "{frames:#?}");
    // The client that stayed got the whole activation, and the late one the same frames from
    // where the buffer reaches back.
    let full: Vec<Frame> = part.into_iter().chain(first.rest().await).collect();
    assert_eq!(stored_only(&checked_live(&full)), stored_only(&events));
    let from = |frames: &[Frame]| {
        let at = frames
            .iter()
            .position(|f| f.id.as_deref() == Some(resumed_at))
            .unwrap_or_else(|| panic!("{resumed_at} in {frames:#?}"));
        frames[at..].to_vec()
    };
    assert_eq!(from(&frames), from(&full));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_of_a_start_holds_every_stored_event_however_late_it_attaches() {
    // A buffer of one frame: the run may be past the frames the buffer keeps by the time the
    // stream answering its start attaches.
    let rig = Rig::memory(vec![text_turn(&["a", "b", "c"])]);
    let config = awaken_server::ServerConfig {
        replay_events: 1,
        ..config()
    };
    let server = TestServer::start(rig.runtime(), config).await;
    let frames = server.start_run("t", "hi").await.rest().await;
    // Told if it fell behind, and every stored event once either way.
    let (notices, frames): (Vec<Frame>, Vec<Frame>) =
        frames.into_iter().partition(|f| f.id.is_none());
    assert!(notices.iter().all(|f| f.is("lagged")), "{notices:#?}");
    let events = agent_events(&frames);
    assert_ids_increase(&events);
    assert_eq!(
        render(&stored_only(&events)),
        render(&rig.store.stored("t").await)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_start_leaves_the_ended_runs_events_to_reconnecting_clients() {
    // A step that streams two deltas, then calls a tool that waits for a decision.
    let mut turn = vec![text("Lo"), text("ok")];
    turn.extend(call("c1", "guarded", json!({"text": "a"})));
    turn.push(stop(StopReason::ToolCalls));
    let rig = Rig::memory(vec![turn]);
    let server = TestServer::start(rig.runtime(), config()).await;
    let frames = server.start_run("t", "hi").await.rest().await;
    checked_live(&frames);
    let first_delta = frames
        .iter()
        .find(|f| f.is_text("Lo"))
        .and_then(|f| f.id.clone())
        .expect("the first delta's id");
    let before = server.events_after("t", &first_delta).await.rest().await;
    assert!(
        before.iter().any(|f| f.is_text("ok")),
        "the ended run's deltas are kept for a while: {before:#?}"
    );

    // A run started on the waiting thread without `supersede` is refused before its first
    // event.
    let refused = server
        .post("/v1/threads/t/runs", json!({"message": "again"}))
        .await;
    assert_eq!(refused.status(), reqwest::StatusCode::CONFLICT);

    let after = server.events_after("t", &first_delta).await.rest().await;
    assert_eq!(
        after, before,
        "a reconnect gets what it got before the refusal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_never_holds_its_run_back() {
    // An answer far larger than the loopback socket's buffers, in 64 KiB deltas, streamed
    // through a broadcast of four frames.
    const DELTAS: usize = 160;
    let chunk = "x".repeat(64 << 10);
    let mut turn = vec![Piece::Hold];
    turn.extend(text_turn(&vec![chunk.as_str(); DELTAS]));
    let rig = Rig::memory(vec![turn]);
    let config = awaken_server::ServerConfig {
        broadcast_capacity: 4,
        ..config()
    };
    let server = TestServer::start(rig.runtime(), config).await;
    let response = server
        .post("/v1/threads/t/runs", json!({"message": "hi"}))
        .await;
    rig.model.wait_holds(1).await;
    rig.model.release(1);
    // The run ends while its client has read none of the answer: the socket's buffers fill,
    // the client's frames fall out of the broadcast, and the run goes on.
    guarded("the run to end with its client reading nothing", async {
        while !matches!(
            rig.store.stored("t").await.last(),
            Some((_, AgentEvent::RunFinish { .. }))
        ) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    // Then it reads: every frame once, caught up from the run's buffer.
    let frames = Sse::new(response).await.rest().await;
    let events = checked_live(&frames);
    let text: String = events
        .iter()
        .filter_map(|(_, e)| match e {
            AgentEvent::TextDelta { delta } => Some(delta.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(text.len(), DELTAS * chunk.len());
    assert!(
        !frames.iter().any(|f| f.is("lagged")),
        "the buffer held every frame"
    );
    assert_eq!(stored_only(&events), rig.store.stored("t").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_to_an_ended_run_gets_what_another_process_stored_since() {
    let rig = Rig::memory(vec![text_turn(&["first"]), text_turn(&["second"])]);
    let server = TestServer::start(rig.runtime(), config()).await;
    let frames = server.start_run("t", "hi").await.rest().await;
    checked_live(&frames);
    let last = frames
        .iter()
        .rev()
        .find_map(|f| f.id.clone())
        .expect("the ended run's last id");
    // Another process (here a runtime of its own on the same store) runs the thread next, while
    // this server still keeps the ended run for reconnecting clients.
    rig.runtime()
        .run_to_completion(
            awaken_runtime::RunActivation::new(tid("t"), "agent").with_user_message("again"),
        )
        .await
        .expect("the other process's run");
    let stored = rig.store.stored("t").await;
    let last_seq = EventId::parse(&last).expect("an id").seq;
    let later: Vec<_> = stored
        .iter()
        .filter(|(id, _)| id.seq > last_seq)
        .cloned()
        .collect();
    assert!(!later.is_empty());

    let resumed = server.reconnect("t", &last).await.rest().await;
    let events = agent_events(&resumed);
    assert_ids_increase(&events);
    assert_eq!(
        render(&stored_only(&events)),
        render(&later),
        "every event stored since, once"
    );
    let all = server.events_after("t", "0").await.rest().await;
    let all = agent_events(&all);
    assert_ids_increase(&all);
    assert_eq!(render(&stored_only(&all)), render(&stored));
    // A client that followed the other process's run from its start reconnects here too.
    let (middle, _) = &later[later.len() / 2];
    let rest: Vec<_> = later
        .iter()
        .filter(|(id, _)| id.seq > middle.seq)
        .cloned()
        .collect();
    let resumed = server
        .reconnect("t", &middle.to_string())
        .await
        .rest()
        .await;
    assert_eq!(stored_only(&agent_events(&resumed)), rest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_is_told_it_lagged_only_when_deltas_it_had_not_read_are_gone() {
    let rig = Rig::memory(vec![vec![
        text("a"),
        text("b"),
        text("c"),
        Piece::Hold,
        text("d"),
        stop(StopReason::EndTurn),
    ]]);
    let config = awaken_server::ServerConfig {
        replay_events: 2,
        ..config()
    };
    let server = TestServer::start(rig.runtime(), config).await;
    // The buffer has dropped the stored `run_start` by the time the start's stream attaches:
    // that stream reads it from the store, and has lost nothing.
    let mut first = server.start_run("t", "hi").await;
    let part = first.until(|f| f.is_text("a")).await;
    let at = part
        .last()
        .and_then(|f| f.id.clone())
        .expect("the first delta's id");
    rig.model.wait_holds(1).await;
    let back = server.reconnect("t", &at).await;
    rig.model.release(1);
    let frames = back.rest().await;
    for stream in [&part, &frames] {
        assert!(stream.iter().all(|f| f.id.is_some()), "{stream:#?}");
    }
    assert!(part[0].is("run_start"), "{part:#?}");
    let deltas: Vec<String> = agent_events(&frames)
        .iter()
        .filter_map(|(_, e)| match e {
            AgentEvent::TextDelta { delta } => Some(delta.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, ["b", "c", "d"], "{frames:#?}");
    drop(first);
}
