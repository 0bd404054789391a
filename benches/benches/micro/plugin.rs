use std::hint::black_box;
use std::sync::Arc;

use awaken_phase::{FnHook, Phase, PhaseContext, PhaseHook};
use awaken_plugin::{ExecutionEnv, Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_state::{KeyOptions, StateCommand, StateError, StateKey};
use criterion::Criterion;

/// Registers the two keys of plugin `i` (0..16).
type RegisterKeys = fn(&mut PluginRegistrar) -> Result<(), PluginError>;

macro_rules! plugin_keys {
    ($($i:literal: $a:ident $ka:literal, $b:ident $kb:literal;)*) => {
        $(
            struct $a;
            impl StateKey for $a {
                const KEY: &'static str = $ka;
                type Value = u64;
                type Update = u64;
                fn apply(v: &mut u64, u: u64) -> Result<(), StateError> { *v = u; Ok(()) }
            }
            struct $b;
            impl StateKey for $b {
                const KEY: &'static str = $kb;
                type Value = u64;
                type Update = u64;
                fn apply(v: &mut u64, u: u64) -> Result<(), StateError> { *v = u; Ok(()) }
            }
        )*
        const REGISTER: [RegisterKeys; 16] = [$(
            |r: &mut PluginRegistrar| {
                r.register_key::<$a>(KeyOptions::new())?;
                r.register_key::<$b>(KeyOptions::new())
            },
        )*];
    };
}

plugin_keys! {
    0: A0 "p0.a", B0 "p0.b"; 1: A1 "p1.a", B1 "p1.b"; 2: A2 "p2.a", B2 "p2.b"; 3: A3 "p3.a", B3 "p3.b";
    4: A4 "p4.a", B4 "p4.b"; 5: A5 "p5.a", B5 "p5.b"; 6: A6 "p6.a", B6 "p6.b"; 7: A7 "p7.a", B7 "p7.b";
    8: A8 "p8.a", B8 "p8.b"; 9: A9 "p9.a", B9 "p9.b"; 10: A10 "p10.a", B10 "p10.b"; 11: A11 "p11.a", B11 "p11.b";
    12: A12 "p12.a", B12 "p12.b"; 13: A13 "p13.a", B13 "p13.b"; 14: A14 "p14.a", B14 "p14.b"; 15: A15 "p15.a", B15 "p15.b";
}

struct BenchPlugin {
    manifest: PluginManifest,
    keys: RegisterKeys,
    hook: Arc<dyn PhaseHook>,
}

impl Plugin for BenchPlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        (self.keys)(r)?;
        for phase in [
            Phase::StepStart,
            Phase::BeforeInference,
            Phase::AfterToolExecute,
            Phase::StepEnd,
        ] {
            r.register_phase_hook(phase, "h", self.hook.clone())?;
        }
        Ok(())
    }
}

pub(crate) fn benches(c: &mut Criterion) {
    let hook: Arc<dyn PhaseHook> = Arc::new(FnHook(|_: &PhaseContext| Ok(StateCommand::new())));
    let plugins: Vec<Arc<dyn Plugin>> = (0..16)
        .map(|i| {
            Arc::new(BenchPlugin {
                manifest: PluginManifest::new(format!("p{i}")),
                keys: REGISTER[i],
                hook: hook.clone(),
            }) as Arc<dyn Plugin>
        })
        .collect();
    c.bench_function("plugin/env_from_16_plugins", |b| {
        b.iter(|| ExecutionEnv::from_plugins(black_box(&plugins), &[], &[]).expect("env"))
    });
}
