//! `cargo xtask fuzz [--seconds N] [target...]`: builds the fuzz targets of `fuzz/` (one per
//! decoder of outside input; see `docs/fuzzing.md`) with cargo-fuzz on nightly and runs each,
//! one after another, for N seconds (60 unless told), at the lowest scheduling priority. Each
//! target keeps its corpus in `fuzz/corpus/<target>/`, starts from its seeds (the repository's
//! example files and `fuzz/regressions/<target>/`), and writes what crashed it to
//! `fuzz/artifacts/<target>/`; its output goes to `fuzz/logs/<target>.log`. The summary gives
//! each target's CPU time and the crashes (artifacts) it found; the command fails when a target
//! crashed or did not build.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::say;

/// A fuzz target: its name (a `[[bin]]` of `fuzz/Cargo.toml`), the directories of inputs it
/// starts from besides its corpus, and its dictionary in `fuzz/dicts/`.
pub(crate) struct Target {
    pub(crate) name: &'static str,
    seeds: &'static [&'static str],
    dict: Option<&'static str>,
}

/// Every fuzz target, in the order they run.
pub(crate) const TARGETS: &[Target] = &[
    Target {
        name: "sse",
        seeds: &[],
        dict: Some("sse.dict"),
    },
    Target {
        name: "openai_stream",
        seeds: &[],
        dict: Some("openai_stream.dict"),
    },
    Target {
        name: "agent_file",
        seeds: &["examples/agents"],
        dict: Some("agent_file.dict"),
    },
    Target {
        name: "plugin_manifest",
        seeds: &["examples/plugins"],
        dict: Some("plugin_manifest.dict"),
    },
    Target {
        name: "tool_arguments",
        seeds: &[],
        dict: None,
    },
    Target {
        name: "compact",
        seeds: &[],
        dict: None,
    },
    Target {
        name: "sqlite_rows",
        seeds: &[],
        dict: None,
    },
    Target {
        name: "event_grammar",
        seeds: &[],
        dict: None,
    },
];

const USAGE: &str = "usage: cargo xtask fuzz [--seconds N] [target...]";

/// Seconds per target unless `--seconds` says otherwise.
const DEFAULT_SECONDS: u64 = 60;

/// A single input running longer than this is reported as a timeout (a crash).
const INPUT_TIMEOUT_SECONDS: u64 = 10;

/// How one target's run went.
struct Outcome {
    target: &'static str,
    /// CPU seconds of the fuzzer (user and system), or `None` where that cannot be read.
    cpu_seconds: Option<f64>,
    wall_seconds: f64,
    /// The artifacts this run wrote (crashes, timeouts, out-of-memory inputs).
    artifacts: Vec<PathBuf>,
    /// Why the target did not build or run, if it did not.
    failed: Option<String>,
}

pub(crate) fn run(root: &Path, args: &[&str]) -> Result<()> {
    let (seconds, targets) = parse(args)?;
    check_tools()?;
    let host = host_triple()?;
    let fuzz = root.join("fuzz");
    let mut outcomes = Vec::new();
    for target in targets {
        outcomes.push(fuzz_one(root, &fuzz, &host, target, seconds));
    }
    say(&summary(&outcomes));
    let crashed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.artifacts.is_empty() || o.failed.is_some())
        .map(|o| o.target)
        .collect();
    if !crashed.is_empty() {
        bail!(
            "{} target(s) crashed or failed: {} (inputs in fuzz/artifacts/<target>/, output in fuzz/logs/<target>.log)",
            crashed.len(),
            crashed.join(", ")
        );
    }
    Ok(())
}

/// The seconds per target and the targets asked for (all when none is named).
fn parse(args: &[&str]) -> Result<(u64, Vec<&'static Target>)> {
    let mut seconds = DEFAULT_SECONDS;
    let mut names = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match *arg {
            "--seconds" => {
                let n = args.next().context(USAGE)?;
                seconds =
                    n.parse().ok().filter(|&s| s > 0).with_context(|| {
                        format!("--seconds {n}: expected a whole number above 0")
                    })?;
            }
            flag if flag.starts_with('-') => bail!("unknown option {flag}\n{USAGE}"),
            name => names.push(name),
        }
    }
    if names.is_empty() {
        return Ok((seconds, TARGETS.iter().collect()));
    }
    let mut targets = Vec::new();
    for name in names {
        let Some(target) = TARGETS.iter().find(|t| t.name == name) else {
            let known: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
            bail!(
                "no fuzz target {name:?}; the targets are {}",
                known.join(", ")
            );
        };
        targets.push(target);
    }
    Ok((seconds, targets))
}

fn check_tools() -> Result<()> {
    let found = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        bail!(
            "cargo-fuzz on a nightly toolchain is needed: `rustup toolchain install nightly` and \
             `cargo install cargo-fuzz --locked`"
        );
    }
    Ok(())
}

/// The host's target triple, which cargo-fuzz builds for and names its output directory after.
fn host_triple() -> Result<String> {
    let out = Command::new("rustc")
        .args(["+nightly", "-vV"])
        .output()
        .context("could not start rustc +nightly")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .context("rustc +nightly -vV names no host")
}

