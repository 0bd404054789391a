//! Errors of connecting to an MCP server and of calling its tools.

use std::time::Duration;

/// Why an MCP server could not be connected or used. Every variant names the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server's spec is not valid.
    #[error("MCP server `{server}`: {source}")]
    InvalidSpec {
        /// The server.
        server: String,
        /// What the validation found.
        #[source]
        source: awaken_spec::SpecError,
    },
    /// A `${VAR}` in `env` or `headers` names a variable this process does not have.
    #[error(
        "MCP server `{server}`: `{field}` names the environment variable `{variable}`, which is not set"
    )]
    MissingVariable {
        /// The server.
        server: String,
        /// The field (`env.TOKEN`, `headers.Authorization`).
        field: String,
        /// The variable.
        variable: String,
    },
    /// A header name or value cannot be sent.
    #[error("MCP server `{server}`: header `{header}` is not a valid HTTP header")]
    InvalidHeader {
        /// The server.
        server: String,
        /// The header's name.
        header: String,
    },
    /// The server's program could not be started.
    #[error("MCP server `{server}`: cannot start `{command}`: {source}")]
    Start {
        /// The server.
        server: String,
        /// The program.
        command: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The server did not complete the protocol's initialization.
    #[error("MCP server `{server}`: initialization failed: {message}")]
    Initialize {
        /// The server.
        server: String,
        /// What went wrong (with the last line the server wrote to its stderr, if any).
        message: String,
    },
    /// The server did not answer in time.
    #[error("MCP server `{server}`: no answer to {what} within {after:?}")]
    Timeout {
        /// The server.
        server: String,
        /// What was asked (`initialize`, `tools/list`).
        what: &'static str,
        /// The limit.
        after: Duration,
    },
    /// The server answered a request with an error or dropped the connection.
    #[error("MCP server `{server}`: {what} failed: {message}")]
    Request {
        /// The server.
        server: String,
        /// What was asked.
        what: &'static str,
        /// The error.
        message: String,
    },
    /// The server is not connected now (it is being reconnected, or it was shut down).
    #[error("MCP server `{server}` is unavailable: {cause}")]
    Unavailable {
        /// The server.
        server: String,
        /// Why (the error that ended the last connection).
        cause: String,
    },
}
