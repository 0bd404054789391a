//! The agent loop: one activation from `RunStart` to `RunFinish` through the phase engine.

use std::collections::HashMap;
use std::sync::Arc;

use awaken_event::{
    AgentEvent, CancellationToken, EventSink, Message, TerminationReason, TokenUsage, ToolCall,
    ToolCallId, ToolCallState, ToolResult, WarningKind,
};
use awaken_llm::{
    InferenceExecutionError, InferenceRequest, LlmStreamEvent, ResponseCollector, with_cancellation,
};
use awaken_phase::{
    Phase, PhaseContext, PhaseEngine, PhaseError, PhaseReport, RunIdentity, ToolPhaseInfo,
};
use awaken_plugin::{
    LifecycleDispatcher, LifecycleEvent, RunLifecycle, TokenCounts, TransformContext,
    apply_transforms,
};
use awaken_resolver::{ResolvedAgent, ResolvedRunPlan};
use awaken_spec::{InferenceOverride, StopConditionSpec};
use awaken_state::{StateCommand, StateStore};
use awaken_tool::{ToolBatch, ToolCallContext, ToolGateHook, ToolInterceptPayload, evaluate_gates};
use futures_util::StreamExt;

use crate::builtins::{
    RunStats, RunStatsKey, StatsUpdate, StepDirectives, StepDirectivesKey, StopRequestKey,
};
use crate::runtime::{AgentRuntime, RunActivation, RunError, RunOutcome};

/// Why a step could not go on.
enum Failure {
    Cancelled,
    Error(String),
}

impl From<PhaseError> for Failure {
    fn from(e: PhaseError) -> Self {
        match e {
            PhaseError::Cancelled { .. } => Failure::Cancelled,
            other => Failure::Error(other.to_string()),
        }
    }
}

impl From<InferenceExecutionError> for Failure {
    fn from(e: InferenceExecutionError) -> Self {
        if e.is_cancelled() {
            Failure::Cancelled
        } else {
            Failure::Error(format!("inference failed: {e}"))
        }
    }
}

enum StepEnd {
    Continue,
    End(TerminationReason),
}

/// How one tool call came out.
enum CallOutcome {
    Closed(ToolResult, ToolCallState),
    Suspended(Box<awaken_event::SuspendTicket>),
}

struct Run<'a> {
    sink: &'a dyn EventSink,
    resolved: ResolvedAgent,
    engine: PhaseEngine,
    identity: Arc<RunIdentity>,
    cancel: CancellationToken,
    history: Vec<Message>,
    run_override: Option<InferenceOverride>,
    gates: Vec<(String, Arc<dyn ToolGateHook>)>,
    lifecycle: LifecycleDispatcher,
    step: u32,
    response: Option<String>,
}

