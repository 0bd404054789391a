//! Stored sequence numbers: every lifecycle event an activation emits goes through
//! `EventSink::emit_stored` with the number the store keeps it under, in stored order and
//! without gaps, and every delta through plain `emit`. Sequential and parallel tool steps, a
//! suspension resumed in fresh runtimes, and a second run on a thread, on the memory and the
//! SQLite store.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use awaken_event::{
    AgentEvent, EventSink, ResumeMode, SuspendTicket, TerminationReason, ThreadId, ToolCallResume,
    ToolDescriptor, check_activation,
};
use awaken_llm::{ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken_phase::PhaseContext;
use awaken_plugin::{FnGate, Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_runtime::{AgentRuntime, Resume, RunActivation, RunOutcome, SequentialIds};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_store::{MemoryStore, SqliteConfig, SqliteStore, ThreadStore};
use awaken_tool::{
    Tool, ToolCallContext, ToolError, ToolInterceptPayload, ToolOutput, pending_call,
};
use serde_json::{Value, json};

use crate::support::*;

/// What the runtime handed the sink, in order: `(Some(seq), event)` from `emit_stored`,
/// `(None, event)` from `emit`.
#[derive(Default)]
struct Recording(Mutex<Vec<(Option<u64>, AgentEvent)>>);

impl EventSink for Recording {
    fn emit(&self, event: &AgentEvent) {
        self.0
            .lock()
            .expect("recording")
            .push((None, event.clone()));
    }
    fn emit_stored(&self, event: &AgentEvent, seq: u64) {
        self.0
            .lock()
            .expect("recording")
            .push((Some(seq), event.clone()));
    }
}

impl Recording {
    fn take(&self) -> Vec<(Option<u64>, AgentEvent)> {
        std::mem::take(&mut *self.0.lock().expect("recording"))
    }
}

/// Reports its progress twice (deltas between its ready and its result).
struct Stages;

#[async_trait]
impl Tool for Stages {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("stages", "Reports its progress").with_parameters(json!({
            "type": "object",
            "properties": {}
        }))
    }
    async fn execute(&self, _args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        ctx.report_progress(json!({"stage": 1}));
        tokio::task::yield_now().await;
        ctx.report_progress(json!({"stage": 2}));
        Ok(ToolOutput::success(json!("staged")))
    }
}

/// Suspends every `echo` call that carries no decision yet.
struct Approval(PluginManifest);

impl Plugin for Approval {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_tool_gate_hook(
            "ask",
            Arc::new(FnGate(|ctx: &PhaseContext| {
                let tool = ctx.tool.as_ref().expect("a tool phase");
                if tool.call.name != "echo" || tool.resume.is_some() {
                    return Ok(None);
                }
                Ok(Some(ToolInterceptPayload::Suspend(SuspendTicket {
                    suspension_id: format!("ask-{}", tool.call.id),
                    call: pending_call(&tool.call),
                    message: format!("Run echo with {}?", tool.call.arguments),
                    response_schema: None,
                    resume_mode: ResumeMode::Replay,
                })))
            })),
        )
    }
}

#[derive(Clone, Copy)]
enum Backend {
    Memory,
    Sqlite,
}

/// A store of `backend`, with the folder that holds it (bound first, it is dropped after the
/// store) for SQLite.
async fn store(backend: Backend, name: &str) -> (Option<TestDir>, Arc<dyn ThreadStore>) {
    match backend {
        Backend::Memory => (None, Arc::new(MemoryStore::new())),
        Backend::Sqlite => {
            let dir = fresh_dir(&format!("event-seq-{name}"));
            let store = Arc::new(
                SqliteStore::open(SqliteConfig::file(dir.join("threads.db")))
                    .await
                    .expect("sqlite"),
            );
            (Some(dir), store)
        }
    }
}

