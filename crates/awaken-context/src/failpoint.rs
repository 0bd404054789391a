//! Crash failpoints inside compaction, for the runtime's crash-recovery tests (feature
//! `failpoints`; never in production builds). They follow the runtime's own failpoints:
//! `AWAKEN_CRASH_AT=<name>` makes the process append the name to the file named by
//! `AWAKEN_CRASH_MARKER` (the proof that it got there) and kill itself with SIGKILL.
//!
//! Names: `compaction_summarized` (the summariser answered; the summary is neither in the
//! state nor in the store).

/// Kills the process here if `AWAKEN_CRASH_AT` names this point.
#[cfg(feature = "failpoints")]
pub(crate) fn hit(name: &str) {
    use std::io::Write;
    if std::env::var("AWAKEN_CRASH_AT").ok().as_deref() != Some(name) {
        return;
    }
    if let Some(marker) = std::env::var_os("AWAKEN_CRASH_MARKER")
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(marker)
    {
        // One write of the whole line, as the runtime's failpoints do.
        let _ = f.write_all(format!("{name}\n").as_bytes());
        let _ = f.sync_all();
    }
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status();
    // Should `kill` be missing, abort instead.
    std::process::abort();
}

/// Without the feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn hit(_name: &str) {}
