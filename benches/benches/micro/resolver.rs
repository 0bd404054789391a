use std::hint::black_box;
use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::ToolDescriptor;
use awaken_llm::{ScriptTurn, ScriptedExecutor};
use awaken_plugin::{Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_resolver::{NoBuiltins, Registries, Resolver};
use awaken_spec::{AgentSpec, Glob, ModelSpec};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use criterion::Criterion;
use serde_json::{Value, json};

struct Echo(String);

#[async_trait]
impl Tool for Echo {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(self.0.clone(), "echo").with_parameters(json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"]
        }))
    }
    async fn execute(&self, args: &Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::success(args.clone()))
    }
}

struct Empty(PluginManifest);

impl Plugin for Empty {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, _r: &mut PluginRegistrar) -> Result<(), PluginError> {
        Ok(())
    }
}

fn base() -> Registries {
    let executor =
        Arc::new(ScriptedExecutor::from_turns(vec![ScriptTurn::text("hi")]).expect("script"));
    Registries::new()
        .with_model(ModelSpec::new("m", "p", "x"))
        .with_provider("p", executor)
}

pub(crate) fn benches(c: &mut Criterion) {
    let mut big = base();
    let mut spec = AgentSpec::new("big", "m");
    for i in 0..8 {
        big.add_plugin(Arc::new(Empty(PluginManifest::new(format!("p{i}")))));
        spec = spec.with_plugin(format!("p{i}"));
    }
    for i in 0..64 {
        let prefix = ["fs", "net", "db", "misc"][i % 4];
        big.add_tool(Arc::new(Echo(format!("{prefix}_{i}"))));
    }
    for p in ["fs_*", "net_*", "db_*"] {
        spec = spec.with_allowed_tool_pattern(Glob::new(p).expect("glob"));
    }
    spec = spec.with_excluded_tool_pattern(Glob::new("db_1*").expect("glob"));
    let big = Resolver::new(Arc::new(big.with_agent_spec(spec)), Arc::new(NoBuiltins));
    c.bench_function("resolver/resolve_8_plugins_64_tools", |b| {
        b.iter(|| big.resolve(black_box("big")).expect("resolves"))
    });

    let minimal = Resolver::new(
        Arc::new(
            base()
                .with_tool(Arc::new(Echo("echo".into())))
                .with_agent_spec(AgentSpec::new("min", "m").with_system_prompt("Be brief.")),
        ),
        Arc::new(NoBuiltins),
    );
    c.bench_function("resolver/resolve_minimal", |b| {
        b.iter(|| minimal.resolve(black_box("min")).expect("resolves"))
    });
}
