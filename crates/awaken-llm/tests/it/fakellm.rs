//! The executors against `fakellm` (from PyPI), a mock server that speaks the OpenAI and
//! Anthropic wire formats: a second implementation of each protocol, not written here.
//!
//! Each test starts `fakellm serve --host 127.0.0.1 --port 0 --config FILE` as a child process
//! (killed when the test ends) and waits for uvicorn's `Uvicorn running on http://HOST:PORT`
//! line, which is printed once the socket listens and names the port it got. When the command
//! is missing the tests are skipped with a notice on stderr, unless
//! `AWAKEN_REQUIRE_PYTHON_PEERS=1` (which covers every Python peer of the tests), which makes a
//! missing `fakellm` a failure.

use std::io::{BufRead, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

#[cfg(feature = "anthropic")]
use awaken_event::{Message, ToolCall, ToolDescriptor, ToolResult};
use awaken_llm::LlmExecutor;

use crate::{render_error, render_response};

/// The rules every test's server plays (first match wins): a greeting, a tool call when the
/// request offers `get_weather`, and an answer once a tool result mentions `sunny`.
const RULES: &str = r#"version: 1
rules:
  - name: answer_after_tool
    when:
      tool_result_contains: "sunny"
    respond:
      content: "It is sunny in Zurich."
  - name: call_weather
    when:
      tools_include: "get_weather"
    respond:
      tool_calls:
        - name: get_weather
          arguments:
            city: Zurich
            days: 3
  - name: greeting
    when:
      messages_contain: "hello fakellm"
    respond:
      content: "Hello from fakellm, streamed word by word."
"#;

/// A running `fakellm`, killed (and its config file removed) on drop.
struct FakeLlm {
    child: Child,
    config: PathBuf,
    /// `http://127.0.0.1:<port>`.
    root: String,
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
    }
}

/// Starts `fakellm` with [`RULES`]; `None` (after a notice) when the command is missing and
/// `AWAKEN_REQUIRE_PYTHON_PEERS` is not `1`.
fn start(test: &str) -> Option<FakeLlm> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let config = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "fakellm-{}-{}.yaml",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&config, RULES).expect("write the fakellm config");
    let spawned = Command::new("fakellm")
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let _ = std::fs::remove_file(&config);
            assert!(
                std::env::var("AWAKEN_REQUIRE_PYTHON_PEERS").as_deref() != Ok("1"),
                "AWAKEN_REQUIRE_PYTHON_PEERS=1 but the `fakellm` command is not installed (pip install fakellm)"
            );
            // Straight to stderr: the test harness does not capture it, so the skip shows.
            let _ = writeln!(
                std::io::stderr(),
                "skipped {test}: the `fakellm` command is not installed (pip install fakellm)"
            );
            return None;
        }
        Err(e) => panic!("cannot start fakellm: {e}"),
    };
    let stderr = child.stderr.take().expect("piped stderr");
    let mut server = FakeLlm {
        child,
        config,
        root: String::new(),
    };
    // Reads uvicorn's log until it names the port, then keeps draining it (a full pipe would
    // block the server); at the end of the log without that line, reports what it said.
    let (tx, rx) = mpsc::channel::<Result<u16, String>>();
    std::thread::spawn(move || {
        let mut log = String::new();
        let mut reported = false;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if !reported && let Some(port) = listening_port(&line) {
                reported = true;
                let _ = tx.send(Ok(port));
            }
            if !reported {
                log.push_str(&line);
                log.push('\n');
            }
        }
        if !reported {
            let _ = tx.send(Err(log));
        }
    });
    let port = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(port)) => port,
        Ok(Err(log)) => panic!("fakellm exited before listening:\n{log}"),
        Err(_) => panic!("fakellm did not start listening within 60 s"),
    };
    assert_ne!(
        port, 0,
        "this uvicorn logs the requested port 0, not the bound one"
    );
    server.root = format!("http://127.0.0.1:{port}");
    Some(server)
}

/// The port in uvicorn's `Uvicorn running on http://127.0.0.1:PORT (Press CTRL+C to quit)`.
fn listening_port(line: &str) -> Option<u16> {
    let rest = line.split("Uvicorn running on http://").nth(1)?;
    let address = rest.split_whitespace().next()?;
    address.rsplit_once(':')?.1.parse().ok()
}

#[test]
fn the_listening_line_names_the_port() {
    assert_eq!(
        listening_port(
            "INFO:     Uvicorn running on http://127.0.0.1:43043 (Press CTRL+C to quit)"
        ),
        Some(43043)
    );
    assert_eq!(
        listening_port("INFO:     Application startup complete."),
        None
    );
}

