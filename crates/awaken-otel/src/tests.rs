//! The configuration read from the variables: endpoints per signal, headers, protocol and the
//! errors for values that cannot be used.

use std::fmt::Write as _;

use expect_test::expect;

use crate::config::parse_headers;
use crate::{OtelConfig, OtelError};

/// The configuration `vars` describe, as one line (or the error).
fn configured(vars: &[(&str, &str)]) -> String {
    let lookup = |name: &str| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    };
    match OtelConfig::from_vars(lookup) {
        Ok(None) => "disabled".to_owned(),
        Ok(Some(c)) => format!(
            "traces={} metrics={} protocol={} service={} timeout={:?} headers={:?}",
            c.traces_endpoint().map_or("-", |u| u.as_str()),
            c.metrics_endpoint().map_or("-", |u| u.as_str()),
            c.protocol().as_str(),
            c.service_name(),
            c.timeout(),
            c.headers(),
        ),
        Err(e) => format!("error: {e}"),
    }
}

#[test]
fn variables_give_each_signal_its_endpoint_or_disable_the_export() {
    let cases: &[&[(&str, &str)]] = &[
        &[],
        &[("OTEL_SERVICE_NAME", "svc")],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "")],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")],
        &[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "https://collector.example/otlp/",
        )],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://127.0.0.1:9999/t",
            ),
        ],
        &[(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "http://127.0.0.1:9999/m",
        )],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "false"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_SERVICE_NAME", "agents"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                " Authorization = Bearer%20t0k , ,x-tenant=a%2Cb",
            ),
        ],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4318")],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost")],
        &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://127.0.0.1/x")],
        &[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://")],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
        ],
    ];
    let mut out = String::new();
    for vars in cases {
        let _ = writeln!(out, "{vars:?}\n  {}", configured(vars));
    }
    expect![[r#"
        []
          disabled
        [("OTEL_SERVICE_NAME", "svc")]
          disabled
        [("OTEL_EXPORTER_OTLP_ENDPOINT", "")]
          disabled
        [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")]
          traces=http://127.0.0.1:4318/v1/traces metrics=http://127.0.0.1:4318/v1/metrics protocol=http/protobuf service=awaken timeout=10s headers=[]
        [("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector.example/otlp/")]
          traces=https://collector.example/otlp/v1/traces metrics=https://collector.example/otlp/v1/metrics protocol=http/protobuf service=awaken timeout=10s headers=[]
        [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9999/t")]
          traces=http://127.0.0.1:9999/t metrics=http://127.0.0.1:4318/v1/metrics protocol=http/protobuf service=awaken timeout=10s headers=[]
        [("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://127.0.0.1:9999/m")]
          traces=- metrics=http://127.0.0.1:9999/m protocol=http/protobuf service=awaken timeout=10s headers=[]
        [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), ("OTEL_SDK_DISABLED", "TRUE")]
          disabled
        [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), ("OTEL_SDK_DISABLED", "false"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"), ("OTEL_SERVICE_NAME", "agents"), ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"), ("OTEL_EXPORTER_OTLP_HEADERS", " Authorization = Bearer%20t0k , ,x-tenant=a%2Cb")]
          traces=http://127.0.0.1:4318/v1/traces metrics=http://127.0.0.1:4318/v1/metrics protocol=http/json service=agents timeout=2.5s headers=[("authorization", "Bearer t0k"), ("x-tenant", "a,b")]
        [("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4318")]
          error: OTEL_EXPORTER_OTLP_ENDPOINT is not a URL (relative URL without a base)
        [("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost")]
          error: OTEL_EXPORTER_OTLP_ENDPOINT is not a URL (relative URL without a base)
        [("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://127.0.0.1/x")]
          error: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT must be an http:// or https:// URL, not a ftp: one
        [("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://")]
          error: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is not a URL (empty host)
        [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]
          error: OTEL_EXPORTER_OTLP_PROTOCOL is `grpc`: the export speaks `http/protobuf` and `http/json` only
        [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"), ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s")]
          error: OTEL_EXPORTER_OTLP_TIMEOUT is `10s`, not a whole number of milliseconds
    "#]]
    .assert_eq(&out);
}

#[test]
fn a_bad_header_entry_is_named_by_position_and_never_shows_a_value() {
    let cases = [
        "api-key",
        "=secret-1",
        "a b=secret-2",
        "x-key=secret-3%zz",
        "x-key=secret-4%",
        "x-key=%ff%fe",
        "x-key=",
        "ok=1,x-key=secret-5%0A",
        "ok=1,,x-key=sécret-6",
    ];
    let mut out = String::new();
    for input in cases {
        let rendered = match parse_headers("OTEL_EXPORTER_OTLP_HEADERS", input) {
            Ok(headers) => format!("{} headers", headers.len()),
            Err(e) => {
                let text = e.to_string();
                assert!(!text.contains("secret"), "{text} shows a value");
                assert!(!text.contains("cret"), "{text} shows a value");
                assert!(matches!(e, OtelError::InvalidHeader { .. }), "{e:?}");
                text
            }
        };
        let _ = writeln!(out, "{input:?}: {rendered}");
    }
    expect![[r#"
        "api-key": OTEL_EXPORTER_OTLP_HEADERS: entry 1 has no `=` between a name and a value
        "=secret-1": OTEL_EXPORTER_OTLP_HEADERS: entry 1 has an empty name
        "a b=secret-2": OTEL_EXPORTER_OTLP_HEADERS: entry 1 has a name that is not an HTTP header name
        "x-key=secret-3%zz": OTEL_EXPORTER_OTLP_HEADERS: entry 1 (`x-key`) has a `%` not followed by two hexadecimal digits in its value
        "x-key=secret-4%": OTEL_EXPORTER_OTLP_HEADERS: entry 1 (`x-key`) has a `%` not followed by two hexadecimal digits in its value
        "x-key=%ff%fe": OTEL_EXPORTER_OTLP_HEADERS: entry 1 (`x-key`) has a value that is not UTF-8 once percent-decoded
        "x-key=": OTEL_EXPORTER_OTLP_HEADERS: entry 1 (`x-key`) has an empty value
        "ok=1,x-key=secret-5%0A": OTEL_EXPORTER_OTLP_HEADERS: entry 2 (`x-key`) has a value with a character outside visible ASCII, space and tab
        "ok=1,,x-key=sécret-6": OTEL_EXPORTER_OTLP_HEADERS: entry 3 (`x-key`) has a value with a character outside visible ASCII, space and tab
    "#]]
    .assert_eq(&out);
}

#[test]
fn the_configuration_debug_shows_header_names_only() {
    let config = OtelConfig::new("http://127.0.0.1:4318")
        .and_then(|c| c.with_header("Authorization", "Bearer sk-test-secret-123"))
        .expect("config");
    let shown = format!("{config:?}");
    assert!(!shown.contains("sk-test"), "{shown}");
    assert!(shown.contains("authorization"), "{shown}");
    let refused = OtelConfig::new("http://127.0.0.1:4318")
        .and_then(|c| c.with_header("x-key", "sk-test-secret-123\n"))
        .expect_err("a newline cannot be sent");
    assert!(!refused.to_string().contains("sk-test"), "{refused}");
}
