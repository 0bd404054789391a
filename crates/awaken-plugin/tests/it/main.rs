//! Integration tests of awaken-plugin.

mod config;
mod env;
mod lifecycle;
mod registry;
mod support;
mod transforms;
