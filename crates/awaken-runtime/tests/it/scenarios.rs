//! The loop's behaviour, scenario by scenario.

use std::sync::Arc;

use awaken_event::{
    AgentEvent, CancellationToken, ResumeMode, SuspendTicket, TerminationReason, ToolCallState,
    ToolResult,
};
use awaken_llm::{ScriptToolCall, ScriptTurn};
use awaken_phase::{CommandExt, FnHook, Phase, PhaseContext};
use awaken_plugin::{FnGate, Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_runtime::*;
use awaken_spec::{InferenceOverride, StopConditionSpec};
use awaken_state::StateCommand;
use awaken_tool::{ToolInterceptPayload, pending_call};
use serde_json::json;

use crate::support::*;

fn call(id: &str, name: &str, args: serde_json::Value) -> ScriptTurn {
    ScriptTurn::text("").with_tool_call(ScriptToolCall::new(name, args).with_id(id))
}

/// A plugin built from a registration closure.
struct P {
    manifest: PluginManifest,
    register: Box<dyn Fn(&mut PluginRegistrar) -> Result<(), PluginError> + Send + Sync>,
}

fn plugin(
    id: &str,
    f: impl Fn(&mut PluginRegistrar) -> Result<(), PluginError> + Send + Sync + 'static,
) -> Arc<dyn Plugin> {
    Arc::new(P {
        manifest: PluginManifest::new(id),
        register: Box::new(f),
    })
}

impl Plugin for P {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        (self.register)(r)
    }
}

#[tokio::test]
async fn natural_end() {
    let out = Scenario::new(vec![ScriptTurn::deltas(["Hel", "lo"])])
        .run()
        .await;
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        step_start 1
        text "Hel"
        text "lo"
        inference upstream-model
        step_end 1
        run_finish natural_end response=Some("Hello") tokens=0
    "#]]
    .assert_eq(&render(&out.events));
    assert_eq!(out.outcome.steps, 1);
    assert_eq!(
        out.runtime
            .history(&awaken_event::ThreadId::new("thread").expect("id"))
            .await
            .expect("stored")
            .len(),
        2
    );
}

#[tokio::test]
async fn multi_step_tool_use() {
    let out = Scenario::new(vec![
        call("c1", "echo", json!({"text": "one"})),
        call("c2", "echo", json!({"text": "two"})),
        ScriptTurn::text("done"),
    ])
    .run()
    .await;
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        step_start 1
        call_start c1 echo
        inference upstream-model
        call_ready c1 {"text":"one"}
        call_done c1 succeeded {"echoed":"one"}
        step_end 1
        step_start 2
        call_start c2 echo
        inference upstream-model
        call_ready c2 {"text":"two"}
        call_done c2 succeeded {"echoed":"two"}
        step_end 2
        step_start 3
        text "done"
        inference upstream-model
        step_end 3
        run_finish natural_end response=Some("done") tokens=0
    "#]]
    .assert_eq(&render(&out.events));
    // The third request carries both calls and both results, in order.
    let requests = out.executor.requests();
    assert_eq!(requests.len(), 3);
    let roles: Vec<String> = requests[2]
        .messages
        .iter()
        .map(|m| format!("{:?}", m.role))
        .collect();
    assert_eq!(
        roles,
        vec!["User", "Assistant", "Tool", "Assistant", "Tool"]
    );
    assert_eq!(requests[0].system_prompt.as_deref(), Some("Be brief."));
}

#[tokio::test]
async fn max_rounds_caps_inferences_and_closes_the_last_calls() {
    let out = Scenario::new(vec![
        call("c1", "echo", json!({"text": "a"})),
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": "b"})).with_id("c2"))
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": "c"})).with_id("c3")),
        ScriptTurn::text("never"),
    ])
    .spec(|s| s.with_max_rounds(2))
    .run()
    .await;
    assert_eq!(
        out.executor.requests().len(),
        2,
        "exactly max_rounds inferences"
    );
    let text = render(&out.events);
    assert!(
        text.contains("call_done c2 cancelled \"not executed: round limit\""),
        "{text}"
    );
    assert!(
        text.contains("call_done c3 cancelled \"not executed: round limit\""),
        "{text}"
    );
    assert_eq!(
        out.outcome.termination,
        TerminationReason::stopped("max_rounds", "reached the limit of 2 inferences")
    );
}

