//! The kill part: a child process (this binary, `awaken-soak child …`) runs loop-5 and
//! loop-50 runs, four at a time, on one SQLite file until it is killed — by SIGKILL from the
//! soak at a random moment, or by itself at a durable boundary through the runtime's crash
//! failpoint (`AWAKEN_CRASH_AT`, feature `failpoints`). The soak then recovers the file with
//! `AgentRuntime::recover` and checks every thread, the recovered activations' events and the
//! side-effect file, and deletes the threads for the next cycle.

use std::collections::HashSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use awaken_event::{TerminationReason, ThreadId, VecSink};
use awaken_runtime::{AgentRuntime, RecoverConfig, RunActivation};
use awaken_store::{SqliteConfig, SqliteStore, ThreadStore};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

use crate::agents::{Recorder, runtime};
use crate::check;
use crate::model::ProviderFaults;
use crate::plan::Shape;
use crate::rng::Rng;
use crate::stats::{Kill, Stats};
use crate::tools::Ledger;

/// The durable boundaries of the runtime's crash failpoint.
const BOUNDARIES: [&str; 4] = [
    "before_requested",
    "after_requested",
    "after_executing",
    "after_result",
];

/// Runs a child keeps in flight.
const IN_FLIGHT: usize = 4;

/// A child that outlives this many runs stops by itself (the soak kills it long before).
const CHILD_RUNS: u64 = 1_000_000;

/// The longest the soak waits, after the child is ready, before its SIGKILL.
const KILL_WITHIN_MS: u32 = 300;

/// The longest a child may take to become ready, or to reach its crash point.
const PATIENCE: Duration = Duration::from_secs(60);

/// The kill part's files and the parent's runtime on them.
pub(crate) struct KillPart {
    exe: PathBuf,
    db: PathBuf,
    effects: PathBuf,
    reported: PathBuf,
    marker: PathBuf,
    stderr: PathBuf,
    store: Arc<SqliteStore>,
    rt: AgentRuntime,
    cycles: u64,
}

impl KillPart {
    /// The kill part in `dir`, its children running `exe`.
    pub(crate) async fn new(dir: &Path, exe: PathBuf) -> anyhow::Result<Self> {
        let db = dir.join("killed.db");
        let effects = dir.join("effects.log");
        let store = Arc::new(
            SqliteStore::open(SqliteConfig::file(&db))
                .await
                .with_context(|| format!("opening {}", db.display()))?,
        );
        let rt = runtime(
            Arc::clone(&store) as Arc<dyn ThreadStore>,
            &Arc::new(ProviderFaults::default()),
            Arc::new(Ledger::File(effects.clone())),
            "recovery-run-",
        )?;
        Ok(Self {
            exe,
            db,
            effects,
            reported: dir.join("child-violations.log"),
            marker: dir.join("crash-marker"),
            stderr: dir.join("child-stderr.log"),
            store,
            rt,
            cycles: 0,
        })
    }

