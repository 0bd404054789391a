//! The provider as the agent file configures it, against loopback servers: an offline agent
//! stays offline whatever the environment holds, timeouts, retries, the errors a user reads,
//! and the log lines that say what happened.

use std::net::TcpStream;

use super::*;

/// An agent file in `dir` whose provider is the OpenAI-compatible server at `base_url` (none:
/// the default), with `extra` appended after `[provider] model` (more provider keys, then
/// sub-tables such as `[provider.retry]`).
fn openai_agent(dir: &Path, base_url: Option<&str>, extra: &str) -> PathBuf {
    let path = dir.join("net.toml");
    let base_url = base_url.map_or(String::new(), |u| format!("base_url = {u:?}\n"));
    std::fs::write(
        &path,
        format!(
            "[agent]\nid = \"net\"\nmodel = \"default\"\n\n\
             [provider]\nkind = \"openai\"\n{base_url}model = \"m\"\n{extra}"
        ),
    )
    .expect("write the agent");
    path
}

/// No retries: a failed call ends the run at once.
const NO_RETRY: &str = "[provider.retry]\nmax_retries = 0\n";

/// `awaken run --agent AGENT --store memory hi`.
fn run_command(agent: &Path) -> Command {
    let mut c = command();
    c.args(["run", "--agent", path_str(agent), "--store", "memory", "hi"]);
    c
}

/// `awaken run --agent AGENT --store memory hi` with `env`, to its end.
fn run_agent(agent: &Path, env: &[(&str, &str)]) -> Output {
    run_command(agent)
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs")
}

/// Runs `command` to its end and returns its output; a watchdog kills it after a minute, so a
/// run that hangs fails the test (killed, it has no exit code) instead of stalling it.
fn output_guarded(mut command: Command) -> Output {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the command");
    let pid = child.id().to_string();
    let (done, guard) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if guard.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
    });
    let out = child.wait_with_output().expect("wait for the command");
    let _ = done.send(());
    let _ = watchdog.join();
    out
}

/// A loopback server for one connection: it reads the request, reports it, and hands the socket
/// to `answer`. The listener closes when `answer` returns.
fn serve_one(
    answer: impl FnOnce(&mut TcpStream) + Send + 'static,
) -> (String, mpsc::Receiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let addr = listener.local_addr().expect("address");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut socket, _)) = listener.accept() else {
            return;
        };
        let Some(request) = read_request(&mut socket) else {
            return;
        };
        let _ = tx.send(request);
        answer(&mut socket);
    });
    (format!("http://{addr}"), rx)
}

/// Holds the connection open, answering nothing more, until the client closes it (it gives up,
/// or its process ends).
fn stall(socket: &mut TcpStream) {
    let _ = socket.read_to_end(&mut Vec::new());
}

/// A response with `status` (such as `500 Internal Server Error`), extra header lines and a
/// body.
fn http_status(status: &str, headers: &str, content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\n{headers}content-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The requests the server has reported so far (all of them, once the client has exited).
fn received(requests: &mpsc::Receiver<Received>) -> Vec<Received> {
    requests.try_iter().collect()
}

/// Whether the request head has the header line `line` (name case-insensitive).
fn has_header(head: &str, line: &str) -> bool {
    let (name, value) = line.split_once(": ").expect("a `name: value` line");
    head.lines().any(|l| {
        l.split_once(':')
            .is_some_and(|(n, v)| n.trim().eq_ignore_ascii_case(name) && v.trim() == value)
    })
}

/// Asserts that nothing connected to `listener`: a connection made now is the first one it
/// accepts. (Every connection a finished process opened is already queued on the listener.)
#[track_caller]
fn assert_never_contacted(listener: &TcpListener) {
    let sentinel =
        TcpStream::connect(listener.local_addr().expect("address")).expect("connect to it");
    let (_accepted, peer) = listener.accept().expect("accept");
    assert_eq!(
        peer,
        sentinel.local_addr().expect("the sentinel's address"),
        "something else connected to {} first",
        listener.local_addr().expect("address")
    );
}

#[test]
fn an_offline_agent_sends_nothing_whatever_the_environment_holds() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let base_url = format!("{url}/v1");
    let agent = repo().join("examples/agents/assistant.toml");
    // The proxies point at the same listener, so a request to any host would show there too.
    let out = run_agent(
        &agent,
        &[
            ("OPENAI_API_KEY", "sk-test"),
            ("AWAKEN_BASE_URL", &base_url),
            ("HTTP_PROXY", &url),
            ("HTTPS_PROXY", &url),
        ],
    );
    expect_code(&out, 0);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("Awaken is a Rust runtime for LLM agents"),
        "the scripted answer: {stdout}"
    );
    assert_never_contacted(&listener);
}

