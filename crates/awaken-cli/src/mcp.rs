//! The MCP commands: `mcp list` connects to MCP servers and lists their state and tools; `mcp
//! call` calls one tool of one server with arguments from the command line, checked against the
//! tool's schema as a run checks a model's call.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{anyhow, bail};
use awaken::event::{
    CancellationToken, EffectClass, RunId, ThreadId, ToolCallId, ToolResultStatus,
};
use awaken::mcp::{McpError, McpServer, McpServerStatus};
use awaken::spec::{McpServerSpec, McpTransportSpec};
use awaken::state::{KeyRegistry, StateStore};
use awaken::tool::{RegisteredTool, ToolCallContext, ToolError, ToolProvider};
use serde_json::{Map, Value, json};

use crate::args::Args;
use crate::output::clip;
use crate::term::{errln, out, outln};
use crate::{Exit, bad_input, load_file};

/// The name of the server `--url` reaches: its tools' ids are `url__{mcp name}`.
const URL_SERVER: &str = "url";

/// `awaken mcp list (--agent FILE | --url URL) [--json]`: connects to each MCP server of the
/// file (or to the one at URL) at once and prints it with its transport, state and tools, or
/// why it could not be connected. Exit 1 when a server could not be connected.
pub(crate) async fn mcp_list(args: Args) -> Result<u8, Exit> {
    let specs = match &args.url {
        Some(url) => vec![McpServerSpec::http(URL_SERVER, url)],
        None => {
            let file = load_file(&args)?;
            if file.mcp_servers.is_empty() {
                outln!("{}: no [[mcp_servers]]", file.path.display());
                return Ok(0);
            }
            file.mcp_servers
        }
    };
    let tasks: Vec<_> = specs
        .iter()
        .map(|spec| tokio::spawn(McpServer::connect(spec.clone())))
        .collect();
    let mut failed = 0usize;
    for (spec, task) in specs.iter().zip(tasks) {
        let connected = task
            .await
            .map_err(|e| anyhow!("an MCP connection task failed: {e}"))?;
        match connected {
            Ok(server) => {
                let status = server.status();
                server.shutdown().await;
                if args.json {
                    outln!("{}", status_json(&status));
                } else {
                    out!("{}", render_status(&status));
                }
            }
            Err(e) => {
                failed += 1;
                let transport = transport(spec);
                if args.json {
                    outln!(
                        "{}",
                        json!({ "name": spec.name, "transport": transport, "state": "failed", "error": e.to_string() })
                    );
                } else {
                    outln!("{} ({transport}) failed: {e}", spec.name);
                }
            }
        }
    }
    Ok(u8::from(failed > 0))
}

/// `awaken mcp call TOOL [KEY=VALUE]... (--url URL | --agent FILE --server NAME) [--json]`:
/// connects to the server, checks the arguments against the tool's schema, calls the tool and
/// prints its result. Exit 1 when the server cannot be reached or the tool fails, 2 on bad input,
/// 4 when Ctrl-C cancelled the call.
pub(crate) async fn mcp_call(args: Args) -> Result<u8, Exit> {
    let Some((name, words)) = args.positional.split_first() else {
        return Err(bad_input(anyhow!("`awaken mcp call` needs a TOOL")));
    };
    let arguments = Value::Object(tool_arguments(words).map_err(bad_input)?);
    let spec = call_spec(&args)?;
    let server = McpServer::connect(spec).await.map_err(|e| match e {
        McpError::InvalidSpec { .. } => bad_input(e.into()),
        e => Exit::from(anyhow::Error::from(e)),
    })?;
    let outcome = call(&server, name, &arguments, &args).await;
    server.shutdown().await;
    outcome
}

/// The server `mcp call` reaches: the one at `--url`, or the agent file's `--server NAME`.
fn call_spec(args: &Args) -> Result<McpServerSpec, Exit> {
    if let Some(url) = &args.url {
        return Ok(McpServerSpec::http(URL_SERVER, url));
    }
    let file = load_file(args)?;
    let name = args.server.as_deref().unwrap_or_default();
    let names: Vec<&str> = file.mcp_servers.iter().map(|s| s.name.as_str()).collect();
    let known = if names.is_empty() {
        "it has no [[mcp_servers]]".to_owned()
    } else {
        format!("its servers: {}", names.join(", "))
    };
    let spec = file.mcp_servers.iter().find(|s| s.name == name).cloned();
    spec.ok_or_else(|| {
        bad_input(anyhow!(
            "{}: no MCP server `{name}` ({known})",
            file.path.display()
        ))
    })
}

