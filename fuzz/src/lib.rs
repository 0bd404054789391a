//! What the fuzz targets share: arbitrary JSON values, messages and events built from the
//! fuzzer's bytes. Strings and ids come mostly from small pools, so that values repeat (the
//! compact form's back-references) and calls meet again (the event grammar's open calls).

use std::sync::Arc;

use arbitrary::{Arbitrary, Result, Unstructured};
use awaken_event::{
    AgentEvent, ContentBlock, Message, PendingCall, ProfileId, ResumeDecision, ResumeMode, Role,
    RunId, SuspendTicket, TerminationReason, ThreadId, TokenUsage, ToolCall, ToolCallId,
    ToolCallState, ToolResult, ToolResultStatus, WarningKind,
};
use serde_json::{Map, Number, Value};

/// How deep an arbitrary value nests by itself (a [`Json::Deep`] goes further on purpose).
const MAX_JSON_DEPTH: usize = 8;

/// Strings that come back often.
const POOL: &[&str] = &[
    "",
    "a",
    "search",
    "call-1",
    "héllo ✓",
    "{\"q\":1}",
    "sha256:0000000000000000000000000000000000000000000000000000000000000000",
    "a string of some length, longer than the short ones",
];

/// A string: from [`POOL`] or any.
#[derive(Debug, Clone, Arbitrary)]
pub enum Text {
    /// One of [`POOL`].
    Pool(u8),
    /// Any string.
    Any(String),
}

impl Text {
    /// The string.
    pub fn get(&self) -> String {
        match self {
            Text::Pool(i) => POOL[usize::from(*i) % POOL.len()].to_owned(),
            Text::Any(s) => s.clone(),
        }
    }
}

/// An arbitrary JSON value.
#[derive(Debug, Clone)]
pub enum Json {
    /// A value.
    Value(Value),
    /// A value wrapped in this many arrays and objects (past every depth limit).
    Deep(u16, Value),
}

impl Json {
    /// The value.
    pub fn get(&self) -> Value {
        match self {
            Json::Value(v) => v.clone(),
            Json::Deep(n, v) => {
                let mut v = v.clone();
                for i in 0..*n {
                    v = if i % 2 == 0 {
                        Value::Array(vec![v])
                    } else {
                        let mut m = Map::new();
                        m.insert("k".into(), v);
                        Value::Object(m)
                    };
                }
                v
            }
        }
    }
}

impl<'a> Arbitrary<'a> for Json {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        if u.ratio(1, 16)? {
            let n = u.int_in_range(90..=600)?;
            return Ok(Json::Deep(n, value(u, 0)?));
        }
        Ok(Json::Value(value(u, 0)?))
    }
}

/// An arbitrary JSON value, nested at most [`MAX_JSON_DEPTH`] deep below `depth`.
pub fn value(u: &mut Unstructured<'_>, depth: usize) -> Result<Value> {
    let leaf_only = depth >= MAX_JSON_DEPTH;
    let kinds = if leaf_only { 7 } else { 9 };
    Ok(match u.choose_index(kinds)? {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => Value::Number(Number::from(u.arbitrary::<u64>()?)),
        3 => Value::Number(Number::from(u.arbitrary::<i64>()?)),
        4 => Number::from_f64(u.arbitrary()?).map_or(Value::Null, Value::Number),
        5 | 6 => Value::String(u.arbitrary::<Text>()?.get()),
        7 => {
            let n = u.int_in_range(0..=4)?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(value(u, depth + 1)?);
            }
            Value::Array(items)
        }
        _ => {
            let n = u.int_in_range(0..=4)?;
            let mut map = Map::new();
            for _ in 0..n {
                let k = u.arbitrary::<Text>()?.get();
                map.insert(k, value(u, depth + 1)?);
            }
            Value::Object(map)
        }
    })
}

/// Ids that come back often (valid for every id type).
const IDS: &[&str] = &["t1", "r1", "c1", "c2", "c3", "ид-1"];

/// An id: from [`IDS`], or any text that parses (else the first of [`IDS`]).
#[derive(Debug, Clone, Arbitrary)]
pub enum Id {
    /// One of [`IDS`].
    Pool(u8),
    /// Any text.
    Any(String),
}

impl Id {
    fn text(&self) -> &str {
        match self {
            Id::Pool(i) => IDS[usize::from(*i) % IDS.len()],
            Id::Any(s) => s,
        }
    }

    /// As a thread id.
    pub fn thread(&self) -> ThreadId {
        ThreadId::new(self.text()).unwrap_or_else(|_| ThreadId::new(IDS[0]).expect("valid"))
    }

    /// As a run id.
    pub fn run(&self) -> RunId {
        RunId::new(self.text()).unwrap_or_else(|_| RunId::new(IDS[1]).expect("valid"))
    }

    /// As a profile id.
    pub fn profile(&self) -> ProfileId {
        ProfileId::new(self.text()).unwrap_or_else(|_| ProfileId::new(IDS[0]).expect("valid"))
    }

    /// As a tool call id.
    pub fn call(&self) -> ToolCallId {
        ToolCallId::new(self.text()).unwrap_or_else(|_| ToolCallId::new(IDS[2]).expect("valid"))
    }
}