#[test]
fn validate_needs_no_key_and_sends_nothing() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let base_url = format!("{url}/v1");
    let agent = repo().join("examples/agents/openai.toml");
    let out = awaken_env(
        &["validate", "--agent", path_str(&agent)],
        &[
            ("AWAKEN_BASE_URL", &base_url),
            ("HTTP_PROXY", &url),
            ("HTTPS_PROXY", &url),
        ],
    );
    expect_code(&out, 0);
    assert!(
        text(&out.stdout).contains("agent `researcher` resolves"),
        "{}",
        text(&out.stdout)
    );
    assert_never_contacted(&listener);
}

#[test]
fn a_local_server_needs_no_key_and_openai_needs_one_before_anything_is_sent() {
    let dir = temp_dir("providers-key");

    // A local server: no key, no authorization header.
    let (base, requests) = serve(vec![sse_text("Hello from loopback.")]);
    let agent = openai_agent(&dir, Some(&format!("{base}/v1")), "");
    let out = run_agent(&agent, &[]);
    expect_code(&out, 0);
    assert!(
        text(&out.stdout).contains("Hello from loopback."),
        "{}",
        text(&out.stdout)
    );
    let request = requests.recv().expect("the request");
    assert!(
        request.head.starts_with("POST /v1/chat/completions "),
        "{}",
        request.head
    );
    assert!(
        !request.head.to_ascii_lowercase().contains("authorization:"),
        "no key, no authorization header: {}",
        request.head
    );

    // OpenAI's own endpoint without the key: refused before any request. The proxy is a
    // loopback listener, so a request that did go out would arrive there.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let proxy = format!("http://{}", listener.local_addr().expect("address"));
    let agent = openai_agent(&dir, None, "");
    let out = run_agent(&agent, &[("HTTPS_PROXY", &proxy), ("HTTP_PROXY", &proxy)]);
    expect_code(&out, 2);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("https://api.openai.com/v1 needs an API key: set OPENAI_API_KEY"),
        "{stderr}"
    );
    assert!(stderr.contains("net.toml"), "the file is named: {stderr}");
    assert_never_contacted(&listener);

    // `api_key_env` names the variable: it is the one asked for, and the one sent.
    let agent = openai_agent(&dir, None, "api_key_env = \"MY_KEY\"\n");
    let out = run_agent(
        &agent,
        &[
            ("OPENAI_API_KEY", "sk-openai-value"),
            ("HTTPS_PROXY", &proxy),
            ("HTTP_PROXY", &proxy),
        ],
    );
    expect_code(&out, 2);
    let stderr = text(&out.stderr);
    assert!(stderr.contains("set MY_KEY"), "{stderr}");
    assert_never_contacted(&listener);

    let (base, requests) = serve(vec![sse_text("Keyed.")]);
    let agent = openai_agent(
        &dir,
        Some(&format!("{base}/v1")),
        "api_key_env = \"MY_KEY\"\n",
    );
    let out = run_agent(
        &agent,
        &[
            ("MY_KEY", "sk-mine-value"),
            ("OPENAI_API_KEY", "sk-openai-value"),
        ],
    );
    expect_code(&out, 0);
    let request = requests.recv().expect("the request");
    assert!(
        has_header(&request.head, "authorization: Bearer sk-mine-value"),
        "{}",
        request.head
    );
    assert!(
        !request.head.contains("sk-openai-value") && !request.body.contains("sk-openai-value"),
        "OPENAI_API_KEY is not sent: {}",
        request.head
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_silent_server_times_out_after_the_first_byte_timeout() {
    let dir = temp_dir("providers-first-byte");
    let (base, requests) = serve_one(stall);
    let agent = openai_agent(
        &dir,
        Some(&format!("{base}/v1")),
        &format!("first_byte_timeout = \"300ms\"\n{NO_RETRY}"),
    );
    let out = output_guarded(run_command(&agent));
    // Exit 1, not a kill by the watchdog: the run ended on its own, long before the default
    // 120 s timeout.
    expect_code(&out, 1);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("inference timed out after 300ms waiting for response headers"),
        "{stderr}"
    );
    assert_eq!(received(&requests).len(), 1, "one request, no retry");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_stream_that_stalls_times_out_after_the_idle_timeout() {
    let dir = temp_dir("providers-idle");
    let (base, _requests) = serve_one(|socket| {
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
        let first = chunk(r#"{"role":"assistant","content":"Partial"}"#, None);
        let _ = socket.write_all(format!("{head}{first}").as_bytes());
        let _ = socket.flush();
        stall(socket);
    });
    let agent = openai_agent(
        &dir,
        Some(&format!("{base}/v1")),
        &format!("idle_timeout = \"300ms\"\n{NO_RETRY}"),
    );
    let out = output_guarded(run_command(&agent));
    expect_code(&out, 1);
    assert!(
        text(&out.stdout).contains("Partial"),
        "the chunk before the stall is shown: {}",
        text(&out.stdout)
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("inference timed out after 300ms waiting for next stream chunk"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn transient_errors_are_retried_by_default_and_not_when_retry_is_off() {
    let dir = temp_dir("providers-retry");
    let server_error = http_status(
        "500 Internal Server Error",
        "",
        "application/json",
        r#"{"error":{"message":"upstream exploded","type":"server_error"}}"#,
    );

    // A 500, then an answer: retried once, with a warning at the default log level.
    let (base, requests) = serve(vec![server_error.clone(), sse_text("Recovered.")]);
    let agent = openai_agent(&dir, Some(&format!("{base}/v1")), "");
    let out = run_agent(&agent, &[]);
    expect_code(&out, 0);
    assert!(
        text(&out.stdout).contains("Recovered."),
        "{}",
        text(&out.stdout)
    );
    let stderr = text(&out.stderr);
    let warning = stderr
        .lines()
        .find(|l| l.contains("retrying inference"))
        .unwrap_or_else(|| panic!("a retry warning: {stderr}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains("provider server error (HTTP 500): upstream exploded"),
        "{warning}"
    );
    assert_eq!(received(&requests).len(), 2);

    // A 429 asking for a second: the retry waits that second.
    let rate_limited = http_status(
        "429 Too Many Requests",
        "retry-after: 1\r\n",
        "application/json",
        r#"{"error":{"message":"slow down","type":"rate_limit_error"}}"#,
    );
    let (base, requests) = serve(vec![rate_limited, sse_text("After the wait.")]);
    let agent = openai_agent(&dir, Some(&format!("{base}/v1")), "");
    let out = run_agent(&agent, &[]);
    expect_code(&out, 0);
    assert!(
        text(&out.stdout).contains("After the wait."),
        "{}",
        text(&out.stdout)
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("delay_ms=1000")
            && stderr.contains("rate limited by the provider (retry after 1s): slow down"),
        "the retry honours Retry-After: {stderr}"
    );
    assert_eq!(received(&requests).len(), 2);

    // Retry off: the 500 ends the run, and the answer waiting on the server is never asked for.
    let (base, requests) = serve(vec![server_error, sse_text("Never asked.")]);
    let agent = openai_agent(&dir, Some(&format!("{base}/v1")), NO_RETRY);
    let out = run_agent(&agent, &[]);
    expect_code(&out, 1);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("provider server error (HTTP 500): upstream exploded"),
        "{stderr}"
    );
    assert!(!stderr.contains("retrying inference"), "{stderr}");
    assert_eq!(received(&requests).len(), 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn connection_and_endpoint_errors_say_what_to_fix() {
    let dir = temp_dir("providers-errors");

    // Nothing listens on the port.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .expect("address")
        .port();
    let agent = openai_agent(&dir, Some(&format!("http://127.0.0.1:{port}/v1")), NO_RETRY);
    let out = run_agent(&agent, &[]);
    expect_code(&out, 1);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("connection refused by 127.0.0.1:{port}")),
        "{stderr}"
    );

    // A base URL without its version segment: the server has no `/chat/completions`.
    let not_found = http_status("404 Not Found", "", "text/plain", "Not Found");
    let (base, requests) = serve(vec![not_found]);
    let agent = openai_agent(&dir, Some(&base), "");
    let out = run_agent(&agent, &[]);
    expect_code(&out, 1);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("the server has no `POST {base}/chat/completions`")),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("try `{base}/v1`")), "{stderr}");
    let request = requests.recv().expect("the request");
    assert!(
        request.head.starts_with("POST /chat/completions "),
        "{}",
        request.head
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn log_levels_and_formats_shape_standard_error() {
    let dir = temp_dir("providers-logs");
    let (base, _requests) = serve(vec![
        sse_text("One."),
        sse_text("Two."),
        sse_text("Three."),
        sse_text("Four."),
        sse_text("Five."),
    ]);
    let agent = openai_agent(&dir, Some(&format!("{base}/v1")), "");

    let out = run_agent(&agent, &[("RUST_LOG", "debug")]);
    expect_code(&out, 0);
    let stderr = text(&out.stderr);
    assert!(stderr.contains("chat completion request"), "{stderr}");

    let out = run_agent(&agent, &[]);
    expect_code(&out, 0);
    let stderr = text(&out.stderr);
    assert!(text(&out.stdout).contains("Two."), "{}", text(&out.stdout));
    assert!(!stderr.contains("chat completion request"), "{stderr}");

    let out = awaken_env(
        &[
            "run",
            "--log-format",
            "json",
            "--agent",
            path_str(&agent),
            "--store",
            "memory",
            "hi",
        ],
        &[("RUST_LOG", "debug")],
    );
    expect_code(&out, 0);
    let stderr = text(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("chat completion request"))
        .unwrap_or_else(|| panic!("the request's debug line: {stderr}"));
    let record: Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("a JSON log line: {line}: {e}"));
    assert_eq!(record["level"], "DEBUG", "{record}");
    assert_eq!(
        record["fields"]["message"], "chat completion request",
        "{record}"
    );
    // Every log line is JSON; the run's closing summary is the one line that is not a log.
    for line in stderr.lines().filter(|l| !l.starts_with("— ")) {
        serde_json::from_str::<Value>(line)
            .unwrap_or_else(|e| panic!("a JSON log line: {line}: {e}"));
    }

    // Without RUST_LOG, -v adds the provider the run uses and -vv each request.
    let verbose = |flag: &str| {
        let out = awaken(&[
            "run",
            flag,
            "--agent",
            path_str(&agent),
            "--store",
            "memory",
            "hi",
        ]);
        expect_code(&out, 0);
        text(&out.stderr)
    };
    let info = verbose("-v");
    assert!(
        info.contains("provider")
            && info.contains("model=m")
            && !info.contains("chat completion request"),
        "{info}"
    );
    let debug = verbose("-vv");
    assert!(debug.contains("chat completion request"), "{debug}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_request_follows_the_provider_settings() {
    let dir = temp_dir("providers-body");
    let (base, requests) = serve(vec![http_response(
        "application/json",
        r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"Plain."},"finish_reason":"stop"}]}"#,
    )]);
    let agent = openai_agent(
        &dir,
        Some(&format!("{base}/v1")),
        "stream = false\nmax_tokens_field = \"max_completion_tokens\"\n\
         [agent.inference]\nmax_tokens = 77\n",
    );
    let out = run_agent(&agent, &[]);
    expect_code(&out, 0);
    assert!(
        text(&out.stdout).contains("Plain."),
        "{}",
        text(&out.stdout)
    );
    let request = requests.recv().expect("the request");
    let body: Value = serde_json::from_str(&request.body).expect("a JSON body");
    assert_eq!(body["stream"], Value::Bool(false), "{body}");
    assert_eq!(body["max_completion_tokens"], 77, "{body}");
    assert!(body.get("max_tokens").is_none(), "{body}");

    // Streaming without usage: no stream_options.
    let (base, requests) = serve(vec![sse_text("Streamed.")]);
    let agent = openai_agent(&dir, Some(&format!("{base}/v1")), "include_usage = false\n");
    expect_code(&run_agent(&agent, &[]), 0);
    let body: Value =
        serde_json::from_str(&requests.recv().expect("the request").body).expect("a JSON body");
    assert_eq!(body["stream"], Value::Bool(true), "{body}");
    assert!(body.get("stream_options").is_none(), "{body}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn quiet_prints_only_the_answer() {
    let agent = repo().join("examples/agents/assistant.toml");
    let out = awaken(&[
        "run",
        "-q",
        "--agent",
        path_str(&agent),
        "--store",
        "memory",
        "hi",
    ]);
    expect_code(&out, 0);
    // Each step's words on their own line, nothing else.
    assert_eq!(
        text(&out.stdout),
        "Let me look that up.\nAwaken is a Rust runtime for LLM agents: validated state, \
         plugins, durable tool calls and a neutral event stream.\n"
    );
    assert_eq!(text(&out.stderr), "", "nothing on standard error");
}

#[test]
fn quiet_and_json_still_say_why_a_run_failed() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    drop(listener);
    let dir = temp_dir("quiet-error");
    let agent = openai_agent(&dir, Some(&format!("http://127.0.0.1:{port}/v1")), NO_RETRY);
    for flag in ["-q", "--json"] {
        let out = awaken(&[
            "run",
            flag,
            "--agent",
            path_str(&agent),
            "--store",
            "memory",
            "hi",
        ]);
        expect_code(&out, 1);
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("awaken: the run ended in an error:")
                && stderr.contains(&format!("127.0.0.1:{port}")),
            "{flag}: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn header_values_read_the_environment_when_a_run_starts() {
    let dir = temp_dir("providers-headers");
    let (base, requests) = serve(vec![sse_text("Team seen.")]);
    let agent = openai_agent(
        &dir,
        Some(&format!("{base}/v1")),
        "headers = { \"x-team\" = \"${TEAM_FOR_TEST}\" }\n",
    );
    let out = run_agent(&agent, &[("TEAM_FOR_TEST", "blue")]);
    expect_code(&out, 0);
    let request = requests.recv().expect("the request");
    assert!(
        has_header(&request.head, "x-team: blue"),
        "{}",
        request.head
    );

    // Unset: the run is refused before any request; validate does not read the environment.
    let (base, requests) = serve(vec![sse_text("Never asked.")]);
    let agent = openai_agent(
        &dir,
        Some(&format!("{base}/v1")),
        "headers = { \"x-team\" = \"${TEAM_FOR_TEST}\" }\n",
    );
    let out = run_agent(&agent, &[]);
    expect_code(&out, 2);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("headers.x-team: the environment variable TEAM_FOR_TEST is not set"),
        "{stderr}"
    );
    let out = awaken(&["validate", "--agent", path_str(&agent)]);
    expect_code(&out, 0);
    assert!(received(&requests).is_empty(), "nothing was sent");
    let _ = std::fs::remove_dir_all(dir);
}

