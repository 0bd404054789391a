//! Unit tests of private helpers and the error classification.

use std::time::Duration;

use std::io;

use expect_test::expect;

use crate::error::{
    BoxError, ConnectionAttempt, ConnectionFailure, ErrorClass, InferenceExecutionError as E,
    truncate,
};

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
                attempt: Box::new(ConnectionAttempt::new(
                    "127.0.0.1",
                    80,
                    ConnectionFailure::Refused,
                )),
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
            E::EndpointNotFound {
                url: "http://127.0.0.1/chat/completions".into(),
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

/// An error with a message and an optional source, standing in for a transport's layers.
#[derive(Debug)]
struct Layer(&'static str, Option<BoxError>);

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Layer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.1.as_deref().map(|e| e as _)
    }
}

/// `inner` under the layers reqwest and hyper put around a connector's error.
fn sent(inner: impl Into<BoxError>) -> BoxError {
    let connect = Layer("client error (Connect)", Some(inner.into()));
    Box::new(Layer("error sending request", Some(Box::new(connect))))
}

#[test]
fn transport_errors_are_classified_by_their_source_chain() {
    let cases: Vec<(&str, BoxError)> = vec![
        (
            "127.0.0.1",
            sent(Layer(
                "tcp connect error",
                Some(Box::new(io::Error::from(io::ErrorKind::ConnectionRefused))),
            )),
        ),
        (
            "nosuch.invalid",
            sent(Layer(
                "dns error",
                Some(Box::new(io::Error::other(
                    "failed to lookup address information: Name or service not known",
                ))),
            )),
        ),
        (
            "api.example.com",
            // rustls' error, as tokio-rustls and hyper-rustls wrap it.
            sent(io::Error::other(io::Error::new(
                io::ErrorKind::InvalidData,
                Layer("invalid peer certificate: UnknownIssuer", None),
            ))),
        ),
        ("10.0.0.1", sent(Layer("operation timed out", None))),
        (
            "127.0.0.1",
            sent(io::Error::other(io::Error::from(
                io::ErrorKind::ConnectionReset,
            ))),
        ),
        ("127.0.0.1", sent(Layer("something else", None))),
    ];
    let mut out = String::new();
    for (host, source) in cases {
        let kind = ConnectionFailure::classify(source.as_ref());
        let error = E::Connection {
            url: format!("https://{host}/v1/chat/completions"),
            attempt: Box::new(ConnectionAttempt::new(host, 443, kind)),
            source,
        };
        assert!(error.is_retryable(), "{error}");
        out.push_str(&format!("{kind:?}: {error}\n"));
    }
    expect![[r#"
        Refused: could not reach the provider at https://127.0.0.1/v1/chat/completions: connection refused by 127.0.0.1:443 (is the server running?)
        Dns: could not reach the provider at https://nosuch.invalid/v1/chat/completions: cannot resolve host "nosuch.invalid" (DNS): failed to lookup address information: Name or service not known
        Tls: could not reach the provider at https://api.example.com/v1/chat/completions: TLS handshake with api.example.com:443 failed: invalid peer certificate: UnknownIssuer
        TimedOut: could not reach the provider at https://10.0.0.1/v1/chat/completions: connecting to 10.0.0.1:443 timed out
        Reset: could not reach the provider at https://127.0.0.1/v1/chat/completions: the connection to 127.0.0.1:443 was closed before a response: connection reset
        Other: could not reach the provider at https://127.0.0.1/v1/chat/completions: sending the request to 127.0.0.1:443 failed: something else
    "#]].assert_eq(&out);
}

#[test]
fn a_stream_item_stays_as_small_as_its_event() {
    // Every item of an inference stream is as large as the largest error: rare errors box their
    // details so the step's hot path moves no more bytes per event than the event needs.
    use crate::event::LlmStreamEvent;
    assert!(size_of::<E>() <= 56, "{}", size_of::<E>());
    assert!(
        size_of::<Result<LlmStreamEvent, E>>() <= 56,
        "{}",
        size_of::<Result<LlmStreamEvent, E>>()
    );
}