/// Token counts.
#[derive(Debug, Clone, Arbitrary)]
pub struct Usage(pub [Option<u64>; 4]);

impl Usage {
    /// The counts (absent ones zero).
    pub fn get(&self) -> TokenUsage {
        let [input, output, cached, reasoning] = self.0.map(Option::unwrap_or_default);
        TokenUsage {
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: cached,
            reasoning_tokens: reasoning,
        }
    }
}

/// Why a run ended.
#[derive(Debug, Clone, Arbitrary)]
pub enum Termination {
    /// `NaturalEnd`.
    NaturalEnd,
    /// `Stopped`.
    Stopped(Text, Text),
    /// `Suspended`.
    Suspended,
    /// `Cancelled`.
    Cancelled,
    /// `Error`.
    Error(Text),
}

impl Termination {
    /// The reason.
    pub fn get(&self) -> TerminationReason {
        match self {
            Termination::NaturalEnd => TerminationReason::NaturalEnd,
            Termination::Stopped(code, detail) => {
                TerminationReason::stopped(code.get(), detail.get())
            }
            Termination::Suspended => TerminationReason::Suspended,
            Termination::Cancelled => TerminationReason::Cancelled,
            Termination::Error(m) => TerminationReason::error(m.get()),
        }
    }
}

/// A content block.
#[derive(Debug, Clone, Arbitrary)]
pub enum Block {
    /// `Text`.
    Text(Text),
    /// `Reasoning`.
    Reasoning(Text),
    /// `Image`.
    Image(Text, Option<Text>),
    /// `Json`.
    Json(Json),
    /// `Incomplete`.
    Incomplete,
}

/// A tool call in a message.
#[derive(Debug, Clone, Arbitrary)]
pub struct Call {
    /// Its id.
    pub id: Id,
    /// The tool's name.
    pub name: Text,
    /// Its arguments.
    pub arguments: Arguments,
}

/// A tool call's arguments.
#[derive(Debug, Clone, Arbitrary)]
pub enum Arguments {
    /// Parsed JSON.
    Json(Json),
    /// Raw text that was not JSON.
    Raw(Text),
}

/// A message.
#[derive(Debug, Clone, Arbitrary)]
pub struct Msg {
    /// Its role (of four).
    pub role: u8,
    /// Its content.
    pub content: Vec<Block>,
    /// Its tool calls.
    pub calls: Vec<Call>,
    /// The call it answers.
    pub answers: Option<Id>,
}

impl Msg {
    /// The message.
    pub fn get(&self) -> Message {
        let role =
            [Role::System, Role::User, Role::Assistant, Role::Tool][usize::from(self.role % 4)];
        let content: Vec<ContentBlock> = self
            .content
            .iter()
            .map(|b| match b {
                Block::Text(t) => ContentBlock::Text { text: t.get() },
                Block::Reasoning(t) => ContentBlock::Reasoning { text: t.get() },
                Block::Image(url, media) => ContentBlock::Image {
                    url: url.get(),
                    media_type: media.as_ref().map(Text::get),
                },
                Block::Json(v) => ContentBlock::Json {
                    value: Arc::new(v.get()),
                },
                Block::Incomplete => ContentBlock::Incomplete,
            })
            .collect();
        let calls: Vec<ToolCall> = self
            .calls
            .iter()
            .map(|c| match &c.arguments {
                Arguments::Json(v) => ToolCall::new(c.id.call(), c.name.get(), v.get()),
                Arguments::Raw(raw) => {
                    ToolCall::from_raw_arguments(c.id.call(), c.name.get(), &raw.get())
                }
            })
            .collect();
        Message {
            role,
            content: if content.is_empty() {
                awaken_event::no_content()
            } else {
                content.into()
            },
            tool_calls: if calls.is_empty() {
                awaken_event::no_tool_calls()
            } else {
                calls.into()
            },
            tool_call_id: self.answers.as_ref().map(Id::call),
        }
    }
}

/// An event of any kind.
#[derive(Debug, Clone, Arbitrary)]
pub enum Event {
    /// `RunStart`.
    RunStart(Id, Id, Text, Option<Id>, bool),
    /// `RunFinish`.
    RunFinish(Id, Id, Termination, Option<Text>, Usage),
    /// `StepStart`.
    StepStart(u8),
    /// `StepEnd`.
    StepEnd(u8),
    /// `TextDelta`.
    TextDelta(Text),
    /// `ReasoningDelta`.
    ReasoningDelta(Text),
    /// `ToolCallStart`.
    ToolCallStart(Id, Text),
    /// `ToolCallArgsDelta`.
    ToolCallArgsDelta(Id, Text),
    /// `ToolCallReady`.
    ToolCallReady(Id, Text, Json),
    /// `ToolCallDone`.
    ToolCallDone(Id, u8, Json, u8),
    /// `ToolCallSuspended`.
    ToolCallSuspended(Id, Text, Text, Json, Option<Json>, u8),
    /// `ToolCallResumed`.
    ToolCallResumed(Id, bool),
    /// `ToolCallProgress`.
    ToolCallProgress(Id, Json),
    /// `InferenceComplete`.
    InferenceComplete(Text, Usage, u64, u8),
    /// `StateSnapshot`.
    StateSnapshot(u64, Json),
    /// `StateDelta`.
    StateDelta(u64, Json),
    /// `ActionDeadLettered`.
    ActionDeadLettered(Text, Text, Text),
    /// `Warning`.
    Warning(u8, Text),
    /// `Error`.
    Error(Text),
}

