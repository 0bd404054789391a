//! Builds what a command needs from the agent file and the command line: the store, the
//! providers (scripted, OpenAI-compatible or Anthropic) of the file's models, its model pools,
//! the built-in tools, the declarative plugins and the runtime.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use awaken::a2a::A2aBackend;
use awaken::event::ThreadId;
use awaken::llm::anthropic::{AnthropicConfig, AnthropicExecutor};
use awaken::llm::openai::{MaxTokensField, OpenAiConfig, OpenAiExecutor};
use awaken::llm::{LlmExecutor, RetryingExecutor, Script};
use awaken::mcp::McpServer;
use awaken::plugin::PluginRegistry;
use awaken::runtime::{AgentRuntime, AgentRuntimeBuilder};
use awaken::spec::{
    AgentSpec, Glob, McpServerSpec, ModelPoolSpec, ModelSpec, RETRY_SECTION, RetryConfig,
};
use awaken::tool::Tool;
use awaken_store::{
    Checkpoint, MemoryStore, PostgresConfig, PostgresStore, SqliteConfig, SqliteStore, StoreError,
    StoreErrorKind, ThreadStore,
};

use crate::agent_file::{AgentFile, ProviderKind, ProviderPlace, ProviderSection, TokensField};
use crate::args::{Args, USAGE};
use crate::script::ThreadScript;
use crate::tools;
use crate::{Exit, bad_input};

/// The store used when `--store` is not given.
pub(crate) const DEFAULT_STORE: &str = "sqlite:./.awaken/awaken.db";

/// Whether opening a store may create it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Open {
    /// Create a missing SQLite file and its directory (commands that run agents).
    Create,
    /// The store must exist already (commands that read or answer what is stored).
    Existing,
}

/// Opens the store `spec` names: `sqlite:PATH` (default `sqlite:./.awaken/awaken.db`),
/// `postgres:URL` (or a `postgres://` URL) or `memory`.
pub(crate) async fn open_store(spec: Option<&str>, open: Open) -> Result<Arc<dyn ThreadStore>> {
    let spec = spec.unwrap_or(DEFAULT_STORE);
    if spec == "memory" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    if let Some(url) = postgres_url(spec) {
        let store = PostgresStore::connect(PostgresConfig::new(url))
            .await
            .context("cannot open the PostgreSQL store")?;
        return Ok(Arc::new(store));
    }
    let Some(path) = spec.strip_prefix("sqlite:") else {
        bail!("unsupported store `{spec}`: use sqlite:PATH, postgres:URL or memory");
    };
    let path = Path::new(path);
    if open == Open::Existing && !path.exists() {
        bail!(
            "no store at {}: nothing has run with this store yet (`awaken run` creates it)",
            path.display()
        );
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let store = SqliteStore::open(SqliteConfig::file(path))
        .await
        .map_err(|e| {
            // The store's own errors name the file; the others get it here.
            let what = if e.database().is_some() {
                "cannot open the SQLite store".to_owned()
            } else {
                format!("cannot open the SQLite store {}", path.display())
            };
            anyhow::Error::new(e).context(what)
        })?;
    Ok(Arc::new(store))
}

/// The URL of a PostgreSQL store spec: `postgres:URL`, or the URL itself.
fn postgres_url(spec: &str) -> Option<&str> {
    if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        Some(spec)
    } else {
        spec.strip_prefix("postgres:")
    }
}

/// The PostgreSQL store of a fleet (`serve --queue`, `worker`), with `connections` pooled
/// connections: `command` names what needs it when `spec` is not a PostgreSQL store.
pub(crate) async fn open_fleet_store(
    spec: Option<&str>,
    command: &str,
    connections: usize,
) -> Result<PostgresStore> {
    let Some(url) = spec.and_then(postgres_url) else {
        bail!(
            "{command} needs the fleet's PostgreSQL store: --store postgres://USER@HOST:PORT/DATABASE"
        );
    };
    PostgresStore::connect(PostgresConfig::new(url).with_max_connections(connections))
        .await
        .context("cannot open the PostgreSQL store")
}

