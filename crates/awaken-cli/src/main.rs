#![allow(clippy::print_stdout, clippy::print_stderr)] // printing is this binary's job
//! The `awaken` command: runs agents defined in TOML files, streaming their events to the
//! terminal, keeps threads in an embedded SQLite file (`./.awaken/awaken.db`), and resumes runs
//! that wait for a human's decision (`awaken resume`), in any later invocation, and runs a
//! crashed process left unfinished (`awaken recover`).
//!
//! Exit codes: 0 completed, 2 bad input, 3 suspended waiting for a decision, 4 cancelled,
//! 1 other errors.

mod agent_file;
mod args;
mod inspect;
mod output;
mod run;
mod script;
mod setup;
#[cfg(test)]
mod tests;
mod tools;

use std::process::ExitCode;

use anyhow::anyhow;

use crate::agent_file::AgentFile;
use crate::args::{Args, USAGE, parse_args};

/// A failure with its exit code.
pub(crate) struct Exit {
    code: u8,
    error: anyhow::Error,
}

/// Bad input: exit code 2.
pub(crate) fn bad_input(error: anyhow::Error) -> Exit {
    Exit { code: 2, error }
}

impl From<anyhow::Error> for Exit {
    fn from(error: anyhow::Error) -> Self {
        Exit { code: 1, error }
    }
}

/// The agent file `--agent` names.
pub(crate) fn load_file(args: &Args) -> Result<AgentFile, Exit> {
    let path = args
        .agent
        .as_ref()
        .ok_or_else(|| bad_input(anyhow!("--agent FILE is required\n\n{USAGE}")))?;
    AgentFile::load(path).map_err(bad_input)
}

fn main() -> ExitCode {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let help = words.first().is_some_and(|w| w == "help")
        || words.iter().any(|w| w == "-h" || w == "--help");
    if help {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let result = (|| -> Result<u8, Exit> {
        let args = parse_args(words).map_err(bad_input)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| anyhow!("{e}"))?;
        match args.command.as_str() {
            "run" => rt.block_on(run::run(args)),
            "resume" => rt.block_on(run::resume(args)),
            "recover" => rt.block_on(run::recover(args)),
            "threads" => rt.block_on(inspect::threads(args)),
            "show" => rt.block_on(inspect::show(args)),
            "validate" => rt.block_on(async { inspect::validate(args) }),
            "plugins" => inspect::plugins(args),
            other => Err(bad_input(anyhow!("unknown command `{other}`\n\n{USAGE}"))),
        }
    })();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Exit { code, error }) => {
            eprintln!("awaken: {error:#}");
            ExitCode::from(code)
        }
    }
}
