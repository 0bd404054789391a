//! The scripted model of the soak's agents, and the provider faults it injects.
//!
//! [`LoopModel`] answers from the request alone, so a run recovered in another process is
//! answered exactly as the interrupted one would have been: while fewer than `n − 1` of its
//! answers follow the last user message it calls `effect` (every third step `echo` as well),
//! then it answers `done`. Call ids are `u{users}c{k}` — the number of user messages, the
//! step — which makes them unique within a thread, as the runtime requires.

use std::sync::{Arc, Mutex};

use awaken_event::{Message, Role, StopReason, ToolCallId};
use awaken_llm::{InferenceExecutionError, InferenceRequest, LlmEventStream, LlmStreamEvent};
use futures_util::StreamExt;
use futures_util::stream;
use tokio::sync::Notify;

/// A provider fault armed for the next run of a runtime (runs of one runtime go one at a time
/// while a fault is armed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProviderFault {
    /// The next `times` calls at the step fail with a retryable error.
    Retryable {
        /// Calls left to fail.
        times: u32,
    },
    /// The call at the step is rejected (permanent).
    Permanent,
    /// The call's stream yields a text delta, then breaks off.
    MidStream,
    /// The call's stream stops yielding and tells [`ProviderFaults::stalled`]; it never ends
    /// by itself.
    Stall,
    /// The call's stream stops yielding for `turns` scheduler turns, then fails with a timeout.
    StallThenTimeout {
        /// How long the stall lasts.
        turns: u32,
    },
}

/// The fault armed on a runtime's models and what became of it.
#[derive(Debug, Default)]
pub(crate) struct ProviderFaults {
    armed: Mutex<Option<(u32, ProviderFault)>>,
    fired: Mutex<bool>,
    /// Signalled when a stalled stream stops yielding.
    pub(crate) stalled: Notify,
}

impl ProviderFaults {
    /// Arms `fault` at step `step` (from 0) of the next run, clearing what was armed before.
    pub(crate) fn arm(&self, step: u32, fault: ProviderFault) {
        *lock(&self.armed) = Some((step, fault));
        *lock(&self.fired) = false;
    }

    /// Clears the armed fault; returns whether it fired since it was armed.
    pub(crate) fn disarm(&self) -> bool {
        *lock(&self.armed) = None;
        std::mem::take(&mut *lock(&self.fired))
    }

    /// The fault to inject into a call at `step`, if one is armed there (consumed as it is
    /// used: a run recovered after a stall is not stalled again).
    fn take(&self, step: u32) -> Option<ProviderFault> {
        let mut armed = lock(&self.armed);
        let (at, fault) = (*armed)?;
        if at != step {
            return None;
        }
        *armed = match fault {
            ProviderFault::Retryable { times } if times > 1 => {
                Some((at, ProviderFault::Retryable { times: times - 1 }))
            }
            _ => None,
        };
        *lock(&self.fired) = true;
        Some(fault)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The soak's model: `n` steps, then `done`; see the module docs.
pub(crate) struct LoopModel {
    n: u32,
    faults: Arc<ProviderFaults>,
}

impl LoopModel {
    /// A model of `n` steps injecting the faults armed in `faults`.
    pub(crate) fn new(n: u32, faults: Arc<ProviderFaults>) -> Self {
        Self { n, faults }
    }
}

/// The number of user messages, and of the model's answers after the last of them (the
/// step: an answer committed is a step taken, whatever its calls' results).
fn position(messages: &[Message]) -> (usize, u32) {
    let last_user = messages.iter().rposition(|m| m.role == Role::User);
    let users = messages.iter().filter(|m| m.role == Role::User).count();
    let answers = last_user.map_or(0, |at| {
        messages[at..]
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count()
    });
    (users, u32::try_from(answers).unwrap_or(u32::MAX))
}

/// The answer at `step` of a run: tool calls while steps remain, then the text.
fn answer(n: u32, users: usize, step: u32) -> Vec<Result<LlmStreamEvent, InferenceExecutionError>> {
    if step + 1 >= n {
        return vec![
            Ok(LlmStreamEvent::TextDelta("done".into())),
            Ok(LlmStreamEvent::Stop(StopReason::EndTurn)),
        ];
    }
    let call = |index: u32, suffix: &str, name: &str| {
        let id = ToolCallId::new(format!("u{users}c{step}{suffix}"))
            .unwrap_or_else(|e| unreachable!("the call ids are short and plain: {e}"));
        [
            Ok(LlmStreamEvent::ToolCallStart {
                index,
                id,
                name: name.into(),
            }),
            Ok(LlmStreamEvent::ToolCallArgsDelta {
                index,
                delta: format!("{{\"n\":{step}}}"),
            }),
        ]
    };
    let mut events: Vec<_> = call(0, "", "effect").into_iter().collect();
    if step % 3 == 2 {
        events.extend(call(1, "e", "echo"));
    }
    events.push(Ok(LlmStreamEvent::Stop(StopReason::ToolCalls)));
    events
}

/// What the stream waits for before its events.
enum Wait {
    /// One scheduler turn, as a network call would take.
    Yield,
    /// Forever, after telling the soak.
    Stall(Arc<ProviderFaults>),
    /// Some turns.
    Turns(u32),
}

impl awaken_llm::LlmExecutor for LoopModel {
    fn name(&self) -> &str {
        "soak-loop"
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let (users, step) = position(&request.messages);
        let (wait, events) = match self.faults.take(step) {
            None => (Wait::Yield, answer(self.n, users, step)),
            Some(ProviderFault::Retryable { .. }) => (
                Wait::Yield,
                vec![Err(InferenceExecutionError::Overloaded {
                    status: 503,
                    retry_after: None,
                    message: "soak: overloaded".into(),
                })],
            ),
            Some(ProviderFault::Permanent) => (
                Wait::Yield,
                vec![Err(InferenceExecutionError::InvalidRequest {
                    status: Some(400),
                    message: "soak: rejected".into(),
                })],
            ),
            Some(ProviderFault::MidStream) => (
                Wait::Yield,
                vec![
                    Ok(LlmStreamEvent::TextDelta("part".into())),
                    Err(InferenceExecutionError::StreamInterrupted {
                        reason: "soak: connection dropped".into(),
                        source: None,
                    }),
                ],
            ),
            Some(ProviderFault::Stall) => (Wait::Stall(Arc::clone(&self.faults)), Vec::new()),
            Some(ProviderFault::StallThenTimeout { turns }) => (
                Wait::Turns(turns),
                vec![Err(InferenceExecutionError::Timeout {
                    after: std::time::Duration::from_secs(30),
                    waiting_for: "next stream chunk",
                })],
            ),
        };
        let before = async move {
            match wait {
                Wait::Yield => tokio::task::yield_now().await,
                Wait::Stall(faults) => {
                    faults.stalled.notify_one();
                    std::future::pending::<()>().await;
                }
                Wait::Turns(turns) => {
                    for _ in 0..turns {
                        tokio::task::yield_now().await;
                    }
                }
            }
        };
        Box::pin(
            stream::once(async move {
                before.await;
                stream::iter(events)
            })
            .flatten(),
        )
    }
}
