//! Small real implementations of the injection points, and a configurable plugin.

use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{AgentEvent, EventSink, TerminationReason, TokenUsage, ToolDescriptor};
use awaken_llm::{ScriptTurn, ScriptedExecutor};
use awaken_plugin::{ConfigSchema, Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_resolver::*;
use awaken_spec::{AgentSpec, EndpointSpec, ModelSpec};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};

/// A tool that echoes its arguments.
pub struct Echo {
    pub id: String,
    pub schema: Value,
}

pub fn echo(id: &str) -> Arc<dyn Tool> {
    Arc::new(Echo {
        id: id.to_owned(),
        schema: json!({"type": "object"}),
    })
}

#[async_trait]
impl Tool for Echo {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(self.id.clone(), "echo").with_parameters(self.schema.clone())
    }
    async fn execute(&self, args: &Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::success(args.clone()))
    }
}

/// A plugin contributing tools and optionally claiming a config section.
pub struct ToolPlugin {
    pub manifest: PluginManifest,
    pub tools: Vec<Arc<dyn Tool>>,
    pub schema: Option<ConfigSchema>,
}

pub fn plugin(id: &str, tools: &[&str]) -> ToolPlugin {
    ToolPlugin {
        manifest: PluginManifest::new(id),
        tools: tools.iter().map(|t| echo(t)).collect(),
        schema: None,
    }
}

impl ToolPlugin {
    pub fn arc(self) -> Arc<dyn Plugin> {
        Arc::new(self)
    }
}

impl Plugin for ToolPlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        for t in &self.tools {
            r.register_tool(t.clone())?;
        }
        Ok(())
    }
    fn config_schemas(&self) -> Vec<ConfigSchema> {
        self.schema.iter().cloned().collect()
    }
}

/// Built-ins as the runtime will supply them: loop actions and stop conditions always, the two
/// context plugins when the spec sets a context policy; refuses agents named `no-builtins`.
pub struct TestBuiltins;

impl BuiltinPlugins for TestBuiltins {
    fn builtin_plugins(
        &self,
        spec: &AgentSpec,
        _model: &ModelSpec,
    ) -> Result<Vec<Arc<dyn Plugin>>, String> {
        if spec.id == "no-builtins" {
            return Err("this agent cannot have built-ins".into());
        }
        let mut list = vec![
            plugin("loop_actions", &[]).arc(),
            plugin("stop_conditions", &[]).arc(),
        ];
        if spec.context_policy.is_some() {
            list.push(plugin("context_transform", &[]).arc());
            list.push(plugin("compaction", &[]).arc());
        }
        Ok(list)
    }
}

/// Delegate tools named `delegate_<agent>`; refuses delegates whose id starts with `bad`.
pub struct TestDelegates;

impl DelegateToolFactory for TestDelegates {
    fn delegate_tool(
        &self,
        _parent: &AgentSpec,
        delegate: &AgentSpec,
    ) -> Result<Arc<dyn Tool>, String> {
        if delegate.id.starts_with("bad") {
            return Err(format!("cannot delegate to {}", delegate.id));
        }
        Ok(echo(&format!("delegate_{}", delegate.id)))
    }
}

/// A runtime-free backend for `echo://` endpoints: answers with the last user message.
pub struct EchoBackend;

#[async_trait]
impl ExecutionBackend for EchoBackend {
    fn id(&self) -> &str {
        "echo"
    }
    fn claims(&self, endpoint: &EndpointSpec) -> bool {
        endpoint.url.starts_with("echo://")
    }
    async fn run(
        &self,
        agent: &AgentSpec,
        request: BackendRequest,
        sink: &dyn EventSink,
    ) -> Result<BackendOutcome, BackendError> {
        let response = request.messages.last().map(|m| m.text());
        sink.emit(&AgentEvent::RunStart {
            thread_id: request.thread_id.clone(),
            run_id: request.run_id.clone(),
            agent_id: agent.id.as_str().into(),
            parent_run_id: None,
            resumed: false,
        });
        sink.emit(&AgentEvent::RunFinish {
            thread_id: request.thread_id,
            run_id: request.run_id,
            termination: Box::new(TerminationReason::NaturalEnd),
            response: response.clone(),
            usage: Box::default(),
        });
        Ok(BackendOutcome {
            termination: TerminationReason::NaturalEnd,
            response,
            usage: TokenUsage::default(),
            waiting: None,
        })
    }
}

pub fn scripted(turns: Vec<ScriptTurn>) -> Arc<ScriptedExecutor> {
    Arc::new(ScriptedExecutor::from_turns(turns).expect("valid script"))
}

/// Registries with one model `m` on provider `p`.
pub fn base() -> Registries {
    Registries::new()
        .with_model(ModelSpec::new("m", "p", "upstream-m").with_context_window(8000))
        .with_provider("p", scripted(vec![ScriptTurn::text("hi")]))
}

pub fn resolver(registries: Registries) -> Resolver {
    Resolver::new(Arc::new(registries), Arc::new(TestBuiltins))
        .with_delegate_factory(Arc::new(TestDelegates))
        .with_backend(Arc::new(EchoBackend))
}
