//! What a tool call needs of its server: the name, the timeout, the connection's current peer
//! and state, and where progress goes. Tools hold it; it holds no tool.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::service::{Peer, RoleClient};
use tokio::sync::watch;

use crate::error::McpError;
use crate::handler::ProgressRoutes;

/// Where a server's connection is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum McpServerState {
    /// Connected; its tools can be called.
    Ready,
    /// The connection ended; it is being opened again. Calls fail until it is.
    Reconnecting {
        /// Attempts since the connection ended.
        attempt: u32,
        /// Why the connection (or the last attempt) ended.
        cause: String,
    },
    /// Shut down; it will not be connected again.
    Stopped,
}

impl std::fmt::Display for McpServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            McpServerState::Ready => f.write_str("ready"),
            McpServerState::Reconnecting { attempt, cause } => {
                write!(f, "reconnecting (attempt {attempt}): {cause}")
            }
            McpServerState::Stopped => f.write_str("stopped"),
        }
    }
}

/// What a tool call needs of its server: the name, the timeout, the current peer and where
/// progress goes. Tools hold it; it holds no tool.
pub(crate) struct Connection {
    pub(crate) name: String,
    pub(crate) timeout: Duration,
    pub(crate) progress: Arc<ProgressRoutes>,
    pub(crate) live: Mutex<Live>,
    /// The state, for those who wait on its changes.
    pub(crate) states: watch::Sender<McpServerState>,
}

pub(crate) struct Live {
    pub(crate) peer: Option<Peer<RoleClient>>,
    pub(crate) state: McpServerState,
}

impl Connection {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn progress(&self) -> &Arc<ProgressRoutes> {
        &self.progress
    }

    /// The peer to send a call to.
    ///
    /// # Errors
    /// [`McpError::Unavailable`] while the connection is being opened again or after shutdown.
    pub(crate) fn peer(&self) -> Result<Peer<RoleClient>, McpError> {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        match (&live.peer, &live.state) {
            (Some(peer), _) => Ok(peer.clone()),
            (None, state) => Err(McpError::Unavailable {
                server: self.name.clone(),
                cause: state.to_string(),
            }),
        }
    }

    pub(crate) fn state(&self) -> McpServerState {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .state
            .clone()
    }

    pub(crate) fn set(&self, peer: Option<Peer<RoleClient>>, state: McpServerState) {
        if let McpServerState::Reconnecting { attempt, cause } = &state {
            tracing::warn!(server = %self.name, attempt, %cause, "MCP server unavailable, reconnecting");
        }
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        self.states.send_replace(state.clone());
        *live = Live { peer, state };
    }
}
