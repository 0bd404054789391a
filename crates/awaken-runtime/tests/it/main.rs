//! Integration tests of awaken-runtime: scenarios rendered as event logs.

mod durable;
mod hitl;
mod permission;
mod scenarios;
mod support;
mod tools;
