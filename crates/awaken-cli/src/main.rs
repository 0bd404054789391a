//! The `awaken` command: runs agents defined in TOML files, streaming their events to the
//! terminal, keeps threads in an embedded SQLite file (`./.awaken/awaken.db`), talks with an
//! agent interactively (`awaken chat`), resumes runs that wait for a human's decision
//! (`awaken resume`) in any later invocation, continues the runs a crashed process left
//! unfinished (`awaken recover`), and serves agents over HTTP (`awaken serve`: the `/v1` API of
//! `awaken::server`, with resumable event streams, until SIGTERM or Ctrl-C shuts it down
//! gracefully).
//!
//! Exit codes: 0 completed, 2 bad input, 3 suspended waiting for a decision (or the thread is
//! busy: another process holds its run, or wrote to it while a run started), 4 cancelled, 1 other
//! errors (a failure of the store among them). `awaken serve` exits 0 after a graceful shutdown and
//! 130 on a second signal. A closed standard output (`awaken show T | head`) ends the command
//! quietly.

mod agent_file;
mod args;
mod chat;
mod init;
mod inspect;
mod log;
mod mcp;
mod output;
mod run;
mod script;
mod serve;
mod setup;
mod term;
#[cfg(test)]
mod tests;
mod tools;
mod worker;

use std::process::ExitCode;

use anyhow::anyhow;

use crate::agent_file::AgentFile;
use crate::args::{Args, Parsed, parse_args};
use crate::term::{errln, outln};

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
    let path = args.agent.as_ref().ok_or_else(|| {
        bad_input(anyhow!(
            "--agent FILE is required\n\n{}",
            args::command_usage(&args.command).unwrap_or(args::USAGE)
        ))
    })?;
    AgentFile::load(path).map_err(bad_input)
}

fn main() -> ExitCode {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(words) {
        Ok(Parsed::Command(args)) => *args,
        Ok(Parsed::Help(text)) => {
            outln!("{text}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Version) => {
            outln!("awaken {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            errln!("awaken: {e:#}");
            return ExitCode::from(2);
        }
    };
    // Kept to the end of the command: dropping it sends the spans not exported yet.
    let _telemetry = log::init(&args);
    let result = (|| -> Result<u8, Exit> {
        // The server answers requests while runs go on, and a worker drives many runs at once,
        // so they get worker threads; the other
        // commands drive one activation at a time.
        let rt = if args.command == "serve" || args.command == "worker" {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        .map_err(|e| anyhow!("cannot start the async runtime: {e}"))?;
        match args.command.as_str() {
            "run" => rt.block_on(run::run(args)),
            "chat" => rt.block_on(chat::chat(args)),
            "resume" => rt.block_on(run::resume(args)),
            "recover" => rt.block_on(run::recover(args)),
            "serve" => rt.block_on(serve::serve(args)),
            "worker" => rt.block_on(worker::worker(args)),
            "threads" => rt.block_on(inspect::threads(args)),
            "threads rm" => rt.block_on(inspect::threads_rm(args)),
            "threads prune" => rt.block_on(inspect::threads_prune(args)),
            "show" => rt.block_on(inspect::show(args)),
            "validate" => rt.block_on(inspect::validate(args)),
            "plugins" => inspect::plugins(args),
            "mcp list" => rt.block_on(mcp::mcp_list(args)),
            "mcp call" => rt.block_on(mcp::mcp_call(args)),
            "init" => init::init(args),
            other => Err(bad_input(anyhow!(
                "unknown command `{other}`\n\n{}",
                args::USAGE
            ))),
        }
    })();
    term::clear_status();
    if term::stdout_closed() {
        // The reader went away (`| head`): nothing more to say, and nobody to say it to.
        return ExitCode::SUCCESS;
    }
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Exit { code, error }) => {
            errln!("awaken: {error:#}");
            ExitCode::from(code)
        }
    }
}
