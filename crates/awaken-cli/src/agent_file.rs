//! The agent file: an `AgentSpec` plus what only the command needs (the model and its
//! provider, more models with providers of their own, model pools over them, the scripted
//! provider's turns, declarative plugin directories, the built-in tools' settings). TOML;
//! unknown fields are errors naming the line, other mistakes name the field. Relative paths in
//! it (tool roots, plugin directories) are relative to the file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use awaken::llm::Script;
use awaken::spec::{
    AgentSpec, DurationSpec, McpServerSpec, ModelPoolSpec, ModelSpec, RETRY_SECTION, RetryConfig,
    SpecError, parse_toml,
};
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

/// `[[models]]`: a model with a provider of its own, which the agent or a model pool names by
/// its id.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModelEntry {
    /// The model id.
    pub(crate) id: String,
    /// The provider-side model name (required, except for the scripted provider).
    pub(crate) upstream_model: Option<String>,
    /// Context window in tokens.
    pub(crate) context_window: Option<u64>,
    /// Maximum output tokens per response.
    pub(crate) max_output_tokens: Option<u64>,
    /// How the model is reached: the fields of `[provider]` but `model` (default: scripted).
    #[serde(default)]
    pub(crate) provider: ProviderSection,
}

impl ModelEntry {
    /// The entry's provider (scripted when it names none).
    pub(crate) fn kind(&self) -> ProviderKind {
        self.provider.kind.unwrap_or_default()
    }

    /// The model spec the entry declares, served by provider `provider_id`.
    pub(crate) fn spec(&self, provider_id: &str) -> ModelSpec {
        let upstream = self
            .upstream_model
            .clone()
            .unwrap_or_else(|| ProviderKind::Scripted.name().to_owned());
        let mut spec = ModelSpec::new(self.id.clone(), provider_id, upstream);
        spec.context_window = self.context_window;
        spec.max_output_tokens = self.max_output_tokens;
        spec
    }
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

/// Where a provider table is: the main `[provider]`, or a `[[models]]` entry's.
pub(crate) enum ProviderPlace {
    /// `[provider]`.
    Main,
    /// `models[index].provider`, of the model `id`.
    Entry {
        /// The entry's position.
        index: usize,
        /// The entry's model id.
        id: String,
    },
}

impl ProviderPlace {
    /// The table, as a message names it.
    pub(crate) fn table(&self) -> String {
        match self {
            ProviderPlace::Main => "[provider]".to_owned(),
            ProviderPlace::Entry { index, .. } => format!("models[{index}].provider"),
        }
    }

    /// The table's retry policy, as a message names it.
    pub(crate) fn retry_table(&self) -> String {
        match self {
            ProviderPlace::Main => "[provider.retry]".to_owned(),
            ProviderPlace::Entry { index, .. } => format!("models[{index}].provider.retry"),
        }
    }

    /// A field of the table, as a message names it (`[provider] retry`,
    /// `models[0].provider.retry`).
    pub(crate) fn field(&self, key: &str) -> String {
        match self {
            ProviderPlace::Main => format!("[provider] {key}"),
            ProviderPlace::Entry { index, .. } => format!("models[{index}].provider.{key}"),
        }
    }
}

/// `error` with the leading `from` of the field it names replaced by `to`
/// (`model_pool.members[0].weight` → `model_pools[2].members[0].weight`).
fn with_field_prefix(error: SpecError, from: &str, to: &str) -> anyhow::Error {
    match error {
        SpecError::Invalid { field, reason } => {
            let field = match field.strip_prefix(from) {
                Some(rest) => format!("{to}{rest}"),
                None => field,
            };
            anyhow::anyhow!("{field}: {reason}")
        }
        other => anyhow::anyhow!("{to}: {other}"),
    }
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
    /// More models, each with its provider.
    #[serde(default)]
    pub(crate) models: Vec<ModelEntry>,
    /// Model pools over the file's models.
    #[serde(default)]
    pub(crate) model_pools: Vec<ModelPoolSpec>,
    pub(crate) script: Option<Script>,
    #[serde(default)]
    pub(crate) tools: ToolsSection,
    #[serde(default)]
    pub(crate) plugins: PluginsSection,
    /// MCP servers whose tools the agent uses.
    #[serde(default)]
    pub(crate) mcp_servers: Vec<McpServerSpec>,
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
        if file.agent.endpoint.is_some() {
            file.check_remote()
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            return Ok(file);
        }
        if let Some(model) = &file.model {
            model
                .validate()
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        }
        let kind = file
            .provider_kind()
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        file.check_provider(&file.provider, kind, &ProviderPlace::Main)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        file.check_models()
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
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
        for (i, server) in file.mcp_servers.iter().enumerate() {
            server.validate().map_err(|e| {
                anyhow::anyhow!("{}: [[mcp_servers]] #{}: {e}", path.display(), i + 1)
            })?;
            if file.mcp_servers[..i].iter().any(|s| s.name == server.name) {
                anyhow::bail!(
                    "{}: [[mcp_servers]] #{}: the name `{}` is taken by an earlier entry",
                    path.display(),
                    i + 1,
                    server.name
                );
            }
        }
        // A stdio server's directory is relative to the agent file, as other paths are.
        for server in &mut file.mcp_servers {
            if let Some(cwd) = &mut server.cwd
                && Path::new(cwd.as_str()).is_relative()
            {
                *cwd = base.join(cwd.as_str()).display().to_string();
            }
        }
        Ok(file)
    }

