//! Scripted runs exported over OTLP/HTTP to the loopback receiver: the span tree (names from
//! `otel.name`, parents, attributes), a pool's failover as attempt spans under its `chat`,
//! the GenAI histograms, message content only with the runtime's opt-in, and no credential
//! in any exported byte.

use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{ThreadId, TokenUsage, ToolDescriptor};
use awaken_llm::openai::{OpenAiConfig, OpenAiExecutor};
use awaken_llm::{
    BreakerPolicy, ModelPool, PoolMember, ScriptToolCall, ScriptTurn, ScriptedExecutor,
};
use awaken_otel::{OtelConfig, OtelGuard};
use awaken_runtime::{AgentRuntime, RunActivation, SequentialIds};
use awaken_spec::{AgentSpec, ModelSpec};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{Layer, Registry};

use crate::llm::RateLimited;
use crate::receiver::{Receiver, attribute, render_tree};

/// The key of the rate-limited member's executor: it must reach that server and nothing
/// exported.
const API_KEY: &str = "sk-test-secret-123";

/// Words of each kind of message content: none may be exported without the opt-in.
const CONTENT: [&str; 4] = [
    "user-message-words",
    "system-prompt-words",
    "tool-argument-words",
    "answer-words",
];

/// `echo {"text": string}` → `{"echoed": text}`.
struct Echo;

#[async_trait]
impl Tool for Echo {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("echo", "Echo text").with_parameters(json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"]
        }))
    }
    async fn execute(&self, args: &Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::success(json!({"echoed": args["text"]})))
    }
}

fn usage(input_tokens: u64, output_tokens: u64) -> TokenUsage {
    TokenUsage {
        input_tokens,
        output_tokens,
        ..TokenUsage::default()
    }
}

/// A runtime whose agent `agent` runs on pool `pool-model`: member `limited` (an OpenAI
/// executor on `llm`, answered 429 every time) first, then the fallback member `scripted`,
/// which calls `echo` and then answers. Agent `failing` runs on a model whose script is empty
/// (its first inference fails).
fn runtime(llm: &RateLimited, content: bool) -> AgentRuntime {
    let limited = OpenAiExecutor::new(OpenAiConfig::new(&llm.base_url).with_api_key(API_KEY))
        .expect("executor");
    let scripted = ScriptedExecutor::from_turns(vec![
        ScriptTurn::text("")
            .with_tool_call(
                ScriptToolCall::new("echo", json!({"text": "tool-argument-words"})).with_id("c1"),
            )
            .with_usage(usage(12, 3)),
        ScriptTurn::text("answer-words").with_usage(usage(20, 5)),
    ])
    .expect("script");
    let pool = ModelPool::new(
        "pool",
        vec![
            PoolMember::new("limited", Arc::new(limited), "model-limited"),
            PoolMember::new("scripted", Arc::new(scripted), "model-scripted").fallback_only(),
        ],
        BreakerPolicy::default(),
    )
    .expect("pool");
    let empty = ScriptedExecutor::from_turns(Vec::new()).expect("script");
    AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_model(ModelSpec::new("model", "pooled", "pool-model"))
        .with_provider("pooled", Arc::new(pool))
        .with_model(ModelSpec::new("broken", "empty", "empty-model"))
        .with_provider("empty", Arc::new(empty))
        .with_tool(Arc::new(Echo))
        .with_agent_spec(AgentSpec::new("agent", "model").with_system_prompt("system-prompt-words"))
        .with_agent_spec(AgentSpec::new("failing", "broken"))
        .with_span_content(content)
        .build()
        .expect("runtime")
}

/// The export of `config` as the default subscriber (with the default filter, as the command
/// installs it)
/// while both agents run once; shut down before returning, so everything is received.
async fn export_runs(config: &OtelConfig, llm: &RateLimited, content: bool) {
    let (layer, guard): (_, OtelGuard) =
        awaken_otel::layer::<Registry>(config).expect("the export starts");
    let runtime = runtime(llm, content);
    {
        let subscriber = Registry::default().with(layer.with_filter(awaken_otel::default_filter()));
        let _default = tracing::subscriber::set_default(subscriber);
        // A call site first reached by a test beside this one while the subscriber was being
        // set may be cached as disabled: asked again, it is enabled for this thread.
        tracing::callsite::rebuild_interest_cache();
        let thread = ThreadId::new("thread").expect("id");
        let outcome = runtime
            .run_to_completion(
                RunActivation::new(thread, "agent").with_user_message("user-message-words"),
            )
            .await
            .expect("the run starts");
        assert_eq!(outcome.steps, 2);
        let thread = ThreadId::new("other").expect("id");
        // Its inference fails: the run ends with an error, recorded on its `chat` span.
        let _ = runtime
            .run_to_completion(RunActivation::new(thread, "failing").with_user_message("hi"))
            .await;
    }
    guard.shutdown().expect("the export ends cleanly");
}

