//! Delegation: each `delegates` entry of an agent becomes a tool that runs the delegate agent
//! as a child run — its own thread and run, the parent named in its run record, its run id
//! derived from the call's idempotency key (so a re-run after a crash continues the same child
//! instead of starting another). The child's final answer is the call's result; a child failure
//! is an error result; a child waiting for a human suspends the parent's call with the child's
//! question, and the parent's decision is forwarded to the child; cancelling the parent cancels
//! the child. A remote delegate (an agent with an endpoint) has no local child run: its
//! backend runs the task remotely (see `remote`).
//!
//! Delegation is bounded in depth: a child run is its parent's depth + 1 (a root run is 0,
//! kept in the run's state), and a call that would start a child deeper than the runtime's
//! limit starts none: the model gets an error result saying the limit was reached.

use std::sync::{Arc, OnceLock, Weak};

use async_trait::async_trait;
use awaken_event::{
    EffectClass, NullSink, ResumeMode, SuspendTicket, TerminationReason, ThreadId, ToolCallResume,
    ToolDescriptor, ToolResult,
};
use awaken_resolver::{DelegateToolFactory, ResolvedRunPlan};
use awaken_spec::AgentSpec;
use awaken_store::RunStatus;
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use crate::activation::{self, Start, Unfinished};
use crate::error::RunError;
use crate::inner::RuntimeInner;
use crate::outcome::RunOutcome;
use crate::request::RunActivation;
use crate::resume::Resume;
use crate::runtime::AgentRuntime;
use crate::steering::Steering;

pub(crate) mod child;
pub(crate) mod remote;

pub use child::{DelegationDepthKey, delegate_tool_id};
use child::{child_run_id, child_thread_id};
pub use remote::{RemoteWait, RemoteWaitUpdate, RemoteWaitsKey};

/// How deep below its root run a delegate's child run may be unless the runtime's builder sets
/// another limit (`AgentRuntimeBuilder::with_max_delegation_depth`): a root run, its child, and
/// three more levels. A call from a run at this depth starts no child.
pub const DEFAULT_MAX_DELEGATION_DEPTH: u32 = 4;

/// The runtime's [`DelegateToolFactory`]; bound to its runtime once built.
#[derive(Clone)]
pub(crate) struct DelegateFactory {
    runtime: Arc<OnceLock<Weak<RuntimeInner>>>,
    /// The deepest a child run may be (its root run is at depth 0).
    max_depth: u32,
}

impl DelegateFactory {
    /// A factory whose tools start no child deeper than `max_depth`.
    pub(crate) fn new(max_depth: u32) -> Self {
        Self {
            runtime: Arc::default(),
            max_depth,
        }
    }

    pub(crate) fn bind(&self, inner: &Arc<RuntimeInner>) {
        // Bound once, by the builder that made the factory.
        let _ = self.runtime.set(Arc::downgrade(inner));
    }
}

impl DelegateToolFactory for DelegateFactory {
    fn delegate_tool(
        &self,
        _parent: &AgentSpec,
        delegate: &AgentSpec,
    ) -> Result<Arc<dyn Tool>, String> {
        let description = if delegate.description.is_empty() {
            format!(
                "Hands a task to the agent `{}` and returns its answer.",
                delegate.id
            )
        } else {
            format!(
                "Hands a task to `{}`: {}",
                delegate.id, delegate.description
            )
        };
        Ok(Arc::new(DelegateTool {
            agent_id: delegate.id.clone(),
            descriptor: ToolDescriptor::new(delegate_tool_id(&delegate.id), description)
                .with_parameters(json!({
                    "type": "object",
                    "properties": {"task": {"type": "string", "description": "What the agent should do."}},
                    "required": ["task"],
                    "additionalProperties": false
                }))
                .with_effect(EffectClass::Idempotent),
            runtime: self.runtime.clone(),
            max_depth: self.max_depth,
            remote: delegate.endpoint.is_some(),
        }))
    }
}

