//! Shared helpers of the benches: the scripted loop agent that the end-to-end, the server and
//! the fleet programs run, the in-process throughput workload they compare, readings of the
//! process's memory, a runtime-free `block_on` for the micro-benchmarks, and the step commit
//! every store benchmark measures ([`step_commit`]).

pub mod step_commit;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use async_trait::async_trait;
use awaken_event::{Role, StopReason, ThreadId, ToolCallId, ToolDescriptor};
use awaken_llm::{InferenceRequest, LlmEventStream, LlmExecutor, LlmStreamEvent};
use awaken_runtime::{AgentRuntime, AgentRuntimeBuilder, RunActivation};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use futures_util::StreamExt;
use serde_json::{Value, json};

/// Drives a future that never waits on IO to completion on the current thread, without a
/// runtime: it is polled with a no-op waker until ready (yielding the thread between polls).
/// For benches of engine code whose futures complete without external wake-ups.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::yield_now();
    }
}

/// Answers with one `echo` call until `n - 1` tool results are in the history, then with text;
/// yields to the scheduler once per request, as a network call would.
pub struct LoopModel {
    /// The steps of a run: `n - 1` tool calls, then the answer.
    pub n: usize,
}

impl LlmExecutor for LoopModel {
    fn name(&self) -> &str {
        "loop-model"
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let results = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .count();
        let n = self.n;
        Box::pin(
            futures_util::stream::once(async move { tokio::task::yield_now().await }).flat_map(
                move |()| {
                    let events: Vec<LlmStreamEvent> = if results + 1 < n {
                        let id = ToolCallId::new(format!("c{results}"))
                            .unwrap_or_else(|e| unreachable!("{e}"));
                        vec![
                            LlmStreamEvent::ToolCallStart {
                                index: 0,
                                id,
                                name: "echo".into(),
                            },
                            LlmStreamEvent::ToolCallArgsDelta {
                                index: 0,
                                delta: "{\"text\":\"hi\"}".into(),
                            },
                            LlmStreamEvent::Stop(StopReason::ToolCalls),
                        ]
                    } else {
                        vec![
                            LlmStreamEvent::TextDelta("done".into()),
                            LlmStreamEvent::Stop(StopReason::EndTurn),
                        ]
                    };
                    futures_util::stream::iter(events.into_iter().map(Ok))
                },
            ),
        )
    }
}

/// `echo {"text": string}` → `{"echoed": text}`.
pub struct Echo;

#[async_trait]
impl Tool for Echo {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("echo", "Echo text").with_parameters(json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"]
        }))
    }
    async fn execute(&self, args: &Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::success(json!({"echoed": args["text"]})))
    }
}

/// The agent `bench` of the loop-`n` runtime: model `model`, rounds enough for `n` steps.
pub fn loop_spec(n: usize) -> AgentSpec {
    AgentSpec::new("bench", "model")
        .with_system_prompt("You echo.")
        .with_max_rounds(u32::try_from(n + 1).unwrap_or(u32::MAX))
}

/// A builder with `provider` serving model `model` and the [`Echo`] tool, no agent yet; the
/// loop-`n` runtime's with [`LoopModel`] as the provider.
pub fn agent_builder(provider: Arc<dyn LlmExecutor>) -> AgentRuntimeBuilder {
    AgentRuntime::builder()
        .with_model(ModelSpec::new("model", "loop", "loop-model"))
        .with_provider("loop", provider)
        .with_tool(Arc::new(Echo))
}

/// The loop-`n` runtime on the memory store: agent [`loop_spec`] on a [`LoopModel`].
pub fn loop_runtime(n: usize) -> AgentRuntime {
    agent_builder(Arc::new(LoopModel { n }))
        .with_agent_spec(loop_spec(n))
        .build()
        .unwrap_or_else(|e| panic!("bench runtime: {e}"))
}

static THREADS: AtomicUsize = AtomicUsize::new(0);

/// A run of agent `bench` with the message `go` on a fresh thread.
pub fn activation() -> RunActivation {
    let n = THREADS.fetch_add(1, Ordering::Relaxed);
    RunActivation::new(
        ThreadId::new(format!("t{n}")).unwrap_or_else(|e| unreachable!("{e}")),
        "bench",
    )
    .with_user_message("go")
}

/// The `p` quantile (0 to 1) of `sorted`, by nearest rank: the value at rank `ceil(p * len)`
/// (at least the first); `None` when `sorted` is empty.
pub fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

/// The process's resident set, in KiB (0 without `/proc/self/statm`).
pub fn rss_kib() -> f64 {
    statm_rss_kib("/proc/self/statm").unwrap_or(0.0)
}

/// The resident set of the process `pid`, in KiB (`None` without its `statm`).
pub fn process_rss_kib(pid: u32) -> Option<f64> {
    statm_rss_kib(&format!("/proc/{pid}/statm"))
}

/// The resident set a `statm` file gives, in KiB.
fn statm_rss_kib(path: &str) -> Option<f64> {
    let statm = std::fs::read_to_string(path).ok()?;
    let pages: f64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4.0)
}

