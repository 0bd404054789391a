//! The store against the reference model: snapshot isolation, and failed commits (including
//! panicking reducers and stale bases) change nothing.

use awaken_state::{Snapshot, StateError};
use proptest::prelude::*;

use crate::keys::{self, Model, Op, any_op};

#[derive(Debug, Clone)]
enum Step {
    /// Commit these updates; `stale` sets a base revision one behind the store's.
    Commit {
        ops: Vec<Op>,
        as_json: bool,
        stale: bool,
    },
    /// Several commands in one transaction.
    Transaction(Vec<Vec<Op>>),
    /// Keep a snapshot to check at the end.
    Snapshot,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (prop::collection::vec(any_op(), 0..4), any::<bool>(), prop::bool::weighted(0.15))
            .prop_map(|(ops, as_json, stale)| Step::Commit { ops, as_json, stale }),
        1 => prop::collection::vec(prop::collection::vec(any_op(), 0..3), 0..4)
            .prop_map(Step::Transaction),
        2 => Just(Step::Snapshot),
    ]
}

proptest! {
    /// Every snapshot, read after any later sequence of commits, equals the model's state at the
    /// snapshot's revision; every failed commit leaves the store (values and revision) as it was.
    #[test]
    fn snapshots_are_isolated_and_failed_commits_change_nothing(
        steps in prop::collection::vec(step(), 1..40)
    ) {
        let store = keys::store();
        let mut model = Model::default();
        let mut history = vec![model.values()]; // history[revision]
        let mut kept: Vec<Snapshot> = vec![store.snapshot()];
        for step in steps {
            match step {
                Step::Commit { ops, as_json, stale } => {
                    let mut command = keys::command(&ops, as_json);
                    let stale = stale && store.revision() > 0;
                    if stale {
                        command = command.with_base_revision(store.revision() - 1);
                    }
                    let mut next = model.clone();
                    let valid = next.apply_all(&ops) && !stale;
                    let result = store.commit(command);
                    prop_assert_eq!(result.is_ok(), valid, "ops {:?}: {:?}", ops, result.as_ref().err());
                    if stale {
                        let is_stale = matches!(result, Err(StateError::StaleRevision { .. }));
                        prop_assert!(is_stale);
                    }
                    if valid && !ops.is_empty() {
                        model = next;
                        history.push(model.values());
                    }
                }
                Step::Transaction(commands) => {
                    let mut tx = store.transaction();
                    let mut staged = model.clone();
                    let mut changed = false;
                    for ops in &commands {
                        let valid = staged.apply_all(ops);
                        prop_assert_eq!(tx.apply(keys::command(ops, false)).is_ok(), valid);
                        changed |= valid && !ops.is_empty();
                        prop_assert_eq!(keys::values(&tx.snapshot()), staged.values());
                    }
                    let committed = tx.commit().unwrap();
                    if changed {
                        model = staged;
                        history.push(model.values());
                    }
                    prop_assert_eq!(committed.revision as usize, history.len() - 1);
                }
                Step::Snapshot => kept.push(store.snapshot()),
            }
            prop_assert_eq!(store.revision() as usize, history.len() - 1);
            prop_assert_eq!(keys::values(&store.snapshot()), model.values());
        }
        for snapshot in kept {
            prop_assert_eq!(&keys::values(&snapshot), &history[snapshot.revision() as usize]);
        }
    }
}

/// A first command that fails after writing a key in another leaf of the table than the one it
/// fails in leaves nothing staged (the transaction writes its first command into the base's
/// table without a copy of it, and must undo those writes).
#[test]
fn a_failing_first_command_leaves_nothing_staged() {
    let store = keys::store();
    let mut tx = store.transaction();
    let failing = keys::command(&[Op::Name('x'), Op::Phase(2), Op::Log(0)], false);
    assert!(tx.apply(failing).is_err());
    assert!(tx.is_empty());
    tx.apply(keys::command(&[Op::Count(3)], false)).unwrap();
    let mut model = Model::default();
    assert!(model.apply_all(&[Op::Count(3)]));
    assert_eq!(keys::values(&tx.snapshot()), model.values());
    assert_eq!(keys::values(&tx.commit().unwrap().snapshot), model.values());
}

/// A read through a key's handle finds what `get` finds; a handle from another registry, whose
/// place holds another key, is checked and never read as that key's value.
#[test]
fn reads_through_a_handle_match_get() {
    use awaken_state::{KeyOptions, KeyRegistry, StateCommand};
    let store = keys::store();
    store
        .commit(StateCommand::new().with_update::<keys::Count>(5))
        .unwrap();
    let count = store
        .registry()
        .handle::<keys::Count>()
        .expect("registered");
    let snapshot = store.snapshot();
    assert_eq!(snapshot.get_by(count).unwrap(), &5);
    // A registry with `Count` where this one has another key: read as a lookup.
    let mut other = KeyRegistry::new();
    other.register_key::<keys::Log>(KeyOptions::new()).unwrap();
    other
        .register_key::<keys::Count>(KeyOptions::new())
        .unwrap();
    let foreign = other.handle::<keys::Count>().expect("registered");
    assert_ne!(foreign, count);
    assert_eq!(snapshot.get_by(foreign).unwrap(), &5);
    // An unregistered key has no handle, and a handle read where the key is not registered is
    // the error `get` gives.
    assert!(KeyRegistry::new().handle::<keys::Count>().is_none());
    let empty = awaken_state::StateStore::new(std::sync::Arc::new(KeyRegistry::new()));
    let at = empty.snapshot().get_by(count).unwrap_err();
    assert_eq!(
        at.to_string(),
        empty
            .snapshot()
            .get::<keys::Count>()
            .unwrap_err()
            .to_string()
    );
    // `read` sees the current state without taking a snapshot.
    assert_eq!(store.read(|state| *state.get::<keys::Count>().unwrap()), 5);
}
