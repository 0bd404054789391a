//! What each in-process run goes through: its shape (loop-5 or loop-50) and at most one fault,
//! drawn from the seeded generator. The first runs of each store take every fault in turn, so
//! even a short soak exercises each kind and each store failpoint.

use awaken_store::FailPoint;

use crate::rng::Rng;

/// The agent a run uses: `n` steps, `n − 1` of them calling tools, then the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Shape {
    /// Five steps.
    Loop5,
    /// Fifty steps.
    Loop50,
}

impl Shape {
    /// Both shapes, in the summary's order.
    pub(crate) const ALL: [Shape; 2] = [Shape::Loop5, Shape::Loop50];

    /// The number of inferences a run of this shape makes when nothing goes wrong.
    pub(crate) fn steps(self) -> u32 {
        match self {
            Shape::Loop5 => 5,
            Shape::Loop50 => 50,
        }
    }

    /// The agent's id (and the summary's name of the shape).
    pub(crate) fn agent(self) -> &'static str {
        match self {
            Shape::Loop5 => "loop-5",
            Shape::Loop50 => "loop-50",
        }
    }

    /// One in ten runs is a loop-50.
    pub(crate) fn draw(rng: &mut Rng) -> Shape {
        if rng.chance(100) {
            Shape::Loop50
        } else {
            Shape::Loop5
        }
    }
}

/// Retries the agents' `retry` section allows: a retryable error repeated this often is
/// survived, once more is not.
pub(crate) const MAX_RETRIES: u32 = 2;

/// A run's fault. Positions (`step`, `at_event`, `at_commit`) count from 0, 0 and 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Nothing goes wrong: the run must end naturally after all its steps.
    None,
    /// The run's token is cancelled when the sink receives event number `at_event` (0: before
    /// the run starts; at or past the run's last event: never).
    Cancel {
        /// The event at which the token is cancelled.
        at_event: u32,
    },
    /// Commit number `at_commit` of the run fails at `point` (the store's failpoint, armed just
    /// before that commit).
    Store {
        /// Which commit of the run fails (1: the run's first).
        at_commit: u32,
        /// Where inside it.
        point: FailPoint,
    },
    /// The provider fails `times` times in a row at `step` with a retryable error: up to
    /// [`MAX_RETRIES`] is retried away, more fails the run.
    Retryable {
        /// The step.
        step: u32,
        /// How many calls in a row fail.
        times: u32,
    },
    /// The provider rejects the request at `step` (a permanent error: never retried).
    Permanent {
        /// The step.
        step: u32,
    },
    /// The provider's stream breaks off after its first event at `step` (not retried: the
    /// caller saw part of it).
    MidStream {
        /// The step.
        step: u32,
    },
    /// The provider stalls at `step` (its stream stops yielding); after `turns` scheduler
    /// turns the soak cancels the run.
    StallCancel {
        /// The step.
        step: u32,
        /// How long the stall lasts before the cancellation.
        turns: u32,
    },
    /// The provider stalls at `step` and, after `turns` turns, gives up with a timeout (a
    /// retryable error: the retry goes through).
    StallTimeout {
        /// The step.
        step: u32,
        /// How long the stall lasts.
        turns: u32,
    },
    /// The provider stalls at `step` and, after `turns` turns, the caller gives up on the run
    /// and drops it; recovery finishes it.
    StallDrop {
        /// The step.
        step: u32,
        /// How long the stall lasts.
        turns: u32,
    },
}

/// The kinds of fault, as the summary counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum FaultKind {
    /// No fault.
    None,
    /// A random cancellation.
    Cancel,
    /// A store fault (counted per failpoint and store as well).
    Store,
    /// Retryable provider errors that the retries absorb.
    RetryableRecovered,
    /// Retryable provider errors beyond the retries.
    RetryableExhausted,
    /// A permanent provider error.
    Permanent,
    /// A stream broken off after its first event.
    MidStream,
    /// A stall ended by a cancellation.
    StallCancel,
    /// A stall ended by the provider's timeout error.
    StallTimeout,
    /// A stall after which the caller dropped the run (then recovered).
    StallDrop,
}

