//! Effects in a run: a handler that fails is reported as a warning and counted in the run's
//! statistics, and the run goes on.

use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{
    AgentEvent, TerminationReason, ThreadId, ToolDescriptor, WarningKind, check_activation,
};
use awaken_llm::{ScriptToolCall, ScriptTurn};
use awaken_phase::{CommandExt, EffectContext, EffectHandler, EffectSpec, FnHook, HookError};
use awaken_phase::{Phase, PhaseContext};
use awaken_plugin::{Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_runtime::RunStatsKey;
use awaken_state::{StateCommand, StateKey};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use crate::support::*;

/// An audit line, handled after the commit that emits it.
struct AuditLine;

impl EffectSpec for AuditLine {
    const KEY: &'static str = "test.audit_line";
    type Payload = String;
}

/// Logs the line it is handed, then fails: its log is full.
struct FullAuditLog(Log);

#[async_trait]
impl EffectHandler<AuditLine> for FullAuditLog {
    async fn handle(&self, _ctx: &EffectContext, line: String) -> Result<(), HookError> {
        self.0.push(line);
        Err(HookError::failed("the audit log is full"))
    }
}

/// Handles audit lines; with `at_step_end`, emits one at the end of the run's first step.
struct Auditor {
    manifest: PluginManifest,
    log: Log,
    at_step_end: bool,
}

impl Auditor {
    fn plugin(log: &Log, at_step_end: bool) -> Arc<dyn Plugin> {
        Arc::new(Self {
            manifest: PluginManifest::new("auditor"),
            log: log.clone(),
            at_step_end,
        })
    }
}

impl Plugin for Auditor {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_effect::<AuditLine, _>(FullAuditLog(self.log.clone()))?;
        if self.at_step_end {
            r.register_phase_hook(
                Phase::StepEnd,
                "audit_step",
                Arc::new(FnHook(|ctx: &PhaseContext| {
                    let mut cmd = StateCommand::new();
                    if ctx.step == 1 {
                        cmd.emit::<AuditLine>("step 1 ended".into())?;
                    }
                    Ok(cmd)
                })),
            )?;
        }
        Ok(())
    }
}

/// A tool whose state change emits an audit line.
struct Audited;

#[async_trait]
impl Tool for Audited {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("audited", "Leaves an audit line")
    }
    async fn execute(
        &self,
        _args: &Value,
        _ctx: &ToolCallContext,
    ) -> Result<ToolOutput, ToolError> {
        let mut cmd = StateCommand::new();
        cmd.emit::<AuditLine>("audited ran".into())
            .map_err(|e| ToolError::Execution {
                message: e.to_string(),
            })?;
        Ok(ToolOutput::success(json!("done")).with_command(cmd))
    }
}

/// A step calling `tool` with `arguments`, then a step that answers.
fn two_steps(tool: &str, arguments: Value) -> Vec<ScriptTurn> {
    vec![
        ScriptTurn::text("").with_tool_call(ScriptToolCall::new(tool, arguments).with_id("c1")),
        ScriptTurn::text("finished"),
    ]
}

/// The `HandlerFailed` warnings of a run.
fn handler_warnings(events: &[AgentEvent]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Warning {
                kind: WarningKind::HandlerFailed,
                detail,
            } => Some(detail.as_str()),
            _ => None,
        })
        .collect()
}

/// The run statistics the finished run keeps.
async fn stored_stats(out: &Outcome) -> String {
    let checkpoint = out
        .runtime
        .store()
        .load_checkpoint(&ThreadId::new("thread").expect("id"))
        .await
        .expect("loads")
        .expect("stored");
    checkpoint.run_state.values[<RunStatsKey as StateKey>::KEY].to_string()
}

#[tokio::test]
async fn a_failing_effect_handler_is_a_warning_and_a_count_and_the_run_goes_on() {
    let log = Log::default();
    let out = Scenario::new(two_steps("echo", json!({"text": "a"})))
        .plugin(Auditor::plugin(&log, true))
        .run()
        .await;
    assert_eq!(out.outcome.termination, TerminationReason::NaturalEnd);
    assert_eq!(out.outcome.response.as_deref(), Some("finished"));
    assert_eq!(log.lines(), ["step 1 ended"], "the handler ran once");
    assert_eq!(check_activation(&out.events), Ok(()));
    assert_eq!(
        handler_warnings(&out.events),
        [
            "the handler of effect `test.audit_line` (plugin `auditor`) failed: the audit log is full"
        ]
    );
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        step_start 1
        call_start c1 echo
        inference upstream-model
        call_ready c1 {"text":"a"}
        warning HandlerFailed: the handler of effect `test.audit_line` (plugin `auditor`) failed: the audit log is full
        call_done c1 succeeded {"echoed":"a"}
        step_end 1
        step_start 2
        text "finished"
        inference upstream-model
        step_end 2
        run_finish natural_end response=Some("finished") tokens=0
    "#]]
    .assert_eq(&render(&out.events));
    expect_test::expect![[r#"{"handler_failures":1,"inferences":2,"steps":2}"#]]
        .assert_eq(&stored_stats(&out).await);
}

#[tokio::test]
async fn a_failing_effect_of_a_tools_state_change_is_reported_before_the_call_closes() {
    let log = Log::default();
    let mut scenario =
        Scenario::new(two_steps("audited", json!({}))).plugin(Auditor::plugin(&log, false));
    scenario.tools.push(Arc::new(Audited));
    let out = scenario.run().await;
    assert_eq!(out.outcome.termination, TerminationReason::NaturalEnd);
    assert_eq!(log.lines(), ["audited ran"]);
    assert_eq!(check_activation(&out.events), Ok(()));
    assert_eq!(handler_warnings(&out.events).len(), 1);
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        step_start 1
        call_start c1 audited
        inference upstream-model
        call_ready c1 {}
        warning HandlerFailed: the handler of effect `test.audit_line` (plugin `auditor`) failed: the audit log is full
        call_done c1 succeeded "done"
        step_end 1
        step_start 2
        text "finished"
        inference upstream-model
        step_end 2
        run_finish natural_end response=Some("finished") tokens=0
    "#]]
    .assert_eq(&render(&out.events));
    expect_test::expect![[r#"{"handler_failures":1,"inferences":2,"steps":2}"#]]
        .assert_eq(&stored_stats(&out).await);
}