#[tokio::test]
async fn unknown_tools_and_non_json_arguments_get_error_results() {
    let out = Scenario::new(vec![
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("no_such_tool", json!({})).with_id("c1"))
            .with_tool_call(ScriptToolCall {
                id: Some("c2".into()),
                name: "echo".into(),
                arguments: None,
                raw_arguments: Some("{\"text\": ".into()),
            })
            .with_tool_call(ScriptToolCall::new("echo", json!({"txt": 1})).with_id("c3")),
        ScriptTurn::text("sorry"),
    ])
    .run()
    .await;
    let text = render(&out.events);
    assert!(
        text.contains(
            "call_done c1 blocked \"unknown tool `no_such_tool`: it is not available to this agent\""
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "call_done c2 blocked \"the arguments of `echo` are not valid JSON: {\\\"text\\\": \""
        ),
        "{text}"
    );
    assert!(text.contains("call_done c3 blocked"), "{text}");
    assert_eq!(out.outcome.termination, TerminationReason::NaturalEnd);
}

fn gate(decision: fn(&PhaseContext) -> Option<ToolInterceptPayload>) -> Arc<dyn Plugin> {
    plugin("gatekeeper", move |r| {
        r.register_tool_gate_hook(
            "decide",
            Arc::new(FnGate(move |ctx: &PhaseContext| Ok(decision(ctx)))),
        )?;
        r.register_phase_hook(
            Phase::BeforeToolExecute,
            "before",
            Arc::new(FnHook(|ctx: &PhaseContext| {
                tracing::info!(call = ?ctx.tool, "before tool execute");
                Ok(StateCommand::new())
            })),
        )
    })
}

#[tokio::test]
async fn block_gives_the_model_an_error_and_the_run_goes_on() {
    let out = Scenario::new(vec![
        call("c1", "echo", json!({"text": "x"})),
        ScriptTurn::text("ok"),
    ])
    .plugin(gate(|_| {
        Some(ToolInterceptPayload::Block {
            reason: "not today".into(),
        })
    }))
    .run()
    .await;
    assert!(render(&out.events).contains("call_done c1 blocked \"not today\""));
    assert_eq!(out.outcome.termination, TerminationReason::NaturalEnd);
    assert_eq!(out.executor.requests().len(), 2);
}

#[tokio::test]
async fn set_result_skips_the_tool() {
    let out = Scenario::new(vec![
        call("c1", "broken", json!({})),
        ScriptTurn::text("ok"),
    ])
    .plugin(gate(|_| {
        Some(ToolInterceptPayload::SetResult(ToolResult::success(json!(
            "cached"
        ))))
    }))
    .run()
    .await;
    assert!(
        render(&out.events).contains("call_done c1 short_circuited \"cached\""),
        "{}",
        render(&out.events)
    );
}

#[tokio::test]
async fn suspend_ends_the_activation_suspended() {
    let out = Scenario::new(vec![
        call("c1", "echo", json!({"text": "x"})),
        ScriptTurn::text("never"),
    ])
    .plugin(gate(|ctx| {
        let call = &ctx.tool.as_ref().expect("tool phase").call;
        Some(ToolInterceptPayload::Suspend(SuspendTicket {
            suspension_id: "s1".into(),
            call: pending_call(call),
            message: "Allow echo?".into(),
            response_schema: None,
            resume_mode: ResumeMode::Replay,
        }))
    }))
    .run()
    .await;
    let text = render(&out.events);
    assert!(text.contains("call_suspended c1 \"Allow echo?\""), "{text}");
    assert_eq!(out.outcome.termination, TerminationReason::Suspended);
    assert_eq!(out.executor.requests().len(), 1);
    assert!(
        !text.contains("run_end"),
        "RunEnd does not run for a suspension"
    );
    // The thread now waits for a decision: a new run on it is refused, naming the run.
    let again = out
        .runtime
        .run_to_completion(
            awaken_runtime::RunActivation::new(
                awaken_event::ThreadId::new("thread").expect("id"),
                "agent",
            )
            .with_user_message("anyone?"),
        )
        .await
        .expect_err("the thread is waiting");
    assert_eq!(
        again.to_string(),
        "thread `thread` is waiting: run `run-1` has suspended tool calls that need a decision: c1"
    );
}

