//! What a running tool sees: its call, a stable idempotency key, a read-only snapshot,
//! cancellation and a progress channel.

use std::fmt;
use std::sync::Arc;

use awaken_event::{CancellationToken, RunId, ThreadId, ToolCallId, ToolCallResume};
use awaken_state::Snapshot;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::digest::hex_with_prefix;

/// A key a tool passes on to the systems it writes to, so a re-run of the same call has no
/// further effect there.
///
/// Derived only from the thread, run and call ids, so it is identical on every attempt of a
/// call: a retry, a re-run after a crash, in this process or another. Format (version 1):
/// `awk1-` followed by the 64 lowercase hex digits of SHA-256 over
/// `"awaken.idempotency.v1\n" + len(thread) + ":" + thread + len(run) + ":" + run + len(call) + ":" + call`
/// (lengths in decimal bytes, so no two id triples collide).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key of call `call_id` of run `run_id` on thread `thread_id`.
    pub fn derive(thread_id: &ThreadId, run_id: &RunId, call_id: &ToolCallId) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"awaken.idempotency.v1\n");
        for part in [thread_id.as_str(), run_id.as_str(), call_id.as_str()] {
            hasher.update(part.len().to_string().as_bytes());
            hasher.update(b":");
            hasher.update(part.as_bytes());
        }
        IdempotencyKey(hex_with_prefix("awk1-", &hasher.finalize()))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({:?})", self.0)
    }
}

/// Where a tool's progress reports go. The runtime supplies one that turns each report into an
/// `AgentEvent::ToolCallProgress`; this crate only forwards.
///
/// Called synchronously from inside the tool's `execute`, possibly many times; it must not
/// block (queue the report and return). Progress is informational: it never changes state.
pub trait ProgressSink: Send + Sync {
    /// Records one progress report of call `call_id`.
    fn report(&self, call_id: &ToolCallId, progress: Value);
}

impl<F> ProgressSink for F
where
    F: Fn(&ToolCallId, Value) + Send + Sync,
{
    fn report(&self, call_id: &ToolCallId, progress: Value) {
        self(call_id, progress)
    }
}

/// A progress sink that drops every report.
#[derive(Debug, Clone, Copy, Default)]
pub struct NullProgress;

impl ProgressSink for NullProgress {
    fn report(&self, _call_id: &ToolCallId, _progress: Value) {}
}

/// What every call of one run shares: the thread and run ids, the run's cancellation and the
/// sink its calls report progress to. Made once per run and handed to each call's context
/// ([`ToolCallScope::context`]): a call then copies one handle for all of them (each handle
/// copied is an atomic count change).
#[derive(Clone)]
pub struct ToolCallScope(Arc<ScopeParts>);

#[derive(Clone)]
struct ScopeParts {
    thread_id: ThreadId,
    run_id: RunId,
    cancel: CancellationToken,
    /// `None`: reports are dropped (no allocation for a sink most calls never use).
    progress: Option<Arc<dyn ProgressSink>>,
}

impl ToolCallScope {
    /// The calls of run `run_id` on thread `thread_id`, cancelled by `cancel`, with no
    /// progress sink.
    pub fn new(thread_id: ThreadId, run_id: RunId, cancel: CancellationToken) -> Self {
        Self(Arc::new(ScopeParts {
            thread_id,
            run_id,
            cancel,
            progress: None,
        }))
    }

    /// With the sink progress reports go to.
    pub fn with_progress(mut self, progress: Arc<dyn ProgressSink>) -> Self {
        Arc::make_mut(&mut self.0).progress = Some(progress);
        self
    }

    /// The context of call `call_id` of this run, reading `snapshot`, with no resume decision.
    pub fn context(&self, call_id: ToolCallId, snapshot: Snapshot) -> ToolCallContext {
        ToolCallContext {
            scope: self.clone(),
            call_id,
            idempotency_key: std::sync::OnceLock::new(),
            snapshot,
            resume: None,
        }
    }
}

