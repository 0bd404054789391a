//! What the soak counts, its memory samples, and the summary table it prints.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use awaken_store::FailPoint;

use crate::plan::{FaultKind, Shape};

/// The stores the soak runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum StoreKind {
    /// `MemoryStore`.
    Memory,
    /// `SqliteStore` on a file.
    Sqlite,
}

impl StoreKind {
    /// The summary's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Sqlite => "sqlite",
        }
    }
}

/// How a child process of the kill part was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Kill {
    /// SIGKILL from the soak at a random moment.
    Signal,
    /// The runtime's crash failpoint at a durable boundary (`AWAKEN_CRASH_AT`).
    CrashAt(&'static str),
}

/// One invariant broken, with what is needed to find it again.
#[derive(Debug, Clone)]
pub(crate) struct Violation {
    /// Where: the store, the thread, the fault.
    pub(crate) context: String,
    /// What was wrong.
    pub(crate) what: String,
}

/// The soak's counters.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// Activations started in process, per store and shape (recoveries not included).
    pub(crate) runs: BTreeMap<(StoreKind, Shape), u64>,
    /// Runs per fault kind (all stores).
    pub(crate) faults: BTreeMap<FaultKind, u64>,
    /// Store faults that fired, per store and failpoint.
    pub(crate) store_faults: BTreeMap<(StoreKind, String), u64>,
    /// Runs continued by `recover` in process (after a dropped run or a lost last commit).
    pub(crate) recovered_in_process: u64,
    /// Every invariant broken (the first few kept in full).
    pub(crate) violations: Vec<Violation>,
    /// Violations beyond the ones kept.
    pub(crate) more_violations: u64,
    /// Side effects that ran twice.
    pub(crate) duplicated_effects: u64,
    /// Commits lost after a store fault (or failed commits that wrote something).
    pub(crate) lost_commits: u64,
    /// Kill cycles (a child killed, then recovered).
    pub(crate) kill_cycles: u64,
    /// Children stopped, per way.
    pub(crate) kills: BTreeMap<Kill, u64>,
    /// Runs the children started (threads found in the file after each kill).
    pub(crate) child_runs: u64,
    /// Runs `recover` continued after a kill.
    pub(crate) recovered_after_kill: u64,
    /// Threads deleted as the soak went.
    pub(crate) pruned: u64,
    /// RSS samples: (in-process runs so far, KiB).
    pub(crate) rss: Vec<(u64, u64)>,
    /// Time spent in each store's in-process runs (their checks included).
    pub(crate) busy: BTreeMap<StoreKind, Duration>,
    /// Time spent in kill cycles (the child's life, the recovery, the checks).
    pub(crate) killing: Duration,
}

/// At most this many violations are kept in full.
const KEPT: usize = 20;

/// The failpoint's name in the summary.
pub(crate) fn point_name(point: FailPoint) -> String {
    format!("{point:?}")
}

impl Stats {
    /// Counts a broken invariant.
    pub(crate) fn violation(&mut self, context: impl Into<String>, what: impl Into<String>) {
        if self.violations.len() < KEPT {
            self.violations.push(Violation {
                context: context.into(),
                what: what.into(),
            });
        } else {
            self.more_violations += 1;
        }
    }

    /// Every violation counted.
    pub(crate) fn violation_count(&self) -> u64 {
        self.violations.len() as u64 + self.more_violations
    }

    /// In-process activations so far.
    pub(crate) fn in_process_runs(&self) -> u64 {
        self.runs.values().sum()
    }

    /// Activations started in process on `store` so far.
    pub(crate) fn in_process(&self, store: StoreKind) -> u64 {
        self.runs
            .iter()
            .filter(|((s, _), _)| *s == store)
            .map(|(_, n)| n)
            .sum()
    }

    /// Runs on `store` so far (SQLite's include the killed children's).
    pub(crate) fn store_runs(&self, store: StoreKind) -> u64 {
        match store {
            StoreKind::Memory => self.in_process(store),
            StoreKind::Sqlite => self.in_process(store) + self.child_runs,
        }
    }
}

