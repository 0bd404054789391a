//! The scenario helper: a scripted model, tools and plugins in; the run's events rendered as
//! text out (and checked against the event grammar).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use awaken_event::{AgentEvent, ThreadId, ToolDescriptor, VecSink, check_activation};
use awaken_llm::{ScriptTurn, ScriptedExecutor};
use awaken_plugin::Plugin;
use awaken_runtime::{AgentRuntime, RunActivation, RunOutcome, SequentialIds};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};

/// `echo {"text": string}` → `{"echoed": text}`.
pub struct Echo;

#[async_trait]
impl Tool for Echo {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("echo", "Echo text").with_parameters(json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": false
        }))
    }
    async fn execute(&self, args: Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::success(json!({"echoed": args["text"]})))
    }
}

/// A tool that always fails.
pub struct Broken;

#[async_trait]
impl Tool for Broken {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("broken", "Always fails")
    }
    async fn execute(&self, _args: Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        Err(ToolError::Execution {
            message: "disk on fire".into(),
        })
    }
}

/// A shared log.
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn push(&self, s: impl Into<String>) {
        self.0.lock().expect("log").push(s.into());
    }
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().expect("log").clone()
    }
}

pub struct Scenario {
    pub spec: AgentSpec,
    pub turns: Vec<ScriptTurn>,
    pub tools: Vec<Arc<dyn Tool>>,
    pub plugins: Vec<Arc<dyn Plugin>>,
    pub activation: Option<Box<dyn FnOnce(RunActivation) -> RunActivation + Send>>,
}

pub struct Outcome {
    pub outcome: RunOutcome,
    pub events: Vec<AgentEvent>,
    pub executor: Arc<ScriptedExecutor>,
    pub runtime: AgentRuntime,
}

impl Scenario {
    pub fn new(turns: Vec<ScriptTurn>) -> Self {
        Self {
            spec: AgentSpec::new("agent", "model").with_system_prompt("Be brief."),
            turns,
            tools: vec![Arc::new(Echo), Arc::new(Broken)],
            plugins: Vec::new(),
            activation: None,
        }
    }

    pub fn spec(mut self, f: impl FnOnce(AgentSpec) -> AgentSpec) -> Self {
        self.spec = f(self.spec);
        self
    }

    pub fn plugin(mut self, p: Arc<dyn Plugin>) -> Self {
        self.spec = self.spec.with_plugin(p.manifest().id.clone());
        self.plugins.push(p);
        self
    }

    pub fn activation(
        mut self,
        f: impl FnOnce(RunActivation) -> RunActivation + Send + 'static,
    ) -> Self {
        self.activation = Some(Box::new(f));
        self
    }

    pub async fn run(self) -> Outcome {
        let executor = Arc::new(ScriptedExecutor::from_turns(self.turns).expect("valid script"));
        let mut builder = AgentRuntime::builder()
            .with_ids(Arc::new(SequentialIds::default()))
            .with_model(ModelSpec::new("model", "scripted", "upstream-model"))
            .with_provider("scripted", executor.clone())
            .with_agent_spec(self.spec);
        for t in self.tools {
            builder = builder.with_tool(t);
        }
        for p in self.plugins {
            builder = builder.with_plugin(p);
        }
        let runtime = builder.build().expect("valid runtime");
        let mut activation = RunActivation::new(ThreadId::new("thread").expect("id"), "agent")
            .with_user_message("hi");
        if let Some(f) = self.activation {
            activation = f(activation);
        }
        let sink = VecSink::new();
        let outcome = runtime
            .run(activation, &sink)
            .await
            .expect("the run starts");
        let events = sink.events();
        if let Err(v) = check_activation(&events) {
            panic!("event grammar violated: {v}\n{}", render(&events));
        }
        Outcome {
            outcome,
            events,
            executor,
            runtime,
        }
    }
}

/// One line per event, ids kept, noise (inference timings) left out.
pub fn render(events: &[AgentEvent]) -> String {
    let mut out = String::new();
    for e in events {
        let line = match e {
            AgentEvent::RunStart {
                run_id, resumed, ..
            } => format!("run_start {run_id} resumed={resumed}"),
            AgentEvent::RunFinish {
                termination,
                response,
                usage,
                ..
            } => {
                format!(
                    "run_finish {termination} response={response:?} tokens={}",
                    usage.total()
                )
            }
            AgentEvent::StepStart { step } => format!("step_start {step}"),
            AgentEvent::StepEnd { step } => format!("step_end {step}"),
            AgentEvent::TextDelta { delta } => format!("text {delta:?}"),
            AgentEvent::ToolCallStart { call_id, name } => format!("call_start {call_id} {name}"),
            AgentEvent::ToolCallArgsDelta { .. } => continue,
            AgentEvent::ToolCallReady {
                call_id, arguments, ..
            } => format!("call_ready {call_id} {arguments}"),
            AgentEvent::ToolCallDone {
                call_id,
                result,
                state,
            } => {
                format!("call_done {call_id} {state} {}", result.content)
            }
            AgentEvent::ToolCallSuspended { call_id, ticket } => {
                format!("call_suspended {call_id} {:?}", ticket.message)
            }
            AgentEvent::InferenceComplete { model, .. } => format!("inference {model}"),
            AgentEvent::ActionDeadLettered { action, reason, .. } => {
                format!("dead_letter {action}: {reason}")
            }
            AgentEvent::Warning { kind, detail } => format!("warning {kind:?}: {detail}"),
            AgentEvent::Error { message } => format!("error {message}"),
            other => other.type_name().to_owned(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}