pub(crate) async fn run(
    rt: &AgentRuntime,
    act: RunActivation,
    sink: &dyn EventSink,
) -> Result<RunOutcome, RunError> {
    let resolved = match rt.resolver.plan(&act.agent_id)? {
        ResolvedRunPlan::Local(agent) => *agent,
        ResolvedRunPlan::Backend(b) => {
            return Err(RunError::BackendPlan {
                agent_id: act.agent_id,
                backend: b.backend.id().to_owned(),
            });
        }
    };
    let identity = Arc::new(RunIdentity {
        thread_id: act.thread_id.clone(),
        run_id: rt.ids.next_run_id(),
        agent_id: act.agent_id.clone(),
        profile_id: act.profile_id.clone(),
    });
    let store = Arc::new(StateStore::new(resolved.env.keys().clone()));
    let engine = PhaseEngine::new(store, resolved.env.phase_env().clone());
    let mut history = rt.history(&act.thread_id);
    history.extend(act.messages);
    let gates = resolved
        .env
        .gate_hooks()
        .iter()
        .map(|g| (format!("{}/{}", g.plugin_id, g.name), g.hook.clone()))
        .collect();
    let mut run = Run {
        sink,
        resolved,
        engine,
        identity,
        cancel: act.cancel,
        history,
        run_override: act.inference,
        gates,
        lifecycle: LifecycleDispatcher::default(),
        step: 0,
        response: None,
    };
    let span = tracing::info_span!("run", run_id = %run.identity.run_id, thread_id = %run.identity.thread_id, agent = %run.identity.agent_id);
    let _entered = span.enter();
    sink.emit(&AgentEvent::RunStart {
        thread_id: run.identity.thread_id.clone(),
        run_id: run.identity.run_id.clone(),
        agent_id: run.identity.agent_id.clone(),
        parent_run_id: None,
        resumed: false,
    });
    let lifecycle_run = RunLifecycle {
        run: run.identity.clone(),
        resumed: false,
        parent_run_id: None,
    };
    run.lifecycle
        .dispatch(
            run.resolved.env.plugins(),
            LifecycleEvent::RunStart(&lifecycle_run),
        )
        .await;
    for w in &run.resolved.warnings {
        sink.emit(&AgentEvent::Warning {
            kind: WarningKind::Resolution,
            detail: w.to_string(),
        });
    }
    if run.resolved.spec.parallel_tools {
        sink.emit(&AgentEvent::Warning {
            kind: WarningKind::Other,
            detail: "parallel_tools is not supported by this runtime yet; tool calls run one after another".into(),
        });
    }
    let termination = match run.drive().await {
        Ok(t) => t,
        Err(Failure::Cancelled) => TerminationReason::Cancelled,
        Err(Failure::Error(message)) => TerminationReason::Error { message },
    };
    let termination = run.finish(termination).await;
    match &termination {
        TerminationReason::Cancelled => {
            run.lifecycle
                .dispatch(
                    run.resolved.env.plugins(),
                    LifecycleEvent::RunCancel(&lifecycle_run),
                )
                .await;
        }
        TerminationReason::Error { message } => {
            run.lifecycle
                .dispatch(
                    run.resolved.env.plugins(),
                    LifecycleEvent::RunError(&lifecycle_run, message),
                )
                .await;
        }
        other => {
            run.lifecycle
                .dispatch(
                    run.resolved.env.plugins(),
                    LifecycleEvent::RunComplete(&lifecycle_run, other),
                )
                .await;
        }
    }
    let usage = run.stats().usage;
    rt.threads.lock().unwrap_or_else(|e| e.into_inner()).insert(
        run.identity.thread_id.clone(),
        Arc::new(std::mem::take(&mut run.history)),
    );
    sink.emit(&AgentEvent::RunFinish {
        thread_id: run.identity.thread_id.clone(),
        run_id: run.identity.run_id.clone(),
        termination: termination.clone(),
        response: run.response.clone(),
        usage,
    });
    Ok(RunOutcome {
        run_id: run.identity.run_id.clone(),
        termination,
        response: run.response,
        steps: run.step,
        usage,
    })
}