    /// Whether the file's main model (`[model]` with `[provider]`) is registered: when the
    /// file has a `[model]` table, or when the agent's model names no `[[models]]` entry and no
    /// `[[model_pools]]` entry (the single-model form, whose model id is the agent's model).
    pub(crate) fn has_main_model(&self) -> bool {
        if self.agent.endpoint.is_some() {
            return false;
        }
        self.model.is_some()
            || !(self.models.iter().any(|m| m.id == self.agent.model)
                || self.model_pools.iter().any(|p| p.id == self.agent.model))
    }

    /// The id of the main model, when it is registered.
    pub(crate) fn main_model_id(&self) -> Option<&str> {
        self.has_main_model().then(|| {
            self.model
                .as_ref()
                .map_or(self.agent.model.as_str(), |m| m.id.as_str())
        })
    }

    /// The model pool the agent's model names, if it names one.
    pub(crate) fn agent_pool(&self) -> Option<&ModelPoolSpec> {
        self.model_pools.iter().find(|p| p.id == self.agent.model)
    }

    /// Whether model `id` is a member of the agent's model pool: its executor then goes
    /// without retries (the pool is retried instead).
    pub(crate) fn in_agent_pool(&self, id: &str) -> bool {
        self.agent_pool()
            .is_some_and(|p| p.members.iter().any(|m| m.model == id))
    }

    /// Checks a provider table: its retry policy (never twice, and never on a member of the
    /// agent's pool, whose retries would delay the pool's failover), its key variable, the
    /// fields its kind takes.
    fn check_provider(
        &self,
        section: &ProviderSection,
        kind: ProviderKind,
        place: &ProviderPlace,
    ) -> Result<()> {
        if let Some(retry) = &section.retry {
            retry
                .validate()
                .map_err(|e| anyhow::anyhow!("{} {e}", place.table()))?;
            if self.agent.sections.get(RETRY_SECTION).is_some() {
                anyhow::bail!(
                    "retry is configured twice ({} and [agent.sections.retry]); keep one",
                    place.retry_table()
                );
            }
            let model = match place {
                ProviderPlace::Main => self.main_model_id(),
                ProviderPlace::Entry { id, .. } => Some(id.as_str()),
            };
            if let Some(pool) = model
                .filter(|m| self.in_agent_pool(m))
                .and_then(|_| self.agent_pool())
            {
                anyhow::bail!(
                    "{}: model `{}` is a member of model pool `{}`, and a member's retries \
                     would delay the pool's failover; retry the pool with [agent.sections.retry]",
                    place.field("retry"),
                    model.unwrap_or_default(),
                    pool.id
                );
            }
        }
        if let Some(env) = &section.api_key_env
            && (env.is_empty() || env.contains(['=', '\0', '$']))
        {
            anyhow::bail!(
                "{}: {env:?} is not an environment variable name",
                place.field("api_key_env")
            );
        }
        if kind == ProviderKind::Anthropic {
            let openai_only = [
                ("max_tokens_field", section.max_tokens_field.is_some()),
                ("stream", section.stream.is_some()),
                ("include_usage", section.include_usage.is_some()),
            ];
            if let Some((key, _)) = openai_only.iter().find(|(_, set)| *set) {
                anyhow::bail!(
                    "{} applies to kind = \"openai\" only (the anthropic provider always streams and reports usage)",
                    place.field(key)
                );
            }
        }
        Ok(())
    }

