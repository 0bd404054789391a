//! Property tests: hooks completing in generated orders always publish the same state, equal to
//! a serial model of the fallback (registration order, greedy batch first, then each deferred
//! hook alone on the state so far), and every hook's output is applied exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use awaken_phase::*;
use awaken_state::StateCommand;
use proptest::prelude::*;
use tokio::sync::watch;

use crate::support::*;

/// What one hook writes: (key index into KEYS, amount). Exclusive keys are set to
/// `read + amount`; the counter gets `amount` added.
type Spec = Vec<(usize, i64)>;

fn command(id: u32, spec: &Spec, ctx: &PhaseContext) -> StateCommand {
    let mut cmd = StateCommand::new();
    for &(k, w) in spec {
        match k {
            0 => cmd.update::<A>(read::<A>(ctx) + w),
            1 => cmd.update::<B>(read::<B>(ctx) + w),
            2 => cmd.update::<C>(read::<C>(ctx) + w),
            3 => cmd.update::<D>(read::<D>(ctx) + w),
            _ => cmd.update::<Counter>(w),
        };
    }
    cmd.update::<Applied>(id);
    cmd
}

/// A hook that waits until the test opens its gate, then records that it completed.
struct GatedHook {
    id: u32,
    spec: Spec,
    gate: watch::Receiver<bool>,
    completed: Arc<Mutex<Vec<u32>>>,
}

#[async_trait]
impl PhaseHook for GatedHook {
    async fn run(&self, ctx: &PhaseContext) -> Result<StateCommand, HookError> {
        let mut gate = self.gate.clone();
        gate.wait_for(|open| *open)
            .await
            .map_err(|e| HookError::Other(Box::new(e)))?;
        self.completed.lock().expect("log").push(self.id);
        Ok(command(self.id, &self.spec, ctx))
    }
}

/// A hook with a synchronous path: its command is ready without a future.
struct SyncHook {
    id: u32,
    spec: Spec,
}

#[async_trait]
impl PhaseHook for SyncHook {
    async fn run(&self, ctx: &PhaseContext) -> Result<StateCommand, HookError> {
        Ok(command(self.id, &self.spec, ctx))
    }

    fn run_sync(&self, ctx: &PhaseContext) -> Option<Result<StateCommand, HookError>> {
        Some(Ok(command(self.id, &self.spec, ctx)))
    }
}

/// The serial model: the values of KEYS after the phase.
fn model(specs: &[Spec]) -> [i64; 5] {
    let eval = |spec: &Spec, s: &[i64; 5]| -> Vec<(usize, i64)> {
        spec.iter()
            .map(|&(k, w)| if k < 4 { (k, s[k] + w) } else { (k, w) })
            .collect()
    };
    let apply = |writes: Vec<(usize, i64)>, s: &mut [i64; 5]| {
        for (k, v) in writes {
            if k < 4 { s[k] = v } else { s[k] += v }
        }
    };
    let s0 = [0i64; 5];
    let mut batch_keys = BTreeSet::new();
    let (mut batch, mut deferred) = (Vec::new(), Vec::new());
    for (i, spec) in specs.iter().enumerate() {
        let keys: BTreeSet<usize> = spec.iter().map(|w| w.0).filter(|k| *k < 4).collect();
        if keys.is_disjoint(&batch_keys) {
            batch_keys.extend(keys);
            batch.push(i);
        } else {
            deferred.push(i);
        }
    }
    let mut s = s0;
    for i in batch {
        apply(eval(&specs[i], &s0), &mut s);
    }
    for i in deferred {
        let w = eval(&specs[i], &s);
        apply(w, &mut s);
    }
    s
}

