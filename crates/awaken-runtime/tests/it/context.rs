//! Context management in real runs: the built-in context plugins, added because the agent sets
//! a `context_policy`, on long scripted runs.

use std::collections::HashSet;
use std::sync::Arc;

use awaken_context::{CompactionState, TokenEstimator, is_omission_marker, is_summary_message};
use awaken_event::{
    AgentEvent, Message, TerminationReason, ThreadId, ToolCall, ToolCallId, ToolDescriptor,
    ToolResult, VecSink, check_activation,
};
use awaken_llm::{InferenceRequest, ScriptTurn, ScriptedExecutor};
use awaken_runtime::{AgentRuntime, RunActivation, SequentialIds};
use awaken_spec::{AgentSpec, ContextPolicy, ModelSpec};
use awaken_tool::Tool;
use serde_json::json;

use crate::support::Echo;

/// The test's estimator: one token per character of everything the model reads (text and
/// JSON content, tool call names and argument text, tool names, descriptions and schemas,
/// the system prompt), so the test counts exactly what the plugin counts.
struct Chars;

fn message_chars(m: &Message) -> u64 {
    let mut n = m.content_as_text().chars().count();
    for call in m.tool_calls.iter() {
        n += call.name.chars().count() + call.arguments.to_string().chars().count();
    }
    n as u64
}

fn tool_chars(t: &ToolDescriptor) -> u64 {
    (t.name.chars().count()
        + t.description.chars().count()
        + t.parameters.to_string().chars().count()) as u64
}

impl TokenEstimator for Chars {
    fn message_tokens(&self, message: &Message) -> u64 {
        message_chars(message)
    }
    fn tool_tokens(&self, tool: &ToolDescriptor) -> u64 {
        tool_chars(tool)
    }
    fn system_prompt_tokens(&self, prompt: &str) -> u64 {
        prompt.chars().count() as u64
    }
}

/// The test's own count of a request.
fn size(request: &InferenceRequest) -> u64 {
    request
        .system_prompt
        .as_deref()
        .map_or(0, |p| p.chars().count() as u64)
        + request.tools.iter().map(tool_chars).sum::<u64>()
        + request.messages.iter().map(message_chars).sum::<u64>()
}

/// No result without its call before it, no call without its result.
fn splits_no_pair(messages: &[Message]) -> bool {
    let mut open: HashSet<&ToolCallId> = HashSet::new();
    for m in messages {
        if let Some(id) = &m.tool_call_id
            && !open.remove(id)
        {
            return false;
        }
        open.extend(m.tool_calls.iter().map(|c| &c.id));
    }
    open.is_empty()
}

const SYSTEM: &str = "Be brief.";
const USER: &str = "Start.";

fn args(step: usize) -> serde_json::Value {
    json!({ "text": format!("step {step:04}") })
}

/// One tool step's messages as the loop writes them (the ids do not count).
fn step_size(step: usize) -> u64 {
    let id = ToolCallId::new("x").expect("id");
    let call =
        Message::assistant_with_calls("", vec![ToolCall::new(id.clone(), "echo", args(step))]);
    let result = Message::tool(
        id,
        &ToolResult::success(json!({ "echoed": format!("step {step:04}") })),
    );
    message_chars(&call) + message_chars(&result)
}

struct Run {
    executor: Arc<ScriptedExecutor>,
    runtime: AgentRuntime,
    termination: TerminationReason,
    events: Vec<AgentEvent>,
}

async fn run(
    spec: AgentSpec,
    turns: Vec<ScriptTurn>,
    extra: Vec<(ModelSpec, Arc<ScriptedExecutor>)>,
) -> Run {
    let executor = Arc::new(ScriptedExecutor::from_turns(turns).expect("script"));
    let mut builder = AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "scripted", "upstream-model"))
        .with_provider("scripted", executor.clone())
        .with_tool(Arc::new(Echo))
        .with_token_estimator(Arc::new(Chars))
        .with_agent_spec(spec);
    for (model, exec) in extra {
        builder = builder
            .with_provider(model.provider.clone(), exec)
            .with_model(model);
    }
    let runtime = builder.build().expect("valid runtime");
    let sink = VecSink::new();
    let outcome = runtime
        .run(
            RunActivation::new(ThreadId::new("thread").expect("id"), "agent")
                .with_user_message(USER),
            &sink,
        )
        .await
        .expect("the run starts");
    let events = sink.events();
    check_activation(&events).expect("event grammar");
    Run {
        executor,
        runtime,
        termination: outcome.termination,
        events,
    }
}

fn echo_turns(steps: usize) -> Vec<ScriptTurn> {
    let mut turns: Vec<ScriptTurn> = (1..steps)
        .map(|i| ScriptTurn::tool_call("echo", args(i)))
        .collect();
    turns.push(ScriptTurn::text("done"));
    turns
}

