//! The server benchmark: the loop-5 agent of the end-to-end benchmark served by
//! `awaken-server` on 127.0.0.1 (memory store, a 2-worker runtime; for the idle streams, in a
//! second process of this program), driven by a small HTTP/1.1 client on the program's main
//! thread (keep-alive connections, chunked bodies, SSE frames), and the figures written for
//! `cargo xtask bench` (what each measures and its target: `docs/performance.md`).
//!
//! Writes a JSON array of `{"name", "value", "unit"}` to `$AWAKEN_BENCH_EXTRA_DIR/server.json`
//! (and prints it). `AWAKEN_BENCH_QUICK=1` runs every workload with small counts;
//! `AWAKEN_BENCH_ONLY=<prefix>` only the workloads of the figures whose names start with it.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a benchmark program reports on stdout

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use awaken_benches::{
    agent_builder, loop_runtime, loop_spec, nearest_rank, process_rss_kib, throughput,
};
use awaken_event::StopReason;
use awaken_llm::{InferenceRequest, LlmEventStream, LlmExecutor, LlmStreamEvent};
use awaken_runtime::AgentRuntime;
use awaken_server::{AgentServer, ServeError, ServerConfig, serve};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot, watch};

/// The longest any phase of the program may take; past it the program fails instead of hanging.
const GUARD: Duration = Duration::from_secs(300);

/// The name of the server runtime's threads (for their CPU time).
const SERVER_THREADS: &str = "awaken-server";

thread_local! {
    /// What a client connection reads into before keeping the bytes (the client runs on one
    /// thread, so one buffer serves every connection).
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(64 << 10));
}

/// Set (to the number of streams) in the process [`idle_streams`] starts for its server.
const IDLE_SERVER_ENV: &str = "AWAKEN_BENCH_IDLE_SERVER";

fn main() {
    if let Some(streams) = std::env::var(IDLE_SERVER_ENV)
        .ok()
        .and_then(|n| n.parse().ok())
    {
        idle_server(streams);
        return;
    }
    let quick = std::env::var("AWAKEN_BENCH_QUICK").is_ok_and(|v| v == "1");
    let scale = |full: usize, small: usize| if quick { small } else { full };
    let only = std::env::var("AWAKEN_BENCH_ONLY").unwrap_or_default();
    let want = |name: &str| name.starts_with(only.as_str());
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut figures: Vec<Value> = Vec::new();
    let mut add = |name: &str, value: f64, unit: &str| {
        println!("{name:<44} {value:>12.2} {unit}");
        figures.push(json!({"name": name, "value": value, "unit": unit}));
    };

    if want("server/kib_per_idle_stream") {
        let kib = idle_streams(&client, scale(1000, 100));
        add("server/kib_per_idle_stream", kib, "KiB");
    }

    let c64_figures = [
        "server/loop5_runs_per_s_c64",
        "server/loop5_ratio_to_inprocess_c32",
        "server/first_event_p99_us_c64",
    ];
    if c64_figures.iter().any(|n| want(n)) {
        // The in-process figure right before the served one, so both see the same host.
        let in_process = throughput(&loop_runtime(5), 32, scale(5000, 64)).runs_per_s;
        println!("  (in-process loop-5 c32: {in_process:.0} runs/s)");
        let served = served_runs(&client, 64, scale(40_000, 640));
        add("server/loop5_runs_per_s_c64", served.runs_per_s, "runs/s");
        add(
            "server/loop5_ratio_to_inprocess_c32",
            served.runs_per_s / in_process,
            "ratio",
        );
        add(
            "server/first_event_p99_us_c64",
            served.first_event_p99_us,
            "us",
        );
    }

    if let Some(dir) = std::env::var_os("AWAKEN_BENCH_EXTRA_DIR") {
        let path = std::path::Path::new(&dir).join("server.json");
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(&figures).unwrap_or_default(),
        )
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}

// ---- the workloads ----

/// What [`served_runs`] measured.
struct Served {
    runs_per_s: f64,
    /// The 99th percentile of (request written → first SSE event read), in µs.
    first_event_p99_us: f64,
}

