//! Integration tests of awaken-mcp, against the reference MCP server (`server-everything` from
//! the npm registry, installed under `tests/node` by `npm ci`) over stdio and over streamable
//! HTTP on 127.0.0.1.

mod calls;
mod failures;
mod peers;
mod runtime;
