//! The command line: the command, its flags and the positional words. Each command accepts only
//! its own flags (plus the global `-v`, `-q` and `--log-format`); anything else is bad input
//! (exit 2) with that command's usage.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use awaken::spec::DurationSpec;
use serde_json::Value;

/// What `awaken --help` prints.
pub(crate) const USAGE: &str = "\
usage: awaken COMMAND [OPTIONS]

commands:
  run        run an agent once on a prompt (a new thread, or --thread to continue one)
  chat       talk with an agent on one thread, interactively
  resume     answer a run that waits for a decision (approve or deny its tool calls)
  recover    continue the runs a killed process left unfinished
  serve      serve agents over HTTP: the /v1 API, with resumable event streams
  worker     drive the runs a fleet's front ends queue in PostgreSQL (`serve --queue`)
  threads    list the stored threads; `threads rm`, `threads prune` delete them
  show       print a thread's transcript
  validate   check an agent file without running it (no model request)
  plugins    list and check declarative plugin manifests
  mcp list   connect to an agent file's MCP servers (or one --url) and list their tools
  mcp call   call one tool of an MCP server with KEY=VALUE arguments and print its result
  init       write a starter agent file and a plugin directory

global options:
  -v, -vv            more log output (info, debug); RUST_LOG overrides
  -q, --quiet        print only the answer on standard output; only errors on standard error
  --log-format FMT   pretty (default) or json log lines on standard error
  -h, --help         help (`awaken COMMAND --help` for a command's own)
  -V, --version      the version

SPEC (--store) is sqlite:PATH (default sqlite:./.awaken/awaken.db), postgres:URL or memory.
Exit codes: 0 completed, 2 bad input, 3 waiting for a decision (or the thread is busy: another
process holds its run or wrote to it while the run started), 4 cancelled, 1 other errors;
`serve` exits 0 after a graceful shutdown and 130 on a second signal.";

/// The usage of one command, for `awaken COMMAND --help` and its usage errors.
pub(crate) fn command_usage(command: &str) -> Option<&'static str> {
    Some(match command {
        "run" => {
            "\
usage: awaken run --agent FILE [PROMPT] [--thread ID [--supersede]] [--json] [--store SPEC]
                  [--script FILE] [--model NAME]

Runs the agent of FILE on PROMPT (default: standard input) and streams its answer, tool calls
and results. --thread continues a stored thread (default: a new one); --supersede starts the new
run on a thread that waits for decisions, closing its waiting calls as cancelled. --json prints
the run's events as JSON lines. --script replays another script with the scripted provider;
--model names the provider-side model of a network provider. Ctrl-C cancels the run (exit 4)
with the partial answer kept; a second Ctrl-C exits at once."
        }
        "chat" => {
            "\
usage: awaken chat --agent FILE [--thread ID] [--store SPEC] [--script FILE] [--model NAME]

An interactive conversation on one thread: each line you type is a run, streamed as it happens;
a tool call that needs approval is asked inline (y/n, with its arguments). Ctrl-C cancels the
current run, not the conversation; Ctrl-D (end of input) leaves. The thread is kept in the store, so
`awaken chat --thread ID` picks the conversation up later."
        }
        "resume" => {
            "\
usage: awaken resume THREAD --agent FILE (--approve CALL | --deny CALL [--answer JSON])...
                     [--json] [--store SPEC] [--script FILE] [--model NAME]

Answers the tool calls a waiting run asked about and continues the run. --answer gives the
decision before it a JSON payload (the answer, or the reason of a denial, for the model);
several --approve/--deny go in one command."
        }
        "recover" => {
            "\
usage: awaken recover --agent FILE [--json] [--store SPEC] [--script FILE] [--model NAME]

Continues the runs that a crashed or killed process left unfinished (not those waiting for a
decision), each with the agent file's agent."
        }
        "serve" => {
            "\
usage: awaken serve --agent FILE [--agent FILE ...] [--store SPEC] [--listen ADDR]
                    [--auth-token TOKEN] [--insecure-no-auth] [--cors ORIGIN ...] [--max-runs N]
                    [--shutdown-grace SECS] [--no-chat-page] [--queue [--max-attempts N]]

Serves the agents of the files over HTTP: /healthz, /readyz and the /v1 API (agents, threads,
runs whose events stream as Server-Sent Events resumable with Last-Event-ID, decisions,
cancel), the AG-UI and AI SDK front-end protocols under /v1, and a chat page at / to try the
agents in a browser (--no-chat-page leaves it out). The files' agents, models and providers share one runtime over one store; runs left
unfinished in the store (by a process that was killed) are continued. --listen is IP:PORT
(default 127.0.0.1:8080; port 0 picks a free port, printed on start). With a token (--auth-token
TOKEN, or the environment variable AWAKEN_API_TOKEN, which other users cannot read from the
process list) every /v1 request must send `Authorization: Bearer TOKEN`; an address other than
loopback needs one, or --insecure-no-auth. --cors lets browser pages of ORIGIN call the API (*:
any origin); --max-runs caps the runs in flight (a run past the cap is refused with 503).
SIGTERM or Ctrl-C stops accepting requests, gives runs in flight 10 s (--shutdown-grace SECS) to
end (the others stop at their last checkpoint and continue on the next start) and exits 0; a
second signal exits at once.

--queue (with --store postgres://...) makes this server a front end of a fleet: it runs nothing
itself but queues each run for the `awaken worker` processes on the same database, and streams
the run's stored events to its client whichever worker drives it; cancels and decisions reach
the run on its worker. A run that keeps failing is dead-lettered after 3 attempts
(--max-attempts N)."
        }
        "worker" => {
            "\
usage: awaken worker --agent FILE [--agent FILE ...] --store postgres://URL [--concurrency N]
                     [--shutdown-grace SECS]

Claims the runs that `awaken serve --queue` front ends queue in the PostgreSQL database, up to
N at once (default 16), and drives them with the agents of the files (only the runs of those
agents). Each claim is a lease kept by a heartbeat; a worker that stops (killed, or cut off
from the database) loses it, and another worker continues its runs from their last checkpoint
once it expires (AWAKEN_LEASE_SECS, default 15). A run that keeps failing is retried with
backoff and dead-lettered after its attempts (the front end's --max-attempts). SIGTERM or Ctrl-C stops claiming, gives the runs
held 10 s (--shutdown-grace SECS) to end, stops the others at their last checkpoint, gives them
back to the queue and exits 0; a second signal exits at once."
        }
        "threads" => {
            "\
usage: awaken threads [--json] [--store SPEC]
       awaken threads rm THREAD... [--store SPEC]
       awaken threads prune --older-than AGE [--dry-run] [--store SPEC]

Lists the stored threads (id, agent, status, last activity, messages), newest first; --json
prints one JSON object per line. `rm` deletes threads with their runs and events; `prune`
deletes those whose last activity is older than AGE (30d, 12h, 90m, ...)."
        }
        "show" => {
            "\
usage: awaken show THREAD [--json] [--store SPEC]

Prints the thread's transcript: each message with its role, tool calls with their arguments and
results, the runs with their times, and the calls waiting for a decision with the commands that
answer them. --json prints the stored checkpoint, runs and events as JSON lines."
        }
        "validate" => {
            "\
usage: awaken validate --agent FILE [--script FILE] [--model NAME]

Checks the agent file and resolves its agent without a model request: no API key is needed
(the key is checked when a run starts). The file's MCP servers ([[mcp_servers]]) are started
and listed, so one that cannot be connected is reported with its cause."
        }
        "mcp" => {
            "\
usage: awaken mcp list (--agent FILE | --url URL) [--json]
       awaken mcp call TOOL [KEY=VALUE]... (--url URL | --agent FILE --server NAME) [--json]

`list` connects to each MCP server of the agent file ([[mcp_servers]]), or to the one
streamable HTTP server at URL (named `url`), and lists it with its transport, its state and the
tools it offers (id, effect class, description), or the cause it could not be connected. --json
prints one JSON object per server. Exit 1 when a server could not be connected.

`call` connects to the server at URL, or to the agent file's server NAME, and calls its tool
TOOL (its MCP name, or its id as `list` shows it). Each KEY=VALUE is one argument: VALUE is
taken as JSON when it parses as JSON (a=5 is the number 5, tags='[\"x\"]' an array, s='\"5\"' the
text 5), else as text (name=Ada). The arguments are checked against the tool's schema before
the server is called. Prints the result (text as it is, anything else as JSON; --json: one JSON
object with the result or the error). Exit 0 on success, 1 when the tool failed or the server
could not be reached, 2 on bad input (an unknown tool, arguments the schema refuses), 4 when
Ctrl-C cancelled the call."
        }
        "plugins" => {
            "\
usage: awaken plugins --dir DIR...

Lists every declarative plugin manifest (*.toml) of the directories, checks each, then loads
them together (repeated ids, dependencies, agent definitions)."
        }
        "init" => {
            "\
usage: awaken init [DIR]

Writes a starter project into DIR (default: the current directory): agent.toml (offline,
scripted), openai.toml (an OpenAI-compatible endpoint) and plugins/ with a commented
declarative plugin. Existing files are never overwritten."
        }
        _ => return None,
    })
}

/// One `--approve CALL` or `--deny CALL`, with its `--answer`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DecisionArg {
    /// Approve (else deny).
    pub(crate) approve: bool,
    /// The call id.
    pub(crate) call: String,
    /// The `--answer` payload.
    pub(crate) answer: Option<Value>,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// One readable line per event.
    #[default]
    Pretty,
    /// One JSON object per line.
    Json,
}

/// A value that is never shown: its `Debug` prints `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub(crate) fn new(value: String) -> Self {
        Self(value)
    }

    /// The value, for the one place that uses it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The parsed command line.