/// The exit of a command whose store could not be opened: 1 when the store itself failed (a
/// damaged or unreadable database, a full disk, a server that cannot be reached), 2 when the
/// command's store setting is wrong (bad input).
pub(crate) fn open_failed(error: anyhow::Error) -> Exit {
    let failed = error
        .chain()
        .find_map(|c| c.downcast_ref::<StoreError>())
        .is_some_and(|e| e.kind() != StoreErrorKind::Config);
    if failed {
        Exit { code: 1, error }
    } else {
        bad_input(error)
    }
}

/// Whether `spec` names the in-memory store, which keeps nothing past the process.
pub(crate) fn is_memory_store(spec: Option<&str>) -> bool {
    spec == Some("memory")
}

/// The thread named by the command's one positional word, its store and its checkpoint; an
/// unknown thread is bad input.
pub(crate) async fn stored_thread(
    args: &Args,
) -> Result<(ThreadId, Arc<dyn ThreadStore>, Checkpoint), Exit> {
    let id = args
        .positional
        .first()
        .ok_or_else(|| bad_input(anyhow!("awaken {} THREAD\n\n{USAGE}", args.command)))?;
    let thread = ThreadId::new(id).map_err(|e| bad_input(anyhow!("{e}")))?;
    let store = open_store(args.store.as_deref(), Open::Existing)
        .await
        .map_err(open_failed)?;
    let checkpoint = store
        .load_checkpoint(&thread)
        .await
        .map_err(|e| anyhow!("{e}"))?
        .ok_or_else(|| bad_input(anyhow!("no thread `{thread}` in the store")))?;
    Ok((thread, store, checkpoint))
}

/// What a command does with the runtime it builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Runs agents: the provider's credentials and header values must be at hand.
    Run,
    /// Only checks the file, offline: no key or header value is read and nothing is sent.
    Validate,
}

/// The retry policy of a network provider when the agent file says nothing: up to 3 retries of
/// transient errors (rate limits, overload, 5xx, timeouts, refused connections), backoff from
/// 0.5 s doubling to 30 s with jitter; a `Retry-After` longer than 30 s ends the call instead.
fn default_retry() -> RetryConfig {
    RetryConfig {
        max_retries: 3,
        ..RetryConfig::default()
    }
}

/// `value` with each `${VAR}` replaced by the environment variable's value.
fn expand_env(value: &str, what: &str) -> Result<String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            bail!("{what}: `${{` without its closing `}}`");
        };
        let name = &after[..end];
        let found = std::env::var(name)
            .map_err(|_| anyhow!("{what}: the environment variable {name} is not set"))?;
        out.push_str(&found);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The base URL of a provider table: its own, else (for the main `[provider]` only)
/// `AWAKEN_BASE_URL`, else `default`.
fn base_url(section: &ProviderSection, place: &ProviderPlace, default: &str) -> String {
    let from_env = || match place {
        ProviderPlace::Main => std::env::var("AWAKEN_BASE_URL")
            .ok()
            .filter(|u| !u.is_empty()),
        ProviderPlace::Entry { .. } => None,
    };
    section
        .base_url
        .clone()
        .or_else(from_env)
        .unwrap_or_else(|| default.to_owned())
}

/// What every HTTP provider takes from a provider table: where it is, its key, its extra
/// headers (`${VAR}` read from the environment for a run) and its timeouts.
struct HttpSettings {
    base: String,
    key: Option<String>,
    headers: Vec<(String, String)>,
    connect_timeout: Option<std::time::Duration>,
    first_byte_timeout: Option<std::time::Duration>,
    idle_timeout: Option<std::time::Duration>,
}

