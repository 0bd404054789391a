//! A deterministic executor that replays a script of turns: for tests, examples and the
//! `awaken` command's offline default.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use awaken_event::{ContentBlock, Message, Role, StopReason, TokenUsage, ToolCallId};
use awaken_spec::SpecError;
use futures_util::StreamExt;
use futures_util::stream;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;

use crate::error::InferenceExecutionError;
use crate::event::{LlmEventStream, LlmStreamEvent};
use crate::executor::LlmExecutor;
use crate::request::InferenceRequest;

/// A script: the turns a [`ScriptedExecutor`] answers with, one per call, in order.
///
/// In TOML:
///
/// ```toml
/// [[turns]]
/// text = "Let me look that up."
/// [[turns.tool_calls]]
/// name = "search"
/// arguments = { query = "rust" }
///
/// [[turns]]
/// deltas = ["Found ", "it."]
/// usage = { input_tokens = 12, output_tokens = 3 }
/// delay_ms = 50            # a slow model: a pause before each streamed event
///
/// [[turns]]
/// error = { kind = "rate_limited", retry_after_ms = 200 }
///
/// [[turns]]
/// wait_for_cancel = true
///
/// [[turns]]
/// tool_calls = [{ name = "append_file", arguments = { line = "buy milk" } }]
///
/// [[turns]]
/// text = "Added it."
/// [turns.if_refused]       # played instead when the call above failed or was denied
/// text = "I did not add it."
/// ```
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// The turns, in the order they are played.
    #[serde(default)]
    pub turns: Vec<ScriptTurn>,
}

/// One scripted model turn. It plays, in order: `reasoning`, the text (`text` or `deltas`),
/// the tool calls, and then one ending: `error` if set, else waiting for cancellation if
/// `wait_for_cancel`, else `usage` (if set) and the stop. When `if_refused` is set and the
/// request answers a failed or refused tool call, that turn plays instead
/// ([`ScriptTurn::for_request`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptTurn {
    /// Reasoning text, streamed as one delta.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The answer's text, streamed as one delta. Exclusive with `deltas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The answer's text, streamed as these deltas. Exclusive with `text`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deltas: Vec<String>,
    /// Tool calls the model makes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ScriptToolCall>,
    /// Usage reported before the stop (none when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<TokenUsage>,
    /// The stop reason (default: `tool_calls` when the turn has tool calls, else `end_turn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopReason>,
    /// Fail the call with this error after the events above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ScriptedError>,
    /// After the events above, stay pending until the stream is dropped (the runtime's
    /// cancellation) or [`ScriptedExecutor::cancel_waiting`] is called (then the stream yields
    /// [`InferenceExecutionError::Cancelled`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wait_for_cancel: bool,
    /// A pause, in milliseconds, before each streamed event of the turn (a slow model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// The turn played instead of this one when the request answers a tool call that failed
    /// or was refused (denied by a human, blocked by a gate, ...). TOML: a `[turns.if_refused]`
    /// table under the turn, or `if_refused = { text = "..." }`. It cannot have an
    /// `if_refused` of its own.
    ///
    /// The signal: the request's messages end with tool results (the tool messages after the
    /// last other message) and at least one of them is an error. A tool message does not carry
    /// its result's status, so an error is recognised by the form `Message::tool` gives an
    /// error result: a single text block starting with `error: `, or a single JSON block
    /// `{"error": ...}`. A successful result of exactly that form counts as an error too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_refused: Option<Box<ScriptTurn>>,
}