#[tokio::test]
async fn the_phase_order_of_a_step_with_two_tool_calls() {
    let log = Log::default();
    let l = log.clone();
    let recorder = plugin("recorder", move |r| {
        for phase in Phase::ALL {
            if phase == Phase::ToolGate {
                let l = l.clone();
                r.register_tool_gate_hook(
                    "gate",
                    Arc::new(FnGate(move |ctx: &PhaseContext| {
                        l.push(format!(
                            "tool_gate {}",
                            ctx.tool.as_ref().expect("call").call.id
                        ));
                        Ok(None)
                    })),
                )?;
                continue;
            }
            let l = l.clone();
            r.register_phase_hook(
                phase,
                "record",
                Arc::new(FnHook(move |ctx: &PhaseContext| {
                    let call = ctx
                        .tool
                        .as_ref()
                        .map(|t| format!(" {}", t.call.id))
                        .unwrap_or_default();
                    l.push(format!("{}{call}", ctx.phase));
                    Ok(StateCommand::new())
                })),
            )?;
        }
        Ok(())
    });
    let _ = Scenario::new(vec![
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": "a"})).with_id("c1"))
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": "b"})).with_id("c2")),
        ScriptTurn::text("done"),
    ])
    .plugin(recorder)
    .run()
    .await;
    expect_test::expect![[r#"
        run_start
        step_start
        before_inference
        after_inference
        tool_gate c1
        before_tool_execute c1
        after_tool_execute c1
        tool_gate c2
        before_tool_execute c2
        after_tool_execute c2
        step_end
        step_start
        before_inference
        after_inference
        step_end
        run_end"#]]
    .assert_eq(&log.lines().join("\n"));
}

#[tokio::test]
async fn overrides_layer_agent_run_step_and_rename_the_model() {
    let stepper = plugin("stepper", |r| {
        r.register_phase_hook(
            Phase::BeforeInference,
            "tune",
            Arc::new(FnHook(|_: &PhaseContext| {
                let mut cmd = StateCommand::new();
                cmd.schedule_action::<SetInferenceOverride>(
                    InferenceOverride::default().with_max_tokens(7),
                )?;
                cmd.schedule_action::<AddContextMessage>("remember the context".into())?;
                cmd.schedule_action::<ExcludeTool>("broken".into())?;
                Ok(cmd)
            })),
        )
    });
    let out = Scenario::new(vec![ScriptTurn::text("ok")])
        .spec(|s| {
            s.with_inference(
                InferenceOverride::default()
                    .with_temperature(0.1)
                    .with_max_tokens(100)
                    .with_upstream_model("renamed"),
            )
        })
        .plugin(stepper)
        .activation(|a| a.with_inference(InferenceOverride::default().with_temperature(0.5)))
        .run()
        .await;
    let request = &out.executor.requests()[0];
    assert_eq!(request.overrides.temperature, Some(0.5), "run beats agent");
    assert_eq!(request.overrides.max_tokens, Some(7), "step beats agent");
    assert_eq!(
        request.effective_model(),
        "renamed",
        "upstream_model renames within the provider"
    );
    assert_eq!(
        request.messages.last().map(|m| m.text()),
        Some("remember the context".into())
    );
    let tools: Vec<&str> = request.tools.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(tools, vec!["echo"]);
    assert!(render(&out.events).contains("inference renamed"));
}

#[tokio::test]
async fn step_directives_do_not_leak_into_the_next_step() {
    let once = plugin("once", |r| {
        r.register_phase_hook(
            Phase::BeforeInference,
            "first_step_only",
            Arc::new(FnHook(|ctx: &PhaseContext| {
                let mut cmd = StateCommand::new();
                if ctx.step == 1 {
                    cmd.schedule_action::<IncludeOnlyTools>(vec!["echo".into()])?;
                    cmd.schedule_action::<AddContextMessage>("step one only".into())?;
                }
                Ok(cmd)
            })),
        )
    });
    let out = Scenario::new(vec![
        call("c1", "echo", json!({"text": "x"})),
        ScriptTurn::text("ok"),
    ])
    .plugin(once)
    .run()
    .await;
    let requests = out.executor.requests();
    assert_eq!(requests[0].tools.len(), 1);
    assert_eq!(requests[1].tools.len(), 2);
    assert!(
        requests[1]
            .messages
            .iter()
            .all(|m| m.text() != "step one only")
    );
}

#[tokio::test]
async fn the_activation_filter_reaches_the_loop() {
    let loud = plugin("loud", |r| {
        r.register_phase_hook(
            Phase::BeforeInference,
            "add",
            Arc::new(FnHook(|_: &PhaseContext| {
                let mut cmd = StateCommand::new();
                cmd.schedule_action::<AddContextMessage>("from loud".into())?;
                Ok(cmd)
            })),
        )
    });
    let out = Scenario::new(vec![ScriptTurn::text("ok")])
        .plugin(loud)
        .spec(|s| s.with_active_hook("someone-else"))
        .run()
        .await;
    assert!(
        out.executor.requests()[0]
            .messages
            .iter()
            .all(|m| m.text() != "from loud")
    );
}

#[tokio::test]
async fn each_stop_condition() {
    let budget = Scenario::new(vec![
        call("c1", "echo", json!({"text": "x"})).with_usage(awaken_event::TokenUsage {
            input_tokens: 60,
            output_tokens: 50,
            ..Default::default()
        }),
        ScriptTurn::text("never"),
    ])
    .spec(|s| {
        s.with_stop_condition(StopConditionSpec::TokenBudget {
            max_total_tokens: 100,
        })
    })
    .run()
    .await;
    assert_eq!(
        budget.outcome.termination,
        TerminationReason::stopped("token_budget", "used 110 of 100 tokens")
    );

    let tool = Scenario::new(vec![
        call("c1", "echo", json!({"text": "x"})),
        ScriptTurn::text("never"),
    ])
    .spec(|s| {
        s.with_stop_condition(StopConditionSpec::StopOnTool {
            tool: "echo".into(),
        })
    })
    .run()
    .await;
    assert_eq!(
        tool.outcome.termination,
        TerminationReason::stopped("stop_tool", "tool `echo` ran")
    );

    let errors = Scenario::new(vec![
        call("c1", "broken", json!({})),
        call("c2", "broken", json!({})),
        ScriptTurn::text("never"),
    ])
    .spec(|s| s.with_stop_condition(StopConditionSpec::ConsecutiveErrors { max: 2 }))
    .run()
    .await;
    assert_eq!(
        errors.outcome.termination,
        TerminationReason::stopped("consecutive_errors", "2 tool calls failed in a row")
    );
    assert_eq!(errors.executor.requests().len(), 2);

    let stopper = plugin("stopper", |r| {
        r.register_phase_hook(
            Phase::AfterToolExecute,
            "stop",
            Arc::new(FnHook(|_: &PhaseContext| {
                let mut cmd = StateCommand::new();
                cmd.schedule_action::<RequestStop>(StopRequest {
                    code: "quota".into(),
                    detail: "plugin says so".into(),
                })?;
                Ok(cmd)
            })),
        )
    });
    let requested = Scenario::new(vec![
        call("c1", "echo", json!({"text": "x"})),
        ScriptTurn::text("never"),
    ])
    .plugin(stopper)
    .run()
    .await;
    assert_eq!(
        requested.outcome.termination,
        TerminationReason::stopped("quota", "plugin says so")
    );
}

/// `AfterInference` hooks see each step's whole response: the assistant message as the history
/// holds it, the usage and the stop reason.
#[tokio::test]
async fn after_inference_hooks_see_the_response() {
    type Seen = Vec<(String, Vec<String>, u64, awaken_event::StopReason)>;
    let seen: Arc<std::sync::Mutex<Seen>> = Arc::default();
    let record = seen.clone();
    let watcher = plugin("watcher", move |r| {
        let record = record.clone();
        r.register_phase_hook(
            Phase::AfterInference,
            "record",
            Arc::new(FnHook(move |ctx: &PhaseContext| {
                let response = ctx.response.as_ref().expect("a response in AfterInference");
                record.lock().unwrap_or_else(|e| e.into_inner()).push((
                    response.message.text(),
                    response
                        .message
                        .tool_calls
                        .iter()
                        .map(|c| c.name.clone())
                        .collect(),
                    response.usage.output_tokens,
                    response.stop_reason,
                ));
                Ok(StateCommand::new())
            })),
        )
    });
    let usage = |output_tokens| awaken_event::TokenUsage {
        input_tokens: 10,
        output_tokens,
        ..Default::default()
    };
    let out = Scenario::new(vec![
        call("c1", "echo", json!({"text": "x"})).with_usage(usage(3)),
        ScriptTurn::text("all done").with_usage(usage(5)),
    ])
    .plugin(watcher)
    .run()
    .await;
    assert_eq!(out.outcome.termination, TerminationReason::NaturalEnd);
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(
        seen,
        vec![
            (
                String::new(),
                vec!["echo".to_owned()],
                3,
                awaken_event::StopReason::ToolCalls
            ),
            (
                "all done".to_owned(),
                Vec::new(),
                5,
                awaken_event::StopReason::EndTurn
            ),
        ]
    );
}

/// A plugin whose `AfterInference` hook panics.
fn after_inference_bomb() -> Arc<dyn Plugin> {
    plugin("bomb", |r| {
        r.register_phase_hook(
            Phase::AfterInference,
            "explode",
            Arc::new(FnHook(|_: &PhaseContext| panic!("kaboom"))),
        )
    })
}

#[tokio::test]
async fn a_panicking_hook_ends_the_run_with_an_error_and_one_run_finish() {
    let bomb = after_inference_bomb();
    let out = Scenario::new(vec![ScriptTurn::text("hi")])
        .plugin(bomb)
        .run()
        .await;
    let TerminationReason::Error { message } = &out.outcome.termination else {
        panic!("an error: {:?}", out.outcome)
    };
    assert!(
        message.contains("hook `explode` of plugin `bomb` panicked in after_inference: kaboom"),
        "{message}"
    );
    assert_eq!(
        out.events
            .iter()
            .filter(|e| e.type_name() == "run_finish")
            .count(),
        1
    );
}

#[tokio::test]
async fn a_step_that_fails_after_the_model_called_a_tool_closes_the_call() {
    let bomb = after_inference_bomb();
    // The call was announced while the response streamed; the step fails before it runs.
    let out = Scenario::new(vec![ScriptTurn::tool_call("echo", json!({"text": "x"}))])
        .plugin(bomb)
        .run()
        .await;
    assert!(
        matches!(out.outcome.termination, TerminationReason::Error { .. }),
        "{:?}",
        out.outcome
    );
    let closing: Vec<_> = out
        .events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCallDone { result, state, .. } => Some((result.clone(), *state)),
            _ => None,
        })
        .collect();
    assert_eq!(closing.len(), 1, "{}", render(&out.events));
    assert_eq!(closing[0].1, ToolCallState::Cancelled);
    assert_eq!(
        closing[0].0.content.as_str(),
        Some("not finished: the run failed")
    );
    assert!(
        out.executor.requests().len() == 1,
        "the tool never ran and nothing was asked again"
    );
}