/// A delegate agent as a tool.
struct DelegateTool {
    agent_id: String,
    descriptor: ToolDescriptor,
    runtime: Arc<OnceLock<Weak<RuntimeInner>>>,
    /// The deepest a child run may be.
    max_depth: u32,
    /// Whether the delegate is a remote agent (an endpoint run by an execution backend).
    remote: bool,
}

#[async_trait]
impl Tool for DelegateTool {
    fn descriptor(&self) -> ToolDescriptor {
        self.descriptor.clone()
    }

    async fn execute(&self, args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        let rt = self
            .runtime
            .get()
            .and_then(Weak::upgrade)
            .map(AgentRuntime::from_inner)
            .ok_or_else(|| ToolError::Execution {
                message: "the runtime that owns this delegate is gone".into(),
            })?;
        if self.remote {
            return match rt.resolver().plan(&self.agent_id) {
                Ok(ResolvedRunPlan::Backend(remote)) => remote::delegate(&remote, args, ctx).await,
                Ok(ResolvedRunPlan::Local(_)) => Err(ToolError::Execution {
                    message: format!(
                        "no execution backend runs the remote agent `{}`",
                        self.agent_id
                    ),
                }),
                Err(e) => Err(ToolError::Execution {
                    message: format!("the remote agent `{}` cannot be run: {e}", self.agent_id),
                }),
            };
        }
        let run_id = child_run_id(ctx.idempotency_key().as_str())?;
        let thread_id = child_thread_id(ctx.thread_id(), ctx.call_id(), &run_id)?;
        let existing = rt
            .store()
            .latest_run(&thread_id)
            .await
            .map_err(|e| ToolError::Execution {
                message: format!("the child thread could not be read: {e}"),
            })?
            .filter(|r| r.run_id == run_id);
        let cancel = ctx.cancel_token().clone();
        let outcome = match existing {
            // The first attempt: a new child run, one level below this run, unless that is
            // past the limit (a child started before the limit was lowered still goes on).
            None => {
                let depth = run_depth(ctx)?;
                if depth >= self.max_depth {
                    return Ok(ToolOutput::new(ToolResult::error(format!(
                        "delegation depth limit {} reached: this run is at depth {depth} (its \
                         root run is at depth 0), so `{}` was not started; do the task without \
                         delegating",
                        self.max_depth, self.agent_id
                    ))));
                }
                let task = args["task"].as_str().unwrap_or_default().to_owned();
                let mut activation = RunActivation::new(thread_id.clone(), self.agent_id.clone())
                    .with_user_message(task);
                activation.run_id = Some(run_id.clone());
                activation.parent_run_id = Some(ctx.run_id().clone());
                activation.delegation_depth = depth + 1;
                activation.cancel = cancel;
                rt.run(activation, &NullSink).await
            }
            // A re-run after a crash: the child finished; its answer stands.
            Some(record) if record.status == RunStatus::Done => Ok(RunOutcome {
                run_id: record.run_id.clone(),
                termination: record
                    .termination
                    .clone()
                    .unwrap_or(TerminationReason::NaturalEnd),
                response: last_answer(&rt, &thread_id).await,
                steps: 0,
                usage: record.usage,
            }),
            // A re-run after a crash: the child was interrupted; it continues.
            Some(record) if record.status == RunStatus::Running => {
                let unfinished = Unfinished {
                    thread_id: thread_id.clone(),
                    run_id: record.run_id.clone(),
                    lease: None,
                };
                activation::activate(
                    rt.inner(),
                    Start::Recover(unfinished, cancel, Steering::new()),
                    &NullSink,
                )
                .await
            }
            // The child waits for a human: forward the parent's decision, or ask again.
            Some(_) => match ctx.resume() {
                Some(decision) => {
                    let waiting = rt.waiting_calls(&thread_id).await.map_err(execution)?;
                    let Some(ticket) = waiting
                        .iter()
                        .find(|t| t.call.argument_digest == decision.argument_digest)
                    else {
                        // The decision was on a question the child no longer asks: ask anew.
                        let Some(current) = waiting.into_iter().next() else {
                            return Err(ToolError::Execution {
                                message: "the child run waits on no call".into(),
                            });
                        };
                        return Ok(ToolOutput::suspended(parent_ticket(
                            ctx,
                            &self.agent_id,
                            current,
                        )));
                    };
                    let forwarded = ToolCallResume {
                        call_id: ticket.call.call_id.clone(),
                        argument_digest: ticket.call.argument_digest.clone(),
                        decision: decision.decision,
                        payload: decision.payload.clone(),
                    };
                    let mut resume = Resume::new(thread_id.clone()).with_decision(forwarded);
                    resume.cancel = cancel;
                    rt.resume(resume, &NullSink).await
                }
                None => Ok(RunOutcome {
                    run_id: run_id.clone(),
                    termination: TerminationReason::Suspended,
                    response: None,
                    steps: 0,
                    usage: Default::default(),
                }),
            },
        };
        let outcome = match outcome {
            // The child ended but its end was not written: its answer is still its answer, and
            // its record stays unfinished (recovery leaves child runs to their parent's call).
            Err(RunError::EndNotWritten {
                outcome, source, ..
            }) => {
                tracing::warn!(run_id = %outcome.run_id, error = %source, "a child run's end was not written");
                *outcome
            }
            other => other.map_err(execution)?,
        };
        match outcome.termination {
            TerminationReason::Suspended => {
                let waiting = rt.waiting_calls(&thread_id).await.map_err(execution)?;
                let Some(child) = waiting.into_iter().next() else {
                    return Err(ToolError::Execution {
                        message: "the child run is suspended but waits on no call".into(),
                    });
                };
                Ok(ToolOutput::suspended(parent_ticket(
                    ctx,
                    &self.agent_id,
                    child,
                )))
            }
            TerminationReason::Cancelled => Err(ToolError::Cancelled {
                tool_id: self.descriptor.id.clone(),
            }),
            TerminationReason::Error { message } => Ok(ToolOutput::new(ToolResult::error(
                format!("the delegate `{}` failed: {message}", self.agent_id),
            ))),
            _ => Ok(ToolOutput::success(json!({
                "agent": self.agent_id,
                "answer": outcome.response.unwrap_or_default(),
            }))),
        }
    }
}

