//! `cargo xtask bench [--quick]`: runs the criterion benches (and any benchmark program that
//! writes its own figures), then gathers every figure into `target/awaken-bench/summary.json`,
//! a JSON array of `{"name", "value", "unit"}`, and prints it as a table.
//!
//! Criterion figures are medians in `ns`, read from the `new/estimates.json` files under
//! `target/criterion/` written by this run, named by the `full_id` in `new/benchmark.json`. Other
//! benchmark programs append their figures as JSON arrays of the same shape to files in
//! `target/awaken-bench/extra/`, which this run empties first.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::{cmd, say};

pub(crate) fn run(root: &Path, quick: bool) -> Result<()> {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let out_dir = target.join("awaken-bench");
    let extra_dir = out_dir.join("extra");
    if extra_dir.exists() {
        std::fs::remove_dir_all(&extra_dir)
            .with_context(|| format!("clearing {}", extra_dir.display()))?;
    }
    std::fs::create_dir_all(&extra_dir)
        .with_context(|| format!("creating {}", extra_dir.display()))?;
    let started = SystemTime::now();
    let extra = extra_dir.to_string_lossy().into_owned();
    let mut args = vec!["bench", "-p", "awaken-benches", "--locked"];
    let quick_args = [
        "--warm-up-time",
        "0.05",
        "--measurement-time",
        "0.1",
        "--sample-size",
        "10",
    ];
    if quick {
        args.extend(["--profile", "bench-quick", "--", "--noplot"]);
        args.extend(quick_args);
    } else {
        args.extend(["--", "--noplot"]);
    }
    let envs = [
        ("AWAKEN_BENCH_EXTRA_DIR", extra.as_str()),
        ("AWAKEN_BENCH_QUICK", if quick { "1" } else { "0" }),
    ];
    cmd("cargo", &args, &envs)?;

    let mut figures = criterion_figures(&target.join("criterion"), started)?;
    figures.extend(extra_figures(&extra_dir)?);
    figures.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let summary = out_dir.join("summary.json");
    std::fs::write(&summary, serde_json::to_vec_pretty(&figures)?)
        .with_context(|| format!("writing {}", summary.display()))?;
    say(&format!("\n{:<48} {:>14} unit", "benchmark", "value"));
    for f in &figures {
        say(&format!(
            "{:<48} {:>14.3} {}",
            f["name"].as_str().unwrap_or("?"),
            f["value"].as_f64().unwrap_or(f64::NAN),
            f["unit"].as_str().unwrap_or("?")
        ));
    }
    say(&format!(
        "\n{} figures written to {}",
        figures.len(),
        summary.display()
    ));
    if figures.is_empty() {
        anyhow::bail!("the benches produced no figures");
    }
    Ok(())
}

/// Medians of every criterion benchmark whose estimates were written since `since`.
fn criterion_figures(dir: &Path, since: SystemTime) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    if !dir.exists() {
        return Ok(out);
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let is_new_estimate = path.file_name().is_some_and(|n| n == "estimates.json")
                && path
                    .parent()
                    .and_then(Path::file_name)
                    .is_some_and(|n| n == "new");
            if !is_new_estimate {
                continue;
            }
            let modified = std::fs::metadata(&path)?.modified()?;
            if modified < since {
                continue; // a bench of an earlier run that this run did not execute
            }
            let text = std::fs::read_to_string(&path)?;
            let est: Value = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", path.display()))?;
            let median = est["median"]["point_estimate"]
                .as_f64()
                .with_context(|| format!("{}: no median", path.display()))?;
            let Some(bench_dir) = path.parent().and_then(Path::parent) else {
                continue;
            };
            // Criterion flattens `group/name` into one directory name; its `benchmark.json`
            // keeps the full id.
            let full_id = std::fs::read_to_string(path.with_file_name("benchmark.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .and_then(|v| v["full_id"].as_str().map(str::to_owned));
            let name = match full_id {
                Some(id) => id,
                None => bench_dir
                    .strip_prefix(dir)?
                    .to_string_lossy()
                    .replace('\\', "/"),
            };
            out.push(json!({ "name": name, "value": median, "unit": "ns" }));
        }
    }
    Ok(out)
}

fn extra_figures(dir: &Path) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path)?;
        let figures: Vec<Value> =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        out.extend(figures);
    }
    Ok(out)
}