/// Runs `request` through `executor` and renders the collected response.
async fn run(executor: &dyn LlmExecutor, request: awaken_llm::InferenceRequest) -> String {
    let response = tokio::time::timeout(Duration::from_secs(30), executor.execute(request))
        .await
        .expect("fakellm answered within 30 s");
    response
        .map(|r| render_response(&r))
        .unwrap_or_else(|e| render_error(&e))
}

#[cfg(feature = "anthropic")]
#[tokio::test]
async fn anthropic_streams_text_and_tool_use_from_fakellm() {
    use awaken_llm::anthropic::{AnthropicConfig, AnthropicExecutor};

    let Some(server) = start("anthropic_streams_text_and_tool_use_from_fakellm") else {
        return;
    };
    let exec =
        AnthropicExecutor::new(AnthropicConfig::new(&server.root).with_api_key("sk-ant-fake"))
            .expect("config");

    let greeting =
        awaken_llm::InferenceRequest::new("claude-test", vec![Message::user("hello fakellm")])
            .with_system_prompt("Be brief.");
    let text = run(&exec, greeting).await;
    assert!(
        text.starts_with("stop=EndTurn usage in=1 out=")
            && text.ends_with(
                "block {\"type\":\"text\",\"text\":\"Hello from fakellm, streamed word by word.\"}\n"
            ),
        "{text}"
    );

    // Turn 1: the tool is offered, fakellm calls it (arguments streamed in pieces).
    let tools = vec![ToolDescriptor::new("get_weather", "Looks up the weather.")];
    let question = Message::user("What is the weather in Zurich?");
    let first = awaken_llm::InferenceRequest::new("claude-test", vec![question.clone()])
        .with_tools(tools.clone());
    let response = tokio::time::timeout(Duration::from_secs(30), exec.execute(first))
        .await
        .expect("fakellm answered")
        .expect("a tool call");
    assert_eq!(response.stop_reason, awaken_event::StopReason::ToolCalls);
    let calls: Vec<ToolCall> = response.message.tool_calls.to_vec();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(
        *calls[0].arguments,
        serde_json::json!({"city": "Zurich", "days": 3})
    );
    assert!(
        calls[0].id.as_str().starts_with("toolu_"),
        "{:?}",
        calls[0].id
    );

    // Turn 2: the result goes back as a tool_result block, which fakellm's rule reads.
    let call_id = calls[0].id.clone();
    let second = awaken_llm::InferenceRequest::new(
        "claude-test",
        vec![
            question,
            Message::assistant_with_calls("", calls),
            Message::tool(
                call_id,
                &ToolResult::success(serde_json::json!("sunny, 21 C")),
            ),
        ],
    )
    .with_tools(tools);
    let answer = run(&exec, second).await;
    assert!(
        answer.starts_with("stop=EndTurn")
            && answer.ends_with("block {\"type\":\"text\",\"text\":\"It is sunny in Zurich.\"}\n"),
        "{answer}"
    );
}

#[cfg(feature = "openai")]
#[tokio::test]
async fn openai_streams_text_and_tool_calls_from_fakellm() {
    use awaken_llm::openai::{OpenAiConfig, OpenAiExecutor};

    let Some(server) = start("openai_streams_text_and_tool_calls_from_fakellm") else {
        return;
    };
    // fakellm's stream has no usage chunk; it ignores `stream_options`.
    let exec =
        OpenAiExecutor::new(OpenAiConfig::new(format!("{}/v1", server.root))).expect("config");
    let greeting = awaken_llm::InferenceRequest::new(
        "gpt-test",
        vec![awaken_event::Message::user("hello fakellm")],
    );
    expect_test::expect![[r#"
        stop=EndTurn usage in=0 out=0
        block {"type":"text","text":"Hello from fakellm, streamed word by word."}
    "#]]
    .assert_eq(&run(&exec, greeting).await);

    let tools = vec![awaken_event::ToolDescriptor::new(
        "get_weather",
        "Looks up the weather.",
    )];
    let first = awaken_llm::InferenceRequest::new(
        "gpt-test",
        vec![awaken_event::Message::user("What is the weather?")],
    )
    .with_tools(tools);
    let rendered = run(&exec, first).await;
    assert!(
        rendered.starts_with("stop=ToolCalls")
            && rendered.contains(" get_weather {\"city\":\"Zurich\",\"days\":3} raw=None"),
        "{rendered}"
    );
}