#[derive(Debug, Default)]
pub(crate) struct Args {
    /// `run`, `chat`, ..., or `threads rm` / `threads prune`.
    pub(crate) command: String,
    pub(crate) positional: Vec<String>,
    /// The last `--agent`.
    pub(crate) agent: Option<PathBuf>,
    /// Every `--agent`, in order (`serve` serves them all).
    pub(crate) agents: Vec<PathBuf>,
    pub(crate) thread: Option<String>,
    pub(crate) json: bool,
    pub(crate) store: Option<String>,
    pub(crate) script: Option<PathBuf>,
    pub(crate) model: Option<String>,
    pub(crate) supersede: bool,
    pub(crate) decisions: Vec<DecisionArg>,
    pub(crate) dirs: Vec<PathBuf>,
    /// `mcp list` / `mcp call --url`: a streamable HTTP MCP server.
    pub(crate) url: Option<String>,
    /// `mcp call --server`: the agent file's MCP server.
    pub(crate) server: Option<String>,
    pub(crate) older_than: Option<Duration>,
    pub(crate) dry_run: bool,
    /// `serve --listen`.
    pub(crate) listen: Option<SocketAddr>,
    /// `serve --auth-token`.
    pub(crate) auth_token: Option<Secret>,
    /// `serve --insecure-no-auth`.
    pub(crate) insecure_no_auth: bool,
    /// `serve --no-chat-page`.
    pub(crate) no_chat_page: bool,
    /// `serve --cors`, each origin.
    pub(crate) cors: Vec<String>,
    /// `serve --max-runs`.
    pub(crate) max_runs: Option<usize>,
    /// `serve --queue`.
    pub(crate) queue: bool,
    /// `serve --queue --max-attempts`.
    pub(crate) max_attempts: Option<u32>,
    /// `worker --concurrency`.
    pub(crate) concurrency: Option<usize>,
    /// `serve --shutdown-grace`, in whole seconds.
    pub(crate) shutdown_grace: Option<u64>,
    /// `-v` counted.
    pub(crate) verbose: u8,
    pub(crate) quiet: bool,
    pub(crate) log_format: LogFormat,
}

