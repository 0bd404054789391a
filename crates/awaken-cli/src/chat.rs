//! `awaken chat`: an interactive conversation on one thread. Each line read is a run, streamed as it
//! happens; a call waiting for a decision is asked inline (y/n with its arguments); Ctrl-C
//! cancels the current run and keeps the conversation; end of input (Ctrl-D) leaves.

use std::io::IsTerminal;
use std::time::Instant;

use anyhow::anyhow;
use awaken::event::{SuspendTicket, TerminationReason, ThreadId, ToolCallResume};
use awaken::runtime::{AgentRuntime, Resume, RunActivation, RunError, RunOutcome};
use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};

use crate::Exit;
use crate::args::Args;
use crate::output::{Printer, chat_command};
use crate::run::{Interrupts, changed_under, interrupts, start, summary_line, unwritten_end_hint};
use crate::term::{self, err, errln};

/// Lines of standard input.
type Input = Lines<BufReader<Stdin>>;

/// `awaken chat --agent FILE [--thread ID]`.
pub(crate) async fn chat(args: Args) -> Result<u8, Exit> {
    let (file, runtime, thread) = start(&args).await?;
    let interactive = std::io::stdin().is_terminal();
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    let mut interrupts = interrupts()?;
    let printer = Printer::for_args(&args);
    if !args.quiet {
        errln!(
            "chat with agent {} on thread {thread} · Ctrl-C cancels a run · Ctrl-D leaves",
            file.agent.id
        );
    }
    let chat = Chat {
        runtime: &runtime,
        args: &args,
        thread: &thread,
        printer: &printer,
    };
    // A thread left waiting by an earlier conversation is answered first.
    let waiting = runtime
        .waiting_calls(&thread)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    if !waiting.is_empty() {
        errln!("thread {thread} waits for a decision from an earlier run");
        if !chat.decide(&mut input, &mut interrupts).await? {
            return Ok(0);
        }
    }
    let ask = if interactive { "you › " } else { "" };
    loop {
        err!("{ask}");
        let hint = format!("\n(Ctrl-D leaves the chat)\n{ask}");
        let Some(line) = next_line(&mut input, &mut interrupts, &hint).await? else {
            if interactive {
                errln!();
            }
            return Ok(0);
        };
        let prompt = line.trim();
        if prompt.is_empty() {
            continue;
        }
        let activation =
            RunActivation::new(thread.clone(), file.agent.id.clone()).with_user_message(prompt);
        let handle = activation.handle();
        let started = Instant::now();
        let outcome = {
            let run = runtime.run(activation, &printer);
            cancellable(run, handle, &mut interrupts).await
        };
        if !chat
            .settle(outcome, started, &mut input, &mut interrupts)
            .await?
        {
            return Ok(0);
        }
        if term::stdout_closed() {
            return Ok(0);
        }
    }
}

/// The next line of input, `None` at its end. A Ctrl-C while waiting prints `hint` and waits on.
async fn next_line(
    input: &mut Input,
    interrupts: &mut Interrupts,
    hint: &str,
) -> Result<Option<String>, Exit> {
    loop {
        tokio::select! {
            line = input.next_line() => {
                return Ok(line.map_err(|e| anyhow!("cannot read standard input: {e}"))?);
            }
            _ = interrupts.recv() => err!("{hint}"),
        }
    }
}

/// Awaits `run`, cancelling it (through `handle`) on Ctrl-C; the run then ends by itself with
/// its checkpoint written.
async fn cancellable<F: std::future::Future>(
    run: F,
    handle: awaken::runtime::RunHandle,
    interrupts: &mut Interrupts,
) -> F::Output {
    let mut run = std::pin::pin!(run);
    let mut cancelled = false;
    loop {
        tokio::select! {
            outcome = &mut run => return outcome,
            _ = interrupts.recv(), if !cancelled => {
                cancelled = true;
                handle.cancel();
                errln!("\ncancelling the run");
            }
        }
    }
}

/// What one conversation works with.
struct Chat<'a> {
    runtime: &'a AgentRuntime,
    args: &'a Args,
    thread: &'a ThreadId,
    printer: &'a Printer,
}

impl Chat<'_> {
    /// Reports how a run ended and, while it waits for decisions, asks for them and resumes
    /// it. `false` when input ended (the conversation ends).
    async fn settle(
        &self,
        mut outcome: Result<RunOutcome, RunError>,
        mut started: Instant,
        input: &mut Input,
        interrupts: &mut Interrupts,
    ) -> Result<bool, Exit> {
        loop {
            match outcome {
                Ok(done) => {
                    if !self.args.quiet {
                        errln!("{}", summary_line(&done, self.thread, started));
                    }
                    if done.termination != TerminationReason::Suspended {
                        return Ok(true);
                    }
                }
                Err(RunError::ThreadWaiting { .. }) => {
                    errln!("the thread waits for a decision first");
                }
                Err(e) => {
                    errln!("error: {e}");
                    if matches!(e, RunError::EndNotWritten { .. }) {
                        errln!("{}", unwritten_end_hint(self.args));
                    } else if changed_under(&e) {
                        errln!(
                            "the thread changed under the run (another process wrote to it): send again"
                        );
                    }
                    return Ok(true);
                }
            }
            let Some(request) = self.ask(input, interrupts).await? else {
                return Ok(false);
            };
            let handle = request.handle();
            started = Instant::now();
            outcome = {
                let resume = self.runtime.resume(request, self.printer);
                cancellable(resume, handle, interrupts).await
            };
        }
    }

    /// Asks for the decisions the thread waits on and resumes. `false` when input ended.
    async fn decide(&self, input: &mut Input, interrupts: &mut Interrupts) -> Result<bool, Exit> {
        let Some(request) = self.ask(input, interrupts).await? else {
            return Ok(false);
        };
        let handle = request.handle();
        let started = Instant::now();
        let outcome = {
            let resume = self.runtime.resume(request, self.printer);
            cancellable(resume, handle, interrupts).await
        };
        self.settle(outcome, started, input, interrupts).await
    }

    /// Asks y/n for each call the thread waits on; `None` when input ended first.
    async fn ask(
        &self,
        input: &mut Input,
        interrupts: &mut Interrupts,
    ) -> Result<Option<Resume>, Exit> {
        let tickets: Vec<SuspendTicket> = self
            .runtime
            .waiting_calls(self.thread)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let mut request = Resume::new(self.thread.clone());
        for ticket in &tickets {
            loop {
                err!(
                    "⏸ {} {} — {}\n  allow it? [y/n] ",
                    ticket.call.tool_name,
                    ticket.call.arguments,
                    ticket.message
                );
                let hint = "\n(answer y or n; Ctrl-D leaves with the call still waiting) ";
                let Some(line) = next_line(input, interrupts, hint).await? else {
                    errln!(
                        "\nthe call still waits; `{}` asks again",
                        chat_command(self.args, self.thread)
                    );
                    return Ok(None);
                };
                match line.trim().to_ascii_lowercase().as_str() {
                    "y" | "yes" => {
                        request = request.with_decision(ToolCallResume::approve(&ticket.call));
                        break;
                    }
                    "n" | "no" => {
                        request = request.with_decision(ToolCallResume::deny(&ticket.call));
                        break;
                    }
                    _ => errln!("answer y or n"),
                }
            }
        }
        Ok(Some(request))
    }
}
