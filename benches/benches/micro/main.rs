//! Criterion micro-benchmarks, one module per crate. Names are `crate/what`, so criterion
//! writes `target/criterion/<crate>/<what>/new/estimates.json`, which `cargo xtask bench`
//! collects into `target/awaken-bench/summary.json`.

use criterion::{criterion_group, criterion_main};

mod context;
mod event;
mod llm;
mod phase;
mod plugin;
mod resolver;
mod state;
mod store;
mod tool;

criterion_group!(
    benches,
    context::benches,
    event::benches,
    llm::benches,
    phase::benches,
    plugin::benches,
    resolver::benches,
    state::benches,
    store::benches,
    tool::benches
);
criterion_main!(benches);