/// The process's peak RSS since the last [`reset_peak_rss`] (`VmHWM`), in KiB.
pub fn peak_rss_kib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resets the process's peak RSS to its current RSS (Linux's `clear_refs`); `false` where that
/// is not allowed.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// What [`throughput`] measured.
pub struct Throughput {
    /// Runs finished per second of the workload.
    pub runs_per_s: f64,
    /// (Peak RSS during the workload − RSS before it) / the peak number of runs in flight.
    pub kib_per_inflight_run: f64,
    /// RSS growth when the runs in flight first reached their peak, per run in flight (before
    /// most runs are done and stored).
    pub kib_at_inflight_peak: f64,
    /// The most runs in flight at once.
    pub peak_inflight: usize,
}

/// Runs per second with `inflight` runs at once on a 2-worker runtime (that many workers, each
/// running runs of [`activation`] one after another until `total` are done), and memory per
/// in-flight run.
pub fn throughput(runtime: &AgentRuntime, inflight: usize, total: usize) -> Throughput {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let before = rss_kib();
    // The peak over the whole workload, as the kernel tracks it; where it cannot be reset, the
    // RSS at the end and at each new peak of runs in flight stand in for it.
    let tracked = reset_peak_rss();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let peak_rss = Arc::new(std::sync::Mutex::new(before));
    let remaining = Arc::new(AtomicUsize::new(total));
    let started = Instant::now();
    rt.block_on(async {
        let mut workers = Vec::with_capacity(inflight);
        for _ in 0..inflight {
            let runtime = runtime.clone();
            let (in_flight, peak, peak_rss, remaining) = (
                in_flight.clone(),
                peak.clone(),
                peak_rss.clone(),
                remaining.clone(),
            );
            workers.push(tokio::spawn(async move {
                while remaining
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| r.checked_sub(1))
                    .is_ok()
                {
                    let now = in_flight.fetch_add(1, Ordering::AcqRel) + 1;
                    if peak.fetch_max(now, Ordering::AcqRel) < now {
                        let rss = rss_kib();
                        let mut p = peak_rss.lock().unwrap_or_else(|e| e.into_inner());
                        *p = p.max(rss);
                    }
                    runtime
                        .run_to_completion(activation())
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                }
            }));
        }
        for w in workers {
            w.await.unwrap_or_else(|e| panic!("{e}"));
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let peak = peak.load(Ordering::Relaxed).max(1) as f64;
    let at_inflight_peak = *peak_rss.lock().unwrap_or_else(|e| e.into_inner());
    let workload_peak = match peak_rss_kib() {
        Some(hwm) if tracked => hwm,
        _ => rss_kib().max(at_inflight_peak),
    };
    Throughput {
        runs_per_s: total as f64 / elapsed,
        kib_per_inflight_run: (workload_peak - before).max(0.0) / peak,
        kib_at_inflight_peak: (at_inflight_peak - before).max(0.0) / peak,
        peak_inflight: peak as usize,
    }
}

/// An OTLP/HTTP receiver on 127.0.0.1 for the export benchmark: a thread of its own answers
/// every request 200 over keep-alive connections and keeps the bodies of `/v1/traces` (read
/// after the measurement, so decoding takes no time from it).
pub struct OtlpSink {
    /// `http://127.0.0.1:<port>`: the base URL of both signals.
    pub endpoint: String,
    traces: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

impl OtlpSink {
    /// Starts the receiver (it lives as long as the process).
    pub fn start() -> OtlpSink {
        let traces: Arc<std::sync::Mutex<Vec<Vec<u8>>>> = Arc::default();
        let kept = traces.clone();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("{e}"));
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
                let _ = bound_tx.send(addr);
                while let Ok((socket, _)) = listener.accept().await {
                    tokio::spawn(answer(socket, kept.clone()));
                }
            });
        });
        let addr = bound_rx.recv().unwrap_or_else(|e| panic!("{e}"));
        OtlpSink {
            endpoint: format!("http://{addr}"),
            traces,
        }
    }

    /// The bodies of the traces requests received so far, taken out.
    pub fn take_traces(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.traces.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Answers the requests of one connection: reads each head and `content-length` body, keeps
/// the traces bodies, answers 200 with no body.
async fn answer(mut socket: tokio::net::TcpStream, traces: Arc<std::sync::Mutex<Vec<Vec<u8>>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    loop {
        let head_end = loop {
            if let Some(i) = memchr::memmem::find(&buf, b"\r\n\r\n") {
                break i + 4;
            }
            match socket.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let traces_request = head.starts_with("post /v1/traces ");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            match socket.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
        if traces_request {
            let body = buf[head_end..head_end + length].to_vec();
            traces.lock().unwrap_or_else(|e| e.into_inner()).push(body);
        }
        buf.drain(..head_end + length);
        let ok =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if socket.write_all(ok).await.is_err() {
            return;
        }
    }
}
