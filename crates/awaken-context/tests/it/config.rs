//! Building the plugins from an agent's policy; every error names its field.

use std::sync::Arc;

use awaken_context::{
    COMPACTION_PLUGIN, CONTEXT_TRANSFORM_PLUGIN, ContextConfig, ContextConfigError, ContextPlugins,
    DefaultEstimator, SummaryModels,
};
use awaken_llm::{LlmExecutor, ScriptedExecutor};
use awaken_spec::{AgentSpec, ContextPolicy, ModelSpec};

struct Models;

impl SummaryModels for Models {
    fn model(&self, id: &str) -> Option<ModelSpec> {
        match id {
            "small" => {
                Some(ModelSpec::new("small", "scripted", "small-v1").with_context_window(8_000))
            }
            "tiny" => Some(ModelSpec::new("tiny", "scripted", "tiny-v1").with_context_window(600)),
            "orphan" => Some(ModelSpec::new("orphan", "nowhere", "x")),
            _ => None,
        }
    }
    fn executor(&self, model: &ModelSpec) -> Option<Arc<dyn LlmExecutor>> {
        (model.provider == "scripted").then(|| {
            Arc::new(ScriptedExecutor::from_turns([]).expect("script")) as Arc<dyn LlmExecutor>
        })
    }
}

fn model() -> ModelSpec {
    ModelSpec::new("main", "scripted", "main-v1").with_context_window(32_000)
}

fn plugins(policy: ContextPolicy) -> Result<Vec<&'static str>, ContextConfigError> {
    let spec = AgentSpec::new("agent", "main").with_context_policy(policy);
    let list = ContextPlugins::for_agent(&spec, &model(), &Models, Arc::new(DefaultEstimator))?;
    Ok(list
        .iter()
        .map(|p| match p.manifest().id.as_str() {
            CONTEXT_TRANSFORM_PLUGIN => CONTEXT_TRANSFORM_PLUGIN,
            COMPACTION_PLUGIN => COMPACTION_PLUGIN,
            _ => "other",
        })
        .collect())
}

fn field(policy: ContextPolicy) -> String {
    let e = plugins(policy).expect_err("invalid");
    format!("{} | {e}", e.field())
}

#[test]
fn the_budget_defaults_to_the_window_minus_the_reserve() {
    let config =
        ContextConfig::from_policy(&ContextPolicy::default(), &model(), &model()).expect("valid");
    assert_eq!(config.budget, 32_000 - 4_096);
    assert!(config.compaction.is_none());
    let compacting = ContextPolicy {
        compaction_threshold: Some(0.5),
        summary_model: Some("small".into()),
        ..ContextPolicy::default()
    };
    let small = Models.model("small").expect("small");
    let config = ContextConfig::from_policy(&compacting, &model(), &small).expect("valid");
    let compaction = config.compaction.expect("on");
    // A quarter of the threshold's tokens: 0.5 × 27,904 / 4.
    assert_eq!(compaction.summary_max_tokens, 3_488);
    assert_eq!(compaction.summary_input_budget, 8_000 - 3_488 - 512);
}

#[test]
fn a_policy_gives_both_plugins_and_no_policy_none() {
    assert_eq!(
        plugins(ContextPolicy::default()).expect("valid"),
        vec![CONTEXT_TRANSFORM_PLUGIN, COMPACTION_PLUGIN]
    );
    let compacting = ContextPolicy {
        compaction_threshold: Some(0.8),
        ..ContextPolicy::default()
    };
    assert_eq!(plugins(compacting).expect("valid").len(), 2);
    let none = ContextPlugins::for_agent(
        &AgentSpec::new("agent", "main"),
        &model(),
        &Models,
        Arc::new(DefaultEstimator),
    )
    .expect("valid");
    assert!(none.is_empty());
}

#[test]
fn every_error_names_its_field() {
    let compacting = |summary_model: &str| ContextPolicy {
        compaction_threshold: Some(0.5),
        summary_model: Some(summary_model.into()),
        ..ContextPolicy::default()
    };
    let rows = [
        field(compacting("missing")),
        field(compacting("orphan")),
        field(compacting("tiny")),
        field(ContextPolicy {
            compaction_threshold: Some(1.5),
            ..ContextPolicy::default()
        }),
        field(ContextPolicy {
            output_reserve_tokens: 40_000,
            ..ContextPolicy::default()
        }),
    ];
    expect_test::expect![[r#"
        context_policy.summary_model | context_policy.summary_model: model `missing` is not registered
        context_policy.summary_model | context_policy.summary_model: provider `nowhere` of model `orphan` is not registered
        context_policy.summary_model | context_policy.summary_model: model `tiny`'s context window of 600 tokens leaves no room for a summary of 3488 tokens
        context_policy.compaction_threshold | invalid `context_policy.compaction_threshold`: 1.5 is outside (0, 1]
        context_policy.output_reserve_tokens | invalid `context_policy.output_reserve_tokens`: 40000 leaves no room in model `main`'s context window of 32000
    "#]]
    .assert_eq(&(rows.join("\n") + "\n"));
    // A window to derive the budget from is needed when no budget is set.
    let windowless = ModelSpec::new("main", "scripted", "main-v1");
    let e = ContextConfig::from_policy(&ContextPolicy::default(), &windowless, &windowless)
        .expect_err("no window");
    assert_eq!(e.field(), "context_policy.budget_tokens");
    // Compaction without a summarizer cannot be built.
    let config = ContextConfig::new(1_000).with_compaction(awaken_context::CompactionConfig {
        threshold: 0.5,
        summary_input_budget: 1_000,
        summary_max_tokens: 64,
    });
    let e = ContextPlugins::new(config)
        .build()
        .err()
        .expect("no summarizer");
    assert_eq!(e.field(), "context_policy.compaction_threshold");
}

/// The agent file of `docs/context.md` parses, and its policy gives the documented config.
#[test]
fn the_documented_example_agent_builds_its_plugins() {
    #[derive(serde::Deserialize)]
    struct AgentFile {
        agent: AgentSpec,
        model: ModelSpec,
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/agents/long-thread.toml"
    );
    let text = std::fs::read_to_string(path).expect("the example exists");
    let file: AgentFile = awaken_spec::parse_toml(&text).expect("the example parses");
    file.agent.validate().expect("the example is valid");
    let policy = file
        .agent
        .context_policy
        .as_ref()
        .expect("a context policy");
    let config = ContextConfig::from_policy(policy, &file.model, &file.model).expect("valid");
    assert_eq!(config, ContextConfig::new(3_000).with_stable_prefix(true));
    let list = ContextPlugins::for_agent(
        &file.agent,
        &file.model,
        &Models,
        Arc::new(DefaultEstimator),
    )
    .expect("plugins");
    assert_eq!(list.len(), 2);
}
