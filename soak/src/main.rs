//! `awaken-soak`: the soak with faults (`cargo xtask soak`; guide: `docs/performance.md`,
//! "Soak with faults"). Real runtimes built through the public builder run loop-5 and loop-50
//! agents on the memory store and on SQLite, one after another, each run with a fault drawn
//! from a seeded generator: a random cancellation, a store failpoint armed inside one of its
//! commits, provider errors (retryable and permanent, a broken stream) and stalls; in rounds
//! with these, child processes running on one SQLite file are killed and their runs
//! recovered. After each run every invariant is checked (`check`), threads are deleted as the
//! soak goes, and the resident set is sampled every 10,000 runs. It prints a summary table and
//! exits non-zero on any broken invariant or on RSS growth beyond 5 % after the warm-up.
//!
//! Nothing here is a library: the soak uses the crates' public APIs and their test-only
//! `failpoints` features, and must never be a dependency of anything.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line program reports on stdout

mod agents;
mod check;
mod inproc;
mod kill;
mod model;
mod plan;
mod rng;
mod stats;
mod store;
mod tools;

#[cfg(test)]
mod tests;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use awaken_store::{MemoryStore, SqliteConfig, SqliteStore};

use crate::inproc::InProcess;
use crate::kill::KillPart;
use crate::rng::Rng;
use crate::stats::{Stats, StoreKind};

const USAGE: &str = "\
usage: awaken-soak [--minutes N | --runs N | --quick] [--seed S] [--only PART]

  --minutes N   soak for about N minutes (the default: 10)
  --runs N      soak until N runs on the memory store are done (SQLite gets one run in 20)
  --quick       a short soak: a few hundred runs per store, every fault, two kills
  --seed S      replay the faults of seed S (printed by every soak)
  --only PART   run one part alone: `memory`, `sqlite` (in process) or `kills`; --runs then
                counts that part's runs (kill cycles for `kills`)";

/// Memory-store runs per round (each round also runs [`SQLITE_ROUND`] SQLite runs and one
/// kill cycle).
const MEMORY_ROUND: u64 = 10_000;
/// SQLite runs per round.
const SQLITE_ROUND: u64 = 500;
/// The resident set is sampled every this many in-process runs, at the end of the round in
/// which they were reached (with the stores and the kill part at rest, so that the samples
/// are comparable).
const RSS_EVERY: u64 = 10_000;
/// Runs before the first sample the drift is measured from.
const WARM_UP: u64 = 100_000;
/// The largest drift allowed, in per cent.
const MAX_DRIFT: f64 = 5.0;

/// How long the soak goes on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Budget {
    /// Rounds until the time is up.
    Minutes(f64),
    /// Rounds until this many memory-store runs.
    Runs(u64),
    /// One small round: this many runs on each store, two kill cycles.
    Quick,
}

/// The soak's parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// In-process runs on the memory store.
    Memory,
    /// In-process runs on SQLite.
    Sqlite,
    /// Kill cycles.
    Kills,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Config {
    budget: Budget,
    seed: u64,
    /// Only this part (all when `None`).
    only: Option<Part>,
}

