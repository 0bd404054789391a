//! The command line: the command, its flags and the positional words. Each command accepts only
//! its own flags; anything else is bad input (exit 2) with the usage.

use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use serde_json::Value;

/// What the command prints for `--help` and after a usage error.
pub(crate) const USAGE: &str = "\
usage:
  awaken run --agent FILE [PROMPT] [--thread ID [--supersede]] [--json] [--store SPEC] [--script FILE] [--model NAME]
  awaken resume THREAD --agent FILE (--approve CALL | --deny CALL [--answer JSON])... [--json] [--store SPEC]
  awaken recover --agent FILE [--json] [--store SPEC] [--script FILE] [--model NAME]
  awaken threads [--store SPEC]
  awaken show THREAD [--store SPEC]
  awaken validate --agent FILE
  awaken plugins --dir DIR...

  PROMPT defaults to standard input. SPEC is sqlite:PATH (default sqlite:./.awaken/awaken.db), postgres:URL or memory.
  With OPENAI_API_KEY or AWAKEN_BASE_URL set (or [provider] kind = \"openai\"), the agent talks to an
  OpenAI-compatible endpoint; otherwise it replays the agent file's [script].
  recover continues the runs a crashed or killed process left unfinished (not those waiting
  for a decision), each with the agent file's agent.
  A run waiting for a decision exits 3 and prints the `awaken resume` commands that answer it;
  --answer gives the decision before it a JSON payload (the answer, or the reason of a denial).
  Exit codes: 0 completed, 2 bad input, 3 waiting for a decision, 4 cancelled, 1 other errors.";

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

/// The parsed command line.
#[derive(Debug, Default)]
pub(crate) struct Args {
    pub(crate) command: String,
    pub(crate) positional: Vec<String>,
    pub(crate) agent: Option<PathBuf>,
    pub(crate) thread: Option<String>,
    pub(crate) json: bool,
    pub(crate) store: Option<String>,
    pub(crate) script: Option<PathBuf>,
    pub(crate) model: Option<String>,
    pub(crate) supersede: bool,
    pub(crate) decisions: Vec<DecisionArg>,
    pub(crate) dirs: Vec<PathBuf>,
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
        "resume" => (RESUME, 1..=1),
        "recover" => (
            &["--agent", "--json", "--store", "--script", "--model"],
            0..=0,
        ),
        "threads" => (&["--store"], 0..=0),
        "show" => (&["--store"], 1..=1),
        "validate" => (&["--agent", "--script", "--model"], 0..=0),
        "plugins" => (&["--dir"], 0..=0),
        _ => return None,
    })
}

/// Parses the words after the program name.
pub(crate) fn parse_args(raw: Vec<String>) -> Result<Args> {
    let mut it = raw.into_iter();
    let command = it.next().ok_or_else(|| anyhow!("{USAGE}"))?;
    if matches!(command.as_str(), "-h" | "--help" | "help") {
        bail!("{USAGE}");
    }
    let Some((flags, positional)) = accepted(&command) else {
        bail!("unknown command `{command}`\n\n{USAGE}");
    };
    let mut args = Args {
        command,
        ..Args::default()
    };
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| anyhow!("{name} needs a value\n\n{USAGE}"))
        };
        let flag: &'static str = match a.as_str() {
            "--agent" => {
                args.agent = Some(value("--agent")?.into());
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
            "-h" | "--help" => bail!("{USAGE}"),
            flag if flag.starts_with("--") => bail!("unknown option {flag}\n\n{USAGE}"),
            _ => {
                args.positional.push(a);
                continue;
            }
        };
        if !flags.contains(&flag) {
            bail!("`awaken {}` does not take {flag}\n\n{USAGE}", args.command);
        }
    }
    if !positional.contains(&args.positional.len()) {
        let expected = match (args.command.as_str(), positional.start()) {
            ("resume" | "show", _) => "one THREAD".to_owned(),
            (_, 0) => "no positional arguments".to_owned(),
            (_, n) => format!("{n}"),
        };
        bail!(
            "`awaken {}` takes {expected}, got {:?}\n\n{USAGE}",
            args.command,
            args.positional
        );
    }
    if args.supersede && args.thread.is_none() {
        bail!("--supersede needs --thread ID (it answers a thread that waits for decisions)");
    }
    Ok(args)
}
