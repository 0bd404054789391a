//! Integration tests of awaken-phase: seed 000's cases, one test each, and property tests
//! of the conflict fallback against a serial model.

mod execute;
mod gather;
mod props;
mod support;