#[tokio::test]
async fn cancellation_during_inference_ends_the_run_cancelled() {
    let token = CancellationToken::new();
    let t = token.clone();
    let scenario = Scenario::new(vec![ScriptTurn::wait_for_cancel()]).activation(move |mut a| {
        a.cancel = t;
        a
    });
    let run = tokio::spawn(scenario.run());
    // Wait until the run is parked on the scripted turn, then cancel.
    tokio::task::yield_now().await;
    token.cancel();
    let out = run.await.expect("joined");
    assert_eq!(out.outcome.termination, TerminationReason::Cancelled);
    assert_eq!(
        out.executor.requests().len(),
        1,
        "the run was parked on the inference when cancelled"
    );
    let text = render(&out.events);
    assert!(
        text.ends_with("run_finish cancelled response=None tokens=0\n"),
        "{text}"
    );
}

/// Every `Commutative` key of the built-in environment must have a commutativity property test
/// here; this test fails when a built-in declares one that is not listed.
#[test]
fn every_commutative_builtin_key_has_a_property_test() {
    use awaken_resolver::BuiltinPlugins;
    use awaken_state::MergeStrategy;
    let builtins = RuntimeBuiltins::default()
        .builtin_plugins(
            &awaken_spec::AgentSpec::new("a", "m"),
            &awaken_spec::ModelSpec::new("m", "p", "x"),
        )
        .expect("built-ins");
    let env = awaken_plugin::ExecutionEnv::from_plugins(&[], &builtins, &[]).expect("env");
    let commutative: Vec<&str> = env
        .keys()
        .keys()
        .filter(|k| k.options.merge == MergeStrategy::Commutative)
        .map(|k| k.name)
        .collect();
    // Keys with a `check_commutative` test in this file.
    let tested = [<awaken_runtime::RemoteWaitsKey as awaken_state::StateKey>::KEY];
    assert_eq!(commutative, tested);
    assert!(
        env.keys()
            .contains(<RunStatsKey as awaken_state::StateKey>::KEY)
    );
}

