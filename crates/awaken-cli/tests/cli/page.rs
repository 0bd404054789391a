//! The chat page of `awaken serve` in a real browser: `tests/node/page.mjs` drives headless
//! Chromium through `puppeteer-core` (pinned by `tests/node/package-lock.json`) to approve a
//! call, deny another, send a message to a running agent, reload a finished and a streaming
//! thread, and take a screenshot of the page.

use std::path::{Path, PathBuf};

use super::serve::node_against_served;
use crate::{path_str, peer_present, repo, temp_dir};

/// The agents the page talks to. `scribe`: turn 1 calls `append_file`, which the permission
/// plugin asks about; turn 2 answers (another answer when the call was denied). `counter`: two
/// answers streamed slowly, the second for a message sent while the first streams.
const AGENTS: [(&str, &str); 2] = [
    (
        "scribe.toml",
        r#"[agent]
id = "scribe"
description = "Keeps a to-do list"
model = "default"
system_prompt = "You keep the user's to-do list in todo.txt."
max_rounds = 4
plugin_ids = ["awaken.permission"]

[agent.sections.permission]
default = "allow"
rules = [{ tool = "append_file", decision = "ask" }]

[model]
id = "default"
provider = "scripted"
upstream_model = "scripted"
context_window = 32000

[tools.append_file]
root = "notes"

[[script.turns]]
text = "I'll add that to your list."
tool_calls = [{ id = "call_1", name = "append_file", arguments = { path = "todo.txt", line = "buy milk" } }]
usage = { input_tokens = 10, output_tokens = 5 }

[[script.turns]]
text = "Added \"buy milk\" to todo.txt."
usage = { input_tokens = 20, output_tokens = 7 }

[script.turns.if_refused]
text = "I did not add it: the append was refused."
usage = { input_tokens = 20, output_tokens = 9 }
"#,
    ),
    (
        "counter.toml",
        r#"[agent]
id = "counter"
description = "Counts, slowly"
model = "default"

[model]
id = "default"
provider = "scripted"
upstream_model = "scripted"
context_window = 32000

[[script.turns]]
deltas = ["Counting slowly:", " one,", " two,", " three,", " four,", " five,", " six,", " seven,", " eight."]
delay_ms = 400
usage = { input_tokens = 40, output_tokens = 9 }

[[script.turns]]
deltas = ["Back down:", " seven,", " six,", " five,", " four,", " three,", " two,", " one."]
delay_ms = 400
usage = { input_tokens = 50, output_tokens = 8 }
"#,
    ),
];

/// The browser the page test drives.
fn chromium() -> PathBuf {
    std::env::var_os("AWAKEN_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from)
}

/// The page test's script, when Node, Chromium and `puppeteer-core` are there.
fn browser_test() -> Option<PathBuf> {
    let package = repo().join("tests/node/node_modules/puppeteer-core/package.json");
    peer_present(
        "the browser test's Chromium or puppeteer-core",
        true,
        &[package, chromium()],
        "AWAKEN_REQUIRE_BROWSER",
    )
    .then(|| repo().join("tests/node/page.mjs"))
}

#[test]
fn the_chat_page_approves_and_denies_calls_and_keeps_threads_across_reloads() {
    let Some(script) = browser_test() else {
        return;
    };
    let dir = temp_dir("page");
    let files: Vec<String> = AGENTS
        .iter()
        .map(|(name, body)| {
            let path = dir.join(name);
            std::fs::write(&path, body).expect("write the agent");
            path_str(&path).to_owned()
        })
        .collect();
    let screenshot = repo().join("target/chat-page.png");
    if let Some(parent) = screenshot.parent() {
        std::fs::create_dir_all(parent).expect("the target directory");
    }
    let _ = std::fs::remove_file(&screenshot);
    let browser = chromium();
    node_against_served(
        &script,
        &files,
        &[screenshot.as_os_str()],
        &[("AWAKEN_CHROMIUM", browser.as_os_str())],
        "ok: the chat page works",
    );
    assert!(
        is_png(&screenshot),
        "no screenshot at {}",
        screenshot.display()
    );
    // The approved call ran.
    let todo = std::fs::read_to_string(dir.join("notes/todo.txt")).expect("the approved append");
    assert_eq!(todo.trim(), "buy milk");
    let _ = std::fs::remove_dir_all(dir);
}

/// Whether `path` holds a PNG image.
fn is_png(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|b| b.starts_with(b"\x89PNG\r\n\x1a\n"))
}
