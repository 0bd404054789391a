//! Integration tests of awaken-context.

mod compaction;
mod config;
mod estimate;
mod support;
mod truncation;