/// `clients` keep-alive connections, each POSTing streamed loop-5 runs on fresh threads one
/// after another and reading each stream to its end: untimed runs until every client has
/// finished one (the clients' first requests leave together, a burst no steady load sends),
/// then `total` runs timed, each written after the clock started.
fn served_runs(client: &tokio::runtime::Runtime, clients: usize, total: usize) -> Served {
    let server = Server::start(loop_runtime(5), ServerConfig::default());
    let addr = server.addr;
    let remaining = Arc::new(AtomicUsize::new(total));
    let next_thread = Arc::new(AtomicUsize::new(0));
    // How many clients have finished their first run; then, when the clock started.
    let warmed = Arc::new(watch::channel(0usize).0);
    let timing = Arc::new(std::sync::OnceLock::<Instant>::new());
    let mut pauses = None;
    let mut cpu_before = (None, None);
    let (elapsed, latencies, events) = client.block_on(guarded("the c64 workload", async {
        let mut conns = Vec::with_capacity(clients);
        for _ in 0..clients {
            conns.push(
                Conn::connect(addr)
                    .await
                    .unwrap_or_else(|e| panic!("connect: {e}")),
            );
        }
        let tasks: Vec<_> = conns
            .into_iter()
            .map(|mut conn| {
                let (remaining, next_thread) = (remaining.clone(), next_thread.clone());
                let (warmed, timing) = (warmed.clone(), timing.clone());
                tokio::spawn(async move {
                    let mut sse = SseReader::default();
                    let run = async |conn: &mut Conn, sse: &mut SseReader| {
                        let n = next_thread.fetch_add(1, Ordering::Relaxed);
                        streamed_run(conn, &format!("s{n}"), sse)
                            .await
                            .map_err(|e| io::Error::other(format!("run on thread s{n}: {e}")))
                    };
                    // Counted even when it failed, so that the clock is not waited for.
                    let first = run(&mut conn, &mut sse).await;
                    warmed.send_modify(|n| *n += 1);
                    first?;
                    // The load goes on, untimed, until the clock starts.
                    while timing.get().is_none() {
                        run(&mut conn, &mut sse).await?;
                    }
                    let mut latencies = Vec::new();
                    let mut events = 0;
                    while remaining
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| r.checked_sub(1))
                        .is_ok()
                    {
                        let run = run(&mut conn, &mut sse).await?;
                        latencies.push((run.written, run.first_event));
                        events = run.events;
                    }
                    io::Result::Ok((latencies, events))
                })
            })
            .collect();
        let _ = warmed.subscribe().wait_for(|n| *n >= clients).await;
        cpu_before = (threads_cpu_ns(SERVER_THREADS), own_cpu_ns());
        pauses = Some(PauseProbe::start());
        let started = Instant::now();
        let _ = timing.set(started);
        let mut latencies = Vec::with_capacity(total);
        let mut events = 0;
        for task in tasks {
            let (l, e) = task
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|e| panic!("{e}"));
            latencies.extend(l);
            events = events.max(e);
        }
        (started.elapsed(), latencies, events)
    }));
    let pauses = pauses.map(PauseProbe::stop).unwrap_or_default();
    let cpu = |before: Option<u64>, after: Option<u64>| {
        before
            .zip(after)
            .map_or(f64::NAN, |(b, a)| a.saturating_sub(b) as f64 / 1e9)
    };
    let (server_cpu, client_cpu) = (
        cpu(cpu_before.0, threads_cpu_ns(SERVER_THREADS)),
        cpu(cpu_before.1, own_cpu_ns()),
    );
    server.stop();
    // The runs whose wait for their first event overlapped a pause of the host's.
    let paused = |(written, waited): &(Instant, Duration)| {
        let read = *written + *waited;
        pauses.iter().any(|p| p.from < read && p.to > *written)
    };
    let unpaused = percentiles(latencies.iter().filter(|l| !paused(l)).map(|l| l.1));
    let all = percentiles(latencies.iter().map(|l| l.1));
    println!(
        "  (served c{clients}: {events} events per run; first event p50 {:.0} us, p90 {:.0} us, max {:.0} us)",
        all(0.5),
        all(0.9),
        all(1.0)
    );
    println!(
        "  (CPU over the c{clients} workload: server threads {server_cpu:.2} s, client {client_cpu:.2} s, in {:.2} s)",
        elapsed.as_secs_f64()
    );
    println!(
        "  (the host paused this program {} times for over {} us while it ran, the longest {} us; \
         the first event's p99 over the {} runs that no pause overlapped: {:.0} us)",
        pauses.len(),
        PauseProbe::OVER.as_micros(),
        pauses
            .iter()
            .map(Pause::length)
            .max()
            .unwrap_or_default()
            .as_micros(),
        latencies.iter().filter(|l| !paused(l)).count(),
        unpaused(0.99)
    );
    Served {
        runs_per_s: total as f64 / elapsed.as_secs_f64(),
        first_event_p99_us: all(0.99),
    }
}

