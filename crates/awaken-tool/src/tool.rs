//! The `Tool` trait and what a tool returns.

use async_trait::async_trait;
use awaken_event::{SuspendTicket, ToolDescriptor, ToolResult};
use awaken_state::{KeyRegistry, StateCommand};
use serde_json::Value;

use crate::context::ToolCallContext;
use crate::error::ToolError;
use crate::recovery::ToolRecoveryPolicy;

/// A tool the model can call.
///
/// The runtime registers a tool once (as a [`crate::RegisteredTool`], which compiles its
/// argument schema and checks its recovery policy), and for each call: validates the arguments
/// (invalid ones never reach `execute`), puts them in the tool's canonical form
/// ([`Tool::normalize_arguments`]), runs the gates, commits the call as `Executing`, then
/// calls [`Tool::execute`], checks the returned command against [`Tool::writes`] and commits the
/// result.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// What the model is told: id, name, description, argument schema and effect class. Read
    /// once, at registration.
    fn descriptor(&self) -> ToolDescriptor;

    /// What recovery does with a call of this tool that was executing when the process stopped.
    /// Defaults from the effect class ([`ToolRecoveryPolicy::default_for`]). Declaring
    /// [`ToolRecoveryPolicy::Rerun`] for a `SideEffecting` tool is rejected at registration.
    fn recovery_policy(&self) -> ToolRecoveryPolicy {
        ToolRecoveryPolicy::default_for(self.descriptor().effect)
    }

    /// The `Exclusive` state keys the tool's command may write (default: none). Writing any
    /// other `Exclusive` key fails the call with [`ToolError::UndeclaredStateWrite`];
    /// `Commutative` keys need no declaration. Also used to serialize concurrent calls whose
    /// declared writes overlap.
    fn writes(&self) -> &[&'static str] {
        &[]
    }

    /// The arguments in the tool's canonical form, or `None` when they are in it already (the
    /// default: every form is canonical, and nothing is allocated).
    ///
    /// Called by the runtime for every call, after the arguments passed the schema and before
    /// any gate, and again each time a resumed call passes the gates. The canonical arguments
    /// replace the call's in its batch entry, so the gates (permission rules), a suspension's
    /// ticket and argument digest (what a human approves), `BeforeToolExecute`,
    /// `AfterToolExecute` and [`Tool::execute`] all see them; the history keeps the model's
    /// text. A tool whose argument has several spellings for one thing (a path: `./a`, `a/`,
    /// `b/../a`) returns one, so that a rule on the argument cannot be sidestepped by another
    /// spelling. It must be idempotent (canonical arguments give `None`), keep the arguments
    /// valid against the schema (the runtime checks), and change nothing outside: it may read
    /// what the arguments name (a file system, to resolve symbolic links).
    ///
    /// # Errors
    /// Arguments that have no canonical form (a path that leads out of the tool's directory):
    /// the call is closed `Blocked` with the error, before any gate, and the tool never runs.
    fn normalize_arguments(&self, args: &Value) -> Result<Option<Value>, ToolError> {
        let _ = args;
        Ok(None)
    }

    /// Runs the call with arguments already validated against the schema (and in the form
    /// [`Tool::normalize_arguments`] gives, when the runtime calls it). They are borrowed:
    /// the value parsed once from the model's output, shared by the history, the batch and the
    /// call's events (a tool copies only what it keeps).
    ///
    /// May do IO (that is what tools are for) and should stop early when
    /// `ctx.cancel_token()` fires. An `Err` closes the call with that error, which the model
    /// sees. Pass `ctx.idempotency_key()` to the systems the tool writes to: a call of a
    /// `ReadOnly` or `Idempotent` tool may run again after a crash with the same key.
    async fn execute(&self, args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError>;
}

/// What a successful `execute` returns: the result the model sees and, optionally, a state
/// command committed with it — or a suspension: the call waits for a decision (a delegate
/// whose child run waits for a human hands the child's question up this way).
#[derive(Debug, Clone)]
pub struct ToolOutput {
    /// The result (ignored when `suspend` is set).
    pub result: ToolResult,
    /// State changes to commit with the result.
    pub command: Option<StateCommand>,
    /// Set: the call is not finished; it is suspended with this ticket (`Executing` →
    /// `Suspended`) and the run waits for a decision, which reaches the tool in
    /// `ToolCallContext::resume` when the ticket's resume mode passes it on.
    pub suspend: Option<SuspendTicket>,
}

impl ToolOutput {
    /// An output with this result and no command.
    pub fn new(result: ToolResult) -> Self {
        Self {
            result,
            command: None,
            suspend: None,
        }
    }

    /// The call waits for a decision on `ticket`.
    pub fn suspended(ticket: SuspendTicket) -> Self {
        Self {
            suspend: Some(ticket),
            ..Self::new(ToolResult::success(Value::Null))
        }
    }

    /// A successful result with this content and no command.
    pub fn success(content: Value) -> Self {
        Self::new(ToolResult::success(content))
    }

    /// With a state command.
    pub fn with_command(mut self, command: StateCommand) -> Self {
        self.command = Some(command);
        self
    }
}

impl From<ToolResult> for ToolOutput {
    fn from(result: ToolResult) -> Self {
        Self::new(result)
    }
}

/// Checks that `command` writes no `Exclusive` key outside `declared` (the tool's
/// [`Tool::writes`]). Keys unknown to `registry` count as `Exclusive`. The runtime calls this on
/// every command a tool returns, before committing it.
///
/// # Errors
/// [`ToolError::UndeclaredStateWrite`] naming the first offending key in key-name order.
pub fn check_writes(
    tool_id: &str,
    command: &StateCommand,
    declared: &[&str],
    registry: &KeyRegistry,
) -> Result<(), ToolError> {
    match command
        .exclusive_keys(registry)
        .into_iter()
        .find(|key| !declared.contains(key))
    {
        Some(key) => Err(ToolError::UndeclaredStateWrite {
            tool_id: tool_id.to_owned(),
            key: key.to_owned(),
        }),
        None => Ok(()),
    }
}