/// The [`HttpSettings`] of a provider table: the key from `api_key_env` (else `key_env`), the
/// base URL from the table (else `default_base`, see [`base_url`]). A run without a key against
/// `official_host` is refused before anything is sent.
fn http_settings(
    file: &AgentFile,
    section: &ProviderSection,
    place: &ProviderPlace,
    purpose: Purpose,
    (default_base, key_env, official_host): (&str, &str, &str),
) -> Result<HttpSettings> {
    let shown = file.path.display();
    let base = base_url(section, place, default_base);
    let key_env = section.api_key_env.as_deref().unwrap_or(key_env);
    let mut key = None;
    if purpose == Purpose::Run {
        match std::env::var(key_env).ok().filter(|k| !k.is_empty()) {
            Some(k) => key = Some(k),
            None if base.contains(official_host) => bail!(
                "{shown}: the provider at {base} needs an API key: set {key_env} \
                 (or point {} at a local server)",
                local_server_hint(place)
            ),
            None => {}
        }
    }
    let mut headers = Vec::with_capacity(section.headers.len());
    for (name, value) in &section.headers {
        let value = match purpose {
            Purpose::Run => expand_env(
                value,
                &format!("{shown}: {}", place.field(&format!("headers.{name}"))),
            )?,
            Purpose::Validate => value.clone(),
        };
        headers.push((name.clone(), value));
    }
    Ok(HttpSettings {
        base,
        key,
        headers,
        connect_timeout: section.connect_timeout.map(|t| t.get()),
        first_byte_timeout: section.first_byte_timeout.map(|t| t.get()),
        idle_timeout: section.idle_timeout.map(|t| t.get()),
    })
}

/// The OpenAI-compatible executor a provider table of the agent file describes (without its
/// retries). The environment gives the key (`api_key_env`, default `OPENAI_API_KEY`) and,
/// when the main `[provider]` has none, the base URL (`AWAKEN_BASE_URL`).
fn openai_executor(
    file: &AgentFile,
    section: &ProviderSection,
    place: &ProviderPlace,
    purpose: Purpose,
) -> Result<(Arc<dyn LlmExecutor>, String)> {
    let http = http_settings(
        file,
        section,
        place,
        purpose,
        (
            "https://api.openai.com/v1",
            "OPENAI_API_KEY",
            "api.openai.com",
        ),
    )?;
    let mut config = OpenAiConfig::new(http.base.clone());
    if let Some(key) = http.key {
        config = config.with_api_key(key);
    }
    for (name, value) in http.headers {
        config = config.with_header(name, value);
    }
    if let Some(t) = http.connect_timeout {
        config = config.with_connect_timeout(t);
    }
    if let Some(t) = http.first_byte_timeout {
        config = config.with_request_timeout(t);
    }
    if let Some(t) = http.idle_timeout {
        config = config.with_stream_idle_timeout(t);
    }
    if let Some(field) = section.max_tokens_field {
        config = config.with_max_tokens_field(match field {
            TokensField::MaxTokens => MaxTokensField::MaxTokens,
            TokensField::MaxCompletionTokens => MaxTokensField::MaxCompletionTokens,
        });
    }
    if let Some(stream) = section.stream {
        config = config.with_stream(stream);
    }
    if let Some(usage) = section.include_usage {
        config = config.with_include_usage(usage);
    }
    let executor: Arc<dyn LlmExecutor> = Arc::new(
        OpenAiExecutor::new(config)
            .map_err(|e| anyhow!("{}: {}: {e}", file.path.display(), place.table()))?,
    );
    Ok((executor, http.base))
}

/// Where a key-less run is told to point instead: the table's `base_url`, or for the main
/// `[provider]` also `AWAKEN_BASE_URL`.
fn local_server_hint(place: &ProviderPlace) -> String {
    match place {
        ProviderPlace::Main => "[provider] base_url or AWAKEN_BASE_URL".to_owned(),
        ProviderPlace::Entry { .. } => place.field("base_url"),
    }
}

/// The Anthropic Messages executor a provider table of the agent file describes (without its
/// retries). The environment gives the key (`api_key_env`, default `ANTHROPIC_API_KEY`) and,
/// when the main `[provider]` has none, the base URL (`AWAKEN_BASE_URL`).
fn anthropic_executor(
    file: &AgentFile,
    section: &ProviderSection,
    place: &ProviderPlace,
    purpose: Purpose,
) -> Result<(Arc<dyn LlmExecutor>, String)> {
    let http = http_settings(
        file,
        section,
        place,
        purpose,
        (
            "https://api.anthropic.com",
            "ANTHROPIC_API_KEY",
            "api.anthropic.com",
        ),
    )?;
    let mut config = AnthropicConfig::new(http.base.clone());
    if let Some(key) = http.key {
        config = config.with_api_key(key);
    }
    for (name, value) in http.headers {
        config = config.with_header(name, value);
    }
    if let Some(t) = http.connect_timeout {
        config = config.with_connect_timeout(t);
    }
    if let Some(t) = http.first_byte_timeout {
        config = config.with_request_timeout(t);
    }
    if let Some(t) = http.idle_timeout {
        config = config.with_stream_idle_timeout(t);
    }
    let executor: Arc<dyn LlmExecutor> = Arc::new(
        AnthropicExecutor::new(config)
            .map_err(|e| anyhow!("{}: {}: {e}", file.path.display(), place.table()))?,
    );
    Ok((executor, http.base))
}

