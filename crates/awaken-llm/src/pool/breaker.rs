//! The circuit breaker each pool member has, and the clock it reads.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The consecutive failures that open a breaker by default.
pub const DEFAULT_FAILURES_TO_OPEN: u32 = 5;

/// How long an open breaker rejects requests by default.
pub const DEFAULT_COOL_DOWN: Duration = Duration::from_secs(30);

/// Where a [`crate::ModelPool`] reads the time for its breakers' cool-downs.
///
/// Called once per member a request considers and once per settled attempt; it must be cheap
/// and never go backwards. [`SystemClock`] is the real one; tests supply a clock they advance
/// by hand, so no test sleeps.
pub trait PoolClock: Send + Sync {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The system's monotonic clock ([`Instant::now`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl PoolClock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// When a member's breaker opens and how long it stays open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Consecutive failures that open the breaker (at least 1).
    pub failures_to_open: u32,
    /// How long an open breaker rejects requests before it lets one trial through.
    pub cool_down: Duration,
}

impl Default for BreakerPolicy {
    /// [`DEFAULT_FAILURES_TO_OPEN`] failures, [`DEFAULT_COOL_DOWN`].
    fn default() -> Self {
        Self {
            failures_to_open: DEFAULT_FAILURES_TO_OPEN,
            cool_down: DEFAULT_COOL_DOWN,
        }
    }
}

impl BreakerPolicy {
    /// Sets the consecutive failures that open the breaker.
    pub fn with_failures_to_open(mut self, failures: u32) -> Self {
        self.failures_to_open = failures;
        self
    }

    /// Sets the cool-down.
    pub fn with_cool_down(mut self, cool_down: Duration) -> Self {
        self.cool_down = cool_down;
        self
    }
}

/// A member's breaker as [`crate::ModelPool::breaker_state`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BreakerState {
    /// Requests go through; this many failures in a row so far.
    Closed {
        /// Failures since the last success (or since the breaker closed).
        consecutive_failures: u32,
    },
    /// Requests skip the member until the cool-down has passed.
    Open {
        /// The rest of the cool-down.
        remaining: Duration,
    },
    /// The cool-down has passed: the next request is the member's one trial.
    HalfOpen {
        /// Whether the trial is under way (other requests skip the member meanwhile).
        trial_in_flight: bool,
    },
}

/// How a request was let through a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The breaker is closed.
    Normal,
    /// The one trial of a half-open breaker.
    Trial,
}

/// What an attempt on a member came to, as the breaker counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The stream reached `Stop`.
    Success,
    /// A failover error, or any error but cancellation after the first event.
    Failure,
    /// Neither: the request's own fault, cancellation, or a dropped stream.
    Neutral,
}

/// What an outcome did to the breaker, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    None,
    Opened,
    Reopened,
    Closed,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Closed { failures: u32 },
    Open { since: Instant },
    HalfOpen { trial_in_flight: bool },
}

/// One member's breaker: Closed → Open after `failures_to_open` consecutive failures; Open
/// rejects until the cool-down passed; then HalfOpen lets one trial through, whose success
/// closes it and whose failure opens it again with a fresh cool-down.
#[derive(Debug)]
pub(crate) struct Breaker {
    state: Mutex<State>,
}

impl Breaker {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a plain value, always whole: a poisoned lock still holds a valid one.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lets a request through, or says for how long the member stays closed to it (`None`
    /// while a trial is under way).
    pub(crate) fn admit(
        &self,
        policy: &BreakerPolicy,
        now: Instant,
    ) -> Result<Admission, Option<Duration>> {
        let mut state = self.lock();
        match *state {
            State::Closed { .. } => Ok(Admission::Normal),
            State::Open { since } => {
                let elapsed = now.saturating_duration_since(since);
                if elapsed >= policy.cool_down {
                    *state = State::HalfOpen {
                        trial_in_flight: true,
                    };
                    Ok(Admission::Trial)
                } else {
                    Err(Some(policy.cool_down - elapsed))
                }
            }
            State::HalfOpen {
                trial_in_flight: true,
            } => Err(None),
            State::HalfOpen {
                trial_in_flight: false,
            } => {
                *state = State::HalfOpen {
                    trial_in_flight: true,
                };
                Ok(Admission::Trial)
            }
        }
    }

    /// Records the outcome of an attempt admitted as `admission`. Outcomes of normal attempts
    /// count only while the breaker is closed: once it opened, only its trial decides.
    pub(crate) fn record(
        &self,
        admission: Admission,
        outcome: Outcome,
        policy: &BreakerPolicy,
        now: Instant,
    ) -> Transition {
        let mut state = self.lock();
        match (admission, *state, outcome) {
            (Admission::Normal, State::Closed { .. }, Outcome::Success) => {
                *state = State::Closed { failures: 0 };
                Transition::None
            }
            (Admission::Normal, State::Closed { failures }, Outcome::Failure) => {
                let failures = failures.saturating_add(1);
                if failures >= policy.failures_to_open {
                    *state = State::Open { since: now };
                    Transition::Opened
                } else {
                    *state = State::Closed { failures };
                    Transition::None
                }
            }
            (Admission::Trial, State::HalfOpen { .. }, Outcome::Success) => {
                *state = State::Closed { failures: 0 };
                Transition::Closed
            }
            (Admission::Trial, State::HalfOpen { .. }, Outcome::Failure) => {
                *state = State::Open { since: now };
                Transition::Reopened
            }
            // The trial told nothing: the next request makes another.
            (Admission::Trial, State::HalfOpen { .. }, Outcome::Neutral) => {
                *state = State::HalfOpen {
                    trial_in_flight: false,
                };
                Transition::None
            }
            _ => Transition::None,
        }
    }

    /// The state as seen at `now` (an open breaker whose cool-down passed is half-open).
    pub(crate) fn state(&self, policy: &BreakerPolicy, now: Instant) -> BreakerState {
        match *self.lock() {
            State::Closed { failures } => BreakerState::Closed {
                consecutive_failures: failures,
            },
            State::Open { since } => {
                let elapsed = now.saturating_duration_since(since);
                if elapsed >= policy.cool_down {
                    BreakerState::HalfOpen {
                        trial_in_flight: false,
                    }
                } else {
                    BreakerState::Open {
                        remaining: policy.cool_down - elapsed,
                    }
                }
            }
            State::HalfOpen { trial_in_flight } => BreakerState::HalfOpen { trial_in_flight },
        }
    }
}
