//! Integration tests of awaken-spec.

mod agent;
mod mcp;
mod merge;
mod permission;
mod pool;
