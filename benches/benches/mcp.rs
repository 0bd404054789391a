//! The MCP benchmark: what one call of a tool of an MCP server costs the runtime, end to end
//! through `Tool::execute` of the tool `awaken-mcp` offers, against the reference server
//! (`@modelcontextprotocol/server-everything`, its `echo` tool) started over stdio, and the
//! same call of a native in-process echo tool beside it (what each measures:
//! `docs/performance.md`).
//!
//! Writes a JSON array of `{"name", "value", "unit"}` to `$AWAKEN_BENCH_EXTRA_DIR/mcp.json`
//! (and prints it, with what the scheduler counted of both processes per call).
//! `AWAKEN_BENCH_QUICK=1` makes fewer calls. Without node or the reference server
//! (`npm ci --prefix tests/node`) it prints why and writes no figure, unless
//! `AWAKEN_REQUIRE_NODE_PEERS=1` asks for them, as CI does.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a benchmark program reports on stdout

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use awaken_event::{CancellationToken, RunId, ThreadId, ToolCallId, ToolDescriptor};
use awaken_mcp::McpServer;
use awaken_spec::{DurationSpec, McpServerSpec};
use awaken_state::{KeyRegistry, StateStore};
use awaken_tool::{Tool, ToolCallContext, ToolCallScope, ToolError, ToolOutput, ToolProvider};
use serde_json::{Value, json};

/// The id `awaken-mcp` gives the reference server's `echo` tool on the server named `ref`.
const ECHO_ID: &str = "ref__echo";

fn main() {
    // Without the server there is nothing to set the native call beside: no figure at all.
    let Some(script) = everything() else {
        return;
    };
    let quick = std::env::var("AWAKEN_BENCH_QUICK").is_ok_and(|v| v == "1");
    let (warm_up, calls) = if quick { (50, 500) } else { (500, 20_000) };
    let mut figures: Vec<Value> = Vec::new();
    let mut add = |name: &str, value: f64, unit: &str| {
        println!("{name:<44} {value:>12.2} {unit}");
        figures.push(json!({"name": name, "value": value, "unit": unit}));
    };

    // The runtime `awaken run` drives an activation on: one thread, the connection's tasks
    // beside the call's.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let args = json!({"message": "hi"});

    let native: Arc<dyn Tool> = Arc::new(NativeEcho);
    let native_times = rt.block_on(async {
        time_calls(&native, &args, 0, warm_up).await;
        time_calls(&native, &args, warm_up, calls).await
    });
    add("mcp/native_call_us", percentile(&native_times, 50), "us");

    let spec = McpServerSpec::stdio("ref", "node", [script.as_str(), "stdio"])
        .with_timeout(DurationSpec::from_secs(20));
    let times = rt.block_on(async {
        let server = McpServer::connect(spec)
            .await
            .unwrap_or_else(|e| panic!("starting the reference server: {e}"));
        let tools = server.tools();
        let echo = tools
            .iter()
            .find(|t| t.id() == ECHO_ID)
            .unwrap_or_else(|| panic!("the reference server lists no `echo`"))
            .tool()
            .clone();
        time_calls(&echo, &args, 0, warm_up).await;
        let node = server_pid();
        let before = sched_readings(node.as_deref());
        let times = time_calls(&echo, &args, warm_up, calls).await;
        let after = sched_readings(node.as_deref());
        print_sched(&before, &after, calls);
        server.shutdown().await;
        times
    });
    add("mcp/stdio_call_us", percentile(&times, 50), "us");
    add("mcp/stdio_call_p99_us", percentile(&times, 99), "us");

    if let Some(dir) = std::env::var_os("AWAKEN_BENCH_EXTRA_DIR") {
        let path = std::path::Path::new(&dir).join("mcp.json");
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(&figures).unwrap_or_default(),
        )
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}

/// The time of each of `calls` sequential calls of `tool` with `args`, their call ids numbered
/// from `first`. Each call has a context of its own (a fresh call id, as each call of a run),
/// made before its clock starts; every answer must be `Echo: hi`.
async fn time_calls(
    tool: &Arc<dyn Tool>,
    args: &Value,
    first: usize,
    calls: usize,
) -> Vec<Duration> {
    let scope = ToolCallScope::new(
        ThreadId::new("bench-thread").unwrap_or_else(|e| unreachable!("{e}")),
        RunId::new("bench-run").unwrap_or_else(|e| unreachable!("{e}")),
        CancellationToken::new(),
    );
    let snapshot = StateStore::new(KeyRegistry::new()).snapshot();
    let mut times = Vec::with_capacity(calls);
    for i in first..first + calls {
        let call = ToolCallId::new(format!("c{i}")).unwrap_or_else(|e| unreachable!("{e}"));
        let ctx = scope.context(call, snapshot.clone());
        let started = Instant::now();
        let out = tool
            .execute(args, &ctx)
            .await
            .unwrap_or_else(|e| panic!("call {i} of `echo` failed: {e}"));
        let took = started.elapsed();
        assert_eq!(*out.result.content, json!("Echo: hi"), "call {i} of `echo`");
        times.push(took);
    }
    times
}

