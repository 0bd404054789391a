//! Integration tests of awaken-runtime: scenarios rendered as event logs.

mod scenarios;
mod support;
