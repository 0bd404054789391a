//! The Agent2Agent (A2A) protocol, v1.0, as serde types: the agent card, messages and their
//! parts, tasks with their status and artifacts, the send request, the stream responses, the
//! list-tasks request and response, and the error body of the HTTP+JSON binding with its typed
//! errors ([`A2aError`]). The JSON is the protocol's own (the protobuf JSON form: camelCase
//! fields, enum values such as `TASK_STATE_INPUT_REQUIRED`).
//!
//! A server binding and a client both speak through these types. The client is here too:
//! [`A2aBackend`] runs an agent whose endpoint speaks A2A as an `ExecutionBackend`, so a local
//! agent delegates to a remote one as to a local one. This crate must never know the agent
//! loop's internals or an HTTP server framework.

mod card;
mod client;
mod error;
mod message;
mod request;
mod task;
mod time;

#[cfg(test)]
mod tests;

pub use card::{
    AgentCapabilities, AgentCard, AgentInterface, AgentProvider, AgentSkill,
    HttpAuthSecurityScheme, SecurityRequirement, SecurityScheme, StringList,
};
pub use client::{
    A2A_BACKEND_ID, A2A_ENDPOINT_PROTOCOL, A2aBackend, ClientBuildError, DiscoverError,
    DiscoveredAgent,
};
pub use error::{A2aError, ErrorBody, ErrorDetail, ErrorStatus};
pub use message::{Message, Part, PartContent, Role};
pub use request::{
    ListTasksRequest, ListTasksResponse, SendMessageConfiguration, SendMessageRequest,
    SendMessageResponse, StreamResponse,
};
pub use task::{
    Artifact, Task, TaskArtifactUpdateEvent, TaskState, TaskStatus, TaskStatusUpdateEvent,
};
pub use time::timestamp;

/// The protocol version these types are (`A2A-Version` header, an interface's
/// `protocolVersion`).
pub const PROTOCOL_VERSION: &str = "1.0";

/// The request header naming the protocol version a client speaks.
pub const VERSION_HEADER: &str = "A2A-Version";

/// The protocol binding name of HTTP+JSON (REST), as an agent interface gives it.
pub const HTTP_JSON_BINDING: &str = "HTTP+JSON";

/// The media type of the HTTP+JSON binding's bodies (`application/json` is accepted too).
pub const A2A_JSON_MEDIA_TYPE: &str = "application/a2a+json";

/// Where a host serves its public agent card.
pub const AGENT_CARD_PATH: &str = "/.well-known/agent-card.json";