/// 500 inferences, the last 451 of which need truncation: every request the provider got is
/// within the budget by the test's own count, keeps the system prompt and the user message,
/// carries the omission marker exactly when it was truncated, and splits no call from its
/// result.
#[tokio::test]
async fn a_500_step_run_is_truncated_from_step_50_and_every_request_fits() {
    const STEPS: usize = 500;
    // The request of step k holds the user message and k-1 tool steps; the budget is one
    // token short of step 50's.
    let fixed = SYSTEM.len() as u64 + tool_chars(&Echo.descriptor()) + USER.len() as u64;
    assert_eq!(step_size(1), step_size(STEPS), "steps are the same size");
    let budget = fixed + 49 * step_size(1) - 1;
    let mut spec = AgentSpec::new("agent", "model")
        .with_system_prompt(SYSTEM)
        .with_context_policy(ContextPolicy {
            budget_tokens: Some(budget),
            ..ContextPolicy::default()
        });
    spec.max_rounds = STEPS as u32;
    let run = run(spec, echo_turns(STEPS), Vec::new()).await;
    assert_eq!(run.termination, TerminationReason::NaturalEnd);
    let requests = run.executor.requests();
    assert_eq!(requests.len(), STEPS);
    assert_eq!(
        size(&requests[1]) - size(&requests[0]),
        step_size(1),
        "the test counts what is sent"
    );
    let mut truncated = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        let step = i + 1;
        let full = 1 + 2 * (step - 1);
        let real: Vec<&Message> = request
            .messages
            .iter()
            .filter(|m| !is_omission_marker(m))
            .collect();
        let was_truncated = real.len() < full;
        assert!(
            size(request) <= budget,
            "step {step}: {} > {budget}",
            size(request)
        );
        assert_eq!(request.system_prompt.as_deref(), Some(SYSTEM));
        assert!(
            request.messages.iter().any(|m| m.text() == USER),
            "step {step}"
        );
        assert_eq!(
            request
                .messages
                .iter()
                .filter(|m| is_omission_marker(m))
                .count(),
            usize::from(was_truncated),
            "step {step}"
        );
        assert!(splits_no_pair(&request.messages), "step {step}");
        if was_truncated {
            truncated.push(step);
        }
    }
    assert_eq!(truncated.len(), 451);
    assert_eq!(truncated.first(), Some(&50));
    // The originals stay in the store.
    let history = run
        .runtime
        .history(&ThreadId::new("thread").expect("id"))
        .await
        .expect("history");
    assert_eq!(history.len(), 1 + 2 * (STEPS - 1) + 1);
}

/// With a compaction threshold, the run's summary model summarises the older part once per
/// range, the summary is committed to the thread's state, later requests carry it instead of
/// the messages it covers, and the store keeps every message.
#[tokio::test]
async fn compaction_in_a_run_commits_each_summary_once_and_keeps_the_originals() {
    const STEPS: usize = 60;
    let summaries = Arc::new(
        ScriptedExecutor::from_turns((1..=10).map(|i| ScriptTurn::text(format!("summary {i}"))))
            .expect("script"),
    );
    let mut spec = AgentSpec::new("agent", "model")
        .with_system_prompt(SYSTEM)
        .with_context_policy(ContextPolicy {
            budget_tokens: Some(1_500),
            compaction_threshold: Some(0.5),
            summary_model: Some("summarizer".into()),
            ..ContextPolicy::default()
        });
    spec.max_rounds = STEPS as u32;
    let summarizer = ModelSpec::new("summarizer", "summary-provider", "small-model");
    let run = run(
        spec,
        echo_turns(STEPS),
        vec![(summarizer, summaries.clone())],
    )
    .await;
    assert_eq!(run.termination, TerminationReason::NaturalEnd);
    let calls = summaries.requests();
    assert!(calls.len() >= 2, "{} summary calls", calls.len());
    assert!(
        calls
            .iter()
            .all(|r| &*r.upstream_model == "small-model" && r.tools.is_empty())
    );
    let thread = ThreadId::new("thread").expect("id");
    let checkpoint = run
        .runtime
        .store()
        .load_checkpoint(&thread)
        .await
        .expect("store")
        .expect("thread");
    let state: CompactionState =
        serde_json::from_value(checkpoint.thread_state.values["awaken.context.compaction"].clone())
            .expect("compaction state");
    // One commit per summary call: no range was summarised twice.
    assert_eq!(state.summaries as usize, calls.len());
    assert_eq!(
        state.summary.as_deref(),
        Some(format!("summary {}", calls.len()).as_str())
    );
    assert_eq!(state.fallbacks, 0);
    assert_eq!(checkpoint.messages.len(), 1 + 2 * (STEPS - 1) + 1);
    // Every request after the first compaction leads with a summary and never exceeds the
    // budget.
    let requests = run.executor.requests();
    let first = requests
        .iter()
        .position(|r| r.messages.first().is_some_and(is_summary_message))
        .expect("a request with a summary");
    assert!(
        requests[first..]
            .iter()
            .all(|r| r.messages.first().is_some_and(is_summary_message))
    );
    assert!(
        requests
            .iter()
            .all(|r| size(r) <= 1_500 && splits_no_pair(&r.messages))
    );
}

