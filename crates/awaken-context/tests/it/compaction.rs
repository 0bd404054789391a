//! Compaction with a scripted summariser, in a phase engine.

use std::sync::Arc;

use awaken_context::{
    Compact, CompactRange, CompactionConfig, CompactionKey, ContextConfig, ContextPlugins,
    DEFAULT_SUMMARY_INSTRUCTIONS, LlmSummarizer, Summarizer, SummaryError, SummaryRequest,
    is_summary_message,
};
use awaken_event::{CancellationToken, History, Message};
use awaken_llm::{ScriptTurn, ScriptedError, ScriptedErrorKind, ScriptedExecutor};
use awaken_phase::CommandExt;
use awaken_state::StateCommand;
use expect_test::expect;

use crate::support::*;

fn harness(threshold: f64, summarizer: Arc<ScriptedSummarizer>) -> Harness {
    let config = ContextConfig::new(2_000).with_compaction(CompactionConfig {
        threshold,
        summary_input_budget: 100_000,
        summary_max_tokens: 64,
    });
    Harness::new(
        ContextPlugins::new(config)
            .with_estimator(Arc::new(CharEstimator))
            .with_summarizer(summarizer),
    )
}

/// A thread that grows by one tool step at a time.
struct Thread {
    history: Vec<Message>,
    step: u32,
}

impl Thread {
    fn new() -> Self {
        Self {
            history: vec![user("Collect the figures.")],
            step: 0,
        }
    }

    /// Adds a step and runs it up to the request: `BeforeInference`, then the transform.
    async fn step(&mut self, h: &Harness) -> (History, awaken_llm::InferenceRequest) {
        self.step += 1;
        let i = self.step;
        self.history.extend(step(
            &format!("c{i}"),
            &format!("figure {i}: {}", "z".repeat(40)),
        ));
        let messages: History = self.history.clone().into();
        h.before_inference(&messages, i).await;
        let request = h.transform(&messages, i).expect("fits");
        assert!(request_chars(&request) <= 2_000);
        assert_pairs(&request.messages);
        (messages, request)
    }
}

