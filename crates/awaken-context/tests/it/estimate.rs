//! The default estimator's heuristic and the correction from reported usage.

use awaken_context::{
    Calibration, CalibrationKey, ContextConfig, DefaultEstimator, TokenEstimator, UsageSample,
    json_tokens, text_tokens,
};
use awaken_event::{ContentBlock, History, Message, ToolDescriptor};
use expect_test::expect;
use serde_json::json;

use crate::support::*;

#[test]
fn the_default_heuristic_is_pinned() {
    let e = DefaultEstimator;
    let image = Message {
        content: std::sync::Arc::new([ContentBlock::Image {
            url: "https://example.invalid/cat.png".into(),
            media_type: None,
        }]),
        ..Message::user("")
    };
    let rows = [
        (
            "text 'hello world' (11 ASCII bytes)",
            text_tokens("hello world"),
        ),
        ("text ''", text_tokens("")),
        (
            "text '上下文管理' (5 CJK characters)",
            text_tokens("上下文管理"),
        ),
        ("text 'café' (3 ASCII + 1 accented)", text_tokens("café")),
        (
            "json {\"q\":\"abc\"} (11 bytes)",
            json_tokens(&json!({"q": "abc"})),
        ),
        (
            "user message 'hello world'",
            e.message_tokens(&Message::user("hello world")),
        ),
        (
            "assistant call lookup {\"q\":\"abc\"}",
            e.message_tokens(&calls(&["abc"])),
        ),
        (
            "tool result 'hello world' for id abc",
            e.message_tokens(&result("abc", "hello world")),
        ),
        ("image", e.message_tokens(&image)),
        (
            "tool schema lookup",
            e.tool_tokens(&ToolDescriptor::new("lookup", "Looks things up")),
        ),
        (
            "system prompt 'Be brief.'",
            e.system_prompt_tokens("Be brief."),
        ),
        ("request overhead", e.request_overhead()),
    ];
    let table: String = rows
        .iter()
        .map(|(what, n)| format!("{what} = {n}\n"))
        .collect();
    expect![[r#"
        text 'hello world' (11 ASCII bytes) = 3
        text '' = 0
        text '上下文管理' (5 CJK characters) = 5
        text 'café' (3 ASCII + 1 accented) = 2
        json {"q":"abc"} (11 bytes) = 3
        user message 'hello world' = 7
        assistant call lookup {"q":"abc"} = 17
        tool result 'hello world' for id abc = 8
        image = 769
        tool schema lookup = 19
        system prompt 'Be brief.' = 7
        request overhead = 3
    "#]]
    .assert_eq(&table);
}

#[test]
fn calibration_follows_reports_within_bounds() {
    let mut c = Calibration::default();
    assert_eq!(c.correct(1_000), 1_000);
    c.observe(UsageSample {
        estimated: 0,
        reported: 50,
    });
    assert_eq!(c.samples, 0, "a sample without an estimate is ignored");
    c.observe(UsageSample {
        estimated: 100,
        reported: 150,
    });
    assert_eq!(
        (c.ratio, c.samples),
        (1.5, 1),
        "the first sample sets the ratio"
    );
    c.observe(UsageSample {
        estimated: 100,
        reported: 100_000,
    });
    // Clamped to 4, then averaged: 1.5 × 0.7 + 4 × 0.3.
    assert!((c.ratio - 2.25).abs() < 1e-9, "{}", c.ratio);
    assert_eq!(c.correct(100), 225);
    // The raw budget is the largest raw count whose correction fits.
    for budget in [1, 7, 100, 1_001, 123_457] {
        let raw = c.raw_budget(budget);
        assert!(
            c.correct(raw) <= budget && c.correct(raw + 1) > budget,
            "{budget}"
        );
    }
}

/// The transform records its estimate of the request it sent; the `AfterInference` hook puts
/// the reported prompt tokens beside it; the next request is fitted with the corrected count.
#[tokio::test]
async fn reported_usage_corrects_the_next_request() {
    let mut history = vec![user("Go.")];
    for i in 0..30 {
        history.extend(step(&format!("c{i}"), &"y".repeat(50)));
    }
    let messages: History = history.into();
    let h = Harness::chars(ContextConfig::new(4_000));
    let first = h.transform(&messages, 1).expect("fits");
    let estimate = request_chars(&first);
    assert!(!has_marker(&first), "everything fits before the correction");
    // The provider counted twice what the estimator did.
    h.after_inference(&messages, 1, 2 * estimate).await;
    let calibration = h.get::<CalibrationKey>();
    assert_eq!((calibration.ratio, calibration.samples), (2.0, 1));
    let second = h.transform(&messages, 2).expect("fits");
    assert!(has_marker(&second), "the corrected count no longer fits");
    assert!(2 * request_chars(&second) <= 4_000);
    assert_pairs(&second.messages);
    // A response for another step (or without usage) teaches nothing.
    h.after_inference(&messages, 7, 10 * estimate).await;
    h.after_inference(&messages, 2, 0).await;
    assert_eq!(h.get::<CalibrationKey>().samples, 1);
}
