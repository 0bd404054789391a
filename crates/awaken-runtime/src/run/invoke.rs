//! One tool's invocation, borrowed from the run so that several can run at once: its context,
//! timeout, cancellation and progress, the delegate-call lifecycle hooks, and the tool's state
//! change submitted on the state as it is when the tool returns.

use std::sync::Arc;

use awaken_event::{
    CancellationToken, EventSink, SuspendTicket, ToolCall, ToolCallResume, ToolCallState,
    ToolResult,
};
use awaken_phase::{EffectFailure, PhaseEngine, RunIdentity};
use awaken_plugin::{DelegateCall, LifecycleDispatcher, LifecycleEvent, Plugin};
use awaken_resolver::ResolvedTool;
use awaken_state::KeyRegistry;
use awaken_tool::{ToolCallScope, ToolError, ToolOutput};
use tracing::Instrument;

use crate::delegate::child::delegate_call;
use crate::failpoint;
use crate::progress::ProgressQueue;
use crate::run::Run;

/// How a tool's invocation ended.
pub(super) enum Ran {
    /// It ran (successfully or not); `AfterToolExecute` follows.
    Finished(ToolResult, ToolCallState),
    /// The run's cancellation ended it.
    Cancelled(ToolResult),
    /// The tool suspended the call (a delegate whose child run waits for a decision).
    Suspended(SuspendTicket),
    /// How it ended, after effect handlers of its state change failed (reported by the run).
    EffectsFailed(Box<(Ran, Vec<EffectFailure>)>),
}

impl Ran {
    /// The result and state of a call that finished (or was cancelled), effect failures put
    /// aside (report them first); `None` when it suspended.
    pub(super) fn finished(self) -> Option<(ToolResult, ToolCallState)> {
        match self {
            Ran::Finished(result, state) => Some((result, state)),
            Ran::Cancelled(result) => Some((result, ToolCallState::Cancelled)),
            Ran::Suspended(_) => None,
            Ran::EffectsFailed(failed) => failed.0.finished(),
        }
    }
}

impl Run<'_> {
    /// What running a tool needs from the run, borrowed apart from the run itself.
    pub(super) fn invocation(&self) -> Invocation<'_> {
        Invocation {
            identity: &self.identity,
            cancel: &self.cancel,
            keys: self.resolved.env.keys(),
            timeout: self.resolved.spec.tool_timeout.map(|t| t.get()),
            lifecycle: &self.lifecycle,
            plugins: self.resolved.env.plugins(),
            progress: &self.progress,
            tool_scope: &self.tool_scope,
            sink: self.sink,
        }
    }
}

/// What running one tool needs: borrowed from the run so that several can run at once.
pub(super) struct Invocation<'a> {
    identity: &'a Arc<RunIdentity>,
    cancel: &'a CancellationToken,
    keys: &'a KeyRegistry,
    timeout: Option<std::time::Duration>,
    /// For the delegate-call lifecycle hooks of the run's plugins.
    lifecycle: &'a LifecycleDispatcher,
    plugins: &'a [Arc<dyn Plugin>],
    /// Where the call's progress reports wait to be emitted to `sink`.
    progress: &'a Arc<ProgressQueue>,
    /// What the call's context shares with the run's other calls.
    tool_scope: &'a ToolCallScope,
    sink: &'a dyn EventSink,
}

