//! Integration tests of awaken-resolver.

mod catalog;
mod cycles;
mod resolve;
mod support;
