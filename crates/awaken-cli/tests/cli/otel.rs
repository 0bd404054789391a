//! The command exports over OTLP when an endpoint is set: the run's spans and the GenAI
//! metrics reach a receiver on 127.0.0.1 before the process exits, message content only with
//! `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`, and a bad configuration is
//! reported without stopping the command.

use std::sync::{Arc, Mutex};

use super::*;

/// The requests an OTLP receiver got: path and body (protobuf, read as lossy text: span names
/// and attribute strings are in it as they are).
type Requests = Arc<Mutex<Vec<(String, String)>>>;

/// An OTLP/HTTP receiver on 127.0.0.1: every request on every keep-alive connection is kept
/// and answered 200.
fn otlp_receiver() -> (String, Requests) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let addr = listener.local_addr().expect("address");
    let requests: Requests = Arc::default();
    let kept = requests.clone();
    std::thread::spawn(move || {
        while let Ok((mut socket, _)) = listener.accept() {
            let kept = kept.clone();
            std::thread::spawn(move || {
                while let Some(request) = read_request(&mut socket) {
                    let path = request
                        .head
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or_default()
                        .to_owned();
                    kept.lock().expect("requests").push((path, request.body));
                    let ok = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                    if socket.write_all(ok.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), requests)
}

/// Runs the offline assistant with `env`, exporting to a fresh receiver; the output and the
/// traces and metrics bodies received.
fn exported_run(name: &str, env: &[(&str, &str)]) -> (Output, String, String) {
    let (endpoint, requests) = otlp_receiver();
    let agent = repo().join("examples/agents/assistant.toml");
    let (dir, store) = temp_store(name);
    let mut vars = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_SERVICE_NAME", "awaken-cli-test"),
    ];
    vars.extend_from_slice(env);
    let out = awaken_env(
        &[
            "run",
            "--agent",
            path_str(&agent),
            "--store",
            &store,
            "What is Awaken?",
        ],
        &vars,
    );
    let _ = std::fs::remove_dir_all(dir);
    let received = requests.lock().expect("requests").clone();
    let bodies = |path: &str| -> String {
        received
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, b)| b.as_str())
            .collect()
    };
    (out, bodies("/v1/traces"), bodies("/v1/metrics"))
}

#[test]
fn a_run_exports_its_spans_and_metrics_before_the_command_exits() {
    let (out, traces, metrics) = exported_run("otel", &[]);
    expect_code(&out, 0);
    for name in [
        "invoke_agent assistant",
        "chat scripted",
        "execute_tool read_file",
        "awaken-cli-test",
    ] {
        assert!(traces.contains(name), "no {name:?} in the exported spans");
    }
    for name in [
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
    ] {
        assert!(
            metrics.contains(name),
            "no {name:?} in the exported metrics"
        );
    }
    // Without the opt-in, neither the question nor the system prompt is exported.
    assert!(!traces.contains("What is Awaken?"));
    assert!(!traces.contains("gen_ai.input.messages"));
    assert!(!traces.contains("You are a concise assistant"));
}

#[test]
fn message_content_is_exported_with_the_capture_variable() {
    let (out, traces, _) = exported_run(
        "otel-content",
        &[("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")],
    );
    expect_code(&out, 0);
    assert!(traces.contains("gen_ai.input.messages"));
    assert!(traces.contains("What is Awaken?"));
    assert!(traces.contains("gen_ai.system_instructions"));
}

#[test]
fn a_bad_otlp_header_list_is_reported_and_the_run_goes_on() {
    let (out, traces, _) = exported_run(
        "otel-bad",
        &[(
            "OTEL_EXPORTER_OTLP_HEADERS",
            "authorization=Bearer sk-secret%zz",
        )],
    );
    expect_code(&out, 0);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "spans are not exported: OTEL_EXPORTER_OTLP_HEADERS: entry 1 (`authorization`)"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("sk-secret"), "{stderr}");
    assert!(traces.is_empty(), "nothing is exported");
}
