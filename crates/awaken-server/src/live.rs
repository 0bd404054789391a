//! The runs in flight in this server: one [`LiveRun`] per thread in a concurrent registry,
//! each with a replay buffer of its activation's events (bounded once they are committed: the
//! frames since the last commit stay, since the store cannot give them back) and a bounded
//! broadcast for the clients attached. The run writes to them and never waits for a client.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use awaken_event::{AgentEvent, CancellationToken, EventSink, ThreadId};
use awaken_runtime::Steering;
use axum::body::Bytes;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use serde_json::Value;
use tokio::sync::{broadcast, watch};

use crate::config::ServerConfig;
use crate::error::ApiError;

/// How long a new run waits for the thread's run that sent its `run_finish` to close (on a
/// fleet front end, for its job to leave the queue) before it is refused as busy.
pub(crate) const FINISHING_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A position in a thread's event stream: `seq`, the number of a stored event, and `sub`, the
/// count of streamed deltas after it (0: the stored event itself). Written `seq` or `seq.sub`;
/// this is the SSE `id` a client sends back as `Last-Event-ID`.
///
/// An event sent before its commit (or a delta after such an event) also names the activation
/// it belongs to, by the number of that activation's first event: `seq@start` or
/// `seq.sub@start`. If the process stops before the commit, the number is given to another
/// event later; the activation tells a reconnecting client's position apart from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct EventId {
    /// The stored event's sequence number in the thread (0: before the first).
    pub seq: u64,
    /// Deltas streamed since it.
    pub sub: u32,
    /// For an event not yet stored when it was sent: the first event of its activation.
    pub activation: Option<u64>,
}

impl EventId {
    /// The id of stored event `seq`.
    pub fn stored(seq: u64) -> Self {
        Self {
            seq,
            sub: 0,
            activation: None,
        }
    }

    /// The position, for ordering (the activation does not move it).
    pub fn key(&self) -> (u64, u32) {
        (self.seq, self.sub)
    }

    /// Reads `seq`, `seq.sub`, `seq@start` or `seq.sub@start`; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let (position, activation) = match text.split_once('@') {
            Some((p, a)) => (p, Some(a)),
            None => (text, None),
        };
        let (seq, sub) = match position.split_once('.') {
            Some((seq, sub)) => (seq, Some(sub)),
            None => (position, None),
        };
        let number = |s: &str| {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u64>().ok())
                .flatten()
        };
        Some(Self {
            seq: number(seq)?,
            sub: match sub {
                Some(s) => u32::try_from(number(s)?).ok()?,
                None => 0,
            },
            activation: match activation {
                Some(a) => Some(number(a)?),
                None => None,
            },
        })
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.seq)?;
        if self.sub != 0 {
            write!(f, ".{}", self.sub)?;
        }
        if let Some(start) = self.activation {
            write!(f, "@{start}")?;
        }
        Ok(())
    }
}

/// One event as sent: its id and its whole SSE frame (shared by every client).
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub(crate) id: EventId,
    pub(crate) bytes: Bytes,
}

impl Frame {
    /// The frame's event, read back from its `data` line (`None` for the error put in place of
    /// an event that could not be written).
    pub(crate) fn event(&self) -> Option<AgentEvent> {
        let text = self.bytes.as_ref();
        let at = text.windows(7).position(|w| w == b"\ndata: ")? + 7;
        let data = text[at..].strip_suffix(b"\n\n")?;
        serde_json::from_slice(data).ok()
    }
}

/// The SSE frame of `event`: `id`, `event` (its type name) and `data` (its JSON form, one
/// line).
pub(crate) fn frame(id: EventId, event: &AgentEvent) -> Frame {
    use std::io::Write as _;
    let mut text = Vec::with_capacity(256);
    // (Writes to a `Vec` do not fail.)
    let _ = write!(text, "id: {id}\nevent: {}\ndata: ", event.type_name());
    let start = text.len();
    if let Err(e) = serde_json::to_writer(&mut text, event) {
        text.truncate(start);
        let error =
            serde_json::json!({"type": "error", "message": format!("unserialisable event: {e}")});
        let _ = serde_json::to_writer(&mut text, &error);
    }
    text.extend_from_slice(b"\n\n");
    Frame {
        id,
        bytes: Bytes::from(text),
    }
}

