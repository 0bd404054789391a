//! `awaken serve`: the agents of one or more agent files over HTTP (`awaken::server`), until
//! SIGTERM or Ctrl-C begins a graceful shutdown (a second signal exits at once).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use anyhow::anyhow;
use std::sync::Arc;

use awaken::server::{AgentServer, QueueConfig, ServeError, ServerConfig, serve as serve_http};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::agent_file::AgentFile;
use crate::args::{self, Args, Secret};
use crate::setup::{
    Open, Purpose, check_remote_agents, lease_duration, mcp_servers, open_failed, open_fleet_store,
    open_store, runtime_of_files, worker_id,
};
use crate::term::errln;
use crate::{Exit, bad_input};

/// Where `serve` listens when `--listen` is not given: 127.0.0.1:8080.
const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8080));

/// How long runs in flight get to end by themselves after a shutdown signal, unless
/// `--shutdown-grace` says otherwise (the usage text says so).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The PostgreSQL connections of a fleet's front end (reads of the stored events it follows,
/// and the queue).
const FRONT_CONNECTIONS: usize = 8;

/// The environment variable that gives the token when `--auth-token` is not given.
const TOKEN_ENV: &str = "AWAKEN_API_TOKEN";

/// `awaken serve --agent FILE...`: serves until a signal, then shuts down gracefully (exit 0).
pub(crate) async fn serve(args: Args) -> Result<u8, Exit> {
    let addr = args.listen.unwrap_or(DEFAULT_LISTEN);
    let token = token(&args)?;
    refuse_unauthenticated(addr, token.is_some(), args.insecure_no_auth)?;
    let files = agent_files(&args)?;
    if args.max_attempts.is_some() && !args.queue {
        return Err(bad_input(anyhow!(
            "--max-attempts applies to queued runs: add --queue (with --store postgres://...)"
        )));
    }
    let (store, queue) = if args.queue {
        let store = open_fleet_store(args.store.as_deref(), "serve --queue", FRONT_CONNECTIONS)
            .await
            .map_err(open_failed)?;
        let queue = store.queue();
        (
            Arc::new(store) as Arc<dyn awaken::store::ThreadStore>,
            Some(queue),
        )
    } else {
        let store = open_store(args.store.as_deref(), Open::Create)
            .await
            .map_err(open_failed)?;
        (store, None)
    };
    let mcp = mcp_servers(&files).await.map_err(bad_input)?;
    check_remote_agents(&files).await.map_err(bad_input)?;
    let runtime = runtime_of_files(&files, &args, store, Purpose::Run, &mcp).map_err(bad_input)?;
    let agents = runtime.resolver().registries().agent_ids();
    let mut config = ServerConfig::default()
        .with_worker(worker_id(), lease_duration().map_err(bad_input)?)
        .with_cors_origins(args.cors.iter().cloned())
        .with_chat_page(!args.no_chat_page)
        .with_shutdown_grace(
            args.shutdown_grace
                .map_or(SHUTDOWN_GRACE, Duration::from_secs),
        );
    // A run that names no agent gets the first file's (a plugin directory may add others).
    if let Some(first) = files.first() {
        config = config.with_default_agent(first.agent.id.clone());
    }
    config.insecure_no_auth = args.insecure_no_auth;
    if let Some(token) = token {
        config = config.with_auth_token(token.expose());
    }
    if let Some(limit) = args.max_runs {
        config = config.with_max_runs_in_flight(limit);
    }
    let shutdown = shutdown_on_signal()?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow!("cannot listen on {addr}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| anyhow!("cannot read the listener's address: {e}"))?;
    let authenticated = config.auth_token.is_some();
    tracing::info!(addr = %bound, ?agents, authenticated, "serving");
    if !args.quiet {
        errln!(
            "awaken: serving {} agent(s) on http://{bound}",
            agents.len()
        );
        if !args.no_chat_page {
            errln!("awaken: chat page at http://{bound}/ (open it in a browser)");
        }
        if queue.is_some() {
            errln!("awaken: queueing runs for the fleet's workers (`awaken worker`)");
        }
    }
    let server = match queue {
        Some(queue) => {
            let mut queue_config = QueueConfig::default();
            if let Some(n) = args.max_attempts {
                queue_config.max_attempts = n;
            }
            AgentServer::queued(runtime, config, queue, queue_config)
        }
        None => AgentServer::new(runtime, config),
    };
    match serve_http(server, listener, shutdown).await {
        Ok(()) => Ok(0),
        Err(e @ ServeError::Unauthenticated { .. }) => Err(bad_input(anyhow!("{e}"))),
        Err(e) => Err(anyhow!("{e}").into()),
    }
}

/// Every `--agent FILE` of a command that serves several (`serve`, `worker`), loaded; at least
/// one is required.
pub(crate) fn agent_files(args: &Args) -> Result<Vec<AgentFile>, Exit> {
    if args.agents.is_empty() {
        return Err(bad_input(anyhow!(
            "--agent FILE is required (once per agent)\n\n{}",
            args::command_usage(&args.command).unwrap_or(args::USAGE)
        )));
    }
    args.agents
        .iter()
        .map(|path| AgentFile::load(path))
        .collect::<anyhow::Result<Vec<_>>>()
        .map_err(bad_input)
}

/// The token: `--auth-token`, else a non-empty `AWAKEN_API_TOKEN`; refused when it holds
/// whitespace, which no `Authorization: Bearer` header can carry (every client would be
/// refused).
fn token(args: &Args) -> Result<Option<Secret>, Exit> {
    let token = args.auth_token.clone().or_else(|| {
        std::env::var(TOKEN_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty())
            .map(Secret::new)
    });
    if let Some(t) = &token
        && t.expose().chars().any(char::is_whitespace)
    {
        return Err(bad_input(anyhow!(
            "the token ({TOKEN_ENV} or --auth-token) holds whitespace, which a bearer token \
             cannot carry: no client could send it"
        )));
    }
    Ok(token)
}

/// Refuses an address other than loopback without a token, unless `--insecure-no-auth`
/// allows it (the server library refuses it too; this says what to do, before binding).
fn refuse_unauthenticated(addr: SocketAddr, token: bool, insecure: bool) -> Result<(), Exit> {
    if addr.ip().is_loopback() || token || insecure {
        return Ok(());
    }
    Err(bad_input(anyhow!(
        "refusing to serve on {addr} without authentication: anyone who reaches it could run \
         the agents. Set {TOKEN_ENV} (or --auth-token TOKEN) so requests must carry \
         `Authorization: Bearer TOKEN`, listen on loopback (--listen 127.0.0.1:PORT), or pass \
         --insecure-no-auth to serve without a token anyway"
    )))
}

/// A future that completes on the first SIGTERM or Ctrl-C; a second one exits the process at
/// once (130). The handlers are installed before this returns.
pub(crate) fn shutdown_on_signal() -> Result<impl Future<Output = ()> + Send + 'static, Exit> {
    let mut signals = Signals::new()?;
    let (begin, begun) = oneshot::channel::<()>();
    tokio::spawn(async move {
        if signals.recv().await {
            errln!(
                "awaken: shutting down: runs in flight get to end (a second signal exits at once)"
            );
            let _ = begin.send(());
            if signals.recv().await {
                std::process::exit(130);
            }
        }
    });
    Ok(async move {
        // No signal can arrive any more: serve on until the process is stopped otherwise.
        if begun.await.is_err() {
            std::future::pending::<()>().await;
        }
    })
}

/// SIGTERM and SIGINT (Ctrl-C) as one stream.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self, Exit> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let install = |kind: SignalKind, name: &str| {
                signal(kind).map_err(|e| anyhow!("cannot install the {name} handler: {e}"))
            };
            Ok(Self {
                interrupt: install(SignalKind::interrupt(), "Ctrl-C")?,
                terminate: install(SignalKind::terminate(), "SIGTERM")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Waits for the next signal; `false` when none can arrive any more.
    async fn recv(&mut self) -> bool {
        #[cfg(unix)]
        return tokio::select! {
            s = self.interrupt.recv() => s.is_some(),
            s = self.terminate.recv() => s.is_some(),
        };
        #[cfg(not(unix))]
        return tokio::signal::ctrl_c().await.is_ok();
    }
}
