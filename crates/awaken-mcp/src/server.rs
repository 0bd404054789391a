//! One MCP server: its connection, opened over stdio or streamable HTTP and opened again with
//! backoff when it ends, and the snapshot of its tools that each resolution takes.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use awaken_event::{CancellationToken, EffectClass, ToolDescriptor};
use awaken_spec::{McpServerSpec, McpTransportSpec};
use awaken_tool::{RegisteredTool, ToolProvider};
use rmcp::ServiceExt;
use rmcp::service::{Peer, QuitReason, RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use tokio::io::AsyncBufReadExt;
use tokio::sync::{Notify, watch};

use crate::connection::{Connection, Live, McpServerState};
use crate::env::expand;
use crate::error::McpError;
use crate::handler::Handler;
use crate::http::ServerStreams;
use crate::tool::{McpTool, effect_of, tool_id};

/// The first wait before reconnecting; it doubles with each failed attempt.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The longest line of the server's stderr kept to explain a failure.
const STDERR_LINE: usize = 300;
/// The longest wait, after an HTTP connection's initialization, for the answer to the GET that
/// opens the stream the server sends its own messages on.
const SERVER_STREAM_WAIT: Duration = Duration::from_secs(2);

/// A tool the server offers, as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpToolInfo {
    /// The tool id (prefix and MCP name).
    pub id: String,
    /// The name the server knows it by.
    pub mcp_name: String,
    /// Its description.
    pub description: String,
    /// Its effect class, from its annotations.
    pub effect: EffectClass,
}

/// A tool the server lists that is not offered, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedTool {
    /// The name the server knows it by.
    pub mcp_name: String,
    /// Why it is left out (an invalid schema, an id another of its tools has).
    pub reason: String,
}

/// What `awaken mcp list` shows of a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerStatus {
    /// The server's name.
    pub name: String,
    /// How it is reached: `stdio: {command}` or `http: {url}`.
    pub transport: String,
    /// Its connection's state.
    pub state: McpServerState,
    /// The tools offered, in the server's order.
    pub tools: Vec<McpToolInfo>,
    /// The tools left out.
    pub skipped: Vec<SkippedTool>,
}

/// A connected MCP server whose tools runs use. Cloning shares the connection; when the last
/// clone is dropped the connection is closed (a stdio server's process is stopped).
///
/// It is a [`ToolProvider`]: register it with the runtime builder and each run takes the
/// server's tools as they are when the run is resolved. A server that says its tool list
/// changed is listed again; a connection that ends is opened again with backoff, and calls
/// made meanwhile fail with an error the model sees.
#[derive(Clone)]
pub struct McpServer {
    server: Arc<Server>,
    _stop: Arc<StopOnDrop>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.server.spec.name)
            .field("state", &self.server.connection.state())
            .finish()
    }
}

impl McpServer {
    /// Connects to the server `spec` describes, lists its tools and keeps the connection up.
    /// Must be called inside a tokio runtime (the supervision is a task of it).
    ///
    /// # Errors
    /// The spec is invalid, a `${VAR}` is not set, the program cannot start, or the server
    /// does not complete initialization or list its tools within the spec's timeout.
    pub async fn connect(spec: McpServerSpec) -> Result<Self, McpError> {
        spec.validate().map_err(|source| McpError::InvalidSpec {
            server: spec.name.clone(),
            source,
        })?;
        let server = Arc::new(Server::new(spec));
        let service = server.open().await?;
        server.refresh(service.peer()).await?;
        server
            .connection
            .set(Some(service.peer().clone()), McpServerState::Ready);
        let stop = Arc::new(StopOnDrop(server.stop.clone()));
        tokio::spawn(supervise(server.clone(), service));
        Ok(Self {
            server,
            _stop: stop,
        })
    }

    /// Connects to every server at once.
    ///
    /// # Errors
    /// Every server that failed, in the order given; the others are closed again.
    pub async fn connect_all(
        specs: impl IntoIterator<Item = McpServerSpec>,
    ) -> Result<Vec<Self>, Vec<McpError>> {
        let tasks: Vec<_> = specs
            .into_iter()
            .map(|spec| tokio::spawn(Self::connect(spec)))
            .collect();
        let mut servers = Vec::with_capacity(tasks.len());
        let mut errors = Vec::new();
        for task in tasks {
            match task.await {
                Ok(Ok(server)) => servers.push(server),
                Ok(Err(e)) => errors.push(e),
                Err(join) => std::panic::resume_unwind(join.into_panic()),
            }
        }
        if errors.is_empty() {
            Ok(servers)
        } else {
            Err(errors)
        }
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.server.spec.name
    }

