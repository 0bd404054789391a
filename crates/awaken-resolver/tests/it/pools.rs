//! Model pools resolve like models: the pool as the agent's executor (retried around, never
//! inside), one pool per id for the registries' lifetime, its derived spec, the shared id
//! namespace, validation of every pool, and a run's recorded membership.

use std::sync::Arc;

use awaken_event::Message;
use awaken_llm::{
    InferenceRequest, LlmExecutor, ScriptTurn, ScriptedError, ScriptedErrorKind, ScriptedExecutor,
};
use awaken_resolver::*;
use awaken_spec::{AgentSpec, ModelPoolSpec, ModelSpec, PoolBreakerSpec, PoolMemberSpec};
use serde_json::json;

use crate::support::*;

fn rate_limited() -> ScriptTurn {
    ScriptTurn::error(ScriptedError::new(ScriptedErrorKind::RateLimited))
}

/// Models `a` (window 128 000) and `b` (window 8 000) on providers `pa` and `pb`, `c` on
/// `pc`, with the given executors.
fn models(a: Arc<ScriptedExecutor>, b: Arc<ScriptedExecutor>) -> Registries {
    Registries::new()
        .with_model(ModelSpec::new("a", "pa", "up-a").with_context_window(128_000))
        .with_model(ModelSpec::new("b", "pb", "up-b").with_context_window(8_000))
        .with_model(ModelSpec::new("c", "pc", "up-c"))
        .with_provider("pa", a)
        .with_provider("pb", b)
        .with_provider("pc", scripted(vec![ScriptTurn::text("from c")]))
}

/// Pool `smart`: `a` first, `b` fallback-only (so the order is fixed whatever the key), with a
/// breaker that opens on the first failure.
fn smart() -> ModelPoolSpec {
    ModelPoolSpec::new(
        "smart",
        [
            PoolMemberSpec::new("a"),
            PoolMemberSpec::new("b").fallback_only(),
        ],
    )
    .with_breaker(PoolBreakerSpec {
        failures_to_open: 1,
        cool_down: awaken_spec::DurationSpec::from_secs(600),
    })
}

fn request() -> InferenceRequest {
    InferenceRequest::new("ignored", vec![Message::user("hi")]).with_routing_key("thread")
}

fn upstreams(executor: &ScriptedExecutor) -> Vec<String> {
    executor
        .requests()
        .iter()
        .map(|r| r.upstream_model.to_string())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_pool_id_resolves_like_a_model_and_keeps_its_breakers_across_resolutions() {
    let a = scripted(vec![rate_limited()]);
    let b = scripted(vec![
        ScriptTurn::text("b answers"),
        ScriptTurn::text("b again"),
    ]);
    let agent = AgentSpec::new("agent", "smart").with_section(
        "retry",
        json!({"max_retries": 2, "initial_backoff": "10ms"}),
    );
    let r = resolver(
        models(a.clone(), b.clone())
            .with_model_pool(smart())
            .with_agent_spec(agent),
    );

    let first = r.resolve("agent").expect("resolves");
    assert_eq!(first.model.id, "smart");
    assert_eq!(
        first.model.context_window,
        Some(8_000),
        "the smallest window"
    );
    assert_eq!(
        (
            first.model.provider.as_str(),
            first.model.upstream_model.as_str()
        ),
        ("smart", "smart")
    );
    assert_eq!(first.executor.name(), "pool", "retried around the pool");
    let membership = first.pool.as_deref().expect("a pool");
    assert_eq!(
        serde_json::to_string(membership).expect("json"),
        r#"{"pool":"smart","members":[{"model":"a","upstream_model":"up-a","weight":1},{"model":"b","upstream_model":"up-b","weight":1,"fallback_only":true}]}"#
    );
    let answer = first.executor.execute(request()).await.expect("answered");
    assert_eq!(answer.message.text(), "b answers");
    // `a` was asked once: its 429 went to the next member at once, not to a retry of `a`.
    assert_eq!(upstreams(&a), ["up-a"]);
    assert_eq!(upstreams(&b), ["up-b"]);

    // A later resolution gets the same pool: `a`'s breaker is still open, so `a` is skipped.
    let second = r.resolve("agent").expect("resolves");
    let answer = second.executor.execute(request()).await.expect("answered");
    assert_eq!(answer.message.text(), "b again");
    assert_eq!(upstreams(&a), ["up-a"], "the open breaker skipped `a`");
    assert_eq!(first.spec_digest, second.spec_digest);
}

#[test]
fn a_model_resolves_to_its_provider_and_a_pool_to_itself() {
    let registries = models(scripted(vec![]), scripted(vec![])).with_model_pool(smart());
    let model = registries.resolve_model("a").expect("a model");
    assert_eq!(
        (model.spec.id.as_str(), model.executor.name()),
        ("a", "scripted")
    );
    assert!(model.pool.is_none());
    let pool = registries.resolve_model("smart").expect("a pool");
    assert_eq!(pool.executor.name(), "pool");
    let again = registries.resolve_model("smart").expect("a pool");
    assert!(
        Arc::ptr_eq(&pool.spec, &again.spec),
        "built once, for every resolution"
    );
    assert_eq!(
        registries
            .resolve_model("ghost")
            .expect_err("none")
            .to_string(),
        "model `ghost` is not registered"
    );
}

#[test]
fn pool_ids_share_the_namespace_of_model_ids() {
    let registries = models(scripted(vec![]), scripted(vec![]))
        .with_model_pool(smart())
        .with_model_pool(ModelPoolSpec::new("a", [PoolMemberSpec::new("b")]))
        .with_model_pool(smart())
        .with_model(ModelSpec::new("smart", "pa", "x"));
    let errors: Vec<String> = registries
        .errors()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        errors,
        [
            "model `a` is registered twice",
            "model `smart` is registered twice",
            "model `smart` is registered twice",
        ]
    );
    // The first registration of each id stands.
    assert!(registries.model_pool("smart").is_some());
    assert!(registries.model("smart").is_none());
}