    /// One cycle: a child run, killed, then recovered and checked. The first cycle kills by
    /// signal, the second at a boundary; later ones choose at random.
    pub(crate) async fn cycle(&mut self, rng: &mut Rng, stats: &mut Stats) -> anyhow::Result<()> {
        self.cycles += 1;
        let cycle = self.cycles;
        let kill = match cycle {
            1 => Kill::Signal,
            2 => Kill::CrashAt(rng.pick(&BOUNDARIES)),
            _ if rng.chance(500) => Kill::Signal,
            _ => Kill::CrashAt(rng.pick(&BOUNDARIES)),
        };
        // A boundary alone stops at the first run reaching it; with a call id (the boundaries
        // of a call take one), at that call of the first run to make it (loop-5 runs make
        // calls 0 to 3).
        let crash_at = match kill {
            Kill::Signal => None,
            Kill::CrashAt(at @ ("after_executing" | "after_result")) if rng.chance(500) => {
                Some(format!("{at}:u1c{}", rng.below(4)))
            }
            Kill::CrashAt(at) => Some(at.to_owned()),
        };
        let context = format!("kill cycle {cycle} ({kill:?}, {crash_at:?})");
        let _ = std::fs::remove_file(&self.marker);

        let mut cmd = Command::new(&self.exe);
        cmd.arg("child")
            .arg(&self.db)
            .arg(&self.effects)
            .arg(&self.reported)
            .arg(format!("k{cycle}-"))
            .arg(rng.next_u64().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&self.stderr)?)
            .kill_on_drop(true);
        if let Some(at) = &crash_at {
            cmd.env("AWAKEN_CRASH_AT", at)
                .env("AWAKEN_CRASH_MARKER", &self.marker);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.exe.display()))?;
        // The child says `ready` on its stdout once its store is open; the kill's moment is
        // drawn from then on.
        let stdout = child.stdout.take().context("the child's stdout")?;
        let ready = tokio::time::timeout(PATIENCE, BufReader::new(stdout).lines().next_line())
            .await
            .is_ok_and(|line| matches!(line, Ok(Some(_))));
        let wait = match kill {
            Kill::Signal => Duration::from_millis(u64::from(rng.between(0, KILL_WITHIN_MS))),
            Kill::CrashAt(_) => PATIENCE,
        };
        let exited_itself = ready && tokio::time::timeout(wait, child.wait()).await.is_ok();
        if !exited_itself {
            // (Fails only if the child is gone already, which the status then shows.)
            let _ = child.start_kill();
        }
        let status = child.wait().await.context("waiting for the child")?;
        let stderr = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let signal = std::os::unix::process::ExitStatusExt::signal(&status);
        if !ready {
            stats.violation(
                &context,
                format!("the child never became ready ({status}): {stderr}"),
            );
        } else if signal != Some(9) {
            stats.violation(
                &context,
                format!("the child ended {status}, not killed: {stderr}"),
            );
        }
        if let Kill::CrashAt(_) = kill {
            let marker = std::fs::read_to_string(&self.marker).unwrap_or_default();
            if !exited_itself || marker.trim() != crash_at.as_deref().unwrap_or_default() {
                stats.violation(
                    &context,
                    format!("the crash point was not reached (marker {marker:?})"),
                );
            }
        }
        stats.kill_cycles += 1;
        *stats.kills.entry(kill).or_default() += 1;

        self.recover_and_check(&context, stats).await
    }

    /// Recovers the file, checks it and the side-effect file, and deletes every thread.
    async fn recover_and_check(&mut self, context: &str, stats: &mut Stats) -> anyhow::Result<()> {
        let sink = Recorder::default();
        let recovered = self
            .rt
            .recover(
                &RecoverConfig::new("soak-recovery").with_limit(1_000),
                &sink,
            )
            .await
            .context("recovering the killed child's runs")?;
        stats.recovered_after_kill += recovered.len() as u64;
        for r in &recovered {
            match &r.outcome {
                Ok(o) if o.termination == TerminationReason::NaturalEnd => {}
                Ok(o) => stats.violation(
                    context,
                    format!("recovered run {} ended {}", r.run_id, o.termination),
                ),
                Err(e) => stats.violation(
                    context,
                    format!("recovered run {} failed to start: {e}", r.run_id),
                ),
            }
        }
        sink.with_events(|events| {
            let activations = check::activations(events);
            let started = recovered.iter().filter(|r| r.outcome.is_ok()).count();
            if activations.len() != started {
                stats.violation(
                    context,
                    format!(
                        "{} recovered activations, {started} runs continued",
                        activations.len()
                    ),
                );
            }
            for a in activations {
                if let Err(e) = check::activation(a) {
                    stats.violation(context, format!("a recovered activation: {e}"));
                }
            }
        });

        let threads = self.store.list_threads().await.context("listing threads")?;
        stats.child_runs += threads.len() as u64;
        for t in &threads {
            match check::finished_thread(&*self.store, &t.thread_id, false).await {
                Ok(h) => {
                    let ended = h.checkpoint.and_then(|c| c.run).and_then(|r| r.termination);
                    if ended != Some(TerminationReason::NaturalEnd) {
                        stats.violation(context, format!("{} ended {ended:?}", t.thread_id));
                    }
                }
                Err(e) => stats.violation(context, format!("{}: {e}", t.thread_id)),
            }
        }

        // Side effects: each call id once, over the child's calls and the recovery's.
        let effects = std::fs::read_to_string(&self.effects).unwrap_or_default();
        let mut seen = HashSet::new();
        for line in effects.lines() {
            if !seen.insert(line) {
                stats.duplicated_effects += 1;
                stats.violation(context, format!("side effect {line} ran twice"));
            }
        }
        let reported = std::fs::read_to_string(&self.reported).unwrap_or_default();
        for line in reported.lines() {
            stats.violation(context, format!("in the child: {line}"));
        }
        for path in [&self.effects, &self.reported] {
            std::fs::write(path, "").with_context(|| format!("emptying {}", path.display()))?;
        }
        for t in threads {
            match self.store.delete_thread(&t.thread_id).await {
                Ok(_) => stats.pruned += 1,
                Err(e) => stats.violation(context, format!("deleting {}: {e}", t.thread_id)),
            }
        }
        Ok(())
    }
}