/// The remote waits of concurrent delegate calls commute: each call writes only its own entry
/// (the call ids are drawn from a space where two calls never share one).
#[test]
fn remote_waits_of_distinct_calls_commute() {
    use awaken_runtime::{RemoteWait, RemoteWaitUpdate, RemoteWaitsKey};
    use proptest::prelude::*;
    let update = (any::<u64>(), any::<bool>(), 0u32..3).prop_map(|(call, waits, answers)| {
        let call = format!("call-{call}");
        if waits {
            RemoteWaitUpdate::Wait {
                call,
                wait: RemoteWait {
                    handle: format!("task-{answers}"),
                    question: "Which city?".to_owned(),
                    answers,
                },
            }
        } else {
            RemoteWaitUpdate::Done { call }
        }
    });
    awaken_state::testing::check_commutative::<RemoteWaitsKey>(update)
        .unwrap_or_else(|v| panic!("{v}"));
}

/// A tool that signals it started, then waits until the run is cancelled.
struct Waits(Arc<tokio::sync::Notify>);

#[async_trait::async_trait]
impl awaken_tool::Tool for Waits {
    fn descriptor(&self) -> awaken_event::ToolDescriptor {
        awaken_event::ToolDescriptor::new("wait", "Waits until cancelled")
    }
    async fn execute(
        &self,
        _args: &serde_json::Value,
        ctx: &awaken_tool::ToolCallContext,
    ) -> Result<awaken_tool::ToolOutput, awaken_tool::ToolError> {
        self.0.notify_one();
        ctx.cancel_token().cancelled().await;
        Err(awaken_tool::ToolError::Cancelled {
            tool_id: "wait".into(),
        })
    }
}