#[test]
fn validation_reports_every_pool_that_cannot_be_built() {
    let registries = models(scripted(vec![]), scripted(vec![]))
        .with_model(ModelSpec::new("orphan", "nobody", "up-orphan"))
        .with_model_pool(smart())
        .with_model_pool(ModelPoolSpec::new(
            "ghostly",
            [PoolMemberSpec::new("a"), PoolMemberSpec::new("ghost")],
        ))
        .with_model_pool(ModelPoolSpec::new(
            "nested",
            [PoolMemberSpec::new("a"), PoolMemberSpec::new("smart")],
        ))
        .with_model_pool(ModelPoolSpec::new(
            "unserved",
            [PoolMemberSpec::new("orphan")],
        ))
        .with_model_pool(ModelPoolSpec::new(
            "heavy",
            [PoolMemberSpec::new("a").with_weight(0)],
        ))
        .with_agent_spec(AgentSpec::new("fine", "smart"))
        .with_agent_spec(AgentSpec::new("haunted", "ghostly").with_plugin("phantom"));
    let failed = resolver(registries).validate().expect_err("problems");
    let lines: Vec<String> = failed.problems.iter().map(ToString::to_string).collect();
    expect_test::expect![[r#"
        model pool `ghostly`: member `ghost` is not a registered model
        model pool `heavy`: invalid `model_pool.members[0].weight`: must be at least 1
        model pool `nested`: member `smart` is itself a model pool; a pool's members are models
        model pool `unserved`: member `orphan` is served by provider `nobody`, which is not registered
        agent `haunted`: model pool `ghostly`: member `ghost` is not a registered model
        agent `haunted` lists plugin `phantom`, which is not registered"#]]
    .assert_eq(&lines.join("\n"));
    let pool_errors: Vec<&str> = failed
        .problems
        .iter()
        .filter_map(|p| match p {
            ValidationProblem::ModelPool(e) => Some(e.pool_id()),
            _ => None,
        })
        .collect();
    assert_eq!(pool_errors, ["ghostly", "heavy", "nested", "unserved"]);
}

#[tokio::test]
async fn a_recorded_membership_is_used_when_the_pool_has_changed() {
    let a = scripted(vec![ScriptTurn::text("from a")]);
    let b = scripted(vec![ScriptTurn::text("from b")]);
    let r = resolver(
        models(a.clone(), b.clone())
            .with_model_pool(smart())
            .with_agent_spec(AgentSpec::new("agent", "smart")),
    );
    let plan = |recorded: Option<&PoolMembership>| match r
        .plan_with_pool("agent", recorded)
        .expect("resolves")
    {
        ResolvedRunPlan::Local(agent) => agent,
        ResolvedRunPlan::Backend(_) => panic!("a local agent"),
    };
    let now = plan(None);
    let current = now.pool.as_deref().expect("a pool").clone();

    // Unchanged: the pool of now, with its digest.
    let same = plan(Some(&current));
    assert_eq!(same.spec_digest, now.spec_digest);

    // Changed since the run started (the run had `c` first and `b` under another name).
    let recorded = PoolMembership {
        pool: "smart".into(),
        members: vec![
            RecordedMember {
                model: "c".into(),
                upstream_model: "up-c-then".into(),
                weight: 2,
                fallback_only: false,
            },
            RecordedMember {
                model: "b".into(),
                upstream_model: "up-b-then".into(),
                weight: 1,
                fallback_only: true,
            },
        ],
    };
    let pinned = plan(Some(&recorded));
    assert_eq!(pinned.pool.as_deref(), Some(&recorded));
    assert_ne!(
        pinned.spec_digest, now.spec_digest,
        "the digest names the members"
    );
    assert_eq!(pinned.model.context_window, Some(8_000), "`b`'s window");
    let answer = pinned.executor.execute(request()).await.expect("answered");
    assert_eq!(answer.message.text(), "from c");
    assert!(
        upstreams(&a).is_empty(),
        "`a` is not a member of the run's pool"
    );
    // The same recorded membership again: the same pool, so the same digest.
    assert_eq!(plan(Some(&recorded)).spec_digest, pinned.spec_digest);

    // A recorded membership of another pool does not apply.
    let other = PoolMembership {
        pool: "elsewhere".into(),
        ..recorded.clone()
    };
    assert_eq!(plan(Some(&other)).spec_digest, now.spec_digest);

    // A recorded member that is no registered model any more.
    let mut gone = recorded.clone();
    gone.members[0].model = "retired".into();
    let err = r
        .plan_with_pool("agent", Some(&gone))
        .err()
        .expect("refused");
    assert!(
        matches!(
            &err,
            ResolveError::ModelPool {
                source: ModelPoolError::RecordedMemberNotFound { member, .. },
                ..
            } if member == "retired"
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "agent `agent`: model pool `smart`: the run started with member `retired`, which is no longer a registered model"
    );
}
