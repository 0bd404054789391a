//! RetryingExecutor against the scripted executor, on tokio's paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use awaken_llm::{
    InferenceExecutionError, InferenceRequest, LlmEventStream, LlmExecutor, RetryPolicy,
    RetryingExecutor, ScriptTurn, ScriptedError, ScriptedErrorKind, ScriptedExecutor,
};
use awaken_spec::{DurationSpec, RetryConfig};
use futures_util::{FutureExt, StreamExt};
use tokio::time::Instant;

use crate::{render_stream, request};

/// Wraps an executor and records when (on tokio's clock) each call started.
struct Timed {
    inner: ScriptedExecutor,
    start: Instant,
    calls: Arc<Mutex<Vec<Duration>>>,
}

impl Timed {
    fn new(turns: Vec<ScriptTurn>) -> Arc<Self> {
        Arc::new(Self {
            inner: ScriptedExecutor::from_turns(turns).expect("valid script"),
            start: Instant::now(),
            calls: Arc::default(),
        })
    }

    /// Offsets of the calls from the wrapper's creation, in milliseconds.
    fn call_offsets_ms(&self) -> Vec<u128> {
        let calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        calls.iter().map(|d| d.as_millis()).collect()
    }
}

impl LlmExecutor for Timed {
    fn name(&self) -> &str {
        "timed"
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.start.elapsed());
        self.inner.execute_stream(request)
    }
}

fn policy(max_retries: u32, initial_ms: u64, max_ms: u64, multiplier: f64) -> RetryPolicy {
    RetryPolicy {
        max_retries,
        initial_backoff: Duration::from_millis(initial_ms),
        max_backoff: Duration::from_millis(max_ms),
        multiplier,
        jitter: false,
        seed: 0,
    }
}

fn err(kind: ScriptedErrorKind) -> ScriptTurn {
    ScriptTurn::error(ScriptedError::new(kind))
}

#[tokio::test(start_paused = true)]
async fn backs_off_exponentially_then_succeeds() {
    let inner = Timed::new(vec![
        err(ScriptedErrorKind::ServerError),
        err(ScriptedErrorKind::RateLimited),
        err(ScriptedErrorKind::Timeout),
        ScriptTurn::text("ok"),
    ]);
    let exec = RetryingExecutor::with_policy(inner.clone(), policy(3, 100, 10_000, 2.0));
    let response = exec.execute(request("x")).await;
    assert_eq!(
        response.map(|r| r.message.text()).ok().as_deref(),
        Some("ok")
    );
    assert_eq!(inner.call_offsets_ms(), [0, 100, 300, 700]);
}