/// A server that answers "Late answer." two seconds after the request: long enough for the
/// waiting indicator, which shows after one second of silence.
fn slow_server() -> String {
    serve_one(|socket| {
        std::thread::sleep(Duration::from_secs(2));
        let _ = socket.write_all(sse_text("Late answer.").as_bytes());
        let _ = socket.flush();
    })
    .0
}

#[test]
fn the_waiting_indicator_stays_off_standard_error_when_it_is_not_a_terminal() {
    let dir = temp_dir("providers-waiting-pipe");
    let agent = openai_agent(&dir, Some(&format!("{}/v1", slow_server())), "");
    let out = run_agent(&agent, &[]);
    expect_code(&out, 0);
    assert!(
        text(&out.stdout).contains("Late answer."),
        "{}",
        text(&out.stdout)
    );
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("waiting for the model"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `word` quoted for `sh`.
fn sh_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[test]
fn the_waiting_indicator_shows_on_a_terminal() {
    let script_found = Command::new("script")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !script_found {
        let _ = writeln!(
            std::io::stderr(),
            "awaken-cli: the waiting indicator test is SKIPPED (`script` from util-linux is not installed)"
        );
        return;
    }
    let dir = temp_dir("providers-waiting-tty");
    let agent = openai_agent(&dir, Some(&format!("{}/v1", slow_server())), "");
    let line = [
        env!("CARGO_BIN_EXE_awaken"),
        "run",
        "--agent",
        path_str(&agent),
        "--store",
        "memory",
        "hi",
    ]
    .map(sh_quote)
    .join(" ");
    // `script` runs the command on a pseudo-terminal and copies what it prints (standard output
    // and standard error together) to its own standard output. Its environment is the minimum:
    // no provider settings, no proxies.
    let mut script = Command::new("script");
    script
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TERM", "dumb")
        .args(["-qec", &line, "/dev/null"])
        .stdin(Stdio::null());
    let out = output_guarded(script);
    expect_code(&out, 0);
    let shown = text(&out.stdout);
    assert!(shown.contains("Late answer."), "{shown}");
    assert!(shown.contains("waiting for the model (1s)"), "{shown}");
    let _ = std::fs::remove_dir_all(dir);
}

/// One event of a Messages API stream.
fn messages_event(data: Value) -> String {
    let kind = data["type"].as_str().unwrap_or("message").to_owned();
    format!("event: {kind}\ndata: {data}\n\n")
}

/// A streamed Messages API response: `message_start`, the `blocks` (each its start, deltas and
/// stop events), then the stop reason, usage and `message_stop`.
fn messages_sse(blocks: &[String], stop: &str) -> String {
    let mut body = messages_event(serde_json::json!({
        "type": "message_start",
        "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
                    "content": [], "usage": {"input_tokens": 30, "output_tokens": 1}}
    }));
    body.push_str(&blocks.concat());
    body.push_str(&messages_event(serde_json::json!({
        "type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 7}
    })));
    body.push_str(&messages_event(serde_json::json!({"type": "message_stop"})));
    http_response("text/event-stream", &body)
}

/// A text block at `index`, streamed in one delta.
fn messages_text(index: u32, text: &str) -> String {
    [
        messages_event(serde_json::json!({
            "type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}
        })),
        messages_event(serde_json::json!({
            "type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}
        })),
        messages_event(serde_json::json!({"type": "content_block_stop", "index": index})),
    ]
    .concat()
}

#[test]
fn the_anthropic_example_talks_to_a_messages_server() {
    let read_readme = [
        messages_text(0, "Reading. "),
        messages_event(serde_json::json!({
            "type": "content_block_start", "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {}}
        })),
        messages_event(serde_json::json!({
            "type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "{\"path\":"}
        })),
        messages_event(serde_json::json!({
            "type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "\"README.md\"}"}
        })),
        messages_event(serde_json::json!({"type": "content_block_stop", "index": 1})),
    ];
    let (base, requests) = serve(vec![
        messages_sse(&read_readme, "tool_use"),
        messages_sse(&[messages_text(0, "Awaken is a runtime.")], "end_turn"),
    ]);
    let agent = repo().join("examples/agents/anthropic.toml");
    let out = awaken_env(
        &[
            "run",
            "--agent",
            path_str(&agent),
            "--store",
            "memory",
            "--thread",
            "a",
            "What is Awaken?",
        ],
        &[
            ("AWAKEN_BASE_URL", &base),
            ("ANTHROPIC_API_KEY", "sk-ant-test-key"),
            ("OPENAI_API_KEY", "sk-openai-value"),
        ],
    );
    expect_code(&out, 0);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("→ read_file {\"path\":\"README.md\"}"),
        "{stdout}"
    );
    assert!(stdout.contains("Awaken is a runtime."), "{stdout}");
    assert!(
        text(&out.stderr).contains("— natural_end · thread a · 2 step(s)"),
        "{}",
        text(&out.stderr)
    );

    let first = requests.recv().expect("the first request");
    assert!(
        first.head.starts_with("POST /v1/messages "),
        "{}",
        first.head
    );
    assert!(
        has_header(&first.head, "x-api-key: sk-ant-test-key"),
        "{}",
        first.head
    );
    assert!(
        has_header(&first.head, "anthropic-version: 2023-06-01"),
        "{}",
        first.head
    );
    assert!(
        !first.head.contains("sk-openai-value")
            && !first.head.to_ascii_lowercase().contains("authorization:"),
        "{}",
        first.head
    );
    let first: Value = serde_json::from_str(&first.body).expect("a JSON body");
    assert_eq!(first["model"], "claude-haiku-4-5");
    assert_eq!(first["stream"], true);
    assert!(
        first["max_tokens"].as_u64().is_some_and(|m| m > 0),
        "{first}"
    );
    assert!(
        first["system"]
            .as_str()
            .is_some_and(|s| s.contains("concise assistant")),
        "{first}"
    );
    assert_eq!(first["messages"][0]["role"], "user");
    assert!(
        first["tools"].to_string().contains("\"input_schema\""),
        "{first}"
    );

    let second: Value = serde_json::from_str(&requests.recv().expect("the second request").body)
        .expect("a JSON body");
    let messages = second["messages"].as_array().expect("messages");
    let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "user"], "{second}");
    let result = &messages[2]["content"][0];
    assert_eq!(result["type"], "tool_result", "{second}");
    assert_eq!(result["tool_use_id"], "toolu_a");
    assert!(
        result["content"]
            .as_str()
            .is_some_and(|c| c.contains("Awaken is a Rust runtime for LLM agents")),
        "{result}"
    );
}

