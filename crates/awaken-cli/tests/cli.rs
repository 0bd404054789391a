//! End-to-end tests of the `awaken` binary: each example agent, the approval flow across two
//! invocations, a new run on a waiting thread, Ctrl-C, the built-in tools, declarative plugins,
//! the README's commands, `awaken serve` over HTTP (and over A2A with the official SDK), and a
//! fleet of `serve --queue` front ends and `awaken worker` processes on PostgreSQL. Nothing here
//! reaches beyond 127.0.0.1.

use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use awaken::event::AgentEvent;
use serde_json::Value;

#[path = "cli/a2a.rs"]
mod a2a;
#[path = "cli/agui.rs"]
mod agui;
#[path = "cli/ai_sdk.rs"]
mod ai_sdk;
#[path = "cli/commands.rs"]
mod commands;
#[path = "cli/conformance.rs"]
mod conformance;
#[path = "cli/fleet.rs"]
mod fleet;
#[path = "cli/mcp.rs"]
mod mcp;
#[path = "cli/mcp_call.rs"]
mod mcp_call;
#[cfg(feature = "otel")]
#[path = "cli/otel.rs"]
mod otel;
#[path = "cli/page.rs"]
mod page;
#[path = "cli/providers.rs"]
mod providers;
#[path = "cli/serve.rs"]
mod serve;

/// The variables that would send a child's requests through a proxy.
const PROXY_VARS: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];

/// The binary with a clean environment: no provider settings, no proxies (loopback only).
fn command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_awaken"));
    for var in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AWAKEN_BASE_URL"]
        .iter()
        .chain(&PROXY_VARS)
    {
        c.env_remove(var);
    }
    c.stdin(Stdio::null());
    // Short run leases: a killed process's run is recoverable a second after it died.
    c.env("AWAKEN_LEASE_SECS", "1");
    c
}

fn awaken(args: &[&str]) -> Output {
    awaken_env(args, &[])
}

/// The binary with `args` and these environment variables.
fn awaken_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    command()
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The binary run from the repository root (the example's server path is relative to it).
fn awaken_in_repo(args: &[&str]) -> Output {
    command()
        .current_dir(repo())
        .args(args)
        .output()
        .expect("the binary runs")
}

/// The scripted model section the front-end tests' agent files share.
const SCRIPTED_MODEL: &str = "[model]\nid = \"default\"\nprovider = \"scripted\"\nupstream_model = \"scripted\"\ncontext_window = 32000\n";

/// An agent whose `append_file` call (`call_1`, the line "buy milk" to `notes/todo.txt`) waits
/// for approval (the permission plugin asks), then answers `Added "buy milk".`.
const SCRIBE: &str = r#"[agent]
id = "scribe"
model = "default"
plugin_ids = ["awaken.permission"]

[agent.sections.permission]
default = "allow"
rules = [{ tool = "append_file", decision = "ask" }]

[tools.append_file]
root = "notes"

[[script.turns]]
text = "I'll add that."
tool_calls = [{ id = "call_1", name = "append_file", arguments = { path = "todo.txt", line = "buy milk" } }]

[[script.turns]]
text = "Added \"buy milk\"."
"#;

/// An agent whose model fails with `the scripted model fails`.
const BROKEN: &str = r#"[agent]
id = "broken"
model = "default"

[[script.turns]]
error = { kind = "invalid_request", message = "the scripted model fails" }
"#;

/// Writes the agent files `(name, body)` to `dir`, each with [`SCRIPTED_MODEL`]; their paths.
fn write_scripted_agents(dir: &Path, files: &[(&str, &str)]) -> Vec<String> {
    files
        .iter()
        .map(|(name, agent)| {
            let path = dir.join(name);
            std::fs::write(&path, format!("{agent}\n{SCRIPTED_MODEL}")).expect("write the agent");
            path_str(&path).to_owned()
        })
        .collect()
}

/// `node` with no proxy to use (loopback only) and no standard input.
fn node() -> Command {
    let mut node = Command::new("node");
    node.stdin(Stdio::null());
    for var in PROXY_VARS {
        node.env_remove(var);
    }
    node
}

/// The variable that makes a missing Node peer (`npm ci --prefix tests/node`) a failure.
const REQUIRE_NODE_PEERS: &str = "AWAKEN_REQUIRE_NODE_PEERS";

/// Whether a peer program a test drives is there: `node` (when `node` is set) and every file of
/// `files`. When it is not, the test is skipped with the reason on standard error, unless the
/// variable `require` is `1`, which makes it a failure.
fn peer_present(what: &str, node: bool, files: &[PathBuf], require: &str) -> bool {
    let node_found = !node
        || Command::new("node")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    let missing: Vec<String> = files
        .iter()
        .filter(|f| !f.exists())
        .map(|f| f.display().to_string())
        .collect();
    if node_found && missing.is_empty() {
        return true;
    }
    let why = format!(
        "{what} is not installed (node found: {node_found}; missing: {}); run `npm ci --prefix tests/node`{}",
        missing.join(", "),
        if require == REQUIRE_NODE_PEERS {
            ""
        } else {
            " and install Chromium"
        },
    );
    assert!(std::env::var(require).as_deref() != Ok("1"), "{why}");
    // Straight to stderr: the test harness does not capture it, so the skip shows.
    let _ = writeln!(std::io::stderr(), "skipped: {why}");
    false
}

/// A fresh directory for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("awaken-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn temp_store(name: &str) -> (PathBuf, String) {
    let dir = temp_dir(name);
    let spec = format!("sqlite:{}", dir.join("awaken.db").display());
    (dir, spec)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Asserts the exit code, showing both streams when it differs.
#[track_caller]
fn expect_code(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

fn events(out: &Output) -> Vec<AgentEvent> {
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not an event: {l}: {e}")))
        .collect()
}

/// A copy of an example agent file in `dir`, so relative tool roots land in the test's directory.
fn copy_example(name: &str, dir: &Path) -> PathBuf {
    let to = dir.join(name);
    std::fs::copy(repo().join("examples/agents").join(name), &to).expect("copy the example");
    to
}

/// A script file with one text turn.
fn text_script(dir: &Path, reply: &str) -> PathBuf {
    let path = dir.join("reply.toml");
    std::fs::write(&path, format!("[[turns]]\ntext = {reply:?}\n")).expect("write the script");
    path
}

/// A request the loopback server received.
struct Received {
    head: String,
    body: String,
}

/// A loopback HTTP/1.1 server that answers its connections, in order, with `responses` (whole
/// responses, `connection: close`), and reports each request on the channel it returns.
fn serve(responses: Vec<String>) -> (String, mpsc::Receiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let addr = listener.local_addr().expect("address");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for response in responses {
            let Ok((mut socket, _)) = listener.accept() else {
                return;
            };
            let Some(request) = read_request(&mut socket) else {
                return;
            };
            let _ = tx.send(request);
            let _ = socket.write_all(response.as_bytes());
            let _ = socket.flush();
        }
    });
    (format!("http://{addr}"), rx)
}