/// Runs the phase with the hooks marked in `sync` synchronous and the others released in
/// `order`; returns the published values, the applied counts, and the order in which the
/// gated hooks' first runs completed.
fn run(
    specs: &[Spec],
    sync: &[bool],
    order: &[usize],
) -> ([i64; 5], BTreeMap<u32, u32>, Vec<u32>, u64) {
    let gated = sync.iter().filter(|s| !**s).count();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let completed = Arc::new(Mutex::new(Vec::new()));
        let mut gates = Vec::new();
        let mut env = PhaseEnv::new();
        for (i, spec) in specs.iter().enumerate() {
            let (tx, rx) = watch::channel(false);
            gates.push(tx);
            let hook: Arc<dyn PhaseHook> = if sync[i] {
                Arc::new(SyncHook {
                    id: i as u32,
                    spec: spec.clone(),
                })
            } else {
                Arc::new(GatedHook {
                    id: i as u32,
                    spec: spec.clone(),
                    gate: rx,
                    completed: completed.clone(),
                })
            };
            env.add_hook(Phase::AfterInference, &format!("p{i}"), "h", hook)
                .expect("hook");
        }
        let engine = engine(env);
        let c = ctx(&engine, Phase::AfterInference);
        let driver = async {
            for (released, &i) in order.iter().filter(|&&i| !sync[i]).enumerate() {
                gates[i].send_replace(true);
                // Wait until that hook has completed before opening the next gate.
                while completed.lock().expect("log").len() <= released {
                    tokio::task::yield_now().await;
                }
            }
        };
        let (result, ()) = tokio::join!(engine.run_phase(&c), driver);
        result.expect("phase");
        let s = engine.store().snapshot();
        let values = [
            *s.get::<A>().expect("a"),
            *s.get::<B>().expect("b"),
            *s.get::<C>().expect("c"),
            *s.get::<D>().expect("d"),
            *s.get::<Counter>().expect("counter"),
        ];
        let first_runs: Vec<u32> = completed
            .lock()
            .expect("log")
            .iter()
            .copied()
            .take(gated)
            .collect();
        (
            values,
            s.get::<Applied>().expect("applied").clone(),
            first_runs,
            s.revision(),
        )
    })
}

fn specs() -> impl Strategy<Value = Vec<Spec>> {
    proptest::collection::vec(proptest::collection::vec((0usize..5, 1i64..10), 1..4), 1..7)
}

fn specs_and_two_orders() -> impl Strategy<Value = (Vec<Spec>, Vec<usize>, Vec<usize>)> {
    specs().prop_flat_map(|specs| {
        let n = specs.len();
        let order = Just((0..n).collect::<Vec<_>>()).prop_shuffle();
        (Just(specs), order.clone(), order)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_completion_order_publishes_the_serial_models_state((specs, o1, o2) in specs_and_two_orders()) {
        let gated = vec![false; specs.len()];
        let (v1, applied1, done1, rev1) = run(&specs, &gated, &o1);
        let (v2, applied2, done2, rev2) = run(&specs, &gated, &o2);
        // The hooks really completed in the generated orders.
        let expect1: Vec<u32> = o1.iter().map(|&i| i as u32).collect();
        let expect2: Vec<u32> = o2.iter().map(|&i| i as u32).collect();
        prop_assert_eq!(done1, expect1);
        prop_assert_eq!(done2, expect2);
        // Same published state whatever the order, equal to the serial model, in one commit.
        prop_assert_eq!(v1, v2);
        prop_assert_eq!(v1, model(&specs));
        prop_assert_eq!((rev1, rev2), (1, 1));
        // Every hook's output applied exactly once.
        let once: BTreeMap<u32, u32> = (0..specs.len() as u32).map(|i| (i, 1)).collect();
        prop_assert_eq!(&applied1, &once);
        prop_assert_eq!(&applied2, &once);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Hooks with a synchronous path finish at once, the others later: their commands still
    /// join the batch in registration order.
    #[test]
    fn sync_and_gated_hooks_publish_the_serial_models_state(
        (specs, order, _) in specs_and_two_orders(),
        sync_bits in any::<u8>(),
    ) {
        let sync: Vec<bool> = (0..specs.len()).map(|i| sync_bits & (1 << i) != 0).collect();
        let (values, applied, done, rev) = run(&specs, &sync, &order);
        let expect: Vec<u32> = order.iter().filter(|&&i| !sync[i]).map(|&i| i as u32).collect();
        prop_assert_eq!(done, expect);
        prop_assert_eq!(values, model(&specs));
        prop_assert_eq!(rev, 1);
        let once: BTreeMap<u32, u32> = (0..specs.len() as u32).map(|i| (i, 1)).collect();
        prop_assert_eq!(&applied, &once);
    }
}

#[test]
fn the_model_itself_distinguishes_batch_from_serial() {
    // Two hooks incrementing `a`: a naive merge would give 1, the fallback gives 2.
    assert_eq!(model(&[vec![(0, 1)], vec![(0, 1)]])[0], 2);
    // Disjoint writers read the same frozen snapshot.
    assert_eq!(model(&[vec![(0, 1)], vec![(1, 1)]]), [1, 1, 0, 0, 0]);
    let (values, _, done, _) = run(
        &[vec![(0, 1)], vec![(0, 1)], vec![(4, 3)]],
        &[false; 3],
        &[2, 0, 1],
    );
    assert_eq!(values, [2, 0, 0, 0, 3]);
    assert_eq!(done, vec![2, 0, 1]);
}
