//! End-to-end tests of the `awaken` binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn awaken(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_awaken"))
        .args(args)
        .env_remove("OPENAI_API_KEY")
        .env_remove("AWAKEN_BASE_URL")
        .output()
        .expect("the binary runs")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn temp_store(name: &str) -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("awaken-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let spec = format!("sqlite:{}", dir.join("awaken.db").display());
    (dir, spec)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
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
    assert!(shown.starts_with("thread t1: 4 message(s)"), "{shown}");
    assert!(shown.contains("status=done"), "{shown}");
    let threads = text(&awaken(&["threads", "--store", &store]).stdout);
    assert!(threads.contains("\"thread_id\":\"t1\""), "{threads}");
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
    let out = awaken(&["validate", "--agent", agent.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("agent `assistant` resolves: 1 tool(s)"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn the_readme_commands_are_the_ones_ci_runs() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README");
    let ci = std::fs::read_to_string(repo().join(".ci/run")).expect(".ci/run");
    let commands: Vec<&str> = readme
        .split("```sh")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .flat_map(str::lines)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert!(commands.contains(&"cargo xtask test"), "{commands:?}");
    assert!(
        ci.lines().any(|l| l.trim() == "cargo xtask test"),
        "CI runs the README's test command"
    );
    let run = commands
        .iter()
        .find(|c| c.contains("-- run --agent"))
        .expect("the README's run command");
    let agent = run
        .split_whitespace()
        .skip_while(|w| *w != "--agent")
        .nth(1)
        .expect("an agent file");
    assert!(
        repo().join(agent).is_file(),
        "the README's agent file {agent} exists"
    );
}
