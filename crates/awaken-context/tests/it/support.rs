//! The harness: the context plugins in a phase engine without the agent loop, a test
//! estimator that counts characters, history builders and a renderer of requests.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use awaken_context::{
    ContextConfig, ContextPlugins, Summarizer, SummaryError, SummaryRequest, TokenEstimator,
    is_omission_marker,
};
use awaken_event::{
    History, InferenceResponse, Message, Role, RunId, StopReason, ThreadId, TokenUsage, ToolCall,
    ToolCallId, ToolDescriptor, ToolResult,
};
use awaken_llm::InferenceRequest;
use awaken_phase::{Phase, PhaseContext, PhaseEngine, PhaseReport, RunIdentity};
use awaken_plugin::{ExecutionEnv, Plugin, TokenCounts, TransformContext, TransformFailure};
use awaken_state::{StateCommand, StateKey, StateStore};
use serde_json::json;

/// One token per character of everything the model reads: text and JSON content, tool call
/// names and argument text, tool names, descriptions and schemas, the system prompt.
pub struct CharEstimator;

pub fn chars(message: &Message) -> u64 {
    let mut n = message.content_as_text().chars().count();
    for call in message.tool_calls.iter() {
        n += call.name.chars().count() + call.arguments.to_string().chars().count();
    }
    n as u64
}

impl TokenEstimator for CharEstimator {
    fn message_tokens(&self, message: &Message) -> u64 {
        chars(message)
    }
    fn tool_tokens(&self, tool: &ToolDescriptor) -> u64 {
        (tool.name.chars().count()
            + tool.description.chars().count()
            + tool.parameters.to_string().chars().count()) as u64
    }
    fn system_prompt_tokens(&self, prompt: &str) -> u64 {
        prompt.chars().count() as u64
    }
}

/// [`CharEstimator`] that also counts the messages it was asked about (markers and summaries
/// excluded).
#[derive(Default)]
pub struct CountingEstimator(pub AtomicUsize);