/// A runtime over `store` with its own script; `echo` asks for approval when `approval`.
fn runtime(
    store: Arc<dyn ThreadStore>,
    turns: Vec<ScriptTurn>,
    parallel: bool,
    approval: bool,
) -> AgentRuntime {
    let executor = Arc::new(ScriptedExecutor::from_turns(turns).expect("script"));
    let mut spec = AgentSpec::new("agent", "model").with_parallel_tools(parallel);
    let mut builder = AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_store(store)
        .with_model(ModelSpec::new("model", "scripted", "upstream"))
        .with_provider("scripted", executor)
        .with_tool(Arc::new(Echo))
        .with_tool(Arc::new(Broken))
        .with_tool(Arc::new(Stages));
    if approval {
        spec = spec.with_plugin("approval");
        builder = builder.with_plugin(Arc::new(Approval(PluginManifest::new("approval"))));
    }
    builder.with_agent_spec(spec).build().expect("runtime")
}

fn thread() -> ThreadId {
    ThreadId::new("t").expect("id")
}

fn call(name: &str, args: Value, id: &str) -> ScriptToolCall {
    ScriptToolCall::new(name, args).with_id(id)
}

/// The thread's last stored sequence number (0 when it has none).
async fn last_seq(store: &dyn ThreadStore) -> u64 {
    store
        .load_events(&thread(), 0)
        .await
        .expect("loads")
        .last()
        .map_or(0, |e| e.seq)
}

/// Checks one activation's emitted stream against the store, where `since` is the thread's
/// last stored sequence number before it, and renders the stream: one line per event, its
/// sequence number first (`-` for a delta). Returns the rendering and the last stored number.
async fn check_seqs(
    store: &dyn ThreadStore,
    since: u64,
    recorded: &[(Option<u64>, AgentEvent)],
) -> (String, u64) {
    let events: Vec<AgentEvent> = recorded.iter().map(|(_, e)| e.clone()).collect();
    if let Err(v) = check_activation(&events) {
        panic!("event grammar violated: {v}\n{}", render(&events));
    }
    // Lifecycle events, and only they, come with a sequence number.
    for (seq, event) in recorded {
        assert_eq!(
            seq.is_some(),
            event.is_lifecycle(),
            "{} came through {}",
            event.type_name(),
            if seq.is_some() { "emit_stored" } else { "emit" }
        );
    }
    let emitted: Vec<(u64, AgentEvent)> = recorded
        .iter()
        .filter_map(|(seq, e)| seq.map(|seq| (seq, e.clone())))
        .collect();
    assert!(!emitted.is_empty(), "the activation stored events");
    // Numbered from the thread's next one, by one, without gaps.
    let seqs: Vec<u64> = emitted.iter().map(|(seq, _)| *seq).collect();
    let expected: Vec<u64> = (since + 1..=since + emitted.len() as u64).collect();
    assert_eq!(seqs, expected, "sequence numbers after {since}");
    // Exactly what the store holds after `since`, in the same order.
    let stored: Vec<(u64, AgentEvent)> = store
        .load_events(&thread(), since)
        .await
        .expect("loads")
        .into_iter()
        .map(|e| (e.seq, e.event))
        .collect();
    assert_eq!(emitted, stored, "emitted (left) and stored (right) events");
    let mut text = String::new();
    for (seq, event) in recorded {
        // (The scenario rendering leaves out argument deltas.)
        let line = match event {
            AgentEvent::ToolCallArgsDelta { call_id, .. } => format!("args {call_id}\n"),
            _ => render(std::slice::from_ref(event)),
        };
        match seq {
            Some(seq) => text.push_str(&format!("{seq:>2} {line}")),
            None => text.push_str(&format!(" - {line}")),
        }
    }
    (text, since + emitted.len() as u64)
}

/// Runs one fresh activation with `message` on `rt`, checked against the store.
async fn run(rt: &AgentRuntime, message: &str) -> (RunOutcome, String, u64) {
    let since = last_seq(rt.store().as_ref()).await;
    let sink = Recording::default();
    let outcome = rt
        .run(
            RunActivation::new(thread(), "agent").with_user_message(message),
            &sink,
        )
        .await
        .expect("the run starts");
    let (text, last) = check_seqs(rt.store().as_ref(), since, &sink.take()).await;
    (outcome, text, last)
}

