//! MCP servers whose tools an agent uses: how each is reached (a child process over stdio or a
//! streamable HTTP URL), how long a call may take, and which of its tools are taken under which
//! ids.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::duration::DurationSpec;
use crate::error::{SpecError, parse_json, parse_toml};
use crate::glob::Glob;

/// How long a call to an MCP server (or its start) may take when the server's entry says
/// nothing (60 s).
pub const DEFAULT_MCP_TIMEOUT: DurationSpec = DurationSpec(std::time::Duration::from_secs(60));

/// One MCP server: `command` (with `args`, `env` and `cwd`) starts it as a child process spoken
/// to over stdio; `url` (with `headers`) reaches it over streamable HTTP. Exactly one of the two.
///
/// Values of `env` and `headers` may name environment variables as `${VAR}`; they are expanded
/// when the server is connected, so a secret stays in the environment and is never part of the
/// spec a thread or a log shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerSpec {
    /// The server's name: letters, digits, `_` and `-`. Names its tools (the default prefix),
    /// its errors and its state in `awaken mcp list`.
    pub name: String,
    /// The program to start (stdio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The program's arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Variables set for the program (on top of this process's environment).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The program's working directory (default: this process's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The streamable HTTP endpoint (`http://` or `https://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Headers sent with every HTTP request (`Authorization = "Bearer ${TOKEN}"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// How long the server may take to start and answer one call (default 60 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationSpec>,
    /// What the server's tool names are prefixed with to make their ids (default `{name}__`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_prefix: Option<String>,
    /// Only the tools whose MCP name matches one of these patterns (default: every tool).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<Glob>,
    /// None of the tools whose MCP name matches one of these patterns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<Glob>,
    /// Whether the tools' annotations (`readOnlyHint`, `idempotentHint`, `destructiveHint`)
    /// decide their effect class (default true). False for a server whose hints are not to be
    /// relied on: every tool is then side-effecting, so recovery never re-runs a call.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub trust_annotations: bool,
}

fn yes() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
}

/// How an [`McpServerSpec`] reaches its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpTransportSpec<'a> {
    /// A child process spoken to over its standard input and output.
    Stdio {
        /// The program.
        command: &'a str,
    },
    /// Streamable HTTP at this URL.
    Http {
        /// The endpoint.
        url: &'a str,
    },
}

