// Tests unwrap freely: a panic is a failed test with its location.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use expect_test::{Expect, expect};
use serde_json::json;

use crate::table::Table;
use crate::*;

/// Commutative counter, run scope.
struct Counter;
impl StateKey for Counter {
    const KEY: &'static str = "test.counter";
    type Value = i64;
    type Update = i64;
    fn apply(value: &mut i64, add: i64) -> Result<(), StateError> {
        *value = value
            .checked_add(add)
            .ok_or_else(|| StateError::invalid_update(Self::KEY, "overflow"))?;
        Ok(())
    }
}

/// Append-only log, thread scope. Rejects "" and panics on "panic" (after pushing, to show that
/// a half-changed value is discarded).
struct Log;
impl StateKey for Log {
    const KEY: &'static str = "test.log";
    type Value = Vec<String>;
    type Update = String;
    fn apply(value: &mut Vec<String>, line: String) -> Result<(), StateError> {
        if line.is_empty() {
            return Err(StateError::invalid_update(Self::KEY, "empty line"));
        }
        value.push(line.clone());
        if line == "panic" {
            panic!("log reducer asked to panic");
        }
        Ok(())
    }
}

/// Last writer wins, ephemeral.
struct Mode;
impl StateKey for Mode {
    const KEY: &'static str = "test.mode";
    type Value = String;
    type Update = String;
    fn apply(value: &mut String, mode: String) -> Result<(), StateError> {
        *value = mode;
        Ok(())
    }
}

/// Profile-scoped quota.
struct Quota;
impl StateKey for Quota {
    const KEY: &'static str = "test.quota";
    type Value = u32;
    type Update = u32;
    fn apply(value: &mut u32, quota: u32) -> Result<(), StateError> {
        *value = quota;
        Ok(())
    }
}

/// Another type claiming `Counter`'s name.
struct Impostor;
impl StateKey for Impostor {
    const KEY: &'static str = "test.counter";
    type Value = i64;
    type Update = i64;
    fn apply(value: &mut i64, v: i64) -> Result<(), StateError> {
        *value = v;
        Ok(())
    }
}

fn registry() -> KeyRegistry {
    let mut r = KeyRegistry::new();
    r.register_key::<Counter>(KeyOptions::new().with_merge(MergeStrategy::Commutative))
        .unwrap();
    r.register_key::<Log>(KeyOptions::new().with_scope(KeyScope::Thread))
        .unwrap();
    r.register_key::<Mode>(KeyOptions::new().with_scope(KeyScope::Ephemeral))
        .unwrap();
    r.register_profile_key::<Quota>().unwrap();
    r
}

fn store() -> StateStore {
    StateStore::new(registry())
}

/// Revision and every value, for comparing whole states.
fn state(snapshot: &Snapshot) -> String {
    format!("revision {}\n{}", snapshot.revision(), snapshot.dump())
}

/// Commands that fail, each for another reason, named, each starting from what `lead` makes:
/// an unknown key, a type mismatch, a stale base, bad JSON, a reducer's error, a reducer's
/// panic, an overflow.
fn failing_commands(lead: impl Fn() -> StateCommand) -> Vec<(&'static str, StateCommand)> {
    let mut unknown = lead();
    unknown.update_json("test.nope", json!(1));
    let mut bad_json = lead();
    bad_json.update_json("test.counter", json!("one"));
    vec![
        ("unknown key", unknown),
        ("type mismatch", lead().with_update::<Impostor>(5)),
        (
            "stale base",
            lead().with_update::<Counter>(1).with_base_revision(0),
        ),
        ("bad json", bad_json),
        ("reducer error", lead().with_update::<Log>(String::new())),
        ("reducer panic", lead().with_update::<Log>("panic".into())),
        ("overflow", lead().with_update::<Counter>(i64::MAX)),
    ]
}

