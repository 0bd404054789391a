//! Validation warnings: delegation cycles among the registered agents are named, and never fail
//! validation; an agent delegating to itself stays an error.

use awaken_resolver::{Registries, ValidationWarning};
use awaken_spec::{AgentSpec, EndpointSpec};

use crate::support::*;

/// `base()` with an agent per `(id, delegates)`.
fn agents(list: &[(&str, &[&str])]) -> Registries {
    let mut registries = base();
    for (id, delegates) in list {
        let mut spec = AgentSpec::new(*id, "m");
        for d in *delegates {
            spec = spec.with_delegate(*d);
        }
        registries.add_agent_spec(spec);
    }
    registries
}

/// The validation warnings of `registries`, one per line, after checking that validation
/// passes: a warning never fails it.
fn warnings(registries: Registries) -> String {
    let r = resolver(registries);
    if let Err(failed) = r.validate() {
        panic!("warnings must not fail validation: {failed}");
    }
    r.validation_warnings()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_two_cycle_and_a_three_cycle_are_each_named_and_validation_passes() {
    let registries = agents(&[
        ("writer", &["reviewer"]),
        ("reviewer", &["writer"]),
        ("c", &["d"]),
        ("d", &["e"]),
        ("e", &["c"]),
        // Reaches a cycle without being on one.
        ("boss", &["writer", "c"]),
    ]);
    expect_test::expect![[r#"
        delegation cycle: c → d → e → c
        delegation cycle: reviewer → writer → reviewer"#]]
    .assert_eq(&warnings(registries));
}

#[test]
fn the_warning_carries_the_cycle_and_its_group() {
    let registries = agents(&[("a", &["b"]), ("b", &["a"])]);
    assert_eq!(
        resolver(registries).validation_warnings(),
        vec![ValidationWarning::DelegationCycle {
            cycle: vec!["a".into(), "b".into()],
            agents: vec!["a".into(), "b".into()],
        }]
    );
}

#[test]
fn a_group_holding_several_cycles_is_one_warning_naming_its_shortest_cycle_and_every_agent() {
    // a → b → c → a and a ⇄ b: one group; through `a` the shortest cycle is a → b → a.
    let registries = agents(&[("a", &["b"]), ("b", &["c", "a"]), ("c", &["a"])]);
    expect_test::expect![[r#"delegation cycle: a → b → a (agents a, b, c all delegate to each other, directly or through others)"#]]
    .assert_eq(&warnings(registries));
}

#[test]
fn chains_diamonds_and_endpoint_agents_are_no_cycle() {
    let registries = agents(&[
        ("top", &["left", "right"]),
        ("left", &["bottom"]),
        ("right", &["bottom"]),
        ("bottom", &[]),
    ]);
    assert_eq!(warnings(registries), "");
    // An endpoint-backed agent's delegates are not run here: no edge back.
    let mut registries = agents(&[("local", &["remote"])]);
    registries.add_agent_spec(
        AgentSpec::new("remote", "")
            .with_endpoint(EndpointSpec {
                url: "echo://remote".into(),
                protocol: None,
                bearer_token_env: None,
            })
            .with_delegate("local"),
    );
    assert_eq!(warnings(registries), "");
}

#[test]
fn self_delegation_stays_an_error_and_is_no_cycle_warning() {
    let r = resolver(agents(&[("narcissus", &["narcissus"])]));
    let failed = r.validate().expect_err("self-delegation is invalid");
    let lines: Vec<String> = failed.problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        vec![
            "agent `narcissus` has an invalid spec: invalid `agent.delegates`: an agent cannot delegate to itself"
        ]
    );
    assert!(r.validation_warnings().is_empty());
}

#[test]
fn a_delegate_that_is_not_registered_is_an_error_not_a_cycle() {
    let r = resolver(agents(&[("a", &["b", "ghost"]), ("b", &["a"])]));
    let failed = r.validate().expect_err("missing delegate");
    let lines: Vec<String> = failed.problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        vec!["agent `a` delegates to `ghost`, which is not registered"]
    );
    assert_eq!(
        r.validation_warnings()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        vec!["delegation cycle: a → b → a"]
    );
}
