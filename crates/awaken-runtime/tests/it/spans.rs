//! The runtime's spans follow the OpenTelemetry GenAI conventions: `invoke_agent` per
//! activation, `chat` per inference and `execute_tool` per call, with their attributes, and no
//! message content in any of them.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, Once};

use awaken_event::{AgentEvent, ThreadId, VecSink};
use awaken_llm::{
    BreakerPolicy, ModelPool, PoolMember, ScriptToolCall, ScriptTurn, ScriptedError,
    ScriptedErrorKind, ScriptedExecutor,
};
use awaken_runtime::{AgentRuntime, RunActivation, SequentialIds};
use awaken_spec::{AgentSpec, ModelSpec};
use serde_json::json;
use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

use crate::support::*;

/// A span as the layer saw it: its name, its parent's name and its fields, in creation order.
#[derive(Debug)]
struct Seen {
    id: u64,
    name: &'static str,
    parent: Option<&'static str>,
    fields: BTreeMap<String, String>,
}

/// Keeps every span created while it is the default subscriber.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Seen>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = ctx.span(id).and_then(|s| s.parent()).map(|p| p.name());
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.0.lock().expect("spans").push(Seen {
            id: id.into_u64(),
            name: attrs.metadata().name(),
            parent,
            fields,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut spans = self.0.lock().expect("spans");
        if let Some(seen) = spans.iter_mut().rev().find(|s| s.id == id.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }
}

impl Spans {
    /// One line per span: name, parent, then its fields.
    fn render(&self) -> String {
        let mut out = String::new();
        for s in self.0.lock().expect("spans").iter() {
            let _ = write!(out, "{} <- {}", s.name, s.parent.unwrap_or("-"));
            for (k, v) in &s.fields {
                let _ = write!(out, " {k}={v}");
            }
            out.push('\n');
        }
        out
    }

    /// Every field value of every span.
    fn values(&self) -> Vec<String> {
        let spans = self.0.lock().expect("spans");
        spans
            .iter()
            .flat_map(|s| s.fields.values().cloned())
            .collect()
    }
}

thread_local! {
    /// The spans of the test running on this thread, when it collects them.
    static ACTIVE: RefCell<Option<Spans>> = const { RefCell::new(None) };
}

/// Hands each span to the collecting test of the thread it is made on. One subscriber for the
/// whole test binary: a per-test (scoped) subscriber races with the tests running beside it,
/// which can leave a span's call site cached as disabled.
struct Router;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Router {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(spans) = ACTIVE.with(|a| a.borrow().clone()) {
            spans.on_new_span(attrs, id, ctx);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(spans) = ACTIVE.with(|a| a.borrow().clone()) {
            spans.on_record(id, values, ctx);
        }
    }
}

/// Collects the spans this (current-thread) test makes until the guard is dropped.
fn collect() -> (Spans, impl Drop) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        tracing::subscriber::set_global_default(Registry::default().with(Router))
            .expect("no other global subscriber in this test binary");
    });
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            ACTIVE.with(|a| *a.borrow_mut() = None);
        }
    }
    // A call site first reached by another test while the subscriber was being installed may
    // still be cached as disabled: asked again, every call site is enabled.
    tracing::callsite::rebuild_interest_cache();
    let spans = Spans::default();
    ACTIVE.with(|a| *a.borrow_mut() = Some(spans.clone()));
    (spans, Stop)
}

/// Runs `scenario`, collecting its spans.
async fn traced(scenario: Scenario) -> (Outcome, Spans) {
    let (spans, _collecting) = collect();
    let out = scenario.run().await;
    (out, spans)
}