/// How many delegations below its root run the calling run is.
fn run_depth(ctx: &ToolCallContext) -> Result<u32, ToolError> {
    ctx.snapshot()
        .get::<DelegationDepthKey>()
        .copied()
        .map_err(|e| ToolError::Execution {
            message: format!("the run's delegation depth could not be read: {e}"),
        })
}

fn execution(e: RunError) -> ToolError {
    ToolError::Execution {
        message: format!("the child run could not go on: {e}"),
    }
}

/// The parent call's ticket for a child's question: the child's call as shown (so the human
/// sees what they decide on), under the parent call's id; the decision goes to the tool, which
/// forwards it (an approval or a denial) to the child.
fn parent_ticket(ctx: &ToolCallContext, agent: &str, child: SuspendTicket) -> SuspendTicket {
    let mut call = child.call;
    call.call_id = ctx.call_id().clone();
    SuspendTicket {
        suspension_id: format!("delegate-{}", child.suspension_id),
        call,
        message: format!("[{agent}] {}", child.message),
        response_schema: child.response_schema,
        resume_mode: ResumeMode::PassDecisionToTool,
    }
}

/// The child thread's last assistant text.
async fn last_answer(rt: &AgentRuntime, thread: &ThreadId) -> Option<String> {
    let history = rt.history(thread).await.ok()?;
    history
        .iter()
        .rev()
        .find(|m| m.role == awaken_event::Role::Assistant)
        .map(awaken_event::Message::text)
        .filter(|t| !t.is_empty())
}