#[test]
fn the_anthropic_example_validates_without_a_key_and_sends_nothing() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let agent = repo().join("examples/agents/anthropic.toml");
    let out = awaken_env(
        &["validate", "--agent", path_str(&agent)],
        &[
            ("AWAKEN_BASE_URL", &url),
            ("HTTP_PROXY", &url),
            ("HTTPS_PROXY", &url),
        ],
    );
    expect_code(&out, 0);
    assert!(
        text(&out.stdout).contains("agent `claude-researcher` resolves"),
        "{}",
        text(&out.stdout)
    );
    assert_never_contacted(&listener);

    // Running it against Anthropic's own API without the key is refused before anything is sent.
    let out = awaken_env(
        &[
            "run",
            "--agent",
            path_str(&agent),
            "--store",
            "memory",
            "hi",
        ],
        &[("HTTP_PROXY", &url), ("HTTPS_PROXY", &url)],
    );
    expect_code(&out, 2);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("https://api.anthropic.com needs an API key: set ANTHROPIC_API_KEY"),
        "{stderr}"
    );
    assert_never_contacted(&listener);
}

/// An agent file in `dir` whose agent runs on the pool `smart` of two OpenAI-compatible
/// models, `first` at `first_url` and `second` (fallback-only, so always tried second) at
/// `second_url`; `member` is the pool's second member entry.
fn pool_agent(dir: &Path, first_url: &str, second_url: &str, member: &str) -> PathBuf {
    let path = dir.join("pool.toml");
    std::fs::write(
        &path,
        format!(
            "[agent]\nid = \"pooled\"\nmodel = \"smart\"\n\n\
             [[models]]\nid = \"first\"\nupstream_model = \"model-one\"\n\
             [models.provider]\nkind = \"openai\"\nbase_url = {first_url:?}\n\n\
             [[models]]\nid = \"second\"\nupstream_model = \"model-two\"\n\
             [models.provider]\nkind = \"openai\"\nbase_url = {second_url:?}\n\n\
             [[model_pools]]\nid = \"smart\"\n\
             members = [{{ model = \"first\" }}, {member}]\n"
        ),
    )
    .expect("write the agent");
    path
}