/// `executor` of model `model_id` wrapped in its provider table's retry policy. An
/// `[agent.sections.retry]` is applied by the runtime itself, and a member of the agent's model
/// pool is retried as the pool (around it, by the runtime), so then the executor is left as it
/// is.
fn with_retry(
    file: &AgentFile,
    section: &ProviderSection,
    model_id: &str,
    executor: Arc<dyn LlmExecutor>,
) -> Arc<dyn LlmExecutor> {
    if file.in_agent_pool(model_id) {
        return executor;
    }
    match (&section.retry, file.agent.sections.get(RETRY_SECTION)) {
        (_, Some(_)) => executor,
        (Some(retry), None) if retry.max_retries == 0 => executor,
        (retry, None) => Arc::new(RetryingExecutor::new(
            executor,
            &retry.clone().unwrap_or_else(default_retry),
        )),
    }
}

/// The scripted executor: the `--script` file, else the agent file's `[script]`, reading where
/// each thread's run stands from `store`; and where its script came from.
fn scripted_executor(
    file: &AgentFile,
    args: &Args,
    store: &Arc<dyn ThreadStore>,
) -> Result<(Arc<dyn LlmExecutor>, String)> {
    let script = match &args.script {
        Some(path) => Script::load(path).map_err(|e| anyhow!("{e}"))?,
        None => file.script.clone().ok_or_else(|| {
            anyhow!(
                "{}: the scripted provider needs a [script] section in the agent file or --script FILE",
                file.path.display()
            )
        })?,
    };
    let source = args.script.as_ref().map_or_else(
        || format!("{}: [script]", file.path.display()),
        |p| p.display().to_string(),
    );
    let executor =
        ThreadScript::new(script, Arc::clone(store)).map_err(|e| anyhow!("{source}: {e}"))?;
    Ok((Arc::new(executor), source))
}

/// The executor and model of the agent file's main model (`[model]` and `[provider]`): the
/// provider it names, never another. The scripted provider reads where each thread's run
/// stands from `store`.
fn provider(
    file: &AgentFile,
    args: &Args,
    store: &Arc<dyn ThreadStore>,
    purpose: Purpose,
) -> Result<(Arc<dyn LlmExecutor>, ModelSpec)> {
    let kind = file.provider_kind()?;
    let model_id = file
        .model
        .as_ref()
        .map_or_else(|| file.agent.model.clone(), |m| m.id.clone());
    let place = ProviderPlace::Main;
    let (executor, upstream): (Arc<dyn LlmExecutor>, String) = match kind {
        ProviderKind::Openai => {
            let upstream = args
                .model
                .clone()
                .or_else(|| file.provider.model.clone())
                .or_else(|| file.model.as_ref().map(|m| m.upstream_model.clone()))
                .unwrap_or_else(|| "gpt-4o-mini".into());
            let (executor, base) = openai_executor(file, &file.provider, &place, purpose)?;
            tracing::info!(provider = "openai", base_url = %base, model = %upstream, "provider");
            (
                with_retry(file, &file.provider, &model_id, executor),
                upstream,
            )
        }
        ProviderKind::Anthropic => {
            let upstream = args
                .model
                .clone()
                .or_else(|| file.provider.model.clone())
                .or_else(|| file.model.as_ref().map(|m| m.upstream_model.clone()))
                .unwrap_or_else(|| "claude-haiku-4-5".into());
            let (executor, base) = anthropic_executor(file, &file.provider, &place, purpose)?;
            tracing::info!(provider = "anthropic", base_url = %base, model = %upstream, "provider");
            (
                with_retry(file, &file.provider, &model_id, executor),
                upstream,
            )
        }
        ProviderKind::Scripted => {
            let (executor, source) = scripted_executor(file, args, store)?;
            tracing::info!(provider = "scripted", script = %source, "provider");
            (executor, "scripted".to_owned())
        }
    };
    let model = file
        .model
        .clone()
        .unwrap_or_else(|| ModelSpec::new(model_id, kind.name(), upstream.clone()));
    Ok((
        executor,
        ModelSpec {
            provider: kind.name().into(),
            upstream_model: upstream,
            ..model
        },
    ))
}

