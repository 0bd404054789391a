//! Model pools: parsing with defaults, round trips, and every validation refusal naming its
//! field.

use awaken_spec::{
    DurationSpec, ModelPoolSpec, PoolBreakerSpec, PoolMemberSpec, SpecError, parse_toml,
};

/// The field an `Invalid` error names (panics on any other error).
fn field(err: SpecError) -> String {
    match err {
        SpecError::Invalid { field, .. } => field,
        other => panic!("not a field error: {other}"),
    }
}

#[test]
fn a_pool_parses_with_defaults_and_round_trips() {
    let pool = ModelPoolSpec::from_toml_str(
        r#"
id = "smart"
members = [
  { model = "gpt-4o", weight = 3 },
  { model = "gpt-4o-azure" },
  { model = "llama-local", fallback_only = true },
]
"#,
    )
    .expect("valid");
    assert_eq!(pool.members[1].weight, 1, "weight defaults to 1");
    assert!(!pool.members[1].fallback_only);
    assert_eq!(pool.breaker, PoolBreakerSpec::default());
    let text = serde_json::to_string(&pool).expect("ser");
    expect_test::expect![[r#"{"id":"smart","members":[{"model":"gpt-4o","weight":3,"fallback_only":false},{"model":"gpt-4o-azure","weight":1,"fallback_only":false},{"model":"llama-local","weight":1,"fallback_only":true}],"breaker":{"failures_to_open":5,"cool_down":"30s"}}"#]].assert_eq(&text);
    assert_eq!(
        ModelPoolSpec::from_json_str(&text).expect("round trip"),
        pool
    );
    assert_eq!(
        pool,
        ModelPoolSpec::new(
            "smart",
            [
                PoolMemberSpec::new("gpt-4o").with_weight(3),
                PoolMemberSpec::new("gpt-4o-azure"),
                PoolMemberSpec::new("llama-local").fallback_only(),
            ],
        )
    );
}

#[test]
fn the_breaker_takes_a_duration_and_keeps_the_other_default() {
    let pool = ModelPoolSpec::from_toml_str(
        "id = \"p\"\nmembers = [{ model = \"m\" }]\n[breaker]\ncool_down = \"2m\"\n",
    )
    .expect("valid");
    assert_eq!(
        pool.breaker,
        PoolBreakerSpec {
            failures_to_open: 5,
            cool_down: DurationSpec::from_secs(120),
        }
    );
}

#[test]
fn unknown_fields_are_refused_with_their_line() {
    let err = ModelPoolSpec::from_toml_str(
        "id = \"p\"\nmembers = [\n  { model = \"m\", wieght = 2 },\n]\n",
    )
    .expect_err("typo");
    assert_eq!(err.line(), Some(3), "{err}");
    assert!(err.to_string().contains("wieght"), "{err}");
    let err = ModelPoolSpec::from_json_str(r#"{"id":"p","members":[{"model":"m"}],"breakr":{}}"#)
        .expect_err("typo");
    assert!(err.to_string().contains("breakr"), "{err}");
    let err = parse_toml::<ModelPoolSpec>(
        "id = \"p\"\nmembers = [{ model = \"m\" }]\n[breaker]\nfailures = 2\n",
    )
    .expect_err("typo");
    assert_eq!(err.line(), Some(4), "{err}");
}

#[test]
fn every_refusal_names_its_field() {
    let ok = ModelPoolSpec::new("p", [PoolMemberSpec::new("a"), PoolMemberSpec::new("b")]);
    ok.validate().expect("valid");
    let cases: Vec<(ModelPoolSpec, &str, &str)> = vec![
        (
            ModelPoolSpec {
                id: " ".into(),
                ..ok.clone()
            },
            "model_pool.id",
            "must not be blank",
        ),
        (
            ModelPoolSpec::new("p", []),
            "model_pool.members",
            "at least one member",
        ),
        (
            ModelPoolSpec::new("p", [PoolMemberSpec::new("a"), PoolMemberSpec::new("")]),
            "model_pool.members[1].model",
            "must not be blank",
        ),
        (
            ModelPoolSpec::new(
                "p",
                [
                    PoolMemberSpec::new("a"),
                    PoolMemberSpec::new("b"),
                    PoolMemberSpec::new("a").fallback_only(),
                ],
            ),
            "model_pool.members[2].model",
            "`a` is listed already (members[0])",
        ),
        (
            ModelPoolSpec::new("p", [PoolMemberSpec::new("a").with_weight(0)]),
            "model_pool.members[0].weight",
            "at least 1",
        ),
        (
            ModelPoolSpec::new(
                "p",
                [
                    PoolMemberSpec::new("a").fallback_only(),
                    PoolMemberSpec::new("b").fallback_only(),
                ],
            ),
            "model_pool.members",
            "every member is fallback_only",
        ),
        (
            ok.clone().with_breaker(PoolBreakerSpec {
                failures_to_open: 0,
                cool_down: DurationSpec::from_secs(1),
            }),
            "model_pool.breaker.failures_to_open",
            "at least 1",
        ),
    ];
    for (spec, expected_field, reason) in cases {
        let err = spec.validate().expect_err(expected_field);
        let message = err.to_string();
        assert!(message.contains(reason), "{message}");
        assert_eq!(field(err), expected_field, "{spec:?}");
    }
    // Parsing validates too.
    let err = ModelPoolSpec::from_toml_str("id = \"p\"\nmembers = []\n").expect_err("empty");
    assert_eq!(field(err), "model_pool.members");
}
