//! Tools from Model Context Protocol servers. An [`McpServer`] is one server, reached by
//! starting its program and speaking over its stdio or over streamable HTTP (with the official
//! Rust SDK, `rmcp`); it keeps the connection up, opening it again with backoff when it ends,
//! and offers the server's tools as Awaken tools through [`awaken_tool::ToolProvider`], so
//! tool-id conflicts, catalog filters, permission rules and the tool gates apply to them as to
//! any tool. A call's progress notifications become the call's progress reports, and a run's
//! cancellation is sent to the server as the protocol's cancellation of the call.
//!
//! This crate must never know the agent loop, the phase engine, plugins or stores: it turns
//! servers into tools, and the runtime uses them like any other.

mod connection;
mod env;
mod error;
mod handler;
mod http;
mod server;
mod tool;

pub use connection::McpServerState;
pub use error::McpError;
pub use server::{McpServer, McpServerStatus, McpToolInfo, SkippedTool};
pub use tool::IDEMPOTENCY_META_KEY;
