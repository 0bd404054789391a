//! Test keys, one reference model of their values written independently of the store, and
//! proptest generators of updates.

use std::collections::BTreeMap;

use awaken_state::{KeyOptions, KeyRegistry, KeyScope, MergeStrategy, Snapshot, StateCommand};
use awaken_state::{StateError, StateKey, StateStore};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Run scope, commutative. Rejects negative additions.
pub(crate) struct Count;
impl StateKey for Count {
    const KEY: &'static str = "it.count";
    type Value = i64;
    type Update = i64;
    fn apply(value: &mut i64, add: i64) -> Result<(), StateError> {
        if add < 0 {
            return Err(StateError::invalid_update(Self::KEY, "negative"));
        }
        *value += add;
        Ok(())
    }
}

/// Thread scope, exclusive. Rejects 0, panics on 13 (after pushing).
pub(crate) struct Log;
impl StateKey for Log {
    const KEY: &'static str = "it.log";
    type Value = Vec<u32>;
    type Update = u32;
    fn apply(value: &mut Vec<u32>, n: u32) -> Result<(), StateError> {
        if n == 0 {
            return Err(StateError::invalid_update(Self::KEY, "zero"));
        }
        value.push(n);
        assert_ne!(n, 13, "unlucky");
        Ok(())
    }
}

/// Profile scope, commutative.
pub(crate) struct Tally;
impl StateKey for Tally {
    const KEY: &'static str = "it.tally";
    type Value = u32;
    type Update = u32;
    fn apply(value: &mut u32, add: u32) -> Result<(), StateError> {
        *value = value
            .checked_add(add)
            .ok_or_else(|| StateError::invalid_update(Self::KEY, "overflow"))?;
        Ok(())
    }
}

/// Ephemeral, exclusive.
pub(crate) struct Scratch;
impl StateKey for Scratch {
    const KEY: &'static str = "it.scratch";
    type Value = Vec<u32>;
    type Update = u32;
    fn apply(value: &mut Vec<u32>, n: u32) -> Result<(), StateError> {
        value.push(n);
        Ok(())
    }
}

/// Thread scope, exclusive.
pub(crate) struct Name;
impl StateKey for Name {
    const KEY: &'static str = "it.name";
    type Value = String;
    type Update = char;
    fn apply(value: &mut String, c: char) -> Result<(), StateError> {
        value.push(c);
        Ok(())
    }
}

/// Run scope, exclusive.
pub(crate) struct Phase;
impl StateKey for Phase {
    const KEY: &'static str = "it.phase";
    type Value = u32;
    type Update = u32;
    fn apply(value: &mut u32, add: u32) -> Result<(), StateError> {
        *value += add;
        Ok(())
    }
}

pub(crate) fn registry() -> KeyRegistry {
    let commutative = KeyOptions::new().with_merge(MergeStrategy::Commutative);
    let mut r = KeyRegistry::new();
    r.register_key::<Count>(commutative).unwrap();
    r.register_key::<Log>(KeyOptions::new().with_scope(KeyScope::Thread))
        .unwrap();
    r.register_key::<Tally>(commutative.with_scope(KeyScope::Profile))
        .unwrap();
    r.register_key::<Scratch>(KeyOptions::new().with_scope(KeyScope::Ephemeral))
        .unwrap();
    r.register_key::<Name>(KeyOptions::new().with_scope(KeyScope::Thread))
        .unwrap();
    r.register_key::<Phase>(KeyOptions::new()).unwrap();
    r
}

pub(crate) fn store() -> StateStore {
    StateStore::new(registry())
}

/// One update of one test key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Count(i64),
    Log(u32),
    Tally(u32),
    Scratch(u32),
    Name(char),
    Phase(u32),
}