/// What the command line asks for.
#[derive(Debug)]
pub(crate) enum Parsed {
    /// Run a command.
    Command(Box<Args>),
    /// Print this help text and exit 0.
    Help(&'static str),
    /// Print the version and exit 0.
    Version,
}

/// The flags each command accepts, and how many positional words.
fn accepted(command: &str) -> Option<(&'static [&'static str], std::ops::RangeInclusive<usize>)> {
    const RUN: &[&str] = &[
        "--agent",
        "--thread",
        "--supersede",
        "--json",
        "--store",
        "--script",
        "--model",
    ];
    const RESUME: &[&str] = &[
        "--agent",
        "--approve",
        "--deny",
        "--answer",
        "--json",
        "--store",
        "--script",
        "--model",
    ];
    Some(match command {
        "run" => (RUN, 0..=usize::MAX),
        "chat" => (
            &["--agent", "--thread", "--store", "--script", "--model"],
            0..=0,
        ),
        "resume" => (RESUME, 1..=1),
        "recover" => (
            &["--agent", "--json", "--store", "--script", "--model"],
            0..=0,
        ),
        "serve" => (
            &[
                "--agent",
                "--store",
                "--listen",
                "--auth-token",
                "--insecure-no-auth",
                "--cors",
                "--max-runs",
                "--shutdown-grace",
                "--no-chat-page",
                "--queue",
                "--max-attempts",
            ],
            0..=0,
        ),
        "worker" => (
            &["--agent", "--store", "--concurrency", "--shutdown-grace"],
            0..=0,
        ),
        "threads" => (&["--store", "--json"], 0..=0),
        "threads rm" => (&["--store"], 1..=usize::MAX),
        "threads prune" => (&["--store", "--older-than", "--dry-run"], 0..=0),
        "show" => (&["--store", "--json"], 1..=1),
        "validate" => (&["--agent", "--script", "--model"], 0..=0),
        "plugins" => (&["--dir"], 0..=0),
        "mcp list" => (&["--agent", "--url", "--json"], 0..=0),
        "mcp call" => (&["--agent", "--url", "--server", "--json"], 1..=usize::MAX),
        "init" => (&[], 0..=1),
        _ => return None,
    })
}

