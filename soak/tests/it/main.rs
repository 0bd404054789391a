//! The quick soak as a test, so that `cargo test` (and `cargo xtask test`) runs it and it
//! cannot rot: the soak binary with `--quick` must pass, having injected every kind of fault,
//! fired every failpoint of both stores and recovered a killed child.

use std::process::Command;

/// The value of the summary row named `name`, as a number.
fn row(summary: &str, name: &str) -> u64 {
    let prefix = format!("| {name} | ");
    let line = summary
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no row {name:?} in\n{summary}"));
    line[prefix.len()..]
        .trim_end_matches(" |")
        .parse()
        .unwrap_or_else(|e| panic!("row {name:?}: {e} in {line:?}"))
}

#[test]
fn the_quick_soak_injects_every_fault_and_breaks_no_invariant() {
    let out = Command::new(env!("CARGO_BIN_EXE_awaken-soak"))
        .args(["--quick", "--seed", "20240601"])
        .output()
        .expect("the soak binary runs");
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the quick soak failed ({}):\n{summary}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for name in [
        "fault: cancellation",
        "fault: store fault",
        "fault: provider: retryable, retried away",
        "fault: provider: retryable, retries exhausted",
        "fault: provider: permanent",
        "fault: provider: broken stream",
        "fault: provider stall, then cancelled",
        "fault: provider stall, then its timeout",
        "fault: provider stall, then dropped and recovered",
        "recovered in process",
        "recovered after a kill",
        "kills: SIGKILL at a random moment",
    ] {
        assert!(row(&summary, name) > 0, "{name} is 0 in\n{summary}");
    }
    for store in ["memory", "sqlite"] {
        for point in ["AfterMessages", "AfterRun", "AfterState", "AfterEvents"] {
            let name = format!("store fault: {store} {point}");
            assert!(row(&summary, &name) > 0, "{name} is 0 in\n{summary}");
        }
    }
    assert_eq!(row(&summary, "kill cycles"), 2, "{summary}");
    assert!(
        summary.contains("| kills: AWAKEN_CRASH_AT="),
        "no kill at a durable boundary in\n{summary}"
    );
    for name in [
        "invariant violations",
        "duplicated side effects",
        "lost commits",
    ] {
        assert_eq!(row(&summary, name), 0, "{name} in\n{summary}");
    }
}
