//! Profile-scoped state: loaded into every run of the profile, written with version guards; a
//! write refused because another thread changed the key is redone on the fresh value.

use std::sync::Arc;

use awaken_event::{ProfileId, Role, TerminationReason, ThreadId};
use awaken_llm::{
    InferenceRequest, LlmEventStream, LlmExecutor, ScriptToolCall, ScriptTurn, ScriptedExecutor,
};
use awaken_phase::{FnHook, Phase, PhaseContext};
use awaken_plugin::{Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_runtime::{AgentRuntime, RunActivation, SequentialIds};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_state::{StateCommand, StateError, StateKey};
use awaken_store::{MemoryStore, ThreadStore};
use serde_json::json;

use crate::support::*;

/// How many tool calls the profile's runs made, across threads.
struct CallsMade;

impl StateKey for CallsMade {
    const KEY: &'static str = "prefs.calls_made";
    type Value = u64;
    type Update = u64;
    fn apply(value: &mut u64, update: u64) -> Result<(), StateError> {
        *value += update;
        Ok(())
    }
}

/// Counts each finished tool call in the profile key (and records what it saw).
struct Counter(PluginManifest, Log);

impl Plugin for Counter {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_profile_key::<CallsMade>()?;
        let log = self.1.clone();
        r.register_phase_hook(
            Phase::AfterToolExecute,
            "count",
            Arc::new(FnHook(move |ctx: &PhaseContext| {
                let seen = ctx.snapshot.get::<CallsMade>().copied().unwrap_or(0);
                log.push(format!("{} saw {seen}", ctx.run.thread_id));
                Ok(StateCommand::new().with_update::<CallsMade>(1))
            })),
        )
    }
}

/// Calls `gate` on thread `slow`, `echo` elsewhere, then answers.
struct ByThread;

impl LlmExecutor for ByThread {
    fn name(&self) -> &str {
        "by-thread"
    }
    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let done = request.messages.iter().any(|m| m.role == Role::Tool);
        let slow = request.routing_key.as_deref() == Some("slow");
        let turn = match (done, slow) {
            (true, _) => ScriptTurn::text("done"),
            (false, true) => ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("gate", json!({})).with_id("g1")),
            (false, false) => ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("echo", json!({"text": "x"})).with_id("e1")),
        };
        match ScriptedExecutor::from_turns(vec![turn]) {
            Ok(e) => e.execute_stream(request),
            Err(e) => unreachable!("a one-turn script is valid: {e}"),
        }
    }
}

fn runtime(store: Arc<dyn ThreadStore>, log: &Log, gate: crate::lifecycle::Gate) -> AgentRuntime {
    AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_store(store)
        .with_model(ModelSpec::new("model", "p", "up"))
        .with_provider("p", Arc::new(ByThread))
        .with_tool(Arc::new(Echo))
        .with_tool(Arc::new(gate))
        .with_plugin(Arc::new(Counter(
            PluginManifest::new("counter"),
            log.clone(),
        )))
        .with_agent_spec(AgentSpec::new("agent", "model").with_plugin("counter"))
        .build()
        .expect("runtime")
}

fn on(thread: &str) -> RunActivation {
    RunActivation::new(ThreadId::new(thread).expect("id"), "agent")
        .with_user_message("go")
        .with_profile(ProfileId::new("ada").expect("id"))
}

fn notifies() -> (Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
    (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    )
}

#[tokio::test]
async fn every_thread_of_a_profile_sees_its_keys() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    let log = Log::default();
    let (entered, release) = notifies();
    let rt = runtime(
        store.clone(),
        &log,
        crate::lifecycle::Gate(entered, release),
    );
    for thread in ["a", "b", "c"] {
        let out = rt.run_to_completion(on(thread)).await.expect("run");
        assert_eq!(out.termination, TerminationReason::NaturalEnd);
    }
    // A run without the profile sees none of it.
    rt.run_to_completion(
        RunActivation::new(ThreadId::new("d").expect("id"), "agent").with_user_message("go"),
    )
    .await
    .expect("run");
    assert_eq!(log.lines(), ["a saw 0", "b saw 1", "c saw 2", "d saw 0"]);
    let profile = store
        .load_profile(&ProfileId::new("ada").expect("id"))
        .await
        .expect("profile");
    let entry = &profile.keys[CallsMade::KEY];
    assert_eq!((entry.value.clone(), entry.version), (json!(3), 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_write_is_redone_on_the_fresh_value_never_lost() {
    let store: Arc<dyn ThreadStore> = Arc::new(MemoryStore::new());
    let log = Log::default();
    let (entered, release) = notifies();
    let rt = runtime(
        store.clone(),
        &log,
        crate::lifecycle::Gate(entered.clone(), release.clone()),
    );
    // `slow` reads the profile (nothing yet), then waits inside its tool.
    let slow = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.run_to_completion(on("slow")).await })
    };
    entered.notified().await;
    // `fast` reads the same version, writes, commits.
    let fast = rt.run_to_completion(on("fast")).await.expect("fast");
    assert_eq!(fast.termination, TerminationReason::NaturalEnd);
    // `slow` then writes from the version it read: refused by the store, redone on the fresh
    // value, committed.
    release.notify_one();
    let slow = slow.await.expect("joined").expect("slow");
    assert_eq!(slow.termination, TerminationReason::NaturalEnd);
    // Both writes count: the retry applied slow's increment to fast's value.
    let profile = store
        .load_profile(&ProfileId::new("ada").expect("id"))
        .await
        .expect("profile");
    let entry = &profile.keys[CallsMade::KEY];
    assert_eq!((entry.value.clone(), entry.version), (json!(2), 2));
    assert_eq!(log.lines(), ["fast saw 0", "slow saw 0"]);
    // A later run of the profile sees both.
    rt.run_to_completion(on("later")).await.expect("later");
    assert_eq!(log.lines()[2], "later saw 2");
}

#[tokio::test]
async fn a_refused_profile_commit_still_gives_one_well_formed_activation() {
    // Every commit that writes the profile key is refused (its store died there).
    let store: Arc<dyn ThreadStore> = Arc::new(Intercepted::new(
        Arc::new(MemoryStore::new()),
        |c: &awaken_store::ThreadCommit| {
            if c.profile_state.values.is_empty() {
                Ok(())
            } else {
                Err(awaken_store::StoreError::Task {
                    detail: "the process died".into(),
                }
                .into())
            }
        },
    ));
    let log = Log::default();
    let (entered, release) = notifies();
    let rt = runtime(store, &log, crate::lifecycle::Gate(entered, release));
    let sink = awaken_event::VecSink::new();
    let out = crate::support::unwritten_end(rt.run(on("a"), &sink).await);
    assert!(matches!(out, TerminationReason::Error { .. }), "{out:?}");
    // The events held back for the refused commits were emitted, once each, in order.
    let events = sink.events();
    if let Err(v) = awaken_event::check_activation(&events) {
        panic!("{v}\n{}", render(&events));
    }
    let done = events
        .iter()
        .filter(|e| e.type_name() == "tool_call_done")
        .count();
    assert_eq!(done, 1, "{}", render(&events));
}
