//! Integration tests of awaken-phase: GATHER and EXECUTE case by case, one test each, and
//! property tests of the conflict fallback against a serial model.

mod execute;
mod gather;
mod props;
mod support;
