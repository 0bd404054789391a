//! The agent file: an `AgentSpec` plus what only the command needs (the model, the provider,
//! the scripted provider's turns, declarative plugin directories, the built-in tools'
//! settings). TOML; unknown fields are errors naming the line. Relative paths in it (tool roots,
//! plugin directories) are relative to the file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use awaken::llm::Script;
use awaken::spec::{AgentSpec, DurationSpec, ModelSpec, RETRY_SECTION, RetryConfig, parse_toml};
use awaken_net::{HostAllowList, IpRange};
use serde::Deserialize;

/// Which provider runs the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ProviderKind {
    /// The deterministic scripted provider (the offline default).
    #[default]
    Scripted,
    /// An OpenAI-compatible chat-completions endpoint.
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
}

impl ProviderKind {
    /// The provider's name in a model entry (`[model] provider`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            ProviderKind::Scripted => "scripted",
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
        }
    }
}

/// Which request field carries the completion-token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TokensField {
    /// `max_tokens` (OpenAI-compatible servers: vLLM, Ollama, llama.cpp, LM Studio).
    MaxTokens,
    /// `max_completion_tokens` (OpenAI's reasoning models).
    MaxCompletionTokens,
}

/// `[provider]`: which provider runs the model and how it is reached.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProviderSection {
    /// The provider; when absent, `[model] provider`, else `scripted`.
    pub(crate) kind: Option<ProviderKind>,
    /// Base URL of the provider: for `openai`, the server's API root up to its version
    /// segment; for `anthropic`, the API root (`/v1` optional). Default: `AWAKEN_BASE_URL`,
    /// else the provider's own.
    pub(crate) base_url: Option<String>,
    /// The provider-side model name.
    pub(crate) model: Option<String>,
    /// The environment variable holding the API key (default `OPENAI_API_KEY`, or
    /// `ANTHROPIC_API_KEY` for `anthropic`). The key itself is never written in the file.
    pub(crate) api_key_env: Option<String>,
    /// Extra HTTP headers sent with every request; `${VAR}` in a value reads the environment.
    #[serde(default)]
    pub(crate) headers: std::collections::BTreeMap<String, String>,
    /// How long to wait for the connection (default 10 s).
    pub(crate) connect_timeout: Option<DurationSpec>,
    /// How long to wait for the response to begin (default 120 s).
    pub(crate) first_byte_timeout: Option<DurationSpec>,
    /// How long a streamed response may stay silent between two chunks (default 120 s).
    pub(crate) idle_timeout: Option<DurationSpec>,
    /// Which request field carries the token limit (default `max_tokens`; `openai` only).
    pub(crate) max_tokens_field: Option<TokensField>,
    /// Whether to stream the answer (default true; `openai` only: `anthropic` always streams).
    pub(crate) stream: Option<bool>,
    /// Whether to ask a streamed response for token usage (default true; turn off for servers
    /// that reject `stream_options`; `openai` only).
    pub(crate) include_usage: Option<bool>,
    /// How failed calls are retried (default: up to 3 retries of transient errors).
    pub(crate) retry: Option<RetryConfig>,
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

/// `[tools.http_get]`: the built-in HTTP GET, limited to `allow_hosts` at public addresses.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HttpGetSettings {
    /// Host names or IP addresses; `*.example.com` allows the subdomains of `example.com`.
    pub(crate) allow_hosts: Vec<String>,
    /// CIDR ranges or addresses (`"10.0.0.0/8"`, `"127.0.0.1"`) reached although the guard
    /// refuses them by default (loopback, private, link-local, ...); none by default.
    #[serde(default)]
    pub(crate) allow_ranges: Vec<String>,
    /// `allow_ranges`, parsed when the file is loaded.
    #[serde(skip)]
    pub(crate) ranges: Vec<IpRange>,
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
        if let Some(retry) = &file.provider.retry {
            retry
                .validate()
                .map_err(|e| anyhow::anyhow!("{}: [provider] {e}", path.display()))?;
            if file.agent.sections.get(RETRY_SECTION).is_some() {
                anyhow::bail!(
                    "{}: retry is configured twice ([provider.retry] and [agent.sections.retry]); keep one",
                    path.display()
                );
            }
        }
        if let Some(env) = &file.provider.api_key_env
            && (env.is_empty() || env.contains(['=', '\0', '$']))
        {
            anyhow::bail!(
                "{}: [provider] api_key_env: {env:?} is not an environment variable name",
                path.display()
            );
        }
        let kind = file
            .provider_kind()
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        if kind == ProviderKind::Anthropic {
            let section = &file.provider;
            let openai_only = [
                ("max_tokens_field", section.max_tokens_field.is_some()),
                ("stream", section.stream.is_some()),
                ("include_usage", section.include_usage.is_some()),
            ];
            if let Some((key, _)) = openai_only.iter().find(|(_, set)| *set) {
                anyhow::bail!(
                    "{}: [provider] {key} applies to kind = \"openai\" only (the anthropic provider always streams and reports usage)",
                    path.display()
                );
            }
        }
        if let Some(script) = &file.script {
            script
                .validate()
                .map_err(|e| anyhow::anyhow!("{}: [script]: {e}", path.display()))?;
        }
        if let Some(http) = &mut file.tools.http_get {
            HostAllowList::new(http.allow_hosts.iter().map(String::as_str)).map_err(|e| {
                anyhow::anyhow!(
                    "{}: tools.http_get.allow_hosts[{}]: expected a host name such as \"example.com\" or \"*.example.com\" (no scheme, port or path)",
                    path.display(),
                    e.index
                )
            })?;
            http.ranges = http
                .allow_ranges
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    r.parse::<IpRange>().map_err(|e| {
                        anyhow::anyhow!("{}: tools.http_get.allow_ranges[{i}]: {e}", path.display())
                    })
                })
                .collect::<Result<_>>()?;
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

    /// The provider the file names: `[provider] kind`, else `[model] provider`, else the
    /// scripted one. The environment never changes it.
    pub(crate) fn provider_kind(&self) -> Result<ProviderKind> {
        let from_model = match self.model.as_ref().map(|m| m.provider.as_str()) {
            None => None,
            Some("scripted") => Some(ProviderKind::Scripted),
            Some("openai") => Some(ProviderKind::Openai),
            Some("anthropic") => Some(ProviderKind::Anthropic),
            Some(other) => anyhow::bail!(
                "[model] provider = {other:?}: the command runs \"scripted\", \"openai\" or \"anthropic\""
            ),
        };
        match (self.provider.kind, from_model) {
            (Some(kind), Some(model)) if kind != model => anyhow::bail!(
                "[provider] kind = {:?} but [model] provider = {:?}; name one provider",
                kind.name(),
                model.name()
            ),
            (kind, model) => Ok(kind.or(model).unwrap_or_default()),
        }
    }
}