#[tokio::test]
async fn a_run_with_a_tool_call_has_an_agent_span_chat_spans_and_a_tool_span() {
    let (out, spans) = traced(Scenario::new(vec![
        ScriptTurn::text("").with_tool_call(
            ScriptToolCall::new("echo", json!({"text": "secret words"})).with_id("c1"),
        ),
        ScriptTurn::text("all done, secretly"),
    ]))
    .await;
    assert_eq!(out.outcome.steps, 2);
    expect_test::expect![[r#"
        invoke_agent <- - awaken.activation=run gen_ai.agent.name=agent gen_ai.conversation.id=thread gen_ai.operation.name=invoke_agent otel.name=invoke_agent agent run_id=run-1
        chat <- invoke_agent gen_ai.conversation.id=thread gen_ai.operation.name=chat gen_ai.provider.name=scripted gen_ai.request.model=upstream-model gen_ai.response.finish_reasons=tool_calls gen_ai.response.model=upstream-model gen_ai.usage.input_tokens=0 gen_ai.usage.output_tokens=0 otel.name=chat upstream-model
        execute_tool <- invoke_agent gen_ai.operation.name=execute_tool gen_ai.tool.call.id=c1 gen_ai.tool.name=echo otel.name=execute_tool echo
        chat <- invoke_agent gen_ai.conversation.id=thread gen_ai.operation.name=chat gen_ai.provider.name=scripted gen_ai.request.model=upstream-model gen_ai.response.finish_reasons=stop gen_ai.response.model=upstream-model gen_ai.usage.input_tokens=0 gen_ai.usage.output_tokens=0 otel.name=chat upstream-model
    "#]]
    .assert_eq(&spans.render());
    // Message content (the user's, the model's, a tool's arguments) is in no attribute.
    for value in spans.values() {
        for content in ["hi", "secret", "Be brief"] {
            assert!(
                !value.contains(content),
                "{value:?} carries message content"
            );
        }
    }
}

#[tokio::test]
async fn a_failed_inference_records_its_error_type() {
    // A script with no turn: the first inference fails, permanently.
    let (_out, spans) = traced(Scenario::new(Vec::new())).await;
    let rendered = spans.render();
    let chat = rendered
        .lines()
        .find(|l| l.starts_with("chat "))
        .unwrap_or_else(|| panic!("no chat span in:\n{rendered}"));
    assert!(chat.contains("error.type=permanent"), "{chat}");
    assert!(!chat.contains("gen_ai.usage"), "{chat}");
}

#[tokio::test]
async fn a_step_answered_by_a_pool_member_records_that_member() {
    // Two members; the one the thread's key ranks first is rate limited, the other answers.
    let members = |first: ScriptTurn, second: ScriptTurn| {
        let a = ScriptedExecutor::from_turns(vec![first]).expect("script");
        let b = ScriptedExecutor::from_turns(vec![second]).expect("script");
        vec![
            PoolMember::new("a", Arc::new(a), "model-a"),
            PoolMember::new("b", Arc::new(b), "model-b"),
        ]
    };
    let probe = ModelPool::new(
        "pool",
        members(ScriptTurn::text(""), ScriptTurn::text("")),
        BreakerPolicy::default(),
    )
    .expect("pool");
    let order: Vec<String> = probe
        .member_order(Some("thread"))
        .into_iter()
        .map(str::to_owned)
        .collect();
    let limited = ScriptTurn::error(ScriptedError::new(ScriptedErrorKind::RateLimited));
    let answer = ScriptTurn::text("from the second member");
    let (a, b) = if order[0] == "a" {
        (limited, answer)
    } else {
        (answer, limited)
    };
    let pool = ModelPool::new("pool", members(a, b), BreakerPolicy::default()).expect("pool");
    let runtime = AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "pooled", "pool-model"))
        .with_provider("pooled", Arc::new(pool))
        .with_agent_spec(AgentSpec::new("agent", "model"))
        .build()
        .expect("runtime");
    let (spans, _collecting) = collect();
    let sink = VecSink::new();
    let activation =
        RunActivation::new(ThreadId::new("thread").expect("id"), "agent").with_user_message("hi");
    runtime
        .run(activation, &sink)
        .await
        .expect("the run starts");
    let answered = format!("model-{}", order[1]);
    let events = sink.events();
    let models: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::InferenceComplete { model, .. } => Some(&**model),
            _ => None,
        })
        .collect();
    assert_eq!(models, [answered.as_str()]);
    let rendered = spans.render();
    assert!(
        rendered.contains(&format!("gen_ai.response.model={answered}")),
        "{rendered}"
    );
    assert!(
        rendered.contains("gen_ai.request.model=pool-model"),
        "{rendered}"
    );
}

/// The fields of the `chat` spans of a run with a tool call, with `with_span_content(content)`.
async fn chat_fields(content: bool) -> Vec<BTreeMap<String, String>> {
    let executor = ScriptedExecutor::from_turns(vec![
        ScriptTurn::text("").with_tool_call(
            ScriptToolCall::new("echo", json!({"text": "secret words"})).with_id("c1"),
        ),
        ScriptTurn::text("all done, secretly"),
    ])
    .expect("script");
    let runtime = AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "scripted", "upstream-model"))
        .with_provider("scripted", Arc::new(executor))
        .with_tool(Arc::new(Echo))
        .with_agent_spec(AgentSpec::new("agent", "model").with_system_prompt("Be brief."))
        .with_span_content(content)
        .build()
        .expect("runtime");
    let (spans, _collecting) = collect();
    let activation =
        RunActivation::new(ThreadId::new("thread").expect("id"), "agent").with_user_message("hi");
    let out = runtime
        .run_to_completion(activation)
        .await
        .expect("the run starts");
    assert_eq!(out.steps, 2);
    let seen = spans.0.lock().expect("spans");
    seen.iter()
        .filter(|s| s.name == "chat")
        .map(|s| s.fields.clone())
        .collect()
}

#[tokio::test]
async fn message_content_is_on_chat_spans_only_with_the_opt_in() {
    let keys = [
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
    ];
    for fields in chat_fields(false).await {
        for key in keys {
            assert!(
                !fields.contains_key(key),
                "{key} recorded without the opt-in"
            );
        }
    }
    let chats = chat_fields(true).await;
    assert_eq!(chats.len(), 2);
    let mut out = String::new();
    for (i, fields) in chats.iter().enumerate() {
        for key in keys {
            let _ = writeln!(out, "chat {i} {key}: {}", fields[key]);
        }
    }
    expect_test::expect![[r#"
        chat 0 gen_ai.input.messages: [{"parts":[{"content":"hi","type":"text"}],"role":"user"}]
        chat 0 gen_ai.output.messages: [{"finish_reason":"tool_calls","parts":[{"arguments":{"text":"secret words"},"id":"c1","name":"echo","type":"tool_call"}],"role":"assistant"}]
        chat 0 gen_ai.system_instructions: [{"content":"Be brief.","type":"text"}]
        chat 1 gen_ai.input.messages: [{"parts":[{"content":"hi","type":"text"}],"role":"user"},{"parts":[{"arguments":{"text":"secret words"},"id":"c1","name":"echo","type":"tool_call"}],"role":"assistant"},{"parts":[{"id":"c1","response":{"echoed":"secret words"},"type":"tool_call_response"}],"role":"tool"}]
        chat 1 gen_ai.output.messages: [{"finish_reason":"stop","parts":[{"content":"all done, secretly","type":"text"}],"role":"assistant"}]
        chat 1 gen_ai.system_instructions: [{"content":"Be brief.","type":"text"}]
    "#]]
    .assert_eq(&out);
}
