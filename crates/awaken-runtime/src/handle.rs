//! [`RunHandle`]: cancels a run from anywhere.

use awaken_event::CancellationToken;

/// Cancels a run from anywhere.
#[derive(Debug, Clone)]
pub struct RunHandle {
    cancel: CancellationToken,
}

impl RunHandle {
    pub(crate) fn new(cancel: CancellationToken) -> Self {
        Self { cancel }
    }

    /// Cancels the run: it ends as `Cancelled` at its next await point.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Whether the run was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
}
