//! Integration tests of awaken-runtime: scenarios rendered as event logs.

mod durable;
mod scenarios;
mod support;
mod tools;