impl TokenEstimator for CountingEstimator {
    fn message_tokens(&self, message: &Message) -> u64 {
        if message.role != Role::System {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        chars(message)
    }
    fn tool_tokens(&self, tool: &ToolDescriptor) -> u64 {
        CharEstimator.tool_tokens(tool)
    }
    fn system_prompt_tokens(&self, prompt: &str) -> u64 {
        CharEstimator.system_prompt_tokens(prompt)
    }
}

/// The test's own count of a request, by [`CharEstimator`].
pub fn request_chars(request: &InferenceRequest) -> u64 {
    let est = CharEstimator;
    request
        .system_prompt
        .as_deref()
        .map_or(0, |p| est.system_prompt_tokens(p))
        + request
            .tools
            .iter()
            .map(|t| est.tool_tokens(t))
            .sum::<u64>()
        + request.messages.iter().map(chars).sum::<u64>()
}

pub fn user(text: &str) -> Message {
    Message::user(text)
}

pub fn id(s: &str) -> ToolCallId {
    ToolCallId::new(s).expect("valid id")
}

/// An assistant message calling `calls` (ids) of `lookup` with `{"q": id}`.
pub fn calls(ids: &[&str]) -> Message {
    Message::assistant_with_calls(
        "",
        ids.iter()
            .map(|c| ToolCall::new(id(c), "lookup", json!({ "q": c })))
            .collect(),
    )
}

pub fn result(call: &str, text: &str) -> Message {
    Message::tool(id(call), &ToolResult::success(json!(text)))
}

/// A tool-call step: the assistant's call and its result.
pub fn step(call: &str, text: &str) -> [Message; 2] {
    [calls(&[call]), result(call, text)]
}

pub fn tool() -> ToolDescriptor {
    ToolDescriptor::new("lookup", "Looks things up")
}

/// Renders a request's messages, one per line.
pub fn render(request: &InferenceRequest) -> String {
    let mut out = String::new();
    for m in request.messages.iter() {
        let line = match m.role {
            Role::System => format!("system: {}", m.text()),
            Role::User => format!("user: {}", m.text()),
            Role::Assistant if !m.tool_calls.is_empty() => format!(
                "assistant: calls {}",
                m.tool_calls
                    .iter()
                    .map(|c| c.id.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Role::Assistant => format!("assistant: {}", m.text()),
            Role::Tool => format!(
                "tool {}: {}",
                m.tool_call_id
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                m.content_as_text()
            ),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Checks that no call is separated from its result: every result follows its call and
/// every call has its result.
pub fn assert_pairs(messages: &[Message]) {
    let mut open: HashSet<ToolCallId> = HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        if let Some(call) = &m.tool_call_id {
            assert!(
                open.remove(call),
                "result {call} at {i} has no call before it"
            );
        }
        for c in m.tool_calls.iter() {
            open.insert(c.id.clone());
        }
    }
    assert!(open.is_empty(), "calls without results: {open:?}");
}

/// Whether the request carries an omission marker.
pub fn has_marker(request: &InferenceRequest) -> bool {
    request.messages.iter().any(is_omission_marker)
}

/// The context plugins inside a phase engine.
pub struct Harness {
    pub env: ExecutionEnv,
    pub engine: PhaseEngine,
    pub identity: Arc<RunIdentity>,
    pub system_prompt: String,
    pub tools: Vec<ToolDescriptor>,
}

impl Harness {
    pub fn new(plugins: ContextPlugins) -> Self {
        let plugins: Vec<Arc<dyn Plugin>> = plugins.into_plugins().expect("plugins");
        let env = ExecutionEnv::from_plugins(&[], &plugins, &[]).expect("env");
        let store = Arc::new(StateStore::new(env.keys().clone()));
        let engine = PhaseEngine::new(store, env.phase_env().clone());
        Self {
            env,
            engine,
            identity: Arc::new(RunIdentity {
                thread_id: ThreadId::new("thread").expect("id"),
                run_id: RunId::new("run-1").expect("id"),
                agent_id: "agent".into(),
                profile_id: None,
            }),
            system_prompt: "Be brief.".into(),
            tools: vec![tool()],
        }
    }

    /// The harness for `config` with the character estimator.
    pub fn chars(config: ContextConfig) -> Self {
        Self::new(ContextPlugins::new(config).with_estimator(Arc::new(CharEstimator)))
    }

    /// The request the runtime would build from `messages`.
    pub fn request(&self, messages: &History) -> InferenceRequest {
        InferenceRequest::new("model", messages.clone())
            .with_tools(self.tools.clone())
            .with_system_prompt(self.system_prompt.clone())
    }

    /// Runs the transforms on the request for `messages` at `step`.
    pub fn transform(
        &self,
        messages: &History,
        step: u32,
    ) -> Result<InferenceRequest, TransformFailure> {
        let snapshot = self.engine.store().snapshot();
        let ctx = TransformContext {
            snapshot: &snapshot,
            run: &self.identity,
            step,
            tokens: TokenCounts::default(),
        };
        awaken_plugin::apply_transforms(self.env.transforms(), self.request(messages), &ctx)
    }

    fn ctx(&self, phase: Phase, messages: &History, step: u32) -> PhaseContext {
        PhaseContext::new(phase, self.engine.store().snapshot(), self.identity.clone())
            .with_messages(messages.clone())
            .with_step(step)
    }

    /// Runs `BeforeInference` (compaction) over `messages`.
    pub async fn before_inference(&self, messages: &History, step: u32) -> PhaseReport {
        self.engine
            .run_phase(&self.ctx(Phase::BeforeInference, messages, step))
            .await
            .expect("phase")
    }

    /// Runs `AfterInference` with a response that reports `input_tokens`.
    pub async fn after_inference(&self, messages: &History, step: u32, input_tokens: u64) {
        let response = InferenceResponse {
            message: Message::assistant("ok"),
            usage: TokenUsage {
                input_tokens,
                output_tokens: 1,
                ..TokenUsage::default()
            },
            stop_reason: StopReason::EndTurn,
        };
        self.engine
            .run_phase(
                &self
                    .ctx(Phase::AfterInference, messages, step)
                    .with_response(Arc::new(response)),
            )
            .await
            .expect("phase");
    }

    /// The value of key `K`.
    pub fn get<K: StateKey>(&self) -> K::Value {
        self.engine
            .store()
            .snapshot()
            .get::<K>()
            .cloned()
            .expect("registered key")
    }

    /// Submits a command (for instance, an action scheduled by hand).
    pub async fn submit(&self, cmd: StateCommand) {
        self.engine.submit_command(cmd).await.expect("submit");
    }
}

/// A summariser that answers `S(first..last)` (1-based message numbers, merged with the
/// previous summary) and records each call's range, or fails when told to.
#[derive(Default)]
pub struct ScriptedSummarizer {
    pub calls: Mutex<Vec<(usize, usize)>>,
    pub fail: Mutex<bool>,
}

impl ScriptedSummarizer {
    pub fn calls(&self) -> Vec<(usize, usize)> {
        self.calls.lock().expect("calls").clone()
    }
}

#[async_trait]
impl Summarizer for ScriptedSummarizer {
    async fn summarize(&self, request: SummaryRequest<'_>) -> Result<String, SummaryError> {
        let range = (
            request.first_index,
            request.first_index + request.messages.len(),
        );
        self.calls.lock().expect("calls").push(range);
        if *self.fail.lock().expect("fail") {
            return Err(SummaryError::Other {
                message: "the summary model is down".into(),
            });
        }
        Ok(match request.previous {
            Some(p) => format!("{p}+S({}..{})", range.0, range.1),
            None => format!("S({}..{})", range.0, range.1),
        })
    }
}
