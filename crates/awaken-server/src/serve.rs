//! [`serve`]: the server on a listener, with recovery of unfinished runs and a graceful
//! shutdown.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Mutex;

use awaken_event::{CancellationToken, RunId};
use awaken_runtime::{RecoverConfig, ShutdownMode, Steering};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use crate::app::AgentServer;
use crate::live::RecoverySink;

/// hyper's initial read buffer, and the least its cap may be.
const READ_BUFFER: usize = 8 * 1024;

/// Room in a connection's read buffer, past the headers' limit, for the request line and the
/// separators of a request head.
const HEAD_ROOM: usize = 8 * 1024;

/// How long a client may take to send a request's head once it has started one.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The pause after an accept error that is not one connection's (out of descriptors).
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// Why [`serve`] could not serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The listener is on an address other than loopback and no token is configured.
    #[error(
        "refusing to serve on {addr} without authentication: set an auth token (or explicitly allow serving without one)"
    )]
    Unauthenticated {
        /// The listener's address.
        addr: SocketAddr,
    },
    /// The listener failed.
    #[error("the listener failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Serves `server` on `listener` until `shutdown` completes.
///
/// On start it continues the store's unfinished runs (unless it is a front end of a fleet,
/// [`AgentServer::queued`], whose workers do) (claimed through their leases, as
/// `AgentRuntime::recover` does; runs waiting for a decision stay waiting), answers `/readyz`,
/// and looks again every `recover_interval` for runs whose process went away. Recovery needs a
/// runtime whose runs hold leases (`AgentRuntimeBuilder::with_worker`): without one, a claim
/// could take one of the server's own runs in flight, so nothing is recovered (a warning says
/// so). On shutdown it
/// stops accepting, tells every open stream and ends it, gives the runs in flight
/// `shutdown_grace` to end by themselves, stops the others at their last checkpoint (their
/// leases are released, so the next start on the same store continues them at once), fires the
/// plugins' shutdown hooks and returns.
///
/// # Errors
/// [`ServeError::Unauthenticated`] for a listener on an address other than loopback without a
/// token (unless `insecure_no_auth`); [`ServeError::Io`] when the listener fails.
pub async fn serve(
    server: AgentServer,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let addr = listener.local_addr()?;
    let config = server.config();
    if !addr.ip().is_loopback() && config.auth_token.is_none() && !config.insecure_no_auth {
        return Err(ServeError::Unauthenticated { addr });
    }
    let stop_recovery = CancellationToken::new();
    // A runtime whose runs hold no lease cannot recover while it serves: a claim could take one
    // of its own runs in flight.
    let recovery = if server.is_queued() {
        // The fleet's workers continue unfinished runs; a front end recovers none.
        None
    } else if server.runtime().worker().is_some() {
        Some(tokio::spawn(recover_loop(
            server.clone(),
            stop_recovery.clone(),
        )))
    } else {
        tracing::warn!(
            "the runtime has no worker identity (AgentRuntimeBuilder::with_worker): unfinished runs are not recovered"
        );
        None
    };
    server.set_ready();
    tracing::info!(%addr, "serving");
    let deadline = accept(&server, listener, shutdown).await?;
    stop_recovery.cancel();
    let runtime = server.runtime().clone();
    if tokio::time::timeout_at(deadline, runtime.shutdown(ShutdownMode::Wait))
        .await
        .is_err()
    {
        let running = server.shared.live.running();
        tracing::warn!(
            runs = running.len(),
            "grace period over: stopping the runs still in flight at their last checkpoint"
        );
        // Once their futures are gone, the runtime's shutdown waits for their leases' release.
        if let Some(recovery) = &recovery {
            recovery.abort();
        }
        for run in running {
            run.stop().await;
        }
        if let Some(recovery) = recovery {
            let _ = recovery.await;
        }
        runtime.shutdown(ShutdownMode::Wait).await;
    } else if let Some(recovery) = recovery {
        let _ = recovery.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Accepts connections until `shutdown` completes, then tells open streams to end and waits
/// for every connection to close, until the end of the grace period it returns; the
/// connections still open then (a client that neither sends its request's body nor reads its
/// answer) are closed, so none outlives the server.
///
/// Each connection is hyper's HTTP/1 connection. Its read buffer starts at 8 KiB and grows
/// only for a read that fills it; its cap lets a request head up to the headers' limit (and
/// [`HEAD_ROOM`] more) reach the router, whose refusal of larger headers is a JSON body. A
/// head past the cap is refused by hyper (431, no body). hyper holds its write buffer to the
/// same cap.
async fn accept(
    server: &AgentServer,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<tokio::time::Instant> {
    let mut http = http1::Builder::new();
    let head = server
        .shared
        .config
        .max_header_bytes
        .saturating_add(HEAD_ROOM);
    http.max_buf_size(READ_BUFFER.max(head))
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let connections = GracefulShutdown::new();
    // The connections' tasks; the ended ones are reaped as the loop goes.
    let mut tasks = tokio::task::JoinSet::new();
    let router = server.router();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of descriptors or memory: wait for connections to close.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Events go out as they happen: without NODELAY a frame written behind an
        // unacknowledged one waits for the client's delayed acknowledgement (40 ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
        }
        let connection = connections.watch(
            http.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(router.clone())),
        );
        tasks.spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tracing::info!("shutting down: no new requests; telling open streams");
    let deadline = tokio::time::Instant::now() + server.config().shutdown_grace;
    server.begin_shutdown();
    if tokio::time::timeout_at(deadline, connections.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = tasks.len(),
            "grace period over: closing the connections still open"
        );
    }
    tasks.shutdown().await;
    Ok(deadline)
}

