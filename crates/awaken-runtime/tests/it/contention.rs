//! Many runs of one profile writing the same profile keys at once, on every store: no run fails
//! because another wrote first, and every write counts exactly once. One key is commutative (a
//! counter), the other exclusive with a reducer that reads what is stored and appends to it.
//!
//! The PostgreSQL case needs `AWAKEN_TEST_POSTGRES_URL` (CI sets it); without it, it says it
//! was skipped and passes.

use std::collections::BTreeSet;
use std::sync::Arc;

use awaken_event::{ProfileId, Role, TerminationReason, ThreadId, VecSink, check_activation};
use awaken_llm::{
    InferenceRequest, LlmEventStream, LlmExecutor, ScriptToolCall, ScriptTurn, ScriptedExecutor,
};
use awaken_phase::{FnHook, Phase, PhaseContext};
use awaken_plugin::{Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_runtime::{AgentRuntime, RunActivation, SystemIds};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_state::{KeyOptions, KeyScope, MergeStrategy, StateCommand, StateError, StateKey};
use awaken_store::{MemoryStore, SqliteConfig, SqliteStore, ThreadStore};
use serde_json::json;

use crate::support::Echo;

/// Concurrent runs, each on its own thread of the one profile.
const RUNS: usize = 64;
/// Tool calls per run; each writes both keys once.
const CALLS: usize = 3;

/// Tool calls made by the profile's runs (commutative: adds).
struct Made;

impl StateKey for Made {
    const KEY: &'static str = "contention.made";
    type Value = u64;
    type Update = u64;
    fn apply(value: &mut u64, update: u64) -> Result<(), StateError> {
        *value += update;
        Ok(())
    }
}

/// Every call, as `thread/call` (exclusive: the reducer reads the stored list and extends it).
struct Seen;

impl StateKey for Seen {
    const KEY: &'static str = "contention.seen";
    type Value = Vec<String>;
    type Update = String;
    fn apply(value: &mut Vec<String>, update: String) -> Result<(), StateError> {
        value.push(update);
        Ok(())
    }
}

struct Writer(PluginManifest);

impl Plugin for Writer {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_key::<Made>(
            KeyOptions::new()
                .with_scope(KeyScope::Profile)
                .with_merge(MergeStrategy::Commutative),
        )?;
        r.register_key::<Seen>(
            KeyOptions::new()
                .with_scope(KeyScope::Profile)
                .with_merge(MergeStrategy::Exclusive),
        )?;
        r.register_phase_hook(
            Phase::AfterToolExecute,
            "write",
            Arc::new(FnHook(|ctx: &PhaseContext| {
                let call = ctx.tool.as_ref().map(|t| t.call.id.to_string());
                let entry = format!("{}/{}", ctx.run.thread_id, call.unwrap_or_default());
                Ok(StateCommand::new()
                    .with_update::<Made>(1)
                    .with_update::<Seen>(entry))
            })),
        )
    }
}

/// Calls `echo` until the request holds `CALLS` tool results, then answers.
struct Caller;

impl LlmExecutor for Caller {
    fn name(&self) -> &str {
        "caller"
    }
    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let done = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .count();
        let turn = if done < CALLS {
            ScriptTurn::text("").with_tool_call(
                ScriptToolCall::new("echo", json!({"text": "x"})).with_id(format!("c{done}")),
            )
        } else {
            ScriptTurn::text("done")
        };
        match ScriptedExecutor::from_turns(vec![turn]) {
            Ok(e) => e.execute_stream(request),
            Err(e) => unreachable!("a one-turn script is valid: {e}"),
        }
    }
}

fn runtime(store: Arc<dyn ThreadStore>) -> AgentRuntime {
    AgentRuntime::builder()
        .with_ids(Arc::new(SystemIds::default()))
        .with_store(store)
        .with_model(ModelSpec::new("model", "p", "up"))
        .with_provider("p", Arc::new(Caller))
        .with_tool(Arc::new(Echo))
        .with_plugin(Arc::new(Writer(PluginManifest::new("writer"))))
        .with_agent_spec(
            AgentSpec::new("agent", "model")
                .with_plugin("writer")
                .with_max_rounds(CALLS as u32 + 2),
        )
        .build()
        .expect("runtime")
}

/// Starts `RUNS` runs of profile `team` at once and checks each run and the profile's keys.
async fn every_write_counts(store: Arc<dyn ThreadStore>) {
    let rt = Arc::new(runtime(store.clone()));
    let profile = ProfileId::new("team").expect("id");
    let mut runs = Vec::with_capacity(RUNS);
    for i in 0..RUNS {
        let rt = rt.clone();
        let profile = profile.clone();
        runs.push(tokio::spawn(async move {
            let thread = ThreadId::new(format!("t{i:02}")).expect("id");
            let sink = VecSink::default();
            let activation = RunActivation::new(thread, "agent")
                .with_user_message("go")
                .with_profile(profile);
            let outcome = rt.run(activation, &sink).await;
            (i, outcome, sink.take())
        }));
    }
    for run in runs {
        let (i, outcome, events) = run.await.expect("task");
        let outcome = outcome.unwrap_or_else(|e| panic!("run {i} failed: {e}"));
        assert_eq!(
            outcome.termination,
            TerminationReason::NaturalEnd,
            "run {i} did not end naturally"
        );
        check_activation(&events).unwrap_or_else(|e| panic!("run {i}: {e}"));
    }
    let stored = store.load_profile(&profile).await.expect("profile");
    let made = &stored.keys[Made::KEY];
    assert_eq!(made.value, json!(RUNS * CALLS), "a counted write was lost");
    let seen: Vec<String> =
        serde_json::from_value(stored.keys[Seen::KEY].value.clone()).expect("list");
    let distinct: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(
        seen.len(),
        RUNS * CALLS,
        "a write was lost or applied twice"
    );
    assert_eq!(distinct.len(), seen.len(), "a write was applied twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_runs_of_one_profile_on_the_memory_store() {
    every_write_counts(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_runs_of_one_profile_on_sqlite() {
    let dir = crate::support::fresh_dir("contention-sqlite");
    let store = SqliteStore::open(SqliteConfig::file(dir.join("threads.db")))
        .await
        .expect("sqlite");
    every_write_counts(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_runs_of_one_profile_on_postgres() {
    let Some((url, schema)) = crate::leases::postgres_schema("contention") else {
        return;
    };
    let store = awaken_store::PostgresStore::connect(
        awaken_store::PostgresConfig::new(&url)
            .with_schema(&schema)
            .with_max_connections(8),
    )
    .await
    .expect("postgres");
    every_write_counts(Arc::new(store)).await;
}
