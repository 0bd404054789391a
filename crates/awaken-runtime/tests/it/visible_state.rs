//! State shown to clients: a visible key's value in a `StateSnapshot` after `RunStart` and in
//! a `StateDelta` after each commit that changed it; an invisible key never shown; an agent
//! without a visible key emits no state event.

use std::sync::Arc;

use awaken_event::{
    AgentEvent, GrammarChecker, ResumeMode, SuspendTicket, TerminationReason, ThreadId,
    ToolCallResume, VecSink,
};
use awaken_llm::{ScriptToolCall, ScriptTurn};
use awaken_phase::{FnHook, Phase, PhaseContext};
use awaken_plugin::{FnGate, Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_runtime::Resume;
use awaken_state::{KeyOptions, KeyScope, StateCommand, StateError, StateKey};
use awaken_tool::{ToolInterceptPayload, pending_call};
use serde_json::json;

use crate::support::*;

/// Steps ended so far: shown to clients.
struct Shown;

impl StateKey for Shown {
    const KEY: &'static str = "test.shown";
    type Value = u64;
    type Update = u64;
    fn apply(value: &mut u64, add: u64) -> Result<(), StateError> {
        *value += add;
        Ok(())
    }
}

/// Steps started so far: never shown.
struct Hidden;

impl StateKey for Hidden {
    const KEY: &'static str = "test.hidden";
    type Value = u64;
    type Update = u64;
    fn apply(value: &mut u64, add: u64) -> Result<(), StateError> {
        *value += add;
        Ok(())
    }
}

/// Counts started steps in `Hidden` (a commit that changes no visible key) and ended steps in
/// both keys; `visible` says whether `Shown` is registered visible; `ask` suspends every
/// `echo` call that is not a resumed one.
struct Counting {
    manifest: PluginManifest,
    visible: bool,
    ask: bool,
}

fn counting(visible: bool, ask: bool) -> Arc<dyn Plugin> {
    Arc::new(Counting {
        manifest: PluginManifest::new("counting"),
        visible,
        ask,
    })
}

impl Plugin for Counting {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_key::<Shown>(
            KeyOptions::new()
                .with_scope(KeyScope::Thread)
                .with_visible(self.visible),
        )?;
        r.register_key::<Hidden>(KeyOptions::new().with_scope(KeyScope::Thread))?;
        r.register_phase_hook(
            Phase::StepStart,
            "count_start",
            Arc::new(FnHook(|_: &PhaseContext| {
                Ok(StateCommand::new().with_update::<Hidden>(1))
            })),
        )?;
        r.register_phase_hook(
            Phase::StepEnd,
            "count_end",
            Arc::new(FnHook(|_: &PhaseContext| {
                Ok(StateCommand::new()
                    .with_update::<Shown>(1)
                    .with_update::<Hidden>(1))
            })),
        )?;
        if self.ask {
            r.register_tool_gate_hook(
                "ask",
                Arc::new(FnGate(|ctx: &PhaseContext| {
                    let tool = ctx.tool.as_ref().expect("a tool phase");
                    if tool.call.name != "echo" || tool.resume.is_some() {
                        return Ok(None);
                    }
                    Ok(Some(ToolInterceptPayload::Suspend(SuspendTicket {
                        suspension_id: format!("ask-{}", tool.call.id),
                        call: pending_call(&tool.call),
                        message: "Run echo?".into(),
                        response_schema: None,
                        resume_mode: ResumeMode::Replay,
                    })))
                })),
            )?;
        }
        Ok(())
    }
}

/// A step calling `echo`, then a step that answers.
fn two_steps() -> Vec<ScriptTurn> {
    vec![
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": "a"})).with_id("c1")),
        ScriptTurn::text("done"),
    ]
}

/// The run's events, state events with their content (revisions left out: see
/// `revisions_rise`), the others as the scenario helper renders them.
fn render_state(events: &[AgentEvent]) -> String {
    let mut out = String::new();
    for e in events {
        match e {
            AgentEvent::StateSnapshot { state, .. } => {
                out.push_str(&format!("state_snapshot {state}\n"));
            }
            AgentEvent::StateDelta { changes, .. } => {
                out.push_str(&format!("state_delta {changes}\n"));
            }
            other => out.push_str(&render(std::slice::from_ref(other))),
        }
    }
    out
}

/// The revisions of the state events, checked to rise strictly from the snapshot on.
fn revisions_rise(events: &[AgentEvent]) -> Vec<u64> {
    let revisions: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::StateSnapshot { revision, .. }
            | AgentEvent::StateDelta { revision, .. } => Some(*revision),
            _ => None,
        })
        .collect();
    assert!(
        revisions.windows(2).all(|w| w[0] < w[1]),
        "state revisions rise: {revisions:?}"
    );
    revisions
}

/// Feeds `events` to `checker` (a fresh one, or one for a resume whose earlier activation it
/// did not see), panicking with the rendered events at a violation.
fn grammar_holds(mut checker: GrammarChecker, events: &[AgentEvent]) {
    for e in events {
        if let Err(v) = checker.push(e) {
            panic!("event grammar violated: {v}\n{}", render_state(events));
        }
    }
    checker
        .finish()
        .expect("the stream ends outside an activation");
}

