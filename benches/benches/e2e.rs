//! The end-to-end benchmark: real `AgentRuntime`s built through the public builder, a yielding
//! scripted provider, and the figures written for `cargo xtask bench` (what each measures and
//! its target: `docs/performance.md`).
//!
//! Writes a JSON array of `{"name", "value", "unit"}` to `$AWAKEN_BENCH_EXTRA_DIR/e2e.json`
//! (and prints it). `AWAKEN_BENCH_QUICK=1` runs every workload with small counts.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a benchmark program reports on stdout

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use awaken_benches::{LoopModel, OtlpSink, activation, agent_builder, loop_spec, throughput};
use awaken_phase::{FnHook, Phase, PhaseContext};
use awaken_plugin::{Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_runtime::AgentRuntime;
use awaken_state::{KeyOptions, StateCommand, StateError, StateKey};
use awaken_store::{SqliteConfig, SqliteStore, Synchronous, ThreadStore};
use prost::Message as _;
use serde_json::{Value, json};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{Layer, Registry};

macro_rules! keys {
    ($($name:ident = $key:literal),*) => {
        $(
            struct $name;
            impl StateKey for $name {
                const KEY: &'static str = $key;
                type Value = u64;
                type Update = u64;
                fn apply(v: &mut u64, u: u64) -> Result<(), StateError> { *v = v.wrapping_add(u); Ok(()) }
            }
        )*
        const REGISTER: [fn(&mut PluginRegistrar) -> Result<(), PluginError>; 16] = [$(
            |r: &mut PluginRegistrar| {
                r.register_key::<$name>(KeyOptions::new())?;
                r.register_phase_hook(Phase::BeforeInference, "before", Arc::new(FnHook(|_: &PhaseContext| Ok(StateCommand::new().with_update::<$name>(1)))))?;
                r.register_phase_hook(Phase::AfterToolExecute, "after", Arc::new(FnHook(|_: &PhaseContext| Ok(StateCommand::new().with_update::<$name>(1)))))
            },
        )*];
    };
}
keys!(
    K0 = "b.k0",
    K1 = "b.k1",
    K2 = "b.k2",
    K3 = "b.k3",
    K4 = "b.k4",
    K5 = "b.k5",
    K6 = "b.k6",
    K7 = "b.k7",
    K8 = "b.k8",
    K9 = "b.k9",
    K10 = "b.k10",
    K11 = "b.k11",
    K12 = "b.k12",
    K13 = "b.k13",
    K14 = "b.k14",
    K15 = "b.k15"
);

struct KeyPlugin {
    manifest: PluginManifest,
    register: fn(&mut PluginRegistrar) -> Result<(), PluginError>,
}

impl Plugin for KeyPlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        (self.register)(r)
    }
}

fn runtime(n: usize, plugins: usize, store: Option<Arc<dyn ThreadStore>>) -> AgentRuntime {
    let mut spec = loop_spec(n);
    let mut builder = agent_builder(Arc::new(LoopModel { n }));
    for (i, register) in REGISTER.iter().enumerate().take(plugins) {
        let id = format!("p{i}");
        spec = spec.with_plugin(id.clone());
        builder = builder.with_plugin(Arc::new(KeyPlugin {
            manifest: PluginManifest::new(id),
            register: *register,
        }));
    }
    if let Some(store) = store {
        builder = builder.with_store(store);
    }
    builder
        .with_agent_spec(spec)
        .build()
        .unwrap_or_else(|e| panic!("bench runtime: {e}"))
}

/// What [`us_per_step`] measured.
struct Sequential {
    /// The median window's microseconds per step.
    us_per_step: f64,
    /// Minor page faults per run over all windows (`None` without `/proc/self/stat`): the heap
    /// the store's kept threads grow by is faulted in page by page, a cost instruction counts
    /// do not show.
    faults_per_run: Option<f64>,
}

/// Microseconds per inference step over `runs` sequential runs of loop-`n`: the median of
/// `windows` measurements, each over `runs` runs (a single short window varies too much from
/// one run of the program to the next; ADR 0028). The windows are printed too.
fn us_per_step(
    rt: &tokio::runtime::Runtime,
    runtime: &AgentRuntime,
    n: usize,
    runs: usize,
    windows: usize,
) -> Sequential {
    let mut faults = None;
    let mut measured: Vec<f64> = rt.block_on(async {
        runtime
            .run_to_completion(activation())
            .await
            .unwrap_or_else(|e| panic!("{e}")); // warm up
        let mut measured = Vec::with_capacity(windows);
        let faults_before = minor_faults();
        for _ in 0..windows {
            measured.push(window(runtime, n, runs).await);
        }
        if let (Some(before), Some(after)) = (faults_before, minor_faults()) {
            faults = Some(after.saturating_sub(before) as f64 / (runs * windows) as f64);
        }
        measured
    });
    let windows: Vec<String> = measured.iter().map(|w| format!("{w:.2}")).collect();
    println!("  (us per step in each window: {})", windows.join(" "));
    if let Some(f) = faults {
        println!("  (minor page faults per run: {f:.2})");
    }
    Sequential {
        us_per_step: median(&mut measured),
        faults_per_run: faults,
    }
}

