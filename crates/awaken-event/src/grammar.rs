//! The event grammar: what a well-formed activation looks like, checked event by event.
//!
//! Per activation: `RunStart` first; exactly one `RunFinish`, last; `StepStart`/`StepEnd`
//! balanced, numbered alike, never nested; deltas, tool-call events and inference results only
//! inside a step, a steered message (`MessageAdded`) only between steps, for the step that
//! starts next; every call opened by `ToolCallStart` (or re-opened by `ToolCallResumed`) is
//! closed by `ToolCallDone` or `ToolCallSuspended` before its step ends. Across activations of
//! one stream, a `ToolCallResumed` must name a call that an earlier activation suspended.

use std::collections::{HashMap, HashSet};

use crate::event::AgentEvent;
use crate::ids::ToolCallId;

/// What rule an event broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ViolationKind {
    /// An event came before the activation's `RunStart`.
    #[error("event before run_start")]
    BeforeRunStart,
    /// A second `RunStart` inside one activation.
    #[error("run_start inside an activation that has not finished")]
    NestedRunStart,
    /// An event came after the activation's `RunFinish`.
    #[error("event after run_finish")]
    AfterRunFinish,
    /// The events ended without a `RunFinish`.
    #[error("activation ended without run_finish")]
    MissingRunFinish,
    /// `RunFinish` while a step was open.
    #[error("run_finish while step {step} is open")]
    FinishInsideStep {
        /// The open step.
        step: u32,
    },
    /// `StepStart` while a step was open.
    #[error("step_start {step} while step {open} is open")]
    NestedStep {
        /// The step being started.
        step: u32,
        /// The step already open.
        open: u32,
    },
    /// `StepEnd` with no open step.
    #[error("step_end {step} with no open step")]
    StepEndWithoutStart {
        /// The step number.
        step: u32,
    },
    /// `StepEnd` numbered differently from the open step.
    #[error("step_end {step} closes step {open}")]
    StepMismatch {
        /// The number on `StepEnd`.
        step: u32,
        /// The open step.
        open: u32,
    },
    /// An event that belongs inside a step came outside one.
    #[error("{event} outside a step")]
    OutsideStep {
        /// The event's type.
        event: &'static str,
    },
    /// An event that belongs between steps came inside one.
    #[error("{event} inside step {step}")]
    InsideStep {
        /// The event's type.
        event: &'static str,
        /// The open step.
        step: u32,
    },
    /// A `MessageAdded` named another step than the one that started next.
    #[error("message_added for step {added}, but step {step} came next")]
    AddedForAnotherStep {
        /// The step the message was added for.
        added: u32,
        /// The step that came next (or that another message was added for).
        step: u32,
    },
    /// A step ended with tool calls neither done nor suspended.
    #[error("step {step} ended with unclosed tool calls: {calls:?}")]
    UnclosedToolCalls {
        /// The step.
        step: u32,
        /// The open calls.
        calls: Vec<String>,
    },
    /// A tool-call event named a call that is not open.
    #[error("{event} for tool call {call_id} which is not open")]
    CallNotOpen {
        /// The event's type.
        event: &'static str,
        /// The call.
        call_id: String,
    },
    /// A call was started (or resumed) twice in one activation, or while open.
    #[error("tool call {call_id} opened twice")]
    CallReopened {
        /// The call.
        call_id: String,
    },
    /// `ToolCallArgsDelta` for a call that was resumed rather than started.
    #[error("tool_call_args_delta for resumed call {call_id}")]
    ArgsForResumedCall {
        /// The call.
        call_id: String,
    },
    /// `ToolCallResumed` for a call no earlier activation suspended.
    #[error("tool_call_resumed for {call_id}, which no earlier activation suspended")]
    ResumedUnknownCall {
        /// The call.
        call_id: String,
    },
}