/// Where a live run stands.
#[derive(Debug, Clone)]
pub(crate) enum Status {
    /// Started, no event yet.
    Starting,
    /// Its first event was emitted.
    Running,
    /// Its activation ended: the outcome as answered to `?stream=false`, or why it could not
    /// start.
    Ended(Result<Value, ApiError>),
}

/// The events of a run's activation kept for clients, and the broadcast to the attached ones.
struct Log {
    frames: VecDeque<Frame>,
    /// The id of the last frame dropped from the front of the buffer that the store does not
    /// have (a streamed delta).
    lost: Option<EventId>,
    /// The id of the last event.
    last: EventId,
    /// The number of the activation's first stored event.
    start: Option<u64>,
    /// Every event numbered up to this one is in the store (only those are ever dropped
    /// from the buffer, so a client behind it finds them there).
    durable: u64,
    /// Closed (taken) when the activation ends.
    tx: Option<broadcast::Sender<Frame>>,
}

/// A run in flight in this server.
pub(crate) struct LiveRun {
    pub(crate) thread_id: ThreadId,
    handle: Option<CancellationToken>,
    log: Mutex<Log>,
    capacity: usize,
    status: watch::Sender<Status>,
    started: AtomicBool,
    /// Whether the activation emitted its `RunFinish`: what is left is its lifecycle hook and
    /// its lease's release.
    finishing: AtomicBool,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The ended run of the thread this one replaced in the registry, until this one's first
    /// event: a run that fails before any puts it back, so its clients can still reconnect.
    replaced: Mutex<Option<Arc<LiveRun>>>,
    /// The run's steering inbox, for a run this server drives (a followed one has none).
    steering: std::sync::OnceLock<Steering>,
}

/// What a client attaching to a live run gets: the buffered frames after its position, the
/// receiver of the later ones (none once the run ended), and whether the buffer still reaches
/// back to that position.
pub(crate) struct Attached {
    pub(crate) backlog: Vec<Frame>,
    pub(crate) rx: Option<broadcast::Receiver<Frame>>,
    /// The id of the last streamed delta dropped from the buffer (a client before it lost
    /// deltas: the stored events are in the store).
    pub(crate) lost: Option<EventId>,
    /// Every event numbered up to this one is in the store.
    pub(crate) durable: u64,
    /// The id of the first frame of the activation kept (the stored events before it come from
    /// the store).
    pub(crate) first: Option<EventId>,
}

impl LiveRun {
    fn new(
        thread_id: ThreadId,
        handle: Option<CancellationToken>,
        capacity: usize,
        broadcast: usize,
    ) -> Self {
        let (tx, _) = broadcast::channel(broadcast.max(1));
        Self {
            thread_id,
            handle,
            log: Mutex::new(Log {
                frames: VecDeque::new(),
                lost: None,
                last: EventId::default(),
                start: None,
                durable: 0,
                tx: Some(tx),
            }),
            capacity: capacity.max(1),
            status: watch::channel(Status::Starting).0,
            started: AtomicBool::new(false),
            finishing: AtomicBool::new(false),
            task: Mutex::new(None),
            replaced: Mutex::new(None),
            steering: std::sync::OnceLock::new(),
        }
    }

    /// The run's steering inbox, when this server drives it.
    pub(crate) fn steering(&self) -> Option<&Steering> {
        self.steering.get()
    }

    /// Keeps the run's task, so a shutdown can stop it.
    pub(crate) fn set_task(&self, task: tokio::task::JoinHandle<()>) {
        *self.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
    }

    /// Cancels the run (it ends `Cancelled` with its checkpoint); `false` when it has no
    /// handle or ended already.
    pub(crate) fn cancel(&self) -> bool {
        if self.is_ended() {
            return false;
        }
        match &self.handle {
            Some(h) => {
                h.cancel();
                true
            }
            None => false,
        }
    }

    /// Stops the run's task where it is (its store keeps the last checkpoint) and waits until
    /// its future is gone.
    pub(crate) async fn stop(&self) {
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
        if !self.is_ended() {
            self.end(Err(ApiError::unavailable(
                "shutting_down",
                "the server stopped the run at its last checkpoint; it goes on when the server starts again",
                std::time::Duration::from_secs(1),
            )));
        }
    }