/// The usage shown after a usage error in `command`.
fn usage_of(command: &str) -> &'static str {
    command_usage(command.split(' ').next().unwrap_or(command)).unwrap_or(USAGE)
}

/// Parses the words after the program name.
pub(crate) fn parse_args(raw: Vec<String>) -> Result<Parsed> {
    let mut it = raw.into_iter().peekable();
    let mut args = Args::default();
    // Global options may come before the command.
    let command = loop {
        let Some(word) = it.next() else {
            return Ok(Parsed::Help(USAGE));
        };
        match global(&word, &mut args, &mut it)? {
            Some(Global::Help) => return Ok(Parsed::Help(USAGE)),
            Some(Global::Version) => return Ok(Parsed::Version),
            Some(Global::Taken) => {}
            None => break word,
        }
    };
    if command == "help" {
        return Ok(Parsed::Help(match it.next() {
            Some(c) => {
                command_usage(&c).ok_or_else(|| anyhow!("unknown command `{c}`\n\n{USAGE}"))?
            }
            None => USAGE,
        }));
    }
    let mut command = command;
    if command == "threads"
        && let Some(sub) = it.next_if(|w| w == "rm" || w == "prune")
    {
        command = format!("threads {sub}");
    }
    if command == "mcp" {
        match it.next() {
            Some(sub) if sub == "list" || sub == "call" => command = format!("mcp {sub}"),
            Some(sub) if sub == "-h" || sub == "--help" => {
                return Ok(Parsed::Help(usage_of("mcp")));
            }
            other => bail!(
                "`awaken mcp` takes a subcommand, `list` or `call`; got {other:?}\n\n{}",
                usage_of("mcp")
            ),
        }
    }
    let Some((flags, positional)) = accepted(&command) else {
        bail!("unknown command `{command}`\n\n{USAGE}");
    };
    let usage = usage_of(&command);
    args.command = command;
    while let Some(a) = it.next() {
        match global(&a, &mut args, &mut it)? {
            Some(Global::Help) => return Ok(Parsed::Help(usage)),
            Some(Global::Version) => return Ok(Parsed::Version),
            Some(Global::Taken) => continue,
            None => {}
        }
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| anyhow!("{name} needs a value\n\n{usage}"))
        };
        let flag: &'static str = match a.as_str() {
            "--agent" => {
                let path = PathBuf::from(value("--agent")?);
                args.agents.push(path.clone());
                args.agent = Some(path);
                "--agent"
            }
            "--thread" => {
                args.thread = Some(value("--thread")?);
                "--thread"
            }
            "--store" => {
                args.store = Some(value("--store")?);
                "--store"
            }
            "--script" => {
                args.script = Some(value("--script")?.into());
                "--script"
            }
            "--model" => {
                args.model = Some(value("--model")?);
                "--model"
            }
            "--dir" => {
                args.dirs.push(value("--dir")?.into());
                "--dir"
            }
            "--url" => {
                let url = value("--url")?;
                let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
                if !matches!(scheme.as_deref(), Some("http" | "https")) {
                    bail!(
                        "--url {url:?}: expected the http:// or https:// URL of a streamable HTTP MCP endpoint"
                    );
                }
                args.url = Some(url);
                "--url"
            }
            "--server" => {
                args.server = Some(value("--server")?);
                "--server"
            }
            "--older-than" => {
                let text = value("--older-than")?;
                let age = parse_age(&text).ok_or_else(|| {
                    anyhow!("--older-than {text:?}: expected an age such as 30d, 12h, 90m or 45s")
                })?;
                args.older_than = Some(age);
                "--older-than"
            }
            "--dry-run" => {
                args.dry_run = true;
                "--dry-run"
            }
            "--listen" => {
                let text = value("--listen")?;
                let addr = text.parse().map_err(|_| {
                    anyhow!(
                        "--listen {text:?}: expected IP:PORT, such as 127.0.0.1:8080 or [::1]:8080"
                    )
                })?;
                args.listen = Some(addr);
                "--listen"
            }
            "--auth-token" => {
                // The value is never repeated in a message.
                let token = value("--auth-token")?;
                if token.trim().is_empty() {
                    bail!("--auth-token is empty");
                }
                args.auth_token = Some(Secret::new(token));
                "--auth-token"
            }
            "--insecure-no-auth" => {
                args.insecure_no_auth = true;
                "--insecure-no-auth"
            }
            "--no-chat-page" => {
                args.no_chat_page = true;
                "--no-chat-page"
            }
            "--cors" => {
                let origin = value("--cors")?;
                if !is_origin(&origin) {
                    bail!(
                        "--cors {origin:?}: expected an origin (scheme and host, an optional port, no \
                         path), such as https://app.example.com, or *"
                    );
                }
                args.cors.push(origin);
                "--cors"
            }
            "--max-runs" => {
                let text = value("--max-runs")?;
                let limit = text
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| {
                        anyhow!("--max-runs {text:?}: expected a whole number, at least 1")
                    })?;
                args.max_runs = Some(limit);
                "--max-runs"
            }
            "--queue" => {
                args.queue = true;
                "--queue"
            }
            "--max-attempts" => {
                let text = value("--max-attempts")?;
                let n = text
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| {
                        anyhow!("--max-attempts {text:?}: expected a whole number from 1 to 100")
                    })?;
                args.max_attempts = Some(n);
                "--max-attempts"
            }
            "--concurrency" => {
                let text = value("--concurrency")?;
                let n = text
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=1024).contains(n))
                    .ok_or_else(|| {
                        anyhow!("--concurrency {text:?}: expected a whole number from 1 to 1024")
                    })?;
                args.concurrency = Some(n);
                "--concurrency"
            }
            "--shutdown-grace" => {
                let text = value("--shutdown-grace")?;
                let secs = text.parse::<u64>().map_err(|_| {
                    anyhow!("--shutdown-grace {text:?}: expected a whole number of seconds")
                })?;
                args.shutdown_grace = Some(secs);
                "--shutdown-grace"
            }
            "--approve" | "--deny" => {
                let approve = a == "--approve";
                let call = value(if approve { "--approve" } else { "--deny" })?;
                args.decisions.push(DecisionArg {
                    approve,
                    call,
                    answer: None,
                });
                if approve { "--approve" } else { "--deny" }
            }
            "--answer" => {
                let text = value("--answer")?;
                let answer: Value = serde_json::from_str(&text).map_err(|e| {
                    anyhow!(
                        "--answer {text:?} is not JSON ({e}); quote text as a JSON string, e.g. --answer '\"use notes.txt\"'"
                    )
                })?;
                let Some(last) = args.decisions.last_mut() else {
                    bail!("--answer must follow the --approve CALL or --deny CALL it answers");
                };
                if last.answer.is_some() {
                    bail!("call {} has two --answer values", last.call);
                }
                last.answer = Some(answer);
                "--answer"
            }
            "--json" => {
                args.json = true;
                "--json"
            }
            "--supersede" => {
                args.supersede = true;
                "--supersede"
            }
            flag if flag.starts_with('-') && flag.len() > 1 => {
                bail!("unknown option {flag}\n\n{usage}")
            }
            _ => {
                args.positional.push(a);
                continue;
            }
        };
        if !flags.contains(&flag) {
            bail!("`awaken {}` does not take {flag}\n\n{usage}", args.command);
        }
    }
    if !positional.contains(&args.positional.len()) {
        let expected = match args.command.as_str() {
            "resume" | "show" => "one THREAD".to_owned(),
            "threads rm" => "one or more THREADs".to_owned(),
            "init" => "at most one DIR".to_owned(),
            "mcp call" => "a TOOL, then KEY=VALUE arguments".to_owned(),
            _ => "no positional arguments".to_owned(),
        };
        bail!(
            "`awaken {}` takes {expected}, got {:?}\n\n{usage}",
            args.command,
            args.positional
        );
    }
    if args.supersede && args.thread.is_none() {
        bail!("--supersede needs --thread ID (it answers a thread that waits for decisions)");
    }
    if args.command == "threads prune" && args.older_than.is_none() {
        bail!("`awaken threads prune` needs --older-than AGE (e.g. 30d)\n\n{usage}");
    }
    if args.command.starts_with("mcp ") {
        mcp_target(&args, usage)?;
    }
    if args.quiet && args.json {
        bail!("--quiet and --json exclude each other (--json prints every event)");
    }
    Ok(Parsed::Command(Box::new(args)))
}

