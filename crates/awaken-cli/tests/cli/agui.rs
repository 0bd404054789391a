//! `awaken serve`'s AG-UI edge read by `@ag-ui/client`'s own `HttpAgent` (`tests/node/agui.mjs`,
//! pinned by `tests/node/package-lock.json`), whose run pipeline verifies every stream: text
//! and a tool call, an interrupt answered by a resume, a model error, and a message sent to a
//! run in flight.

use std::path::{Path, PathBuf};

use super::serve::node_against_served;
use crate::{
    BROKEN, REQUIRE_NODE_PEERS, SCRIBE, peer_present, repo, temp_dir, write_scripted_agents,
};

/// The agents `agui.mjs` talks to, written to `dir` with the note `reader` reads; their paths.
/// (A scripted agent plays its script from the start on each new prompt, so each scenario has
/// its own agent.)
fn agents(dir: &Path) -> Vec<String> {
    std::fs::write(dir.join("note.txt"), "hello from the note\n").expect("write the note");
    let files = [
        (
            "reader.toml",
            r#"[agent]
id = "reader"
model = "default"

[tools.read_file]
root = "."

[[script.turns]]
reasoning = "The user wants the note."
text = "Let me read it. "
tool_calls = [{ id = "call_read", name = "read_file", arguments = { path = "note.txt" } }]

[[script.turns]]
deltas = ["The note says: ", "hello."]
"#,
        ),
        ("scribe.toml", SCRIBE),
        ("broken.toml", BROKEN),
        (
            "barista.toml",
            r#"[agent]
id = "barista"
model = "default"

[[script.turns]]
deltas = ["Making ", "coffee."]
delay_ms = 300

[[script.turns]]
text = "Tea too."
"#,
        ),
    ];
    write_scripted_agents(dir, &files)
}

/// The script, when Node and `@ag-ui/client` are installed.
fn client() -> Option<PathBuf> {
    let package = repo().join("tests/node/node_modules/@ag-ui/client/package.json");
    peer_present("the AG-UI client", true, &[package], REQUIRE_NODE_PEERS)
        .then(|| repo().join("tests/node/agui.mjs"))
}

#[test]
fn the_ag_ui_client_runs_verifies_and_resumes_the_servers_streams() {
    let Some(script) = client() else {
        return;
    };
    let dir = temp_dir("agui");
    let files = agents(&dir);
    node_against_served(&script, &files, &[], &[], "agui: all checks passed");
    // The approved call ran.
    let todo = std::fs::read_to_string(dir.join("notes/todo.txt")).expect("the approved append");
    assert_eq!(todo.trim(), "buy milk");
    let _ = std::fs::remove_dir_all(dir);
}
