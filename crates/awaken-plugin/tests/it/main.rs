//! Integration tests of awaken-plugin.

mod config;
mod env;
mod gate;
mod lifecycle;
mod panics;
mod registry;
mod support;
mod transforms;
