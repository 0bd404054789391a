//! Fault injection inside a commit's write (feature `failpoints` arms them; tests only).

use std::sync::atomic::{AtomicU8, Ordering};

/// A place between two writes of a commit where a test can make the commit fail, to check
/// that the store then holds exactly the last successful commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailPoint {
    /// After the new messages are written.
    AfterMessages,
    /// After the run record (and batch) is written.
    AfterRun,
    /// After the run, thread and profile state deltas are written.
    AfterState,
    /// After the events are written, before the thread row and the transaction's end.
    AfterEvents,
}

impl FailPoint {
    const ALL: [FailPoint; 4] = [
        FailPoint::AfterMessages,
        FailPoint::AfterRun,
        FailPoint::AfterState,
        FailPoint::AfterEvents,
    ];

    fn code(self) -> u8 {
        match self {
            FailPoint::AfterMessages => 1,
            FailPoint::AfterRun => 2,
            FailPoint::AfterState => 3,
            FailPoint::AfterEvents => 4,
        }
    }

    /// Every failpoint, in the order a commit passes them.
    pub fn all() -> [FailPoint; 4] {
        Self::ALL
    }
}

/// The armed failpoint of one store (at most one; it fires once).
#[derive(Debug, Default)]
pub(crate) struct Failpoints {
    armed: AtomicU8,
}

impl Failpoints {
    /// Arms `point`: the next commit that reaches it fails with `StoreError::Injected` (its
    /// `CommitError::Backend`).
    #[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
    pub(crate) fn arm(&self, point: FailPoint) {
        self.armed.store(point.code(), Ordering::SeqCst);
    }

    /// Fails (once) if `point` is armed. One relaxed load when nothing is armed.
    #[inline]
    pub(crate) fn check(&self, point: FailPoint) -> Result<(), crate::StoreError> {
        if self.armed.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        if self
            .armed
            .compare_exchange(point.code(), 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return Err(crate::StoreError::Injected { point });
        }
        Ok(())
    }
}
