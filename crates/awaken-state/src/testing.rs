//! Test helpers for crates that declare state keys (cargo feature `testing`).
//!
//! Every key registered as [`crate::MergeStrategy::Commutative`] must pass
//! [`check_commutative`] (or [`check_commutative_from`]) in its crate's tests:
//!
//! ```
//! use awaken_state::{StateError, StateKey};
//!
//! struct Hits;
//! impl StateKey for Hits {
//!     const KEY: &'static str = "example.hits";
//!     type Value = u64;
//!     type Update = u64;
//!     fn apply(value: &mut u64, add: u64) -> Result<(), StateError> {
//!         *value += add;
//!         Ok(())
//!     }
//! }
//!
//! // In a #[test] of the crate that declares `Hits` as Commutative:
//! awaken_state::testing::assert_commutative::<Hits>(0u64..1_000);
//! ```

use std::fmt;

use proptest::collection::vec;
use proptest::strategy::{Just, Strategy};
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::key::StateKey;

/// Longest sequence of updates whose every permutation is checked (5! = 120 orders per case).
pub const MAX_PERMUTED_UPDATES: usize = 5;

/// A counterexample to commutativity, as found (and shrunk) by proptest.
#[derive(Debug, Clone)]
pub struct CommutativityViolation {
    /// The key that failed.
    pub key: &'static str,
    /// Proptest's report: the minimal start value and updates, and the two orders that differ.
    pub message: String,
}

impl fmt::Display for CommutativityViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "state key `{}` is not commutative: {}",
            self.key, self.message
        )
    }
}

impl std::error::Error for CommutativityViolation {}

/// Property-tests that applying up to [`MAX_PERMUTED_UPDATES`] updates drawn from `updates` to
/// `K::Value::default()` gives the same outcome in every order. Outcomes compare as JSON; a
/// reducer error counts as the outcome "failed", so an order that fails where another succeeds
/// is a violation. Uses proptest's default configuration (`PROPTEST_CASES` applies) and writes
/// no regression files.
pub fn check_commutative<K: StateKey>(
    updates: impl Strategy<Value = K::Update>,
) -> Result<(), CommutativityViolation>
where
    K::Update: fmt::Debug,
{
    run::<K, _>(
        (Just(()), vec(updates, 0..=MAX_PERMUTED_UPDATES)),
        |(), ups| check_orders::<K>(&K::Value::default(), ups),
    )
}

/// As [`check_commutative`], starting from values drawn from `initial`.
pub fn check_commutative_from<K: StateKey>(
    initial: impl Strategy<Value = K::Value>,
    updates: impl Strategy<Value = K::Update>,
) -> Result<(), CommutativityViolation>
where
    K::Value: fmt::Debug,
    K::Update: fmt::Debug,
{
    run::<K, _>(
        (initial, vec(updates, 0..=MAX_PERMUTED_UPDATES)),
        |start, ups| check_orders::<K>(&start, ups),
    )
}

/// [`check_commutative`], panicking with the counterexample (for use in `#[test]`s).
pub fn assert_commutative<K: StateKey>(updates: impl Strategy<Value = K::Update>)
where
    K::Update: fmt::Debug,
{
    if let Err(violation) = check_commutative::<K>(updates) {
        panic!("{violation}");
    }
}

fn run<K: StateKey, S>(
    strategy: (S, impl Strategy<Value = Vec<K::Update>>),
    test: impl Fn(S::Value, Vec<K::Update>) -> Result<(), TestCaseError>,
) -> Result<(), CommutativityViolation>
where
    S: Strategy,
    K::Update: fmt::Debug,
{
    let config = Config {
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new(config)
        .run(&strategy, |(start, ups)| test(start, ups))
        .map_err(|e| CommutativityViolation {
            key: K::KEY,
            message: e.to_string(),
        })
}

fn check_orders<K: StateKey>(
    start: &K::Value,
    updates: Vec<K::Update>,
) -> Result<(), TestCaseError> {
    let identity: Vec<usize> = (0..updates.len()).collect();
    let expected = outcome::<K>(start, &updates, &identity);
    let mut result = Ok(());
    for_each_permutation(updates.len(), &mut |order| {
        if result.is_ok() {
            let got = outcome::<K>(start, &updates, order);
            if got != expected {
                result = Err(TestCaseError::fail(format!(
                    "order {identity:?} gives {expected}, order {order:?} gives {got}"
                )));
            }
        }
    });
    result
}

/// The value after applying `updates` in `order`, as JSON, or `"failed"`.
fn outcome<K: StateKey>(start: &K::Value, updates: &[K::Update], order: &[usize]) -> String {
    let mut value = start.clone();
    for &i in order {
        let update = updates[i].clone();
        let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            K::apply(&mut value, update)
        }));
        if !matches!(applied, Ok(Ok(()))) {
            return "failed".to_owned();
        }
    }
    match serde_json::to_value(&value) {
        Ok(json) => json.to_string(),
        Err(e) => format!("unserializable ({e})"),
    }
}

/// Calls `f` with every permutation of `0..n` (Heap's algorithm).
fn for_each_permutation(n: usize, f: &mut dyn FnMut(&[usize])) {
    let mut order: Vec<usize> = (0..n).collect();
    let mut counters = vec![0; n];
    f(&order);
    let mut i = 1;
    while i < n {
        if counters[i] < i {
            let j = if i % 2 == 0 { 0 } else { counters[i] };
            order.swap(j, i);
            f(&order);
            counters[i] += 1;
            i = 1;
        } else {
            counters[i] = 0;
            i += 1;
        }
    }
}

#[cfg(test)]
pub(crate) fn permutations(n: usize) -> Vec<Vec<usize>> {
    let mut all = Vec::new();
    for_each_permutation(n, &mut |p| all.push(p.to_vec()));
    all
}