/// The models an agent file declares, each with its executor, its model pools, and its agent
/// as the runtime gets it.
struct FileModels {
    /// Each model (its `provider` is the provider id the executor is registered under).
    models: Vec<(ModelSpec, Arc<dyn LlmExecutor>)>,
    /// The pools.
    pools: Vec<ModelPoolSpec>,
    /// The agent; one whose model is a pool and who sets no `retry` section gets the default
    /// policy there, so that the runtime retries the pool as the command retries a model.
    agent: AgentSpec,
}

/// The main model (when the file registers it) and every `[[models]]` entry with its
/// executor (an entry's provider id is `model:ID`), and the file's pools.
fn file_models(
    file: &AgentFile,
    args: &Args,
    store: &Arc<dyn ThreadStore>,
    purpose: Purpose,
) -> Result<FileModels> {
    let mut models = Vec::with_capacity(1 + file.models.len());
    if file.has_main_model() {
        let (executor, model) = provider(file, args, store, purpose)?;
        models.push((model, executor));
    }
    for (index, entry) in file.models.iter().enumerate() {
        let place = ProviderPlace::Entry {
            index,
            id: entry.id.clone(),
        };
        let executor = match entry.kind() {
            ProviderKind::Openai => {
                let (executor, base) = openai_executor(file, &entry.provider, &place, purpose)?;
                tracing::info!(provider = "openai", model_id = %entry.id, base_url = %base, "provider");
                with_retry(file, &entry.provider, &entry.id, executor)
            }
            ProviderKind::Anthropic => {
                let (executor, base) = anthropic_executor(file, &entry.provider, &place, purpose)?;
                tracing::info!(provider = "anthropic", model_id = %entry.id, base_url = %base, "provider");
                with_retry(file, &entry.provider, &entry.id, executor)
            }
            ProviderKind::Scripted => scripted_executor(file, args, store)?.0,
        };
        models.push((entry.spec(&format!("model:{}", entry.id)), executor));
    }
    let mut agent = file.agent.clone();
    if file.agent_pool().is_some() && agent.sections.get(RETRY_SECTION).is_none() {
        agent.sections.insert(
            RETRY_SECTION,
            serde_json::json!({"max_retries": default_retry().max_retries}),
        );
    }
    Ok(FileModels {
        models,
        pools: file.model_pools.clone(),
        agent,
    })
}

/// This process's worker identity in run leases: its pid and 32 random bits, the same for the
/// whole process (pids repeat across machines and containers; two workers must never share
/// an identity).
pub(crate) fn worker_id() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| awaken::runtime::process_worker_id("awaken-cli"))
        .clone()
}

/// How long a run's lease outlives its process: `AWAKEN_LEASE_SECS` (whole seconds, at least
/// 1), else 15 s. A killed process's runs become recoverable that long after it stopped.
pub(crate) fn lease_duration() -> Result<std::time::Duration> {
    const DEFAULT_SECS: u64 = 15;
    match std::env::var("AWAKEN_LEASE_SECS") {
        Err(_) => Ok(std::time::Duration::from_secs(DEFAULT_SECS)),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(secs) if secs >= 1 => Ok(std::time::Duration::from_secs(secs)),
            _ => {
                bail!("AWAKEN_LEASE_SECS must be a whole number of seconds, at least 1 (got {v:?})")
            }
        },
    }
}