/// The drift the soak reports: the first sample at or after `warm_up` runs against the last.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drift {
    /// RSS at warm-up, KiB.
    pub(crate) at_warm_up: u64,
    /// RSS at the end, KiB.
    pub(crate) at_end: u64,
    /// (end − warm-up) / warm-up, in per cent.
    pub(crate) percent: f64,
    /// The lowest and highest sample from the warm-up's on, KiB.
    pub(crate) range: (u64, u64),
}

/// The drift after `warm_up` runs, if a sample after it and a later one exist.
pub(crate) fn drift(samples: &[(u64, u64)], warm_up: u64) -> Option<Drift> {
    let first = samples.iter().position(|(runs, _)| *runs >= warm_up)?;
    let (_, at_warm_up) = samples[first];
    let &(_, at_end) = samples.last()?;
    if samples.len() <= first + 1 || at_warm_up == 0 {
        return None;
    }
    let after = samples[first..].iter().map(|(_, kib)| *kib);
    Some(Drift {
        at_warm_up,
        at_end,
        percent: (at_end as f64 - at_warm_up as f64) * 100.0 / at_warm_up as f64,
        range: (
            after.clone().min().unwrap_or(at_warm_up),
            after.max().unwrap_or(at_end),
        ),
    })
}

/// The process's resident set in KiB (`/proc/self/statm`, its second field in pages).
pub(crate) fn rss_kib() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4)
}

/// The summary as a Markdown table (the form `docs/performance.md` quotes).
pub(crate) fn summary(
    stats: &Stats,
    seed: u64,
    wall: Duration,
    warm_up: u64,
    drift: Option<Drift>,
) -> String {
    let mut out = String::new();
    let mut row = |name: &str, value: String| {
        let _ = writeln!(out, "| {name} | {value} |");
    };
    row("seed (`--seed` replays it)", seed.to_string());
    row("wall time", format!("{:.1} s", wall.as_secs_f64()));
    for ((store, shape), n) in &stats.runs {
        row(
            &format!("runs: {} {}", store.name(), shape.agent()),
            n.to_string(),
        );
    }
    row(
        "runs: sqlite, in killed children",
        stats.child_runs.to_string(),
    );
    for (store, busy) in &stats.busy {
        let runs = stats.in_process(*store);
        row(
            &format!("time in {} runs (runs per second)", store.name()),
            format!(
                "{:.1} s ({:.0})",
                busy.as_secs_f64(),
                runs as f64 / busy.as_secs_f64().max(1e-9)
            ),
        );
    }
    row(
        "time in kill cycles",
        format!("{:.1} s", stats.killing.as_secs_f64()),
    );
    for kind in FaultKind::ALL {
        row(
            &format!("fault: {}", kind.name()),
            stats.faults.get(&kind).copied().unwrap_or(0).to_string(),
        );
    }
    for ((store, point), n) in &stats.store_faults {
        row(
            &format!("store fault: {} {point}", store.name()),
            n.to_string(),
        );
    }
    row(
        "recovered in process",
        stats.recovered_in_process.to_string(),
    );
    row("kill cycles", stats.kill_cycles.to_string());
    for (kill, n) in &stats.kills {
        let name = match kill {
            Kill::Signal => "kills: SIGKILL at a random moment".to_owned(),
            Kill::CrashAt(at) => format!("kills: AWAKEN_CRASH_AT={at}"),
        };
        row(&name, n.to_string());
    }
    row(
        "recovered after a kill",
        stats.recovered_after_kill.to_string(),
    );
    row("threads pruned", stats.pruned.to_string());
    row("invariant violations", stats.violation_count().to_string());
    row(
        "duplicated side effects",
        stats.duplicated_effects.to_string(),
    );
    row("lost commits", stats.lost_commits.to_string());
    match drift {
        Some(d) => {
            row(
                &format!("RSS after warm-up ({warm_up} runs)"),
                format!("{} KiB", d.at_warm_up),
            );
            row("RSS at the end", format!("{} KiB", d.at_end));
            row(
                "RSS samples from the warm-up on, lowest–highest",
                format!("{}–{} KiB", d.range.0, d.range.1),
            );
            row("RSS drift", format!("{:+.2} %", d.percent));
        }
        None => row(
            "RSS drift",
            format!("not measured: fewer than two samples after {warm_up} runs"),
        ),
    }
    out
}