impl ScriptTurn {
    /// A turn answering `text` in one delta.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            ..Self::default()
        }
    }

    /// A turn answering with these text deltas.
    pub fn deltas<I, S>(deltas: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            deltas: deltas.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// A turn making one tool call with JSON `arguments`.
    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Self {
        Self::default().with_tool_call(ScriptToolCall::new(name, arguments))
    }

    /// A turn failing with `error`.
    pub fn error(error: ScriptedError) -> Self {
        Self {
            error: Some(error),
            ..Self::default()
        }
    }

    /// A turn that waits until it is cancelled.
    pub fn wait_for_cancel() -> Self {
        Self {
            wait_for_cancel: true,
            ..Self::default()
        }
    }

    /// Adds a tool call.
    pub fn with_tool_call(mut self, call: ScriptToolCall) -> Self {
        self.tool_calls.push(call);
        self
    }

    /// Sets the reasoning text.
    pub fn with_reasoning(mut self, text: impl Into<String>) -> Self {
        self.reasoning = Some(text.into());
        self
    }

    /// Sets the usage.
    pub fn with_usage(mut self, usage: TokenUsage) -> Self {
        self.usage = Some(usage);
        self
    }

    /// Sets the stop reason.
    pub fn with_stop(mut self, stop: StopReason) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Ends the turn with `error` (after its other events).
    pub fn with_error(mut self, error: ScriptedError) -> Self {
        self.error = Some(error);
        self
    }

    /// Sets the turn played instead when the request answers a failed or refused tool call.
    pub fn with_if_refused(mut self, turn: ScriptTurn) -> Self {
        self.if_refused = Some(Box::new(turn));
        self
    }

    /// The turn to play for `request`: [`ScriptTurn::if_refused`] when it is set and the
    /// request ends with tool results of which one is an error (see that field), else this
    /// turn. [`ScriptedExecutor`] applies it to every turn it plays.
    pub fn for_request(&self, request: &InferenceRequest) -> &ScriptTurn {
        match &self.if_refused {
            Some(alternative) if answers_a_refused_call(&request.messages) => alternative,
            _ => self,
        }
    }
}

/// A scripted tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptToolCall {
    /// The call id (default: `call_<turn>_<index>`, turn 1-based, index 0-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The tool name.
    pub name: String,
    /// The JSON arguments (default `{}`). Exclusive with `raw_arguments`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    /// The argument text exactly as the model streams it, which need not be JSON (to test
    /// invalid arguments). Exclusive with `arguments`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_arguments: Option<String>,
}

impl ScriptToolCall {
    /// A call of `name` with JSON `arguments`.
    pub fn new(name: impl Into<String>, arguments: Value) -> Self {
        Self {
            id: None,
            name: name.into(),
            arguments: Some(arguments),
            raw_arguments: None,
        }
    }

    /// Sets the call id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }
}

/// A scripted failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedError {
    /// Which error.
    pub kind: ScriptedErrorKind,
    /// The provider message (default empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Retry-after in milliseconds (`rate_limited` and `overloaded` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl ScriptedError {
    /// An error of `kind` with no message.
    pub fn new(kind: ScriptedErrorKind) -> Self {
        Self {
            kind,
            message: String::new(),
            retry_after_ms: None,
        }
    }

    /// Sets the retry-after.
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after_ms = Some(after.as_millis() as u64);
        self
    }

    /// The executor error this stands for.
    pub fn to_error(&self) -> InferenceExecutionError {
        let message = self.message.clone();
        let retry_after = self.retry_after_ms.map(Duration::from_millis);
        match self.kind {
            ScriptedErrorKind::RateLimited => InferenceExecutionError::RateLimited {
                retry_after,
                message,
            },
            ScriptedErrorKind::Overloaded => InferenceExecutionError::Overloaded {
                status: 503,
                retry_after,
                message,
            },
            ScriptedErrorKind::Timeout => InferenceExecutionError::Timeout {
                after: Duration::ZERO,
                waiting_for: "response headers",
            },
            ScriptedErrorKind::StreamInterrupted => InferenceExecutionError::interrupted(message),
            ScriptedErrorKind::ServerError => InferenceExecutionError::ServerError {
                status: Some(500),
                message,
            },
            ScriptedErrorKind::InvalidRequest => InferenceExecutionError::InvalidRequest {
                status: Some(400),
                message,
            },
            ScriptedErrorKind::Unauthorized => InferenceExecutionError::Unauthorized {
                status: 401,
                message,
            },
            ScriptedErrorKind::ModelNotFound => InferenceExecutionError::ModelNotFound {
                model: String::new(),
                message,
            },
            ScriptedErrorKind::ContextOverflow => {
                InferenceExecutionError::ContextOverflow { message }
            }
            ScriptedErrorKind::ContentFiltered => {
                InferenceExecutionError::ContentFiltered { message }
            }
            ScriptedErrorKind::Cancelled => InferenceExecutionError::Cancelled,
        }
    }
}

