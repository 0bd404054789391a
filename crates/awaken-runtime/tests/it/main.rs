//! Integration tests of awaken-runtime: scenarios rendered as event logs.

mod durable;
mod hitl;
mod scenarios;
mod support;
mod tools;
