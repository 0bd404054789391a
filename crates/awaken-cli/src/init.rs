//! `awaken init [DIR]`: a starter project a user can run at once and then edit: an offline
//! scripted agent, an agent for an OpenAI-compatible endpoint and a declarative plugin, each
//! commented. Existing files are never overwritten.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};

use crate::args::Args;
use crate::output::shell_word;
use crate::term::{errln, outln};
use crate::{Exit, bad_input};

/// The offline agent: scripted, with the file reader and the starter plugin.
const AGENT: &str = r#"# An agent that runs offline: the scripted provider replays [script], turn by turn.
#   awaken run --agent agent.toml "What is in notes.md?"
#   awaken chat --agent agent.toml
# Switch [provider] to an OpenAI-compatible endpoint when you are ready (see openai.toml).

[agent]
id = "starter"
model = "default"
system_prompt = "You are a concise assistant. Read files with read_file before answering."
# Most inference rounds per run.
max_rounds = 4
# Plugins the agent activates, by id: the standard permission plugin (it reads the
# `permission` section below) and plugins/style.toml.
plugin_ids = ["awaken.permission", "style"]

# Ask before a tool runs: `allow`, `deny` or `ask` (ask suspends the call until you decide).
[agent.sections.permission]
default = "allow"
rules = [{ tool = "append_file", decision = "ask" }]

# The model the agent names.
[model]
id = "default"
provider = "scripted"
upstream_model = "scripted"
context_window = 32000

# Directories of declarative plugins (relative to this file).
[plugins]
dirs = ["plugins"]

# Built-in tools, each confined to a directory (relative to this file).
[tools.read_file]
root = "."

[tools.append_file]
root = "notes"

# What the scripted model says. Each user message starts from the first turn.
[[script.turns]]
text = "Let me read the notes first."
tool_calls = [{ id = "call_1", name = "read_file", arguments = { path = "notes.md" } }]

[[script.turns]]
text = "The notes say what this starter contains: an agent, a plugin and a notes file."
"#;

/// The agent on an OpenAI-compatible endpoint.
const OPENAI: &str = r#"# An agent on an OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, LM Studio, ...).
#   OPENAI_API_KEY=sk-... awaken run --agent openai.toml "What is in notes.md?"
#   AWAKEN_BASE_URL=http://127.0.0.1:11434/v1 awaken chat --agent openai.toml --model llama3.2
# The key comes from the environment only (api_key_env), never from this file.

[agent]
id = "starter-openai"
model = "default"
system_prompt = "You are a concise assistant. Read files with read_file before answering."
max_rounds = 6
plugin_ids = ["style"]

[provider]
kind = "openai"
# The API root up to its version segment (default: AWAKEN_BASE_URL, else OpenAI's).
# base_url = "http://127.0.0.1:11434/v1"
model = "gpt-4o-mini"
api_key_env = "OPENAI_API_KEY"
connect_timeout = "10s"
# Until the first byte of the answer, and between two streamed chunks.
first_byte_timeout = "60s"
idle_timeout = "60s"
# headers = { "OpenAI-Organization" = "${OPENAI_ORG}" }

# Transient failures (429, 5xx, timeouts, refused connections) are retried by default;
# this section tunes it (max_retries = 0 turns it off).
[provider.retry]
max_retries = 3
initial_backoff = "500ms"
max_backoff = "30s"

[plugins]
dirs = ["plugins"]

[tools.read_file]
root = "."
"#;

/// A declarative plugin.
const PLUGIN: &str = r#"# A declarative plugin: no Rust code. Check it with `awaken plugins --dir plugins`.
id = "style"
version = "1.0.0"
enabled = true
# Higher priority goes first among plugins whose dependencies are placed.
priority = 0
depends_on = []

# Appended to the system prompt of every agent that activates this plugin.
prompt_fragments = ["Keep answers under five sentences unless asked for more."]

# After a call of a tool whose name matches `tool`, `text` reaches the model before its next
# answer.
[[reminders]]
tool = "read_*"
text = "Quote the lines you rely on."
"#;

/// A file for the agent to read.
const NOTES: &str = "# Notes\n\nThis starter holds agent.toml (offline), openai.toml (a network \
model) and plugins/style.toml (a declarative plugin).\n";

/// `awaken init [DIR]`.
pub(crate) fn init(args: Args) -> Result<u8, Exit> {
    let dir = args
        .positional
        .first()
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    let files: [(&str, &str); 4] = [
        ("agent.toml", AGENT),
        ("openai.toml", OPENAI),
        ("plugins/style.toml", PLUGIN),
        ("notes.md", NOTES),
    ];
    let existing: Vec<String> = files
        .iter()
        .map(|(name, _)| dir.join(name))
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if !existing.is_empty() {
        return Err(bad_input(anyhow!(
            "not overwriting {}; pick another directory (awaken init DIR)",
            existing.join(", ")
        )));
    }
    for (name, text) in files {
        write_new(&dir.join(name), text)?;
        if !args.quiet {
            outln!("wrote {}", dir.join(name).display());
        }
    }
    if !args.quiet {
        let agent = shell_word(&dir.join("agent.toml").display().to_string());
        errln!(
            "next:\n  awaken run --agent {agent} \"What is in notes.md?\"\n  awaken chat --agent {agent}"
        );
    }
    Ok(0)
}

/// Writes `text` to a new file at `path` (its directory created), never replacing one.
fn write_new(path: &Path, text: &str) -> Result<(), Exit> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    std::io::Write::write_all(&mut file, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