#[tokio::test]
async fn cancellation_during_a_tool_closes_its_call_and_ends_the_run_cancelled() {
    let started = Arc::new(tokio::sync::Notify::new());
    let token = CancellationToken::new();
    let t = token.clone();
    let mut scenario = Scenario::new(vec![
        call("c1", "wait", json!({})),
        ScriptTurn::text("never"),
    ])
    .activation(move |mut a| {
        a.cancel = t;
        a
    });
    scenario.tools.push(Arc::new(Waits(started.clone())));
    let run = tokio::spawn(scenario.run());
    started.notified().await;
    token.cancel();
    let out = run.await.expect("joined");
    assert_eq!(out.outcome.termination, TerminationReason::Cancelled);
    let text = render(&out.events);
    assert!(text.contains("call_done c1 cancelled"), "{text}");
    assert_eq!(out.executor.requests().len(), 1);
}

#[tokio::test]
async fn a_failing_hook_before_a_tool_closes_the_calls_and_fails_the_run() {
    let failing = plugin("strict", |r| {
        r.register_phase_hook(
            Phase::BeforeToolExecute,
            "refuse",
            Arc::new(FnHook(|_: &PhaseContext| {
                Err(awaken_phase::HookError::failed("no tools today"))
            })),
        )
    });
    let out = Scenario::new(vec![
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": "a"})).with_id("c1"))
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": "b"})).with_id("c2")),
    ])
    .plugin(failing)
    .run()
    .await;
    let TerminationReason::Error { message } = &out.outcome.termination else {
        panic!("{:?}", out.outcome)
    };
    assert!(message.contains("no tools today"), "{message}");
    let text = render(&out.events);
    assert!(
        text.contains("call_done c1 cancelled \"not finished: the run failed\""),
        "{text}"
    );
    assert!(
        text.contains("call_done c2 cancelled \"not finished: the run failed\""),
        "{text}"
    );
}

