//! The commutativity helper passes on commutative keys and catches keys that are not.

use std::collections::BTreeSet;

use awaken_state::testing::{assert_commutative, check_commutative, check_commutative_from};
use awaken_state::{StateError, StateKey};
use proptest::prelude::*;

use crate::keys::{Count, Tally};

/// A set that only grows: commutative.
struct Tags;
impl StateKey for Tags {
    const KEY: &'static str = "it.tags";
    type Value = BTreeSet<String>;
    type Update = String;
    fn apply(value: &mut BTreeSet<String>, tag: String) -> Result<(), StateError> {
        value.insert(tag);
        Ok(())
    }
}

/// Last writer wins: not commutative.
struct Latest;
impl StateKey for Latest {
    const KEY: &'static str = "it.latest";
    type Value = u8;
    type Update = u8;
    fn apply(value: &mut u8, v: u8) -> Result<(), StateError> {
        *value = v;
        Ok(())
    }
}

/// A counter that may not go below zero: the sum is the same in every order, but whether a
/// reducer fails depends on the order, so it is not commutative.
struct Balance;
impl StateKey for Balance {
    const KEY: &'static str = "it.balance";
    type Value = i64;
    type Update = i64;
    fn apply(value: &mut i64, delta: i64) -> Result<(), StateError> {
        if *value + delta < 0 {
            return Err(StateError::invalid_update(Self::KEY, "below zero"));
        }
        *value += delta;
        Ok(())
    }
}

#[test]
fn commutative_keys_pass() {
    assert_commutative::<Count>(0i64..1_000);
    // Invalid updates fail in every order, which is still commutative.
    check_commutative::<Count>(-5i64..5).unwrap();
    check_commutative_from::<Tally>(0u32..1_000_000, 0u32..1_000).unwrap();
    check_commutative::<Tags>("[a-d]{1,2}").unwrap();
}

#[test]
fn last_writer_wins_is_caught() {
    let violation = check_commutative::<Latest>(any::<u8>()).unwrap_err();
    assert_eq!(violation.key, "it.latest");
    let text = violation.to_string();
    assert!(
        text.starts_with("state key `it.latest` is not commutative:"),
        "{text}"
    );
    assert!(text.contains("order"), "names the two orders: {text}");
}

#[test]
fn order_dependent_failure_is_caught() {
    let violation = check_commutative::<Balance>(-3i64..3).unwrap_err();
    assert!(
        violation.message.contains("failed"),
        "{}",
        violation.message
    );
}

#[test]
#[should_panic(expected = "is not commutative")]
fn assert_commutative_panics_on_a_violation() {
    assert_commutative::<Latest>(any::<u8>());
}