/// The runtime for the agent file over `store`: the provider, the built-in tools the file
/// configures and its declarative plugin directories. The file's agent is resolved once here,
/// so a bad agent fails before anything runs (other agents, such as those a declarative plugin
/// contributes, are resolved only when run).
pub(crate) fn runtime(
    file: &AgentFile,
    args: &Args,
    store: Arc<dyn ThreadStore>,
    purpose: Purpose,
    mcp: &[McpServer],
) -> Result<AgentRuntime> {
    let FileModels {
        models,
        pools,
        agent,
    } = file_models(file, args, &store, purpose)?;
    let mut builder = runtime_builder(store)?;
    for (model, executor) in models {
        builder = builder
            .with_provider(model.provider.clone(), executor)
            .with_model(model);
    }
    for pool in pools {
        builder = builder.with_model_pool(pool);
    }
    builder = builder.with_agent_spec(agent);
    for tool in builtin_tools(file)? {
        builder = builder.with_tool(tool.tool);
    }
    for server in mcp {
        builder = builder.with_tool_provider(Arc::new(server.clone()));
    }
    if let Some(registry) = plugin_registry(std::slice::from_ref(file))? {
        builder = builder.with_plugin_registry(registry);
    }
    if let Some(backend) = remote_backend(std::slice::from_ref(file))? {
        builder = builder.with_backend(backend);
    }
    let runtime = builder
        .build_unchecked()
        .map_err(|e| anyhow!("{}: {e}", file.path.display()))?;
    resolve_agents(&runtime, std::slice::from_ref(file))?;
    Ok(runtime)
}

/// The runtime for several agent files over one `store` (`awaken serve`): every file's agent
/// with its model and provider, the built-in tools and the plugin directories, each agent
/// resolved once here. One file gives the same runtime as [`runtime`].
///
/// With several files, each file's providers are registered under ids of their own
/// (`PROVIDER:AGENT`, such as `scripted:assistant`), so two scripted files keep their own
/// scripts; a model or pool id an earlier file registered already is taken as `ID:AGENT` by
/// the later one (its pools' members, its agent's model and summary model follow). A built-in tool several files configure is registered once and must have the same
/// settings in each; an agent does not see the built-in tools only other files configure. Two
/// files defining the same agent id are refused, naming both.
pub(crate) fn runtime_of_files(
    files: &[AgentFile],
    args: &Args,
    store: Arc<dyn ThreadStore>,
    purpose: Purpose,
    mcp: &[McpServer],
) -> Result<AgentRuntime> {
    if let [file] = files {
        return runtime(file, args, store, purpose, mcp);
    }
    for (i, file) in files.iter().enumerate() {
        if let Some(earlier) = files[..i].iter().find(|e| e.agent.id == file.agent.id) {
            if earlier.path == file.path {
                bail!("--agent {} is given twice", file.path.display());
            }
            bail!(
                "agent `{}` is defined by two files, {} and {}: the agents of one server need \
                 distinct ids",
                file.agent.id,
                earlier.path.display(),
                file.path.display()
            );
        }
    }
    let builtins = files
        .iter()
        .map(builtin_tools)
        .collect::<Result<Vec<_>>>()?;
    // One tool per id: the files that configure a built-in tool must agree on its settings.
    let mut shared: Vec<(&AgentFile, BuiltinTool)> = Vec::new();
    for (file, tools) in files.iter().zip(&builtins) {
        for tool in tools {
            match shared.iter().find(|(_, s)| s.id == tool.id) {
                Some((first, s)) if s.settings != tool.settings => bail!(
                    "{} and {} configure [tools.{}] differently ({} and {}): the agents of one \
                     server share one {} tool, so give it the same settings in both",
                    first.path.display(),
                    file.path.display(),
                    tool.id,
                    s.settings,
                    tool.settings,
                    tool.id
                ),
                Some(_) => {}
                None => shared.push((file, tool.clone())),
            }
        }
    }
    let mut builder = runtime_builder(store.clone())?;
    let mut model_ids: Vec<String> = Vec::new();
    for (file, tools) in files.iter().zip(&builtins) {
        let FileModels {
            models,
            mut pools,
            mut agent,
        } = file_models(file, args, &store, purpose)?;
        // The file's model and pool ids that an earlier file took, and what they become.
        let mut renamed: Vec<(String, String)> = Vec::new();
        let mut take = |id: &mut String| {
            if model_ids.contains(id) {
                let new = format!("{id}:{}", agent.id);
                renamed.push((std::mem::replace(id, new.clone()), new));
            }
            model_ids.push(id.clone());
        };
        let mut registered = Vec::with_capacity(models.len());
        for (mut model, executor) in models {
            let provider_id = format!("{}:{}", model.provider, agent.id);
            model.provider.clone_from(&provider_id);
            take(&mut model.id);
            registered.push((model, provider_id, executor));
        }
        for pool in &mut pools {
            take(&mut pool.id);
        }
        let follow = |id: &mut String| {
            if let Some((_, new)) = renamed.iter().find(|(old, _)| old == id) {
                id.clone_from(new);
            }
        };
        for member in pools.iter_mut().flat_map(|p| p.members.iter_mut()) {
            follow(&mut member.model);
        }
        follow(&mut agent.model);
        if let Some(summary) = agent
            .context_policy
            .as_mut()
            .and_then(|p| p.summary_model.as_mut())
        {
            follow(summary);
        }
        // Each agent sees the built-in tools its own file configures, not the others' ones;
        // likewise the tools of MCP servers (by their id prefix: their lists may change).
        for (_, tool) in &shared {
            if !tools.iter().any(|t| t.id == tool.id) {
                agent.excluded_tools.push(tool.id.clone());
            }
        }
        for server in mcp {
            if !file.mcp_servers.iter().any(|s| s.name == server.name()) {
                let prefix = server.spec().tool_prefix();
                agent
                    .excluded_tool_patterns
                    .push(Glob::new(format!("{prefix}*")).map_err(|e| anyhow!("{e}"))?);
            }
        }
        for (model, provider_id, executor) in registered {
            builder = builder
                .with_model(model)
                .with_provider(provider_id, executor);
        }
        for pool in pools {
            builder = builder.with_model_pool(pool);
        }
        builder = builder.with_agent_spec(agent);
    }
    for (_, tool) in shared {
        builder = builder.with_tool(tool.tool);
    }
    for server in mcp {
        builder = builder.with_tool_provider(Arc::new(server.clone()));
    }
    if let Some(registry) = plugin_registry(files)? {
        builder = builder.with_plugin_registry(registry);
    }
    if let Some(backend) = remote_backend(files)? {
        builder = builder.with_backend(backend);
    }
    let runtime = builder.build_unchecked().map_err(|e| {
        let shown: Vec<String> = files.iter().map(|f| f.path.display().to_string()).collect();
        anyhow!("{}: {e}", shown.join(", "))
    })?;
    resolve_agents(&runtime, files)?;
    Ok(runtime)
}