impl fmt::Debug for ToolCallScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolCallScope")
            .field("thread_id", &self.0.thread_id)
            .field("run_id", &self.0.run_id)
            .field("cancelled", &self.0.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// The context of one tool call. Cheap to clone (what the run's calls share is one handle, the
/// rest are shared strings and `Arc`s).
#[derive(Clone)]
pub struct ToolCallContext {
    /// The run's ids, cancellation and progress sink.
    scope: ToolCallScope,
    call_id: ToolCallId,
    /// Derived when first asked for (a hash: most tools never ask).
    idempotency_key: std::sync::OnceLock<IdempotencyKey>,
    snapshot: Snapshot,
    resume: Option<ToolCallResume>,
}

impl ToolCallContext {
    /// The context of call `call_id` of run `run_id` on thread `thread_id`, reading `snapshot`,
    /// with a fresh cancellation token, no progress sink and no resume decision.
    pub fn new(
        thread_id: ThreadId,
        run_id: RunId,
        call_id: ToolCallId,
        snapshot: Snapshot,
    ) -> Self {
        Self::with_token(
            thread_id,
            run_id,
            call_id,
            snapshot,
            CancellationToken::new(),
        )
    }

    /// As [`new`](Self::new), with the run's cancellation token (or a child of it) from the
    /// start: no fresh token is made to be replaced. A runtime making many calls of one run
    /// makes a [`ToolCallScope`] once instead.
    pub fn with_token(
        thread_id: ThreadId,
        run_id: RunId,
        call_id: ToolCallId,
        snapshot: Snapshot,
        cancel: CancellationToken,
    ) -> Self {
        ToolCallScope::new(thread_id, run_id, cancel).context(call_id, snapshot)
    }

    /// With the run's cancellation token (or a child of it).
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        Arc::make_mut(&mut self.scope.0).cancel = cancel;
        self
    }

    /// With the sink progress reports go to.
    pub fn with_progress(mut self, progress: Arc<dyn ProgressSink>) -> Self {
        self.scope = self.scope.with_progress(progress);
        self
    }

    /// With the human decision that let this call run (`ResumeMode::PassDecisionToTool`).
    pub fn with_resume(mut self, resume: ToolCallResume) -> Self {
        self.resume = Some(resume);
        self
    }

    /// The thread.
    pub fn thread_id(&self) -> &ThreadId {
        &self.scope.0.thread_id
    }

    /// The run.
    pub fn run_id(&self) -> &RunId {
        &self.scope.0.run_id
    }

    /// The call.
    pub fn call_id(&self) -> &ToolCallId {
        &self.call_id
    }

    /// The call's idempotency key: identical on every attempt of this call, in any process.
    pub fn idempotency_key(&self) -> &IdempotencyKey {
        self.idempotency_key
            .get_or_init(|| IdempotencyKey::derive(self.thread_id(), self.run_id(), &self.call_id))
    }

    /// The state as of the call's start. Read-only: a tool changes state only through the
    /// command it returns.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The run's cancellation; a long tool should stop when it fires.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.scope.0.cancel
    }

    /// Whether the run has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.scope.0.cancel.is_cancelled()
    }

    /// The human decision this call runs under, if any.
    pub fn resume(&self) -> Option<&ToolCallResume> {
        self.resume.as_ref()
    }

    /// Reports progress (tool-defined JSON); the runtime streams it as a progress event.
    pub fn report_progress(&self, progress: Value) {
        if let Some(sink) = &self.scope.0.progress {
            sink.report(&self.call_id, progress);
        }
    }
}

impl fmt::Debug for ToolCallContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolCallContext")
            .field("thread_id", self.thread_id())
            .field("run_id", self.run_id())
            .field("call_id", &self.call_id)
            .field("idempotency_key", &self.idempotency_key)
            .field("revision", &self.snapshot.revision())
            .field("cancelled", &self.is_cancelled())
            .field("resume", &self.resume)
            .finish_non_exhaustive()
    }
}
