//! Integration tests of `awaken-tool`: one binary, a module per feature.

mod batch;
mod execute;
mod gate;
mod recovery;
mod support;
mod typed;
mod validate;