    /// Whether the activation ended.
    pub(crate) fn is_ended(&self) -> bool {
        matches!(*self.status.borrow(), Status::Ended(_))
    }

    /// Waits until the run emitted its first event or ended; the end's result if it ended.
    pub(crate) async fn started(&self) -> Option<Result<Value, ApiError>> {
        let mut rx = self.status.subscribe();
        let status = rx
            .wait_for(|s| !matches!(s, Status::Starting))
            .await
            .map(|s| s.clone())
            .unwrap_or(Status::Running);
        match status {
            Status::Ended(result) => Some(result),
            _ => None,
        }
    }

    /// Waits until the run ended; its result.
    pub(crate) async fn ended(&self) -> Result<Value, ApiError> {
        let mut rx = self.status.subscribe();
        match rx.wait_for(|s| matches!(s, Status::Ended(_))).await {
            Ok(s) => match &*s {
                Status::Ended(result) => result.clone(),
                _ => unreachable!("waited for the end"),
            },
            Err(_) => Err(ApiError::internal("run_lost", "the run's task went away")),
        }
    }

    /// Marks the activation ended: attached clients get the rest of the buffer, then the end of
    /// the stream.
    pub(crate) fn end(&self, result: Result<Value, ApiError>) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).tx = None;
        self.status.send_replace(Status::Ended(result));
    }

    /// Counts the run as started before its first event: a follower of a run driven in
    /// another process, whose clients attach at once (from the store) rather than when the
    /// next event is stored.
    pub(crate) fn mark_started(&self) {
        self.replaced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.status.send_if_modified(|s| {
            let first = matches!(s, Status::Starting);
            if first {
                *s = Status::Running;
            }
            first
        });
    }

    /// Whether the activation emitted its `RunFinish` (it may not have ended yet).
    pub(crate) fn is_finishing(&self) -> bool {
        self.finishing.load(Ordering::Acquire)
    }

    /// Whether the activation emitted any event.
    pub(crate) fn has_events(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }

    /// Attaches a client positioned after `after` (`None`: from the activation's start).
    pub(crate) fn attach(&self, after: Option<EventId>) -> Attached {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let rx = log.tx.as_ref().map(broadcast::Sender::subscribe);
        let backlog = log
            .frames
            .iter()
            .filter(|f| after.is_none_or(|a| f.id.key() > a.key()))
            .cloned()
            .collect();
        Attached {
            backlog,
            rx,
            lost: log.lost,
            first: log.frames.front().map(|f| f.id),
            durable: log.durable,
        }
    }

    fn push(&self, seq: Option<u64>, event: &AgentEvent) {
        self.push_with(seq, event, true);
    }

    /// [`Self::push`]; `lifecycle`: whether the event is the activation's, so that its first
    /// stored one starts it and a `RunFinish` or `RunStart` marks this run finishing or not
    /// (false for the thread's history before a followed job's events).
    fn push_with(&self, seq: Option<u64>, event: &AgentEvent, lifecycle: bool) {
        if !self.started.swap(true, Ordering::AcqRel) {
            self.replaced
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            self.status.send_if_modified(|s| {
                let first = matches!(s, Status::Starting);
                if first {
                    *s = Status::Running;
                }
                first
            });
        }
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let mut id = match seq {
            Some(seq) => EventId::stored(seq),
            None => EventId {
                seq: log.last.seq,
                sub: log.last.sub.saturating_add(1),
                activation: None,
            },
        };
        if let Some(seq) = seq.filter(|_| lifecycle) {
            log.start.get_or_insert(seq);
        }
        if id.seq > log.durable {
            id.activation = Some(log.start.unwrap_or(id.seq));
        }
        log.last = id;
        let frame = frame(id, event);
        while log.frames.len() >= self.capacity
            && log.frames.front().is_some_and(|f| f.id.seq <= log.durable)
        {
            if let Some(f) = log.frames.pop_front()
                && f.id.sub > 0
            {
                log.lost = Some(f.id);
            }
        }
        log.frames.push_back(frame.clone());
        // Before the frame goes out, so a client that saw `run_finish` finds the run finishing.
        match event {
            AgentEvent::RunFinish { .. } if lifecycle => {
                self.finishing.store(true, Ordering::Release);
            }
            AgentEvent::RunStart { .. } if lifecycle => {
                self.finishing.store(false, Ordering::Release);
            }
            _ => {}
        }
        if let Some(tx) = &log.tx {
            // No receiver attached is fine: the buffer keeps the event.
            let _ = tx.send(frame);
        }
    }

    /// Pushes a stored event (one read back from the store, followed from another process).
    pub(crate) fn push_stored(&self, seq: u64, event: &AgentEvent) {
        self.committed(seq);
        self.push(Some(seq), event);
    }

    /// Pushes a stored event of the thread from before the followed job's events (a client
    /// following from an earlier position): an earlier run's end does not make this run
    /// finishing, so a start on the thread is not held up waiting for it to close.
    pub(crate) fn push_earlier(&self, seq: u64, event: &AgentEvent) {
        self.committed(seq);
        self.push_with(Some(seq), event, false);
    }

    fn committed(&self, last_seq: u64) {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.durable = log.durable.max(last_seq);
    }

    /// Makes the activation start after stored event `seq` (a followed job's, from the
    /// thread's position when it was queued): a client with no position starts there, whatever
    /// earlier events of the thread a follower pushes for a client from further back.
    pub(crate) fn starts_after(&self, seq: u64) {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .start
            .get_or_insert(seq + 1);
    }

    /// The number of the activation's first stored event, once it was emitted.
    pub(crate) fn activation_start(&self) -> Option<u64> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).start
    }
}

