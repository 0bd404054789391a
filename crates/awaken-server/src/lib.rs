//! Awaken's HTTP server: agents over a versioned JSON API (`/v1`) whose runs stream their
//! neutral events as Server-Sent Events, resumable with `Last-Event-ID`.
//!
//! [`AgentServer::router`] is an `axum` router a program can mount in its own app;
//! [`serve`] runs it on a listener with recovery of unfinished runs and a graceful shutdown.
//! Runs belong to the server, not to their clients: a run started over HTTP goes on when its
//! client disconnects, and a client that reconnects gets the stored events after its last id,
//! then the live run's buffered and live events, each once. The live runs of the process are
//! held in a concurrent registry, each with a bounded broadcast that a slow client never holds
//! up.
//!
//! Besides the native API it speaks two front-end protocols, AG-UI and the AI SDK's UI message
//! stream, serves every agent over the Agent2Agent protocol (A2A 1.0, HTTP+JSON binding) and a
//! chat page at `/`. The server translates the runtime's neutral events at
//! the edge; it never changes what the runtime emits. It must never know terminal UI, and the library installs no log subscriber.

mod a2a;
mod agui;
mod ai_sdk;
mod app;
mod config;
mod error;
mod fleet;
mod job;
mod live;
mod page;
mod routes;
mod runs;
mod serve;
mod sse;

pub use app::AgentServer;
pub use config::ServerConfig;
pub use error::ApiError;
pub use fleet::{QueueConfig, Worker, WorkerConfig, WorkerError, WorkerReport};
pub use live::EventId;
pub use serve::{ServeError, serve};
