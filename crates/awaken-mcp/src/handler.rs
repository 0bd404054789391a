//! The client side of one connection: the notifications the server sends (tool-list changes,
//! progress of a call) routed to whoever waits for them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use rmcp::ClientHandler;
use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, ProgressNotificationParam, ProgressToken,
    ProtocolVersion,
};
use rmcp::service::{NotificationContext, RoleClient};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

/// Progress reports kept for a token nobody listens to yet (a report may overtake the
/// registration of its call).
const EARLY_REPORTS: usize = 32;

/// Where each call's progress goes, by the progress token its request carried.
#[derive(Default)]
pub(crate) struct ProgressRoutes {
    inner: Mutex<Routes>,
}

#[derive(Default)]
struct Routes {
    by_token: HashMap<ProgressToken, mpsc::UnboundedSender<Value>>,
    early: VecDeque<(ProgressToken, Value)>,
}

impl ProgressRoutes {
    /// Sends the reports for `token` to `to` until the returned guard is dropped (reports that
    /// arrived before are sent now).
    pub(crate) fn register(
        self: &Arc<Self>,
        token: ProgressToken,
        to: mpsc::UnboundedSender<Value>,
    ) -> RouteGuard {
        let mut routes = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        routes.early.retain(|(t, report)| {
            if *t == token {
                let _ = to.send(report.clone());
                false
            } else {
                true
            }
        });
        routes.by_token.insert(token.clone(), to);
        RouteGuard {
            routes: self.clone(),
            token,
        }
    }

    fn dispatch(&self, params: ProgressNotificationParam) {
        let mut report = json!({ "progress": params.progress });
        if let Some(total) = params.total {
            report["total"] = json!(total);
        }
        if let Some(message) = params.message {
            report["message"] = Value::String(message);
        }
        let mut routes = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match routes.by_token.get(&params.progress_token) {
            Some(to) => {
                let _ = to.send(report);
            }
            None => {
                if routes.early.len() == EARLY_REPORTS {
                    routes.early.pop_front();
                }
                routes.early.push_back((params.progress_token, report));
            }
        }
    }
}

/// Removes a call's progress route when the call ends.
pub(crate) struct RouteGuard {
    routes: Arc<ProgressRoutes>,
    token: ProgressToken,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        let mut routes = self
            .routes
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        routes.by_token.remove(&self.token);
    }
}

/// The handler of one connection.
pub(crate) struct Handler {
    pub(crate) progress: Arc<ProgressRoutes>,
    /// Signalled when the server says its tool list changed.
    pub(crate) tools_changed: Arc<Notify>,
}

impl ClientHandler for Handler {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.dispatch(params);
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.tools_changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        // rmcp's default is its newest version, which servers and the official conformance
        // suite do not accept yet; 2025-11-25 is the newest that begins with `initialize`.
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("awaken", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }
}