impl Op {
    pub(crate) fn key(self) -> &'static str {
        match self {
            Op::Count(_) => Count::KEY,
            Op::Log(_) => Log::KEY,
            Op::Tally(_) => Tally::KEY,
            Op::Scratch(_) => Scratch::KEY,
            Op::Name(_) => Name::KEY,
            Op::Phase(_) => Phase::KEY,
        }
    }

    /// Whether parallel writers of this key conflict (written here, not asked of the registry).
    pub(crate) fn exclusive(self) -> bool {
        !matches!(self, Op::Count(_) | Op::Tally(_))
    }

    /// Adds the update to `command`, typed or as JSON.
    pub(crate) fn add_to(self, command: &mut StateCommand, as_json: bool) {
        if as_json {
            let update = match self {
                Op::Count(n) => json!(n),
                Op::Log(n) | Op::Tally(n) | Op::Scratch(n) | Op::Phase(n) => json!(n),
                Op::Name(c) => json!(c),
            };
            command.update_json(self.key(), update);
            return;
        }
        match self {
            Op::Count(n) => command.update::<Count>(n),
            Op::Log(n) => command.update::<Log>(n),
            Op::Tally(n) => command.update::<Tally>(n),
            Op::Scratch(n) => command.update::<Scratch>(n),
            Op::Name(c) => command.update::<Name>(c),
            Op::Phase(n) => command.update::<Phase>(n),
        };
    }
}

pub(crate) fn command(ops: &[Op], as_json: bool) -> StateCommand {
    let mut command = StateCommand::new();
    for op in ops {
        op.add_to(&mut command, as_json);
    }
    command
}

/// Reference model: the values of the test keys, changed by plain code.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Model {
    pub(crate) count: i64,
    pub(crate) log: Vec<u32>,
    pub(crate) tally: u32,
    pub(crate) scratch: Vec<u32>,
    pub(crate) name: String,
    pub(crate) phase: u32,
}

impl Model {
    /// Applies `ops` in order, all or nothing; `false` if one is invalid.
    pub(crate) fn apply_all(&mut self, ops: &[Op]) -> bool {
        let mut next = self.clone();
        for &op in ops {
            match op {
                Op::Count(n) if n < 0 => return false,
                Op::Count(n) => next.count += n,
                Op::Log(0 | 13) => return false,
                Op::Log(n) => next.log.push(n),
                Op::Tally(n) => match next.tally.checked_add(n) {
                    Some(t) => next.tally = t,
                    None => return false,
                },
                Op::Scratch(n) => next.scratch.push(n),
                Op::Name(c) => next.name.push(c),
                Op::Phase(n) => next.phase += n,
            }
        }
        *self = next;
        true
    }

    /// Every key's value as JSON, by name.
    pub(crate) fn values(&self) -> BTreeMap<String, Value> {
        [
            (Count::KEY, json!(self.count)),
            (Log::KEY, json!(self.log)),
            (Tally::KEY, json!(self.tally)),
            (Scratch::KEY, json!(self.scratch)),
            (Name::KEY, json!(self.name)),
            (Phase::KEY, json!(self.phase)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The values of persisted keys only.
    pub(crate) fn persisted(&self) -> BTreeMap<String, Value> {
        let mut values = self.values();
        values.remove(Scratch::KEY);
        values
    }
}

/// Every key's value in `snapshot`, as JSON, by name.
pub(crate) fn values(snapshot: &Snapshot) -> BTreeMap<String, Value> {
    snapshot
        .registry()
        .keys()
        .map(|k| (k.name.to_owned(), snapshot.get_json(k.name).unwrap()))
        .collect()
}

/// Any update, including invalid (negative count, log 0) and panicking (log 13) ones.
pub(crate) fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (-2i64..20).prop_map(Op::Count),
        prop_oneof![8 => 1u32..20, 1 => Just(0u32), 1 => Just(13u32)].prop_map(Op::Log),
        prop_oneof![9 => 0u32..100, 1 => Just(u32::MAX)].prop_map(Op::Tally),
        (0u32..100).prop_map(Op::Scratch),
        proptest::char::range('a', 'z').prop_map(Op::Name),
        (0u32..10).prop_map(Op::Phase),
    ]
}

/// Valid updates that always change the value they write.
pub(crate) fn changing_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1i64..20).prop_map(Op::Count),
        (1u32..13).prop_map(Op::Log),
        (1u32..100).prop_map(Op::Tally),
        (0u32..100).prop_map(Op::Scratch),
        proptest::char::range('a', 'z').prop_map(Op::Name),
        (1u32..10).prop_map(Op::Phase),
    ]
}