/// Resumes the waiting run on `rt` with `decisions`, checked against the store; `since` is
/// the last number the previous activation emitted, which must be the store's last too.
async fn resume(
    rt: &AgentRuntime,
    since: u64,
    decisions: Vec<ToolCallResume>,
) -> (RunOutcome, String, u64) {
    assert_eq!(last_seq(rt.store().as_ref()).await, since);
    let mut request = Resume::new(thread());
    for d in decisions {
        request = request.with_decision(d);
    }
    let sink = Recording::default();
    let outcome = rt.resume(request, &sink).await.expect("resumed");
    let (text, last) = check_seqs(rt.store().as_ref(), since, &sink.take()).await;
    (outcome, text, last)
}

/// Three steps of two tool calls each (with text, reasoning, a failure and progress around
/// them), then an answer.
fn tool_steps() -> Vec<ScriptTurn> {
    vec![
        ScriptTurn::text("looking")
            .with_reasoning("first the echoes")
            .with_tool_call(call("echo", json!({"text": "a"}), "c1"))
            .with_tool_call(call("echo", json!({"text": "b"}), "c2")),
        ScriptTurn::text("")
            .with_tool_call(call("stages", json!({}), "c3"))
            .with_tool_call(call("broken", json!({}), "c4")),
        ScriptTurn::text("")
            .with_tool_call(call("echo", json!({"text": "c"}), "c5"))
            .with_tool_call(call("stages", json!({}), "c6")),
        ScriptTurn::text("done"),
    ]
}

async fn sequential_tool_steps(backend: Backend) -> String {
    let (_dir, store) = store(backend, "sequential").await;
    let rt = runtime(store, tool_steps(), false, false);
    let (outcome, text, _) = run(&rt, "hi").await;
    assert_eq!(outcome.termination, TerminationReason::NaturalEnd);
    text
}