/// The kinds of [`ScriptedError`], named like the [`InferenceExecutionError`] variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ScriptedErrorKind {
    /// Retryable: rate limited.
    RateLimited,
    /// Retryable: overloaded (HTTP 503).
    Overloaded,
    /// Retryable: timeout.
    Timeout,
    /// Retryable: interrupted stream.
    StreamInterrupted,
    /// Retryable: server error (HTTP 500).
    ServerError,
    /// Permanent: invalid request.
    InvalidRequest,
    /// Permanent: unauthorized.
    Unauthorized,
    /// Permanent: model not found.
    ModelNotFound,
    /// Permanent: context overflow.
    ContextOverflow,
    /// Permanent: content filtered.
    ContentFiltered,
    /// Cancelled.
    Cancelled,
}

/// A script that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// The file could not be read.
    #[error("cannot read script {path}: {source}", path = .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The file's extension is neither `.json` nor `.toml`.
    #[error("script {path} must end in .json or .toml", path = .path.display())]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },
    /// The text did not parse (the source names line and column).
    #[error("invalid script{}: {source}", .path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Parse {
        /// The file, when loaded from one.
        path: Option<PathBuf>,
        /// The parse error (boxed: it is large).
        #[source]
        source: Box<SpecError>,
    },
    /// A turn is inconsistent.
    #[error("script turn {turn}: {reason}")]
    Invalid {
        /// The turn, 1-based.
        turn: usize,
        /// What is wrong.
        reason: String,
    },
}

impl Script {
    /// A script of these turns.
    pub fn new(turns: impl IntoIterator<Item = ScriptTurn>) -> Self {
        Self {
            turns: turns.into_iter().collect(),
        }
    }

    /// Parses and validates a JSON script.
    pub fn from_json_str(text: &str) -> Result<Self, ScriptError> {
        let script: Script =
            awaken_spec::parse_json(text).map_err(|source| ScriptError::Parse {
                path: None,
                source: Box::new(source),
            })?;
        script.validate()?;
        Ok(script)
    }

    /// Parses and validates a TOML script.
    pub fn from_toml_str(text: &str) -> Result<Self, ScriptError> {
        let script: Script =
            awaken_spec::parse_toml(text).map_err(|source| ScriptError::Parse {
                path: None,
                source: Box::new(source),
            })?;
        script.validate()?;
        Ok(script)
    }

    /// Reads a `.json` or `.toml` script file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ScriptError> {
        let path = path.as_ref();
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let parse: fn(&str) -> Result<Script, ScriptError> = match ext.as_deref() {
            Some("json") => Self::from_json_str,
            Some("toml") => Self::from_toml_str,
            _ => {
                return Err(ScriptError::UnknownFormat {
                    path: path.to_owned(),
                });
            }
        };
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Io {
            path: path.to_owned(),
            source,
        })?;
        parse(&text).map_err(|e| match e {
            ScriptError::Parse { source, .. } => ScriptError::Parse {
                path: Some(path.to_owned()),
                source,
            },
            other => other,
        })
    }

    /// Checks every turn (and its `if_refused` turn, which cannot have one of its own):
    /// `text` and `deltas` exclusive, `error` and `wait_for_cancel` exclusive, tool calls with
    /// a non-empty name, a valid id and at most one of `arguments` / `raw_arguments`.
    pub fn validate(&self) -> Result<(), ScriptError> {
        for (i, turn) in self.turns.iter().enumerate() {
            let bad = |reason: String| ScriptError::Invalid {
                turn: i + 1,
                reason,
            };
            check_turn(turn).map_err(bad)?;
            if let Some(alternative) = &turn.if_refused {
                if alternative.if_refused.is_some() {
                    return Err(bad(
                        "`if_refused` cannot have an `if_refused` of its own".into()
                    ));
                }
                check_turn(alternative).map_err(|reason| bad(format!("if_refused: {reason}")))?;
            }
        }
        Ok(())
    }
}

