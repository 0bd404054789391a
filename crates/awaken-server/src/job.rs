//! [`Job`]: what a launched task runs, a new run or the resume of a waiting one.

use awaken_runtime::{Resume, RunActivation};

/// What a launched task runs.
pub(crate) enum Job {
    Run(RunActivation),
    Resume(Resume),
}
