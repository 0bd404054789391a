//! Retrying retryable inference errors with capped exponential backoff and jitter.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use awaken_spec::RetryConfig;
use futures_util::StreamExt;
use futures_util::stream;

use crate::error::InferenceExecutionError;
use crate::event::LlmEventStream;
use crate::executor::LlmExecutor;
use crate::request::InferenceRequest;

/// How [`RetryingExecutor`] waits and when it gives up; the typed form of the agent's `retry`
/// section ([`RetryConfig`]) plus a jitter seed.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (so at most `max_retries + 1` calls); 0 disables retrying.
    pub max_retries: u32,
    /// The backoff before the first retry.
    pub initial_backoff: Duration,
    /// The cap on any backoff. A provider asking (via retry-after) for a longer wait than this
    /// is not retried: the error is returned at once, carrying its `retry_after`.
    pub max_backoff: Duration,
    /// Factor between consecutive backoffs (values below 1, or not finite, count as 1).
    pub multiplier: f64,
    /// Whether each backoff is drawn uniformly from its upper half `[b/2, b]`.
    pub jitter: bool,
    /// Seeds the jitter; fixed seeds give reproducible delays.
    pub seed: u64,
}

impl RetryPolicy {
    /// The policy of a `retry` section, with a seed that differs between executors (so that
    /// clients do not retry in lockstep).
    pub fn from_config(config: &RetryConfig) -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self {
            max_retries: config.max_retries,
            initial_backoff: config.initial_backoff.get(),
            max_backoff: config.max_backoff.get(),
            multiplier: config.multiplier,
            jitter: config.jitter,
            seed: nanos
                ^ COUNTER
                    .fetch_add(1, Ordering::Relaxed)
                    .wrapping_mul(0x9E37_79B9),
        }
    }

    /// Sets the jitter seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The backoff before retry number `retry` (0 is the first retry) without jitter:
    /// `initial_backoff * multiplier^retry`, capped at `max_backoff`.
    pub fn base_backoff(&self, retry: u32) -> Duration {
        let multiplier = if self.multiplier.is_finite() && self.multiplier >= 1.0 {
            self.multiplier
        } else {
            1.0
        };
        let cap = self.max_backoff.as_secs_f64();
        let raw = self.initial_backoff.as_secs_f64() * multiplier.powi(retry.min(1024) as i32);
        if !raw.is_finite() || raw >= cap {
            self.max_backoff
        } else {
            Duration::try_from_secs_f64(raw).unwrap_or(self.max_backoff)
        }
    }

    /// The backoff before retry number `retry`, with jitter when enabled. `salt` tells apart
    /// independent calls sharing the policy.
    pub fn backoff(&self, retry: u32, salt: u64) -> Duration {
        let base = self.base_backoff(retry);
        if !self.jitter {
            return base;
        }
        let r = splitmix64(self.seed ^ splitmix64(salt) ^ u64::from(retry).rotate_left(32));
        // Uniform fraction in [0, 1) from the top 53 bits.
        let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
        base.mul_f64(0.5 + 0.5 * unit)
    }

    /// What to do after `error` when `retries_done` retries were already made: `Some(delay)`
    /// to wait and call again, `None` to give up and return the error. Permanent errors,
    /// cancellation, exhausted retries and a retry-after longer than `max_backoff` give up.
    /// The delay is the longer of the backoff and the provider's retry-after.
    pub fn delay_after(
        &self,
        retries_done: u32,
        error: &InferenceExecutionError,
        salt: u64,
    ) -> Option<Duration> {
        if !error.is_retryable() || retries_done >= self.max_retries {
            return None;
        }
        let backoff = self.backoff(retries_done, salt);
        match error.retry_after() {
            Some(after) if after > self.max_backoff => None,
            Some(after) => Some(after.max(backoff)),
            None => Some(backoff),
        }
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Wraps an executor and retries its retryable errors.
///
/// A call that fails before its stream yielded any event is retried after a backoff (see
/// [`RetryPolicy::delay_after`]), at most `max_retries` times. Once an event was yielded,
/// the stream is passed through unchanged and a later error is returned as it is: the partial
/// output was already seen by the caller, so calling again would duplicate it. Permanent
/// errors and cancellation are never retried. Backoffs use `tokio::time::sleep`, so dropping
/// the stream during one cancels the wait.
pub struct RetryingExecutor {
    inner: Arc<dyn LlmExecutor>,
    policy: RetryPolicy,
    calls: AtomicU64,
}

impl std::fmt::Debug for RetryingExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryingExecutor")
            .field("inner", &self.inner.name())
            .field("policy", &self.policy)
            .finish()
    }
}

impl RetryingExecutor {
    /// Wraps `inner` with the policy of a `retry` section.
    pub fn new(inner: Arc<dyn LlmExecutor>, config: &RetryConfig) -> Self {
        Self::with_policy(inner, RetryPolicy::from_config(config))
    }

    /// Wraps `inner` with an explicit policy.
    pub fn with_policy(inner: Arc<dyn LlmExecutor>, policy: RetryPolicy) -> Self {
        Self {
            inner,
            policy,
            calls: AtomicU64::new(0),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The wrapped executor.
    pub fn inner(&self) -> &Arc<dyn LlmExecutor> {
        &self.inner
    }
}

impl LlmExecutor for RetryingExecutor {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let inner = Arc::clone(&self.inner);
        let policy = self.policy.clone();
        let salt = self.calls.fetch_add(1, Ordering::Relaxed);
        let first = async move {
            let mut retries = 0u32;
            loop {
                let mut attempt = inner.execute_stream(request.clone());
                match attempt.next().await {
                    Some(Ok(event)) => {
                        return stream::once(async move { Ok(event) })
                            .chain(attempt)
                            .boxed();
                    }
                    None => return attempt,
                    Some(Err(error)) => {
                        drop(attempt);
                        let Some(delay) = policy.delay_after(retries, &error, salt) else {
                            return stream::once(async move { Err(error) }).boxed();
                        };
                        retries += 1;
                        tracing::warn!(
                            executor = inner.name(),
                            retry = retries,
                            max_retries = policy.max_retries,
                            delay_ms = delay.as_millis() as u64,
                            error = %error,
                            "retrying inference"
                        );
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        };
        stream::once(first).flatten().boxed()
    }
}