    /// The server's spec.
    pub fn spec(&self) -> &McpServerSpec {
        &self.server.spec
    }

    /// Its state and tools now.
    pub fn status(&self) -> McpServerStatus {
        let spec = &self.server.spec;
        let transport = match spec.transport() {
            McpTransportSpec::Stdio { command } => format!("stdio: {command}"),
            McpTransportSpec::Http { url } => format!("http: {url}"),
        };
        let tools = self
            .server
            .tools
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        McpServerStatus {
            name: spec.name.clone(),
            transport,
            state: self.server.connection.state(),
            tools: tools.info.clone(),
            skipped: tools.skipped.clone(),
        }
    }

    /// Counts the listings of the server's tools (1 after connecting; one more each time the
    /// server's tool list is read again: after it said the list changed, after a reconnection,
    /// or after the stream an HTTP server sends its notifications on was opened anew). Wait on
    /// it to see a change reach the tools.
    pub fn tool_listings(&self) -> watch::Receiver<u64> {
        self.server.listings.subscribe()
    }

    /// The connection's state, as it changes (ready, reconnecting with the cause, stopped).
    pub fn state_changes(&self) -> watch::Receiver<McpServerState> {
        self.server.connection.states.subscribe()
    }

    /// Closes the connection for good (a stdio server's process is stopped) and waits until
    /// it is closed. Calls made after fail.
    pub async fn shutdown(&self) {
        self.server.stop.cancel();
        self.server.stopped.notified().await;
    }
}

impl ToolProvider for McpServer {
    fn id(&self) -> &str {
        &self.server.spec.name
    }

    fn tools(&self) -> Arc<[RegisteredTool]> {
        self.server
            .tools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .tools
            .clone()
    }
}

/// Stops the supervision when the last [`McpServer`] clone is dropped.
struct StopOnDrop(CancellationToken);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The tools of one listing.
struct ToolSet {
    tools: Arc<[RegisteredTool]>,
    info: Vec<McpToolInfo>,
    skipped: Vec<SkippedTool>,
}

struct Server {
    spec: McpServerSpec,
    connection: Arc<Connection>,
    tools: Mutex<ToolSet>,
    tools_changed: Arc<Notify>,
    /// Bumped at each listing of the tools.
    listings: watch::Sender<u64>,
    stop: CancellationToken,
    /// Signalled once the supervision has closed the connection after a stop.
    stopped: Notify,
    /// The last line the server's process wrote to its stderr.
    stderr: Arc<Mutex<Option<String>>>,
}

impl Server {
    fn new(spec: McpServerSpec) -> Self {
        let not_yet = McpServerState::Reconnecting {
            attempt: 0,
            cause: "not connected yet".to_owned(),
        };
        let connection = Arc::new(Connection {
            name: spec.name.clone(),
            timeout: spec.timeout().get(),
            progress: Arc::default(),
            live: Mutex::new(Live {
                peer: None,
                state: not_yet.clone(),
            }),
            states: watch::Sender::new(not_yet),
        });
        Self {
            spec,
            connection,
            tools: Mutex::new(ToolSet {
                tools: Arc::from(Vec::new()),
                info: Vec::new(),
                skipped: Vec::new(),
            }),
            tools_changed: Arc::default(),
            listings: watch::Sender::new(0),
            stop: CancellationToken::new(),
            stopped: Notify::new(),
            stderr: Arc::default(),
        }
    }

    fn name(&self) -> &str {
        &self.spec.name
    }

