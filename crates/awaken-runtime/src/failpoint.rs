//! Crash failpoints for the crash-recovery tests (feature `failpoints`; never in production
//! builds). `AWAKEN_CRASH_AT=<boundary>` or `<boundary>:<call id>` makes the process kill
//! itself with SIGKILL when the run reaches that durable boundary, after appending the boundary
//! to the file named by `AWAKEN_CRASH_MARKER` (the proof that it got there).
//!
//! Boundaries: `before_requested` (the model answered with calls; nothing of them is
//! committed), `after_requested` (the calls are committed `Requested`), `after_executing`
//! (the call is committed `Executing` and its tool has run; the result is not committed),
//! `after_result` (the call's result is committed), `after_compaction_commit` (a commit
//! carrying a change to the thread's compaction state — a summary — is in the store).
//! awaken-context's `compaction_summarized` (the summariser answered, nothing of it is
//! committed) comes with this feature too, and so does the fleet worker's `before_job_end`
//! (a queued job's activation ended and is committed; the queue has not been told).

/// Kills the process here if `AWAKEN_CRASH_AT` names this boundary (and call, when given).
#[cfg(feature = "failpoints")]
pub fn hit(boundary: &str, call_id: Option<&str>) {
    use std::io::Write;
    use std::sync::OnceLock;
    static AT: OnceLock<Option<String>> = OnceLock::new();
    let Some(at) = AT.get_or_init(|| std::env::var("AWAKEN_CRASH_AT").ok()) else {
        return;
    };
    let matches = match at.split_once(':') {
        Some((b, c)) => b == boundary && call_id == Some(c),
        None => at == boundary,
    };
    if !matches {
        return;
    }
    if let Some(marker) = std::env::var_os("AWAKEN_CRASH_MARKER")
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(marker)
    {
        // One write of the whole line: threads reaching the point at once append whole lines
        // (`writeln!` may write the name and the newline apart).
        let _ = f.write_all(format!("{at}\n").as_bytes());
        let _ = f.sync_all();
    }
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status();
    // SIGKILL is not deliverable late; should `kill` be missing, abort instead.
    std::process::abort();
}

/// Without the feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_boundary: &str, _call_id: Option<&str>) {}