/// Finds the tool `name` (its MCP name, else its id), checks `arguments` against its schema,
/// calls it and prints the result.
async fn call(server: &McpServer, name: &str, arguments: &Value, args: &Args) -> Result<u8, Exit> {
    let tool = find_tool(server, name)?;
    tool.validate(arguments)
        .map_err(|e| bad_input(anyhow::Error::from(e)))?;
    let cancel = CancellationToken::new();
    let mut ctx = ToolCallContext::with_token(
        ThreadId::new("mcp-call").map_err(|e| anyhow!("{e}"))?,
        RunId::new("mcp-call").map_err(|e| anyhow!("{e}"))?,
        ToolCallId::new("call-1").map_err(|e| anyhow!("{e}"))?,
        StateStore::new(KeyRegistry::new()).snapshot(),
        cancel.clone(),
    );
    if !args.quiet {
        // The server's progress notifications, as they come, on standard error.
        ctx = ctx.with_progress(Arc::new(|_: &ToolCallId, report: Value| {
            errln!("progress: {report}");
        }));
    }
    let call = tool.tool().execute(arguments, &ctx);
    tokio::pin!(call);
    let outcome = tokio::select! {
        outcome = &mut call => outcome,
        Ok(()) = tokio::signal::ctrl_c() => {
            // The server is told the call is cancelled; the call ends at once.
            cancel.cancel();
            call.await
        }
    };
    let describe = |key: &str, value: Value| {
        let mut object = json!({ "server": server.name(), "tool": name, "id": tool.id() });
        object[key] = value;
        object
    };
    let failure = match outcome {
        Ok(output) if output.result.status == ToolResultStatus::Success => {
            let result = output.result.content.as_ref();
            if args.json {
                outln!("{}", describe("result", result.clone()));
            } else {
                match result {
                    Value::String(text) if text.ends_with('\n') => out!("{text}"),
                    Value::String(text) => outln!("{text}"),
                    other => outln!(
                        "{}",
                        serde_json::to_string_pretty(other).unwrap_or_else(|_| other.to_string())
                    ),
                }
            }
            return Ok(0);
        }
        Ok(output) => match output.result.content.as_ref() {
            Value::String(text) => anyhow!("`{name}` failed: {text}"),
            other => anyhow!("`{name}` failed: {other}"),
        },
        Err(ToolError::Cancelled { .. }) => {
            return Err(Exit {
                code: 4,
                error: anyhow!("the call of `{name}` was cancelled"),
            });
        }
        Err(e) => anyhow::Error::from(e),
    };
    if args.json {
        outln!(
            "{}",
            describe("error", Value::String(format!("{failure:#}")))
        );
        return Ok(1);
    }
    Err(Exit::from(failure))
}

/// The tool the server offers as `name`: by its MCP name, else by its id. Bad input when there
/// is none, naming the tools there are (or why a tool by that name is left out).
fn find_tool(server: &McpServer, name: &str) -> Result<RegisteredTool, Exit> {
    let status = server.status();
    let info = status
        .tools
        .iter()
        .find(|t| t.mcp_name == name)
        .or_else(|| status.tools.iter().find(|t| t.id == name));
    let Some(info) = info else {
        if let Some(skipped) = status.skipped.iter().find(|s| s.mcp_name == name) {
            return Err(bad_input(anyhow!(
                "MCP server `{}` lists `{name}`, but it is left out: {}",
                status.name,
                skipped.reason
            )));
        }
        let names: Vec<&str> = status.tools.iter().map(|t| t.mcp_name.as_str()).collect();
        let filtered = if server.spec().include.is_empty() && server.spec().exclude.is_empty() {
            ""
        } else {
            " (after the agent file's include and exclude patterns)"
        };
        return Err(bad_input(anyhow!(
            "MCP server `{}` offers no tool `{name}`; its tools{filtered}: {}",
            status.name,
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        )));
    };
    let tools = server.tools();
    let tool = tools.iter().find(|t| t.id() == info.id).cloned();
    tool.ok_or_else(|| {
        Exit::from(anyhow!(
            "MCP server `{}` changed its tool list while `{name}` was looked up; try again",
            status.name
        ))
    })
}

/// The arguments `KEY=VALUE...` as a JSON object: VALUE is JSON when it parses as JSON (`a=5`
/// is a number, `tags=["x"]` an array, `s="5"` a string), else the text itself (`name=Ada`).
fn tool_arguments(words: &[String]) -> anyhow::Result<Map<String, Value>> {
    let mut arguments = Map::new();
    for word in words {
        let Some((key, text)) = word.split_once('=') else {
            bail!("argument {word:?} is not KEY=VALUE (e.g. a=5 or name=Ada)");
        };
        if key.is_empty() {
            bail!("argument {word:?} has no KEY before `=`");
        }
        let value = serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()));
        if arguments.insert(key.to_owned(), value).is_some() {
            bail!("argument `{key}` is given twice");
        }
    }
    Ok(arguments)
}

/// How the server is reached, as `mcp list` shows it.
fn transport(spec: &McpServerSpec) -> String {
    match spec.transport() {
        McpTransportSpec::Stdio { command } => format!("stdio: {command}"),
        McpTransportSpec::Http { url } => format!("http: {url}"),
    }
}

/// A connected server for a person: a line with its state, then one line per tool and per
/// tool left out.
fn render_status(status: &McpServerStatus) -> String {
    let mut text = format!(
        "{} ({}) {}, {} tool(s)\n",
        status.name,
        status.transport,
        status.state,
        status.tools.len()
    );
    for tool in &status.tools {
        let _ = writeln!(
            text,
            "  {}  {}  {}",
            tool.id,
            effect_name(tool.effect),
            clip(&tool.description, 100)
        );
    }
    for skipped in &status.skipped {
        let _ = writeln!(text, "  left out: {}: {}", skipped.mcp_name, skipped.reason);
    }
    text
}

/// A connected server as one JSON object.
fn status_json(status: &McpServerStatus) -> Value {
    let tools: Vec<Value> = status
        .tools
        .iter()
        .map(|t| {
            json!({
                "id": t.id,
                "mcp_name": t.mcp_name,
                "effect": effect_name(t.effect),
                "description": t.description,
            })
        })
        .collect();
    let skipped: Vec<Value> = status
        .skipped
        .iter()
        .map(|s| json!({ "mcp_name": s.mcp_name, "reason": s.reason }))
        .collect();
    json!({
        "name": status.name,
        "transport": status.transport,
        "state": status.state.to_string(),
        "tools": tools,
        "skipped": skipped,
    })
}

/// An effect class as the agent file and the JSON forms spell it.
fn effect_name(effect: EffectClass) -> &'static str {
    match effect {
        EffectClass::ReadOnly => "read_only",
        EffectClass::Idempotent => "idempotent",
        EffectClass::SideEffecting => "side_effecting",
    }
}