/// Microseconds per step over `runs` sequential runs of loop-`n`.
async fn window(runtime: &AgentRuntime, n: usize, runs: usize) -> f64 {
    let started = Instant::now();
    for _ in 0..runs {
        let out = runtime
            .run_to_completion(activation())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.steps as usize, n, "loop-{n} takes {n} steps");
    }
    started.elapsed().as_secs_f64() * 1e6 / (runs * n) as f64
}

/// The middle of `values` (sorted here).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// What [`otel_us_per_step`] measured.
struct Exported {
    /// The median window's microseconds per step, with the export installed.
    us_per_step: f64,
    /// The median of the windows' ratios: each export window over the window without the
    /// export just before it.
    ratio: f64,
    /// The spans a step makes (under the export's filter).
    spans_per_step: f64,
    /// The spans the receiver got, and the spans the runs made.
    received: usize,
    made: usize,
}

/// Counts the spans created while it is the default subscriber.
struct SpanCount(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> Layer<S> for SpanCount {
    fn on_new_span(
        &self,
        _attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// [`us_per_step`] with the OTLP export as the default subscriber (the layer under
/// `awaken_otel::default_filter`, as the command installs it), its batches sent to an OTLP
/// receiver on loopback; with the spans a step makes and how many the receiver got.
///
/// Each window with the export follows one without any subscriber, and the ratio is taken
/// window by window: the host's speed drifts more between two phases of the program than
/// between neighbouring windows. Each export window has a pipeline of its own, started (and
/// warmed by one run) before its clock starts and shut down after it stops, so the windows
/// without it run as the plain figure does, with no subscriber alive.
fn otel_us_per_step(
    rt: &tokio::runtime::Runtime,
    runtime: &AgentRuntime,
    n: usize,
    runs: usize,
    windows: usize,
) -> Exported {
    let counted = Arc::new(AtomicUsize::new(0));
    {
        let counter = SpanCount(counted.clone()).with_filter(awaken_otel::default_filter());
        let _default = tracing::subscriber::set_default(Registry::default().with(counter));
        rt.block_on(runtime.run_to_completion(activation()))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // The callsites cached the counter's interest; the windows without the export run without.
    tracing::callsite::rebuild_interest_cache();
    let per_run = counted.load(Ordering::Relaxed);
    let sink = OtlpSink::start();
    let config = awaken_otel::OtelConfig::new(&sink.endpoint).unwrap_or_else(|e| panic!("{e}"));
    let (mut plain, mut exported) = (Vec::new(), Vec::new());
    for _ in 0..windows {
        plain.push(rt.block_on(window(runtime, n, runs)));
        let (layer, guard) =
            awaken_otel::layer::<Registry>(&config).unwrap_or_else(|e| panic!("{e}"));
        {
            let subscriber =
                Registry::default().with(layer.with_filter(awaken_otel::default_filter()));
            let _default = tracing::subscriber::set_default(subscriber);
            rt.block_on(runtime.run_to_completion(activation()))
                .unwrap_or_else(|e| panic!("{e}")); // warm up
            exported.push(rt.block_on(window(runtime, n, runs)));
        }
        guard.shutdown().unwrap_or_else(|e| panic!("{e}"));
        tracing::callsite::rebuild_interest_cache();
    }
    let shown = |w: &[f64]| {
        w.iter()
            .map(|w| format!("{w:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "  (us per step in each window, without / with the export: {} / {})",
        shown(&plain),
        shown(&exported)
    );
    let mut ratios: Vec<f64> = exported.iter().zip(&plain).map(|(e, p)| e / p).collect();
    let received = sink
        .take_traces()
        .iter()
        .map(|body| {
            let request = opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest::decode(
                body.as_slice(),
            )
            .unwrap_or_else(|e| panic!("a traces request decodes: {e}"));
            request
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len())
                .sum::<usize>()
        })
        .sum();
    Exported {
        us_per_step: median(&mut exported),
        ratio: median(&mut ratios),
        spans_per_step: per_run as f64 / n as f64,
        received,
        // Each window's measured runs and its warm-up run.
        made: per_run * windows * (runs + 1),
    }
}

/// The process's minor page faults so far (`/proc/self/stat`, the tenth field).
fn minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (in parentheses, which may hold spaces), from the third.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(7)?.parse().ok()
}

fn main() {
    let quick = std::env::var("AWAKEN_BENCH_QUICK").is_ok_and(|v| v == "1");
    let scale = |full: usize, small: usize| if quick { small } else { full };
    // The sequential figures are medians of this many windows (one in the quick mode).
    let windows = scale(5, 1);
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut figures: Vec<Value> = Vec::new();
    let mut add = |name: &str, value: f64, unit: &str| {
        println!("{name:<44} {value:>12.2} {unit}");
        figures.push(json!({"name": name, "value": value, "unit": unit}));
    };

    // `AWAKEN_BENCH_ONLY=<prefix>` runs only the workloads whose figure names start with it
    // (for profiling one workload); unset, every workload runs.
    let only = std::env::var("AWAKEN_BENCH_ONLY").unwrap_or_default();
    let want = |name: &str| name.starts_with(only.as_str());

    let loop5 = runtime(5, 0, None);
    if want("e2e/loop5_us_per_step") {
        let loop5_seq = us_per_step(&current, &loop5, 5, scale(2000, 20), windows);
        add("e2e/loop5_us_per_step", loop5_seq.us_per_step, "us");
        // A diagnostic figure without a target: heap faulted in a page at a time, a cost no
        // instruction count shows.
        if let Some(f) = loop5_seq.faults_per_run {
            add("e2e/loop5_page_faults_per_run", f, "faults");
        }
    }
    if want("e2e/loop5_us_per_step_otel") {
        let otel = otel_us_per_step(&current, &loop5, 5, scale(2000, 20), windows);
        add("e2e/loop5_us_per_step_otel", otel.us_per_step, "us");
        add("e2e/loop5_otel_ratio", otel.ratio, "x");
        println!(
            "  (spans per step: {:.1}; received {} of {} spans; cost per exported span: {:.2} us \
             = the export's us per step x (1 - 1 / ratio) / spans per step)",
            otel.spans_per_step,
            otel.received,
            otel.made,
            otel.us_per_step * (1.0 - 1.0 / otel.ratio) / otel.spans_per_step
        );
    }
    if want("e2e/loop257_us_per_step") {
        let loop257 = runtime(257, 0, None);
        add(
            "e2e/loop257_us_per_step",
            us_per_step(&current, &loop257, 257, scale(10, 1), windows).us_per_step,
            "us",
        );
    }
    if want("e2e/loop5_runs_per_s_c32") {
        let c32 = throughput(&loop5, 32, scale(5000, 64));
        add("e2e/loop5_runs_per_s_c32", c32.runs_per_s, "runs/s");
    }
    if want("e2e/loop5_runs_per_s_c1000") {
        let c1000 = throughput(&loop5, 1000, scale(10_000, 1000));
        add("e2e/loop5_runs_per_s_c1000", c1000.runs_per_s, "runs/s");
        add(
            "e2e/loop5_kib_per_inflight_run_c1000",
            c1000.kib_per_inflight_run,
            "KiB",
        );
        add(
            "e2e/loop5_peak_inflight_c1000",
            c1000.peak_inflight as f64,
            "runs",
        );
        // A diagnostic figure without a target: the same growth when the runs in flight first
        // reach their peak, before most of the workload's runs are done and kept by the store.
        add(
            "e2e/loop5_kib_at_inflight_peak_c1000",
            c1000.kib_at_inflight_peak,
            "KiB",
        );
    }

    if want("e2e/durable5_steps_per_s") {
        let dir = std::env::temp_dir().join(format!("awaken-e2e-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let sqlite: Arc<dyn ThreadStore> = Arc::new(
            current
                .block_on(SqliteStore::open(
                    SqliteConfig::file(dir.join("bench.db")).with_synchronous(Synchronous::Normal),
                ))
                .unwrap_or_else(|e| panic!("{e}")),
        );
        let durable = runtime(5, 0, Some(sqlite));
        let per_step = us_per_step(&current, &durable, 5, scale(200, 5), windows).us_per_step;
        add("e2e/durable5_steps_per_s", 1e6 / per_step, "steps/s");
        let _ = std::fs::remove_dir_all(&dir);
    }

    if want("e2e/plugins16_us_per_step") {
        let plugins16 = runtime(5, 16, None);
        add(
            "e2e/plugins16_us_per_step",
            us_per_step(&current, &plugins16, 5, scale(500, 5), windows).us_per_step,
            "us",
        );
    }

    if let Some(dir) = std::env::var_os("AWAKEN_BENCH_EXTRA_DIR") {
        let path = std::path::Path::new(&dir).join("e2e.json");
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(&figures).unwrap_or_default(),
        )
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}