/// Checks that an `mcp` command names its server one way: `--url URL`, or `--agent FILE` (with
/// `--server NAME` for `mcp call`).
fn mcp_target(args: &Args, usage: &str) -> Result<()> {
    let call = args.command == "mcp call";
    match (&args.url, &args.agent, &args.server) {
        (Some(_), Some(_), _) => bail!("--url and --agent exclude each other\n\n{usage}"),
        (Some(_), None, Some(_)) => {
            bail!("--server names a server of the agent file; with --url leave it out\n\n{usage}")
        }
        (None, None, _) if call => {
            bail!("`awaken mcp call` needs --url URL, or --agent FILE --server NAME\n\n{usage}")
        }
        (None, None, _) => bail!("`awaken mcp list` needs --agent FILE or --url URL\n\n{usage}"),
        (None, Some(_), None) if call => {
            bail!(
                "`awaken mcp call --agent FILE` needs --server NAME (one of the file's [[mcp_servers]])\n\n{usage}"
            )
        }
        _ => Ok(()),
    }
}

/// A global option taken from the words.
enum Global {
    Taken,
    Help,
    Version,
}

/// Takes `word` when it is a global option (`-v`, `-vv`, `-q`, `--log-format FMT`, help,
/// version).
fn global(
    word: &str,
    args: &mut Args,
    rest: &mut impl Iterator<Item = String>,
) -> Result<Option<Global>> {
    Ok(Some(match word {
        "-h" | "--help" => Global::Help,
        "-V" | "--version" => Global::Version,
        "-q" | "--quiet" => {
            args.quiet = true;
            Global::Taken
        }
        "--verbose" => {
            args.verbose = args.verbose.saturating_add(1);
            Global::Taken
        }
        "--log-format" => {
            let value = rest
                .next()
                .ok_or_else(|| anyhow!("--log-format needs a value: pretty or json"))?;
            args.log_format = match value.as_str() {
                "pretty" => LogFormat::Pretty,
                "json" => LogFormat::Json,
                other => bail!("--log-format {other:?}: expected pretty or json"),
            };
            Global::Taken
        }
        w if w.len() > 1 && w.starts_with('-') && w[1..].bytes().all(|b| b == b'v') => {
            let count = u8::try_from(w.len() - 1).unwrap_or(u8::MAX);
            args.verbose = args.verbose.saturating_add(count);
            Global::Taken
        }
        _ => return Ok(None),
    }))
}

/// Whether `text` is a CORS origin: `*`, or `http://` / `https://` and a host with an optional
/// port, without path, query or user.
fn is_origin(text: &str) -> bool {
    if text == "*" {
        return true;
    }
    let Some(host) = text
        .strip_prefix("https://")
        .or_else(|| text.strip_prefix("http://"))
    else {
        return false;
    };
    !host.is_empty()
        && !host.contains(['/', '?', '#', '@'])
        && !host.chars().any(char::is_whitespace)
}

/// An age such as `30d`, `12h`, `90m`, `45s` (or anything [`DurationSpec`] reads).
fn parse_age(text: &str) -> Option<Duration> {
    let text = text.trim();
    if let Some(days) = text.strip_suffix('d') {
        let days: u64 = days.parse().ok()?;
        return days.checked_mul(86_400).map(Duration::from_secs);
    }
    DurationSpec::parse(text).ok().map(DurationSpec::get)
}
