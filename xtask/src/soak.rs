//! `cargo xtask soak [--minutes N | --runs N | --quick] [--seed S]`: builds and runs the soak
//! with faults (`soak/`, the `awaken-soak` binary). The real soak runs in release mode (ten
//! minutes unless told otherwise); `--quick` runs the short debug soak that `cargo xtask test`
//! also runs, as the `awaken-soak` crate's test. The soak prints its summary table and fails
//! on any broken invariant.

use anyhow::Result;

use crate::cmd;

pub(crate) fn run(args: &[&str]) -> Result<()> {
    let quick = args.contains(&"--quick");
    let mut cargo = vec!["run", "-p", "awaken-soak", "--locked"];
    if !quick {
        cargo.push("--release");
    }
    cargo.push("--");
    cargo.extend(args);
    cmd("cargo", &cargo, &[])
}
