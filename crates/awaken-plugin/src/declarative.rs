//! Declarative plugins: TOML manifests with no Rust code. A manifest gives the plugin's
//! identity, agent definitions, prompt fragments (appended to the system prompt of agents that
//! activate the plugin) and reminders (a context message added before the next inference after
//! a tool whose name matches a glob ran).
//!
//! ```toml
//! id = "house-style"
//! version = "1.0.0"
//! priority = 0
//! enabled = true
//! depends_on = []
//! prompt_fragments = ["Answer in British English."]
//!
//! [[reminders]]
//! tool = "read_*"
//! text = "Quote the file you read."
//!
//! [[agents]]
//! on_conflict = "skip"
//! [agents.spec]
//! id = "editor"
//! model = "scripted"
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use awaken_event::{Message, Role};
use awaken_llm::InferenceRequest;
use awaken_spec::{AgentSpec, Glob, SpecError, parse_toml};
use serde::Deserialize;

use crate::error::{LoadError, PluginError};
use crate::hooks::LifecycleHooks;
use crate::manifest::{CapabilityBound, PluginManifest};
use crate::plugin::{AgentBuildContext, AgentDefinition, OnConflict, Plugin};
use crate::registrar::PluginRegistrar;
use crate::transform::{InferenceRequestTransform, TransformContext, TransformError};

/// A reminder: after a call of a tool whose name matches `tool`, `text` is added as a context
/// message before the next inference.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reminder {
    /// Glob over tool names.
    pub tool: Glob,
    /// The message.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentEntry {
    #[serde(default)]
    on_conflict: OnConflict,
    spec: AgentSpec,
}

fn default_enabled() -> bool {
    true
}

fn default_version() -> String {
    "0.1.0".into()
}

/// The TOML form of a declarative plugin.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    id: String,
    #[serde(default = "default_version")]
    version: String,
    #[serde(default)]
    priority: i32,
    #[serde(default = "default_enabled")]
    enabled: bool,
    #[serde(default)]
    depends_on: Vec<String>,
    #[serde(default)]
    prompt_fragments: Vec<String>,
    #[serde(default)]
    reminders: Vec<Reminder>,
    #[serde(default)]
    agents: Vec<AgentEntry>,
}

/// A plugin defined by a TOML manifest.
#[derive(Debug, Clone)]
pub struct DeclarativePlugin {
    manifest: PluginManifest,
    prompt_fragments: Vec<String>,
    reminders: Vec<Reminder>,
    agents: Vec<AgentDefinition>,
    source: Option<PathBuf>,
}

/// The name of a declarative plugin's transform.
pub const DECLARATIVE_TRANSFORM: &str = "prompt_fragments_and_reminders";

impl DeclarativePlugin {
    /// Parses a manifest from TOML text. Errors name the field and carry the line.
    pub fn from_toml_str(text: &str) -> Result<Self, SpecError> {
        let m: Manifest = parse_toml(text)?;
        let version = semver::Version::parse(&m.version).map_err(|e| {
            SpecError::invalid(
                "version",
                format!("{:?} is not a semantic version: {e}", m.version),
            )
        })?;
        let agents: Vec<AgentDefinition> = m
            .agents
            .into_iter()
            .map(|a| AgentDefinition {
                spec: a.spec,
                on_conflict: a.on_conflict,
            })
            .collect();
        for (i, a) in agents.iter().enumerate() {
            a.spec
                .validate()
                .map_err(|e| SpecError::invalid(format!("agents[{i}].spec"), e.to_string()))?;
        }
        for (i, f) in m.prompt_fragments.iter().enumerate() {
            if f.trim().is_empty() {
                return Err(SpecError::invalid(
                    format!("prompt_fragments[{i}]"),
                    "must not be blank",
                ));
            }
        }
        let bound = CapabilityBound::nothing()
            .with_request_transforms([DECLARATIVE_TRANSFORM])
            .with_agent_definitions(agents.iter().map(|a| a.spec.id.clone()));
        let manifest = PluginManifest {
            id: m.id,
            version,
            priority: m.priority,
            enabled: m.enabled,
            depends_on: m.depends_on,
            bound,
        };
        manifest.validate().map_err(|e| match e {
            PluginError::InvalidManifest { field, reason, .. } => SpecError::invalid(field, reason),
            other => SpecError::invalid("id", other.to_string()),
        })?;
        Ok(Self {
            manifest,
            prompt_fragments: m.prompt_fragments,
            reminders: m.reminders,
            agents,
            source: None,
        })
    }

    /// The file the plugin was loaded from, if any.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }

