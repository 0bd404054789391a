//! An answer the model did not finish — cut at its output token limit or stopped by the
//! provider's content filter — ends the run `Stopped` with a code that says so, keeping the
//! partial text as the response; an answer that ends its turn, or a step that calls tools and
//! then ends its turn, ends naturally.

use awaken_event::{AgentEvent, StopReason, TerminationReason};
use awaken_llm::{ScriptToolCall, ScriptTurn};
use serde_json::json;

use crate::support::Scenario;

#[tokio::test]
async fn an_answer_cut_at_the_token_limit_ends_the_run_truncated() {
    let out = Scenario::new(vec![
        ScriptTurn::text("The first half of").with_stop(StopReason::MaxTokens),
    ])
    .run()
    .await;
    match &out.outcome.termination {
        TerminationReason::Stopped { code, detail } => {
            assert_eq!(code, "truncated");
            assert!(detail.contains("max_tokens"), "{detail}");
        }
        other => panic!("expected a truncated stop, got {other:?}"),
    }
    assert_eq!(out.outcome.response.as_deref(), Some("The first half of"));
    assert!(out.events.iter().any(|e| matches!(
        e,
        AgentEvent::InferenceComplete {
            stop_reason: StopReason::MaxTokens,
            ..
        }
    )));
    assert!(out.events.iter().any(|e| matches!(
        e,
        AgentEvent::RunFinish { termination, .. }
            if matches!(&**termination, TerminationReason::Stopped { code, .. } if code == "truncated")
    )));
}

#[tokio::test]
async fn an_answer_the_content_filter_stopped_says_so() {
    let out = Scenario::new(vec![
        ScriptTurn::text("Here is how").with_stop(StopReason::ContentFiltered),
    ])
    .run()
    .await;
    assert!(matches!(
        &out.outcome.termination,
        TerminationReason::Stopped { code, .. } if code == "content_filtered"
    ));
}

#[tokio::test]
async fn a_finished_answer_after_tool_calls_ends_naturally() {
    let out = Scenario::new(vec![
        ScriptTurn::text("")
            .with_tool_call(ScriptToolCall::new("echo", json!({"text": "a"})).with_id("c1")),
        ScriptTurn::text("All done.").with_stop(StopReason::EndTurn),
    ])
    .run()
    .await;
    assert_eq!(out.outcome.termination, TerminationReason::NaturalEnd);
}