/// What is wrong with one turn, its `if_refused` aside.
fn check_turn(turn: &ScriptTurn) -> Result<(), String> {
    if turn.text.is_some() && !turn.deltas.is_empty() {
        return Err("set either `text` or `deltas`, not both".into());
    }
    if turn.error.is_some() && turn.wait_for_cancel {
        return Err("set either `error` or `wait_for_cancel`, not both".into());
    }
    for (j, call) in turn.tool_calls.iter().enumerate() {
        if call.name.trim().is_empty() {
            return Err(format!("tool_calls[{j}].name must not be empty"));
        }
        if call.arguments.is_some() && call.raw_arguments.is_some() {
            return Err(format!(
                "tool_calls[{j}]: set either `arguments` or `raw_arguments`, not both"
            ));
        }
        if let Some(id) = &call.id {
            ToolCallId::new(id).map_err(|e| format!("tool_calls[{j}].id: {e}"))?;
        }
    }
    Ok(())
}

/// Whether `messages` end with tool results of which at least one is an error.
fn answers_a_refused_call(messages: &[Message]) -> bool {
    messages
        .iter()
        .rev()
        .take_while(|m| m.role == Role::Tool)
        .any(is_error_result)
}

/// Whether a tool message has the form `Message::tool` gives an error result.
pub(crate) fn is_error_result(message: &Message) -> bool {
    match &message.content[..] {
        [ContentBlock::Text { text }] => text.starts_with("error: "),
        [ContentBlock::Json { value }] => value
            .as_object()
            .is_some_and(|o| o.len() == 1 && o.contains_key("error")),
        _ => false,
    }
}

enum Ending {
    Stop,
    Error(InferenceExecutionError),
    Wait,
}

/// Turns a validated turn into its events and ending.
fn play(turn: &ScriptTurn, turn_number: usize) -> (Vec<LlmStreamEvent>, Ending) {
    let mut events = Vec::new();
    if let Some(r) = &turn.reasoning {
        events.push(LlmStreamEvent::ReasoningDelta(r.clone()));
    }
    if let Some(t) = &turn.text {
        events.push(LlmStreamEvent::TextDelta(t.clone()));
    }
    events.extend(turn.deltas.iter().cloned().map(LlmStreamEvent::TextDelta));
    for (index, call) in turn.tool_calls.iter().enumerate() {
        let raw_id = call
            .id
            .clone()
            .unwrap_or_else(|| format!("call_{turn_number}_{index}"));
        // Validated ids parse; a generated one always does. Fall back defensively anyway.
        let id = match ToolCallId::new(&raw_id) {
            Ok(id) => id,
            Err(e) => {
                let err = InferenceExecutionError::malformed(e.to_string(), &raw_id, None);
                return (events, Ending::Error(err));
            }
        };
        let index = index as u32;
        events.push(LlmStreamEvent::ToolCallStart {
            index,
            id,
            name: call.name.clone(),
        });
        let args = match (&call.raw_arguments, &call.arguments) {
            (Some(raw), _) => raw.clone(),
            (None, Some(v)) => v.to_string(),
            (None, None) => "{}".to_owned(),
        };
        events.push(LlmStreamEvent::ToolCallArgsDelta { index, delta: args });
    }
    if let Some(e) = &turn.error {
        return (events, Ending::Error(e.to_error()));
    }
    if turn.wait_for_cancel {
        return (events, Ending::Wait);
    }
    if let Some(u) = turn.usage {
        events.push(LlmStreamEvent::Usage(u));
    }
    let stop = turn.stop.unwrap_or(if turn.tool_calls.is_empty() {
        StopReason::EndTurn
    } else {
        StopReason::ToolCalls
    });
    events.push(LlmStreamEvent::Stop(stop));
    (events, Ending::Stop)
}

#[derive(Debug, Default)]
struct ScriptState {
    turns: Vec<ScriptTurn>,
    next: usize,
    requests: Vec<InferenceRequest>,
}

