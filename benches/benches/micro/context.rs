use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use awaken_context::{ContextConfig, ContextPlugins, is_omission_marker};
use awaken_event::{
    History, Message, RunId, ThreadId, ToolCall, ToolCallId, ToolDescriptor, ToolResult,
};
use awaken_llm::InferenceRequest;
use awaken_phase::RunIdentity;
use awaken_plugin::{ExecutionEnv, Plugin, TokenCounts, TransformContext, apply_transforms};
use awaken_state::StateStore;
use criterion::Criterion;
use serde_json::json;

/// A thread of `len` messages: the user's request, then tool steps (a call to `read_file` and
/// its ~200-byte result).
fn thread(len: usize) -> Vec<Message> {
    let mut messages = vec![Message::user(
        "Refactor the storage module and keep the tests green.",
    )];
    let mut i = 0;
    while messages.len() < len {
        let id = ToolCallId::new(format!("call_{i}")).expect("id");
        messages.push(Message::assistant_with_calls(
            "",
            vec![ToolCall::new(
                id.clone(),
                "read_file",
                json!({ "path": format!("src/store/file_{i}.rs") }),
            )],
        ));
        messages.push(Message::tool(
            id,
            &ToolResult::success(json!(format!(
                "// file {i}\npub fn handler_{i}(input: &str) -> Result<String, Error> {{\n    let parsed = parse(input)?;\n    validate(&parsed)?;\n    Ok(render(parsed))\n}}\n"
            ))),
        ));
        i += 1;
    }
    messages.truncate(len);
    messages
}

/// One step's transform on a thread of `len` messages, with the counts of the previous step
/// (two messages shorter) cached: a 16,000-token budget, which both threads exceed.
fn bench_transform(c: &mut Criterion, name: &str, len: usize) {
    let plugins: Vec<Arc<dyn Plugin>> = ContextPlugins::new(ContextConfig::new(16_000))
        .into_plugins()
        .expect("plugins");
    let env = ExecutionEnv::from_plugins(&[], &plugins, &[]).expect("env");
    let snapshot = StateStore::new(env.keys().clone()).snapshot();
    let run = RunIdentity {
        thread_id: ThreadId::new("thread").expect("id"),
        run_id: RunId::new("run").expect("id"),
        agent_id: "agent".into(),
        profile_id: None,
    };
    let ctx = TransformContext {
        snapshot: &snapshot,
        run: &run,
        step: 1,
        tokens: TokenCounts::default(),
    };
    let tools = vec![ToolDescriptor::new(
        "read_file",
        "Reads a file of the repository",
    )];
    let messages = thread(len);
    let previous: History = messages[..len - 2].to_vec().into();
    let current: History = messages.into();
    let request = |m: &History| {
        InferenceRequest::new("model", m.clone())
            .with_tools(tools.clone())
            .with_system_prompt("You are a careful engineer.")
    };
    let out = apply_transforms(env.transforms(), request(&current), &ctx).expect("fits");
    assert!(
        out.messages.iter().any(is_omission_marker),
        "the bench truncates"
    );
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                // The previous step, untimed: its counts are what the cache holds.
                apply_transforms(env.transforms(), request(&previous), &ctx).expect("fits");
                let req = request(&current);
                let started = Instant::now();
                let out = apply_transforms(env.transforms(), black_box(req), &ctx).expect("fits");
                total += started.elapsed();
                black_box(out);
            }
            total
        })
    });
}

pub(crate) fn benches(c: &mut Criterion) {
    // A fresh process has a heap without free blocks: every request freed shrinks it and the
    // next one faults the pages back in, which doubled the first benchmark of the process
    // (and only the first) here. Building and dropping a thread first gives the heap of a
    // process that has been running, which is what a step of a long thread sees.
    drop(black_box(thread(10_000)));
    bench_transform(c, "context/transform_1k_messages", 1_000);
    bench_transform(c, "context/transform_10k_messages", 10_000);
}
