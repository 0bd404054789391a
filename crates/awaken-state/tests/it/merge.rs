//! `merge_parallel` and `ParallelBatch` against the model: conflicts are symmetric and exactly
//! the shared exclusive keys, a merge that succeeds does not depend on the order of its
//! operands, and a batch defers exactly the commands the greedy rule defers.

use std::collections::BTreeSet;

use awaken_state::{KeyRegistry, ParallelBatch, StateCommand, StateError, StateKey, StateStore};
use proptest::prelude::*;

use crate::keys::{self, Model, Op, changing_op};

fn expected_conflict(a: &[Op], b: &[Op]) -> Option<&'static str> {
    let exclusive = |ops: &[Op]| -> BTreeSet<&'static str> {
        ops.iter()
            .filter(|op| op.exclusive())
            .map(|op| op.key())
            .collect()
    };
    exclusive(a).intersection(&exclusive(b)).next().copied()
}

proptest! {
    #[test]
    fn merge_parallel_conflicts_iff_the_reverse_does(
        start in prop::collection::vec(changing_op(), 0..6),
        a in prop::collection::vec(changing_op(), 0..4),
        b in prop::collection::vec(changing_op(), 0..4),
    ) {
        let registry = keys::registry();
        let ab = keys::command(&a, false).merge_parallel(keys::command(&b, true), &registry);
        let ba = keys::command(&b, true).merge_parallel(keys::command(&a, false), &registry);
        let key = |r: &Result<_, StateError>| r.as_ref().err().and_then(|e| e.key().map(str::to_owned));
        let expected = expected_conflict(&a, &b).map(str::to_owned);
        prop_assert_eq!(key(&ab), expected.clone());
        prop_assert_eq!(key(&ba), expected.clone());
        if expected.is_none() {
            // Both orders commit to the same state, and to the state of a then b.
            let mut model = Model::default();
            prop_assert!(model.apply_all(&start));
            prop_assert!(model.apply_all(&a) && model.apply_all(&b));
            for merged in [ab.unwrap(), ba.unwrap()] {
                let store = keys::store();
                store.commit(keys::command(&start, false)).unwrap();
                let committed = store.commit(merged).unwrap();
                prop_assert_eq!(keys::values(&committed.snapshot), model.values());
            }
        }
    }
}

/// The phase engine's greedy batch, written against the model: a command joins unless one of
/// its exclusive keys is already written by a joined command.
fn expected_deferred(commands: &[Vec<Op>]) -> Vec<usize> {
    let mut written = BTreeSet::new();
    let mut deferred = Vec::new();
    for (i, ops) in commands.iter().enumerate() {
        let exclusive: BTreeSet<_> = ops
            .iter()
            .filter(|op| op.exclusive())
            .map(|op| op.key())
            .collect();
        if exclusive.is_disjoint(&written) {
            written.extend(exclusive);
        } else {
            deferred.push(i);
        }
    }
    deferred
}

/// The test keys registered in the reverse order, so every key has another index than in
/// `keys::registry()`.
fn reversed_registry() -> KeyRegistry {
    let forward = keys::registry();
    let mut names: Vec<_> = forward.keys().collect();
    names.reverse();
    let mut reversed = KeyRegistry::new();
    for info in names {
        let mut one = KeyRegistry::new();
        match info.name {
            n if n == keys::Count::KEY => one.register_key::<keys::Count>(info.options),
            n if n == keys::Log::KEY => one.register_key::<keys::Log>(info.options),
            n if n == keys::Tally::KEY => one.register_key::<keys::Tally>(info.options),
            n if n == keys::Scratch::KEY => one.register_key::<keys::Scratch>(info.options),
            n if n == keys::Name::KEY => one.register_key::<keys::Name>(info.options),
            _ => one.register_key::<keys::Phase>(info.options),
        }
        .unwrap();
        reversed.extend(&one).unwrap();
    }
    reversed
}

proptest! {
    #[test]
    fn parallel_batch_is_the_greedy_merge(
        commands in prop::collection::vec(
            (prop::collection::vec(changing_op(), 0..4), any::<bool>()),
            0..6,
        ),
    ) {
        let registry = keys::registry();
        let mut batch = ParallelBatch::new(&registry);
        let mut deferred = Vec::new();
        for (i, (ops, as_json)) in commands.iter().enumerate() {
            if !batch.offer(keys::command(ops, *as_json)) {
                deferred.push(i);
            }
        }
        let ops: Vec<Vec<Op>> = commands.iter().map(|(ops, _)| ops.clone()).collect();
        prop_assert_eq!(&deferred, &expected_deferred(&ops));
        let joined: Vec<StateCommand> = commands
            .iter()
            .enumerate()
            .filter(|(i, _)| !deferred.contains(i))
            .map(|(_, (ops, as_json))| keys::command(ops, *as_json))
            .collect();
        let merged = batch.into_command();
        prop_assert_eq!(
            merged.to_json().unwrap(),
            StateCommand::concat(joined).to_json().unwrap()
        );
        // The batch commits to the state of its commands applied in order, also in a store
        // whose registry gives every key another index than the one the batch looked up.
        let mut model = Model::default();
        for (i, ops) in ops.iter().enumerate() {
            if !deferred.contains(&i) {
                prop_assert!(model.apply_all(ops));
            }
        }
        let elsewhere = StateStore::new(reversed_registry());
        let committed = elsewhere.commit(merged.clone()).unwrap();
        prop_assert_eq!(keys::values(&committed.snapshot), model.values());
        let committed = keys::store().commit(merged).unwrap();
        prop_assert_eq!(keys::values(&committed.snapshot), model.values());
    }
}