#[tokio::test(start_paused = true)]
async fn backoff_is_capped_at_max_backoff() {
    let inner = Timed::new(vec![
        err(ScriptedErrorKind::Overloaded),
        err(ScriptedErrorKind::Overloaded),
        err(ScriptedErrorKind::Overloaded),
        ScriptTurn::text("ok"),
    ]);
    let exec = RetryingExecutor::with_policy(inner.clone(), policy(5, 100, 500, 10.0));
    assert!(exec.execute(request("x")).await.is_ok());
    assert_eq!(inner.call_offsets_ms(), [0, 100, 600, 1100]);
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured_and_too_long_a_wait_gives_up() {
    let inner = Timed::new(vec![
        ScriptTurn::error(
            ScriptedError::new(ScriptedErrorKind::RateLimited)
                .with_retry_after(Duration::from_millis(700)),
        ),
        // Shorter than the backoff: the backoff (200 ms, second retry) wins.
        ScriptTurn::error(
            ScriptedError::new(ScriptedErrorKind::RateLimited)
                .with_retry_after(Duration::from_millis(10)),
        ),
        ScriptTurn::text("ok"),
    ]);
    let exec = RetryingExecutor::with_policy(inner.clone(), policy(3, 100, 1_000, 2.0));
    assert!(exec.execute(request("x")).await.is_ok());
    assert_eq!(inner.call_offsets_ms(), [0, 700, 900]);

    let inner = Timed::new(vec![
        ScriptTurn::error(
            ScriptedError::new(ScriptedErrorKind::RateLimited)
                .with_retry_after(Duration::from_secs(60)),
        ),
        ScriptTurn::text("never"),
    ]);
    let exec = RetryingExecutor::with_policy(inner.clone(), policy(3, 100, 1_000, 2.0));
    let error = exec.execute(request("x")).await.err();
    assert_eq!(
        error.as_ref().and_then(|e| e.retry_after()),
        Some(Duration::from_secs(60)),
        "the error is returned with its retry-after"
    );
    assert_eq!(inner.call_offsets_ms(), [0]);
}

#[tokio::test(start_paused = true)]
async fn attempts_are_bounded() {
    let inner = Timed::new(vec![err(ScriptedErrorKind::ServerError); 5]);
    let exec = RetryingExecutor::with_policy(inner.clone(), policy(2, 100, 10_000, 2.0));
    let error = exec.execute(request("x")).await.err();
    assert!(matches!(
        error,
        Some(InferenceExecutionError::ServerError { .. })
    ));
    assert_eq!(inner.call_offsets_ms(), [0, 100, 300]);
}

#[tokio::test(start_paused = true)]
async fn permanent_errors_and_cancellation_are_never_retried() {
    for kind in [
        ScriptedErrorKind::Unauthorized,
        ScriptedErrorKind::InvalidRequest,
        ScriptedErrorKind::ModelNotFound,
        ScriptedErrorKind::ContextOverflow,
        ScriptedErrorKind::ContentFiltered,
        ScriptedErrorKind::Cancelled,
    ] {
        let inner = Timed::new(vec![err(kind), ScriptTurn::text("never")]);
        let exec = RetryingExecutor::with_policy(inner.clone(), policy(3, 100, 1_000, 2.0));
        let error = exec.execute(request("x")).await.err();
        assert!(
            error.as_ref().is_some_and(|e| !e.is_retryable()),
            "{kind:?}: {error:?}"
        );
        assert_eq!(inner.call_offsets_ms(), [0], "{kind:?} was retried");
    }
}

#[tokio::test(start_paused = true)]
async fn a_failure_after_the_first_event_is_not_retried() {
    let inner = Timed::new(vec![
        ScriptTurn::deltas(["par"]).with_error(ScriptedError::new(ScriptedErrorKind::ServerError)),
        ScriptTurn::text("never"),
    ]);
    let exec = RetryingExecutor::with_policy(inner.clone(), policy(3, 100, 1_000, 2.0));
    let out = render_stream(exec.execute_stream(request("x"))).await;
    expect_test::expect![[r#"
        text "par"
        error Retryable ServerError: provider server error (HTTP 500): 
    "#]]
    .assert_eq(&out);
    assert_eq!(inner.call_offsets_ms(), [0]);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_stream_during_a_backoff_stops_retrying() {
    let inner = Timed::new(vec![
        err(ScriptedErrorKind::ServerError),
        ScriptTurn::text("never"),
    ]);
    let exec = RetryingExecutor::with_policy(inner.clone(), policy(3, 100, 1_000, 2.0));
    let mut stream = exec.execute_stream(request("x"));
    assert!(
        stream.next().now_or_never().is_none(),
        "waiting in the backoff"
    );
    drop(stream);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(inner.call_offsets_ms(), [0]);
}

#[tokio::test(start_paused = true)]
async fn jittered_backoffs_stay_in_the_upper_half_and_follow_the_seed() {
    let jittered = RetryPolicy {
        jitter: true,
        seed: 42,
        ..policy(3, 100, 10_000, 2.0)
    };
    let inner = Timed::new(vec![
        err(ScriptedErrorKind::ServerError),
        err(ScriptedErrorKind::ServerError),
        ScriptTurn::text("ok"),
    ]);
    let exec = RetryingExecutor::with_policy(inner.clone(), jittered.clone());
    assert!(exec.execute(request("x")).await.is_ok());
    let offsets = inner.call_offsets_ms();
    let first = offsets[1];
    let second = offsets[2] - offsets[1];
    assert!((50..=100).contains(&first), "{offsets:?}");
    assert!((100..=200).contains(&second), "{offsets:?}");
    // The delays are those the policy computes for the first call (salt 0), give or take
    // the timer's millisecond rounding.
    let near = |actual: u128, expected: Duration| actual.abs_diff(expected.as_millis()) <= 1;
    assert!(near(first, jittered.backoff(0, 0)), "{offsets:?}");
    assert!(near(second, jittered.backoff(1, 0)), "{offsets:?}");

    let delays = |seed: u64| -> Vec<Duration> {
        let p = RetryPolicy {
            seed,
            ..jittered.clone()
        };
        (0..8).map(|r| p.backoff(r, 0)).collect()
    };
    assert_eq!(delays(42), delays(42));
    assert_ne!(delays(42), delays(43));
    for retry in 0..8 {
        let base = jittered.base_backoff(retry);
        for salt in 0..50 {
            let d = jittered.backoff(retry, salt);
            assert!(
                d >= base / 2 && d <= base,
                "retry {retry} salt {salt}: {d:?}"
            );
        }
    }
}

#[test]
fn the_policy_comes_from_the_retry_section() {
    let config = RetryConfig {
        max_retries: 4,
        initial_backoff: DurationSpec::from_millis(250),
        max_backoff: DurationSpec::from_secs(8),
        multiplier: 3.0,
        jitter: false,
    };
    let inner = ScriptedExecutor::from_turns([]).expect("valid");
    let exec = RetryingExecutor::new(Arc::new(inner), &config);
    let p = exec.policy();
    assert_eq!(p.max_retries, 4);
    assert_eq!(p.initial_backoff, Duration::from_millis(250));
    assert_eq!(p.max_backoff, Duration::from_secs(8));
    assert_eq!(p.multiplier, 3.0);
    assert!(!p.jitter);
    let backoffs: Vec<u128> = (0..5).map(|r| p.base_backoff(r).as_millis()).collect();
    assert_eq!(backoffs, [250, 750, 2250, 6750, 8000]);
    assert_eq!(exec.name(), "scripted");
}