    /// Its prompt fragments.
    pub fn prompt_fragments(&self) -> &[String] {
        &self.prompt_fragments
    }

    /// Its reminders.
    pub fn reminders(&self) -> &[Reminder] {
        &self.reminders
    }
}

impl Plugin for DeclarativePlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }

    fn lifecycle_hooks(&self) -> LifecycleHooks {
        LifecycleHooks::NONE
    }

    fn register(&self, registrar: &mut PluginRegistrar) -> Result<(), PluginError> {
        if !self.prompt_fragments.is_empty() || !self.reminders.is_empty() {
            registrar.register_request_transform(Arc::new(FragmentsAndReminders {
                fragments: self.prompt_fragments.clone(),
                reminders: self.reminders.clone(),
            }));
        }
        Ok(())
    }

    fn agent_definitions(
        &self,
        _ctx: &mut AgentBuildContext,
    ) -> Result<Vec<AgentDefinition>, PluginError> {
        Ok(self.agents.clone())
    }
}

/// Appends prompt fragments to the system prompt, and adds reminders for the tools the model
/// called in its last turn (the messages after the last assistant message are that turn's tool
/// results).
struct FragmentsAndReminders {
    fragments: Vec<String>,
    reminders: Vec<Reminder>,
}

impl InferenceRequestTransform for FragmentsAndReminders {
    fn name(&self) -> &str {
        DECLARATIVE_TRANSFORM
    }

    fn transform(
        &self,
        mut request: InferenceRequest,
        _ctx: &TransformContext<'_>,
    ) -> Result<InferenceRequest, TransformError> {
        if !self.fragments.is_empty() {
            let mut prompt = request
                .system_prompt
                .take()
                .map(|p| p.to_string())
                .unwrap_or_default();
            for f in &self.fragments {
                if !prompt.is_empty() {
                    prompt.push_str("\n\n");
                }
                prompt.push_str(f);
            }
            request.system_prompt = Some(prompt.into());
        }
        if !self.reminders.is_empty() {
            // The tool results at the end of the history answer the last assistant turn.
            let results = request
                .messages
                .iter()
                .rev()
                .take_while(|m| m.role == Role::Tool)
                .count();
            let last_turn_tools: Vec<&str> = match request.messages.iter().rev().nth(results) {
                Some(m) if results > 0 && m.role == Role::Assistant => {
                    m.tool_calls.iter().map(|c| c.name.as_str()).collect()
                }
                _ => Vec::new(),
            };
            let due: Vec<&Reminder> = self
                .reminders
                .iter()
                .filter(|r| last_turn_tools.iter().any(|t| r.tool.matches(t)))
                .collect();
            if !due.is_empty() {
                let mut messages: Vec<Message> = request.messages.to_vec();
                for r in due {
                    messages.push(Message::user(format!("<reminder>{}</reminder>", r.text)));
                }
                request.messages = messages.into();
            }
        }
        Ok(request)
    }
}

/// Parses every `*.toml` entry of `dir`, sorted by file name. One bad entry fails the whole
/// load, naming it: a manifest that does not parse, and an entry that cannot be read as a file
/// (a directory, a broken symlink, a symlink loop, one without read permission) — none is
/// skipped.
pub fn load_dir(dir: &Path) -> Result<Vec<Arc<dyn Plugin>>, LoadError> {
    let entries = std::fs::read_dir(dir).map_err(|source| LoadError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|source| LoadError::Io {
                path: dir.to_path_buf(),
                source,
            })?
            .path();
        if path.extension().is_some_and(|e| e == "toml") {
            files.push(path);
        }
    }
    files.sort();
    let mut plugins: Vec<Arc<dyn Plugin>> = Vec::with_capacity(files.len());
    for path in files {
        // Symlinks are followed: a dangling one or a loop fails here with its cause. What is
        // not a regular file is refused before it is opened (reading a named pipe could block).
        let metadata = std::fs::metadata(&path).map_err(|source| LoadError::Io {
            path: path.clone(),
            source,
        })?;
        if !metadata.is_file() {
            let kind = if metadata.is_dir() {
                "a directory"
            } else {
                "a special file (a pipe, socket or device)"
            };
            return Err(LoadError::NotAFile { path, kind });
        }
        let text = std::fs::read_to_string(&path).map_err(|source| LoadError::Io {
            path: path.clone(),
            source,
        })?;
        let mut plugin =
            DeclarativePlugin::from_toml_str(&text).map_err(|source| LoadError::Manifest {
                line: source.line(),
                path: path.clone(),
                source,
            })?;
        plugin.source = Some(path);
        plugins.push(Arc::new(plugin));
    }
    Ok(plugins)
}