impl Event {
    /// The event.
    pub fn get(&self) -> AgentEvent {
        match self {
            Event::RunStart(thread, run, agent, parent, resumed) => AgentEvent::RunStart {
                thread_id: thread.thread(),
                run_id: run.run(),
                agent_id: agent.get().into(),
                parent_run_id: parent.as_ref().map(Id::run),
                resumed: *resumed,
            },
            Event::RunFinish(thread, run, termination, response, usage) => AgentEvent::RunFinish {
                thread_id: thread.thread(),
                run_id: run.run(),
                termination: Box::new(termination.get()),
                response: response.as_ref().map(Text::get),
                usage: Box::new(usage.get()),
            },
            Event::StepStart(step) => AgentEvent::StepStart {
                step: u32::from(*step % 4),
            },
            Event::StepEnd(step) => AgentEvent::StepEnd {
                step: u32::from(*step % 4),
            },
            Event::TextDelta(t) => AgentEvent::TextDelta { delta: t.get() },
            Event::ReasoningDelta(t) => AgentEvent::ReasoningDelta { delta: t.get() },
            Event::ToolCallStart(id, name) => AgentEvent::ToolCallStart {
                call_id: id.call(),
                name: name.get().into(),
            },
            Event::ToolCallArgsDelta(id, t) => AgentEvent::ToolCallArgsDelta {
                call_id: id.call(),
                delta: t.get(),
            },
            Event::ToolCallReady(id, name, args) => AgentEvent::ToolCallReady {
                call_id: id.call(),
                name: name.get().into(),
                arguments: Arc::new(args.get()),
            },
            Event::ToolCallDone(id, status, content, state) => AgentEvent::ToolCallDone {
                call_id: id.call(),
                result: Arc::new(ToolResult {
                    status: [
                        ToolResultStatus::Success,
                        ToolResultStatus::Error,
                        ToolResultStatus::Pending,
                    ][usize::from(*status % 3)],
                    content: Arc::new(content.get()),
                }),
                state: ToolCallState::ALL[usize::from(*state) % ToolCallState::ALL.len()],
            },
            Event::ToolCallSuspended(id, tool, message, args, schema, mode) => {
                AgentEvent::ToolCallSuspended {
                    call_id: id.call(),
                    ticket: Box::new(SuspendTicket {
                        suspension_id: format!("{}:0", id.call()),
                        call: PendingCall {
                            call_id: id.call(),
                            tool_name: tool.get(),
                            arguments: args.get(),
                            argument_digest: POOL[6].to_owned(),
                        },
                        message: message.get(),
                        // `Some(null)` is written as `null`, which reads back as `None`.
                        response_schema: schema.as_ref().map(Json::get).filter(|v| !v.is_null()),
                        resume_mode: [
                            ResumeMode::Replay,
                            ResumeMode::UseDecisionAsResult,
                            ResumeMode::PassDecisionToTool,
                        ][usize::from(*mode % 3)],
                    }),
                }
            }
            Event::ToolCallResumed(id, approve) => AgentEvent::ToolCallResumed {
                call_id: id.call(),
                decision: if *approve {
                    ResumeDecision::Approve
                } else {
                    ResumeDecision::Deny
                },
            },
            Event::ToolCallProgress(id, v) => AgentEvent::ToolCallProgress {
                call_id: id.call(),
                progress: v.get(),
            },
            Event::InferenceComplete(model, usage, ms, stop) => AgentEvent::InferenceComplete {
                model: model.get().into(),
                usage: usage.get(),
                duration_ms: *ms,
                stop_reason: awaken_event::StopReason::ALL
                    [usize::from(*stop) % awaken_event::StopReason::ALL.len()],
            },
            Event::StateSnapshot(revision, v) => AgentEvent::StateSnapshot {
                revision: *revision,
                state: v.get(),
            },
            Event::StateDelta(revision, v) => AgentEvent::StateDelta {
                revision: *revision,
                changes: v.get(),
            },
            Event::ActionDeadLettered(action, phase, reason) => AgentEvent::ActionDeadLettered {
                action: action.get(),
                phase: phase.get(),
                reason: reason.get(),
            },
            Event::Warning(kind, detail) => AgentEvent::Warning {
                kind: [
                    WarningKind::HistoryRepaired,
                    WarningKind::SpecChanged,
                    WarningKind::CompactionFellBack,
                    WarningKind::Resolution,
                    WarningKind::GateConflict,
                    WarningKind::HandlerFailed,
                    WarningKind::Other,
                ][usize::from(*kind % 7)],
                detail: detail.get(),
            },
            Event::Error(m) => AgentEvent::Error { message: m.get() },
        }
    }
}
