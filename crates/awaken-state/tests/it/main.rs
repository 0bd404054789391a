//! Integration tests of awaken-state: property tests against a reference model, a concurrent
//! readers/writer test, and the commutativity helper.

// Tests unwrap freely: a panic is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod commutative;
mod concurrent;
mod keys;
mod merge;
mod model;
mod persist;