#[test]
fn a_pool_answers_from_its_second_server_when_the_first_is_rate_limited() {
    let dir = temp_dir("providers-pool");
    let rate_limited = http_status(
        "429 Too Many Requests",
        "",
        "application/json",
        r#"{"error":{"message":"slow down","type":"rate_limit_error"}}"#,
    );
    let (first, first_requests) = serve(vec![rate_limited]);
    let (second, second_requests) = serve(vec![sse_text("From the second server.")]);
    let agent = pool_agent(
        &dir,
        &format!("{first}/v1"),
        &format!("{second}/v1"),
        "{ model = \"second\", fallback_only = true }",
    );
    let out = output_guarded(run_command(&agent));
    expect_code(&out, 0);
    assert!(
        text(&out.stdout).contains("From the second server."),
        "{}",
        text(&out.stdout)
    );
    // Each server was asked once, for its own model; the 429 was not retried on the first
    // server but failed over at once.
    let model = |r: &Received| {
        serde_json::from_str::<Value>(&r.body).expect("a JSON body")["model"].clone()
    };
    let first_requests = received(&first_requests);
    let second_requests = received(&second_requests);
    assert_eq!(first_requests.len(), 1);
    assert_eq!(model(&first_requests[0]), "model-one");
    assert_eq!(second_requests.len(), 1);
    assert_eq!(model(&second_requests[0]), "model-two");
    let stderr = text(&out.stderr);
    let failover = stderr
        .lines()
        .find(|l| l.contains("model pool member failed; trying the next"))
        .unwrap_or_else(|| panic!("a failover warning: {stderr}"));
    assert!(
        failover.contains("member=first") && failover.contains("slow down"),
        "{failover}"
    );
    assert!(!stderr.contains("retrying inference"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn validate_names_the_file_and_field_of_a_pool_member_that_is_no_model() {
    let dir = temp_dir("providers-pool-validate");
    let agent = pool_agent(
        &dir,
        "http://127.0.0.1:9/v1",
        "http://127.0.0.1:9/v1",
        "{ model = \"ghost\" }",
    );
    let out = awaken(&["validate", "--agent", path_str(&agent)]);
    expect_code(&out, 2);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: model_pools[0].members[1].model: `ghost` is not a model of this file (its models: `first`, `second`)",
            agent.display()
        )),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_pool_example_validates_offline() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let agent = repo().join("examples/agents/pool.toml");
    let out = awaken_env(
        &["validate", "--agent", path_str(&agent)],
        &[("HTTP_PROXY", &url), ("HTTPS_PROXY", &url)],
    );
    expect_code(&out, 0);
    assert!(
        text(&out.stdout).starts_with("agent `pooled` resolves"),
        "{}",
        text(&out.stdout)
    );
    assert_never_contacted(&listener);
}
