//! The agent file: an `AgentSpec` plus what only the command needs (the model, the provider,
//! the scripted provider's turns, the built-in tools' settings). TOML; unknown fields are
//! errors naming the line.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use awaken::llm::Script;
use awaken::spec::{AgentSpec, ModelSpec, parse_toml};
use serde::Deserialize;

/// Which provider runs the model.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ProviderKind {
    /// The deterministic scripted provider (the offline default).
    #[default]
    Scripted,
    /// An OpenAI-compatible chat-completions endpoint.
    Openai,
}

/// `[provider]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProviderSection {
    #[serde(default)]
    pub(crate) kind: ProviderKind,
    /// Base URL of an OpenAI-compatible server (default: `AWAKEN_BASE_URL`, else OpenAI's).
    pub(crate) base_url: Option<String>,
    /// The provider-side model name.
    pub(crate) model: Option<String>,
}

/// `[tools.read_file]`: the built-in file reader, confined to `root`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadFileSettings {
    pub(crate) root: PathBuf,
}

/// `[tools]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolsSection {
    pub(crate) read_file: Option<ReadFileSettings>,
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentFile {
    pub(crate) agent: AgentSpec,
    pub(crate) model: Option<ModelSpec>,
    #[serde(default)]
    pub(crate) provider: ProviderSection,
    pub(crate) script: Option<Script>,
    #[serde(default)]
    pub(crate) tools: ToolsSection,
}

impl AgentFile {
    /// Reads and validates `path`; errors name the file and the line.
    pub(crate) fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let mut file: AgentFile = parse_toml(&text).map_err(|e| {
            let line = e.line().map(|l| format!(":{l}")).unwrap_or_default();
            anyhow::anyhow!("{}{line}: {e}", path.display())
        })?;
        file.agent
            .validate()
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        if let Some(model) = &file.model {
            model
                .validate()
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        }
        if let Some(script) = &file.script {
            script
                .validate()
                .map_err(|e| anyhow::anyhow!("{}: [script]: {e}", path.display()))?;
        }
        if let Some(rf) = &mut file.tools.read_file {
            // A relative root is relative to the agent file.
            if rf.root.is_relative() {
                rf.root = path.parent().unwrap_or(Path::new(".")).join(&rf.root);
            }
        }
        Ok(file)
    }
}