/// An event that broke the grammar, with its position in the checked sequence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event #{index} ({event}): {kind}")]
pub struct GrammarViolation {
    /// Index of the offending event (for `MissingRunFinish`, the number of events seen).
    pub index: usize,
    /// The offending event's type (`end` for a missing finish).
    pub event: &'static str,
    /// The rule broken.
    pub kind: ViolationKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opened {
    Started,
    Resumed,
}

/// Checks a stream of events incrementally. Feed events with [`GrammarChecker::push`] and call
/// [`GrammarChecker::finish`] at the end of the stream.
#[derive(Debug, Default)]
pub struct GrammarChecker {
    index: usize,
    in_activation: bool,
    finished_once: bool,
    step: Option<u32>,
    /// The step the messages added since the last step are for.
    added_for: Option<u32>,
    open_calls: HashMap<ToolCallId, Opened>,
    seen_calls: HashSet<ToolCallId>,
    suspended: HashSet<ToolCallId>,
    strict_resume: bool,
}

impl GrammarChecker {
    /// A checker for a stream of any number of activations, in which a resumed call must have
    /// been suspended by an earlier activation of the same stream.
    pub fn new() -> Self {
        Self {
            strict_resume: true,
            ..Self::default()
        }
    }

    /// A checker for activations whose earlier history it has not seen (a resume in another
    /// process): `ToolCallResumed` may name any call that is not open.
    pub fn without_history() -> Self {
        Self {
            strict_resume: false,
            ..Self::default()
        }
    }

    fn violation(&self, event: &'static str, kind: ViolationKind) -> GrammarViolation {
        GrammarViolation {
            index: self.index,
            event,
            kind,
        }
    }

    fn require_step(&self, name: &'static str) -> Result<(), GrammarViolation> {
        if self.step.is_none() {
            return Err(self.violation(name, ViolationKind::OutsideStep { event: name }));
        }
        Ok(())
    }

    fn require_open(
        &self,
        name: &'static str,
        id: &ToolCallId,
    ) -> Result<Opened, GrammarViolation> {
        self.require_step(name)?;
        self.open_calls.get(id).copied().ok_or_else(|| {
            self.violation(
                name,
                ViolationKind::CallNotOpen {
                    event: name,
                    call_id: id.to_string(),
                },
            )
        })
    }

    fn open(
        &mut self,
        name: &'static str,
        id: &ToolCallId,
        how: Opened,
    ) -> Result<(), GrammarViolation> {
        self.require_step(name)?;
        if self.open_calls.contains_key(id) || self.seen_calls.contains(id) {
            return Err(self.violation(
                name,
                ViolationKind::CallReopened {
                    call_id: id.to_string(),
                },
            ));
        }
        self.open_calls.insert(id.clone(), how);
        self.seen_calls.insert(id.clone());
        Ok(())
    }

    /// Checks the next event.
    pub fn push(&mut self, event: &AgentEvent) -> Result<(), GrammarViolation> {
        let name = event.type_name();
        let result = self.push_inner(name, event);
        self.index += 1;
        result
    }

