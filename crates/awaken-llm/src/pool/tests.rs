//! Unit tests of the rendezvous hash, the failover classification and the breaker's states.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use expect_test::expect;

use super::breaker::{Admission, Breaker, BreakerPolicy, BreakerState, Outcome, Transition};
use super::rendezvous::{FNV_OFFSET_BASIS, KeyHash, fmix64, fnv1a, score};
use super::{PoolError, is_failover_error, pool_context_window};
use crate::error::{ConnectionAttempt, ConnectionFailure, InferenceExecutionError as E};

#[test]
fn fnv1a_matches_the_published_test_vectors() {
    assert_eq!(fnv1a(FNV_OFFSET_BASIS, b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(FNV_OFFSET_BASIS, b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a(FNV_OFFSET_BASIS, b"foobar"), 0x8594_4171_f739_67e8);
    assert_eq!(fmix64(0), 0);
}

#[test]
fn member_hashes_are_pinned() {
    // The ranking must not change between releases: a thread would move to another member
    // (and lose its prompt cache) on upgrade. These values are the contract.
    let mut out = String::new();
    for (key, member) in [
        ("thread-1", "gpt-4o"),
        ("thread-1", "claude"),
        ("thread-2", "gpt-4o"),
        ("", ""),
    ] {
        let hash = KeyHash::new(key).member_hash(member);
        let _ = writeln!(out, "{key:?} {member:?} {hash:#018x}");
    }
    expect![[r#"
        "thread-1" "gpt-4o" 0xed3528b664ea926c
        "thread-1" "claude" 0xa32518cbd12da51d
        "thread-2" "gpt-4o" 0x9799c6d243906555
        "" "" 0x1bbd5c813c69a8d7
    "#]]
    .assert_eq(&out);
}

#[test]
fn the_separator_keeps_key_and_member_apart() {
    // ("ab", "c") and ("a", "bc") concatenate alike; the separator tells them apart.
    assert_ne!(
        KeyHash::new("ab").member_hash("c"),
        KeyHash::new("a").member_hash("bc")
    );
}

#[test]
fn scores_are_positive_finite_and_grow_with_the_weight() {
    for hash in [0, 1, 1 << 12, u64::MAX >> 1, u64::MAX - 1, u64::MAX] {
        let mut last = 0.0;
        for weight in [1, 2, 3, 100, u32::MAX] {
            let s = score(hash, weight);
            assert!(
                s.is_finite() && s > 0.0,
                "hash {hash:#x} weight {weight}: {s}"
            );
            assert!(s > last, "hash {hash:#x} weight {weight}: {s} <= {last}");
            last = s;
        }
    }
    // A larger hash is a larger `u`, hence a larger score.
    assert!(score(u64::MAX, 1) > score(u64::MAX >> 1, 1));
    assert!(score(u64::MAX >> 1, 1) > score(0, 1));
}

#[test]
fn every_error_has_its_failover_rule() {
    let connection = E::Connection {
        url: "http://127.0.0.1:9/v1/chat/completions".into(),
        attempt: Box::new(ConnectionAttempt::new(
            "127.0.0.1",
            9,
            ConnectionFailure::Refused,
        )),
        source: "refused".into(),
    };
    let cases = [
        E::RateLimited {
            retry_after: None,
            message: String::new(),
        },
        E::Overloaded {
            status: 529,
            retry_after: None,
            message: String::new(),
        },
        E::Timeout {
            after: Duration::from_secs(1),
            waiting_for: "response headers",
        },
        E::interrupted("cut"),
        E::ServerError {
            status: Some(500),
            message: String::new(),
        },
        connection,
        E::Unauthorized {
            status: 401,
            message: String::new(),
        },
        E::ModelNotFound {
            model: "m".into(),
            message: String::new(),
        },
        E::EndpointNotFound {
            url: "http://127.0.0.1/chat/completions".into(),
            message: String::new(),
        },
        E::InvalidRequest {
            status: Some(400),
            message: String::new(),
        },
        E::ContextOverflow {
            message: String::new(),
        },
        E::ContentFiltered {
            message: String::new(),
        },
        E::malformed("bad", "{", None),
        E::ScriptExhausted { turns: 1 },
        E::Config {
            field: "base_url",
            reason: String::new(),
        },
        E::Cancelled,
    ];
    let mut out = String::new();
    for error in &cases {
        let variant = format!("{error:?}");
        let variant = variant
            .split(|c: char| !c.is_alphanumeric())
            .next()
            .unwrap_or_default();
        let _ = writeln!(out, "{variant}: {}", is_failover_error(error));
    }
    expect![[r#"
        RateLimited: true
        Overloaded: true
        Timeout: true
        StreamInterrupted: true
        ServerError: true
        Connection: true
        Unauthorized: true
        ModelNotFound: true
        EndpointNotFound: true
        InvalidRequest: false
        ContextOverflow: false
        ContentFiltered: false
        MalformedResponse: false
        ScriptExhausted: false
        Config: false
        Cancelled: false
    "#]]
    .assert_eq(&out);
}

fn policy(failures: u32, cool_down_s: u64) -> BreakerPolicy {
    BreakerPolicy::default()
        .with_failures_to_open(failures)
        .with_cool_down(Duration::from_secs(cool_down_s))
}

#[test]
fn the_breaker_opens_after_consecutive_failures_and_a_success_resets_the_count() {
    let p = policy(3, 30);
    let t0 = Instant::now();
    let b = Breaker::new();
    let fail = |b: &Breaker| b.record(Admission::Normal, Outcome::Failure, &p, t0);
    assert_eq!(fail(&b), Transition::None);
    assert_eq!(fail(&b), Transition::None);
    assert_eq!(
        b.state(&p, t0),
        BreakerState::Closed {
            consecutive_failures: 2
        }
    );
    b.record(Admission::Normal, Outcome::Success, &p, t0);
    assert_eq!(fail(&b), Transition::None);
    assert_eq!(fail(&b), Transition::None);
    // Neutral outcomes neither count nor reset.
    b.record(Admission::Normal, Outcome::Neutral, &p, t0);
    assert_eq!(fail(&b), Transition::Opened);
    assert_eq!(
        b.admit(&p, t0 + Duration::from_secs(10)),
        Err(Some(Duration::from_secs(20)))
    );
}

#[test]
fn a_half_open_breaker_lets_one_trial_through() {
    let p = policy(1, 30);
    let t0 = Instant::now();
    let later = t0 + Duration::from_secs(30);
    let b = Breaker::new();
    assert_eq!(
        b.record(Admission::Normal, Outcome::Failure, &p, t0),
        Transition::Opened
    );
    assert_eq!(
        b.admit(&p, t0 + Duration::from_millis(29_999)),
        Err(Some(Duration::from_millis(1)))
    );
    assert_eq!(
        b.state(&p, later),
        BreakerState::HalfOpen {
            trial_in_flight: false
        }
    );
    assert_eq!(b.admit(&p, later), Ok(Admission::Trial));
    assert_eq!(b.admit(&p, later), Err(None), "a second request skips it");
    // An outcome of a request admitted before the breaker opened changes nothing now.
    b.record(Admission::Normal, Outcome::Success, &p, later);
    assert_eq!(
        b.state(&p, later),
        BreakerState::HalfOpen {
            trial_in_flight: true
        }
    );
    // A neutral trial frees the slot for the next request.
    b.record(Admission::Trial, Outcome::Neutral, &p, later);
    assert_eq!(b.admit(&p, later), Ok(Admission::Trial));
    // A failed trial reopens with a fresh cool-down.
    assert_eq!(
        b.record(Admission::Trial, Outcome::Failure, &p, later),
        Transition::Reopened
    );
    assert_eq!(
        b.admit(&p, later + Duration::from_secs(29)),
        Err(Some(Duration::from_secs(1)))
    );
    let again = later + Duration::from_secs(30);
    assert_eq!(b.admit(&p, again), Ok(Admission::Trial));
    assert_eq!(
        b.record(Admission::Trial, Outcome::Success, &p, again),
        Transition::Closed
    );
    assert_eq!(
        b.state(&p, again),
        BreakerState::Closed {
            consecutive_failures: 0
        }
    );
    assert_eq!(b.admit(&p, again), Ok(Admission::Normal));
}

#[test]
fn the_pool_window_is_the_smallest_member_window() {
    assert_eq!(
        pool_context_window([Some(200_000), Some(128_000), None]),
        Some(128_000)
    );
    assert_eq!(pool_context_window([None, Some(8_192)]), Some(8_192));
    assert_eq!(pool_context_window([None, None]), None);
    assert_eq!(pool_context_window([]), None);
}

#[test]
fn pool_errors_name_the_pool_and_the_member() {
    let errors = [
        PoolError::BlankPoolId,
        PoolError::NoMembers {
            pool: "smart".into(),
        },
        PoolError::BlankMemberId {
            pool: "smart".into(),
            index: 1,
        },
        PoolError::DuplicateMember {
            pool: "smart".into(),
            member: "gpt".into(),
        },
        PoolError::BlankUpstreamModel {
            pool: "smart".into(),
            member: "gpt".into(),
        },
        PoolError::ZeroWeight {
            pool: "smart".into(),
            member: "gpt".into(),
        },
        PoolError::NoPrimaryMember {
            pool: "smart".into(),
        },
        PoolError::ZeroFailuresToOpen {
            pool: "smart".into(),
        },
    ];
    let out: String = errors.iter().map(|e| format!("{e}\n")).collect();
    expect![[r#"
        a model pool's id must not be blank
        model pool `smart` has no members
        model pool `smart`: members[1] has a blank id
        model pool `smart` lists member `gpt` twice
        model pool `smart`: member `gpt` has a blank upstream_model
        model pool `smart`: member `gpt` has weight 0 (weights start at 1)
        model pool `smart`: every member is fallback-only; at least one must take traffic first
        model pool `smart`: the breaker's failures_to_open is 0 (it must be at least 1)
    "#]]
    .assert_eq(&out);
}
