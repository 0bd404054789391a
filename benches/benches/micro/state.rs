use std::hint::black_box;

use awaken_state::{KeyOptions, KeyRegistry, KeyScope, StateCommand, StateError, StateKey};
use awaken_state::{StateStore, UnknownKeyPolicy};
use criterion::Criterion;

/// Key names `s0000` … `s4095`, built at compile time so each filler key has its own type.
const fn name_bytes(n: usize) -> [u8; 5] {
    [
        b's',
        b'0' + (n / 1000 % 10) as u8,
        b'0' + (n / 100 % 10) as u8,
        b'0' + (n / 10 % 10) as u8,
        b'0' + (n % 10) as u8,
    ]
}

/// A counter key; `N` gives it its own type and name.
struct Counter<const N: usize>;

impl<const N: usize> Counter<N> {
    const NAME: [u8; 5] = name_bytes(N);
}

impl<const N: usize> StateKey for Counter<N> {
    const KEY: &'static str = match std::str::from_utf8(&Self::NAME) {
        Ok(name) => name,
        Err(_) => panic!("ascii name"),
    };
    type Value = u64;
    type Update = u64;
    fn apply(value: &mut u64, add: u64) -> Result<(), StateError> {
        *value = value.wrapping_add(add);
        Ok(())
    }
}

macro_rules! register_16 {
    ($registry:ident, $base:expr) => {
        register_16!(@each $registry, $base, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@each $registry:ident, $base:expr, $($i:literal)*) => {
        $(
            $registry
                .register_key::<Counter<{ $base * 16 + $i }>>(options({ $base * 16 + $i }))
                .expect("distinct names");
        )*
    };
}

macro_rules! register_256 {
    ($registry:ident, $base:expr) => {
        register_256!(@each $registry, $base, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@each $registry:ident, $base:expr, $($i:literal)*) => {
        $( register_16!($registry, ($base * 16 + $i)); )*
    };
}

/// Scopes spread over the keys: a quarter each.
fn options(n: usize) -> KeyOptions {
    KeyOptions::new().with_scope(KeyScope::ALL[n % 4])
}

fn registry_64() -> KeyRegistry {
    let mut registry = KeyRegistry::new();
    register_16!(registry, 0);
    register_16!(registry, 1);
    register_16!(registry, 2);
    register_16!(registry, 3);
    registry
}

fn registry_4096() -> KeyRegistry {
    let mut registry = KeyRegistry::new();
    register_256!(registry, 0);
    register_256!(registry, 1);
    register_256!(registry, 2);
    register_256!(registry, 3);
    register_256!(registry, 4);
    register_256!(registry, 5);
    register_256!(registry, 6);
    register_256!(registry, 7);
    register_256!(registry, 8);
    register_256!(registry, 9);
    register_256!(registry, 10);
    register_256!(registry, 11);
    register_256!(registry, 12);
    register_256!(registry, 13);
    register_256!(registry, 14);
    register_256!(registry, 15);
    registry
}

/// One typed update of one key per commit, while the snapshot taken before the commit is still
/// alive (so the commit must copy, as in the phase engine, which snapshots before every hook).
fn bench_commit(c: &mut Criterion, name: &str, registry: KeyRegistry) {
    let store = StateStore::new(registry);
    let mut live = store.snapshot();
    c.bench_function(name, |b| {
        b.iter(|| {
            let committed =
                store.commit(StateCommand::new().with_update::<Counter<37>>(black_box(1)));
            live = store.snapshot();
            committed.expect("valid command").revision
        })
    });
    black_box(live.revision());
}

pub(crate) fn benches(c: &mut Criterion) {
    bench_commit(c, "state/commit_1_of_64_live_snapshot", registry_64());
    bench_commit(c, "state/commit_1_of_4096_live_snapshot", registry_4096());

    let store = StateStore::new(registry_64());
    c.bench_function("state/snapshot_take", |b| b.iter(|| store.snapshot()));
    let snapshot = store.snapshot();
    c.bench_function("state/snapshot_get_typed", |b| {
        b.iter(|| {
            *black_box(&snapshot)
                .get::<Counter<37>>()
                .expect("registered")
        })
    });

    // Export every persisted key of a 64-key store with every key written, restore it into a
    // fresh store.
    let mut command = StateCommand::new();
    macro_rules! touch {
        ($($i:literal)*) => { $( command.update::<Counter<$i>>($i); )* };
    }
    touch!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
    touch!(32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59);
    touch!(60 61 62 63);
    store.commit(command).expect("valid command");
    let target = StateStore::new(registry_64());
    c.bench_function("state/export_restore_64", |b| {
        b.iter(|| {
            let exported = store.snapshot().export_persisted().expect("serializable");
            target
                .restore(&exported, UnknownKeyPolicy::Reject)
                .expect("restorable")
                .revision
        })
    });
}