impl McpServerSpec {
    /// A server started as `command` with `args`, spoken to over stdio.
    pub fn stdio(
        name: impl Into<String>,
        command: impl Into<String>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            command: Some(command.into()),
            args: args.into_iter().map(Into::into).collect(),
            ..Self::empty(name.into())
        }
    }

    /// A server reached over streamable HTTP at `url`.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            url: Some(url.into()),
            ..Self::empty(name.into())
        }
    }

    fn empty(name: String) -> Self {
        Self {
            name,
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            url: None,
            headers: BTreeMap::new(),
            timeout: None,
            tool_prefix: None,
            include: Vec::new(),
            exclude: Vec::new(),
            trust_annotations: true,
        }
    }

    /// Sets a variable of the child's environment (`${VAR}` is expanded at connection).
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Sets a header of every HTTP request (`${VAR}` is expanded at connection).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Sets the start and per-call timeout.
    pub fn with_timeout(mut self, timeout: DurationSpec) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the prefix of the tool ids.
    pub fn with_tool_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.tool_prefix = Some(prefix.into());
        self
    }

    /// Takes only the tools matching `pattern` (and those of the other include patterns).
    pub fn with_include(mut self, pattern: Glob) -> Self {
        self.include.push(pattern);
        self
    }

    /// Leaves out the tools matching `pattern`.
    pub fn with_exclude(mut self, pattern: Glob) -> Self {
        self.exclude.push(pattern);
        self
    }

    /// Sets whether the tools' annotations decide their effect class.
    pub fn with_trusted_annotations(mut self, trust: bool) -> Self {
        self.trust_annotations = trust;
        self
    }

    /// How the server is reached. Call on a validated spec: one that has neither `command`
    /// nor `url` reads as stdio with an empty command.
    pub fn transport(&self) -> McpTransportSpec<'_> {
        match (&self.command, &self.url) {
            (_, Some(url)) if self.command.is_none() => McpTransportSpec::Http { url },
            (command, _) => McpTransportSpec::Stdio {
                command: command.as_deref().unwrap_or(""),
            },
        }
    }

    /// The start and per-call timeout.
    pub fn timeout(&self) -> DurationSpec {
        self.timeout.unwrap_or(DEFAULT_MCP_TIMEOUT)
    }

    /// The prefix of the server's tool ids.
    pub fn tool_prefix(&self) -> String {
        match &self.tool_prefix {
            Some(prefix) => prefix.clone(),
            None => format!("{}__", self.name),
        }
    }

    /// Whether the include and exclude patterns take the tool the server calls `name`.
    pub fn takes_tool(&self, name: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|g| g.matches(name)))
            && !self.exclude.iter().any(|g| g.matches(name))
    }

    /// Checks the entry, naming fields under `mcp_servers.{name}.`: a name of letters, digits,
    /// `_` and `-`; exactly one of `command` and `url`, with `args`, `env` and `cwd` only beside
    /// `command` and `headers` only beside `url`; an `http` or `https` URL; a timeout above
    /// zero; a tool prefix of the characters a tool id allows.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.name.is_empty() || !self.name.chars().all(id_char) {
            return Err(SpecError::invalid(
                "mcp_servers.name",
                format!(
                    "`{}` must be letters, digits, `_` and `-` (it prefixes the server's tool ids)",
                    self.name
                ),
            ));
        }
        let field = |f: &str| format!("mcp_servers.{}.{f}", self.name);
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => {
                return Err(SpecError::invalid(
                    field("url"),
                    "give either `command` (stdio) or `url` (streamable HTTP), not both",
                ));
            }
            (None, None) => {
                return Err(SpecError::invalid(
                    field("command"),
                    "give `command` (a program spoken to over stdio) or `url` (streamable HTTP)",
                ));
            }
            (Some(command), None) => {
                if command.trim().is_empty() {
                    return Err(SpecError::invalid(field("command"), "must not be blank"));
                }
                if !self.headers.is_empty() {
                    return Err(SpecError::invalid(
                        field("headers"),
                        "apply to `url` only; a stdio server takes `env`",
                    ));
                }
            }
            (None, Some(url)) => {
                let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
                if !matches!(scheme.as_deref(), Some("http" | "https")) {
                    return Err(SpecError::invalid(
                        field("url"),
                        format!("`{url}` is not an http:// or https:// URL"),
                    ));
                }
                for (name, set) in [
                    ("args", !self.args.is_empty()),
                    ("env", !self.env.is_empty()),
                    ("cwd", self.cwd.is_some()),
                ] {
                    if set {
                        return Err(SpecError::invalid(
                            field(name),
                            "applies to `command` only; an HTTP server takes `headers`",
                        ));
                    }
                }
            }
        }
        if self.timeout.is_some_and(|t| t.get().is_zero()) {
            return Err(SpecError::invalid(field("timeout"), "must be above zero"));
        }
        if let Some(prefix) = &self.tool_prefix
            && !prefix.chars().all(id_char)
        {
            return Err(SpecError::invalid(
                field("tool_prefix"),
                format!("`{prefix}` must be letters, digits, `_` and `-`"),
            ));
        }
        Ok(())
    }

    /// Parses and validates an entry from TOML.
    pub fn from_toml_str(text: &str) -> Result<Self, SpecError> {
        let spec: Self = parse_toml(text)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parses and validates an entry from JSON.
    pub fn from_json_str(text: &str) -> Result<Self, SpecError> {
        let spec: Self = parse_json(text)?;
        spec.validate()?;
        Ok(spec)
    }
}

/// The characters a tool id is made of (those every provider accepts in a function name).
fn id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}
