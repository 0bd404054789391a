//! The catalog filter against a set-algebra model.

use std::collections::BTreeSet;

use awaken_resolver::filter_catalog;
use awaken_spec::{AgentSpec, Glob};
use proptest::prelude::*;

const NAMES: [&str; 8] = [
    "fs_read", "fs_write", "net_get", "net_post", "shell", "search", "s3_get", "fs_net",
];
const PATTERNS: [&str; 6] = ["fs_*", "net_*", "*_get", "s*", "*", "?hell"];

fn names() -> impl Strategy<Value = Vec<String>> {
    proptest::sample::subsequence(NAMES.to_vec(), 0..=NAMES.len())
        .prop_map(|v| v.into_iter().map(str::to_owned).collect())
}

fn patterns() -> impl Strategy<Value = Vec<Glob>> {
    proptest::sample::subsequence(PATTERNS.to_vec(), 0..=3)
        .prop_map(|v| v.into_iter().map(|p| Glob::new(p).expect("glob")).collect())
}

/// The set model: `None` allow fields (both) mean all; exclusion wins.
fn model(
    tools: &[String],
    allowed: &Option<Vec<String>>,
    allowed_p: &Option<Vec<Glob>>,
    excluded: &[String],
    excluded_p: &[Glob],
) -> BTreeSet<String> {
    let all: BTreeSet<String> = tools.iter().cloned().collect();
    let matching = |ps: &[Glob]| -> BTreeSet<String> {
        all.iter()
            .filter(|t| ps.iter().any(|p| p.matches(t)))
            .cloned()
            .collect()
    };
    let allow: BTreeSet<String> = if allowed.is_none() && allowed_p.is_none() {
        all.clone()
    } else {
        let lits: BTreeSet<String> = allowed
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|t| all.contains(t))
            .collect();
        lits.union(&matching(allowed_p.as_deref().unwrap_or_default()))
            .cloned()
            .collect()
    };
    let exclude: BTreeSet<String> = excluded
        .iter()
        .cloned()
        .collect::<BTreeSet<_>>()
        .union(&matching(excluded_p))
        .cloned()
        .collect();
    allow.difference(&exclude).cloned().collect()
}

proptest! {
    #[test]
    fn the_filter_is_allow_minus_exclude(
        tools in names(),
        allowed in proptest::option::of(names()),
        allowed_p in proptest::option::of(patterns()),
        excluded in names(),
        excluded_p in patterns(),
    ) {
        let mut spec = AgentSpec::new("a", "m");
        spec.allowed_tools = allowed.clone();
        spec.allowed_tool_patterns = allowed_p.clone();
        spec.excluded_tools = excluded.clone();
        spec.excluded_tool_patterns = excluded_p.clone();
        let ids: Vec<&str> = tools.iter().map(String::as_str).collect();
        let outcome = filter_catalog(&spec, &ids);
        let kept: BTreeSet<String> = tools.iter().zip(&outcome.keep).filter(|(_, k)| **k).map(|(t, _)| t.clone()).collect();
        prop_assert_eq!(kept, model(&tools, &allowed, &allowed_p, &excluded, &excluded_p));
    }
}

#[test]
fn exclusion_wins_and_absent_allow_fields_allow_all() {
    let spec = AgentSpec::new("a", "m")
        .with_allowed_tool("shell")
        .with_excluded_tool_pattern(Glob::new("sh*").expect("glob"));
    assert_eq!(
        filter_catalog(&spec, &["shell", "fs_read"]).keep,
        vec![false, false]
    );
    let open = AgentSpec::new("a", "m");
    assert_eq!(
        filter_catalog(&open, &["shell", "fs_read"]).keep,
        vec![true, true]
    );
}
