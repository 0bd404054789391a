//! `awaken serve`'s AI SDK edge read by the `ai` package's own client (`tests/node/ai-sdk.mjs`,
//! pinned by `tests/node/package-lock.json`): text, reasoning, tool outputs and errors, an
//! approval round trip, a model error, and a resume after a dropped connection.

use std::path::Path;

use super::serve::node_against_served;
use crate::{
    BROKEN, REQUIRE_NODE_PEERS, SCRIBE, peer_present, repo, temp_dir, write_scripted_agents,
};

/// The agents `ai-sdk.mjs` talks to, written to `dir`; their paths.
fn agents(dir: &Path) -> Vec<String> {
    std::fs::write(dir.join("notes.md"), "hello from the notes\n").expect("write the notes");
    let files = [
        (
            "reader.toml",
            r#"[agent]
id = "reader"
model = "default"

[tools.read_file]
root = "."

[[script.turns]]
reasoning = "The user wants the notes."
text = "Reading the notes."
tool_calls = [
  { id = "call_ok", name = "read_file", arguments = { path = "notes.md" } },
  { id = "call_missing", name = "read_file", arguments = { path = "missing.md" } },
]

[[script.turns]]
text = "The notes say hello."
"#,
        ),
        ("scribe.toml", SCRIBE),
        ("broken.toml", BROKEN),
        (
            "slow.toml",
            r#"[agent]
id = "slow"
model = "default"

[[script.turns]]
deltas = ["One ", "two ", "three ", "four ", "five."]
delay_ms = 300
"#,
        ),
    ];
    write_scripted_agents(dir, &files)
}

/// The script, when Node and the `ai` package are installed.
fn client() -> Option<std::path::PathBuf> {
    let package = repo().join("tests/node/node_modules/ai/package.json");
    peer_present("the AI SDK client", true, &[package], REQUIRE_NODE_PEERS)
        .then(|| repo().join("tests/node/ai-sdk.mjs"))
}

#[test]
fn the_ai_sdk_client_reads_the_servers_ui_message_streams() {
    let Some(script) = client() else {
        return;
    };
    let dir = temp_dir("ai-sdk");
    let files = agents(&dir);
    node_against_served(&script, &files, &[], &[], "all AI SDK checks passed");
    // The approved call ran.
    let todo = std::fs::read_to_string(dir.join("notes/todo.txt")).expect("the approved append");
    assert_eq!(todo.trim(), "buy milk");
    let _ = std::fs::remove_dir_all(dir);
}
