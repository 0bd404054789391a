//! Integration tests of awaken-resolver.

mod catalog;
mod cycles;
mod pools;
mod resolve;
mod support;
