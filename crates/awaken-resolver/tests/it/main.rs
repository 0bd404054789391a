//! Integration tests of awaken-resolver.

mod catalog;
mod resolve;
mod support;
