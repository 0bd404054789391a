use std::hint::black_box;
use std::sync::Arc;

use async_trait::async_trait;
use awaken_benches::block_on;
use awaken_event::{RunId, ThreadId};
use awaken_phase::{
    ActionHandler, CommandExt, FnHook, HookError, Phase, PhaseContext, PhaseEngine, PhaseEnv,
    RunIdentity, ScheduledActionSpec, erase_action, register_engine_keys,
};
use awaken_state::{KeyOptions, KeyRegistry, StateCommand, StateError, StateKey, StateStore};
use criterion::Criterion;

macro_rules! keys {
    ($($name:ident = $key:literal),*) => {
        $(
            struct $name;
            impl StateKey for $name {
                const KEY: &'static str = $key;
                type Value = u64;
                type Update = u64;
                fn apply(value: &mut u64, update: u64) -> Result<(), StateError> {
                    *value = update;
                    Ok(())
                }
            }
        )*
        fn register_all(r: &mut KeyRegistry) {
            $( r.register_key::<$name>(KeyOptions::new()).expect("bench key"); )*
        }
        fn write(i: usize, v: u64) -> StateCommand {
            let mut n = 0;
            $(
                if n == i {
                    return StateCommand::new().with_update::<$name>(v);
                }
                n += 1;
            )*
            let _ = n;
            unreachable!("16 keys")
        }
    };
}

keys!(
    K0 = "k0",
    K1 = "k1",
    K2 = "k2",
    K3 = "k3",
    K4 = "k4",
    K5 = "k5",
    K6 = "k6",
    K7 = "k7",
    K8 = "k8",
    K9 = "k9",
    K10 = "k10",
    K11 = "k11",
    K12 = "k12",
    K13 = "k13",
    K14 = "k14",
    K15 = "k15"
);

struct Countdown;
impl ScheduledActionSpec for Countdown {
    const KEY: &'static str = "bench.countdown";
    const PHASE: Phase = Phase::BeforeInference;
    type Payload = u32;
}
struct CountdownHandler;
#[async_trait]
impl ActionHandler<Countdown> for CountdownHandler {
    async fn handle(&self, _ctx: &PhaseContext, n: u32) -> Result<StateCommand, HookError> {
        let mut cmd = StateCommand::new().with_update::<K0>(u64::from(n));
        if n > 0 {
            cmd.schedule_action::<Countdown>(n - 1)?;
        }
        Ok(cmd)
    }
}

/// An engine whose `StepStart` has 16 hooks; hook `i` writes key `target(i)`.
fn engine(target: impl Fn(usize) -> usize) -> (PhaseEngine, PhaseContext) {
    let mut registry = KeyRegistry::new();
    register_engine_keys(&mut registry).expect("engine keys");
    register_all(&mut registry);
    let mut env = PhaseEnv::new();
    for i in 0..16 {
        let key = target(i);
        env.add_hook(
            Phase::StepStart,
            &format!("p{i}"),
            "h",
            Arc::new(FnHook(move |_: &PhaseContext| Ok(write(key, 1)))),
        )
        .expect("hook");
    }
    env.add_action("bench", erase_action::<Countdown, _>(CountdownHandler))
        .expect("action");
    let engine = PhaseEngine::new(Arc::new(StateStore::new(registry)), Arc::new(env));
    let run = Arc::new(RunIdentity {
        thread_id: ThreadId::new("t").expect("id"),
        run_id: RunId::new("r").expect("id"),
        agent_id: "bench".into(),
        profile_id: None,
    });
    let ctx = PhaseContext::new(Phase::StepStart, engine.store().snapshot(), run);
    (engine, ctx)
}

pub(crate) fn benches(c: &mut Criterion) {
    let (disjoint, ctx) = engine(|i| i);
    c.bench_function("phase/gather_16_hooks_disjoint", |b| {
        b.iter(|| block_on(disjoint.run_phase(black_box(&ctx))).expect("phase"))
    });
    // Hooks 12..15 write the keys of hooks 0..3: four deferred re-runs.
    let (conflicting, ctx) = engine(|i| if i >= 12 { i - 12 } else { i });
    c.bench_function("phase/gather_16_hooks_4_conflicts", |b| {
        b.iter(|| {
            let report = block_on(conflicting.run_phase(black_box(&ctx))).expect("phase");
            assert_eq!(report.deferred_hooks.len(), 4);
        })
    });
    let (chain, ctx) = engine(|i| i);
    let ctx = ctx.with_phase(Phase::BeforeInference);
    c.bench_function("phase/execute_chain_15", |b| {
        b.iter(|| {
            let mut cmd = StateCommand::new();
            cmd.schedule_action::<Countdown>(14).expect("schedule");
            block_on(chain.submit_command(cmd)).expect("submit");
            let report = block_on(chain.run_phase(black_box(&ctx))).expect("phase");
            assert_eq!(report.rounds, 15);
        })
    });
}