/// The percentiles of `durations`, in µs (`p` in 0..=1; NaN when there are none).
fn percentiles(durations: impl Iterator<Item = Duration>) -> impl Fn(f64) -> f64 {
    let mut sorted: Vec<Duration> = durations.collect();
    sorted.sort();
    move |p: f64| nearest_rank(&sorted, p).map_or(f64::NAN, |d| d.as_secs_f64() * 1e6)
}

/// Starts `streams` runs whose model waits on a server in a process of its own (so that its
/// resident set is the server's alone, on a fresh heap), attaches one client to each thread's
/// live events (`GET /v1/threads/{t}/events?after=0`) and waits until every client has its
/// first event; the server's resident set's growth over the attaching, per stream, in KiB.
/// Then releases the models and reads every stream to its end.
fn idle_streams(client: &tokio::runtime::Runtime, streams: usize) -> f64 {
    let mut server = IdleServer::start(client, streams);
    let addr = server.addr;
    let kib = client.block_on(guarded("the idle streams", async {
        // Each run is started by a request that waits for its outcome (`?stream=false`): it
        // holds a connection, not a stream.
        let starters: Vec<_> = (0..streams)
            .map(|i| {
                tokio::spawn(async move {
                    let mut conn = Conn::connect(addr).await?;
                    let body = r#"{"message":"go"}"#;
                    let request = format!(
                        "POST /v1/threads/w{i}/runs?stream=false HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    conn.send(request.as_bytes()).await?;
                    let head = conn.read_head().await?;
                    let body = conn.read_body(head.framing).await?;
                    let body = String::from_utf8_lossy(&body);
                    if head.status != 200 || !body.contains("\"termination\"") {
                        return Err(io::Error::other(format!(
                            "run on thread w{i}: {} {body}",
                            head.status
                        )));
                    }
                    io::Result::Ok(())
                })
            })
            .collect();
        server.command(&format!("wait {streams}"));
        server.expect("waiting").await;
        let before = server.rss_kib();

        let attached = Arc::new(watch::channel(0usize).0);
        let clients: Vec<_> = (0..streams)
            .map(|i| {
                let attached = attached.clone();
                tokio::spawn(async move {
                    let mut conn = Conn::connect(addr).await?;
                    let request =
                        format!("GET /v1/threads/w{i}/events?after=0 HTTP/1.1\r\nhost: bench\r\n\r\n");
                    conn.send(request.as_bytes()).await?;
                    drop(request);
                    let head = conn.read_head().await?;
                    if head.status != 200 {
                        let body = conn.read_body(head.framing).await?;
                        return Err(io::Error::other(format!(
                            "events of thread w{i}: {} {}",
                            head.status,
                            String::from_utf8_lossy(&body)
                        )));
                    }
                    let mut framing = head.framing;
                    let mut sse = SseReader::default();
                    while sse.events == 0 {
                        if !conn.body_data(&mut framing, &mut sse.data).await? {
                            break;
                        }
                        sse.frames();
                    }
                    attached.send_modify(|n| *n += 1);
                    while conn.body_data(&mut framing, &mut sse.data).await? {
                        sse.frames();
                    }
                    if !sse.finished {
                        return Err(io::Error::other(format!(
                            "the events of thread w{i} ended without `run_finish`"
                        )));
                    }
                    io::Result::Ok(sse.events)
                })
            })
            .collect();
        let _ = attached.subscribe().wait_for(|n| *n >= streams).await;
        let after = server.rss_kib();

        server.command("release");
        for task in starters {
            task.await
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let mut events = 0;
        for task in clients {
            events = task
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        println!(
            "  ({streams} idle streams: RSS {before:.0} KiB with the runs waiting, {after:.0} KiB with the streams attached; {events} events per stream)"
        );
        (after - before) / streams as f64
    }));
    server.stop();
    kib
}

/// The server of the idle-stream workload, run by [`idle_streams`] in a process of its own:
/// prints `addr <address>`, then follows the lines of its standard input (`wait <n>`: prints
/// `waiting` once `n` models wait; `release`: releases them; `stop`: shuts down and exits).
fn idle_server(streams: usize) {
    use std::io::Write as _;
    let gate = Arc::new(Gate::default());
    let runtime = agent_builder(Arc::new(WaitModel { gate: gate.clone() }))
        .with_agent_spec(loop_spec(1))
        .build()
        .unwrap_or_else(|e| panic!("bench runtime: {e}"));
    let config = ServerConfig::default().with_max_runs_in_flight(streams + 64);
    let server = Server::start(runtime, config);
    let mut out = std::io::stdout().lock();
    let mut say = |line: &str| {
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .unwrap_or_else(|e| panic!("telling the bench: {e}"));
    };
    say(&format!("addr {}", server.addr));
    for line in std::io::stdin().lines() {
        let line = line.unwrap_or_else(|e| panic!("reading the bench's commands: {e}"));
        match line.split_once(' ') {
            Some(("wait", n)) => {
                let n: usize = n.parse().unwrap_or_else(|e| panic!("`{line}`: {e}"));
                let mut waiting = gate.waiting.subscribe();
                server.rt.block_on(guarded("the models' wait", async {
                    let _ = waiting.wait_for(|w| *w >= n).await;
                }));
                say("waiting");
            }
            None if line == "release" => gate.release(),
            None if line == "stop" => break,
            _ => panic!("unknown command `{line}`"),
        }
    }
    server.stop();
}

/// The process [`idle_server`] runs in, seen from the bench: its address, its output's lines
/// and its resident set.
struct IdleServer {
    child: std::process::Child,
    addr: SocketAddr,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl IdleServer {
    fn start(client: &tokio::runtime::Runtime, streams: usize) -> Self {
        use std::io::BufRead as _;
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the bench's path: {e}"));
        let mut child = std::process::Command::new(exe)
            .env(IDLE_SERVER_ENV, streams.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the idle-stream server: {e}"));
        let out = child.stdout.take().map(std::io::BufReader::new);
        let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
        // Read on a thread of its own: the client's runtime has its connections to drive.
        std::thread::spawn(move || {
            for line in out
                .into_iter()
                .flat_map(|o| o.lines())
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let first = client
            .block_on(guarded("the idle-stream server's address", lines.recv()))
            .unwrap_or_default();
        let addr = first
            .strip_prefix("addr ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("the idle-stream server said `{first}`, not its address"));
        Self { child, addr, lines }
    }

    fn command(&mut self, line: &str) {
        use std::io::Write as _;
        let stdin = self.child.stdin.as_mut();
        stdin
            .map_or(Err(io::ErrorKind::BrokenPipe.into()), |s| {
                writeln!(s, "{line}").and_then(|()| s.flush())
            })
            .unwrap_or_else(|e| panic!("telling the idle-stream server `{line}`: {e}"));
    }

    async fn expect(&mut self, line: &str) {
        match self.lines.recv().await {
            Some(l) if l == line => {}
            other => panic!("the idle-stream server said {other:?}, not `{line}`"),
        }
    }

    /// The server process's resident set, in KiB.
    fn rss_kib(&self) -> f64 {
        process_rss_kib(self.child.id())
            .unwrap_or_else(|| panic!("the idle-stream server's resident set cannot be read"))
    }

    /// Stops the server and waits for its process to exit.
    fn stop(mut self) {
        self.command("stop");
        let status = self
            .child
            .wait()
            .unwrap_or_else(|e| panic!("waiting for the idle-stream server: {e}"));
        assert!(
            status.success(),
            "the idle-stream server exited with {status}"
        );
    }
}

impl Drop for IdleServer {
    /// A bench that failed leaves no server behind.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The CPU time so far of this process's threads named `name`, in ns
/// (`/proc/self/task/*/schedstat`); `None` where that cannot be read.
fn threads_cpu_ns(name: &str) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        if std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.trim_end() == name) {
            total += schedstat_ns(&dir.join("schedstat"))?;
        }
    }
    Some(total)
}

/// The CPU time so far of the calling thread, in ns.
fn own_cpu_ns() -> Option<u64> {
    schedstat_ns(std::path::Path::new("/proc/thread-self/schedstat"))
}

/// The first field of a `schedstat` file: time spent on a CPU, in ns.
fn schedstat_ns(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Awaits `f`, failing the program with `what` when it takes longer than [`GUARD`].
async fn guarded<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(GUARD, f)
        .await
        .unwrap_or_else(|_| panic!("{what} took longer than {GUARD:?}"))
}

/// A thread that sleeps [`PauseProbe::TICK`] at a time and keeps each wake-up later than that
/// by over [`PauseProbe::OVER`]: the moments the host gave this program no core at all (a
/// sleeping thread that wakes is scheduled ahead of busy ones, so on a host that does not
/// pause it wakes on time even with every core busy).
struct PauseProbe {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Pause>>,
}

impl PauseProbe {
    const TICK: Duration = Duration::from_millis(1);
    const OVER: Duration = Duration::from_millis(1);

    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut late = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let asleep = Instant::now();
                    std::thread::sleep(Self::TICK);
                    let woke = Instant::now();
                    let due = asleep + Self::TICK;
                    if woke.saturating_duration_since(due) > Self::OVER {
                        late.push(Pause {
                            from: due,
                            to: woke,
                        });
                    }
                }
                late
            }
        });
        Self { stop, thread }
    }

    /// The late wake-ups.
    fn stop(self) -> Vec<Pause> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// A late wake-up of the [`PauseProbe`]: from when it was due to when it came.
#[derive(Clone, Copy)]
struct Pause {
    from: Instant,
    to: Instant,
}

impl Pause {
    fn length(&self) -> Duration {
        self.to - self.from
    }
}

// ---- the server ----

/// A server on a loopback port, on its own 2-worker runtime.
struct Server {
    rt: tokio::runtime::Runtime,
    addr: SocketAddr,
    shutdown: oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<Result<(), ServeError>>,
}

impl Server {
    fn start(runtime: AgentRuntime, config: ServerConfig) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(SERVER_THREADS)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let listener = rt
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .unwrap_or_else(|e| panic!("binding a loopback port: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("the listener's address: {e}"));
        let (shutdown, stop) = oneshot::channel::<()>();
        let server = AgentServer::new(runtime, config);
        let serving = rt.spawn(serve(server, listener, async move {
            let _ = stop.await;
        }));
        Self {
            rt,
            addr,
            shutdown,
            serving,
        }
    }

    /// Shuts the server down and waits until it has stopped.
    fn stop(self) {
        let _ = self.shutdown.send(());
        self.rt
            .block_on(guarded("the server's shutdown", self.serving))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("serving: {e}"));
    }
}

/// Released once for all: every waiting [`WaitModel`] stream goes on.
#[derive(Default)]
struct Gate {
    released: AtomicBool,
    notify: Notify,
    /// How many streams have waited so far.
    waiting: watch::Sender<usize>,
}

impl Gate {
    async fn wait(&self) {
        let mut notified = pin!(self.notify.notified());
        // Registered before the flag is read, so a release in between still wakes it.
        notified.as_mut().enable();
        self.waiting.send_modify(|n| *n += 1);
        if !self.released.load(Ordering::Acquire) {
            notified.await;
        }
    }

    fn release(&self) {
        self.released.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }
}

/// Answers `done` once its [`Gate`] is released.
struct WaitModel {
    gate: Arc<Gate>,
}

impl LlmExecutor for WaitModel {
    fn name(&self) -> &str {
        "loop-model"
    }

    fn execute_stream(&self, _request: InferenceRequest) -> LlmEventStream {
        let gate = self.gate.clone();
        Box::pin(
            futures_util::stream::once(async move { gate.wait().await }).flat_map(|()| {
                futures_util::stream::iter(
                    [
                        LlmStreamEvent::TextDelta("done".into()),
                        LlmStreamEvent::Stop(StopReason::EndTurn),
                    ]
                    .map(Ok),
                )
            }),
        )
    }
}

// ---- the client ----

/// What one streamed run took.
struct RunStats {
    /// When the request was written.
    written: Instant,
    /// From the request written to the first SSE event read.
    first_event: Duration,
    /// The events of the stream.
    events: usize,
}

/// Starts a run on `thread` (`POST /v1/threads/{thread}/runs`) and reads its event stream to
/// the end, which must come after `run_finish`.
async fn streamed_run(conn: &mut Conn, thread: &str, sse: &mut SseReader) -> io::Result<RunStats> {
    let body = r#"{"message":"go"}"#;
    let request = format!(
        "POST /v1/threads/{thread}/runs HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.send(request.as_bytes()).await?;
    let written = Instant::now();
    let head = conn.read_head().await?;
    if head.status != 200 {
        let body = conn.read_body(head.framing).await?;
        return Err(io::Error::other(format!(
            "answered {}: {}",
            head.status,
            String::from_utf8_lossy(&body)
        )));
    }
    sse.reset();
    let mut framing = head.framing;
    let mut first_event = None;
    while conn.body_data(&mut framing, &mut sse.data).await? {
        if sse.frames() > 0 && first_event.is_none() {
            first_event = Some(written.elapsed());
        }
    }
    if !sse.finished {
        return Err(io::Error::other("the stream ended without `run_finish`"));
    }
    if head.close {
        *conn = Conn::connect(conn.addr).await?;
    }
    Ok(RunStats {
        written,
        first_event: first_event.unwrap_or_default(),
        events: sse.events,
    })
}

/// How a response's body is delimited.
#[derive(Debug, Clone, Copy)]
enum Framing {
    /// Chunked: `left` bytes of the current chunk to read, then its CRLF when `crlf`.
    Chunked { left: usize, crlf: bool },
    /// `Content-Length`: the bytes left.
    Length(usize),
    /// Read to its end.
    Done,
}

/// A response's status line and headers.
struct Head {
    status: u16,
    framing: Framing,
    /// The server closes the connection after this response.
    close: bool,
}

/// One HTTP/1.1 keep-alive connection: the socket and the bytes read but not yet consumed.
struct Conn {
    addr: SocketAddr,
    stream: TcpStream,
    buf: Vec<u8>,
    /// Where the unconsumed bytes of `buf` begin.
    pos: usize,
}

impl Conn {
    async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            addr,
            stream,
            buf: Vec::new(),
            pos: 0,
        })
    }

    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// Reads more bytes into the buffer (after dropping the consumed ones); an error at the end
    /// of the stream.
    async fn fill(&mut self) -> io::Result<()> {
        if self.pos == self.buf.len() {
            self.buf.clear();
        } else {
            self.buf.drain(..self.pos);
        }
        self.pos = 0;
        loop {
            self.stream.readable().await?;
            // Read through the thread's scratch buffer, so a connection keeps only the bytes
            // it has not consumed (an idle stream's client holds next to nothing).
            let read = SCRATCH.with_borrow_mut(|scratch| {
                scratch.clear();
                let read = self.stream.try_read_buf(scratch);
                self.buf.extend_from_slice(scratch);
                read
            });
            match read {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection",
                    ));
                }
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The next line (without its CRLF), consumed; `None` until a whole line is buffered.
    fn line(&mut self) -> Option<&[u8]> {
        let rest = &self.buf[self.pos..];
        let end = memchr::memmem::find(rest, b"\r\n")?;
        let line = &self.buf[self.pos..self.pos + end];
        self.pos += end + 2;
        Some(line)
    }

    /// Reads a response's status line and headers.
    async fn read_head(&mut self) -> io::Result<Head> {
        let end = loop {
            if let Some(end) = memchr::memmem::find(&self.buf[self.pos..], b"\r\n\r\n") {
                break end;
            }
            self.fill().await?;
        };
        let text = std::str::from_utf8(&self.buf[self.pos..self.pos + end])
            .map_err(|e| io::Error::other(format!("a response head that is not UTF-8: {e}")))?;
        let mut lines = text.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::other(format!("no status line in {text:?}")))?;
        let mut framing = Framing::Length(0);
        let mut close = false;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("transfer-encoding")
                && value.to_ascii_lowercase().contains("chunked")
            {
                framing = Framing::Chunked {
                    left: 0,
                    crlf: false,
                };
            } else if name.eq_ignore_ascii_case("content-length") {
                let length = value
                    .parse()
                    .map_err(|e| io::Error::other(format!("content-length {value:?}: {e}")))?;
                framing = Framing::Length(length);
            } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close")
            {
                close = true;
            }
        }
        self.pos += end + 4;
        Ok(Head {
            status,
            framing,
            close,
        })
    }

    /// Appends the next body bytes to `out`: `false` (and nothing appended) at the body's end.
    async fn body_data(&mut self, framing: &mut Framing, out: &mut Vec<u8>) -> io::Result<bool> {
        loop {
            let available = self.buf.len() - self.pos;
            let left = match framing {
                Framing::Done | Framing::Length(0) => {
                    *framing = Framing::Done;
                    return Ok(false);
                }
                Framing::Length(left) => left,
                Framing::Chunked { left, .. } if *left > 0 => left,
                Framing::Chunked { crlf, .. } if *crlf => {
                    if available < 2 {
                        self.fill().await?;
                        continue;
                    }
                    if &self.buf[self.pos..self.pos + 2] != b"\r\n" {
                        return Err(io::Error::other("a chunk without its CRLF"));
                    }
                    self.pos += 2;
                    *crlf = false;
                    continue;
                }
                Framing::Chunked { left, crlf } => {
                    let Some(line) = self.line() else {
                        self.fill().await?;
                        continue;
                    };
                    let size = line.split(|&b| b == b';').next().unwrap_or_default();
                    let size = std::str::from_utf8(size)
                        .ok()
                        .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
                        .ok_or_else(|| {
                            io::Error::other(format!(
                                "a chunk size {:?}",
                                String::from_utf8_lossy(line)
                            ))
                        })?;
                    if size > 0 {
                        (*left, *crlf) = (size, true);
                        continue;
                    }
                    // The last chunk: the trailers up to an empty line.
                    loop {
                        match self.line() {
                            Some([]) => break,
                            Some(_) => {}
                            None => self.fill().await?,
                        }
                    }
                    *framing = Framing::Done;
                    return Ok(false);
                }
            };
            if available == 0 {
                self.fill().await?;
                continue;
            }
            let n = available.min(*left);
            out.extend_from_slice(&self.buf[self.pos..self.pos + n]);
            self.pos += n;
            *left -= n;
            return Ok(true);
        }
    }

    /// Reads a whole body.
    async fn read_body(&mut self, mut framing: Framing) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        while self.body_data(&mut framing, &mut body).await? {}
        Ok(body)
    }
}