    fn push_inner(
        &mut self,
        name: &'static str,
        event: &AgentEvent,
    ) -> Result<(), GrammarViolation> {
        let is_start = matches!(event, AgentEvent::RunStart { .. });
        if !is_start && !self.in_activation {
            let kind = if self.finished_once {
                ViolationKind::AfterRunFinish
            } else {
                ViolationKind::BeforeRunStart
            };
            return Err(self.violation(name, kind));
        }
        match event {
            AgentEvent::RunStart { .. } => {
                if self.in_activation {
                    return Err(self.violation(name, ViolationKind::NestedRunStart));
                }
                self.in_activation = true;
                self.step = None;
                self.added_for = None;
                self.open_calls.clear();
                self.seen_calls.clear();
            }
            AgentEvent::RunFinish { .. } => {
                if let Some(step) = self.step {
                    return Err(self.violation(name, ViolationKind::FinishInsideStep { step }));
                }
                self.in_activation = false;
                self.finished_once = true;
                // A run may end right after a message was added (its step never starts).
                self.added_for = None;
            }
            AgentEvent::StepStart { step } => {
                if let Some(open) = self.step {
                    return Err(
                        self.violation(name, ViolationKind::NestedStep { step: *step, open })
                    );
                }
                if let Some(added) = self.added_for.take()
                    && added != *step
                {
                    return Err(self.violation(
                        name,
                        ViolationKind::AddedForAnotherStep { added, step: *step },
                    ));
                }
                self.step = Some(*step);
            }
            AgentEvent::StepEnd { step } => {
                let Some(open) = self.step else {
                    return Err(
                        self.violation(name, ViolationKind::StepEndWithoutStart { step: *step })
                    );
                };
                if open != *step {
                    return Err(
                        self.violation(name, ViolationKind::StepMismatch { step: *step, open })
                    );
                }
                if !self.open_calls.is_empty() {
                    let mut calls: Vec<String> =
                        self.open_calls.keys().map(ToString::to_string).collect();
                    calls.sort();
                    return Err(self
                        .violation(name, ViolationKind::UnclosedToolCalls { step: open, calls }));
                }
                self.step = None;
            }
            AgentEvent::TextDelta { .. }
            | AgentEvent::ReasoningDelta { .. }
            | AgentEvent::InferenceComplete { .. } => self.require_step(name)?,
            AgentEvent::ToolCallStart { call_id, .. } => {
                self.open(name, call_id, Opened::Started)?
            }
            AgentEvent::ToolCallResumed { call_id, .. } => {
                if self.strict_resume && !self.suspended.contains(call_id) {
                    self.require_step(name)?;
                    return Err(self.violation(
                        name,
                        ViolationKind::ResumedUnknownCall {
                            call_id: call_id.to_string(),
                        },
                    ));
                }
                self.open(name, call_id, Opened::Resumed)?;
                self.suspended.remove(call_id);
            }
            AgentEvent::ToolCallArgsDelta { call_id, .. } => {
                if self.require_open(name, call_id)? == Opened::Resumed {
                    return Err(self.violation(
                        name,
                        ViolationKind::ArgsForResumedCall {
                            call_id: call_id.to_string(),
                        },
                    ));
                }
            }
            AgentEvent::ToolCallReady { call_id, .. }
            | AgentEvent::ToolCallProgress { call_id, .. } => {
                self.require_open(name, call_id)?;
            }
            AgentEvent::ToolCallDone { call_id, .. } => {
                self.require_open(name, call_id)?;
                self.open_calls.remove(call_id);
            }
            AgentEvent::ToolCallSuspended { call_id, .. } => {
                self.require_open(name, call_id)?;
                self.open_calls.remove(call_id);
                self.suspended.insert(call_id.clone());
            }
            AgentEvent::StateSnapshot { .. }
            | AgentEvent::StateDelta { .. }
            | AgentEvent::ActionDeadLettered { .. }
            | AgentEvent::Warning { .. }
            | AgentEvent::Error { .. } => {}
            AgentEvent::MessageAdded { step: added, .. } => {
                if let Some(step) = self.step {
                    return Err(
                        self.violation(name, ViolationKind::InsideStep { event: name, step })
                    );
                }
                if let Some(earlier) = self.added_for
                    && earlier != *added
                {
                    return Err(self.violation(
                        name,
                        ViolationKind::AddedForAnotherStep {
                            added: earlier,
                            step: *added,
                        },
                    ));
                }
                self.added_for = Some(*added);
            }
        }
        Ok(())
    }

    /// Checks that the stream did not stop inside an activation.
    pub fn finish(&self) -> Result<(), GrammarViolation> {
        if self.in_activation {
            return Err(GrammarViolation {
                index: self.index,
                event: "end",
                kind: ViolationKind::MissingRunFinish,
            });
        }
        Ok(())
    }
}

/// Checks a complete stream of one or more activations (see [`GrammarChecker::new`]).
pub fn check_events(events: &[AgentEvent]) -> Result<(), GrammarViolation> {
    let mut checker = GrammarChecker::new();
    for event in events {
        checker.push(event)?;
    }
    checker.finish()
}

/// Checks exactly one activation: like [`check_events`], and also rejects an empty sequence
/// and anything after the first `RunFinish`.
pub fn check_activation(events: &[AgentEvent]) -> Result<(), GrammarViolation> {
    let mut checker = GrammarChecker::without_history();
    if events.is_empty() {
        return Err(GrammarViolation {
            index: 0,
            event: "end",
            kind: ViolationKind::MissingRunFinish,
        });
    }
    for event in events {
        if checker.finished_once {
            return Err(GrammarViolation {
                index: checker.index,
                event: event.type_name(),
                kind: ViolationKind::AfterRunFinish,
            });
        }
        checker.push(event)?;
    }
    checker.finish()
}
