//! Bad configuration is a typed error naming the variable, before anything is started, and
//! never shows a header value.

use awaken_otel::{HeaderProblem, OtelConfig, OtelError};

fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    }
}

#[test]
fn a_bad_header_list_is_a_typed_error_naming_the_variable_and_entry() {
    let error = OtelConfig::from_vars(vars(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-tenant=blue,authorization=Bearer sk-test-secret-123%G1",
        ),
    ]))
    .expect_err("a `%G1` is not percent-encoding");
    match &error {
        OtelError::InvalidHeader {
            setting,
            entry,
            problem,
        } => {
            assert_eq!(*setting, "OTEL_EXPORTER_OTLP_HEADERS");
            assert_eq!(*entry, 2);
            assert_eq!(
                *problem,
                HeaderProblem::BadPercentEncoding {
                    name: "authorization".to_owned()
                }
            );
        }
        other => panic!("not a header error: {other:?}"),
    }
    let shown = format!("{error} {error:?}");
    assert!(!shown.contains("sk-test"), "{shown}");
    assert_eq!(
        error.to_string(),
        "OTEL_EXPORTER_OTLP_HEADERS: entry 2 (`authorization`) has a `%` not followed by two \
         hexadecimal digits in its value"
    );

    // A bare token (a credential pasted without its name) is refused without being shown.
    let error = OtelConfig::from_vars(vars(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "sk-test-secret-123"),
    ]))
    .expect_err("an entry needs a name");
    assert!(
        matches!(
            error,
            OtelError::InvalidHeader {
                entry: 1,
                problem: HeaderProblem::MissingEquals,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(!error.to_string().contains("sk-test"), "{error}");
}

#[test]
fn a_bad_endpoint_names_its_variable() {
    let error = OtelConfig::from_vars(vars(&[(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "grpc://127.0.0.1:4317",
    )]))
    .expect_err("not http");
    assert!(
        matches!(
            &error,
            OtelError::EndpointScheme { setting: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", scheme }
                if scheme == "grpc"
        ),
        "{error:?}"
    );
}

#[test]
fn without_an_endpoint_or_when_disabled_there_is_no_export() {
    let none = OtelConfig::from_vars(vars(&[("OTEL_SERVICE_NAME", "svc")])).expect("valid");
    assert!(none.is_none());
    let disabled = OtelConfig::from_vars(vars(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
        ("OTEL_SDK_DISABLED", "true"),
    ]))
    .expect("valid");
    assert!(disabled.is_none());
}