/// The MCP servers the files name, connected: a server several files name (with the same
/// settings) is connected once. Every server that cannot be connected is reported, each with
/// its file, its name and the cause.
pub(crate) async fn mcp_servers(files: &[AgentFile]) -> Result<Vec<McpServer>> {
    let mut specs: Vec<(&AgentFile, &McpServerSpec)> = Vec::new();
    for file in files {
        for spec in &file.mcp_servers {
            match specs.iter().find(|(_, s)| s.name == spec.name) {
                Some((first, s)) if *s != spec => bail!(
                    "{} and {} configure MCP server `{}` differently: the agents of one server \
                     share it, so give it the same settings in both",
                    first.path.display(),
                    file.path.display(),
                    spec.name
                ),
                Some(_) => {}
                None => specs.push((file, spec)),
            }
        }
    }
    let tasks: Vec<_> = specs
        .iter()
        .map(|(_, spec)| tokio::spawn(McpServer::connect((*spec).clone())))
        .collect();
    let mut servers = Vec::with_capacity(tasks.len());
    let mut failures = Vec::new();
    for ((file, _), task) in specs.iter().zip(tasks) {
        match task
            .await
            .map_err(|e| anyhow!("an MCP connection task failed: {e}"))?
        {
            Ok(server) => servers.push(server),
            Err(e) => failures.push(format!("{}: {e}", file.path.display())),
        }
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(servers)
}

/// The builder every runtime starts from: this process's worker identity and the store.
fn runtime_builder(store: Arc<dyn ThreadStore>) -> Result<AgentRuntimeBuilder> {
    // Every run this process drives holds a lease (renewed while it lives), so another
    // process never takes it over, recovers it or supersedes it while it is alive.
    // Message content goes on spans only when they are exported and the variable asks.
    Ok(AgentRuntime::builder()
        .with_worker(worker_id(), lease_duration()?)
        .with_store(store)
        .with_span_content(crate::log::span_content()))
}

/// A built-in tool as an agent file configures it.
#[derive(Clone)]
struct BuiltinTool {
    /// The tool's id.
    id: String,
    /// Its settings as text, to compare two files' and to name them in a refusal.
    settings: String,
    tool: Arc<dyn Tool>,
}

/// The built-in tools the file configures.
fn builtin_tools(file: &AgentFile) -> Result<Vec<BuiltinTool>> {
    let mut out = Vec::new();
    let mut add = |settings: String, tool: Arc<dyn Tool>| {
        out.push(BuiltinTool {
            id: tool.descriptor().id,
            settings,
            tool,
        });
    };
    if let Some(rf) = &file.tools.read_file {
        add(
            format!("root = {}", shown_dir(&rf.root)),
            Arc::new(tools::ReadFile {
                root: rf.root.clone(),
            }),
        );
    }
    if let Some(af) = &file.tools.append_file {
        add(
            format!("root = {}", shown_dir(&af.root)),
            Arc::new(tools::AppendFile {
                root: af.root.clone(),
            }),
        );
    }
    if let Some(http) = &file.tools.http_get {
        let max_bytes = http.max_bytes.unwrap_or(tools::DEFAULT_MAX_BYTES);
        add(
            format!(
                "allow_hosts = {:?}, allow_ranges = {:?}, max_bytes = {max_bytes}",
                http.allow_hosts, http.allow_ranges
            ),
            Arc::new(tools::HttpGet::new(
                http.allow_hosts.clone(),
                http.ranges.clone(),
                max_bytes,
            )?),
        );
    }
    Ok(out)
}

/// A directory as one path for every way of naming it (the path itself when it does not
/// exist yet).
fn shown_dir(dir: &Path) -> String {
    std::fs::canonicalize(dir)
        .unwrap_or_else(|_| dir.to_path_buf())
        .display()
        .to_string()
}

/// One registry of the files' declarative plugin directories, or `None` when they list none. A
/// directory an earlier file lists already is not loaded again.
fn plugin_registry(files: &[AgentFile]) -> Result<Option<Arc<PluginRegistry>>> {
    let registry = PluginRegistry::new();
    let mut loaded: Vec<String> = Vec::new();
    for file in files {
        let mut mine = Vec::new();
        for dir in &file.plugins.dirs {
            let key = shown_dir(dir);
            if loaded.contains(&key) {
                continue;
            }
            registry
                .load_dir(dir)
                .map_err(|e| anyhow!("{}: [plugins] dirs: {e}", file.path.display()))?;
            mine.push(key);
        }
        loaded.extend(mine);
    }
    let any = files.iter().any(|f| !f.plugins.dirs.is_empty());
    Ok(any.then(|| Arc::new(registry)))
}

/// Resolves each file's agent, so a bad one fails before anything runs.
fn resolve_agents(runtime: &AgentRuntime, files: &[AgentFile]) -> Result<()> {
    for file in files {
        // A remote agent is planned onto the backend that claims its endpoint.
        let resolved = if file.agent.endpoint.is_some() {
            runtime.resolver().plan(&file.agent.id).map(drop)
        } else {
            runtime.resolver().resolve(&file.agent.id).map(drop)
        };
        resolved.map_err(|e| anyhow!("{}: agent `{}`: {e}", file.path.display(), file.agent.id))?;
    }
    Ok(())
}

/// The A2A backend of the remote agents among `files` (`[agent.endpoint]` with protocol
/// `a2a`), when there is one.
fn remote_backend(files: &[AgentFile]) -> Result<Option<Arc<A2aBackend>>> {
    if !files.iter().any(|f| f.agent.endpoint.is_some()) {
        return Ok(None);
    }
    let backend = A2aBackend::new().map_err(|e| anyhow!("{e}"))?;
    Ok(Some(Arc::new(backend)))
}

/// Fetches and checks the agent card of each remote agent among `files` (reachable, the A2A
/// HTTP+JSON binding 1.0, streaming), before a runtime is built on them.
pub(crate) async fn check_remote_agents(files: &[AgentFile]) -> Result<()> {
    let Some(backend) = remote_backend(files)? else {
        return Ok(());
    };
    for file in files.iter().filter(|f| f.agent.endpoint.is_some()) {
        backend
            .discover([&file.agent])
            .await
            .map_err(|e| anyhow!("{}: {e}", file.path.display()))?;
    }
    Ok(())
}