/// A configuration for `receiver` from the variables, with a collector header.
fn config(receiver: &Receiver, protocol: &str) -> OtelConfig {
    let endpoint = receiver.endpoint.clone();
    let protocol = protocol.to_owned();
    OtelConfig::from_vars(move |name| match name {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(endpoint.clone()),
        "OTEL_EXPORTER_OTLP_PROTOCOL" => Some(protocol.clone()),
        "OTEL_EXPORTER_OTLP_HEADERS" => Some("x-collector-token=collector%20token".to_owned()),
        "OTEL_SERVICE_NAME" => Some("awaken-test".to_owned()),
        _ => None,
    })
    .expect("valid")
    .expect("an endpoint is set")
}

/// Fails when any byte the receiver got (bodies and headers) holds `needle`.
fn assert_nowhere(receiver: &Receiver, needle: &str) {
    for r in receiver.received() {
        let body = String::from_utf8_lossy(&r.body);
        assert!(!body.contains(needle), "{} body holds {needle:?}", r.path);
        assert!(
            !r.headers.contains(needle),
            "{} headers hold {needle:?}",
            r.path
        );
    }
}

#[tokio::test]
async fn a_run_with_a_tool_call_and_a_failover_exports_its_span_tree_and_metrics() {
    let receiver = Receiver::start();
    let llm = RateLimited::start().await;
    export_runs(&config(&receiver, "http/protobuf"), &llm, false).await;

    let spans = receiver.spans();
    // Event counts and the ids of the run vary with nothing here, but the conversation ids
    // are the threads, so every attribute is kept.
    expect_test::expect![[r#"
        invoke_agent agent {awaken.activation=run gen_ai.agent.name=agent gen_ai.conversation.id=thread gen_ai.operation.name=invoke_agent run_id=run-1}
          chat pool-model {gen_ai.conversation.id=thread gen_ai.operation.name=chat gen_ai.provider.name=pool gen_ai.request.model=pool-model gen_ai.response.finish_reasons=tool_calls gen_ai.response.model=model-scripted gen_ai.usage.input_tokens=12 gen_ai.usage.output_tokens=3}
            chat model-limited {awaken.pool.member=limited error.type=rate_limited gen_ai.operation.name=chat gen_ai.provider.name=openai gen_ai.request.model=model-limited}
            chat model-scripted {awaken.pool.member=scripted gen_ai.operation.name=chat gen_ai.provider.name=scripted gen_ai.request.model=model-scripted}
          execute_tool echo {gen_ai.operation.name=execute_tool gen_ai.tool.call.id=c1 gen_ai.tool.name=echo}
          chat pool-model {gen_ai.conversation.id=thread gen_ai.operation.name=chat gen_ai.provider.name=pool gen_ai.request.model=pool-model gen_ai.response.finish_reasons=stop gen_ai.response.model=model-scripted gen_ai.usage.input_tokens=20 gen_ai.usage.output_tokens=5}
            chat model-limited {awaken.pool.member=limited error.type=rate_limited gen_ai.operation.name=chat gen_ai.provider.name=openai gen_ai.request.model=model-limited}
            chat model-scripted {awaken.pool.member=scripted gen_ai.operation.name=chat gen_ai.provider.name=scripted gen_ai.request.model=model-scripted}
        invoke_agent failing {awaken.activation=run gen_ai.agent.name=failing gen_ai.conversation.id=other gen_ai.operation.name=invoke_agent run_id=run-2}
          chat empty-model {error.type=permanent gen_ai.conversation.id=other gen_ai.operation.name=chat gen_ai.provider.name=scripted gen_ai.request.model=empty-model}
    "#]]
    .assert_eq(&render_tree(&spans, &["otel.tracing_event_count"]));
    // The default filter keeps log events (the pool's warning about the failed member among
    // them) out of the spans.
    assert!(spans.iter().all(|s| s.events.is_empty()));
    // One trace per activation.
    let traces: std::collections::BTreeSet<&[u8]> =
        spans.iter().map(|s| s.trace_id.as_slice()).collect();
    assert_eq!(traces.len(), 2);
    assert!(receiver.service_names().iter().all(|n| n == "awaken-test"));

    expect_test::expect![[r#"
        gen_ai.client.operation.duration [s] {error.type=permanent gen_ai.operation.name=chat gen_ai.provider.name=scripted gen_ai.request.model=empty-model} count=1
        gen_ai.client.operation.duration [s] {gen_ai.operation.name=chat gen_ai.provider.name=pool gen_ai.request.model=pool-model gen_ai.response.model=model-scripted} count=2
        gen_ai.client.token.usage [{token}] {gen_ai.operation.name=chat gen_ai.provider.name=pool gen_ai.request.model=pool-model gen_ai.response.model=model-scripted gen_ai.token.type=input} count=2 sum=32
        gen_ai.client.token.usage [{token}] {gen_ai.operation.name=chat gen_ai.provider.name=pool gen_ai.request.model=pool-model gen_ai.response.model=model-scripted gen_ai.token.type=output} count=2 sum=8
    "#]]
    .assert_eq(&receiver.histograms());

    // The collector's header went with every request; the executor's key reached its own
    // server and nothing exported.
    for r in receiver.received() {
        assert!(
            r.headers.contains("x-collector-token: collector token"),
            "{}",
            r.headers
        );
    }
    assert_eq!(
        llm.authorizations(),
        vec![format!("Bearer {API_KEY}"), format!("Bearer {API_KEY}")]
    );
    assert_nowhere(&receiver, API_KEY);
    assert_nowhere(&receiver, "secret");
    for words in CONTENT {
        assert_nowhere(&receiver, words);
    }
}

#[tokio::test]
async fn message_content_is_exported_only_with_the_runtime_opt_in() {
    let receiver = Receiver::start();
    let llm = RateLimited::start().await;
    export_runs(&config(&receiver, "http/protobuf"), &llm, true).await;
    let spans = receiver.spans();
    let chats: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "chat pool-model")
        .collect();
    assert_eq!(chats.len(), 2);
    let content = |span: &opentelemetry_proto::tonic::trace::v1::Span, key: &str| {
        let text = attribute(&span.attributes, key).unwrap_or_else(|| panic!("no {key}"));
        serde_json::from_str::<Value>(&text).unwrap_or_else(|e| panic!("{key} is JSON: {e}"))
    };
    assert_eq!(
        content(chats[0], "gen_ai.input.messages"),
        json!([{"role": "user", "parts": [{"type": "text", "content": "user-message-words"}]}])
    );
    assert_eq!(
        content(chats[0], "gen_ai.system_instructions"),
        json!([{"type": "text", "content": "system-prompt-words"}])
    );
    assert_eq!(
        content(chats[0], "gen_ai.output.messages"),
        json!([{"role": "assistant", "finish_reason": "tool_calls", "parts": [
            {"type": "tool_call", "id": "c1", "name": "echo",
             "arguments": {"text": "tool-argument-words"}}
        ]}])
    );
    let second_input = content(chats[1], "gen_ai.input.messages");
    assert_eq!(
        second_input[2],
        json!({"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1",
               "response": {"echoed": "tool-argument-words"}}]})
    );
    assert_eq!(
        content(chats[1], "gen_ai.output.messages"),
        json!([{"role": "assistant", "finish_reason": "stop",
                "parts": [{"type": "text", "content": "answer-words"}]}])
    );
    // Content is on the runtime's `chat` spans only (not on the agent's, a tool's or a pool
    // attempt's); the credential is still nowhere.
    let attempt = |s: &&opentelemetry_proto::tonic::trace::v1::Span| {
        attribute(&s.attributes, "awaken.pool.member").is_some()
    };
    for span in spans
        .iter()
        .filter(|s| !s.name.starts_with("chat ") || attempt(s))
    {
        assert!(
            attribute(&span.attributes, "gen_ai.input.messages").is_none(),
            "{}",
            span.name
        );
    }
    assert_nowhere(&receiver, API_KEY);
}

#[tokio::test]
async fn the_json_protocol_sends_the_same_spans_as_json() {
    let receiver = Receiver::start();
    let llm = RateLimited::start().await;
    export_runs(&config(&receiver, "http/json"), &llm, false).await;
    let received = receiver.received();
    let mut names = Vec::new();
    for r in received.iter().filter(|r| r.path == "/v1/traces") {
        assert_eq!(r.content_type, "application/json");
        let body: Value = serde_json::from_slice(&r.body).expect("a JSON body");
        for resource in body["resourceSpans"].as_array().expect("resourceSpans") {
            for scope in resource["scopeSpans"].as_array().expect("scopeSpans") {
                for span in scope["spans"].as_array().expect("spans") {
                    names.push(span["name"].as_str().expect("a name").to_owned());
                }
            }
        }
    }
    names.sort();
    assert_eq!(
        names,
        [
            "chat empty-model",
            "chat model-limited",
            "chat model-limited",
            "chat model-scripted",
            "chat model-scripted",
            "chat pool-model",
            "chat pool-model",
            "execute_tool echo",
            "invoke_agent agent",
            "invoke_agent failing",
        ]
    );
    let metrics = received
        .iter()
        .rev()
        .find(|r| r.path == "/v1/metrics")
        .expect("a metrics request");
    assert_eq!(metrics.content_type, "application/json");
    let body = String::from_utf8_lossy(&metrics.body);
    assert!(body.contains("gen_ai.client.token.usage"), "{body}");
    assert_nowhere(&receiver, API_KEY);
}