/// Reads one HTTP request (head and `content-length` body) from `socket`.
fn read_request(socket: &mut TcpStream) -> Option<Received> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match socket.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = text(&buf[..head_end]);
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())
                .flatten()
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        match socket.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = text(&buf[head_end..head_end + length]);
    Some(Received { head, body })
}

fn http_response(content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// One chat-completions stream chunk with `delta` (and a finish reason).
fn chunk(delta: &str, finish: Option<&str>) -> String {
    let finish = finish.map_or("null".to_owned(), |f| format!("{f:?}"));
    format!(
        "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
    )
}

/// An SSE chat-completions response: the chunks, then usage and `[DONE]`.
fn sse(chunks: &[String], input_tokens: u32, output_tokens: u32) -> String {
    let mut body = chunks.concat();
    body.push_str(&format!(
        "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{input_tokens},\"completion_tokens\":{output_tokens},\"total_tokens\":{}}}}}\n\n",
        input_tokens + output_tokens
    ));
    body.push_str("data: [DONE]\n\n");
    http_response("text/event-stream", &body)
}

/// A model turn that calls `read_file` on README.md.
fn sse_read_readme() -> String {
    sse(
        &[
            chunk(r#"{"role":"assistant","content":"Reading. "}"#, None),
            chunk(
                r#"{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"read_file","arguments":"{\"path\":"}}]}"#,
                None,
            ),
            chunk(
                r#"{"tool_calls":[{"index":0,"function":{"arguments":"\"README.md\"}"}}]}"#,
                None,
            ),
            chunk("{}", Some("tool_calls")),
        ],
        20,
        5,
    )
}

/// A model turn that answers with text.
fn sse_text(reply: &str) -> String {
    sse(
        &[
            chunk(&format!("{{\"content\":{reply:?}}}"), None),
            chunk("{}", Some("stop")),
        ],
        30,
        7,
    )
}

#[test]
fn the_offline_assistant_runs_to_the_end_on_sqlite_and_show_reads_it_back() {
    let agent = repo().join("examples/agents/assistant.toml");
    let (dir, store) = temp_store("assistant");
    let out = awaken(&[
        "run",
        "--agent",
        agent.to_str().expect("utf-8"),
        "--store",
        &store,
        "--thread",
        "t1",
        "What is Awaken?",
    ]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("→ read_file {\"path\":\"README.md\"}"),
        "{stdout}"
    );
    assert!(stdout.contains("← succeeded"), "{stdout}");
    assert!(
        stdout.contains("Awaken is a Rust runtime for LLM agents"),
        "{stdout}"
    );
    assert!(
        text(&out.stderr).contains("— natural_end · thread t1 · 2 step(s)"),
        "{}",
        text(&out.stderr)
    );

    let shown = awaken(&["show", "t1", "--store", &store]);
    assert_eq!(shown.status.code(), Some(0), "{}", text(&shown.stderr));
    let shown = text(&shown.stdout);
    assert!(
        shown.starts_with("thread t1 · 4 message(s) · 1 run(s)"),
        "{shown}"
    );
    assert!(
        shown.contains(" assistant · natural_end · 2 step(s)"),
        "{shown}"
    );
    assert!(shown.contains("  user       What is Awaken?\n"), "{shown}");
    let threads = text(&awaken(&["threads", "--store", &store, "--json"]).stdout);
    assert!(threads.contains("\"thread_id\":\"t1\""), "{threads}");
    assert!(threads.contains("\"status\":\"done\""), "{threads}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn json_output_follows_the_event_grammar() {
    let agent = repo().join("examples/agents/assistant.toml");
    let out = awaken(&[
        "run",
        "--agent",
        agent.to_str().expect("utf-8"),
        "--store",
        "memory",
        "--json",
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let events: Vec<awaken::event::AgentEvent> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is an event"))
        .collect();
    assert!(events.len() > 5);
    awaken::event::check_activation(&events).expect("one well-formed activation");
}

#[test]
fn a_bad_agent_file_names_the_file_and_line() {
    let dir = std::env::temp_dir().join(format!("awaken-cli-{}-bad", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("bad.toml");
    std::fs::write(
        &file,
        "[agent]\nid = \"a\"\nmodel = \"m\"\nmax_rounds = \"many\"\n",
    )
    .expect("write");
    let out = awaken(&[
        "run",
        "--agent",
        file.to_str().expect("utf-8"),
        "--store",
        "memory",
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("bad.toml:4"), "{err}");
    assert!(
        err.contains("max_rounds") || err.contains("invalid type"),
        "{err}"
    );
    let out = awaken(&["run", "--agent", "/nonexistent/agent.toml", "hi"]);
    assert_eq!(out.status.code(), Some(2));
    let out = awaken(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn validate_resolves_the_agent() {
    let agent = repo().join("examples/agents/assistant.toml");
    let out = awaken(&["validate", "--agent", path_str(&agent)]);
    expect_code(&out, 0);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("agent `assistant` resolves: 1 tool(s), plugins house-style,"),
        "{stdout}"
    );
}

#[test]
fn validate_names_a_delegation_cycle_as_a_warning_and_passes() {
    let dir = temp_dir("cycle");
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).expect("dir");
    std::fs::write(
        plugins.join("reviewers.toml"),
        "id = \"reviewers\"\nversion = \"1.0.0\"\n\n\
         [[agents]]\n[agents.spec]\nid = \"reviewer\"\nmodel = \"default\"\ndelegates = [\"writer\"]\n",
    )
    .expect("write");
    let agent = dir.join("writer.toml");
    std::fs::write(
        &agent,
        "[agent]\nid = \"writer\"\nmodel = \"default\"\ndelegates = [\"reviewer\"]\n\n\
         [plugins]\ndirs = [\"plugins\"]\n\n[[script.turns]]\ntext = \"Done.\"\n",
    )
    .expect("write");
    let out = awaken(&["validate", "--agent", path_str(&agent)]);
    expect_code(&out, 0);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("warning: delegation cycle: reviewer → writer → reviewer\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("agent `writer` resolves: 1 tool(s)"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The commands of the README's `sh` blocks.
fn readme_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README");
    readme
        .split("```sh")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .flat_map(str::lines)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Splits a command line into words: whitespace separates, '…' and "…" quote.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

#[test]
fn the_readme_commands_are_the_ones_ci_runs() {
    let ci = std::fs::read_to_string(repo().join(".ci/run")).expect(".ci/run");
    let commands = readme_commands();
    assert!(
        commands.iter().any(|c| c == "cargo xtask test"),
        "{commands:?}"
    );
    assert!(
        ci.lines().any(|l| l.trim() == "cargo xtask test"),
        "CI runs the README's test command"
    );
    assert!(
        commands.iter().any(|c| c.starts_with(
            "cargo run --release -p awaken-cli -- run --agent examples/agents/assistant.toml "
        )),
        "the README runs the offline assistant: {commands:?}"
    );
    // Directories a README command makes with `awaken init DIR` hold files the repository
    // does not (`the_readmes_init_commands_work_as_written` runs those).
    let made: Vec<String> = commands
        .iter()
        .filter_map(|c| {
            c.split_once(" -- init ")
                .map(|(_, dir)| format!("{}/", dir.trim()))
        })
        .collect();
    assert!(!made.is_empty(), "the README shows `awaken init`");
    for command in commands.iter().filter(|c| c.contains("--agent")) {
        let agent = command
            .split_whitespace()
            .skip_while(|w| *w != "--agent")
            .nth(1)
            .expect("an agent file");
        if made.iter().any(|dir| agent.starts_with(dir.as_str())) {
            continue;
        }
        assert!(
            repo().join(agent).is_file(),
            "the README's agent file {agent} exists"
        );
    }
}

#[test]
fn the_readmes_init_commands_work_as_written() {
    let dir = temp_dir("readme-init");
    let prefix = "cargo run --release -p awaken-cli -- ";
    let commands: Vec<Vec<String>> = readme_commands()
        .iter()
        .skip_while(|c| !c.contains(" -- init "))
        .take(2)
        .map(|c| shell_words(c.strip_prefix(prefix).expect("a cargo run of the command")))
        .collect();
    assert_eq!(commands.len(), 2, "init and the run after it: {commands:?}");
    for (words, what) in commands.iter().zip(["init", "run"]) {
        assert_eq!(words[0], what, "{words:?}");
        let out = command()
            .args(words)
            .current_dir(&dir)
            .output()
            .expect("runs");
        expect_code(&out, 0);
    }
    assert!(
        dir.join(".awaken/awaken.db").is_file(),
        "the run kept its thread"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_readmes_approval_commands_work_as_written() {
    // In a directory laid out like the repository, so the README's relative paths and the
    // default store (./.awaken/awaken.db) land in the test's directory.
    let dir = temp_dir("readme-approval");
    std::fs::create_dir_all(dir.join("examples/agents")).expect("dirs");
    copy_example("approval.toml", &dir.join("examples/agents"));
    let prefix = "cargo run --release -p awaken-cli -- ";
    let commands: Vec<Vec<String>> = readme_commands()
        .iter()
        .filter(|c| {
            c.contains("approval.toml") && !c.contains(" -- chat ") && !c.contains(" -- serve ")
        })
        .map(|c| shell_words(c.strip_prefix(prefix).expect("a cargo run of the command")))
        .collect();
    assert_eq!(commands.len(), 2, "{commands:?}");
    let run = command()
        .args(&commands[0])
        .current_dir(&dir)
        .output()
        .expect("runs");
    expect_code(&run, 3);
    let resume = command()
        .args(&commands[1])
        .current_dir(&dir)
        .output()
        .expect("runs");
    expect_code(&resume, 0);
    let todo =
        std::fs::read_to_string(dir.join("examples/agents/notes/todo.txt")).expect("appended");
    assert_eq!(todo.lines().count(), 1, "{todo}");
    assert!(dir.join(".awaken/awaken.db").is_file());
    let _ = std::fs::remove_dir_all(dir);
}

/// The line on stderr that approves `call`, as the command printed it, split into words.
fn printed_command(stderr: &str, needle: &str) -> Vec<String> {
    let line = stderr
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("awaken ") && l.contains(needle))
        .unwrap_or_else(|| panic!("no printed command with {needle:?} in:\n{stderr}"));
    line.split_whitespace().skip(1).map(str::to_owned).collect()
}

#[test]
fn the_approval_example_suspends_and_a_second_invocation_approves_it() {
    let dir = temp_dir("approval");
    let agent = copy_example("approval.toml", &dir);
    let store = format!("sqlite:{}", dir.join("awaken.db").display());
    let todo = dir.join("notes/todo.txt");
    let run = awaken(&[
        "run",
        "--agent",
        path_str(&agent),
        "--store",
        &store,
        "--thread",
        "todo",
        "--json",
        "Remind me to buy milk",
    ]);
    expect_code(&run, 3);
    let first = events(&run);
    awaken::event::check_activation(&first).expect("the suspended run is one activation");
    let stderr = text(&run.stderr);
    assert!(
        stderr.contains("call_1  append_file {\"line\":\"buy milk\",\"path\":\"todo.txt\"}")
            && stderr.contains("Allow `append_file` with arguments"),
        "the question and the call: {stderr}"
    );
    assert!(!todo.exists(), "nothing is appended before the approval");

    // A second process runs the command the first one printed.
    let approve = printed_command(&stderr, "--approve call_1");
    assert_eq!(
        approve.join(" "),
        format!(
            "resume todo --agent {} --store {store} --approve call_1",
            agent.display()
        )
    );
    let mut words: Vec<&str> = approve.iter().map(String::as_str).collect();
    words.push("--json");
    let resumed = awaken(&words);
    expect_code(&resumed, 0);
    let second = events(&resumed);
    awaken::event::check_activation(&second).expect("the resumed run is one activation");
    let both: Vec<AgentEvent> = first.into_iter().chain(second.iter().cloned()).collect();
    awaken::event::check_events(&both).expect("suspension and resume are one well-formed stream");
    assert!(
        second.iter().any(|e| matches!(e, AgentEvent::ToolCallResumed { call_id, .. } if call_id.as_str() == "call_1")),
        "{}",
        text(&resumed.stdout)
    );
    let lines: Vec<String> = std::fs::read_to_string(&todo)
        .expect("the approved append happened")
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines, ["buy milk"], "the file holds the line only");

    // The thread is no longer waiting: resuming again is bad input, and nothing is appended.
    let again = awaken(&approve.iter().map(String::as_str).collect::<Vec<_>>());
    expect_code(&again, 2);
    assert!(
        text(&again.stderr).contains("thread `todo` is not waiting for decisions"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&todo)
            .expect("read")
            .lines()
            .count(),
        1
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn resume_names_the_waiting_calls_when_a_decision_does_not_fit_and_deny_tells_the_model() {
    let dir = temp_dir("deny");
    let agent = copy_example("approval.toml", &dir);
    let store = format!("sqlite:{}", dir.join("awaken.db").display());
    let agent = path_str(&agent);

    let missing = awaken(&[
        "resume",
        "nope",
        "--agent",
        agent,
        "--store",
        &store,
        "--approve",
        "call_1",
    ]);
    expect_code(&missing, 2);
    assert!(
        text(&missing.stderr).contains("no store at"),
        "resume does not create a store: {}",
        text(&missing.stderr)
    );
    assert!(!dir.join("awaken.db").exists());

    expect_code(
        &awaken(&[
            "run", "--agent", agent, "--store", &store, "--thread", "t", "hi",
        ]),
        3,
    );
    let missing = awaken(&[
        "resume",
        "nope",
        "--agent",
        agent,
        "--store",
        &store,
        "--approve",
        "call_1",
    ]);
    expect_code(&missing, 2);
    assert!(
        text(&missing.stderr).contains("no thread `nope`"),
        "{}",
        text(&missing.stderr)
    );
    let unknown = awaken(&[
        "resume",
        "t",
        "--agent",
        agent,
        "--store",
        &store,
        "--approve",
        "call_9",
    ]);
    expect_code(&unknown, 2);
    let err = text(&unknown.stderr);
    assert!(
        err.contains("call call_9 is not waiting for a decision on thread `t`")
            && err.contains("call_1  append_file")
            && err.contains("--approve call_1"),
        "{err}"
    );
    let nothing = awaken(&["resume", "t", "--agent", agent, "--store", &store]);
    expect_code(&nothing, 2);
    assert!(
        text(&nothing.stderr).contains("--approve call_1"),
        "{}",
        text(&nothing.stderr)
    );

    let denied = awaken(&[
        "resume",
        "t",
        "--agent",
        agent,
        "--store",
        &store,
        "--deny",
        "call_1",
        "--answer",
        "\"not today\"",
    ]);
    expect_code(&denied, 0);
    let stdout = text(&denied.stdout);
    assert!(stdout.contains("✗ call_1 denied"), "{stdout}");
    assert!(stdout.contains("denied by the user: not today"), "{stdout}");
    assert!(!dir.join("notes/todo.txt").exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_new_run_on_a_waiting_thread_is_refused_unless_it_supersedes_the_calls() {
    let dir = temp_dir("supersede");
    let agent = copy_example("approval.toml", &dir);
    let store = format!("sqlite:{}", dir.join("awaken.db").display());
    let agent = path_str(&agent);
    expect_code(
        &awaken(&[
            "run", "--agent", agent, "--store", &store, "--thread", "t", "hi",
        ]),
        3,
    );

    let refused = awaken(&[
        "run", "--agent", agent, "--store", &store, "--thread", "t", "other",
    ]);
    expect_code(&refused, 3);
    let err = text(&refused.stderr);
    assert!(err.contains("thread `t` is waiting"), "{err}");
    assert!(
        err.contains(&format!(
            "awaken resume t --agent {agent} --store {store} --approve call_1"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "awaken run --agent {agent} --thread t --store {store} --supersede other"
        )),
        "{err}"
    );
    assert!(
        !text(&refused.stdout).contains("▶"),
        "the refused run did not start"
    );

    let script = text_script(&dir, "Starting over.");
    let superseded = awaken(&[
        "run",
        "--agent",
        agent,
        "--store",
        &store,
        "--thread",
        "t",
        "--supersede",
        "--script",
        path_str(&script),
        "other",
    ]);
    expect_code(&superseded, 0);
    assert!(text(&superseded.stdout).contains("Starting over."));
    let shown = text(&awaken(&["show", "t", "--store", &store]).stdout);
    assert!(
        shown.contains("call_1 ← error: not executed: superseded by a new message"),
        "the superseded call is closed: {shown}"
    );
    assert!(!shown.contains("waiting:"), "{shown}");
    assert!(!dir.join("notes/todo.txt").exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn ctrl_c_cancels_the_run_and_leaves_a_thread_that_shows_and_continues() {
    let dir = temp_dir("ctrl-c");
    let agent = waiting_agent(&dir);
    let store = format!("sqlite:{}", dir.join("awaken.db").display());
    let (rest, stderr, status) = interrupt_after_start(
        &[
            "run",
            "--agent",
            path_str(&agent),
            "--store",
            &store,
            "--thread",
            "w",
            "Wait",
        ],
        "-INT",
    );
    assert_eq!(status.code(), Some(4), "stdout: {rest}\nstderr: {stderr}");
    assert!(stderr.contains("— cancelled · thread w"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "awaken run --agent {} --thread w --store {store} PROMPT",
            agent.display()
        )),
        "{stderr}"
    );

    let shown = awaken(&["show", "w", "--store", &store]);
    expect_code(&shown, 0);
    let shown = text(&shown.stdout);
    assert!(shown.contains("  user       Wait\n"), "{shown}");
    assert!(
        shown.contains("  assistant  Thinking (interrupted)\n"),
        "the streamed part of the answer is kept: {shown}"
    );
    assert!(shown.contains(" waiter · cancelled · 0 step(s)"), "{shown}");

    let script = text_script(&dir, "Done waiting.");
    let next = awaken(&[
        "run",
        "--agent",
        path_str(&agent),
        "--store",
        &store,
        "--thread",
        "w",
        "--script",
        path_str(&script),
        "Go on",
    ]);
    expect_code(&next, 0);
    assert!(text(&next.stdout).contains("Done waiting."));
    let shown = text(&awaken(&["show", "w", "--store", &store]).stdout);
    assert!(shown.contains(" · natural_end · "), "{shown}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_openai_example_talks_to_an_openai_compatible_server() {
    let (base, requests) = serve(vec![sse_read_readme(), sse_text("Awaken is a runtime.")]);
    let agent = repo().join("examples/agents/openai.toml");
    let base_url = format!("{base}/v1");
    let out = awaken_env(
        &[
            "run",
            "--agent",
            path_str(&agent),
            "--store",
            "memory",
            "--thread",
            "o",
            "What is Awaken?",
        ],
        &[
            ("AWAKEN_BASE_URL", &base_url),
            ("OPENAI_API_KEY", "sk-test-key"),
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
        text(&out.stderr).contains("— natural_end · thread o · 2 step(s) · 62 tokens"),
        "{}",
        text(&out.stderr)
    );
    let first = requests.recv().expect("the first request");
    assert!(
        first.head.starts_with("POST /v1/chat/completions "),
        "{}",
        first.head
    );
    assert!(
        first
            .head
            .lines()
            .any(|l| l.eq_ignore_ascii_case("authorization: Bearer sk-test-key")),
        "{}",
        first.head
    );
    let first: Value = serde_json::from_str(&first.body).expect("a JSON body");
    assert_eq!(first["model"], "gpt-4o-mini");
    assert_eq!(first["stream"], true);
    assert!(first["tools"].to_string().contains("read_file"), "{first}");
    let second: Value = serde_json::from_str(&requests.recv().expect("the second request").body)
        .expect("a JSON body");
    let tool_message = second["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the tool result goes back to the model")
        .to_string();
    assert!(tool_message.contains("call_a"), "{tool_message}");
    assert!(
        tool_message.contains("Awaken is a Rust runtime for LLM agents"),
        "{tool_message}"
    );
}

#[test]
fn the_assistant_loads_its_declarative_plugins_and_the_model_sees_them() {
    // The offline example with its provider switched to a loopback OpenAI-compatible server,
    // to observe the request (its relative paths made absolute, as the copy lives elsewhere).
    let (base, requests) = serve(vec![sse_read_readme(), sse_text("Done.")]);
    let examples = repo().join("examples");
    let original =
        std::fs::read_to_string(examples.join("agents/assistant.toml")).expect("read the example");
    let switched = original
        .replace("provider = \"scripted\"", "provider = \"openai\"")
        .replace(
            "\"../plugins\"",
            &format!("{:?}", path_str(&examples.join("plugins"))),
        )
        .replace(
            "root = \"../..\"",
            &format!("root = {:?}", path_str(&repo())),
        );
    assert_ne!(
        switched, original,
        "the example's provider and paths were found"
    );
    let dir = temp_dir("assistant-openai");
    let agent = dir.join("assistant.toml");
    std::fs::write(&agent, switched).expect("write the copy");
    let base_url = format!("{base}/v1");
    let out = awaken_env(
        &[
            "run",
            "--agent",
            path_str(&agent),
            "--store",
            "memory",
            "hi",
        ],
        &[("AWAKEN_BASE_URL", &base_url)],
    );
    expect_code(&out, 0);
    let first: Value =
        serde_json::from_str(&requests.recv().expect("a request").body).expect("JSON");
    let system = first["messages"][0].to_string();
    assert!(
        system.contains("Use read_file") && system.contains("Answer in British English."),
        "the house-style fragments follow the system prompt: {system}"
    );
    let second: Value =
        serde_json::from_str(&requests.recv().expect("a request").body).expect("JSON");
    assert!(
        second["messages"]
            .to_string()
            .contains("Quote the lines of the file you rely on."),
        "the house-style reminder after read_file: {second}"
    );

    // Without a key or a base URL, the OpenAI example says what it needs instead of calling out.
    let out = awaken(&[
        "run",
        "--agent",
        path_str(&repo().join("examples/agents/openai.toml")),
        "--store",
        "memory",
        "hi",
    ]);
    expect_code(&out, 2);
    assert!(
        text(&out.stderr).contains("needs an API key: set OPENAI_API_KEY"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn http_get_reaches_allowed_hosts_only() {
    let (base, requests) = serve(vec![http_response("text/plain", "hello from loopback")]);
    let port = base.rsplit_once(':').expect("a port").1;
    let dir = temp_dir("http");
    let agent = dir.join("fetch.toml");
    std::fs::write(
        &agent,
        format!(
            "[agent]\nid = \"fetcher\"\nmodel = \"default\"\n\n\
             [tools.http_get]\nallow_hosts = [\"127.0.0.1\", \"::1\"]\nallow_ranges = [\"127.0.0.1\"]\n\n\
             [[script.turns]]\ntool_calls = [\n\
             {{ id = \"c1\", name = \"http_get\", arguments = {{ url = \"{base}/hello\" }} }},\n\
             {{ id = \"c2\", name = \"http_get\", arguments = {{ url = \"http://example.invalid/x\" }} }},\n\
             {{ id = \"c3\", name = \"http_get\", arguments = {{ url = \"file:///etc/passwd\" }} }},\n\
             {{ id = \"c4\", name = \"http_get\", arguments = {{ url = \"http://[::1]:{port}/x\" }} }},\n]\n\n\
             [[script.turns]]\ntext = \"Fetched.\"\n"
        ),
    )
    .expect("write the agent");
    let out = awaken(&[
        "run",
        "--agent",
        path_str(&agent),
        "--store",
        "memory",
        "--json",
        "fetch",
    ]);
    expect_code(&out, 0);
    let done: Vec<String> = events(&out)
        .iter()
        .filter_map(|e| match e {
            AgentEvent::ToolCallDone {
                call_id,
                result,
                state,
            } => Some(format!("{call_id} {state} {}", result.content)),
            _ => None,
        })
        .collect();
    assert_eq!(done.len(), 4, "{done:?}");
    assert!(
        done[0].starts_with("c1 succeeded")
            && done[0].contains("\"body\":\"hello from loopback\"")
            && done[0].contains("\"status\":200"),
        "{done:?}"
    );
    assert!(
        done[1].contains("host `example.invalid` is not allowed (allowed: 127.0.0.1, ::1)"),
        "{done:?}"
    );
    assert!(done[2].contains("is not an http or https URL"), "{done:?}");
    // An allowed host is still refused at an address outside `allow_ranges`.
    assert!(
        done[3].contains("refused ::1 for host `[::1]`: ::1/128 (loopback)"),
        "{done:?}"
    );
    let request = requests.recv().expect("the allowed request");
    assert!(request.head.starts_with("GET /hello "), "{}", request.head);
    assert!(
        requests.try_recv().is_err(),
        "only the allowed host was reached"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plugins_lists_the_examples_and_names_the_line_of_a_broken_file() {
    let out = awaken(&[
        "plugins",
        "--dir",
        path_str(&repo().join("examples/plugins")),
    ]);
    expect_code(&out, 0);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("house-style 1.0.0 · enabled · priority 0 · depends on - · 2 prompt fragment(s) · reminders after read_* · agents editor"),
        "{stdout}"
    );
    assert!(stdout.contains("ok: 1 plugin(s) load together"), "{stdout}");

    let dir = temp_dir("plugins");
    std::fs::copy(
        repo().join("examples/plugins/house-style.toml"),
        dir.join("house-style.toml"),
    )
    .expect("copy");
    std::fs::write(
        dir.join("broken.toml"),
        "id = \"broken\"\nversion = \"1.0.0\"\ncolour = \"red\"\n",
    )
    .expect("write");
    let out = awaken(&["plugins", "--dir", path_str(&dir)]);
    expect_code(&out, 2);
    let err = text(&out.stderr);
    assert!(err.contains("broken.toml:3"), "{err}");
    assert!(err.contains("colour"), "{err}");
    assert!(
        text(&out.stdout).contains("house-style 1.0.0"),
        "the good file is still listed"
    );

    // An agent file whose plugin directory holds a broken file fails before running.
    std::fs::create_dir_all(dir.join("agents")).expect("dir");
    let agent = dir.join("agents/agent.toml");
    std::fs::write(
        &agent,
        "[agent]\nid = \"a\"\nmodel = \"m\"\n\n[plugins]\ndirs = [\"..\"]\n\n[[script.turns]]\ntext = \"hi\"\n",
    )
    .expect("write");
    let out = awaken(&[
        "run",
        "--agent",
        path_str(&agent),
        "--store",
        "memory",
        "hi",
    ]);
    expect_code(&out, 2);
    assert!(
        text(&out.stderr).contains("broken.toml:3"),
        "{}",
        text(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The PostgreSQL URL of the test server: `None` (the test `what` is skipped, with a note)
/// when it is not configured, a failure when `AWAKEN_REQUIRE_POSTGRES=1` (as in CI).
fn postgres_url(what: &str) -> Option<String> {
    match std::env::var("AWAKEN_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            assert!(
                !std::env::var("AWAKEN_REQUIRE_POSTGRES").is_ok_and(|v| v == "1"),
                "AWAKEN_REQUIRE_POSTGRES=1 but AWAKEN_TEST_POSTGRES_URL is not set"
            );
            let _ = writeln!(
                std::io::stderr(),
                "awaken-cli: {what} is SKIPPED (AWAKEN_TEST_POSTGRES_URL is not set)"
            );
            None
        }
    }
}

#[test]
fn the_approval_flow_works_on_postgres_too() {
    let Some(url) = postgres_url("the PostgreSQL approval test") else {
        return;
    };
    let dir = temp_dir("postgres");
    let agent = copy_example("approval.toml", &dir);
    let agent = path_str(&agent);
    // The tables are shared with other runs of this test: a thread of its own.
    let thread = format!(
        "pg-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let store = format!("postgres:{url}");
    expect_code(
        &awaken(&[
            "run", "--agent", agent, "--store", &store, "--thread", &thread, "hi",
        ]),
        3,
    );
    expect_code(
        &awaken(&[
            "resume",
            &thread,
            "--agent",
            agent,
            "--store",
            &store,
            "--approve",
            "call_1",
        ]),
        0,
    );
    let todo = std::fs::read_to_string(dir.join("notes/todo.txt")).expect("appended");
    assert_eq!(todo.lines().count(), 1, "{todo}");
    let shown = text(&awaken(&["show", &thread, "--store", &store]).stdout);
    assert!(shown.contains(" · natural_end · "), "{shown}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Starts `awaken run` of the waiting agent with `args`, waits until its model streamed a word,
/// and sends the process `signal`; returns the rest of its output and its status.
fn interrupt_after_start(
    args: &[&str],
    signal: &str,
) -> (String, String, std::process::ExitStatus) {
    // The signal goes once the model has streamed its first word, so the run is mid-answer
    // when it arrives.
    let (mut child, mut stdout) = start_waiting(args);
    // A hang guard, not a wait: kills the child if the test is stuck for a minute.
    let (done, guard) = mpsc::channel::<()>();
    let pid = child.id().to_string();
    let watchdog = {
        let pid = pid.clone();
        std::thread::spawn(move || {
            if guard.recv_timeout(Duration::from_secs(60)).is_err() {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
        })
    };
    let sent = Command::new("kill")
        .args([signal, &pid])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("read stdout");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("piped stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    let status = child.wait().expect("wait");
    let _ = done.send(());
    let _ = watchdog.join();
    (rest, stderr, status)
}

/// The word the waiting agent's model streams before it waits.
const THINKING: &str = "Thinking";

/// An agent whose model streams a word, then waits until the run is cancelled.
fn waiting_agent(dir: &Path) -> PathBuf {
    let agent = dir.join("waiter.toml");
    std::fs::write(
        &agent,
        "[agent]\nid = \"waiter\"\nmodel = \"default\"\n\n\
         [[script.turns]]\ndeltas = [\"Thinking\"]\nwait_for_cancel = true\n",
    )
    .expect("write the agent");
    agent
}

#[test]
fn recover_continues_a_run_whose_process_was_killed() {
    let dir = temp_dir("recover");
    let agent = waiting_agent(&dir);
    let agent = path_str(&agent);
    let store = format!("sqlite:{}", dir.join("awaken.db").display());
    let (_, _, status) = interrupt_after_start(
        &[
            "run", "--agent", agent, "--store", &store, "--thread", "k", "Wait",
        ],
        "-KILL",
    );
    assert_eq!(status.code(), None, "killed by the signal");
    let shown = text(&awaken(&["show", "k", "--store", &store]).stdout);
    assert!(
        shown.contains(" waiter · running · "),
        "the run was left unfinished: {shown}"
    );
    // The dead process's lease runs out a second after its last heartbeat.
    std::thread::sleep(Duration::from_millis(1500));

    let script = text_script(&dir, "Back after the crash.");
    let recovered = awaken(&[
        "recover",
        "--agent",
        agent,
        "--store",
        &store,
        "--script",
        path_str(&script),
    ]);
    expect_code(&recovered, 0);
    let stdout = text(&recovered.stdout);
    assert!(stdout.contains("▶ resuming run"), "{stdout}");
    assert!(stdout.contains("Back after the crash."), "{stdout}");
    assert!(
        text(&recovered.stderr).contains("· natural_end · thread k"),
        "{}",
        text(&recovered.stderr)
    );
    let shown = text(&awaken(&["show", "k", "--store", &store]).stdout);
    assert!(
        shown.contains(" waiter · natural_end · 1 step(s)"),
        "{shown}"
    );

    let again = awaken(&["recover", "--agent", agent, "--store", &store]);
    expect_code(&again, 0);
    assert!(
        text(&again.stderr).contains("no unfinished runs"),
        "{}",
        text(&again.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Starts `awaken run` of the waiting agent with `args` and returns it, with the rest of its
/// output, once its model streamed its first word (the waiting agent's `Thinking`, printed
/// without a newline): the run is then live, committed, its lease held.
fn start_waiting(args: &[&str]) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let mut child = command()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the run");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut seen = Vec::new();
    let mut chunk = [0u8; 256];
    while !text(&seen).contains(THINKING) {
        let n = stdout.read(&mut chunk).expect("read stdout");
        assert!(
            n > 0,
            "the run ended before its model wrote: {}",
            text(&seen)
        );
        seen.extend_from_slice(&chunk[..n]);
    }
    (child, stdout)
}

#[test]
fn a_second_process_on_a_running_thread_is_refused_until_the_first_is_gone() {
    let dir = temp_dir("busy");
    let agent = waiting_agent(&dir);
    let agent = path_str(&agent);
    let store = format!("sqlite:{}", dir.join("awaken.db").display());
    let (mut first, _output) = start_waiting(&[
        "run", "--agent", agent, "--store", &store, "--thread", "conc1", "a",
    ]);

    let refused = awaken(&[
        "run", "--agent", agent, "--store", &store, "--thread", "conc1", "b",
    ]);
    expect_code(&refused, 3);
    let err = text(&refused.stderr);
    let runs = text(&awaken(&["show", "conc1", "--store", &store]).stdout);
    let run_id = runs
        .split_whitespace()
        .find(|w| w.starts_with("run-"))
        .unwrap_or_else(|| panic!("no run id in: {runs}"));
    assert!(
        err.contains(&format!(
            "thread `conc1` is busy: run `{run_id}` is still running"
        )),
        "{err}"
    );
    assert!(err.contains("awaken recover --agent"), "{err}");

    // Superseding a run whose process is alive is refused too.
    let live = awaken(&[
        "run",
        "--agent",
        agent,
        "--store",
        &store,
        "--thread",
        "conc1",
        "--supersede",
        "b",
    ]);
    expect_code(&live, 3);
    assert!(
        text(&live.stderr).contains("the process driving it is alive"),
        "{}",
        text(&live.stderr)
    );

    // Once the first process is gone and its lease ran out, the new run supersedes its run.
    first.kill().expect("kill the first run");
    let _ = first.wait();
    std::thread::sleep(Duration::from_millis(1500));
    let script = text_script(&dir, "Second run.");
    let second = awaken(&[
        "run",
        "--agent",
        agent,
        "--store",
        &store,
        "--thread",
        "conc1",
        "--supersede",
        "--script",
        path_str(&script),
        "b",
    ]);
    expect_code(&second, 0);
    assert!(text(&second.stdout).contains("Second run."));
    let shown = text(&awaken(&["show", "conc1", "--store", &store]).stdout);
    assert!(shown.contains(" waiter · cancelled · "), "{shown}");
    assert!(shown.contains(" waiter · natural_end · "), "{shown}");
    assert!(!shown.contains(" · running · "), "{shown}");
    let nothing = awaken(&["recover", "--agent", agent, "--store", &store]);
    expect_code(&nothing, 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn two_processes_starting_on_one_thread_at_once_run_one_run() {
    let dir = temp_dir("race");
    let agent = waiting_agent(&dir);
    let agent = path_str(&agent);
    let store = format!("sqlite:{}", dir.join("awaken.db").display());
    for round in 0..4 {
        let thread = format!("race{round}");
        let spawn = || {
            command()
                .args([
                    "run", "--agent", agent, "--store", &store, "--thread", &thread, "go",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a run")
        };
        let (mut a, mut b) = (spawn(), spawn());
        // The loser exits 3 at once; the winner waits until it is interrupted.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let loser = loop {
            if let Some(status) = a.try_wait().expect("wait") {
                break (status, a, b);
            }
            if let Some(status) = b.try_wait().expect("wait") {
                break (status, b, a);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "neither run was refused"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let (status, mut refused, winner) = loser;
        let mut err = String::new();
        refused
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut err)
            .expect("read");
        assert_eq!(status.code(), Some(3), "round {round}: {err}");
        assert!(err.contains("busy") || err.contains("changed"), "{err}");
        let pid = winner.id().to_string();
        let sent = Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .expect("kill");
        assert!(sent.success());
        let out = winner.wait_with_output().expect("wait");
        assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
        let shown = text(&awaken(&["show", &thread, "--store", &store]).stdout);
        assert_eq!(shown.matches(" waiter · ").count(), 1, "one run: {shown}");
        assert!(shown.contains(" waiter · cancelled · "), "{shown}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_damaged_database_is_a_storage_failure_that_names_the_file() {
    let dir = temp_dir("damaged");
    let path = dir.join("awaken.db");
    std::fs::write(
        &path,
        b"this is not a database, just sixty-odd bytes of text ........",
    )
    .expect("write");
    let store = format!("sqlite:{}", path.display());
    for args in [
        vec!["threads", "--store", &store],
        vec!["show", "t", "--store", &store],
    ] {
        let out = awaken(&args);
        expect_code(&out, 1);
        let err = text(&out.stderr);
        assert!(err.contains(&path.display().to_string()), "{args:?}: {err}");
        assert!(err.contains("not a database"), "{args:?}: {err}");
        assert_eq!(
            err.matches(&path.display().to_string()).count(),
            1,
            "the path is named once: {err}"
        );
    }
    // A store setting that cannot work is bad input, not a storage failure.
    let missing = format!("sqlite:{}", dir.join("nowhere/awaken.db").display());
    expect_code(&awaken(&["threads", "--store", &missing]), 2);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn two_processes_creating_one_new_store_at_once_both_open_it() {
    let dir = temp_dir("new-store");
    let agent = dir.join("hello.toml");
    std::fs::write(
        &agent,
        "[agent]\nid = \"hello\"\nmodel = \"default\"\n\n[[script.turns]]\ntext = \"Hello.\"\n",
    )
    .expect("write the agent");
    let agent = path_str(&agent);
    for round in 0..12 {
        let store = format!(
            "sqlite:{}",
            dir.join(format!("r{round}/awaken.db")).display()
        );
        let spawn = |thread: &str| {
            command()
                .args([
                    "run", "--agent", agent, "--store", &store, "--thread", thread, "hi",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a run")
        };
        let (a, b) = (spawn("a"), spawn("b"));
        for (name, child) in [("a", a), ("b", b)] {
            let out = child.wait_with_output().expect("wait");
            assert_eq!(
                out.status.code(),
                Some(0),
                "round {round}, run {name}: {}",
                text(&out.stderr)
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
