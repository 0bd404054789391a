//! The scripted provider across processes. A script describes the model's answers to one prompt:
//! each inference plays the turn after those the thread's current run already played, read
//! from the store (the inferences the run's statistics count). So a run that suspends, is
//! cancelled or crashes goes on with the right turn when another invocation resumes, continues
//! or recovers it, a message sent to the run in flight is answered by its next turn, and a new
//! prompt starts the script again.

use std::sync::Arc;

use awaken::event::{Message, Role, ThreadId};
use awaken::llm::{
    InferenceExecutionError, InferenceRequest, LlmEventStream, LlmExecutor, Script, ScriptTurn,
    ScriptedExecutor,
};
use awaken::runtime::RunStats;
use awaken_store::{Checkpoint, RunStatus, ThreadStore};
use futures_util::StreamExt;
use futures_util::stream;

/// The number of turns the thread's current run has played: the inferences its statistics
/// count while it runs, else the assistant messages after the last user message.
pub(crate) fn played(checkpoint: &Checkpoint) -> usize {
    match &checkpoint.run {
        Some(run) if run.status == RunStatus::Running => {
            RunStats::of_stored(&checkpoint.run_state).inferences as usize
        }
        _ => script_offset(&checkpoint.messages),
    }
}

/// The assistant messages after the last user message of `history`.
pub(crate) fn script_offset(history: &[Message]) -> usize {
    history
        .iter()
        .rev()
        .take_while(|m| m.role != Role::User)
        .filter(|m| m.role == Role::Assistant)
        .count()
}

/// Plays a script per thread (the request's routing key is its thread id), starting each
/// inference at the turn after those [`played`] of the thread as stored.
pub(crate) struct ThreadScript {
    turns: Arc<[ScriptTurn]>,
    store: Arc<dyn ThreadStore>,
}

impl ThreadScript {
    /// Checks `script` and plays it against the histories in `store`.
    pub(crate) fn new(script: Script, store: Arc<dyn ThreadStore>) -> anyhow::Result<Self> {
        script.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Self {
            turns: script.turns.into(),
            store,
        })
    }
}

impl LlmExecutor for ThreadScript {
    fn name(&self) -> &str {
        "scripted"
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let turns = Arc::clone(&self.turns);
        let store = Arc::clone(&self.store);
        let start = async move {
            let thread = request
                .routing_key
                .as_deref()
                .and_then(|k| ThreadId::new(k).ok());
            let played = match thread {
                Some(thread) => match store.load_checkpoint(&thread).await {
                    Ok(checkpoint) => checkpoint.as_ref().map_or(0, played),
                    Err(e) => {
                        return stream::once(async move {
                            Err(InferenceExecutionError::Config {
                                field: "script",
                                reason: format!("cannot read the thread's history: {e}"),
                            })
                        })
                        .boxed();
                    }
                },
                None => 0,
            };
            let total = turns.len();
            let rest = turns.get(played..).unwrap_or_default().to_vec();
            if rest.is_empty() {
                return stream::once(async move {
                    Err(InferenceExecutionError::ScriptExhausted { turns: total })
                })
                .boxed();
            }
            match ScriptedExecutor::new(Script { turns: rest }) {
                Ok(executor) => executor.execute_stream(request),
                Err(e) => stream::once(async move {
                    Err(InferenceExecutionError::Config {
                        field: "script",
                        reason: e.to_string(),
                    })
                })
                .boxed(),
            }
        };
        stream::once(start).flatten().boxed()
    }
}