impl Invocation<'_> {
    /// Runs the call's tool (its arguments validated here only for a recovery's re-run:
    /// `prepare_call` checked the others), with the agent's timeout, cancellation and panic
    /// capture, then commits the tool's state change (on the state as it is now).
    ///
    /// What only some calls need is boxed when they need it (the timer of a tool that waits,
    /// a delegate's lifecycle events, a tool's state change): every run's future holds room
    /// for a call's invocation for its whole life, and most calls need none of it.
    /// `checked`: the call's arguments passed `RegisteredTool::check_call` in this activation
    /// (`prepare_call`); otherwise (a recovery's re-run) they are validated here.
    pub(super) async fn run(
        &self,
        tool: &ResolvedTool,
        call: &ToolCall,
        resume: Option<&ToolCallResume>,
        engine: &PhaseEngine,
        checked: bool,
    ) -> Ran {
        // The tool's view of the state: taken before anything is awaited, as the call starts.
        let snapshot = engine.store().snapshot();
        let delegate = delegate_call(self.identity, tool, call);
        if let Some(d) = &delegate {
            Box::pin(
                self.lifecycle
                    .dispatch(self.plugins, LifecycleEvent::DelegateCallStart(d)),
            )
            .await;
        }
        // The call's context, timer and guards live in this block only: what the compiler
        // keeps across the awaits after it is then only the output (see `settle`).
        let (invoked, waits) = {
            let mut tool_ctx = self.tool_scope.context(call.id.clone(), snapshot);
            if let Some(resume) = resume {
                tool_ctx = tool_ctx.with_resume(resume.clone());
            }
            let timeout = self.timeout;
            // Polled only once the tool waits (a tool that answers at once makes no timer).
            let timer = async move {
                match timeout {
                    Some(t) => Box::pin(tokio::time::sleep(t)).await,
                    None => std::future::pending::<()>().await,
                }
            };
            let name = tool.tool.id();
            let span = tracing::info_span!(
                "execute_tool",
                otel.name = %format_args!("execute_tool {name}"),
                gen_ai.operation.name = "execute_tool",
                gen_ai.tool.name = %name,
                gen_ai.tool.call.id = %call.id,
            );
            let invoked = async {
                // Arguments `prepare_call` checked are not validated twice.
                if !checked {
                    tool.tool.validate(&call.arguments)?;
                }
                tool.tool
                    .invoke_checked_with_timeout(&call.arguments, &tool_ctx, self.keys, timer)
                    .await
            }
            .instrument(span);
            let invoked = self
                .progress
                .forward(&call.id, std::pin::pin!(invoked), self.sink)
                .await;
            let waits = delegate.is_some() || invoked.as_ref().is_ok_and(|o| o.command.is_some());
            (invoked, waits)
        };
        failpoint::hit("after_executing", Some(call.id.as_str()));
        if !waits {
            return self.ran(invoked);
        }
        // A delegate's end or a tool's state change is awaited in a box (most calls have
        // neither, and the run's future need not keep the output across those awaits).
        Box::pin(self.settle(invoked, delegate, engine)).await
    }

    /// After a delegate call or a tool that returned a state change: the delegate's end is
    /// dispatched, the change submitted (a rejected change fails the call).
    async fn settle(
        &self,
        mut invoked: Result<ToolOutput, ToolError>,
        delegate: Option<DelegateCall>,
        engine: &PhaseEngine,
    ) -> Ran {
        if let Some(d) = &delegate {
            let event = match &invoked {
                Ok(o) if o.suspend.is_some() => None,
                Ok(o) if !o.result.is_error() => Some(LifecycleEvent::DelegateCallComplete(
                    d,
                    o.result.content.as_str().unwrap_or_default(),
                )),
                Ok(o) => Some(LifecycleEvent::DelegateCallError(
                    d,
                    o.result.content.as_str().unwrap_or("the delegate failed"),
                )),
                Err(_) => Some(LifecycleEvent::DelegateCallError(
                    d,
                    "the delegate call failed",
                )),
            };
            if let Some(event) = event {
                self.lifecycle.dispatch(self.plugins, event).await;
            }
        }
        let command = invoked.as_mut().ok().and_then(|o| o.command.take());
        if let Some(cmd) = command {
            match engine.submit_command(cmd).await {
                Ok(report) if !report.effects.failures.is_empty() => {
                    let ran = self.ran(invoked);
                    return Ran::EffectsFailed(Box::new((ran, report.effects.failures)));
                }
                Ok(_) => {}
                Err(e) => {
                    return Ran::Finished(
                        ToolResult::error(format!("the tool's state change was rejected: {e}")),
                        ToolCallState::Failed,
                    );
                }
            }
        }
        self.ran(invoked)
    }

    /// How the call ended, from the tool's output (its state change already submitted).
    fn ran(&self, invoked: Result<ToolOutput, ToolError>) -> Ran {
        match invoked {
            Ok(ToolOutput {
                suspend: Some(ticket),
                ..
            }) => Ran::Suspended(ticket),
            Ok(output) => {
                let state = if output.result.is_error() {
                    ToolCallState::Failed
                } else {
                    ToolCallState::Succeeded
                };
                Ran::Finished(output.result, state)
            }
            Err(e) if self.cancel.is_cancelled() => Ran::Cancelled(e.to_result()),
            Err(e) => Ran::Finished(e.to_result(), e.closing_state()),
        }
    }
}