#[tokio::test]
async fn a_summary_is_committed_once_and_stands_for_the_messages_it_covers() {
    let summarizer = Arc::new(ScriptedSummarizer::default());
    let h = harness(0.5, summarizer.clone());
    let mut thread = Thread::new();
    let (messages, request) = loop {
        let (messages, request) = thread.step(&h).await;
        if !summarizer.calls().is_empty() {
            break (messages, request);
        }
    };
    let state = h.get::<CompactionKey>();
    let covers = state.covers as usize;
    assert_eq!(summarizer.calls(), vec![(0, covers)]);
    assert_eq!(state.summaries, 1);
    assert_eq!(
        state.summary.as_deref(),
        Some(format!("S(0..{covers})").as_str())
    );
    // The request of that very step carries the summary instead of the covered messages;
    // the latest user message is still sent as it was, and nothing is marked omitted.
    assert!(is_summary_message(&request.messages[0]));
    assert_eq!(request.messages[1], thread.history[0]);
    assert_eq!(&request.messages[2..], &messages[covers..]);
    assert!(!has_marker(&request));
    expect![[r#"
        system: [Summary of the earlier conversation, standing for its first 19 messages]
        S(0..19)
        user: Collect the figures.
    "#]]
    .assert_eq(
        &render(&request)
            .lines()
            .take(3)
            .map(|l| format!("{l}\n"))
            .collect::<String>(),
    );
    // Running the phase again on the same history summarises nothing more.
    h.before_inference(&messages, thread.step).await;
    assert_eq!(summarizer.calls().len(), 1);
    // Growing on: each later summary folds the previous one with the next range, and no range
    // is ever summarised twice.
    for _ in 0..60 {
        thread.step(&h).await;
    }
    let calls = summarizer.calls();
    assert!(calls.len() >= 3, "{calls:?}");
    for pair in calls.windows(2) {
        assert_eq!(pair[0].1, pair[1].0, "ranges follow each other: {calls:?}");
    }
    let state = h.get::<CompactionKey>();
    assert_eq!(state.summaries as usize, calls.len());
    assert_eq!(state.covers as usize, calls[calls.len() - 1].1);
    assert!(
        state
            .summary
            .as_deref()
            .is_some_and(|s| s.starts_with(&format!("S(0..{covers})+S({covers}..")))
    );
}

#[tokio::test]
async fn a_stale_compaction_action_does_not_summarise_again() {
    let summarizer = Arc::new(ScriptedSummarizer::default());
    let h = harness(0.5, summarizer.clone());
    let mut thread = Thread::new();
    let messages = loop {
        let (messages, _) = thread.step(&h).await;
        if !summarizer.calls().is_empty() {
            break messages;
        }
    };
    let covers = h.get::<CompactionKey>().covers;
    // The same range scheduled again (a repeated action, a replay after a restart): the
    // handler sees the state already covers it and does not call the summariser.
    let mut cmd = StateCommand::new();
    cmd.schedule_action::<Compact>(CompactRange {
        from: 0,
        to: covers,
    })
    .expect("schedule");
    h.submit(cmd).await;
    let report = h.before_inference(&messages, thread.step).await;
    assert_eq!(report.actions_processed, 1);
    assert_eq!(summarizer.calls().len(), 1);
    assert_eq!(h.get::<CompactionKey>().summaries, 1);
}

#[tokio::test]
async fn a_failed_summary_falls_back_to_truncation_and_backs_off() {
    let summarizer = Arc::new(ScriptedSummarizer::default());
    *summarizer.fail.lock().expect("fail") = true;
    let h = harness(0.8, summarizer.clone());
    let mut thread = Thread::new();
    let mut lengths_at_calls = Vec::new();
    let mut truncated = 0;
    for _ in 0..80 {
        let before = summarizer.calls().len();
        let (messages, request) = thread.step(&h).await;
        if summarizer.calls().len() > before {
            lengths_at_calls.push(messages.len());
        }
        truncated += usize::from(has_marker(&request));
        assert!(!request.messages.iter().any(is_summary_message));
    }
    // Retried after 8, 16, 32 more messages.
    let gaps: Vec<usize> = lengths_at_calls.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps, vec![8, 16, 32]);
    assert!(
        truncated > 0,
        "the transform kept fitting requests by truncation"
    );
    let state = h.get::<CompactionKey>();
    assert_eq!(
        (state.fallbacks, state.failures_in_a_row, state.summaries),
        (4, 4, 0)
    );
    expect![
        "compaction of messages 0..85 failed, falling back to truncation: the summary model is down"
    ]
    .assert_eq(state.last_error.as_deref().unwrap_or_default());
    // The model recovers: the next attempt (once the history has grown enough) commits.
    *summarizer.fail.lock().expect("fail") = false;
    while h.get::<CompactionKey>().summaries == 0 {
        thread.step(&h).await;
    }
    let state = h.get::<CompactionKey>();
    assert_eq!((state.failures_in_a_row, state.retry_at), (0, None));
}

#[tokio::test]
async fn the_llm_summarizer_sends_a_transcript_and_classifies_failures() {
    let executor = ScriptedExecutor::from_turns([
        ScriptTurn::text("  They looked up c1.  "),
        ScriptTurn::error(ScriptedError::new(ScriptedErrorKind::Overloaded)),
    ])
    .expect("script");
    let summarizer =
        LlmSummarizer::new(Arc::new(executor.clone()), "small-model").with_max_tokens(128);
    let mut messages = vec![user("Look it up.")];
    messages.extend(step("c1", "found it"));
    let cancel = CancellationToken::new();
    let request = SummaryRequest {
        previous: Some("The user greeted."),
        messages: &messages,
        first_index: 4,
        cancel: &cancel,
    };
    let text = summarizer.summarize(request).await.expect("summary");
    assert_eq!(text, "They looked up c1.");
    let sent = &executor.requests()[0];
    assert_eq!(&*sent.upstream_model, "small-model");
    assert_eq!(
        sent.system_prompt.as_deref(),
        Some(DEFAULT_SUMMARY_INSTRUCTIONS)
    );
    assert_eq!(sent.overrides.max_tokens, Some(128));
    assert!(sent.tools.is_empty());
    expect![[r#"
        Summary so far:
        The user greeted.

        New messages:
        [5] user: Look it up.
        [6] assistant: → lookup({"q":"c1"})
        [7] tool: ← c1: found it
    "#]]
    .assert_eq(&sent.messages[0].text());
    let failed = summarizer.summarize(request).await.expect_err("overloaded");
    assert!(matches!(failed, SummaryError::Inference(_)), "{failed}");
}