/// Appends a line to the system prompt of every request.
struct Stamp;

impl awaken_plugin::InferenceRequestTransform for Stamp {
    fn name(&self) -> &str {
        "stamp"
    }
    fn transform(
        &self,
        mut request: awaken_llm::InferenceRequest,
        ctx: &awaken_plugin::TransformContext<'_>,
    ) -> Result<awaken_llm::InferenceRequest, awaken_plugin::TransformError> {
        let prompt = request.system_prompt.take().unwrap_or_default();
        request.system_prompt = Some(format!("{prompt}\n(step {})", ctx.step).into());
        Ok(request)
    }
}

#[tokio::test]
async fn request_transforms_reach_the_provider() {
    let stamp = plugin("stamp", |r| {
        r.register_request_transform(Arc::new(Stamp));
        Ok(())
    });
    let out = Scenario::new(vec![
        call("c1", "echo", json!({"text": "a"})),
        ScriptTurn::text("done"),
    ])
    .plugin(stamp)
    .run()
    .await;
    let prompts: Vec<Option<String>> = out
        .executor
        .requests()
        .iter()
        .map(|r| r.system_prompt.as_deref().map(str::to_owned))
        .collect();
    assert_eq!(
        prompts,
        [
            Some("Be brief.\n(step 1)".to_owned()),
            Some("Be brief.\n(step 2)".to_owned())
        ]
    );
}

/// Every run in flight holds its future: its size is memory per in-flight run (the e2e
/// benchmark's KiB figure). Not a speed test; a guard against a change that inflates it
/// unnoticed (a future moved into another, a large value held across an await).
#[test]
fn a_runs_future_stays_small() {
    let runtime = AgentRuntime::builder()
        .with_model(awaken_spec::ModelSpec::new("model", "scripted", "upstream"))
        .with_provider(
            "scripted",
            Arc::new(awaken_llm::ScriptedExecutor::from_turns(vec![]).expect("script")),
        )
        .with_agent_spec(awaken_spec::AgentSpec::new("agent", "model"))
        .build()
        .expect("runtime");
    let activation = RunActivation::new(awaken_event::ThreadId::new("t").expect("id"), "agent");
    let future = runtime.run_to_completion(activation);
    let size = std::mem::size_of_val(&future);
    // About 2 KiB: the request is boxed before the future is made, the built run is boxed
    // once, and what only some steps or runs need is boxed where it is made (see the ADR on
    // a run's future).
    assert!(size <= 2_112, "run_to_completion's future is {size} bytes");
}

/// Answers with a text after yielding to the scheduler once (as a network call would), so a
/// run waits on its cancellation token during each inference.
struct Yielding;