fn fuzz_one(
    root: &Path,
    fuzz: &Path,
    host: &str,
    target: &'static Target,
    seconds: u64,
) -> Outcome {
    let mut outcome = Outcome {
        target: target.name,
        cpu_seconds: None,
        wall_seconds: 0.0,
        artifacts: Vec::new(),
        failed: None,
    };
    if let Err(e) = try_fuzz_one(root, fuzz, host, target, seconds, &mut outcome) {
        outcome.failed = Some(format!("{e:#}"));
    }
    outcome
}

fn try_fuzz_one(
    root: &Path,
    fuzz: &Path,
    host: &str,
    target: &Target,
    seconds: u64,
    outcome: &mut Outcome,
) -> Result<()> {
    // Without a sanitizer: the workspace forbids `unsafe`, so what the targets find are panics,
    // overflows, stack overflows, timeouts and memory blow-ups, which need none (and run about
    // twice as fast without one).
    crate::cmd(
        "nice",
        &[
            "-n",
            "19",
            "cargo",
            "+nightly",
            "fuzz",
            "build",
            "--fuzz-dir",
            "fuzz",
            "--target",
            host,
            "--sanitizer",
            "none",
            target.name,
        ],
        &[],
    )?;
    let binary = fuzz
        .join("target")
        .join(host)
        .join("release")
        .join(target.name);
    let corpus = fuzz.join("corpus").join(target.name);
    let artifacts = fuzz.join("artifacts").join(target.name);
    let logs = fuzz.join("logs");
    for dir in [&corpus, &artifacts, &logs] {
        fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let before = files(&artifacts)?;
    let mut args: Vec<String> = vec![
        "-n".into(),
        "19".into(),
        binary.display().to_string(),
        corpus.display().to_string(),
    ];
    let regressions = fuzz.join("regressions").join(target.name);
    let seeds = target.seeds.iter().map(|s| root.join(s));
    for dir in seeds.chain([regressions]).filter(|d| d.is_dir()) {
        args.push(dir.display().to_string());
    }
    args.push(format!("-max_total_time={seconds}"));
    args.push(format!("-timeout={INPUT_TIMEOUT_SECONDS}"));
    args.push(format!("-artifact_prefix={}/", artifacts.display()));
    if let Some(dict) = target.dict {
        args.push(format!("-dict={}", fuzz.join("dicts").join(dict).display()));
    }
    let log_path = logs.join(format!("{}.log", target.name));
    let log =
        fs::File::create(&log_path).with_context(|| format!("create {}", log_path.display()))?;
    say(&format!(
        "$ nice {} ({seconds} s, output in {})",
        args[2..].join(" "),
        log_path.display()
    ));
    let cpu_before = children_cpu_seconds();
    let started = Instant::now();
    let status = Command::new("nice")
        .args(&args)
        .stdout(log.try_clone().context("log file")?)
        .stderr(log)
        .status()
        .context("could not start the fuzz target")?;
    outcome.wall_seconds = started.elapsed().as_secs_f64();
    outcome.cpu_seconds = cpu_before
        .zip(children_cpu_seconds())
        .map(|(before, after)| after - before);
    outcome.artifacts = files(&artifacts)?.difference(&before).cloned().collect();
    if !status.success() && outcome.artifacts.is_empty() {
        bail!(
            "the fuzzer stopped with {status} and left no input; see {}",
            log_path.display()
        );
    }
    Ok(())
}

/// The files in `dir`.
fn files(dir: &Path) -> Result<BTreeSet<PathBuf>> {
    let mut out = BTreeSet::new();
    for entry in fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_file() {
            out.insert(path);
        }
    }
    Ok(out)
}

/// The CPU seconds (user and system) of this process's children that have ended, from
/// `/proc/self/stat` (Linux; `None` elsewhere). Its clock ticks are USER_HZ, 100 a second on
/// every Linux architecture.
fn children_cpu_seconds() -> Option<f64> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    cpu_from_stat(&stat)
}

/// `cutime + cstime` of a `/proc/<pid>/stat` line, in seconds.
pub(crate) fn cpu_from_stat(stat: &str) -> Option<f64> {
    // The command name (field 2) may hold spaces; the fields after its `)` are space-separated,
    // the state (field 3) first, so cutime and cstime (fields 16 and 17) are the 14th and 15th.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(13)?.parse::<u64>().ok()? + fields.get(14)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn summary(outcomes: &[Outcome]) -> String {
    let mut out = String::from("\nfuzz summary\ntarget            cpu s   wall s  crashes\n");
    for o in outcomes {
        let cpu = o
            .cpu_seconds
            .map_or_else(|| "?".to_owned(), |s| format!("{s:.1}"));
        let _ = writeln!(
            out,
            "{:<16} {cpu:>6} {:>8.1}  {}",
            o.target,
            o.wall_seconds,
            o.artifacts.len()
        );
        for a in &o.artifacts {
            let _ = writeln!(out, "    {}", a.display());
        }
        if let Some(why) = &o.failed {
            let _ = writeln!(out, "    failed: {why}");
        }
    }
    out
}

#[cfg(test)]
mod tests;
