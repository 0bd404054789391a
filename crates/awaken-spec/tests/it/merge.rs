//! `InferenceOverride::merge`: associative, empty is the identity, last non-empty wins per field.

use awaken_spec::{InferenceOverride, ReasoningEffort};
use proptest::prelude::*;

fn effort() -> impl Strategy<Value = ReasoningEffort> {
    prop_oneof![
        Just(ReasoningEffort::None),
        Just(ReasoningEffort::Low),
        Just(ReasoningEffort::Medium),
        Just(ReasoningEffort::High),
    ]
}

fn layer() -> impl Strategy<Value = InferenceOverride> {
    (
        proptest::option::of(prop_oneof![Just(String::new()), "[a-z]{1,4}"]),
        proptest::option::of(0u8..=20),
        proptest::option::of(1u32..10_000),
        proptest::option::of(0u8..=10),
        proptest::option::of(effort()),
    )
        .prop_map(|(m, t, n, p, e)| InferenceOverride {
            upstream_model: m,
            temperature: t.map(|t| f64::from(t) / 10.0),
            max_tokens: n,
            top_p: p.map(|p| f64::from(p) / 10.0),
            reasoning_effort: e,
        })
}

/// The reference model: scan layers from last to first, taking the first non-empty value.
fn last_non_empty<T: Clone>(
    layers: &[InferenceOverride],
    get: impl Fn(&InferenceOverride) -> Option<T>,
) -> Option<T> {
    layers.iter().rev().find_map(get)
}

proptest! {
    #[test]
    fn merge_is_associative(a in layer(), b in layer(), c in layer()) {
        prop_assert_eq!(a.merge(&b).merge(&c), a.merge(&b.merge(&c)));
    }

    #[test]
    fn empty_is_identity(a in layer()) {
        let e = InferenceOverride::default();
        let normalised = e.merge(&a);
        prop_assert_eq!(normalised.merge(&e), normalised.clone());
        prop_assert_eq!(e.merge(&normalised), normalised);
    }

    #[test]
    fn last_non_empty_wins_per_field(layers in proptest::collection::vec(layer(), 0..6)) {
        let merged = InferenceOverride::merge_all(&layers);
        prop_assert_eq!(
            merged.upstream_model,
            last_non_empty(&layers, |l| l.upstream_model.clone().filter(|m| !m.is_empty()))
        );
        prop_assert_eq!(merged.temperature, last_non_empty(&layers, |l| l.temperature));
        prop_assert_eq!(merged.max_tokens, last_non_empty(&layers, |l| l.max_tokens));
        prop_assert_eq!(merged.top_p, last_non_empty(&layers, |l| l.top_p));
        prop_assert_eq!(merged.reasoning_effort, last_non_empty(&layers, |l| l.reasoning_effort));
    }
}

#[test]
fn step_beats_run_beats_agent() {
    let agent = InferenceOverride::default()
        .with_temperature(0.1)
        .with_max_tokens(100)
        .with_upstream_model("base");
    let run = InferenceOverride::default().with_temperature(0.5);
    let step = InferenceOverride::default().with_max_tokens(7);
    let merged = InferenceOverride::merge_all([&agent, &run, &step]);
    assert_eq!(merged.temperature, Some(0.5));
    assert_eq!(merged.max_tokens, Some(7));
    assert_eq!(merged.upstream_model.as_deref(), Some("base"));
}
