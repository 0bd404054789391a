//! The context transform on crafted histories.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use awaken_context::{ContextConfig, ContextPlugins, OMISSION_MARKER_PREFIX, is_omission_marker};
use awaken_event::{History, Message, Role};
use awaken_plugin::TransformError;
use awaken_spec::TruncationStrategy;
use expect_test::expect;

use crate::support::*;

/// Two user turns, calls with one and two results, texts long enough that dropping a unit
/// pays for the marker.
fn history() -> Vec<Message> {
    let long = |w: &str| w.repeat(30);
    let mut h = vec![user(&format!("first question {}", long("a")))];
    h.extend(step("c1", &long("alpha ")));
    h.push(Message::assistant(long("first answer ")));
    h.push(user(&format!("second question {}", long("b"))));
    h.push(calls(&["c2", "c3"]));
    h.push(result("c2", &long("beta ")));
    h.push(result("c3", &long("gamma ")));
    h.extend(step("c4", &long("delta ")));
    h.extend(step("c5", &long("epsilon ")));
    h
}

fn full_size(h: &Harness, messages: &History) -> u64 {
    request_chars(&h.request(messages))
}

#[test]
fn a_request_that_fits_is_sent_unchanged() {
    let messages: History = history().into();
    let h = Harness::chars(ContextConfig::new(100_000));
    let out = h.transform(&messages, 1).expect("fits");
    assert!(History::ptr_eq(&out.messages, &messages));
}