#[tokio::test]
async fn sequential_tool_steps_emit_the_stored_numbers() {
    let memory = sequential_tool_steps(Backend::Memory).await;
    assert_eq!(memory, sequential_tool_steps(Backend::Sqlite).await);
    expect_test::expect![[r#"
         1 run_start run-1 resumed=false
         2 step_start 1
         - reasoning_delta
         - text "looking"
         3 call_start c1 echo
         - args c1
         4 call_start c2 echo
         - args c2
         5 inference upstream
         6 call_ready c1 {"text":"a"}
         7 call_done c1 succeeded {"echoed":"a"}
         8 call_ready c2 {"text":"b"}
         9 call_done c2 succeeded {"echoed":"b"}
        10 step_end 1
        11 step_start 2
        12 call_start c3 stages
         - args c3
        13 call_start c4 broken
         - args c4
        14 inference upstream
        15 call_ready c3 {}
         - tool_call_progress
         - tool_call_progress
        16 call_done c3 succeeded "staged"
        17 call_ready c4 {}
        18 call_done c4 failed "disk on fire"
        19 step_end 2
        20 step_start 3
        21 call_start c5 echo
         - args c5
        22 call_start c6 stages
         - args c6
        23 inference upstream
        24 call_ready c5 {"text":"c"}
        25 call_done c5 succeeded {"echoed":"c"}
        26 call_ready c6 {}
         - tool_call_progress
         - tool_call_progress
        27 call_done c6 succeeded "staged"
        28 step_end 3
        29 step_start 4
         - text "done"
        30 inference upstream
        31 step_end 4
        32 run_finish natural_end response=Some("done") tokens=0
    "#]]
    .assert_eq(&memory);
}

async fn parallel_tool_steps(backend: Backend) -> String {
    let (_dir, store) = store(backend, "parallel").await;
    let rt = runtime(store, tool_steps(), true, false);
    let (outcome, text, _) = run(&rt, "hi").await;
    assert_eq!(outcome.termination, TerminationReason::NaturalEnd);
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_tool_steps_emit_the_stored_numbers() {
    // The calls of a step finish in varying order: a few runs see more of the interleavings.
    for backend in [Backend::Memory, Backend::Sqlite] {
        for _ in 0..8 {
            let text = parallel_tool_steps(backend).await;
            for id in ["c1", "c2", "c3", "c4", "c5", "c6"] {
                assert!(text.contains(&format!("call_done {id} ")), "{text}");
            }
        }
    }
}

#[tokio::test]
async fn a_resumed_run_continues_the_numbers_in_fresh_runtimes() {
    let (_dir, store) = store(Backend::Sqlite, "resume").await;
    let two_echoes = ScriptTurn::text("")
        .with_tool_call(call("echo", json!({"text": "a"}), "c1"))
        .with_tool_call(call("echo", json!({"text": "b"}), "c2"));
    let first = runtime(store.clone(), vec![two_echoes], false, true);
    let (outcome, text, last) = run(&first, "hi").await;
    assert_eq!(outcome.termination, TerminationReason::Suspended);
    expect_test::expect![[r#"
         1 run_start run-1 resumed=false
         2 step_start 1
         3 call_start c1 echo
         - args c1
         4 call_start c2 echo
         - args c2
         5 inference upstream
         6 call_ready c1 {"text":"a"}
         7 call_suspended c1 "Run echo with {\"text\":\"a\"}?"
         8 call_ready c2 {"text":"b"}
         9 call_suspended c2 "Run echo with {\"text\":\"b\"}?"
        10 step_end 1
        11 run_finish suspended response=None tokens=0
    "#]]
    .assert_eq(&text);
    let tickets = first.waiting_calls(&thread()).await.expect("read");
    assert_eq!(tickets.len(), 2);

    // Another process approves the first call only: the run keeps waiting.
    let second = runtime(store.clone(), Vec::new(), false, true);
    let (outcome, text, last) = resume(
        &second,
        last,
        vec![ToolCallResume::approve(&tickets[0].call)],
    )
    .await;
    assert_eq!(outcome.termination, TerminationReason::Suspended);
    expect_test::expect![[r#"
        12 run_start run-1 resumed=true
        13 run_finish suspended response=None tokens=0
    "#]]
    .assert_eq(&text);

    // A third approves the second: both calls run and the run ends.
    let third = runtime(
        store.clone(),
        vec![ScriptTurn::text("both done")],
        false,
        true,
    );
    let (outcome, text, _) = resume(
        &third,
        last,
        vec![ToolCallResume::approve(&tickets[1].call)],
    )
    .await;
    assert_eq!(outcome.termination, TerminationReason::NaturalEnd);
    expect_test::expect![[r#"
        14 run_start run-1 resumed=true
        15 step_start 2
        16 tool_call_resumed
        17 call_ready c1 {"text":"a"}
        18 call_done c1 succeeded {"echoed":"a"}
        19 tool_call_resumed
        20 call_ready c2 {"text":"b"}
        21 call_done c2 succeeded {"echoed":"b"}
        22 step_end 2
        23 step_start 3
         - text "both done"
        24 inference upstream
        25 step_end 3
        26 run_finish natural_end response=Some("both done") tokens=0
    "#]]
    .assert_eq(&text);
}

async fn second_run(backend: Backend) -> String {
    let (_dir, store) = store(backend, "second-run").await;
    let mut turns = tool_steps();
    turns.push(ScriptTurn::text("again").with_tool_call(call("echo", json!({"text": "d"}), "c7")));
    turns.push(ScriptTurn::text("done again"));
    let rt = runtime(store.clone(), turns, false, false);
    let (_, _, first_last) = run(&rt, "hi").await;
    // The second run's numbers start after the first run's last.
    assert_eq!(last_seq(store.as_ref()).await, first_last);
    let (outcome, text, _) = run(&rt, "once more").await;
    assert_eq!(outcome.termination, TerminationReason::NaturalEnd);
    text
}

#[tokio::test]
async fn a_second_run_on_the_thread_continues_the_numbers() {
    let memory = second_run(Backend::Memory).await;
    assert_eq!(memory, second_run(Backend::Sqlite).await);
    expect_test::expect![[r#"
        33 run_start run-2 resumed=false
        34 step_start 1
         - text "again"
        35 call_start c7 echo
         - args c7
        36 inference upstream
        37 call_ready c7 {"text":"d"}
        38 call_done c7 succeeded {"echoed":"d"}
        39 step_end 1
        40 step_start 2
         - text "done again"
        41 inference upstream
        42 step_end 2
        43 run_finish natural_end response=Some("done again") tokens=0
    "#]]
    .assert_eq(&memory);
}
