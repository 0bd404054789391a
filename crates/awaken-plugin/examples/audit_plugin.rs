//! A Rust plugin, end to end: a state key, a phase hook, an effect with its handler, a config
//! section with its schema, and an environment that runs it. Run with
//! `cargo run -p awaken-plugin --example audit_plugin`; `cargo test` builds it.

use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{RunId, ThreadId};
use awaken_phase::{
    CommandExt, EffectContext, EffectHandler, EffectSpec, FnHook, HookError, Phase, PhaseContext,
    PhaseEngine, RunIdentity,
};
use awaken_plugin::{
    ConfigSchema, ExecutionEnv, Plugin, PluginError, PluginManifest, PluginRegistrar,
};
use awaken_state::{KeyOptions, KeyScope, StateCommand, StateError, StateKey, StateStore};
use serde_json::json;

/// How many steps the run has taken (persisted with the run).
struct StepsSeen;
impl StateKey for StepsSeen {
    const KEY: &'static str = "audit.steps_seen";
    type Value = u64;
    type Update = u64;
    fn apply(value: &mut u64, add: u64) -> Result<(), StateError> {
        *value = value
            .checked_add(add)
            .ok_or_else(|| StateError::invalid_update(Self::KEY, "overflow"))?;
        Ok(())
    }
}

/// Emitted at every step end; handled after the commit.
struct AuditLine;
impl EffectSpec for AuditLine {
    const KEY: &'static str = "audit.line";
    type Payload = String;
}

struct PrintAudit;
#[async_trait]
impl EffectHandler<AuditLine> for PrintAudit {
    async fn handle(&self, ctx: &EffectContext, line: String) -> Result<(), HookError> {
        let seen = ctx.snapshot.get::<StepsSeen>()?;
        tracing::info!(%line, seen, "audit");
        Ok(())
    }
}

struct AuditPlugin {
    manifest: PluginManifest,
    schema: ConfigSchema,
}

impl AuditPlugin {
    fn new() -> Result<Self, Box<dyn std::error::Error>> {
        Ok(Self {
            manifest: PluginManifest::new("audit").with_version("1.0.0")?,
            schema: ConfigSchema::new(
                "audit",
                json!({"type": "object", "properties": {"level": {"enum": ["info", "debug"]}}}),
            )?,
        })
    }
}

impl Plugin for AuditPlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }

    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        // Structural: always installed.
        r.register_key::<StepsSeen>(KeyOptions::new().with_scope(KeyScope::Run))?;
        r.register_effect::<AuditLine, _>(PrintAudit)?;
        // Behavioural: installed when the agent activates this plugin.
        r.register_phase_hook(
            Phase::StepEnd,
            "count_steps",
            Arc::new(FnHook(|ctx: &PhaseContext| {
                let mut cmd = StateCommand::new().with_update::<StepsSeen>(1);
                cmd.emit::<AuditLine>(format!(
                    "step {} of run {} ended",
                    ctx.step, ctx.run.run_id
                ))?;
                Ok(cmd)
            })),
        )
    }

    fn config_schemas(&self) -> Vec<ConfigSchema> {
        vec![self.schema.clone()]
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let plugin: Arc<dyn Plugin> = Arc::new(AuditPlugin::new()?);
    let env = ExecutionEnv::from_plugins(&[plugin], &[], &[])?;
    let engine = PhaseEngine::new(
        Arc::new(StateStore::new(env.keys().clone())),
        env.phase_env().clone(),
    );
    let run = Arc::new(RunIdentity {
        thread_id: ThreadId::new("thread-1")?,
        run_id: RunId::new("run-1")?,
        agent_id: "assistant".into(),
        profile_id: None,
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    for step in 1..=3 {
        let ctx = PhaseContext::new(Phase::StepEnd, engine.store().snapshot(), run.clone())
            .with_step(step);
        runtime.block_on(engine.run_phase(&ctx))?;
    }
    let seen = *engine.store().snapshot().get::<StepsSeen>()?;
    assert_eq!(seen, 3);
    Ok(())
}
