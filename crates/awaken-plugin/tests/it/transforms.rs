//! Request transforms: order, activation, typed failures; the declarative plugin's transform.

use std::sync::Arc;

use awaken_event::{Message, RunId, ThreadId, ToolCall, ToolCallId, ToolResult};
use awaken_llm::InferenceRequest;
use awaken_phase::RunIdentity;
use awaken_plugin::*;
use awaken_state::{KeyRegistry, StateStore};

use crate::support::*;

struct Append(&'static str);
impl InferenceRequestTransform for Append {
    fn name(&self) -> &str {
        self.0
    }
    fn transform(
        &self,
        mut request: InferenceRequest,
        _ctx: &TransformContext<'_>,
    ) -> Result<InferenceRequest, TransformError> {
        let prompt = request.system_prompt.take().unwrap_or_default();
        request.system_prompt = Some(format!("{prompt}[{}]", self.0).into());
        Ok(request)
    }
}

struct Refuse;
impl InferenceRequestTransform for Refuse {
    fn name(&self) -> &str {
        "refuse"
    }
    fn transform(
        &self,
        _request: InferenceRequest,
        _ctx: &TransformContext<'_>,
    ) -> Result<InferenceRequest, TransformError> {
        Err(TransformError::ContextOverflow {
            required: 9000,
            budget: 4000,
        })
    }
}

fn with_transform(id: &str, t: fn() -> Arc<dyn InferenceRequestTransform>) -> Arc<dyn Plugin> {
    TestPlugin::new(id)
        .registering(move |r| {
            r.register_request_transform(t());
            Ok(())
        })
        .arc()
}

fn run(
    env: &ExecutionEnv,
    request: InferenceRequest,
) -> Result<InferenceRequest, TransformFailure> {
    let store = StateStore::new(KeyRegistry::new());
    let snapshot = store.snapshot();
    let run = RunIdentity {
        thread_id: ThreadId::new("t").expect("id"),
        run_id: RunId::new("r").expect("id"),
        agent_id: "a".into(),
        profile_id: None,
    };
    let ctx = TransformContext {
        snapshot: &snapshot,
        run: &run,
        step: 1,
        tokens: TokenCounts::default(),
    };
    apply_transforms(env.transforms(), request, &ctx)
}

#[test]
fn transforms_compose_in_plugin_order_and_filtered_ones_do_not_apply() {
    let plugins = vec![
        with_transform("one", || Arc::new(Append("one"))),
        with_transform("two", || Arc::new(Append("two"))),
        with_transform("three", || Arc::new(Append("three"))),
    ];
    let env = ExecutionEnv::from_plugins(&plugins, &[], &[]).expect("env");
    let out = run(
        &env,
        InferenceRequest::new("m", Vec::new()).with_system_prompt("base"),
    )
    .expect("ok");
    assert_eq!(out.system_prompt.as_deref(), Some("base[one][two][three]"));
    let env =
        ExecutionEnv::from_plugins(&plugins, &[], &["one".into(), "three".into()]).expect("env");
    let out = run(&env, InferenceRequest::new("m", Vec::new())).expect("ok");
    assert_eq!(out.system_prompt.as_deref(), Some("[one][three]"));
}

#[test]
fn a_failing_transform_comes_back_typed() {
    let plugins = vec![
        with_transform("one", || Arc::new(Append("one"))),
        with_transform("guard", || Arc::new(Refuse)),
    ];
    let env = ExecutionEnv::from_plugins(&plugins, &[], &[]).expect("env");
    let err = run(&env, InferenceRequest::new("m", Vec::new())).expect_err("refused");
    assert_eq!(
        (err.plugin_id.as_str(), err.transform.as_str()),
        ("guard", "refuse")
    );
    assert!(matches!(
        err.source,
        TransformError::ContextOverflow {
            required: 9000,
            budget: 4000
        }
    ));
    assert_eq!(
        err.to_string(),
        "request transform `refuse` of plugin `guard` failed: the request needs at least 9000 tokens but the budget is 4000"
    );
}

#[test]
fn a_transform_name_used_twice_in_a_plugin_is_rejected() {
    let twice = TestPlugin::new("p")
        .registering(|r| {
            r.register_request_transform(Arc::new(Append("x")));
            r.register_request_transform(Arc::new(Append("x")));
            Ok(())
        })
        .arc();
    let err = ExecutionEnv::from_plugins(&[twice], &[], &[]).expect_err("dup");
    assert_eq!(
        err.to_string(),
        "plugin `p` registers request transform `x` twice"
    );
}

const STYLE: &str = r#"
id = "house-style"
version = "1.0.0"
prompt_fragments = ["Answer in British English.", "Be brief."]

[[reminders]]
tool = "read_*"
text = "Quote the file you read."
"#;

fn call(id: &str, name: &str) -> ToolCall {
    ToolCall::new(
        ToolCallId::new(id).expect("id"),
        name,
        serde_json::json!({}),
    )
}

#[test]
fn declarative_fragments_reach_the_system_prompt_and_reminders_follow_matching_tools() {
    let plugin: Arc<dyn Plugin> = Arc::new(DeclarativePlugin::from_toml_str(STYLE).expect("valid"));
    let env = ExecutionEnv::from_plugins(&[plugin], &[], &[]).expect("env");
    let out = run(
        &env,
        InferenceRequest::new("m", vec![Message::user("hi")]).with_system_prompt("You help."),
    )
    .expect("ok");
    assert_eq!(
        out.system_prompt.as_deref(),
        Some("You help.\n\nAnswer in British English.\n\nBe brief.")
    );
    assert_eq!(out.messages.len(), 1, "no tool ran: no reminder");

    let history = vec![
        Message::user("read it"),
        Message::assistant_with_calls("", vec![call("c1", "read_file"), call("c2", "echo")]),
        Message::tool(
            ToolCallId::new("c1").expect("id"),
            &ToolResult::success(serde_json::json!("text")),
        ),
        Message::tool(
            ToolCallId::new("c2").expect("id"),
            &ToolResult::success(serde_json::json!("e")),
        ),
    ];
    let out = run(&env, InferenceRequest::new("m", history.clone())).expect("ok");
    assert_eq!(out.messages.len(), 5);
    assert_eq!(
        out.messages[4].text(),
        "<reminder>Quote the file you read.</reminder>"
    );

    // A tool that does not match: no reminder. After the model answered: no reminder.
    let mut other = history.clone();
    other[1] =
        Message::assistant_with_calls("", vec![call("c1", "write_file"), call("c2", "echo")]);
    assert_eq!(
        run(&env, InferenceRequest::new("m", other))
            .expect("ok")
            .messages
            .len(),
        4
    );
    let mut answered = history;
    answered.push(Message::assistant("done"));
    answered.push(Message::user("thanks"));
    assert_eq!(
        run(&env, InferenceRequest::new("m", answered))
            .expect("ok")
            .messages
            .len(),
        6
    );
}

#[test]
fn a_declarative_plugin_filtered_out_adds_nothing() {
    let plugin: Arc<dyn Plugin> = Arc::new(DeclarativePlugin::from_toml_str(STYLE).expect("valid"));
    let env = ExecutionEnv::from_plugins(&[plugin], &[], &["someone-else".into()]).expect("env");
    let out = run(
        &env,
        InferenceRequest::new("m", Vec::new()).with_system_prompt("p"),
    )
    .expect("ok");
    assert_eq!(out.system_prompt.as_deref(), Some("p"));
}