impl Run<'_> {
    fn ctx(&self, phase: Phase) -> PhaseContext {
        PhaseContext::new(phase, self.engine.store().snapshot(), self.identity.clone())
            .with_sections(Arc::new(self.resolved.spec.sections.clone()))
            .with_messages(Arc::from(self.history.as_slice()))
            .with_step(self.step)
            .with_cancel(self.cancel.clone())
    }

    fn report(&self, report: &PhaseReport) {
        for letter in &report.dead_lettered {
            self.sink.emit(&AgentEvent::ActionDeadLettered {
                action: letter.action.key.clone(),
                phase: letter.action.phase.clone(),
                reason: letter.reason.clone(),
            });
        }
    }

    async fn phase_with(&self, ctx: PhaseContext) -> Result<(), Failure> {
        let report = self.engine.run_phase(&ctx).await?;
        self.report(&report);
        Ok(())
    }

    async fn phase(&self, phase: Phase) -> Result<(), Failure> {
        self.phase_with(self.ctx(phase)).await
    }

    async fn submit(&self, cmd: StateCommand) -> Result<(), Failure> {
        self.engine.submit_command(cmd).await?;
        Ok(())
    }

    fn stats(&self) -> RunStats {
        self.engine
            .store()
            .snapshot()
            .get::<RunStatsKey>()
            .cloned()
            .unwrap_or_default()
    }

    async fn drive(&mut self) -> Result<TerminationReason, Failure> {
        for plugin in self.resolved.env.plugins() {
            let cmd = plugin
                .on_activate(&self.resolved.spec.sections)
                .map_err(|e| Failure::Error(e.to_string()))?;
            if let Some(cmd) = cmd {
                self.submit(cmd).await?;
            }
        }
        self.phase(Phase::RunStart).await?;
        loop {
            self.step += 1;
            let step = self.step;
            self.sink.emit(&AgentEvent::StepStart { step });
            let outcome = self.run_step().await;
            self.sink.emit(&AgentEvent::StepEnd { step });
            match outcome? {
                StepEnd::Continue => {}
                StepEnd::End(t) => return Ok(t),
            }
        }
    }

    fn directives(&self) -> StepDirectives {
        let snapshot = self.engine.store().snapshot();
        match snapshot.get::<StepDirectivesKey>() {
            Ok(d) if d.step == self.step => d.clone(),
            _ => StepDirectives::default(),
        }
    }

    fn request(&self, directives: &StepDirectives) -> InferenceRequest {
        let spec = &self.resolved.spec;
        let tools: Vec<_> = self
            .resolved
            .tools
            .iter()
            .map(|t| t.tool.descriptor())
            .filter(|d| !directives.excluded_tools.contains(&d.id))
            .filter(|d| {
                directives
                    .include_only
                    .as_ref()
                    .is_none_or(|only| only.contains(&d.id))
            })
            .cloned()
            .collect();
        let mut messages = self.history.clone();
        messages.extend(
            directives
                .context_messages
                .iter()
                .map(|t| Message::system(t.clone())),
        );
        let mut overrides = spec.inference.clone();
        if let Some(run) = &self.run_override {
            overrides = overrides.merge(run);
        }
        overrides = overrides.merge(&directives.inference);
        let mut request =
            InferenceRequest::new(self.resolved.model.upstream_model.clone(), messages)
                .with_tools(tools)
                .with_overrides(overrides)
                .with_routing_key(self.identity.thread_id.to_string());
        if !spec.system_prompt.is_empty() {
            request = request.with_system_prompt(spec.system_prompt.clone());
        }
        request
    }

    async fn infer(
        &mut self,
        request: InferenceRequest,
    ) -> Result<awaken_event::InferenceResponse, Failure> {
        let model = request.effective_model().to_owned();
        let started = tokio::time::Instant::now();
        let mut stream = with_cancellation(
            self.resolved.executor.execute_stream(request),
            self.cancel.clone(),
        );
        let mut collector = ResponseCollector::new();
        let mut calls: HashMap<u32, ToolCallId> = HashMap::new();
        let mut failure = None;
        while let Some(item) = stream.next().await {
            let event = match item {
                Ok(e) => e,
                Err(e) => {
                    failure = Some(Failure::from(e));
                    break;
                }
            };
            match &event {
                LlmStreamEvent::TextDelta(delta) if !delta.is_empty() => {
                    self.sink.emit(&AgentEvent::TextDelta {
                        delta: delta.clone(),
                    })
                }
                LlmStreamEvent::ReasoningDelta(delta) if !delta.is_empty() => {
                    self.sink.emit(&AgentEvent::ReasoningDelta {
                        delta: delta.clone(),
                    })
                }
                LlmStreamEvent::ToolCallStart { index, id, name } => {
                    calls.insert(*index, id.clone());
                    self.sink.emit(&AgentEvent::ToolCallStart {
                        call_id: id.clone(),
                        name: name.clone(),
                    });
                }
                LlmStreamEvent::ToolCallArgsDelta { index, delta } => {
                    if let Some(id) = calls.get(index) {
                        self.sink.emit(&AgentEvent::ToolCallArgsDelta {
                            call_id: id.clone(),
                            delta: delta.clone(),
                        });
                    }
                }
                _ => {}
            }
            if let Err(e) = collector.push(event) {
                failure = Some(Failure::from(e));
                break;
            }
        }
        let result = match failure {
            Some(f) => Err(f),
            None => collector.finish().map_err(Failure::from),
        };
        if result.is_err() {
            // Calls the model began but never finished get their closing event.
            let mut started_calls: Vec<(u32, ToolCallId)> = calls.into_iter().collect();
            started_calls.sort_by_key(|(i, _)| *i);
            for (_, call_id) in started_calls {
                self.sink.emit(&AgentEvent::ToolCallDone {
                    call_id,
                    result: ToolResult::error("not executed: the inference failed"),
                    state: ToolCallState::Cancelled,
                });
            }
        }
        let response = result?;
        self.sink.emit(&AgentEvent::InferenceComplete {
            model,
            usage: response.usage,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        });
        Ok(response)
    }

    async fn run_step(&mut self) -> Result<StepEnd, Failure> {
        self.phase(Phase::StepStart).await?;
        self.phase(Phase::BeforeInference).await?;
        let directives = self.directives();
        let request = self.request(&directives);
        let stats = self.stats();
        let snapshot = self.engine.store().snapshot();
        let tctx = TransformContext {
            snapshot: &snapshot,
            run: &self.identity,
            step: self.step,
            tokens: TokenCounts {
                last_usage: None,
                run_usage: stats.usage,
            },
        };
        let request = apply_transforms(self.resolved.env.transforms(), request, &tctx)
            .map_err(|e| Failure::Error(e.to_string()))?;
        let response = self.infer(request).await?;
        self.submit(
            StateCommand::new().with_update::<RunStatsKey>(StatsUpdate::Inference {
                usage: response.usage,
            }),
        )
        .await?;
        let text = response.message.text();
        if !text.is_empty() {
            self.response = Some(text);
        }
        let calls = response.message.tool_calls.clone();
        self.history.push(response.message.clone());
        let response = Arc::new(response);
        self.phase_with(self.ctx(Phase::AfterInference).with_response(response))
            .await?;

        if calls.is_empty() {
            self.end_step().await?;
            return Ok(StepEnd::End(TerminationReason::NaturalEnd));
        }
        let max_rounds = self.resolved.spec.max_rounds;
        if self.stats().inferences >= max_rounds {
            for call in &calls {
                self.close(
                    call,
                    ToolResult::error("not executed: round limit"),
                    ToolCallState::Cancelled,
                )
                .await?;
            }
            self.end_step().await?;
            return Ok(StepEnd::End(TerminationReason::stopped(
                "max_rounds",
                format!("reached the limit of {max_rounds} inferences"),
            )));
        }
        let mut suspended = false;
        for (i, call) in calls.iter().enumerate() {
            if self.cancel.is_cancelled() {
                for rest in &calls[i..] {
                    self.close(
                        rest,
                        ToolResult::error("not executed: the run was cancelled"),
                        ToolCallState::Cancelled,
                    )
                    .await?;
                }
                return Err(Failure::Cancelled);
            }
            self.sink.emit(&AgentEvent::ToolCallReady {
                call_id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            });
            match self.execute_call(call).await? {
                CallOutcome::Closed(result, state) => self.close(call, result, state).await?,
                CallOutcome::Suspended(ticket) => {
                    suspended = true;
                    self.sink.emit(&AgentEvent::ToolCallSuspended {
                        call_id: call.id.clone(),
                        ticket: *ticket,
                    });
                }
            }
        }
        self.phase(Phase::StepEnd).await?;
        let stop = self.stop_condition(&self.stats());
        self.submit(StateCommand::new().with_update::<RunStatsKey>(StatsUpdate::StepEnded))
            .await?;
        if suspended {
            return Ok(StepEnd::End(TerminationReason::Suspended));
        }
        Ok(match stop {
            Some(t) => StepEnd::End(t),
            None => StepEnd::Continue,
        })
    }

    async fn end_step(&mut self) -> Result<(), Failure> {
        self.phase(Phase::StepEnd).await?;
        self.submit(StateCommand::new().with_update::<RunStatsKey>(StatsUpdate::StepEnded))
            .await
    }

    fn stop_condition(&self, stats: &RunStats) -> Option<TerminationReason> {
        let snapshot = self.engine.store().snapshot();
        if let Ok(Some(request)) = snapshot.get::<StopRequestKey>() {
            return Some(TerminationReason::stopped(
                request.code.clone(),
                request.detail.clone(),
            ));
        }
        let max_rounds = self.resolved.spec.max_rounds;
        if stats.inferences >= max_rounds {
            return Some(TerminationReason::stopped(
                "max_rounds",
                format!("reached the limit of {max_rounds} inferences"),
            ));
        }
        for condition in &self.resolved.spec.stop_conditions {
            match condition {
                StopConditionSpec::TokenBudget { max_total_tokens }
                    if stats.usage.total() >= *max_total_tokens =>
                {
                    return Some(TerminationReason::stopped(
                        "token_budget",
                        format!("used {} of {max_total_tokens} tokens", stats.usage.total()),
                    ));
                }
                StopConditionSpec::StopOnTool { tool } if stats.tools_in_step.contains(tool) => {
                    return Some(TerminationReason::stopped(
                        "stop_tool",
                        format!("tool `{tool}` ran"),
                    ));
                }
                StopConditionSpec::ConsecutiveErrors { max }
                    if stats.consecutive_errors >= *max =>
                {
                    return Some(TerminationReason::stopped(
                        "consecutive_errors",
                        format!("{} tool calls failed in a row", stats.consecutive_errors),
                    ));
                }
                _ => {}
            }
        }
        None
    }

    /// Closes a call: its event, its message in the history, its statistics.
    async fn close(
        &mut self,
        call: &ToolCall,
        result: ToolResult,
        state: ToolCallState,
    ) -> Result<(), Failure> {
        let failed = !matches!(
            state,
            ToolCallState::Succeeded | ToolCallState::ShortCircuited
        );
        self.history.push(Message::tool(call.id.clone(), &result));
        self.sink.emit(&AgentEvent::ToolCallDone {
            call_id: call.id.clone(),
            result,
            state,
        });
        let tool = self
            .resolved
            .tools
            .iter()
            .find(|t| t.tool.descriptor().name == call.name)
            .map_or_else(|| call.name.clone(), |t| t.tool.id().to_owned());
        self.submit(
            StateCommand::new()
                .with_update::<RunStatsKey>(StatsUpdate::ToolClosed { tool, failed }),
        )
        .await
    }

    async fn execute_call(&mut self, call: &ToolCall) -> Result<CallOutcome, Failure> {
        let Some(tool) = self
            .resolved
            .tools
            .iter()
            .find(|t| t.tool.descriptor().name == call.name)
            .cloned()
        else {
            return Ok(CallOutcome::Closed(
                ToolResult::error(format!(
                    "unknown tool `{}`: it is not available to this agent",
                    call.name
                )),
                ToolCallState::Failed,
            ));
        };
        if let Some(raw) = &call.invalid_arguments {
            return Ok(CallOutcome::Closed(
                ToolResult::error(format!(
                    "the arguments of `{}` are not valid JSON: {raw}",
                    call.name
                )),
                ToolCallState::Failed,
            ));
        }
        let mut batch =
            ToolBatch::new([call.clone()]).map_err(|e| Failure::Error(e.to_string()))?;
        let info = ToolPhaseInfo {
            call: call.clone(),
            result: None,
            resume: None,
        };
        let gate_ctx = self.ctx(Phase::ToolGate).with_tool(info.clone());
        let resolution = evaluate_gates(&self.gates, &gate_ctx)
            .await
            .map_err(|e| Failure::Error(e.to_string()))?;
        for conflict in &resolution.conflicts {
            self.sink.emit(&AgentEvent::Warning {
                kind: WarningKind::GateConflict,
                detail: format!(
                    "gate `{}` overruled `{}` on call {}",
                    conflict.winner, conflict.loser, call.id
                ),
            });
        }
        if let Some(decision) = resolution.decision {
            let payload = decision.payload;
            return Ok(match payload {
                ToolInterceptPayload::Block { reason } => {
                    CallOutcome::Closed(ToolResult::error(reason), ToolCallState::Blocked)
                }
                ToolInterceptPayload::SetResult(result) => {
                    CallOutcome::Closed(result, ToolCallState::ShortCircuited)
                }
                ToolInterceptPayload::Suspend(ticket) => CallOutcome::Suspended(Box::new(ticket)),
            });
        }
        self.phase_with(self.ctx(Phase::BeforeToolExecute).with_tool(info.clone()))
            .await?;
        batch
            .start(&call.id)
            .map_err(|e| Failure::Error(e.to_string()))?;
        let tool_ctx = ToolCallContext::new(
            self.identity.thread_id.clone(),
            self.identity.run_id.clone(),
            call.id.clone(),
            self.engine.store().snapshot(),
        )
        .with_cancel(self.cancel.clone());
        let timeout = self.resolved.spec.tool_timeout.map(|t| t.get());
        let timer = async move {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending::<()>().await,
            }
        };
        let invoked = tool
            .tool
            .invoke_with_timeout(
                call.arguments.clone(),
                &tool_ctx,
                self.resolved.env.keys(),
                timer,
            )
            .await;
        let (result, state) = match invoked {
            Ok(output) => {
                let mut state = if output.result.is_error() {
                    ToolCallState::Failed
                } else {
                    ToolCallState::Succeeded
                };
                let mut result = output.result;
                if let Some(cmd) = output.command
                    && let Err(e) = self.engine.submit_command(cmd).await
                {
                    result =
                        ToolResult::error(format!("the tool's state change was rejected: {e}"));
                    state = ToolCallState::Failed;
                }
                (result, state)
            }
            Err(e) => {
                if self.cancel.is_cancelled() {
                    return Err(Failure::Cancelled);
                }
                (e.to_result(), e.closing_state())
            }
        };
        let after = ToolPhaseInfo {
            call: call.clone(),
            result: Some(result.clone()),
            resume: None,
        };
        self.phase_with(self.ctx(Phase::AfterToolExecute).with_tool(after))
            .await?;
        Ok(CallOutcome::Closed(result, state))
    }

    /// The one exit path: `RunEnd` (unless suspended), leftover actions dead-lettered,
    /// `on_deactivate`.
    async fn finish(&mut self, termination: TerminationReason) -> TerminationReason {
        let mut termination = termination;
        if termination != TerminationReason::Suspended {
            // RunEnd runs even for a cancelled run: give it a fresh token.
            let ctx = self
                .ctx(Phase::RunEnd)
                .with_cancel(CancellationToken::new());
            if let Err(e) = self.engine.run_phase(&ctx).await.map(|r| self.report(&r)) {
                self.sink.emit(&AgentEvent::Error {
                    message: e.to_string(),
                });
                if !matches!(termination, TerminationReason::Error { .. }) {
                    termination = TerminationReason::error(e.to_string());
                }
            }
            match self
                .engine
                .dead_letter_remaining("the run ended before its phase ran again")
            {
                Ok(letters) => {
                    for letter in letters {
                        self.sink.emit(&AgentEvent::ActionDeadLettered {
                            action: letter.action.key,
                            phase: letter.action.phase,
                            reason: letter.reason,
                        });
                    }
                }
                Err(e) => self.sink.emit(&AgentEvent::Error {
                    message: e.to_string(),
                }),
            }
        }
        if let TerminationReason::Error { message } = &termination {
            self.sink.emit(&AgentEvent::Error {
                message: message.clone(),
            });
        }
        for plugin in self.resolved.env.plugins() {
            match plugin.on_deactivate() {
                Ok(Some(cmd)) => {
                    if let Err(e) = self.engine.submit_command(cmd).await {
                        self.sink.emit(&AgentEvent::Error {
                            message: e.to_string(),
                        });
                    }
                }
                Ok(None) => {}
                Err(e) => self.sink.emit(&AgentEvent::Error {
                    message: e.to_string(),
                }),
            }
        }
        termination
    }
}

/// Token usage of a finished run, for callers that only hold events.
pub fn usage_of(events: &[AgentEvent]) -> TokenUsage {
    events
        .iter()
        .rev()
        .find_map(|e| match e {
            AgentEvent::RunFinish { usage, .. } => Some(*usage),
            _ => None,
        })
        .unwrap_or_default()
}
