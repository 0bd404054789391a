//! The soak's tools: `effect`, side-effecting, which records each call it runs in a ledger (an
//! in-memory set in process, a file shared by the processes of the kill part), and `echo`,
//! read-only. A call id recorded twice is a side effect that ran twice.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use awaken_event::{EffectClass, ToolDescriptor};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};

/// Where `effect` records the calls it ran.
pub(crate) enum Ledger {
    /// In process: the calls of each live thread (forgotten when the thread is deleted), and
    /// the calls found recorded already.
    Memory {
        /// Thread id → `run/call` of every call that ran.
        calls: Mutex<HashMap<String, HashSet<String>>>,
        /// Calls that ran a second time.
        repeated: AtomicU64,
    },
    /// A file: one line `thread/run/call` per call, appended in one write (so a process killed
    /// at any moment leaves whole lines).
    File(PathBuf),
}

impl Ledger {
    /// An empty in-memory ledger.
    pub(crate) fn memory() -> Self {
        Ledger::Memory {
            calls: Mutex::new(HashMap::new()),
            repeated: AtomicU64::new(0),
        }
    }

    fn record(&self, ctx: &ToolCallContext) -> std::io::Result<()> {
        match self {
            Ledger::Memory { calls, repeated } => {
                let mut calls = calls.lock().unwrap_or_else(|e| e.into_inner());
                let call = format!("{}/{}", ctx.run_id(), ctx.call_id());
                let fresh = calls
                    .entry(ctx.thread_id().to_string())
                    .or_default()
                    .insert(call);
                if !fresh {
                    repeated.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
            Ledger::File(path) => {
                let line = format!("{}/{}/{}\n", ctx.thread_id(), ctx.run_id(), ctx.call_id());
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?
                    .write_all(line.as_bytes())
            }
        }
    }

    /// Forgets a deleted thread's calls (in memory; a file is checked and emptied whole).
    pub(crate) fn forget(&self, thread_id: &str) {
        if let Ledger::Memory { calls, .. } = self {
            calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(thread_id);
        }
    }

    /// Calls that ran twice so far (in memory; a file's are counted by reading it).
    pub(crate) fn repeated(&self) -> u64 {
        match self {
            Ledger::Memory { repeated, .. } => repeated.load(Ordering::Relaxed),
            Ledger::File(_) => 0,
        }
    }
}

/// The side-effecting tool: records the call, then yields once (a cancellation may land
/// after the effect and before the result).
pub(crate) struct Effect(pub(crate) std::sync::Arc<Ledger>);

#[async_trait]
impl Tool for Effect {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("effect", "Does something that must happen at most once")
            .with_effect(EffectClass::SideEffecting)
            .with_parameters(json!({
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"]
            }))
    }

    async fn execute(&self, args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        self.0
            .record(ctx)
            .map_err(|e| ToolError::execution(format!("the ledger could not be written: {e}")))?;
        tokio::task::yield_now().await;
        Ok(ToolOutput::success(json!({"done": args["n"]})))
    }
}

/// The read-only tool.
pub(crate) struct Echo;

#[async_trait]
impl Tool for Echo {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("echo", "Echoes its argument").with_effect(EffectClass::ReadOnly)
    }

    async fn execute(&self, args: &Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::success(json!({"echoed": args["n"]})))
    }
}
