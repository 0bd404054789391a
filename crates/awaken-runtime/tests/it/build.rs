//! Building a runtime: every problem of the registrations and the agents in one error.

use std::sync::Arc;

use awaken_llm::ScriptedExecutor;
use awaken_runtime::{AgentRuntime, BuildError};
use awaken_spec::{AgentSpec, ModelSpec};

use crate::support::*;

/// The build error as text: its kind, then one problem a line.
fn render_build_error(error: &BuildError) -> String {
    let problems: Vec<String> = match error {
        BuildError::ValidationFailed(failed) => {
            failed.problems.iter().map(ToString::to_string).collect()
        }
        BuildError::Registration { errors } => errors.iter().map(ToString::to_string).collect(),
        other => vec![other.to_string()],
    };
    let kind = match error {
        BuildError::ValidationFailed(_) => "validation failed",
        BuildError::Registration { .. } => "registration failed",
        _ => "other",
    };
    format!("{kind}\n{}\nmessage: {error}", problems.join("\n"))
}

#[test]
fn build_reports_a_duplicate_tool_and_an_agents_missing_model_together() {
    let executor = Arc::new(ScriptedExecutor::from_turns(Vec::new()).expect("script"));
    let error = AgentRuntime::builder()
        .with_model(ModelSpec::new("model", "scripted", "upstream-model"))
        .with_provider("scripted", executor)
        .with_tool(Arc::new(Echo))
        .with_tool(Arc::new(Echo))
        .with_agent_spec(AgentSpec::new("agent", "model"))
        .with_agent_spec(AgentSpec::new("lost", "ghost").with_plugin("phantom"))
        .build()
        .expect_err("three problems");
    // Both kinds in one error: the registration problem and the agent's resolution problems
    // (each id it names that no registry holds).
    expect_test::expect![[r#"
        validation failed
        tool `echo` is registered twice
        agent `lost` uses model `ghost`, which is not registered
        agent `lost` lists plugin `phantom`, which is not registered
        message: 3 problem(s): tool `echo` is registered twice; agent `lost` uses model `ghost`, which is not registered; agent `lost` lists plugin `phantom`, which is not registered"#]]
    .assert_eq(&render_build_error(&error));
}
