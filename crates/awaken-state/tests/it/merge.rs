//! `merge_parallel` against the model: conflicts are symmetric and exactly the shared exclusive
//! keys, and a merge that succeeds does not depend on the order of its operands.

use std::collections::BTreeSet;

use awaken_state::StateError;
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
