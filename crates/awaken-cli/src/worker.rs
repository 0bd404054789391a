//! `awaken worker`: drives the runs a fleet's front ends queue (`awaken::server::Worker`)
//! until SIGTERM or Ctrl-C begins a drain (a second signal exits at once).

use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use awaken::server::{Worker, WorkerConfig};

use crate::args::Args;
use crate::serve::{agent_files, shutdown_on_signal};
use crate::setup::{
    Purpose, check_remote_agents, mcp_servers, open_failed, open_fleet_store, runtime_of_files,
};
use crate::term::errln;
use crate::{Exit, bad_input};

/// Runs driven at once unless `--concurrency` says otherwise (the usage text says so).
const CONCURRENCY: usize = 16;

/// How long the runs held get to end after a shutdown signal, unless `--shutdown-grace` says
/// otherwise (the usage text says so).
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// `awaken worker --agent FILE... --store postgres://...`: claims and drives queued runs until
/// a signal, then drains (exit 0).
pub(crate) async fn worker(args: Args) -> Result<u8, Exit> {
    let files = agent_files(&args)?;
    let concurrency = args.concurrency.unwrap_or(CONCURRENCY);
    // A connection per run in flight at most, plus the queue's own reads; the database's CPU,
    // not the pool, is what a larger pool would wait on.
    let connections = concurrency.clamp(4, 32);
    let store = open_fleet_store(args.store.as_deref(), "awaken worker", connections)
        .await
        .map_err(open_failed)?;
    let queue = store.queue();
    let mcp = mcp_servers(&files).await.map_err(bad_input)?;
    check_remote_agents(&files).await.map_err(bad_input)?;
    let runtime =
        runtime_of_files(&files, &args, Arc::new(store), Purpose::Run, &mcp).map_err(bad_input)?;
    let agents = runtime.resolver().registries().agent_ids();
    let config = WorkerConfig {
        concurrency,
        drain_grace: args.shutdown_grace.map_or(DRAIN_GRACE, Duration::from_secs),
        agents: Some(agents.clone()),
        ..WorkerConfig::default()
    };
    let worker = Worker::new(runtime, queue, config).map_err(|e| anyhow!("{e}"))?;
    let shutdown = shutdown_on_signal()?;
    tracing::info!(?agents, concurrency, "worker started");
    if !args.quiet {
        errln!(
            "awaken: worker claiming queued runs of {} agent(s), {concurrency} at once",
            agents.len()
        );
    }
    let report = worker.run(shutdown).await;
    tracing::info!(?report, "worker stopped");
    if !args.quiet {
        errln!(
            "awaken: worker stopped: {} run(s) completed, {} retried, {} dead-lettered, {} given back, {} taken over elsewhere",
            report.completed,
            report.retried,
            report.dead,
            report.released,
            report.lost
        );
    }
    Ok(0)
}
