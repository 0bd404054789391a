//! Integration tests of awaken-resolver.

mod catalog;
mod cycles;
mod pools;
mod providers;
mod resolve;
mod support;