/// The sink a live run's activation writes to.
pub(crate) struct LiveSink(pub(crate) Arc<LiveRun>);

impl EventSink for LiveSink {
    fn emit(&self, event: &AgentEvent) {
        self.0.push(None, event);
    }

    fn emit_stored(&self, event: &AgentEvent, seq: u64) {
        self.0.push(Some(seq), event);
    }

    fn committed(&self, last_seq: u64) {
        self.0.committed(last_seq);
    }
}

/// The sink of recovered runs: `recover` continues them one after another through one sink,
/// so each `RunStart` opens the thread's live run and its `RunFinish` ends it.
pub(crate) struct RecoverySink {
    pub(crate) live: Arc<LiveRuns>,
    pub(crate) current: Mutex<Option<Arc<LiveRun>>>,
    /// The token that cancels the run being recovered, and its steering inbox.
    pub(crate) handles: Mutex<(CancellationToken, Steering)>,
    /// The last event the latest commit stored (a recovered run's first commit comes before
    /// its `RunStart` opens its live run).
    pub(crate) pending_commit: Mutex<u64>,
}

impl RecoverySink {
    fn route(&self, seq: Option<u64>, event: &AgentEvent) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let AgentEvent::RunStart { thread_id, .. } = event {
            let (cancel, steering) = self
                .handles
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            *current = self.live.begin_recovered(thread_id, cancel, &steering);
            let durable = *self
                .pending_commit
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Some(run) = &*current {
                run.committed(durable);
            }
        }
        if let Some(run) = &*current {
            run.push(seq, event);
        }
        if let AgentEvent::RunFinish {
            termination,
            run_id,
            ..
        } = event
            && let Some(run) = current.take()
        {
            run.end(Ok(serde_json::json!({
                "run_id": run_id,
                "termination": termination,
            })));
            self.live.linger(&run);
        }
    }
}

impl EventSink for RecoverySink {
    fn emit(&self, event: &AgentEvent) {
        self.route(None, event);
    }

    fn emit_stored(&self, event: &AgentEvent, seq: u64) {
        self.route(Some(seq), event);
    }

    fn committed(&self, last_seq: u64) {
        // The recovered run's first commit comes before its `RunStart` opens its live run.
        *self
            .pending_commit
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = last_seq;
        if let Some(run) = &*self.current.lock().unwrap_or_else(|e| e.into_inner()) {
            run.committed(last_seq);
        }
    }
}

/// The registry of live runs, by thread.
pub(crate) struct LiveRuns {
    runs: DashMap<ThreadId, Arc<LiveRun>>,
    replay: usize,
    broadcast: usize,
    linger: std::time::Duration,
    max_lingering: usize,
    /// Ended runs kept for reconnecting clients, oldest first, with when they ended.
    ended: Mutex<VecDeque<(std::time::Instant, Arc<LiveRun>)>>,
}