/// Whether an accept error concerns one connection only (the next accept may succeed at once).
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// Continues unfinished runs, one claim at a time (so each has its own cancel token), until
/// `stop`; rests `recover_interval` whenever none is left to claim, or every run left has
/// failed to continue since the last rest.
async fn recover_loop(server: AgentServer, stop: CancellationToken) {
    let shared = &server.shared;
    let sink = RecoverySink {
        live: shared.live.clone(),
        current: Mutex::new(None),
        handles: Mutex::new((CancellationToken::new(), Steering::new())),
        pending_commit: Mutex::new(0),
    };
    let config = &shared.config;
    // The runs that failed to continue since the last rest. Claims go to the runs claimed
    // fewest times, so one of them claimed again means every other run has had its turn.
    let mut failed: HashSet<RunId> = HashSet::new();
    loop {
        // Not a child of `stop`: a shutdown leaves a recovered run to its grace period, as any
        // other; this token only serves the cancel route. The inbox lets clients steer it.
        let (cancel, steering) = (CancellationToken::new(), Steering::new());
        *sink.handles.lock().unwrap_or_else(|e| e.into_inner()) =
            (cancel.clone(), steering.clone());
        let recover = RecoverConfig::new(config.worker_id.clone())
            .with_lease_duration(config.lease_duration)
            .with_limit(1)
            .with_cancel(cancel)
            .with_steering(steering);
        let continued = match shared.runtime.recover(&recover, &sink).await {
            Ok(runs) => {
                for run in &runs {
                    match &run.outcome {
                        Ok(o) => {
                            tracing::info!(thread_id = %run.thread_id, run_id = %run.run_id, termination = ?o.termination, "recovered run ended")
                        }
                        Err(e) => {
                            tracing::warn!(thread_id = %run.thread_id, run_id = %run.run_id, error = %e, "recovered run could not continue")
                        }
                    }
                }
                // A run that could not continue (its store failing, its agent not served here)
                // goes behind the others, which are claimed at once; it is looked at again
                // after the interval.
                runs.iter().fold(false, |go_on, r| match &r.outcome {
                    Ok(_) => true,
                    Err(_) => failed.insert(r.run_id.clone()) || go_on,
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "recovery failed");
                false
            }
        };
        if stop.is_cancelled() {
            return;
        }
        if !continued {
            failed.clear();
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(config.recover_interval) => {}
            }
        }
    }
}
