//! Unit tests of private helpers and the error classification.

use std::time::Duration;

use crate::error::{ErrorClass, InferenceExecutionError as E, truncate};

#[test]
fn truncate_never_splits_a_character() {
    assert_eq!(truncate("héllo", 2), "h");
    assert_eq!(truncate("héllo", 3), "hé");
    assert_eq!(truncate("😀😀", 5), "😀");
    assert_eq!(truncate("abc", 10), "abc");
    assert_eq!(truncate("😀", 0), "");
}

#[test]
fn every_error_has_its_class() {
    let after = Some(Duration::from_secs(2));
    let cases: Vec<(E, ErrorClass, Option<Duration>)> = vec![
        (
            E::RateLimited {
                retry_after: after,
                message: String::new(),
            },
            ErrorClass::Retryable,
            after,
        ),
        (
            E::Overloaded {
                status: 503,
                retry_after: after,
                message: String::new(),
            },
            ErrorClass::Retryable,
            after,
        ),
        (
            E::Timeout {
                after: Duration::from_secs(1),
                waiting_for: "response headers",
            },
            ErrorClass::Retryable,
            None,
        ),
        (E::interrupted("cut"), ErrorClass::Retryable, None),
        (
            E::ServerError {
                status: Some(500),
                message: String::new(),
            },
            ErrorClass::Retryable,
            None,
        ),
        (
            E::Connection {
                url: "http://127.0.0.1/".into(),
                source: "refused".into(),
            },
            ErrorClass::Retryable,
            None,
        ),
        (
            E::InvalidRequest {
                status: Some(400),
                message: String::new(),
            },
            ErrorClass::Permanent,
            None,
        ),
        (
            E::Unauthorized {
                status: 401,
                message: String::new(),
            },
            ErrorClass::Permanent,
            None,
        ),
        (
            E::ModelNotFound {
                model: "m".into(),
                message: String::new(),
            },
            ErrorClass::Permanent,
            None,
        ),
        (
            E::ContextOverflow {
                message: String::new(),
            },
            ErrorClass::Permanent,
            None,
        ),
        (
            E::ContentFiltered {
                message: String::new(),
            },
            ErrorClass::Permanent,
            None,
        ),
        (E::malformed("bad", "{", None), ErrorClass::Permanent, None),
        (E::ScriptExhausted { turns: 2 }, ErrorClass::Permanent, None),
        (
            E::Config {
                field: "base_url",
                reason: String::new(),
            },
            ErrorClass::Permanent,
            None,
        ),
        (E::Cancelled, ErrorClass::Cancelled, None),
    ];
    for (error, class, retry_after) in cases {
        assert_eq!(error.class(), class, "{error:?}");
        assert_eq!(
            error.is_retryable(),
            class == ErrorClass::Retryable,
            "{error:?}"
        );
        assert_eq!(
            error.is_cancelled(),
            class == ErrorClass::Cancelled,
            "{error:?}"
        );
        assert_eq!(error.retry_after(), retry_after, "{error:?}");
    }
}