/// The child process: `child <db> <effects> <violations> <prefix> <seed>`. Runs until killed,
/// checking each finished run's events and appending what is wrong to the violations file.
pub(crate) fn child(args: &[String]) -> anyhow::Result<()> {
    let [db, effects, reported, prefix, seed] = args else {
        bail!("usage: awaken-soak child <db> <effects> <violations> <prefix> <seed>");
    };
    let seed: u64 = seed
        .parse()
        .with_context(|| format!("the child's seed {seed:?} is not a number"))?;
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    tokio.block_on(async {
        let store = SqliteStore::open(SqliteConfig::file(db))
            .await
            .with_context(|| format!("opening {db}"))?;
        let rt = runtime(
            Arc::new(store),
            &Arc::new(ProviderFaults::default()),
            Arc::new(Ledger::File(PathBuf::from(effects))),
            &format!("{prefix}run-"),
        )?;
        let mut out = std::io::stdout();
        writeln!(out, "ready")?;
        out.flush()?;
        let mut rng = Rng::new(seed);
        let mut running = tokio::task::JoinSet::new();
        let mut started = 0u64;
        loop {
            while running.len() < IN_FLIGHT && started < CHILD_RUNS {
                started += 1;
                let thread = ThreadId::new(format!("{prefix}{started}"))?;
                let shape = Shape::draw(&mut rng);
                let rt = rt.clone();
                running.spawn(async move {
                    let sink = VecSink::new();
                    let activation =
                        RunActivation::new(thread.clone(), shape.agent()).with_user_message("go");
                    let outcome = rt.run(activation, &sink).await;
                    (thread, shape, outcome, sink.take())
                });
            }
            let Some(done) = running.join_next().await else {
                return Ok(());
            };
            let (thread, shape, outcome, events) = done?;
            let wrong = match (&outcome, check::activation(&events)) {
                (_, Err(e)) => Some(e),
                (Ok(o), Ok(_))
                    if o.termination != TerminationReason::NaturalEnd
                        || o.steps != shape.steps() =>
                {
                    Some(format!("ended {} after {} steps", o.termination, o.steps))
                }
                (Ok(_), Ok(_)) => None,
                (Err(e), Ok(_)) => Some(format!("could not start: {e}")),
            };
            if let Some(wrong) = wrong {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(reported)?;
                writeln!(f, "{thread}: {wrong}")?;
            }
        }
    })
}