/// Splits a stream's bytes into SSE frames: counts the events (frames with a field; comments
/// alone are not events) and notes `run_finish`.
#[derive(Default)]
struct SseReader {
    /// Bytes of the body not yet split into lines.
    data: Vec<u8>,
    /// The frame being read has a field.
    in_event: bool,
    /// The frame being read is a `run_finish`.
    in_finish: bool,
    events: usize,
    finished: bool,
}

impl SseReader {
    fn reset(&mut self) {
        self.data.clear();
        (self.in_event, self.in_finish, self.events, self.finished) = (false, false, 0, false);
    }

    /// Consumes the whole lines of `data`; how many events they ended.
    fn frames(&mut self) -> usize {
        let mut start = 0;
        let mut ended = 0;
        while let Some(end) = memchr::memchr(b'\n', &self.data[start..]) {
            let line = &self.data[start..start + end];
            start += end + 1;
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            match line {
                [] => {
                    if self.in_event {
                        ended += 1;
                        self.events += 1;
                        self.finished |= self.in_finish;
                    }
                    (self.in_event, self.in_finish) = (false, false);
                }
                [b':', ..] => {}
                _ => {
                    self.in_event = true;
                    if let Some(name) = line.strip_prefix(b"event:") {
                        self.in_finish |= name.trim_ascii() == b"run_finish";
                    }
                }
            }
        }
        self.data.drain(..start);
        ended
    }
}