impl awaken_llm::LlmExecutor for Yielding {
    fn name(&self) -> &str {
        "yielding"
    }
    fn execute_stream(&self, _request: awaken_llm::InferenceRequest) -> awaken_llm::LlmEventStream {
        use futures_util::StreamExt;
        Box::pin(
            futures_util::stream::once(tokio::task::yield_now()).flat_map(|()| text_answer("done")),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_sharing_one_cancellation_token_leave_no_waker_on_it() {
    let runtime = AgentRuntime::builder()
        .with_model(awaken_spec::ModelSpec::new("model", "y", "up"))
        .with_provider("y", Arc::new(Yielding))
        .with_agent_spec(awaken_spec::AgentSpec::new("agent", "model"))
        .build()
        .expect("runtime");
    // One token for every activation (a server's "cancel everything"), each run on its own
    // task: a waker kept per finished task would keep that task's memory alive.
    let token = CancellationToken::new();
    let runs: Vec<_> = (0..20)
        .map(|i| {
            let (runtime, token) = (runtime.clone(), token.clone());
            tokio::spawn(async move {
                let mut act = RunActivation::new(
                    awaken_event::ThreadId::new(format!("t{i}")).expect("id"),
                    "agent",
                )
                .with_user_message("go");
                act.cancel = token;
                runtime.run_to_completion(act).await
            })
        })
        .collect();
    for run in runs {
        let out = run.await.expect("joined").expect("ran");
        assert_eq!(out.termination, TerminationReason::NaturalEnd);
    }
    assert_eq!(token.waiting_tasks(), 0);
}

/// An `AfterToolExecute` hook fails on the first of two calls after both tools ran: the run
/// ends in error, and each call keeps the result its tool gave (never "not executed"), in the
/// history and in its `ToolCallDone`, sequential or concurrent.
#[tokio::test]
async fn a_failing_after_tool_hook_keeps_the_results_of_the_tools_that_ran() {
    for parallel in [false, true] {
        let failing = plugin("failing", |r| {
            r.register_phase_hook(
                Phase::AfterToolExecute,
                "fail_on_c1",
                Arc::new(FnHook(|ctx: &PhaseContext| {
                    let tool = ctx.tool.as_ref().expect("a tool phase");
                    if tool.call.id.as_str() == "c1" {
                        return Err(awaken_phase::HookError::failed("audit log is down"));
                    }
                    Ok(StateCommand::new())
                })),
            )
        });
        let out = Scenario::new(vec![
            ScriptTurn::text("")
                .with_tool_call(ScriptToolCall::new("echo", json!({"text": "a"})).with_id("c1"))
                .with_tool_call(ScriptToolCall::new("echo", json!({"text": "b"})).with_id("c2")),
            ScriptTurn::text("never"),
        ])
        .spec(|s| s.with_parallel_tools(parallel))
        .plugin(failing)
        .run()
        .await;
        assert!(
            matches!(out.outcome.termination, TerminationReason::Error { .. }),
            "{:?}",
            out.outcome.termination
        );
        let done: Vec<String> = out
            .events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::ToolCallDone {
                    call_id,
                    result,
                    state,
                } => Some(format!("{call_id} {state} {}", result.content)),
                _ => None,
            })
            .collect();
        // In a sequential step c2 never ran; in a concurrent one it did, and says so.
        let expected_c2 = if parallel {
            r#"c2 succeeded {"echoed":"b"}"#
        } else {
            r#"c2 cancelled "not finished: the run failed""#
        };
        assert_eq!(
            done,
            [r#"c1 succeeded {"echoed":"a"}"#, expected_c2],
            "parallel: {parallel}"
        );
        let checkpoint = out
            .runtime
            .store()
            .load_checkpoint(&awaken_event::ThreadId::new("thread").expect("id"))
            .await
            .expect("loads")
            .expect("stored");
        let tools: Vec<String> = checkpoint
            .messages
            .iter()
            .filter(|m| m.tool_call_id.is_some())
            .map(|m| serde_json::to_string(&m.content).expect("json"))
            .collect();
        assert_eq!(tools.len(), 2, "one result per call: {tools:?}");
        assert!(tools[0].contains("echoed"), "{tools:?}");
        assert_eq!(tools[1].contains("echoed"), parallel, "{tools:?}");
    }
}