#[tokio::test]
async fn a_visible_key_is_shown_after_run_start_and_after_each_commit_that_changed_it() {
    let out = Scenario::new(two_steps())
        .plugin(counting(true, false))
        .run()
        .await;
    assert_eq!(out.outcome.termination, TerminationReason::NaturalEnd);
    grammar_holds(GrammarChecker::new(), &out.events);
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        state_snapshot {"test.shown":0}
        step_start 1
        call_start c1 echo
        inference upstream-model
        call_ready c1 {"text":"a"}
        state_delta {"test.shown":1}
        call_done c1 succeeded {"echoed":"a"}
        step_end 1
        step_start 2
        text "done"
        inference upstream-model
        state_delta {"test.shown":2}
        step_end 2
        run_finish natural_end response=Some("done") tokens=0
    "#]]
    .assert_eq(&render_state(&out.events));
    let revisions = revisions_rise(&out.events);
    assert_eq!(revisions.len(), 3, "one snapshot, two deltas");
    // The invisible key is never named.
    let text = serde_json::to_string(&out.events).expect("json");
    assert!(!text.contains(Hidden::KEY), "{text}");
    // The last delta holds the value the thread kept.
    let thread = ThreadId::new("thread").expect("id");
    let checkpoint = out
        .runtime
        .store()
        .load_checkpoint(&thread)
        .await
        .expect("loads")
        .expect("stored");
    assert_eq!(
        checkpoint.thread_state.values.get(Shown::KEY),
        Some(&json!(2))
    );
    assert_eq!(
        checkpoint.thread_state.values.get(Hidden::KEY),
        Some(&json!(4))
    );
}

#[tokio::test]
async fn a_resumed_activation_starts_with_a_snapshot_of_the_persisted_value() {
    let out = Scenario::new(two_steps())
        .plugin(counting(true, true))
        .run()
        .await;
    assert_eq!(out.outcome.termination, TerminationReason::Suspended);
    let thread = ThreadId::new("thread").expect("id");
    let waiting = out.runtime.waiting_calls(&thread).await.expect("read");
    assert_eq!(waiting.len(), 1);

    let sink = VecSink::new();
    let resumed = out
        .runtime
        .resume(
            Resume::new(thread).with_decision(ToolCallResume::approve(&waiting[0].call)),
            &sink,
        )
        .await
        .expect("resumed");
    assert_eq!(resumed.termination, TerminationReason::NaturalEnd);
    let events = sink.events();
    grammar_holds(GrammarChecker::without_history(), &events);
    expect_test::expect![[r#"
        run_start run-1 resumed=true
        state_snapshot {"test.shown":1}
        step_start 2
        tool_call_resumed
        call_ready c1 {"text":"a"}
        state_delta {"test.shown":2}
        call_done c1 succeeded {"echoed":"a"}
        step_end 2
        step_start 3
        text "done"
        inference upstream-model
        state_delta {"test.shown":3}
        step_end 3
        run_finish natural_end response=Some("done") tokens=0
    "#]]
    .assert_eq(&render_state(&events));
    revisions_rise(&events);
}

#[tokio::test]
async fn an_agent_without_a_visible_key_emits_no_state_event() {
    let out = Scenario::new(two_steps())
        .plugin(counting(false, false))
        .run()
        .await;
    assert_eq!(out.outcome.termination, TerminationReason::NaturalEnd);
    let state_events: Vec<_> = out
        .events
        .iter()
        .filter(|e| {
            matches!(
                e,
                AgentEvent::StateSnapshot { .. } | AgentEvent::StateDelta { .. }
            )
        })
        .collect();
    assert!(state_events.is_empty(), "{state_events:?}");
    // Both keys were still updated.
    let thread = ThreadId::new("thread").expect("id");
    let checkpoint = out
        .runtime
        .store()
        .load_checkpoint(&thread)
        .await
        .expect("loads")
        .expect("stored");
    assert_eq!(
        checkpoint.thread_state.values.get(Shown::KEY),
        Some(&json!(2))
    );
}

/// A visible value JSON cannot hold once it has an entry (a map keyed by byte strings).
struct Unshowable;

impl StateKey for Unshowable {
    const KEY: &'static str = "test.unshowable";
    type Value = std::collections::BTreeMap<Vec<u8>, u8>;
    type Update = u8;
    fn apply(value: &mut Self::Value, n: u8) -> Result<(), StateError> {
        value.insert(vec![n], n);
        Ok(())
    }
}

/// Registers [`Unshowable`] visible (ephemeral: never persisted) and gives it an entry when
/// each step ends.
struct Breaking(PluginManifest);

impl Plugin for Breaking {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_key::<Unshowable>(
            KeyOptions::new()
                .with_scope(KeyScope::Ephemeral)
                .with_visible(true),
        )?;
        r.register_phase_hook(
            Phase::StepEnd,
            "break",
            Arc::new(FnHook(|ctx: &PhaseContext| {
                let step = u8::try_from(ctx.step).unwrap_or(u8::MAX);
                Ok(StateCommand::new().with_update::<Unshowable>(step))
            })),
        )
    }
}

#[tokio::test]
async fn a_visible_value_that_cannot_be_serialized_is_a_warning_not_a_failure() {
    let out = Scenario::new(vec![ScriptTurn::text("done")])
        .plugin(Arc::new(Breaking(PluginManifest::new("breaking"))))
        .run()
        .await;
    assert_eq!(out.outcome.termination, TerminationReason::NaturalEnd);
    grammar_holds(GrammarChecker::new(), &out.events);
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        state_snapshot {"test.unshowable":{}}
        step_start 1
        text "done"
        inference upstream-model
        warning Other: state key `test.unshowable` could not be serialized: key must be a string; the value is not shown to clients
        step_end 1
        run_finish natural_end response=Some("done") tokens=0
    "#]]
    .assert_eq(&render_state(&out.events));
}