/// Replays a [`Script`], one turn per call, deterministically.
///
/// A call takes the next turn when its stream is first polled (its `if_refused` turn instead
/// when the request answers a failed or refused tool call, see [`ScriptTurn::for_request`]),
/// and records its request ([`ScriptedExecutor::requests`]). A call after the last turn fails with
/// [`InferenceExecutionError::ScriptExhausted`] (and is recorded too).
///
/// Cancellation of a `wait_for_cancel` turn: dropping its stream ends it (counted by
/// [`ScriptedExecutor::dropped_waits`]); [`ScriptedExecutor::cancel_waiting`] makes every
/// waiting stream yield [`InferenceExecutionError::Cancelled`] instead.
///
/// Clones share the script position, the recorded requests and the counters, so a test can
/// keep a clone while the runtime owns another.
#[derive(Debug, Clone)]
pub struct ScriptedExecutor {
    name: String,
    state: Arc<Mutex<ScriptState>>,
    cancel: Arc<watch::Sender<u64>>,
    dropped_waits: Arc<AtomicUsize>,
}

impl ScriptedExecutor {
    /// An executor replaying `script`, after validating it.
    pub fn new(script: Script) -> Result<Self, ScriptError> {
        script.validate()?;
        Ok(Self {
            name: "scripted".to_owned(),
            state: Arc::new(Mutex::new(ScriptState {
                turns: script.turns,
                next: 0,
                requests: Vec::new(),
            })),
            cancel: Arc::new(watch::Sender::new(0)),
            dropped_waits: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// An executor replaying these turns.
    pub fn from_turns(turns: impl IntoIterator<Item = ScriptTurn>) -> Result<Self, ScriptError> {
        Self::new(Script::new(turns))
    }

    /// An executor replaying the `.json` or `.toml` script at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ScriptError> {
        Self::new(Script::load(path)?)
    }

    /// Sets the name `name()` returns (default `"scripted"`).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    fn lock(&self) -> MutexGuard<'_, ScriptState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The requests received so far, in order (cheap clones: histories are shared).
    pub fn requests(&self) -> Vec<InferenceRequest> {
        self.lock().requests.clone()
    }

    /// How many turns have not been played yet.
    pub fn remaining(&self) -> usize {
        let state = self.lock();
        state.turns.len().saturating_sub(state.next)
    }

    /// Makes every stream created so far that waits (or will wait) in a `wait_for_cancel`
    /// turn yield [`InferenceExecutionError::Cancelled`].
    pub fn cancel_waiting(&self) {
        self.cancel.send_modify(|generation| *generation += 1);
    }

    /// How many `wait_for_cancel` turns ended because their stream was dropped.
    pub fn dropped_waits(&self) -> usize {
        self.dropped_waits.load(Ordering::SeqCst)
    }
}

struct WaitGuard {
    dropped: Arc<AtomicUsize>,
    armed: bool,
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if self.armed {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl LlmExecutor for ScriptedExecutor {
    fn name(&self) -> &str {
        &self.name
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let this = self.clone();
        let mut cancel = self.cancel.subscribe();
        cancel.borrow_and_update();
        let start = async move {
            let played = {
                let mut state = this.lock();
                let n = state.next;
                let played = state.turns.get(n).map(|turn| {
                    let turn = turn.for_request(&request);
                    (play(turn, n + 1), turn.delay_ms)
                });
                if played.is_some() {
                    state.next += 1;
                }
                state.requests.push(request);
                played
            };
            let Some(((events, ending), delay)) = played else {
                let turns = this.lock().turns.len();
                return stream::once(async move {
                    Err(InferenceExecutionError::ScriptExhausted { turns })
                })
                .boxed();
            };
            let head = stream::iter(events).then(move |e| async move {
                if let Some(ms) = delay.filter(|&ms| ms > 0) {
                    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                }
                Ok(e)
            });
            match ending {
                Ending::Stop => head.boxed(),
                Ending::Error(e) => head.chain(stream::once(async move { Err(e) })).boxed(),
                Ending::Wait => {
                    let dropped = Arc::clone(&this.dropped_waits);
                    let wait = async move {
                        let mut guard = WaitGuard {
                            dropped,
                            armed: true,
                        };
                        if cancel.changed().await.is_err() {
                            // The executor is gone; nothing can cancel us but a drop.
                            std::future::pending::<()>().await;
                        }
                        guard.armed = false;
                        Err(InferenceExecutionError::Cancelled)
                    };
                    head.chain(stream::once(wait)).boxed()
                }
            }
        };
        stream::once(start).flatten().boxed()
    }
}