#[test]
fn oldest_units_go_first_and_the_latest_user_message_stays() {
    let messages: History = history().into();
    let probe = Harness::chars(ContextConfig::new(100_000));
    let full = full_size(&probe, &messages);
    // Room for the fixed part, the marker, the second question and the last two steps.
    let h = Harness::chars(ContextConfig::new(full - 700));
    let out = h.transform(&messages, 1).expect("fits after dropping");
    assert!(request_chars(&out) <= full - 700);
    assert_pairs(&out.messages);
    expect![[r#"
        system: [Earlier context omitted: 7 messages of this conversation are not shown, to fit the context window.]
        user: second question bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
        assistant: calls c4
        tool c4: delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta delta 
        assistant: calls c5
        tool c5: epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon epsilon 
    "#]]
    .assert_eq(&render(&out));
}

/// For every budget from nothing to the full size: the request is within budget by the test's
/// own count, keeps every call with its result, always has the system prompt and the latest
/// user message, carries the marker exactly when something was dropped, keeps a suffix of the
/// history (plus the pinned user message), and a larger budget never keeps fewer messages.
/// Below the minimum the error names both sizes.
#[test]
fn every_budget_keeps_the_invariants() {
    let history = history();
    let messages: History = history.clone().into();
    let full = full_size(&Harness::chars(ContextConfig::new(1)), &messages);
    let latest_user = history
        .iter()
        .rposition(|m| m.role == Role::User)
        .expect("user");
    let mut kept_before = 0;
    let mut overflows = 0;
    let mut truncated = 0;
    for budget in 1..=full + 3 {
        let h = Harness::chars(ContextConfig::new(budget));
        let out = match h.transform(&messages, 1) {
            Ok(out) => out,
            Err(e) => {
                let TransformError::ContextOverflow {
                    required,
                    budget: b,
                } = e.source
                else {
                    panic!("unexpected error {e}");
                };
                assert_eq!(b, budget);
                assert!(required > budget, "{required} > {budget}");
                assert_eq!(
                    kept_before, 0,
                    "a smaller budget fitted but {budget} does not"
                );
                overflows += 1;
                continue;
            }
        };
        let sent = &out.messages;
        assert!(request_chars(&out) <= budget, "budget {budget}");
        assert_pairs(sent);
        assert_eq!(out.system_prompt.as_deref(), Some("Be brief."));
        assert!(sent.contains(&history[latest_user]), "budget {budget}");
        let marker = sent.iter().filter(|m| is_omission_marker(m)).count();
        let real: Vec<&Message> = sent.iter().filter(|m| !is_omission_marker(m)).collect();
        assert_eq!(
            marker,
            usize::from(real.len() < history.len()),
            "budget {budget}"
        );
        truncated += marker;
        // What is kept past the pinned user message is a suffix of the history.
        let tail: Vec<&Message> = real
            .iter()
            .skip_while(|m| **m == &history[latest_user] && real.len() < history.len())
            .copied()
            .collect();
        let suffix: Vec<&Message> = history[history.len() - tail.len()..].iter().collect();
        assert_eq!(tail, suffix, "budget {budget}");
        assert!(real.len() >= kept_before, "budget {budget}");
        kept_before = real.len();
    }
    assert!(overflows > 0 && truncated > 0);
    assert_eq!(kept_before, history.len());
}

#[test]
fn the_latest_user_message_is_kept_ahead_of_a_long_agentic_tail() {
    let mut history = vec![user("Fix the build.")];
    for i in 0..20 {
        history.extend(step(&format!("c{i}"), &"log line ".repeat(8)));
    }
    let messages: History = history.into();
    let h = Harness::chars(ContextConfig::new(600));
    let out = h.transform(&messages, 1).expect("fits");
    assert!(request_chars(&out) <= 600);
    assert_pairs(&out.messages);
    expect![[r#"
        system: [Earlier context omitted: 32 messages of this conversation are not shown, to fit the context window.]
        user: Fix the build.
        assistant: calls c16
        tool c16: log line log line log line log line log line log line log line log line 
        assistant: calls c17
        tool c17: log line log line log line log line log line log line log line log line 
        assistant: calls c18
        tool c18: log line log line log line log line log line log line log line log line 
        assistant: calls c19
        tool c19: log line log line log line log line log line log line log line log line 
    "#]]
    .assert_eq(&render(&out));
}

#[test]
fn when_even_the_minimum_does_not_fit_the_error_names_both_sizes() {
    let messages: History = history().into();
    let h = Harness::chars(ContextConfig::new(300));
    let e = h.transform(&messages, 1).expect_err("too small");
    expect!["request transform `context_window` of plugin `awaken.context_transform` failed: the request needs at least 449 tokens but the budget is 300"]
        .assert_eq(&e.to_string());
    assert!(matches!(
        e.source,
        TransformError::ContextOverflow {
            required: 449,
            budget: 300
        }
    ));
}

#[test]
fn the_fail_strategy_refuses_instead_of_dropping() {
    let messages: History = history().into();
    let full = full_size(&Harness::chars(ContextConfig::new(1)), &messages);
    let config = ContextConfig::new(full - 1).with_truncation(TruncationStrategy::Fail);
    let e = Harness::chars(config.clone())
        .transform(&messages, 1)
        .expect_err("does not fit");
    assert!(matches!(
        e.source,
        TransformError::ContextOverflow { required, budget } if required == full && budget == full - 1
    ));
    let ok = Harness::chars(
        config
            .clone()
            .with_truncation(TruncationStrategy::DropOldest),
    )
    .transform(&messages, 1)
    .expect("drop_oldest fits");
    assert!(ok.messages[0].text().starts_with(OMISSION_MARKER_PREFIX));
}

/// Grows a thread by one step at a time and returns, per request, how many leading messages
/// it shares with the previous request.
fn shared_prefixes(stable: bool, steps: usize) -> Vec<usize> {
    let h = Harness::chars(ContextConfig::new(2_000).with_stable_prefix(stable));
    let mut history = vec![user("Keep going.")];
    let mut previous: Option<History> = None;
    let mut shared = Vec::new();
    for i in 0..steps {
        history.extend(step(&format!("c{i}"), &"x".repeat(40)));
        let messages: History = history.clone().into();
        let out = h.transform(&messages, i as u32 + 1).expect("fits");
        assert!(request_chars(&out) <= 2_000);
        assert_pairs(&out.messages);
        if let Some(prev) = &previous {
            let n = prev
                .iter()
                .zip(out.messages.iter())
                .take_while(|(a, b)| a == b)
                .count();
            shared.push(if n == prev.len() { usize::MAX } else { n });
        }
        previous = Some(out.messages.clone());
    }
    shared
}

#[test]
fn a_stable_prefix_moves_only_in_chunks() {
    // Without stable_prefix, once truncation starts every request drops a little more, so
    // the prefix past the marker and the user message changes on every step.
    let moving = shared_prefixes(false, 200);
    let changed = moving.iter().filter(|n| **n != usize::MAX).count();
    assert!(changed > 150, "{changed}");
    // With it, the previous request is a prefix of the next one except when a chunk is
    // dropped.
    let stable = shared_prefixes(true, 200);
    let recuts = stable.iter().filter(|n| **n != usize::MAX).count();
    assert!((1..=40).contains(&recuts), "{recuts} re-cuts");
}

#[test]
fn counts_are_cached_so_a_step_estimates_only_new_messages() {
    let estimator = Arc::new(CountingEstimator::default());
    let h = Harness::new(
        ContextPlugins::new(ContextConfig::new(100_000)).with_estimator(estimator.clone()),
    );
    let mut history = history();
    let first: History = history.clone().into();
    h.transform(&first, 1).expect("fits");
    assert_eq!(estimator.0.load(Ordering::SeqCst), history.len());
    // The next step: two new messages, in a new slice.
    history.extend(step("c6", "zeta"));
    let second: History = history.clone().into();
    h.transform(&second, 2).expect("fits");
    assert_eq!(estimator.0.load(Ordering::SeqCst), history.len());
    // A step with a trailing context message, then the history grows past it: the context
    // message is counted once and replaced, the history is not recounted.
    let mut with_context = history.clone();
    with_context.push(Message::user("reminder"));
    h.transform(&with_context.into(), 3).expect("fits");
    assert_eq!(estimator.0.load(Ordering::SeqCst), history.len() + 1);
    history.extend(step("c7", "eta"));
    h.transform(&history.clone().into(), 4).expect("fits");
    assert_eq!(estimator.0.load(Ordering::SeqCst), history.len() + 1);
}