impl LiveRuns {
    pub(crate) fn new(config: &ServerConfig) -> Self {
        Self {
            runs: DashMap::new(),
            replay: config.replay_events,
            broadcast: config.broadcast_capacity,
            linger: config.finished_linger,
            max_lingering: config.max_lingering,
            ended: Mutex::new(VecDeque::new()),
        }
    }

    /// Registers a new live run on `thread_id`; the one in flight there if there is one.
    pub(crate) fn begin(
        &self,
        thread_id: &ThreadId,
        handle: Option<CancellationToken>,
        steering: Option<&Steering>,
    ) -> Result<Arc<LiveRun>, Arc<LiveRun>> {
        let run = || self.new_run(thread_id, handle.clone(), steering);
        match self.runs.entry(thread_id.clone()) {
            Entry::Occupied(o) if !o.get().is_ended() => Err(o.get().clone()),
            Entry::Occupied(mut o) => {
                let new = run();
                let replaced = o.insert(new.clone());
                *new.replaced.lock().unwrap_or_else(|e| e.into_inner()) = Some(replaced);
                Ok(new)
            }
            Entry::Vacant(v) => Ok(v.insert(run()).clone()),
        }
    }

    /// A live run of `thread_id`, not registered yet.
    fn new_run(
        &self,
        thread_id: &ThreadId,
        handle: Option<CancellationToken>,
        steering: Option<&Steering>,
    ) -> Arc<LiveRun> {
        let run = LiveRun::new(thread_id.clone(), handle, self.replay, self.broadcast);
        if let Some(s) = steering {
            let _ = run.steering.set(s.clone());
        }
        Arc::new(run)
    }

    /// Registers the live run of a run recovered on `thread_id`. The recovered run holds the
    /// thread's lease, so a run registered there that has emitted nothing is a start bound to
    /// be refused busy: it gives way (its end leaves this entry in place).
    fn begin_recovered(
        &self,
        thread_id: &ThreadId,
        handle: CancellationToken,
        steering: &Steering,
    ) -> Option<Arc<LiveRun>> {
        let run = || self.new_run(thread_id, Some(handle), Some(steering));
        match self.runs.entry(thread_id.clone()) {
            Entry::Occupied(o) if o.get().has_events() && !o.get().is_ended() => None,
            Entry::Occupied(mut o) => {
                let run = run();
                o.insert(Arc::clone(&run));
                Some(run)
            }
            Entry::Vacant(v) => Some(v.insert(run()).clone()),
        }
    }

    /// The live (or recently ended) run of `thread_id`.
    pub(crate) fn get(&self, thread_id: &ThreadId) -> Option<Arc<LiveRun>> {
        let run = self.runs.get(thread_id).map(|r| r.clone())?;
        if !run.is_ended() {
            return Some(run);
        }
        // An ended run goes once its time is over, whether or not another run ended since.
        let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        self.expire(&mut ended, std::time::Instant::now());
        self.runs.get(thread_id).map(|r| r.clone())
    }

    /// Removes `run` from the registry now (a run that never started), putting back the ended
    /// run it replaced if that one still lingers.
    pub(crate) fn remove(&self, run: &Arc<LiveRun>) {
        let removed = self.unregister(run);
        let replaced = run
            .replaced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let (true, Some(replaced)) = (removed, replaced) {
            // Only while it lingers: once its time is over, nothing would remove it.
            let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
            if ended.iter().any(|(_, r)| Arc::ptr_eq(r, &replaced)) {
                self.runs.entry(run.thread_id.clone()).or_insert(replaced);
            }
        }
    }

    /// Removes `run` from the registry if it is still its thread's entry.
    fn unregister(&self, run: &Arc<LiveRun>) -> bool {
        self.runs
            .remove_if(&run.thread_id, |_, r| Arc::ptr_eq(r, run))
            .is_some()
    }

