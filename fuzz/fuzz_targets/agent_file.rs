//! The agent file: the command's own loader (`crates/awaken-cli/src/agent_file.rs`, compiled
//! into this target: the command has no library) over a file holding the text, and the
//! `AgentSpec` parser (`awaken_spec`) over the text itself. Any text is a value or an error,
//! never a panic; what is accepted passes validation and reads back equal from the JSON and
//! TOML it writes (a spec is stored and digested as JSON).

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use awaken_spec::{AgentSpec, ModelSpec};
use libfuzzer_sys::fuzz_target;

#[allow(dead_code, unreachable_pub)]
#[path = "../../crates/awaken-cli/src/agent_file.rs"]
mod agent_file;

/// The file each input is written to (one per process: libFuzzer runs inputs one at a time).
fn file() -> &'static PathBuf {
    static FILE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = FILE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("agent.toml");
        (dir, path)
    });
    path
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(spec) = AgentSpec::from_toml_str(text) {
        round_trip(&spec);
    }
    std::fs::write(file(), text).expect("the input is written");
    if let Ok(loaded) = agent_file::AgentFile::load(file()) {
        loaded.agent.validate().expect("a loaded agent is valid");
        round_trip(&loaded.agent);
        if let Some(model) = &loaded.model {
            model.validate().expect("a loaded model is valid");
            let json = serde_json::to_string(model).expect("a model serializes");
            let back = ModelSpec::from_json_str(&json)
                .unwrap_or_else(|e| panic!("{json} does not read back: {e}"));
            assert_eq!(&back, model);
        }
        if let Some(script) = &loaded.script {
            script.validate().expect("a loaded script is valid");
        }
    }
});

/// `spec` reads back equal from its JSON and from its TOML.
fn round_trip(spec: &AgentSpec) {
    let json = serde_json::to_string(spec).expect("a spec serializes to JSON");
    let back = AgentSpec::from_json_str(&json)
        .unwrap_or_else(|e| panic!("{json} does not read back: {e}"));
    assert_eq!(&back, spec, "{json}");
    // TOML has no null: a section holding one has no TOML form.
    if let Ok(toml) = toml::to_string(spec) {
        let back = AgentSpec::from_toml_str(&toml)
            .unwrap_or_else(|e| panic!("{toml} does not read back: {e}"));
        assert_eq!(&back, spec, "{toml}");
    }
}