/// Commits each named command, which must fail and leave the store's state `before`; returns
/// the errors, a line each.
fn failed_commits(
    store: &StateStore,
    before: &str,
    cases: impl IntoIterator<Item = (&'static str, StateCommand)>,
) -> String {
    let mut out = String::new();
    for (name, command) in cases {
        let err = store.commit(command).unwrap_err();
        out.push_str(&format!("{name}: {err}\n"));
        assert_eq!(state(&store.snapshot()), before, "{name} changed the store");
    }
    out
}

fn check(actual: impl AsRef<str>, expected: Expect) {
    expected.assert_eq(actual.as_ref());
}

#[test]
fn second_registration_of_a_name_fails_on_every_path() {
    let mut r = registry();
    let same = r.register_key::<Counter>(KeyOptions::new()).unwrap_err();
    let other = r.register_key::<Impostor>(KeyOptions::new()).unwrap_err();
    let profile = r.register_profile_key::<Log>().unwrap_err();
    let mut plugin = KeyRegistry::new();
    struct Fresh;
    impl StateKey for Fresh {
        const KEY: &'static str = "test.fresh";
        type Value = u8;
        type Update = u8;
        fn apply(v: &mut u8, u: u8) -> Result<(), StateError> {
            *v = u;
            Ok(())
        }
    }
    plugin.register_key::<Fresh>(KeyOptions::new()).unwrap();
    plugin.register_key::<Impostor>(KeyOptions::new()).unwrap();
    let across = r.extend(&plugin).unwrap_err();
    check(
        format!(
            "{same}\n{other}\n{profile}\n{across}\nfresh registered: {}\nlen {}",
            r.contains("test.fresh"),
            r.len()
        ),
        expect![[r#"
            state key `test.counter` is already registered (as awaken_state::tests::Counter; again as awaken_state::tests::Counter)
            state key `test.counter` is already registered (as awaken_state::tests::Counter; again as awaken_state::tests::Impostor)
            state key `test.log` is already registered (as awaken_state::tests::Log; again as awaken_state::tests::Log)
            state key `test.counter` is already registered (as awaken_state::tests::Counter; again as awaken_state::tests::Impostor)
            fresh registered: false
            len 4"#]],
    );
    let mut empty = KeyRegistry::new();
    empty.extend(&plugin).unwrap();
    assert_eq!(
        empty.keys().map(|k| k.name).collect::<Vec<_>>(),
        ["test.fresh", "test.counter"]
    );
}

/// A registry built with room to spare gives it back and still finds every key, by name and
/// by type (a store built on it reads and writes them).
#[test]
fn a_shrunk_registry_keeps_its_keys() {
    let mut r = KeyRegistry::with_capacity(10);
    r.extend(&registry()).unwrap();
    r.shrink_to_fit();
    assert_eq!(r.capacity(), r.len());
    assert_eq!(r.len(), 4);
    assert!(r.options("test.mode").is_some());
    let store = StateStore::new(r);
    store
        .commit(StateCommand::new().with_update::<Counter>(2))
        .unwrap();
    assert_eq!(store.read(|s| *s.get::<Counter>().unwrap()), 2);
}

#[test]
fn registry_reports_options() {
    let r = registry();
    check(
        format!("{r:?}"),
        expect![[
            r#"[KeyInfo { name: "test.counter", type_name: "awaken_state::tests::Counter", options: KeyOptions { scope: Run, merge: Commutative, visible: false } }, KeyInfo { name: "test.log", type_name: "awaken_state::tests::Log", options: KeyOptions { scope: Thread, merge: Exclusive, visible: false } }, KeyInfo { name: "test.mode", type_name: "awaken_state::tests::Mode", options: KeyOptions { scope: Ephemeral, merge: Exclusive, visible: false } }, KeyInfo { name: "test.quota", type_name: "awaken_state::tests::Quota", options: KeyOptions { scope: Profile, merge: Exclusive, visible: false } }]"#
        ]],
    );
    assert!(r.is_exclusive("test.log"));
    assert!(!r.is_exclusive("test.counter"));
    assert!(r.is_exclusive("not.registered"));
}

#[test]
fn visible_keys_are_counted_as_registered_and_listed_in_order() {
    let mut r = registry();
    assert!(!r.has_visible_keys());
    assert_eq!(r.visible_keys().count(), 0);
    let mut shown = KeyRegistry::new();
    shown
        .register_key::<Tally>(KeyOptions::new().with_visible(true))
        .unwrap();
    // A rejected registration counts nothing.
    let again = shown.register_key::<Tally>(KeyOptions::new().with_visible(true));
    assert!(again.is_err());
    r.extend(&shown).unwrap();
    assert!(r.has_visible_keys());
    let names: Vec<_> = r.visible_keys().map(|k| k.name).collect();
    assert_eq!(names, [<Tally as StateKey>::KEY]);
    assert!(!KeyOptions::new().visible);
    assert!(
        !KeyOptions::new()
            .with_visible(true)
            .with_visible(false)
            .visible
    );
    // Options stored before the field existed read as not visible.
    let old: KeyOptions =
        serde_json::from_str(r#"{"scope":"thread","merge":"exclusive"}"#).unwrap();
    assert_eq!(old, KeyOptions::new().with_scope(KeyScope::Thread));
}

#[test]
fn commits_apply_typed_and_json_updates_and_bump_the_revision() {
    let store = store();
    let before = store.snapshot();
    let c1 = store
        .commit(
            StateCommand::new()
                .with_update::<Counter>(2)
                .with_update::<Log>("a".into()),
        )
        .unwrap();
    let mut json = StateCommand::new();
    json.update_json("test.counter", json!(40))
        .update_json("test.log", json!("b"));
    json.update_json("test.mode", json!("plan"));
    let c2 = store.commit(json).unwrap();
    assert_eq!((c1.revision, c2.revision), (1, 2));
    assert_eq!(*store.snapshot().get::<Counter>().unwrap(), 42);
    check(
        format!("{}\n{}", state(&before), state(&c2.snapshot)),
        expect![[r#"
            revision 0
            test.counter = 0
            test.log = []
            test.mode = ""
            test.quota = 0

            revision 2
            test.counter = 42
            test.log = ["a","b"]
            test.mode = "plan"
            test.quota = 0
        "#]],
    );
    assert_eq!(c2.snapshot.changed_at("test.log").unwrap(), 2);
    assert_eq!(c2.snapshot.changed_at("test.quota").unwrap(), 0);
}

#[test]
fn a_failed_commit_changes_nothing() {
    let store = store();
    store
        .commit(StateCommand::new().with_update::<Log>("kept".into()))
        .unwrap();
    let before = state(&store.snapshot());
    // Each failing update follows a good one: nothing of the command is kept.
    let cases = failing_commands(|| StateCommand::new().with_update::<Counter>(1));
    check(
        failed_commits(&store, &before, cases),
        expect![[r#"
            unknown key: state key `test.nope` is not registered
            type mismatch: state key `test.counter` is registered as awaken_state::tests::Counter, used as awaken_state::tests::Impostor
            stale base: stale state: command expects revision 0, store is at 1
            bad json: update of state key `test.counter` is not valid JSON for its type: invalid type: string "one", expected i64
            reducer error: update of state key `test.log` rejected: empty line
            reducer panic: reducer of state key `test.log` panicked: log reducer asked to panic
            overflow: update of state key `test.counter` rejected: overflow
        "#]],
    );
    // The store still works after a panicking reducer (no poisoned lock).
    assert_eq!(
        store
            .commit(StateCommand::new().with_update::<Counter>(1))
            .unwrap()
            .revision,
        2
    );
}

/// A one-key command commits in place when no snapshot is held outside the store: every
/// failure still changes nothing, and a snapshot held across such a commit never changes.
#[test]
fn one_key_commits_in_place_change_nothing_on_failure_and_no_snapshot() {
    let store = store();
    store
        .commit(StateCommand::new().with_update::<Counter>(1))
        .unwrap();
    // No snapshot is held from here (the state is kept as text).
    let before = state(&store.snapshot());
    let cases = failing_commands(StateCommand::new);
    check(
        failed_commits(&store, &before, cases),
        expect![[r#"
            unknown key: state key `test.nope` is not registered
            type mismatch: state key `test.counter` is registered as awaken_state::tests::Counter, used as awaken_state::tests::Impostor
            stale base: stale state: command expects revision 0, store is at 1
            bad json: update of state key `test.counter` is not valid JSON for its type: invalid type: string "one", expected i64
            reducer error: update of state key `test.log` rejected: empty line
            reducer panic: reducer of state key `test.log` panicked: log reducer asked to panic
            overflow: update of state key `test.counter` rejected: overflow
        "#]],
    );
    // In place: the same version, with the value, its change revision and the store's
    // revision moved together.
    let version = |store: &StateStore| Arc::as_ptr(&store.snapshot().version) as usize;
    let at = version(&store);
    let committed = store
        .commit(StateCommand::new().with_update::<Counter>(2))
        .unwrap();
    assert_eq!(committed.revision, 2);
    assert_eq!(Arc::as_ptr(&committed.snapshot.version) as usize, at);
    assert_eq!(committed.snapshot.get::<Counter>().unwrap(), &3);
    let mut changed = Vec::new();
    committed
        .snapshot
        .version
        .table
        .for_each_changed(1, &mut |i, _| changed.push(i));
    assert_eq!(
        changed.len(),
        1,
        "only the counter changed since revision 1"
    );
    // A snapshot held across a one-key commit keeps its state (the commit copies instead).
    let held = store.snapshot();
    let held_state = state(&held);
    drop(committed);
    store
        .commit(StateCommand::new().with_update::<Counter>(4))
        .unwrap();
    assert_eq!(state(&held), held_state);
    assert_eq!(held.get::<Counter>().unwrap(), &3);
    assert_ne!(version(&store), Arc::as_ptr(&held.version) as usize);
    assert_eq!(store.snapshot().get::<Counter>().unwrap(), &7);
    assert_eq!(store.revision(), 3);
}

/// A list whose reducer changes nothing when it fails (it checks first), so its typed updates
/// are applied in place.
struct Tally;
impl StateKey for Tally {
    const KEY: &'static str = "test.tally";
    type Value = Vec<u32>;
    type Update = u32;
    const APPLY_IN_PLACE: bool = true;
    fn apply(value: &mut Vec<u32>, n: u32) -> Result<(), StateError> {
        if n == 0 {
            return Err(StateError::invalid_update(Self::KEY, "zero"));
        }
        value.push(n);
        Ok(())
    }
}

#[test]
fn an_in_place_update_changes_the_stored_value_unless_a_snapshot_holds_it() {
    let mut registry = registry();
    registry.register_key::<Tally>(KeyOptions::new()).unwrap();
    let store = StateStore::new(registry);
    let at = store.registry().handle::<Tally>().unwrap();
    assert_eq!(store.update_by(at, 1).unwrap(), 1);
    // Nothing else holds the value: the next update pushes into the same vector.
    let first = store.read(|s| s.get::<Tally>().unwrap().as_ptr());
    assert_eq!(store.update_by(at, 2).unwrap(), 2);
    store.read(|s| {
        assert_eq!(s.get::<Tally>().unwrap(), &[1, 2]);
        assert_eq!(
            s.get::<Tally>().unwrap().as_ptr(),
            first,
            "written in place"
        );
    });
    // A held snapshot keeps what it saw; the update goes to a copy.
    let held = store.snapshot();
    assert_eq!(store.update_by(at, 3).unwrap(), 3);
    assert_eq!(held.get::<Tally>().unwrap(), &[1, 2]);
    assert_eq!(store.snapshot().get::<Tally>().unwrap(), &[1, 2, 3]);
    drop(held);
    // A rejected update changes neither the value nor the revision, in place or not.
    let before = state(&store.snapshot());
    let err = store.update_by(at, 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "update of state key `test.tally` rejected: zero"
    );
    assert_eq!(state(&store.snapshot()), before);
    let held = store.snapshot();
    store.update_by(at, 0).unwrap_err();
    assert_eq!(state(&store.snapshot()), before);
    drop(held);
    // Its change revision is the update's, as for any commit.
    assert_eq!(store.update_by(at, 4).unwrap(), 4);
    assert_eq!(store.snapshot().changed_at(Tally::KEY).unwrap(), 4);
    let mut changed = Vec::new();
    store
        .snapshot()
        .version
        .table
        .for_each_changed(3, &mut |i, _| changed.push(i));
    assert_eq!(changed, [at.index()]);
}

/// A key's value before any update is made once per OS thread and shared by every store built
/// there (a registry is built per run); an update, in place or not, never changes it.
#[test]
fn stores_share_each_default_and_never_change_it() {
    let mut registry = registry();
    registry.register_key::<Tally>(KeyOptions::new()).unwrap();
    let (a, b) = (StateStore::new(registry.clone()), StateStore::new(registry));
    let fresh = StateStore::new({
        let mut r = KeyRegistry::new();
        r.register_key::<Tally>(KeyOptions::new()).unwrap();
        r
    });
    let ptr = |s: &StateStore| s.read(|s| s.get::<Tally>().unwrap() as *const Vec<u32>);
    assert_eq!(ptr(&a), ptr(&b));
    assert_eq!(
        ptr(&a),
        ptr(&fresh),
        "a registry built afresh shares it too"
    );
    let at = a.registry().handle::<Tally>().unwrap();
    a.update_by(at, 1).unwrap();
    a.update_by(at, 2).unwrap();
    assert_eq!(a.snapshot().get::<Tally>().unwrap(), &[1, 2]);
    assert!(b.snapshot().get::<Tally>().unwrap().is_empty());
    assert!(fresh.snapshot().get::<Tally>().unwrap().is_empty());
    // Another OS thread makes its own.
    let other = std::thread::spawn(|| {
        let mut r = KeyRegistry::new();
        r.register_key::<Tally>(KeyOptions::new()).unwrap();
        let s = StateStore::new(r);
        s.read(|s| s.get::<Tally>().unwrap() as *const Vec<u32> as usize)
    })
    .join()
    .unwrap();
    assert_ne!(other, ptr(&b) as usize);
}

#[test]
fn the_lock_free_revision_follows_every_kind_of_write() {
    let store = store();
    let same = |what: &str| {
        assert_eq!(
            store.revision(),
            store.snapshot().revision(),
            "after {what}"
        );
    };
    same("nothing");
    store.update::<Counter>(1).unwrap();
    same("a typed update in place");
    let held = store.snapshot();
    store.update::<Counter>(1).unwrap();
    same("a typed update past a held snapshot");
    drop(held);
    store
        .commit(StateCommand::new().with_update::<Mode>("a".into()))
        .unwrap();
    same("a one-key command in place");
    store
        .commit(
            StateCommand::new()
                .with_update::<Counter>(1)
                .with_update::<Mode>("b".into()),
        )
        .unwrap();
    same("a published command");
    let mut tx = store.transaction();
    tx.apply(StateCommand::new().with_update::<Counter>(1))
        .unwrap();
    tx.commit().unwrap();
    same("a transaction");
    let persisted = store.snapshot().export(KeyScope::Run).unwrap();
    store.restore(&persisted, UnknownKeyPolicy::Reject).unwrap();
    same("a restore");
    let before = store.revision();
    store.update::<Log>(String::new()).unwrap_err();
    store
        .commit(StateCommand::new().with_update::<Log>(String::new()))
        .unwrap_err();
    same("failed writes");
    assert_eq!(store.revision(), before, "a failed write advances nothing");
    assert_eq!(before, 6);
}

#[test]
fn a_typed_update_commits_like_a_one_update_command() {
    let store = store();
    let at = store.registry().handle::<Counter>().unwrap();
    assert_eq!(store.update_by(at, 1).unwrap(), 1);
    let before = state(&store.snapshot());
    // Failures change nothing and read as a command's: a rejected or panicking reducer, a key
    // registered with another type. A handle from another registry, whose place here holds
    // another key, is not trusted: the key's own place is looked up.
    let mut errors = String::new();
    let log_at = store.registry().handle::<Log>().unwrap();
    let mut swapped = KeyRegistry::new();
    swapped.register_key::<Log>(KeyOptions::new()).unwrap();
    swapped.register_key::<Counter>(KeyOptions::new()).unwrap();
    let foreign = swapped.handle::<Counter>().unwrap();
    assert_eq!(format!("{foreign:?}"), "KeyHandle(\"test.counter\" at 1)");
    for (name, result) in [
        ("reducer error", store.update_by(log_at, String::new())),
        ("reducer panic", store.update_by(log_at, "panic".into())),
        ("overflow", store.update_by(foreign, i64::MAX)),
        ("impostor", store.update::<Impostor>(5)),
    ] {
        errors.push_str(&format!("{name}: {}\n", result.unwrap_err()));
        assert_eq!(state(&store.snapshot()), before, "{name} changed the store");
    }
    check(
        errors,
        expect![[r#"
            reducer error: update of state key `test.log` rejected: empty line
            reducer panic: reducer of state key `test.log` panicked: log reducer asked to panic
            overflow: update of state key `test.counter` rejected: overflow
            impostor: state key `test.counter` is registered as awaken_state::tests::Counter, used as awaken_state::tests::Impostor
        "#]],
    );
    // A good update through a foreign handle still updates its own key, with its change
    // revision.
    assert_eq!(store.update_by(foreign, 2).unwrap(), 2);
    assert_eq!(store.snapshot().get_by(foreign).unwrap(), &3);
    let snapshot = store.snapshot();
    assert_eq!(snapshot.get::<Counter>().unwrap(), &3);
    let mut changed = Vec::new();
    snapshot
        .version
        .table
        .for_each_changed(1, &mut |i, _| changed.push(i));
    assert_eq!(changed, [at.index()]);
    // A snapshot held across the update keeps its state (the command path copies).
    let held_state = state(&snapshot);
    assert_eq!(store.update::<Counter>(4).unwrap(), 3);
    assert_eq!(state(&snapshot), held_state);
    drop(snapshot);
    assert_eq!(store.snapshot().get::<Counter>().unwrap(), &7);
    // A value an export still holds is not written into: the update publishes a new one. One
    // nothing else holds is written in place.
    let [exported] = store.snapshot().export_changed_in_each([KeyScope::Run], 0);
    assert_eq!(store.update::<Counter>(10).unwrap(), 4);
    assert_eq!(exported.values[Counter::KEY], StateValue::json(json!(7)));
    drop(exported);
    assert_eq!(store.update::<Counter>(100).unwrap(), 5);
    assert_eq!(store.snapshot().get::<Counter>().unwrap(), &117);
    // Observers and a journal see it as the command it stands for.
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    store.subscribe(move |c: &Committed| s.store(c.revision, Ordering::SeqCst));
    assert_eq!(store.update_by(at, 1).unwrap(), 6);
    assert_eq!(seen.load(Ordering::SeqCst), 6);
    let journaled = StateStore::with_journal(registry(), KeyScope::Profile);
    journaled.update::<Quota>(3).unwrap();
    journaled.update::<Counter>(1).unwrap();
    let journal = journaled.take_journal();
    assert_eq!(
        journal.len(),
        1,
        "only the profile key's update: {journal:?}"
    );
    assert_eq!(journal[0].0, Quota::KEY);
    assert_eq!(journaled.revision(), 2);
}

#[test]
fn empty_commands_keep_the_revision_but_still_check_the_base() {
    let store = store();
    store
        .commit(StateCommand::new().with_update::<Counter>(1))
        .unwrap();
    assert_eq!(store.commit(StateCommand::new()).unwrap().revision, 1);
    assert!(matches!(
        store.commit(StateCommand::new().with_base_revision(0)),
        Err(StateError::StaleRevision {
            expected: 0,
            actual: 1
        })
    ));
    let mut effect_only = StateCommand::new();
    effect_only.emit_json("audit", json!({"n": 1}));
    let committed = store.commit(effect_only).unwrap();
    assert_eq!(committed.revision, 2);
    assert_eq!(
        committed.effects,
        [Effect {
            key: "audit".into(),
            payload: json!({"n": 1})
        }]
    );
}

#[test]
fn typed_reads_check_the_key_type() {
    let store = store();
    let snapshot = store.snapshot();
    struct Unregistered;
    impl StateKey for Unregistered {
        const KEY: &'static str = "test.unregistered";
        type Value = ();
        type Update = ();
        fn apply(_: &mut (), _: ()) -> Result<(), StateError> {
            Ok(())
        }
    }
    check(
        format!(
            "{}\n{}\n{}",
            snapshot.get::<Impostor>().unwrap_err(),
            snapshot.get::<Unregistered>().unwrap_err(),
            snapshot.get_json("test.none").unwrap_err()
        ),
        expect![[r#"
            state key `test.counter` is registered as awaken_state::tests::Counter, used as awaken_state::tests::Impostor
            state key `test.unregistered` is not registered
            state key `test.none` is not registered"#]],
    );
}

#[test]
fn commands_serialize_and_read_back_as_json_updates() {
    let mut command = StateCommand::new()
        .with_update::<Counter>(3)
        .with_base_revision(7);
    command.update_json("test.log", json!("x"));
    command.schedule_json("BeforeInference", "compact", json!({"keep": 4}));
    command.emit_json("audit", json!(null));
    let text = serde_json::to_string(&command).unwrap();
    check(
        &text,
        expect![[
            r#"{"base_revision":7,"updates":[{"key":"test.counter","update":3},{"key":"test.log","update":"x"}],"actions":[{"phase":"BeforeInference","key":"compact","payload":{"keep":4}}],"effects":[{"key":"audit","payload":null}]}"#
        ]],
    );
    let back: StateCommand = serde_json::from_str(&text).unwrap();
    assert!(command.updates()[0].is_typed());
    assert!(!back.updates()[0].is_typed());
    assert_eq!(serde_json::to_string(&back).unwrap(), text);
    // Both forms commit to the same state.
    let (a, b) = (store(), store());
    a.commit(StateCommand::new().with_update::<Counter>(1))
        .unwrap(); // to revision 1 ...
    b.commit(StateCommand::new().with_update::<Counter>(1))
        .unwrap();
    let (command, back) = (rebase(command, 1), rebase(back, 1));
    assert_eq!(
        state(&a.commit(command).unwrap().snapshot),
        state(&b.commit(back).unwrap().snapshot)
    );
    let unknown_field = serde_json::from_str::<StateCommand>(r#"{"updates":[],"extra":1}"#);
    assert!(unknown_field.is_err());
}

fn rebase(mut command: StateCommand, revision: u64) -> StateCommand {
    command.base_revision = Some(revision);
    command
}

#[test]
fn merge_parallel_rejects_only_shared_exclusive_keys() {
    let r = registry();
    let log = |s: &str| StateCommand::new().with_update::<Log>(s.into());
    let both = |s: &str| {
        StateCommand::new()
            .with_update::<Mode>(s.into())
            .with_update::<Log>(s.into())
    };
    let counter = |n| StateCommand::new().with_update::<Counter>(n);
    // One command writing a key twice is not a conflict.
    let twice = log("a").with_update::<Log>("b".into());
    assert!(twice.conflict_with(&counter(1), &r).is_none());
    // Commutative keys merge.
    let merged = counter(1).merge_parallel(counter(2), &r).unwrap();
    assert_eq!(merged.updates().len(), 2);
    // The reported key is the first conflicting one in name order, whichever side comes first.
    let ab = both("a").merge_parallel(both("b"), &r).unwrap_err();
    let ba = both("b").merge_parallel(both("a"), &r).unwrap_err();
    check(
        format!("{ab}\n{ba}"),
        expect![[r#"
        parallel commands both write exclusive state key `test.log`
        parallel commands both write exclusive state key `test.log`"#]],
    );
    // Merge keeps order: self first.
    let mut a = log("a");
    a.emit_json("e1", json!(1));
    let mut b = counter(5);
    b.emit_json("e2", json!(2));
    let m = a.merge_parallel(b.with_base_revision(3), &r).unwrap();
    check(
        serde_json::to_string(&m).unwrap(),
        expect![[
            r#"{"base_revision":3,"updates":[{"key":"test.log","update":"a"},{"key":"test.counter","update":5}],"actions":[],"effects":[{"key":"e1","payload":1},{"key":"e2","payload":2}]}"#
        ]],
    );
}

#[test]
fn extend_keeps_the_lower_base_revision() {
    let mut a = StateCommand::new().with_base_revision(5);
    a.extend(StateCommand::new().with_base_revision(3));
    assert_eq!(a.base_revision(), Some(3));
    let mut b = StateCommand::new();
    b.extend(StateCommand::new().with_base_revision(9));
    assert_eq!(b.base_revision(), Some(9));
}

#[test]
fn a_transaction_publishes_several_commands_as_one_revision() {
    let store = store();
    let revisions = Arc::new(Mutex::new(Vec::new()));
    let seen = revisions.clone();
    store.subscribe(move |c: &Committed| seen.lock().unwrap().push((c.revision, c.effects.len())));
    let mut tx = store.transaction();
    let mut first = StateCommand::new().with_update::<Log>("one".into());
    first.emit_json("e", json!(1));
    tx.apply(first).unwrap();
    let staged = tx.snapshot();
    assert!(staged.is_staged());
    assert_eq!(staged.get::<Log>().unwrap(), &["one"]);
    assert_eq!(
        store.snapshot().get::<Log>().unwrap().len(),
        0,
        "not published yet"
    );
    // A failing command leaves the transaction as it was.
    let err = tx.apply(
        StateCommand::new()
            .with_update::<Log>("two".into())
            .with_update::<Log>(String::new()),
    );
    assert!(err.is_err());
    assert_eq!(tx.snapshot().get::<Log>().unwrap(), &["one"]);
    tx.apply(
        StateCommand::new()
            .with_update::<Log>("three".into())
            .with_base_revision(0),
    )
    .unwrap();
    assert_eq!(
        staged.get::<Log>().unwrap(),
        &["one"],
        "staged snapshots are immutable too"
    );
    let committed = tx.commit().unwrap();
    assert_eq!(committed.revision, 1);
    check(
        state(&store.snapshot()),
        expect![[r#"
        revision 1
        test.counter = 0
        test.log = ["one","three"]
        test.mode = ""
        test.quota = 0
    "#]],
    );
    assert_eq!(*revisions.lock().unwrap(), [(1, 1)]);
}

#[test]
fn a_transaction_fails_if_the_store_moved() {
    let store = store();
    let mut tx = store.transaction();
    tx.apply(StateCommand::new().with_update::<Counter>(1))
        .unwrap();
    store
        .commit(StateCommand::new().with_update::<Counter>(10))
        .unwrap();
    assert!(matches!(
        tx.commit(),
        Err(StateError::StaleRevision {
            expected: 0,
            actual: 1
        })
    ));
    assert_eq!(*store.snapshot().get::<Counter>().unwrap(), 10);
    assert!(
        store.transaction().commit().is_ok_and(|c| c.revision == 1),
        "empty tx publishes nothing"
    );
}

#[test]
fn observers_run_after_the_swap_outside_the_lock() {
    let store = Arc::new(store());
    let weak = Arc::downgrade(&store);
    let calls = Arc::new(AtomicU64::new(0));
    let reentered = Arc::new(AtomicBool::new(false));
    let (c, r) = (calls.clone(), reentered.clone());
    let id = store.subscribe(move |committed: &Committed| {
        c.fetch_add(1, Ordering::SeqCst);
        let store = weak.upgrade().unwrap();
        // The new state is already visible ...
        assert_eq!(store.revision(), committed.revision);
        // ... and the store accepts a commit from inside an observer.
        if !r.swap(true, Ordering::SeqCst) {
            store
                .commit(StateCommand::new().with_update::<Counter>(100))
                .unwrap();
        }
    });
    store
        .commit(StateCommand::new().with_update::<Counter>(1))
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(*store.snapshot().get::<Counter>().unwrap(), 101);
    assert!(store.unsubscribe(id));
    assert!(!store.unsubscribe(id));
    store
        .commit(StateCommand::new().with_update::<Counter>(1))
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn export_by_scope_and_restore() {
    let store = store();
    store
        .commit(
            StateCommand::new()
                .with_update::<Counter>(7)
                .with_update::<Log>("l".into())
                .with_update::<Mode>("m".into())
                .with_update::<Quota>(9),
        )
        .unwrap();
    let snapshot = store.snapshot();
    let mut out = String::new();
    for scope in KeyScope::ALL {
        out.push_str(&format!(
            "{scope:?}: {}\n",
            serde_json::to_string(&snapshot.export(scope).unwrap()).unwrap()
        ));
    }
    check(
        out,
        expect![[r#"
        Ephemeral: {"revision":1,"values":{}}
        Run: {"revision":1,"values":{"test.counter":7}}
        Thread: {"revision":1,"values":{"test.log":["l"]}}
        Profile: {"revision":1,"values":{"test.quota":9}}
    "#]],
    );
    let fresh = self::store();
    let restored = fresh
        .restore(
            &snapshot.export_persisted().unwrap(),
            UnknownKeyPolicy::Reject,
        )
        .unwrap();
    assert_eq!((restored.revision, restored.restored.len()), (1, 3));
    check(
        state(&fresh.snapshot()),
        expect![[r#"
        revision 1
        test.counter = 7
        test.log = ["l"]
        test.mode = ""
        test.quota = 9
    "#]],
    );
}

#[test]
fn restore_is_all_or_nothing() {
    let store = store();
    let with = |pairs: &[(&str, serde_json::Value)]| PersistedState {
        revision: 0,
        values: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    };
    let cases = [
        with(&[("test.counter", json!(1)), ("test.gone", json!(2))]),
        with(&[("test.counter", json!(1)), ("test.mode", json!("x"))]),
        with(&[
            ("test.counter", json!(1)),
            ("test.log", json!("not a list")),
        ]),
    ];
    let mut out = String::new();
    for case in &cases {
        out.push_str(&format!(
            "{}\n",
            store.restore(case, UnknownKeyPolicy::Reject).unwrap_err()
        ));
        assert_eq!(store.revision(), 0);
        assert_eq!(*store.snapshot().get::<Counter>().unwrap(), 0);
    }
    check(
        out,
        expect![[r#"
        state key `test.gone` is not registered
        state key `test.mode` is ephemeral and cannot be restored
        persisted value of state key `test.log` is not valid for its type: invalid type: string "not a list", expected a sequence
    "#]],
    );
    let skipped = store.restore(&cases[0], UnknownKeyPolicy::Skip).unwrap();
    assert_eq!(
        (skipped.revision, skipped.restored, skipped.skipped),
        (1, vec!["test.counter".into()], vec!["test.gone".into()])
    );
    let nothing = store
        .restore(&with(&[("test.gone", json!(1))]), UnknownKeyPolicy::Skip)
        .unwrap();
    assert_eq!(nothing.revision, 1);
}

#[test]
fn export_changed_lists_keys_written_since_a_revision() {
    let store = store();
    store
        .commit(StateCommand::new().with_update::<Counter>(1))
        .unwrap();
    store
        .commit(
            StateCommand::new()
                .with_update::<Log>("a".into())
                .with_update::<Mode>("m".into()),
        )
        .unwrap();
    store
        .commit(StateCommand::new().with_update::<Quota>(3))
        .unwrap();
    let s = store.snapshot();
    let mut out = String::new();
    for since in 0..=3 {
        out.push_str(&format!(
            "since {since}: {:?}\n",
            s.export_changed(since).unwrap().values
        ));
    }
    out.push_str(&format!(
        "thread since 0: {:?}\n",
        s.export_changed_in(KeyScope::Thread, 0).unwrap().values
    ));
    check(
        out,
        expect![[r#"
        since 0: {"test.counter": Number(1), "test.log": Array [String("a")], "test.quota": Number(3)}
        since 1: {"test.log": Array [String("a")], "test.quota": Number(3)}
        since 2: {"test.quota": Number(3)}
        since 3: {}
        thread since 0: {"test.log": Array [String("a")]}
    "#]],
    );
}

#[test]
fn table_write_each_matches_slot_mut_per_item() {
    use crate::table::SlotValue;
    type Written = Result<Option<Arc<crate::key::AnyValue>>, usize>;
    // Each write adds `n + 1` to the value (n: the item's position); a missing slot fails with
    // `n` if `strict`, else is noted and skipped.
    fn add(
        n: usize,
        value: Option<SlotValue<'_>>,
        strict: bool,
        missing: &mut Vec<usize>,
    ) -> Written {
        let read = |v: &Arc<crate::key::AnyValue>| *v.downcast_ref::<usize>().unwrap();
        match value {
            None if strict => Err(n),
            None => {
                missing.push(n);
                Ok(None)
            }
            Some(SlotValue::Shared(old)) => Ok(Some(Arc::new(read(old) + n + 1))),
            Some(SlotValue::Private(v)) => match Arc::get_mut(v) {
                Some(v) => {
                    *v.downcast_mut::<usize>().unwrap() += n + 1;
                    Ok(None)
                }
                None => Ok(Some(Arc::new(read(v) + n + 1))),
            },
        }
    }
    for len in [1, 5, 17, 64, 600] {
        let values: Vec<Arc<crate::key::AnyValue>> =
            (0..len).map(|i| Arc::new(i) as Arc<_>).collect();
        let base = Table::build(&values);
        // Ascending runs, runs going backwards (within a leaf, across leaves and branches), a
        // slot written twice, and indexes past the end: in a present leaf, in a missing
        // subtree, past the tree's span.
        let order = [
            0, 1, 3, 2, 3, 5, 4, 0, 18, 20, 63, 62, 7, 7, 64, 599, 598, 600, 1030, 1, 16,
        ];
        let (mut each, mut single) = (base.clone(), base.clone());
        for rev in [1, 2] {
            // The second pass finds the copied nodes private.
            let mut missing = Vec::new();
            each.write_each(
                rev,
                order.iter().enumerate(),
                |(_, i)| **i,
                |(n, _), v| add(n, v, false, &mut missing),
            )
            .unwrap();
            let expected: Vec<usize> = (0..order.len()).filter(|&n| order[n] >= len).collect();
            assert_eq!(missing, expected, "len {len}");
            for (n, &i) in order.iter().enumerate() {
                if let Some(slot) = single.slot_mut(i, rev) {
                    let old = *slot.value.downcast_ref::<usize>().unwrap();
                    slot.value = Arc::new(old + n + 1);
                    slot.changed_at = rev;
                }
            }
        }
        let dump = |t: &Table| -> Vec<(usize, usize, u64)> {
            (0..len)
                .map(|i| {
                    let slot = t.get(i).unwrap();
                    (
                        i,
                        *slot.value.downcast_ref::<usize>().unwrap(),
                        slot.changed_at,
                    )
                })
                .collect()
        };
        assert_eq!(dump(&each), dump(&single), "len {len}");
        assert_eq!(
            dump(&base),
            dump(&Table::build(&values)),
            "len {len}: base changed"
        );
        for since in [0, 1] {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            each.for_each_changed(since, &mut |i, _| a.push(i));
            single.for_each_changed(since, &mut |i, _| b.push(i));
            assert_eq!(a, b, "len {len} since {since}");
        }
        // Stops at the first error.
        let mut calls = Vec::new();
        let stopped = base.clone().write_each(
            3,
            [0, len, 0],
            |i| *i,
            |i, v| {
                calls.push(i);
                add(i, v, true, &mut Vec::new())
            },
        );
        assert_eq!((stopped, calls), (Err(len), vec![0, len]));
    }
}

#[test]
fn table_paths_copy_on_write_at_every_depth() {
    for len in [0, 1, 4, 5, 7, 8, 9, 16, 17, 64, 65, 600] {
        let values: Vec<Arc<crate::key::AnyValue>> =
            (0..len).map(|i| Arc::new(i) as Arc<_>).collect();
        let base = Table::build(&values);
        let mut next = base.clone();
        for i in (0..len).step_by(5) {
            let slot = next.slot_mut(i, 1).unwrap();
            slot.value = Arc::new(i + 1000);
            slot.changed_at = 1;
        }
        assert!(next.slot_mut(len, 1).is_none());
        for i in 0..len {
            let old = *base.get(i).unwrap().value.downcast_ref::<usize>().unwrap();
            let new = *next.get(i).unwrap().value.downcast_ref::<usize>().unwrap();
            assert_eq!(old, i, "len {len}: base changed at {i}");
            assert_eq!(
                new,
                if i % 5 == 0 { i + 1000 } else { i },
                "len {len} at {i}"
            );
        }
        let mut changed = Vec::new();
        next.for_each_changed(0, &mut |i, _| changed.push(i));
        assert_eq!(
            changed,
            (0..len).step_by(5).collect::<Vec<_>>(),
            "len {len}"
        );
        let mut none = Vec::new();
        base.for_each_changed(0, &mut |i, _| none.push(i));
        assert!(none.is_empty());
    }
}

#[test]
fn permutations_cover_every_order_once() {
    for n in 0..=5 {
        let mut all = crate::testing::permutations(n);
        let count = all.len();
        all.sort();
        all.dedup();
        let factorial: usize = (1..=n).product();
        assert_eq!((count, all.len()), (factorial, factorial), "n = {n}");
    }
}

#[test]
fn key_errors_name_their_key() {
    let err = StateError::UnknownKey { key: "k".into() };
    assert_eq!(err.key(), Some("k"));
    let loop_err = StateError::PhaseRunLoopExceeded {
        phase: "StepEnd".into(),
        max_rounds: 16,
    };
    assert_eq!(loop_err.key(), None);
    check(
        loop_err.to_string(),
        expect!["phase StepEnd did not converge within 16 rounds"],
    );
}

#[test]
fn state_types_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<StateStore>();
    send_sync::<Snapshot>();
    send_sync::<StateCommand>();
    send_sync::<Transaction<'static>>();
    send_sync::<Committed>();
    send_sync::<StateError>();
    send_sync::<KeyRegistry>();
}

#[test]
fn restore_notifies_observers() {
    let store = store();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    store.subscribe(move |c: &Committed| {
        log.lock()
            .unwrap()
            .push((c.revision, c.snapshot.get_json("test.counter").unwrap()))
    });
    let state = PersistedState {
        revision: 0,
        values: [("test.counter".to_owned(), json!(5))]
            .into_iter()
            .collect(),
    };
    store.restore(&state, UnknownKeyPolicy::Reject).unwrap();
    assert_eq!(*seen.lock().unwrap(), [(1, json!(5))]);
}

#[test]
fn concat_equals_repeated_extend() {
    let mut a = StateCommand::new()
        .with_base_revision(4)
        .with_update::<Counter>(1);
    a.emit_json("e1", json!(1));
    let mut b = StateCommand::new()
        .with_base_revision(2)
        .with_update::<Counter>(2);
    b.schedule_json("step_end", "a1", json!(null));
    let c = StateCommand::new().with_update::<Counter>(3);
    let mut extended = a.clone();
    extended.extend(b.clone());
    extended.extend(c.clone());
    let concatenated = StateCommand::concat(vec![a, b, c]);
    assert_eq!(
        concatenated.to_json().expect("json"),
        extended.to_json().expect("json")
    );
    assert_eq!(concatenated.base_revision(), Some(2));
    assert_eq!(concatenated.updates().len(), 3);
}

/// The keys of a command's updates, in order.
fn update_keys(command: &StateCommand) -> String {
    let keys: Vec<&str> = command.updates().iter().map(KeyUpdate::key).collect();
    keys.join(" ")
}

#[test]
fn updates_keep_their_order_from_one_to_many() {
    let one = |key: &str| {
        let mut c = StateCommand::new();
        c.update_json(key, json!(1));
        c
    };
    let many = |keys: &[&str]| {
        let mut c = StateCommand::new();
        for key in keys {
            c.update_json(*key, json!(1));
        }
        c
    };
    let mut lines = Vec::new();
    for (a, b) in [
        (StateCommand::new(), one("b")),
        (one("a"), StateCommand::new()),
        (one("a"), one("b")),
        (StateCommand::new(), many(&["b", "c"])),
        (one("a"), many(&["b", "c"])),
        (many(&["a", "b"]), one("c")),
        (many(&["a", "b"]), many(&["c", "d"])),
    ] {
        let mut extended = a.clone();
        extended.extend(b.clone());
        let concatenated = StateCommand::concat(vec![a, b]);
        assert_eq!(update_keys(&extended), update_keys(&concatenated));
        lines.push(format!("[{}]", update_keys(&extended)));
    }
    check(
        lines.join(" "),
        expect!["[b] [a] [a b] [b c] [a b c] [a b c] [a b c d]"],
    );
    let three = many(&["x", "y", "z"]);
    check(update_keys(&three.clone()), expect!["x y z"]);
}

#[test]
fn parallel_batch_defers_writers_of_keys_the_batch_holds() {
    let r = registry();
    let mut batch = ParallelBatch::with_capacity(&r, 4);
    let mode = |s: &str| StateCommand::new().with_update::<Mode>(s.into());
    let mut unknown = StateCommand::new();
    unknown.update_json("test.unknown", json!(1));
    let offers = [
        (
            "mode a, written twice",
            mode("a").with_update::<Mode>("a2".into()),
        ),
        ("counter 1", StateCommand::new().with_update::<Counter>(1)),
        (
            "counter 2 (commutative)",
            StateCommand::new().with_update::<Counter>(2),
        ),
        ("mode b", mode("b")),
        ("log x and mode c", mode("c").with_update::<Log>("x".into())),
        ("unknown name", unknown.clone()),
        ("unknown name again", unknown),
        ("log y", StateCommand::new().with_update::<Log>("y".into())),
    ];
    let mut lines = Vec::new();
    for (what, command) in offers {
        let joined = batch.offer(command);
        lines.push(format!(
            "{what}: {}",
            if joined { "joins" } else { "deferred" }
        ));
    }
    lines.push(format!("batch: {}", update_keys(batch.command())));
    check(
        lines.join("\n"),
        expect![[r#"
            mode a, written twice: joins
            counter 1: joins
            counter 2 (commutative): joins
            mode b: deferred
            log x and mode c: deferred
            unknown name: joins
            unknown name again: deferred
            log y: joins
            batch: test.mode test.mode test.counter test.counter test.unknown test.log"#]],
    );
}

#[test]
fn a_journal_records_the_committed_updates_of_its_scope_in_order() {
    let s = StateStore::with_journal(registry(), KeyScope::Profile);
    // A commit: the profile key's typed and JSON updates are journaled, others are not.
    let mut cmd = StateCommand::new()
        .with_update::<Quota>(3)
        .with_update::<Counter>(1);
    cmd.update_json(Quota::KEY, serde_json::json!(5));
    s.commit(cmd).unwrap();
    // A failed commit journals nothing.
    let bad = StateCommand::new()
        .with_update::<Quota>(7)
        .with_update::<Log>(String::new());
    assert!(s.commit(bad).is_err());
    // A transaction's updates are journaled when it publishes.
    let mut tx = s.transaction();
    tx.apply(StateCommand::new().with_update::<Quota>(9))
        .unwrap();
    assert_eq!(s.take_journal().len(), 2, "not yet published");
    tx.commit().unwrap();
    assert_eq!(
        s.take_journal(),
        [("test.quota".to_owned(), serde_json::json!(9))]
    );
    assert!(s.take_journal().is_empty());
    // Replayed on another store, the journal gives the same value.
    let other = store();
    let mut replay = StateCommand::new();
    for (k, v) in [("test.quota", 3), ("test.quota", 5), ("test.quota", 9)] {
        replay.update_json(k, serde_json::json!(v));
    }
    other.commit(replay).unwrap();
    assert_eq!(other.snapshot().get::<Quota>().copied().unwrap(), 9);
    // A store without a journal records nothing.
    let plain = store();
    plain
        .commit(StateCommand::new().with_update::<Quota>(1))
        .unwrap();
    assert!(plain.take_journal().is_empty());
}

#[test]
fn delta_values_keep_one_value_per_key_and_compare_in_any_order() {
    let mut a = DeltaValues::new();
    assert!(a.insert("x", StateValue::json(json!(1))).is_none());
    assert!(a.insert("y", StateValue::json(json!(2))).is_none());
    let replaced = a.insert("x", StateValue::json(json!(3)));
    assert_eq!(replaced, Some(StateValue::json(json!(1))));
    assert_eq!(a.len(), 2);
    assert_eq!(a["x"], StateValue::json(json!(3)));
    assert!(a.get("z").is_none());
    assert_eq!(
        a.keys().map(|k| k.as_ref()).collect::<Vec<_>>(),
        ["x", "y"],
        "insertion order"
    );

    // Collecting keeps the last value of a repeated key, as a map would.
    let b: DeltaValues = [
        ("y", StateValue::json(json!(2))),
        ("x", StateValue::json(json!(1))),
        ("x", StateValue::json(json!(3))),
    ]
    .into_iter()
    .collect();
    assert_eq!(a, b, "same keys and values, other order");
    let c: DeltaValues = [("x", StateValue::json(json!(3)))].into_iter().collect();
    assert_ne!(a, c, "a missing key");
    let d: DeltaValues = [
        ("x", StateValue::json(json!(3))),
        ("y", StateValue::json(json!(4))),
    ]
    .into_iter()
    .collect();
    assert_ne!(a, d, "another value");
}

#[test]
fn an_export_lists_each_changed_key_once_in_registration_order() {
    let store = StateStore::new(registry());
    let since = store.revision();
    let mut cmd = StateCommand::new();
    cmd.update::<Counter>(1);
    store.commit(cmd).unwrap();
    let mut cmd = StateCommand::new();
    cmd.update::<Counter>(2);
    store.commit(cmd).unwrap();
    let [run, thread] = store
        .snapshot()
        .export_changed_in_each([KeyScope::Run, KeyScope::Thread], since);
    assert_eq!(run.values.len(), 1, "{:?}", run.values);
    assert_eq!(run.values[Counter::KEY], StateValue::json(json!(3)));
    assert!(thread.values.is_empty());
}

/// Keys `m.00` … `m.19`, alternately run- and thread-scoped.
struct Many<const N: usize>;

const MANY: [&str; 20] = [
    "m.00", "m.01", "m.02", "m.03", "m.04", "m.05", "m.06", "m.07", "m.08", "m.09", "m.10", "m.11",
    "m.12", "m.13", "m.14", "m.15", "m.16", "m.17", "m.18", "m.19",
];

impl<const N: usize> StateKey for Many<N> {
    const KEY: &'static str = MANY[N];
    type Value = i64;
    type Update = i64;
    fn apply(value: &mut i64, update: i64) -> Result<(), StateError> {
        *value += update;
        Ok(())
    }
}

#[test]
fn an_export_of_more_changed_keys_than_it_keeps_on_the_stack_lists_them_all() {
    let mut registry = KeyRegistry::new();
    let mut cmd = StateCommand::new();
    macro_rules! each {
        ($($n:literal)*) => {$(
            let scope = if $n % 2 == 0 { KeyScope::Run } else { KeyScope::Thread };
            registry.register_key::<Many<$n>>(KeyOptions::new().with_scope(scope)).unwrap();
            cmd.update::<Many<$n>>($n + 1);
        )*};
    }
    each!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19);
    let store = StateStore::new(registry);
    store.commit(cmd).unwrap();
    let now = store.snapshot();
    let [run, thread] = now.export_changed_in_each([KeyScope::Run, KeyScope::Thread], 0);
    for (scope, delta, parity) in [(KeyScope::Run, run, 0), (KeyScope::Thread, thread, 1)] {
        assert_eq!(delta.values.len(), 10, "{scope:?}");
        assert_eq!(
            delta.to_persisted().unwrap(),
            now.export_changed_in(scope, 0).unwrap()
        );
        for (i, name) in MANY.iter().enumerate().filter(|(i, _)| i % 2 == parity) {
            assert_eq!(delta.values[*name], StateValue::json(json!(i + 1)));
        }
    }
}

#[test]
fn find_reads_a_registered_key_and_is_none_for_another() {
    struct Unregistered;
    impl StateKey for Unregistered {
        const KEY: &'static str = "test.unregistered";
        type Value = i64;
        type Update = i64;
        fn apply(value: &mut i64, update: i64) -> Result<(), StateError> {
            *value = update;
            Ok(())
        }
    }
    let store = StateStore::new(registry());
    let mut cmd = StateCommand::new();
    cmd.update::<Counter>(5);
    store.commit(cmd).unwrap();
    let snapshot = store.snapshot();
    assert_eq!(snapshot.find::<Counter>(), Some(&5));
    assert_eq!(snapshot.find::<Unregistered>(), None);
    assert!(snapshot.get::<Unregistered>().is_err());
}

/// A key per `N` (names `n00` … `n99`), for registries of many keys.
struct Nth<const N: usize>;

impl<const N: usize> Nth<N> {
    const NAME: [u8; 3] = [b'n', b'0' + (N / 10 % 10) as u8, b'0' + (N % 10) as u8];
}

impl<const N: usize> StateKey for Nth<N> {
    const KEY: &'static str = match std::str::from_utf8(&Self::NAME) {
        Ok(name) => name,
        Err(_) => panic!("ascii name"),
    };
    type Value = u64;
    type Update = u64;
    fn apply(value: &mut u64, add: u64) -> Result<(), StateError> {
        *value += add;
        Ok(())
    }
}

macro_rules! register_nth {
    ($registry:ident, $($n:literal)*) => {
        $( $registry.register_key::<Nth<$n>>(KeyOptions::new()).unwrap(); )*
    };
}

#[test]
fn a_registry_finds_its_keys_below_and_past_the_size_it_indexes_at() {
    let mut registry = KeyRegistry::new();
    register_nth!(registry, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    let check = |registry: &KeyRegistry, n: usize| {
        assert_eq!(registry.len(), n);
        assert!(registry.contains("n00") && registry.contains("n15"));
        assert!(!registry.contains("n99"));
        assert_eq!(registry.index_of("n07"), Some(7));
        assert_eq!(
            registry.index_of_type(std::any::TypeId::of::<Nth<15>>()),
            Some(15)
        );
        assert_eq!(
            registry.index_of_type(std::any::TypeId::of::<Nth<99>>()),
            None
        );
        // A second key of a taken name is refused, whatever the registry's size.
        let again = registry.clone().register_key::<Nth<3>>(KeyOptions::new());
        assert!(
            matches!(again, Err(StateError::DuplicateKey { .. })),
            "{again:?}"
        );
    };
    check(&registry, 16);
    register_nth!(registry, 16 17 18 19 20);
    check(&registry, 21);
    assert_eq!(registry.index_of("n20"), Some(20));
    assert_eq!(
        registry.index_of_type(std::any::TypeId::of::<Nth<18>>()),
        Some(18)
    );
    // A store over it reads and writes past the indexed size.
    let store = StateStore::new(registry);
    let mut cmd = StateCommand::new();
    cmd.update::<Nth<20>>(4);
    cmd.update::<Nth<2>>(1);
    store.commit(cmd).unwrap();
    assert_eq!(store.snapshot().find::<Nth<20>>(), Some(&4));
    assert_eq!(store.snapshot().find::<Nth<2>>(), Some(&1));
}
