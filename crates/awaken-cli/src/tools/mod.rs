//! The command's built-in tools, each enabled and configured by the agent file's `[tools]`:
//! `read_file` (`ReadOnly`, confined to a directory), `append_file` (`SideEffecting`, confined
//! to a directory, idempotent per call) and `http_get` (`ReadOnly`, allowed hosts only, public
//! addresses or allowed ranges only).

mod append_file;
mod confine;
mod http_get;
mod read_file;

pub(crate) use append_file::AppendFile;
pub(crate) use http_get::{DEFAULT_MAX_BYTES, HttpGet};
pub(crate) use read_file::ReadFile;

// Symbolic links are made with `std::os::unix`.
#[cfg(all(test, unix))]
mod tests;