fn parse(args: &[String]) -> anyhow::Result<Config> {
    let mut budget = None;
    let mut seed = None;
    let mut only = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |what: &str| {
            it.next()
                .with_context(|| format!("`{arg}` needs {what}"))
                .cloned()
        };
        let set = match arg.as_str() {
            "--minutes" => {
                let v = value("a number of minutes")?;
                let m: f64 = v
                    .parse()
                    .ok()
                    .filter(|m: &f64| m.is_finite() && *m > 0.0)
                    .with_context(|| format!("`--minutes {v}`: not a positive number"))?;
                Some(Budget::Minutes(m))
            }
            "--runs" => {
                let v = value("a number of runs")?;
                let n: u64 = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .with_context(|| format!("`--runs {v}`: not a positive whole number"))?;
                Some(Budget::Runs(n))
            }
            "--quick" => Some(Budget::Quick),
            "--seed" => {
                let v = value("a seed")?;
                seed = Some(
                    v.parse()
                        .with_context(|| format!("`--seed {v}`: not a whole number"))?,
                );
                None
            }
            "--only" => {
                let v = value("a part")?;
                only = Some(match v.as_str() {
                    "memory" => Part::Memory,
                    "sqlite" => Part::Sqlite,
                    "kills" => Part::Kills,
                    _ => bail!("`--only {v}`: the parts are memory, sqlite and kills"),
                });
                None
            }
            other => bail!("unknown argument `{other}`"),
        };
        if let Some(b) = set {
            if budget.is_some() {
                bail!("give one of --minutes, --runs and --quick");
            }
            budget = Some(b);
        }
    }
    Ok(Config {
        budget: budget.unwrap_or(Budget::Minutes(10.0)),
        seed: seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        }),
        only,
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("child") {
        return match kill::child(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("awaken-soak child: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let config = match parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("awaken-soak: {e:#}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match soak(config) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("awaken-soak: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the soak; `Ok(false)` when an invariant broke or the memory drifted.
fn soak(config: Config) -> anyhow::Result<bool> {
    let Config { budget, seed, only } = config;
    println!("awaken-soak: seed {seed}, {budget:?}, parts {only:?}");
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("awaken-soak-")
        .tempdir()
        .context("creating the soak's directory")?;
    let exe = std::env::current_exe().context("locating the soak's own binary")?;
    // The blocking pool (SQLite's calls) keeps two threads for the whole soak: threads
    // started anew as calls overlap or the pool idles each get a glibc arena, whose growth
    // would be counted as the runtime's drift. Two suffice: every blocking call waits only
    // for the store's connection, which a running call holds.
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(2)
        .thread_keep_alive(Duration::from_secs(24 * 3600))
        .build()?;
    let mut rng = Rng::new(seed);
    let mut stats = Stats::default();
    tokio.block_on(async {
        let mut memory = InProcess::new(StoreKind::Memory, MemoryStore::new())?;
        let sqlite_path = dir.path().join("in-process.db");
        let sqlite = SqliteStore::open(SqliteConfig::file(&sqlite_path))
            .await
            .with_context(|| format!("opening {}", sqlite_path.display()))?;
        let mut sqlite = InProcess::new(StoreKind::Sqlite, sqlite)?;
        let mut kills = KillPart::new(dir.path(), exe).await?;
        let deadline = match budget {
            Budget::Minutes(m) => Some(started + Duration::from_secs_f64(m * 60.0)),
            _ => None,
        };
        let mut last_progress = Instant::now();
        // What `--runs` counts.
        let progress = |stats: &Stats| match only {
            None | Some(Part::Memory) => stats.in_process(StoreKind::Memory),
            Some(Part::Sqlite) => stats.in_process(StoreKind::Sqlite),
            Some(Part::Kills) => stats.kill_cycles,
        };
        loop {
            let (mut memory_runs, mut sqlite_runs, mut kill_cycles) = match budget {
                Budget::Quick => (300, 200, 2),
                Budget::Runs(n) => {
                    let left = n.saturating_sub(progress(&stats));
                    match only {
                        None | Some(Part::Memory) => {
                            let round = left.min(MEMORY_ROUND);
                            (round, (round * SQLITE_ROUND).div_ceil(MEMORY_ROUND), 1)
                        }
                        Some(Part::Sqlite) => (0, left.min(SQLITE_ROUND), 0),
                        Some(Part::Kills) => (0, 0, 1),
                    }
                }
                Budget::Minutes(_) => (MEMORY_ROUND, SQLITE_ROUND, 1),
            };
            if let Some(part) = only {
                memory_runs *= u64::from(part == Part::Memory);
                sqlite_runs *= u64::from(part == Part::Sqlite);
                kill_cycles *= u64::from(part == Part::Kills);
            }
            let at = Instant::now();
            for _ in 0..memory_runs {
                memory.run_one(&mut rng, &mut stats).await;
            }
            *stats.busy.entry(StoreKind::Memory).or_default() += at.elapsed();
            let at = Instant::now();
            for _ in 0..sqlite_runs {
                sqlite.run_one(&mut rng, &mut stats).await;
            }
            *stats.busy.entry(StoreKind::Sqlite).or_default() += at.elapsed();
            let at = Instant::now();
            for _ in 0..kill_cycles {
                kills.cycle(&mut rng, &mut stats).await?;
            }
            stats.killing += at.elapsed();
            sample(&mut stats);
            if last_progress.elapsed() > Duration::from_secs(10) {
                last_progress = Instant::now();
                eprintln!(
                    "awaken-soak: {:.0} s: {} memory runs, {} sqlite runs, {} kills, \
                     {} violations, RSS {} KiB",
                    started.elapsed().as_secs_f64(),
                    stats.store_runs(StoreKind::Memory),
                    stats.store_runs(StoreKind::Sqlite),
                    stats.kill_cycles,
                    stats.violation_count(),
                    stats.rss.last().map_or(0, |(_, kib)| *kib)
                );
            }
            let done = match budget {
                Budget::Quick => true,
                Budget::Runs(n) => progress(&stats) >= n,
                Budget::Minutes(_) => deadline.is_some_and(|d| Instant::now() >= d),
            };
            if done {
                break;
            }
        }
        anyhow::Ok(())
    })?;
    let wall = started.elapsed();
    let drift = stats::drift(&stats.rss, WARM_UP);
    println!();
    println!("| soak | value |");
    println!("|---|---|");
    print!("{}", stats::summary(&stats, seed, wall, WARM_UP, drift));
    for v in &stats.violations {
        println!("violation: {}: {}", v.context, v.what);
    }
    if stats.more_violations > 0 {
        println!("... and {} more violations", stats.more_violations);
    }
    let mut ok = stats.violation_count() == 0;
    if let Some(d) = drift
        && d.percent > MAX_DRIFT
    {
        println!(
            "the resident set grew {:.2} % after the warm-up (at most {MAX_DRIFT} %)",
            d.percent
        );
        ok = false;
    }
    if ok {
        println!("soak: ok");
    } else {
        println!("soak: FAILED (the same faults again: --seed {seed})");
    }
    Ok(ok)
}

/// Samples the resident set if [`RSS_EVERY`] more in-process runs were made since the last
/// sample.
fn sample(stats: &mut Stats) {
    let runs = stats.in_process_runs();
    let sampled = stats.rss.last().map_or(0, |(at, _)| *at);
    if runs / RSS_EVERY > sampled / RSS_EVERY
        && let Some(kib) = stats::rss_kib()
    {
        stats.rss.push((runs, kib));
    }
}