/// The `p`-th percentile of `times`, in µs.
fn percentile(times: &[Duration], p: usize) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort_unstable();
    let at = (sorted.len() * p / 100).min(sorted.len().saturating_sub(1));
    sorted.get(at).map_or(f64::NAN, |d| d.as_secs_f64() * 1e6)
}

/// What the scheduler counted of a process's threads (`/proc/<pid>/task/*/schedstat`).
struct Sched {
    /// Time on a CPU, in ns.
    cpu_ns: u64,
    /// Time runnable but waiting for a CPU, in ns.
    wait_ns: u64,
    /// Times a thread was put on a CPU.
    runs: u64,
}

/// One thread's counts (the `schedstat` file in its `/proc` directory `dir`).
fn task_sched(dir: &str) -> Option<Sched> {
    let text = std::fs::read_to_string(format!("{dir}/schedstat")).ok()?;
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    Some(Sched {
        cpu_ns: fields.next()?.ok()?,
        wait_ns: fields.next()?.ok()?,
        runs: fields.next()?.ok()?,
    })
}

/// The sum over the threads of process `pid` (`self` for this one); `None` where it cannot be
/// read.
fn process_sched(pid: &str) -> Option<Sched> {
    let mut total = Sched {
        cpu_ns: 0,
        wait_ns: 0,
        runs: 0,
    };
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let one = task_sched(task.ok()?.path().to_str()?)?;
        total.cpu_ns += one.cpu_ns;
        total.wait_ns += one.wait_ns;
        total.runs += one.runs;
    }
    Some(total)
}

/// What the scheduler counted so far of this process, of the server's main thread and of all
/// the server's threads.
fn sched_readings(server: Option<&str>) -> [(&'static str, Option<Sched>); 3] {
    [
        ("this process", process_sched("self")),
        (
            "the server's main thread",
            server.and_then(|pid| task_sched(&format!("/proc/{pid}/task/{pid}"))),
        ),
        ("all the server's threads", server.and_then(process_sched)),
    ]
}

/// Prints what each reading grew by per call between `before` and `after`.
fn print_sched(before: &[(&str, Option<Sched>)], after: &[(&str, Option<Sched>)], calls: usize) {
    let per_call = |a: u64, b: u64| b.saturating_sub(a) as f64 / calls as f64;
    for ((who, a), (_, b)) in before.iter().zip(after) {
        if let (Some(a), Some(b)) = (a, b) {
            println!(
                "  ({who}, per call: {:.1} us on a CPU, {:.1} us runnable waiting for one, \
                 {:.2} times put on one)",
                per_call(a.cpu_ns, b.cpu_ns) / 1e3,
                per_call(a.wait_ns, b.wait_ns) / 1e3,
                per_call(a.runs, b.runs),
            );
        }
    }
}

/// The pid of this process's child `node` (the reference server), if there is one.
fn server_pid() -> Option<String> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let name = entry.ok()?.file_name().into_string().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{name}/stat")).ok()?;
        // `pid (comm) state ppid ...`: the command may hold spaces, so split after its `)`.
        let (head, rest) = stat.rsplit_once(')')?;
        let ppid = rest.split_whitespace().nth(1)?;
        (head.ends_with("(node") && ppid == me).then_some(name)
    })
}

/// The reference server's `echo` in process: `{"message": string}` → `Echo: <message>`.
struct NativeEcho;

#[async_trait]
impl Tool for NativeEcho {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("echo", "Echoes back the input string").with_parameters(json!({
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"]
        }))
    }

    async fn execute(&self, args: &Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        let message = args["message"]
            .as_str()
            .ok_or_else(|| ToolError::execution("`message` is not a string"))?;
        Ok(ToolOutput::success(Value::String(format!(
            "Echo: {message}"
        ))))
    }
}

/// The reference server's entry point, or `None` (with the reason printed) when node or the
/// server is not installed; with `AWAKEN_REQUIRE_NODE_PEERS=1` a missing peer fails instead.
fn everything() -> Option<String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let node = std::process::Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if node && script.exists() {
        return Some(script.display().to_string());
    }
    let why = format!(
        "the MCP reference server is not installed (node found: {node}; {} exists: {}); \
         run `npm ci --prefix tests/node`",
        script.display(),
        script.exists()
    );
    assert!(
        std::env::var("AWAKEN_REQUIRE_NODE_PEERS").as_deref() != Ok("1"),
        "{why}"
    );
    println!("mcp: no MCP figures: {why}");
    None
}