    /// Keeps an ended run for reconnecting clients for a while (at most `max_lingering` of
    /// them, the oldest going first), then removes it unless a newer run of its thread replaced
    /// it.
    pub(crate) fn linger(&self, run: &Arc<LiveRun>) {
        run.replaced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let now = std::time::Instant::now();
        let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        ended.push_back((now, Arc::clone(run)));
        self.expire(&mut ended, now);
    }

    /// Removes the ended runs kept past their time or past `max_lingering`, oldest first.
    fn expire(
        &self,
        ended: &mut VecDeque<(std::time::Instant, Arc<LiveRun>)>,
        now: std::time::Instant,
    ) {
        while let Some((at, oldest)) = ended.front() {
            if ended.len() <= self.max_lingering && now.duration_since(*at) < self.linger {
                break;
            }
            self.unregister(oldest);
            ended.pop_front();
        }
    }

    /// The runs whose activation has not ended.
    pub(crate) fn running(&self) -> Vec<Arc<LiveRun>> {
        self.runs
            .iter()
            .filter(|r| !r.is_ended())
            .map(|r| r.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use awaken_event::{RunId, TerminationReason};

    use super::*;

    fn begun(runs: &LiveRuns, thread: &ThreadId) -> Arc<LiveRun> {
        let Ok(run) = runs.begin(thread, None, None) else {
            panic!("registered")
        };
        run
    }

    fn run_start(thread: &ThreadId) -> AgentEvent {
        AgentEvent::RunStart {
            thread_id: thread.clone(),
            run_id: RunId::new("r").expect("id"),
            agent_id: "agent".into(),
            parent_run_id: None,
            resumed: true,
        }
    }

    #[test]
    fn a_recovered_run_takes_the_place_of_a_start_that_emitted_nothing() {
        let runs = Arc::new(LiveRuns::new(&ServerConfig::default()));
        let thread = ThreadId::new("t").expect("id");
        // A start registered, bound to be refused busy: the recovered run holds the lease.
        let starting = begun(&runs, &thread);
        let sink = RecoverySink {
            live: runs.clone(),
            current: Mutex::new(None),
            handles: Mutex::new((CancellationToken::new(), Steering::new())),
            pending_commit: Mutex::new(0),
        };
        sink.emit_stored(&run_start(&thread), 1);
        let recovered = runs.get(&thread).expect("the recovered run");
        assert!(!Arc::ptr_eq(&recovered, &starting));
        assert!(recovered.has_events() && recovered.steering().is_some());
        // The refused start goes; the recovered run stays, and can be cancelled.
        starting.end(Err(ApiError::conflict("thread_busy", "busy")));
        runs.remove(&starting);
        let live = runs.get(&thread).expect("still registered");
        assert!(Arc::ptr_eq(&live, &recovered));
        assert!(live.cancel());
        sink.emit_stored(
            &AgentEvent::RunFinish {
                thread_id: thread.clone(),
                run_id: RunId::new("r").expect("id"),
                termination: Box::new(TerminationReason::Cancelled),
                response: None,
                usage: Default::default(),
            },
            2,
        );
        assert!(live.is_ended());
    }

    #[test]
    fn a_recovered_run_never_replaces_a_run_that_emitted_events() {
        let runs = Arc::new(LiveRuns::new(&ServerConfig::default()));
        let thread = ThreadId::new("t").expect("id");
        let running = begun(&runs, &thread);
        running.push(Some(1), &run_start(&thread));
        assert!(
            runs.begin_recovered(&thread, CancellationToken::new(), &Steering::new())
                .is_none()
        );
        assert!(Arc::ptr_eq(&runs.get(&thread).expect("kept"), &running));
    }

    #[test]
    fn an_ended_run_is_let_go_once_its_time_is_over_with_no_other_run_ending() {
        let config = ServerConfig {
            finished_linger: std::time::Duration::from_millis(20),
            ..ServerConfig::default()
        };
        let runs = LiveRuns::new(&config);
        let thread = ThreadId::new("t").expect("id");
        let run = begun(&runs, &thread);
        run.push(Some(1), &run_start(&thread));
        run.end(Ok(serde_json::Value::Null));
        runs.linger(&run);
        assert!(runs.get(&thread).is_some(), "kept for reconnecting clients");
        std::thread::sleep(std::time::Duration::from_millis(40));
        assert!(runs.get(&thread).is_none());
    }
}
