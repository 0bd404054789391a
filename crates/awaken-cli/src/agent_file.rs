//! The agent file: an `AgentSpec` plus what only the command needs (the model, the provider,
//! the scripted provider's turns, declarative plugin directories, the built-in tools'
//! settings). TOML; unknown fields are errors naming the line. Relative paths in it (tool roots,
//! plugin directories) are relative to the file.

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

/// `[tools.append_file]`: the built-in line appender, confined to `root` (created if missing).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AppendFileSettings {
    pub(crate) root: PathBuf,
}

/// `[tools.http_get]`: the built-in HTTP GET, limited to `allow_hosts`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HttpGetSettings {
    /// Host names or IP addresses; `*.example.com` allows the subdomains of `example.com`.
    pub(crate) allow_hosts: Vec<String>,
    /// Most bytes of a response body returned (default 64 KiB).
    pub(crate) max_bytes: Option<u64>,
}

/// `[tools]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolsSection {
    pub(crate) read_file: Option<ReadFileSettings>,
    pub(crate) append_file: Option<AppendFileSettings>,
    pub(crate) http_get: Option<HttpGetSettings>,
}

/// `[plugins]`: directories of declarative plugin manifests to load (`*.toml`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PluginsSection {
    #[serde(default)]
    pub(crate) dirs: Vec<PathBuf>,
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentFile {
    /// Where the file was read from.
    #[serde(skip)]
    pub(crate) path: PathBuf,
    pub(crate) agent: AgentSpec,
    pub(crate) model: Option<ModelSpec>,
    #[serde(default)]
    pub(crate) provider: ProviderSection,
    pub(crate) script: Option<Script>,
    #[serde(default)]
    pub(crate) tools: ToolsSection,
    #[serde(default)]
    pub(crate) plugins: PluginsSection,
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
        file.path = path.to_path_buf();
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
        let hosts = file.tools.http_get.iter().flat_map(|h| &h.allow_hosts);
        if let Some((i, _)) = hosts.enumerate().find(|(_, h)| {
            h.trim().is_empty()
                || h.contains(['/', ' ', '@'])
                || (h.contains(':') && h.parse::<std::net::Ipv6Addr>().is_err())
        }) {
            anyhow::bail!(
                "{}: tools.http_get.allow_hosts[{i}]: expected a host name such as \"example.com\" or \"*.example.com\" (no scheme, port or path)",
                path.display()
            );
        }
        // Relative paths are relative to the agent file.
        let base = path.parent().unwrap_or(Path::new("."));
        let anchor = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        if let Some(rf) = &mut file.tools.read_file {
            anchor(&mut rf.root);
        }
        if let Some(af) = &mut file.tools.append_file {
            anchor(&mut af.root);
        }
        file.plugins.dirs.iter_mut().for_each(anchor);
        Ok(file)
    }
}