    /// A remote agent (`[agent.endpoint]`) runs on its host: the file configures nothing that
    /// would run here.
    fn check_remote(&self) -> Result<()> {
        let local = [
            ("[model]", self.model.is_some()),
            (
                "[provider]",
                self.provider.kind.is_some()
                    || self.provider.base_url.is_some()
                    || self.provider.model.is_some()
                    || self.provider.api_key_env.is_some(),
            ),
            ("[[models]]", !self.models.is_empty()),
            ("[[model_pools]]", !self.model_pools.is_empty()),
            ("[script]", self.script.is_some()),
            (
                "[tools]",
                self.tools.read_file.is_some()
                    || self.tools.append_file.is_some()
                    || self.tools.http_get.is_some(),
            ),
            ("[plugins]", !self.plugins.dirs.is_empty()),
            ("[[mcp_servers]]", !self.mcp_servers.is_empty()),
        ];
        match local.iter().find(|(_, given)| *given) {
            Some((section, _)) => anyhow::bail!(
                "agent `{}` runs at its endpoint: {section} has no use in its file",
                self.agent.id
            ),
            None => Ok(()),
        }
    }

    /// Checks `[[models]]` and `[[model_pools]]`: each entry and its provider, every id
    /// declared once (a pool's id shares the namespace of model ids), and each pool's members
    /// naming models of the file.
    fn check_models(&self) -> Result<()> {
        // Every model id the file declares, with where it is declared.
        let mut declared: Vec<(&str, String)> = Vec::new();
        if let Some(model) = &self.model {
            declared.push((model.id.as_str(), "[model]".to_owned()));
        }
        for (i, entry) in self.models.iter().enumerate() {
            let place = ProviderPlace::Entry {
                index: i,
                id: entry.id.clone(),
            };
            if entry.id.trim().is_empty() {
                anyhow::bail!("models[{i}].id: must not be blank");
            }
            if entry.provider.model.is_some() {
                anyhow::bail!(
                    "{}: a model entry names its provider-side model with models[{i}].upstream_model",
                    place.field("model")
                );
            }
            let kind = entry.kind();
            if kind != ProviderKind::Scripted
                && entry
                    .upstream_model
                    .as_deref()
                    .is_none_or(|u| u.trim().is_empty())
            {
                anyhow::bail!(
                    "models[{i}].upstream_model: required for kind = {:?} (the model's name at the provider)",
                    kind.name()
                );
            }
            entry
                .spec("entry")
                .validate()
                .map_err(|e| with_field_prefix(e, "model", &format!("models[{i}]")))?;
            self.check_provider(&entry.provider, kind, &place)?;
            if let Some((_, first)) = declared.iter().find(|(id, _)| *id == entry.id) {
                anyhow::bail!(
                    "models[{i}].id: model `{}` is declared twice ({first} and models[{i}])",
                    entry.id
                );
            }
            declared.push((entry.id.as_str(), format!("models[{i}]")));
        }
        // The main model in its single-model form takes the agent's model id.
        let main = self.main_model_id();
        for (i, pool) in self.model_pools.iter().enumerate() {
            pool.validate()
                .map_err(|e| with_field_prefix(e, "model_pool", &format!("model_pools[{i}]")))?;
            if let Some((_, first)) = declared.iter().find(|(id, _)| *id == pool.id) {
                anyhow::bail!(
                    "model_pools[{i}].id: `{}` is declared twice ({first} and model_pools[{i}]); model and pool ids share one namespace",
                    pool.id
                );
            }
            declared.push((pool.id.as_str(), format!("model_pools[{i}]")));
        }
        for (i, pool) in self.model_pools.iter().enumerate() {
            for (j, member) in pool.members.iter().enumerate() {
                let field = format!("model_pools[{i}].members[{j}].model");
                if self.model_pools.iter().any(|p| p.id == member.model) {
                    anyhow::bail!(
                        "{field}: `{}` is a model pool; a pool's members are models",
                        member.model
                    );
                }
                let known = main == Some(member.model.as_str())
                    || self.models.iter().any(|m| m.id == member.model);
                if !known {
                    let mut models: Vec<String> = main
                        .into_iter()
                        .chain(self.models.iter().map(|m| m.id.as_str()))
                        .map(|id| format!("`{id}`"))
                        .collect();
                    models.dedup();
                    let models = if models.is_empty() {
                        "none".to_owned()
                    } else {
                        models.join(", ")
                    };
                    anyhow::bail!(
                        "{field}: `{}` is not a model of this file (its models: {models})",
                        member.model
                    );
                }
            }
        }
        Ok(())
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
