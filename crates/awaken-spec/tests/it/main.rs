//! Integration tests of awaken-spec.

mod agent;
mod merge;
mod permission;
mod pool;