    /// Opens a connection and completes initialization, within the spec's timeout.
    async fn open(&self) -> Result<RunningService<RoleClient, Handler>, McpError> {
        let handler = Handler {
            progress: self.connection.progress.clone(),
            tools_changed: self.tools_changed.clone(),
        };
        let timeout = self.connection.timeout;
        let timed_out = || McpError::Timeout {
            server: self.name().to_owned(),
            what: "initialize",
            after: timeout,
        };
        match self.spec.transport() {
            McpTransportSpec::Stdio { command } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(&self.spec.args);
                for (key, value) in &self.spec.env {
                    let field = format!("env.{key}");
                    cmd.env(key, expand(value, self.name(), &field, env_var)?);
                }
                if let Some(cwd) = &self.spec.cwd {
                    cmd.current_dir(cwd);
                }
                let (transport, stderr) = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|source| McpError::Start {
                        server: self.name().to_owned(),
                        command: command.to_owned(),
                        source,
                    })?;
                let reader = stderr.map(|stderr| self.read_stderr(stderr));
                match tokio::time::timeout(timeout, handler.serve(transport)).await {
                    Ok(Ok(service)) => Ok(service),
                    Ok(Err(e)) => {
                        // The process has likely exited: its last words explain why.
                        if let Some(reader) = reader {
                            let _ = tokio::time::timeout(Duration::from_millis(500), reader).await;
                        }
                        Err(McpError::Initialize {
                            server: self.name().to_owned(),
                            message: self.with_stderr(e.to_string()),
                        })
                    }
                    Err(_) => Err(timed_out()),
                }
            }
            McpTransportSpec::Http { url } => {
                let mut headers = reqwest::header::HeaderMap::new();
                for (name, value) in &self.spec.headers {
                    let value = expand(value, self.name(), &format!("headers.{name}"), env_var)?;
                    let invalid = || McpError::InvalidHeader {
                        server: self.name().to_owned(),
                        header: name.clone(),
                    };
                    let key = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| invalid())?;
                    let mut value =
                        reqwest::header::HeaderValue::from_str(&value).map_err(|_| invalid())?;
                    value.set_sensitive(true);
                    headers.insert(key, value);
                }
                let client = crate::http::HttpClient::new(headers, timeout).map_err(|e| {
                    McpError::Initialize {
                        server: self.name().to_owned(),
                        message: e.to_string(),
                    }
                })?;
                let streams = client.server_streams();
                let transport = crate::http::transport(url, client);
                match tokio::time::timeout(timeout, handler.serve(transport)).await {
                    Ok(Ok(service)) => {
                        self.follow_server_streams(streams).await;
                        Ok(service)
                    }
                    Ok(Err(e)) => Err(McpError::Initialize {
                        server: self.name().to_owned(),
                        message: e.to_string(),
                    }),
                    Err(_) => Err(timed_out()),
                }
            }
        }
    }

    /// Waits (at most [`SERVER_STREAM_WAIT`]) until the GET for the server's own stream is
    /// answered, unless the server is stateless (then no such stream is opened): a server
    /// drops a tool-list change it sends while that stream is not open, so
    /// the tools are listed only once it is. Each stream opened after that has the tools
    /// listed again, for a change sent while none was open is lost.
    async fn follow_server_streams(&self, mut streams: watch::Receiver<ServerStreams>) {
        let answered = tokio::time::timeout(SERVER_STREAM_WAIT, async {
            streams
                .wait_for(|s| s.answered > 0 || s.stateless)
                .await
                .is_ok()
        })
        .await;
        if answered.is_err() {
            tracing::debug!(server = %self.name(), "MCP server's stream not answered yet");
        }
        let tools_changed = self.tools_changed.clone();
        let mut opened = streams.borrow_and_update().opened;
        tokio::spawn(async move {
            while streams.changed().await.is_ok() {
                let now = streams.borrow_and_update().opened;
                if now > opened {
                    opened = now;
                    tools_changed.notify_one();
                }
            }
        });
    }

    /// Logs each line the server's process writes to its stderr and keeps the last one.
    fn read_stderr(&self, stderr: tokio::process::ChildStderr) -> tokio::task::JoinHandle<()> {
        let last = self.stderr.clone();
        let server = self.name().to_owned();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(server = %server, "MCP server stderr: {line}");
                if !line.trim().is_empty() {
                    let kept: String = line.chars().take(STDERR_LINE).collect();
                    *last.lock().unwrap_or_else(PoisonError::into_inner) = Some(kept);
                }
            }
        })
    }

    /// `message`, followed by the server's last stderr line when there is one.
    fn with_stderr(&self, message: String) -> String {
        match self
            .stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_deref()
        {
            Some(line) => format!("{message} (the server's last stderr line: {line})"),
            None => message,
        }
    }

    /// Lists the server's tools and makes them the ones the next resolution takes.
    async fn refresh(&self, peer: &Peer<RoleClient>) -> Result<(), McpError> {
        let timeout = self.connection.timeout;
        let listed = tokio::time::timeout(timeout, peer.list_all_tools())
            .await
            .map_err(|_| McpError::Timeout {
                server: self.name().to_owned(),
                what: "tools/list",
                after: timeout,
            })?
            .map_err(|e| McpError::Request {
                server: self.name().to_owned(),
                what: "tools/list",
                message: e.to_string(),
            })?;
        let set = self.tool_set(listed);
        for skipped in &set.skipped {
            tracing::warn!(server = %self.name(), tool = %skipped.mcp_name, reason = %skipped.reason, "MCP tool left out");
        }
        *self.tools.lock().unwrap_or_else(PoisonError::into_inner) = set;
        self.listings.send_modify(|n| *n += 1);
        Ok(())
    }

    fn tool_set(&self, listed: Vec<rmcp::model::Tool>) -> ToolSet {
        let prefix = self.spec.tool_prefix();
        let mut tools = Vec::with_capacity(listed.len());
        let mut info: Vec<McpToolInfo> = Vec::with_capacity(listed.len());
        let mut skipped = Vec::new();
        for tool in listed {
            let mcp_name = tool.name.to_string();
            if !self.spec.takes_tool(&mcp_name) {
                continue;
            }
            let id = tool_id(&prefix, &mcp_name);
            if let Some(first) = info.iter().find(|t| t.id == id) {
                skipped.push(SkippedTool {
                    reason: format!("its id `{id}` is the id of `{}` already", first.mcp_name),
                    mcp_name,
                });
                continue;
            }
            let description = tool
                .description
                .as_deref()
                .or(tool.title.as_deref())
                .unwrap_or_default()
                .to_owned();
            let effect = if self.spec.trust_annotations {
                effect_of(tool.annotations.as_ref())
            } else {
                EffectClass::SideEffecting
            };
            let descriptor = ToolDescriptor::new(id.clone(), description.clone())
                .with_parameters(serde_json::Value::Object((*tool.input_schema).clone()))
                .with_effect(effect);
            let adapter = McpTool {
                connection: self.connection.clone(),
                mcp_name: mcp_name.clone(),
                descriptor,
            };
            match RegisteredTool::new(Arc::new(adapter)) {
                Ok(registered) => {
                    tools.push(registered);
                    info.push(McpToolInfo {
                        id,
                        mcp_name,
                        description,
                        effect,
                    });
                }
                Err(e) => skipped.push(SkippedTool {
                    mcp_name,
                    reason: e.to_string(),
                }),
            }
        }
        ToolSet {
            tools: Arc::from(tools),
            info,
            skipped,
        }
    }

    /// Serves one connection until it ends. `None`: it was stopped; `Some(cause)`: it ended.
    async fn serve(&self, service: RunningService<RoleClient, Handler>) -> Option<String> {
        let peer = service.peer().clone();
        self.connection
            .set(Some(peer.clone()), McpServerState::Ready);
        let cancel = service.cancellation_token();
        let waiting = service.waiting();
        tokio::pin!(waiting);
        loop {
            tokio::select! {
                reason = &mut waiting => {
                    let cause = match reason {
                        Ok(QuitReason::Closed) => "the connection closed".to_owned(),
                        Ok(QuitReason::Cancelled) => "the connection was cancelled".to_owned(),
                        Ok(reason) => format!("the connection ended: {reason:?}"),
                        Err(e) => format!("the connection's task failed: {e}"),
                    };
                    return Some(self.with_stderr(cause));
                }
                () = self.tools_changed.notified() => {
                    if let Err(e) = self.refresh(&peer).await {
                        tracing::warn!(server = %self.name(), error = %e, "MCP tool list not refreshed");
                    }
                }
                () = self.stop.cancelled() => {
                    cancel.cancel();
                    let _ = (&mut waiting).await;
                    return None;
                }
            }
        }
    }
}

/// Keeps the server connected until it is stopped: each time the connection ends, it is
/// opened again after a wait that doubles with each failed attempt.
async fn supervise(server: Arc<Server>, first: RunningService<RoleClient, Handler>) {
    let mut service = first;
    'connected: loop {
        let Some(mut cause) = server.serve(service).await else {
            break;
        };
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            server.connection.set(
                None,
                McpServerState::Reconnecting {
                    attempt,
                    cause: cause.clone(),
                },
            );
            let wait = FIRST_BACKOFF
                .saturating_mul(1 << (attempt - 1).min(16))
                .min(MAX_BACKOFF);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = server.stop.cancelled() => break 'connected,
            }
            let opened = tokio::select! {
                opened = server.open() => opened,
                () = server.stop.cancelled() => break 'connected,
            };
            match opened {
                Ok(next) => match server.refresh(next.peer()).await {
                    Ok(()) => {
                        service = next;
                        continue 'connected;
                    }
                    Err(e) => cause = e.to_string(),
                },
                Err(e) => cause = e.to_string(),
            }
        }
    }
    server.connection.set(None, McpServerState::Stopped);
    server.stopped.notify_waiters();
    server.stopped.notify_one();
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}
