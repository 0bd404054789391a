//! Test keys, hooks and a harness that renders a phase's outcome as text.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use awaken_event::{RunId, ThreadId};
use awaken_phase::*;
use awaken_state::{
    KeyOptions, KeyRegistry, MergeStrategy, StateCommand, StateError, StateKey, StateStore,
};

macro_rules! int_key {
    ($name:ident, $key:literal) => {
        /// An exclusive integer; updates replace the value.
        pub struct $name;
        impl StateKey for $name {
            const KEY: &'static str = $key;
            type Value = i64;
            type Update = i64;
            fn apply(value: &mut i64, update: i64) -> Result<(), StateError> {
                *value = update;
                Ok(())
            }
        }
    };
}
int_key!(A, "test.a");
int_key!(B, "test.b");
int_key!(C, "test.c");
int_key!(D, "test.d");

/// A commutative counter: updates add.
pub struct Counter;
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

/// A commutative multiset of hook ids: how often each hook's output was applied.
pub struct Applied;
impl StateKey for Applied {
    const KEY: &'static str = "test.applied";
    type Value = BTreeMap<u32, u32>;
    type Update = u32;
    fn apply(value: &mut BTreeMap<u32, u32>, id: u32) -> Result<(), StateError> {
        *value.entry(id).or_default() += 1;
        Ok(())
    }
}

#[test]
fn counter_and_applied_are_commutative() {
    awaken_state::testing::assert_commutative::<Counter>(-1000i64..1000);
    awaken_state::testing::assert_commutative::<Applied>(0u32..8);
}

pub fn registry() -> KeyRegistry {
    let mut r = KeyRegistry::new();
    register_engine_keys(&mut r).expect("engine keys");
    let ex = KeyOptions::new();
    r.register_key::<A>(ex).expect("a");
    r.register_key::<B>(ex).expect("b");
    r.register_key::<C>(ex).expect("c");
    r.register_key::<D>(ex).expect("d");
    let co = KeyOptions::new().with_merge(MergeStrategy::Commutative);
    r.register_key::<Counter>(co).expect("counter");
    r.register_key::<Applied>(co).expect("applied");
    r
}

pub fn run_identity() -> Arc<RunIdentity> {
    Arc::new(RunIdentity {
        thread_id: ThreadId::new("t").expect("id"),
        run_id: RunId::new("r").expect("id"),
        agent_id: "agent".into(),
        profile_id: None,
    })
}

pub fn engine(env: PhaseEnv) -> PhaseEngine {
    PhaseEngine::new(Arc::new(StateStore::new(registry())), Arc::new(env))
}

pub fn ctx(engine: &PhaseEngine, phase: Phase) -> PhaseContext {
    PhaseContext::new(phase, engine.store().snapshot(), run_identity())
}

/// A hook from a closure over the context.
pub fn hook(
    f: impl Fn(&PhaseContext) -> Result<StateCommand, HookError> + Send + Sync + 'static,
) -> Arc<dyn PhaseHook> {
    Arc::new(FnHook(f))
}

/// Reads an integer key from the context's snapshot.
pub fn read<K: StateKey<Value = i64>>(ctx: &PhaseContext) -> i64 {
    *ctx.snapshot.get::<K>().expect("registered")
}

/// The test keys' values as one line.
pub fn dump(engine: &PhaseEngine) -> String {
    let s = engine.store().snapshot();
    format!(
        "rev={} a={} b={} c={} d={} counter={} applied={:?}",
        s.revision(),
        s.get::<A>().expect("a"),
        s.get::<B>().expect("b"),
        s.get::<C>().expect("c"),
        s.get::<D>().expect("d"),
        s.get::<Counter>().expect("counter"),
        s.get::<Applied>().expect("applied"),
    )
}

/// A shared log of strings, for handlers to record what they saw.
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn push(&self, line: impl Into<String>) {
        self.0.lock().expect("log").push(line.into());
    }
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().expect("log").clone()
    }
}

/// An effect carrying a string.
pub struct Note;
impl EffectSpec for Note {
    const KEY: &'static str = "test.note";
    type Payload = String;
}

/// Records each note with the value of `a` in the snapshot it was handed.
pub struct RecordNote(pub Log);

#[async_trait]
impl EffectHandler<Note> for RecordNote {
    async fn handle(&self, ctx: &EffectContext, payload: String) -> Result<(), HookError> {
        let a = ctx.snapshot.get::<A>().expect("a");
        self.0.push(format!(
            "note {payload} a={a} rev={}",
            ctx.snapshot.revision()
        ));
        if payload == "fail" {
            return Err(HookError::failed("note handler refuses"));
        }
        Ok(())
    }
}