impl FaultKind {
    /// Every kind, in the summary's order.
    pub(crate) const ALL: [FaultKind; 10] = [
        FaultKind::None,
        FaultKind::Cancel,
        FaultKind::Store,
        FaultKind::RetryableRecovered,
        FaultKind::RetryableExhausted,
        FaultKind::Permanent,
        FaultKind::MidStream,
        FaultKind::StallCancel,
        FaultKind::StallTimeout,
        FaultKind::StallDrop,
    ];

    /// The summary's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            FaultKind::None => "none",
            FaultKind::Cancel => "cancellation",
            FaultKind::Store => "store fault",
            FaultKind::RetryableRecovered => "provider: retryable, retried away",
            FaultKind::RetryableExhausted => "provider: retryable, retries exhausted",
            FaultKind::Permanent => "provider: permanent",
            FaultKind::MidStream => "provider: broken stream",
            FaultKind::StallCancel => "provider stall, then cancelled",
            FaultKind::StallTimeout => "provider stall, then its timeout",
            FaultKind::StallDrop => "provider stall, then dropped and recovered",
        }
    }
}

impl Fault {
    /// Its kind.
    pub(crate) fn kind(self) -> FaultKind {
        match self {
            Fault::None => FaultKind::None,
            Fault::Cancel { .. } => FaultKind::Cancel,
            Fault::Store { .. } => FaultKind::Store,
            Fault::Retryable { times, .. } if times <= MAX_RETRIES => FaultKind::RetryableRecovered,
            Fault::Retryable { .. } => FaultKind::RetryableExhausted,
            Fault::Permanent { .. } => FaultKind::Permanent,
            Fault::MidStream { .. } => FaultKind::MidStream,
            Fault::StallCancel { .. } => FaultKind::StallCancel,
            Fault::StallTimeout { .. } => FaultKind::StallTimeout,
            Fault::StallDrop { .. } => FaultKind::StallDrop,
        }
    }
}

/// What a fault-free run of a shape looked like on a store: where faults can land.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Extent {
    /// Its commits.
    pub(crate) commits: u32,
    /// Its events.
    pub(crate) events: u32,
}

/// The length of the forced rotation each store starts with: every kind, every failpoint
/// (slots 2–5), and among those the first and the last commit.
pub(crate) const ROTATION: usize = 13;

/// Draws the fault of a run of `shape`, whose fault-free extent is `extent`: rotation slot
/// `forced` (below [`ROTATION`]) when given, else at random.
pub(crate) fn draw(rng: &mut Rng, forced: Option<usize>, shape: Shape, extent: Extent) -> Fault {
    let steps = shape.steps();
    let step = |rng: &mut Rng| rng.below(u64::from(steps)) as u32;
    let turns = |rng: &mut Rng| rng.between(1, 64);
    let commit = |rng: &mut Rng| rng.between(1, extent.commits.max(1));
    let points = FailPoint::all();
    let choice = forced.unwrap_or_else(|| match rng.below(1000) {
        0..250 => 0,
        250..400 => 1,
        400..600 => 2 + rng.below(points.len() as u64) as usize,
        600..700 => 6,
        700..750 => 7,
        750..800 => 8,
        800..850 => 9,
        850..900 => 10,
        900..950 => 11,
        _ => 12,
    });
    match choice {
        0 => Fault::None,
        1 => Fault::Cancel {
            at_event: rng.below(u64::from(extent.events.max(1)) + 1) as u32,
        },
        2..=5 => Fault::Store {
            // In the rotation the first and the last commit come up for certain.
            at_commit: match forced {
                Some(2) => 1,
                Some(5) => extent.commits.max(1),
                _ => commit(rng),
            },
            point: points[choice - 2],
        },
        6 => Fault::Retryable {
            step: step(rng),
            times: rng.between(1, MAX_RETRIES),
        },
        7 => Fault::Retryable {
            step: step(rng),
            times: MAX_RETRIES + 1,
        },
        8 => Fault::Permanent { step: step(rng) },
        9 => Fault::MidStream { step: step(rng) },
        10 => Fault::StallCancel {
            step: step(rng),
            turns: turns(rng),
        },
        11 => Fault::StallTimeout {
            step: step(rng),
            turns: turns(rng),
        },
        _ => Fault::StallDrop {
            step: step(rng),
            turns: turns(rng),
        },
    }
}
