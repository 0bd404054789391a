//! Export and restore against the model: round trips, scope partition, deltas.

use std::collections::{BTreeMap, BTreeSet};

use awaken_state::{KeyScope, PersistedState, UnknownKeyPolicy};
use proptest::prelude::*;
use serde_json::Value;

use crate::keys::{self, Model, Op, changing_op};

fn commits() -> impl Strategy<Value = Vec<Vec<Op>>> {
    prop::collection::vec(prop::collection::vec(changing_op(), 1..4), 0..12)
}

proptest! {
    /// Export → JSON text → restore into a fresh store gives every persisted key its value
    /// back; ephemeral keys are not exported and stay at their default.
    #[test]
    fn export_restore_round_trips_persisted_keys(commits in commits()) {
        let store = keys::store();
        let mut model = Model::default();
        for ops in &commits {
            prop_assert!(model.apply_all(ops));
            store.commit(keys::command(ops, false)).unwrap();
        }
        let exported = store.snapshot().export_persisted().unwrap();
        prop_assert_eq!(&exported.values, &model.persisted());
        let text = serde_json::to_string(&exported).unwrap();
        let read: PersistedState = serde_json::from_str(&text).unwrap();
        let fresh = keys::store();
        fresh.restore(&read, UnknownKeyPolicy::Reject).unwrap();
        let restored = Model { scratch: Vec::new(), ..model };
        prop_assert_eq!(keys::values(&fresh.snapshot()), restored.values());
        prop_assert_eq!(fresh.snapshot().export_persisted().unwrap().values, exported.values);
    }

    /// The exports of the three persisted scopes are disjoint and together are the whole
    /// persisted export; the ephemeral export is empty.
    #[test]
    fn scope_exports_partition_the_persisted_keys(commits in commits()) {
        let store = keys::store();
        for ops in &commits {
            store.commit(keys::command(ops, true)).unwrap();
        }
        let snapshot = store.snapshot();
        prop_assert!(snapshot.export(KeyScope::Ephemeral).unwrap().values.is_empty());
        let mut union = BTreeMap::new();
        for scope in KeyScope::PERSISTED {
            let part = snapshot.export(scope).unwrap();
            prop_assert!(!part.values.is_empty(), "every scope has a test key");
            for (key, value) in part.values {
                prop_assert_eq!(snapshot.registry().options(&key).unwrap().scope, scope);
                prop_assert!(union.insert(key, value).is_none(), "scopes overlap");
            }
        }
        prop_assert_eq!(union, snapshot.export_persisted().unwrap().values);
    }

    /// `export_changed(r)` is exactly the diff between the full exports at `r` and now (every
    /// generated update changes its value), per scope too, including after a restore.
    #[test]
    fn export_changed_is_the_diff_of_two_exports(
        commits in commits(),
        later in commits(),
        cut in any::<prop::sample::Index>(),
    ) {
        let store = keys::store();
        let mut snapshots = vec![store.snapshot()];
        for ops in commits.iter().chain(&later) {
            snapshots.push(store.commit(keys::command(ops, false)).unwrap().snapshot);
        }
        // Restoring a slice of an old export also counts as a change.
        let old = snapshots[commits.len()].export(KeyScope::Thread).unwrap();
        let restore_changes = store.restore(&old, UnknownKeyPolicy::Reject).unwrap().revision > 0;
        snapshots.push(store.snapshot());
        let now = store.snapshot();
        let since = &snapshots[cut.index(snapshots.len())];
        let diff = |a: &BTreeMap<String, Value>, b: &BTreeMap<String, Value>| -> BTreeMap<String, Value> {
            b.iter().filter(|(k, v)| a.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        let mut expected = diff(&since.export_persisted().unwrap().values, &now.export_persisted().unwrap().values);
        // A restore writes its keys even when the value is the same as before.
        if restore_changes && since.revision() < now.revision() {
            for key in old.values.keys() {
                expected.insert(key.clone(), now.get_json(key).unwrap());
            }
        }
        let changed = now.export_changed(since.revision()).unwrap();
        prop_assert_eq!(&changed.values, &expected);
        let mut by_scope = BTreeSet::new();
        for scope in KeyScope::PERSISTED {
            by_scope.extend(now.export_changed_in(scope, since.revision()).unwrap().values.into_keys());
        }
        prop_assert_eq!(by_scope, expected.into_keys().collect::<BTreeSet<_>>());
    }
}

proptest! {
    /// The one-pass, lazily serialized export of several scopes gives, per scope, the same keys
    /// and values as `export_changed_in`, whether read as JSON, taken as JSON or as text, and
    /// the same into the lists of an earlier export.
    #[test]
    fn export_changed_in_each_matches_export_changed_in(commits in commits(), cut in any::<prop::sample::Index>()) {
        let store = keys::store();
        let mut revisions = vec![0];
        for ops in &commits {
            store.commit(keys::command(ops, true)).unwrap();
            revisions.push(store.revision());
        }
        let since = revisions[cut.index(revisions.len())];
        let now = store.snapshot();
        let deltas = now.export_changed_in_each(KeyScope::PERSISTED, since);
        // Into lists kept from an earlier export (here all the keys): the same, nothing of the
        // earlier export left.
        let mut kept = now.export_changed_in_each(KeyScope::PERSISTED, 0);
        now.export_changed_in_each_into(KeyScope::PERSISTED, since, kept.each_mut());
        prop_assert_eq!(&kept, &deltas);
        for (scope, delta) in KeyScope::PERSISTED.into_iter().zip(deltas) {
            let expected = now.export_changed_in(scope, since).unwrap();
            prop_assert_eq!(delta.revision, expected.revision);
            prop_assert_eq!(&delta.to_persisted().unwrap(), &expected);
            for (key, value) in delta.values {
                let text: Value = serde_json::from_str(&value.to_text().unwrap()).unwrap();
                prop_assert_eq!(&text, &expected.values[key.as_ref()]);
                prop_assert_eq!(&value.into_json().unwrap(), &expected.values[key.as_ref()]);
            }
        }
    }
}