/// A summary call that fails falls back to truncation, and the run says so once per failure.
#[tokio::test]
async fn a_failed_summary_is_reported_as_a_warning_and_the_run_goes_on() {
    const STEPS: usize = 30;
    let failing = Arc::new(
        ScriptedExecutor::from_turns((0..10).map(|_| {
            ScriptTurn::error(awaken_llm::ScriptedError::new(
                awaken_llm::ScriptedErrorKind::InvalidRequest,
            ))
        }))
        .expect("script"),
    );
    let mut spec = AgentSpec::new("agent", "model")
        .with_system_prompt(SYSTEM)
        .with_context_policy(ContextPolicy {
            budget_tokens: Some(1_500),
            compaction_threshold: Some(0.5),
            summary_model: Some("summarizer".into()),
            ..ContextPolicy::default()
        });
    spec.max_rounds = STEPS as u32;
    let summarizer = ModelSpec::new("summarizer", "summary-provider", "small-model");
    let run = run(spec, echo_turns(STEPS), vec![(summarizer, failing.clone())]).await;
    assert_eq!(run.termination, TerminationReason::NaturalEnd);
    let warnings: Vec<&AgentEvent> = run
        .events
        .iter()
        .filter(|e| {
            matches!(
                e,
                AgentEvent::Warning {
                    kind: awaken_event::WarningKind::CompactionFellBack,
                    ..
                }
            )
        })
        .collect();
    assert!(!failing.requests().is_empty(), "the summariser was asked");
    assert_eq!(
        warnings.len(),
        failing.requests().len(),
        "one warning per failed summary"
    );
    // Every request still fits: truncation took over.
    assert!(
        run.executor
            .requests()
            .iter()
            .all(|r| size(r) <= 1_500 && splits_no_pair(&r.messages))
    );
}

/// The context plugins join the built-ins only when the agent sets a context policy, and a
/// policy that cannot work fails the build naming its field.
#[test]
fn the_context_plugins_come_with_a_policy_and_its_errors_name_the_field() {
    let runtime = |spec: AgentSpec| {
        AgentRuntime::builder()
            .with_model(
                ModelSpec::new("model", "scripted", "upstream-model").with_context_window(8_000),
            )
            .with_provider(
                "scripted",
                Arc::new(ScriptedExecutor::from_turns([]).expect("script")),
            )
            .with_agent_spec(spec)
            .build()
    };
    let plain = runtime(AgentSpec::new("agent", "model")).expect("valid");
    let managed = runtime(
        AgentSpec::new("agent", "model").with_context_policy(ContextPolicy {
            compaction_threshold: Some(0.8),
            ..ContextPolicy::default()
        }),
    )
    .expect("valid");
    let ids = |rt: &AgentRuntime| {
        rt.resolver()
            .resolve("agent")
            .expect("resolves")
            .env
            .plugin_ids()
            .join(",")
    };
    assert_eq!(ids(&plain), "awaken.loop_actions,awaken.stop_conditions");
    assert_eq!(
        ids(&managed),
        "awaken.loop_actions,awaken.stop_conditions,awaken.context_transform,awaken.compaction"
    );
    let Err(e) = runtime(
        AgentSpec::new("agent", "model").with_context_policy(ContextPolicy {
            compaction_threshold: Some(0.8),
            summary_model: Some("missing".into()),
            ..ContextPolicy::default()
        }),
    ) else {
        panic!("an unknown summary model must fail the build");
    };
    assert!(
        e.to_string()
            .contains("context_policy.summary_model: model `missing` is not registered"),
        "{e}"
    );
}

/// A request whose minimum is over the budget is never sent: the run ends with the
/// transform's error, naming both sizes.
#[tokio::test]
async fn a_request_that_cannot_fit_ends_the_run_unsent() {
    let spec = AgentSpec::new("agent", "model")
        .with_system_prompt(SYSTEM)
        .with_context_policy(ContextPolicy {
            budget_tokens: Some(20),
            ..ContextPolicy::default()
        });
    let run = run(spec, vec![ScriptTurn::text("never")], Vec::new()).await;
    let required = SYSTEM.len() as u64 + tool_chars(&Echo.descriptor()) + USER.len() as u64;
    assert_eq!(
        run.termination,
        TerminationReason::error(format!(
            "request transform `context_window` of plugin `awaken.context_transform` failed: the request needs at least {required} tokens but the budget is 20"
        ))
    );
    assert!(run.executor.requests().is_empty(), "nothing was sent");
}
