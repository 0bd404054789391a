//! Awaken's project automation (the cargo-xtask pattern): `cargo xtask test`, `lint`, `ci`,
//! `bench [--quick]`, `soak` (the soak with faults), `fuzz` (the fuzz targets), `deps` (the
//! check that crates depend in one direction and never on what they must not know) and `tidy`
//! (wording, file length, module cycles). A program, not a framework: each command is a short
//! sequence of `cargo` invocations.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

mod bench;
mod deps;
mod fuzz;
mod soak;
mod tidy;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  test            run every test of the workspace (the README's test command; it includes
                  the quick soak, the `awaken-soak` crate's test)
  lint            cargo fmt --check, clippy -D warnings, rustdoc -D warnings, deps, tidy
  tidy            no development narration, no source file over 1,000 lines, no module cycles
  deps            check crate directions and forbidden dependencies
  ci              lint, then test
  bench [--quick] run the benches and write target/awaken-bench/summary.json
  fuzz [--seconds N] [target...]
                  build the fuzz targets of fuzz/ (cargo-fuzz, nightly) and run each for N
                  seconds (60 by default; all targets unless named); prints each target's CPU
                  time and crashes, and fails when one crashed (see docs/fuzzing.md)
  soak [--minutes N | --runs N | --quick] [--seed S]
                  run agents under cancellations, store and provider faults and process
                  kills, checking every invariant after each run (release; ten minutes by
                  default; --quick: the short debug soak)
";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("xtask: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<()> {
    let root = workspace_root();
    std::env::set_current_dir(&root).with_context(|| format!("cd {}", root.display()))?;
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["test"] => test(),
        ["lint"] => lint(),
        ["deps"] => deps_check(),
        ["tidy"] => tidy_check(&root),
        ["ci"] => {
            lint()?;
            test()
        }
        ["bench"] => bench::run(&root, false),
        ["bench", "--quick"] => bench::run(&root, true),
        ["fuzz", rest @ ..] => fuzz::run(&root, rest),
        ["soak", rest @ ..] => soak::run(rest),
        _ => bail!("{USAGE}"),
    }
}

fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Runs a command, failing with its name when it fails.
pub(crate) fn cmd(program: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<()> {
    say(&format!("$ {program} {}", args.join(" ")));
    let status = Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .status()
        .with_context(|| format!("could not start {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

pub(crate) fn say(line: &str) {
    #[allow(clippy::print_stderr)]
    {
        eprintln!("{line}");
    }
}

fn test() -> Result<()> {
    let postgres = std::env::var_os("AWAKEN_TEST_POSTGRES_URL").is_some();
    cmd("cargo", &["test", "--workspace", "--locked"], &[])?;
    if !postgres {
        say(
            "note: the PostgreSQL store suite was skipped (AWAKEN_TEST_POSTGRES_URL is not set); \
             run `eval \"$(bash .ci/postgres.sh start)\"` first to include it",
        );
    }
    Ok(())
}

fn lint() -> Result<()> {
    cmd("cargo", &["fmt", "--all", "--", "--check"], &[])?;
    cmd(
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )?;
    cmd(
        "cargo",
        &["doc", "--workspace", "--no-deps", "--locked"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    // The store alone, without the backends the workspace build turns on: what a crate that
    // takes `awaken-store` without features compiles.
    cmd(
        "cargo",
        &[
            "check",
            "--locked",
            "--lib",
            "-p",
            "awaken-store",
            "--no-default-features",
        ],
        &[],
    )?;
    deps_check()?;
    tidy_check(Path::new("."))
}

fn tidy_check(root: &Path) -> Result<()> {
    say("$ tidy (wording, file length, module cycles)");
    report(
        "tidy",
        &tidy::check(root)?,
        "the repository speaks of the project; files and modules are in order",
        "tidy finding(s)",
    )
}

/// Says `ok` when a check found nothing, else each finding, and fails with their count.
fn report(check: &str, found: &[impl std::fmt::Display], ok: &str, what: &str) -> Result<()> {
    if found.is_empty() {
        say(&format!("{check}: {ok}"));
        return Ok(());
    }
    for f in found {
        say(&format!("{check}: {f}"));
    }
    bail!("{} {what}", found.len())
}

fn deps_check() -> Result<()> {
    say("$ cargo metadata (crate-direction check)");
    let out = Command::new("cargo")
        .args(["metadata", "--format-version", "1", "--locked"])
        .output()
        .context("could not start cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("cargo metadata output is not JSON")?;
    report(
        "deps",
        &deps::check(&meta)?,
        "every crate depends only on crates before it and on nothing it must not know",
        "dependency rule violation(s)",
    )
}
