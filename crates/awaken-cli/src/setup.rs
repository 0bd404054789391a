//! Builds what a command needs from the agent file and the command line: the store, the
//! provider (scripted or OpenAI-compatible), the built-in tools, the declarative plugins and the
//! runtime.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use awaken::event::ThreadId;
use awaken::llm::openai::{OpenAiConfig, OpenAiExecutor};
use awaken::llm::{LlmExecutor, Script};
use awaken::plugin::PluginRegistry;
use awaken::runtime::AgentRuntime;
use awaken::spec::ModelSpec;
use awaken_store::{
    Checkpoint, MemoryStore, PostgresConfig, PostgresStore, SqliteConfig, SqliteStore, ThreadStore,
};

use crate::agent_file::{AgentFile, ProviderKind};
use crate::args::{Args, USAGE};
use crate::script::ThreadScript;
use crate::tools;
use crate::{Exit, bad_input};

/// Opens the store `spec` names: `sqlite:PATH` (default `sqlite:./.awaken/awaken.db`),
/// `postgres:URL` (or a `postgres://` URL) or `memory`.
pub(crate) async fn open_store(spec: Option<&str>) -> Result<Arc<dyn ThreadStore>> {
    let spec = spec.unwrap_or("sqlite:./.awaken/awaken.db");
    if spec == "memory" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    // `postgres:URL`, or the URL itself.
    let postgres = if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        Some(spec)
    } else {
        spec.strip_prefix("postgres:")
    };
    if let Some(url) = postgres {
        let store = PostgresStore::connect(PostgresConfig::new(url))
            .await
            .context("cannot open the PostgreSQL store")?;
        return Ok(Arc::new(store));
    }
    let Some(path) = spec.strip_prefix("sqlite:") else {
        bail!("unsupported store `{spec}`: use sqlite:PATH, postgres:URL or memory");
    };
    let path = Path::new(path);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let store = SqliteStore::open(SqliteConfig::file(path))
        .await
        .with_context(|| format!("cannot open the SQLite store {}", path.display()))?;
    Ok(Arc::new(store))
}

/// Whether `spec` names a store several processes share (PostgreSQL).
fn is_shared_store(spec: Option<&str>) -> bool {
    spec.is_some_and(|s| {
        s.starts_with("postgres:") || s.starts_with("postgres://") || s.starts_with("postgresql://")
    })
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
    let store = open_store(args.store.as_deref()).await.map_err(bad_input)?;
    let checkpoint = store
        .load_checkpoint(&thread)
        .await
        .map_err(|e| anyhow!("{e}"))?
        .ok_or_else(|| bad_input(anyhow!("no thread `{thread}` in the store")))?;
    Ok((thread, store, checkpoint))
}

/// The executor and model the agent file (and the environment) ask for. The scripted provider
/// reads where each thread's run stands from `store`.
fn provider(
    file: &AgentFile,
    args: &Args,
    store: &Arc<dyn ThreadStore>,
) -> Result<(Arc<dyn LlmExecutor>, ModelSpec)> {
    let env_key = std::env::var("OPENAI_API_KEY")
        .ok()
        .filter(|k| !k.is_empty());
    let env_url = std::env::var("AWAKEN_BASE_URL")
        .ok()
        .filter(|u| !u.is_empty());
    let openai =
        file.provider.kind == ProviderKind::Openai || env_key.is_some() || env_url.is_some();
    let model_id = file.agent.model.clone();
    if openai {
        let base = match file.provider.base_url.clone().or(env_url) {
            Some(base) => base,
            None if env_key.is_some() => "https://api.openai.com/v1".into(),
            None => bail!(
                "{}: the OpenAI-compatible provider needs OPENAI_API_KEY (for api.openai.com) \
                 or a base URL (AWAKEN_BASE_URL, or [provider] base_url) for a local server",
                file.path.display()
            ),
        };
        let upstream = args
            .model
            .clone()
            .or_else(|| file.provider.model.clone())
            .unwrap_or_else(|| "gpt-4o-mini".into());
        let mut config = OpenAiConfig::new(base);
        if let Some(key) = env_key {
            config = config.with_api_key(key);
        }
        let executor = OpenAiExecutor::new(config)
            .map_err(|e| anyhow!("the OpenAI-compatible provider: {e}"))?;
        let model = file
            .model
            .clone()
            .unwrap_or_else(|| ModelSpec::new(model_id, "openai", upstream.clone()));
        return Ok((
            Arc::new(executor),
            ModelSpec {
                provider: "openai".into(),
                upstream_model: upstream,
                ..model
            },
        ));
    }
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
    let model = file
        .model
        .clone()
        .unwrap_or_else(|| ModelSpec::new(model_id, "scripted", "scripted"));
    Ok((
        Arc::new(executor),
        ModelSpec {
            provider: "scripted".into(),
            ..model
        },
    ))
}

/// The runtime for the agent file over `store`: the provider, the built-in tools the file
/// configures and its declarative plugin directories. The file's agent is resolved once here,
/// so a bad agent fails before anything runs (other agents, such as those a declarative plugin
/// contributes, are resolved only when run).
pub(crate) fn runtime(
    file: &AgentFile,
    args: &Args,
    store: Arc<dyn ThreadStore>,
) -> Result<AgentRuntime> {
    let (executor, model) = provider(file, args, &store)?;
    let mut builder = AgentRuntime::builder();
    if is_shared_store(args.store.as_deref()) {
        // Several processes share a PostgreSQL store: every run this one drives holds a
        // lease, so a `recover` elsewhere never takes it over while it is alive.
        builder = builder.with_worker(
            format!("awaken-cli-{}", std::process::id()),
            std::time::Duration::from_secs(30),
        );
    }
    let mut builder = builder
        .with_store(store)
        .with_model(model.clone())
        .with_provider(model.provider.clone(), executor)
        .with_agent_spec(file.agent.clone());
    if let Some(rf) = &file.tools.read_file {
        builder = builder.with_tool(Arc::new(tools::ReadFile {
            root: rf.root.clone(),
        }));
    }
    if let Some(af) = &file.tools.append_file {
        builder = builder.with_tool(Arc::new(tools::AppendFile {
            root: af.root.clone(),
        }));
    }
    if let Some(http) = &file.tools.http_get {
        builder = builder.with_tool(Arc::new(tools::HttpGet::new(
            http.allow_hosts.clone(),
            http.max_bytes.unwrap_or(tools::DEFAULT_MAX_BYTES),
        )?));
    }
    if !file.plugins.dirs.is_empty() {
        let registry = PluginRegistry::new();
        for dir in &file.plugins.dirs {
            registry
                .load_dir(dir)
                .map_err(|e| anyhow!("{}: [plugins] dirs: {e}", file.path.display()))?;
        }
        builder = builder.with_plugin_registry(Arc::new(registry));
    }
    let runtime = builder
        .build_unchecked()
        .map_err(|e| anyhow!("{}: {e}", file.path.display()))?;
    runtime
        .resolver()
        .resolve(&file.agent.id)
        .map_err(|e| anyhow!("{}: agent `{}`: {e}", file.path.display(), file.agent.id))?;
    Ok(runtime)
}
