//! `awaken run`, `awaken resume` and `awaken recover`: activations streamed to the terminal (or
//! as JSON lines). Ctrl-C cancels a run or a resume cleanly (a second Ctrl-C exits at once).

use std::io::{IsTerminal, Read};
use std::time::Instant;

use anyhow::anyhow;
use awaken::event::{SuspendTicket, TerminationReason, ThreadId, ToolCallResume};
use awaken::runtime::{
    AgentRuntime, RecoverConfig, Resume, RunActivation, RunError, RunHandle, RunOutcome,
};
use awaken_store::{CommitError, RunStatus};

use crate::agent_file::AgentFile;
use crate::args::Args;
use crate::output::{Printer, push_model_flags, shell_word, thread_command, waiting_instructions};
use crate::setup::{
    Open, Purpose, is_memory_store, lease_duration, mcp_servers, open_failed, open_store, runtime,
    stored_thread, worker_id,
};
use crate::term::{self, err, errln};
use crate::{Exit, bad_input, load_file};

/// `awaken run --agent FILE [PROMPT] [--thread ID [--supersede]]`.
pub(crate) async fn run(args: Args) -> Result<u8, Exit> {
    let prompt = prompt(&args)?;
    let (file, runtime, thread) = start(&args).await?;
    let mut activation = RunActivation::new(thread.clone(), file.agent.id.clone())
        .with_user_message(prompt.trim_end());
    if args.supersede {
        activation = activation.with_supersede();
    }
    cancel_on_interrupt(activation.handle())?;
    let started = Instant::now();
    let sink = Printer::for_args(&args);
    match runtime.run(activation, &sink).await {
        Ok(outcome) => finish(&runtime, &args, &thread, &outcome, started).await,
        Err(RunError::ThreadWaiting { run_id, .. }) => {
            let tickets = undecided(&runtime, &thread).await?;
            let shown_prompt = shown_prompt(&args, &prompt);
            Err(Exit {
                code: 3,
                error: anyhow!(
                    "thread `{thread}` is waiting: run `{run_id}` has tool calls that need a decision first.\n{}\
                     or close the waiting calls as cancelled and start the new run anyway:\n  {} {shown_prompt}",
                    waiting_instructions(&args, &thread, &tickets),
                    continue_command(&args, &thread, true),
                ),
            })
        }
        Err(RunError::ThreadBusy {
            run_id, lease_held, ..
        }) => Err(Exit {
            code: 3,
            error: anyhow!(
                "thread `{thread}` is busy: run `{run_id}` is still running{}.\n                 One run at a time per thread: wait for it to end (Ctrl-C in its terminal cancels it){}",
                if lease_held {
                    " and the process driving it is alive"
                } else {
                    ""
                },
                if lease_held {
                    String::new()
                } else {
                    format!(
                        ";\nif its process is gone, continue it with\n  {}\nor close it as cancelled and start the new run anyway:\n  {} {}",
                        recover_command(&args),
                        continue_command(&args, &thread, true),
                        shown_prompt(&args, &prompt),
                    )
                }
            ),
        }),
        Err(e) => Err(not_started(e, &args)),
    }
}

/// The runs of `store` that are `Running` (as `run R on thread T`): after a recovery claimed
/// none, those whose lease is still held.
async fn running_runs(store: &dyn awaken_store::ThreadStore) -> Result<Vec<String>, Exit> {
    let mut running = Vec::new();
    for thread in store.list_threads().await.map_err(|e| anyhow!("{e}"))? {
        let runs = store
            .list_runs(&thread.thread_id)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        running.extend(
            runs.iter()
                .filter(|r| r.status == RunStatus::Running)
                .map(|r| format!("run {} on thread {}", r.run_id, thread.thread_id)),
        );
    }
    Ok(running)
}

/// The prompt as shown in a suggested command: itself when short and given as arguments.
fn shown_prompt(args: &Args, prompt: &str) -> String {
    if args.positional.is_empty() || prompt.len() > 80 {
        "PROMPT".to_owned()
    } else {
        shell_word(prompt.trim_end())
    }
}

/// The `awaken recover` command for this agent file, store and model.
pub(crate) fn recover_command(args: &Args) -> String {
    let mut cmd = String::from("awaken recover");
    if let Some(agent) = &args.agent {
        cmd.push_str(&format!(
            " --agent {}",
            shell_word(&agent.display().to_string())
        ));
    }
    if let Some(store) = &args.store {
        cmd.push_str(&format!(" --store {}", shell_word(store)));
    }
    push_model_flags(&mut cmd, args);
    cmd
}

/// Whether an activation did not start because the thread or its run changed under it: another
/// process wrote the thread (a stale message guard, a profile key moved past the retries), or
/// holds the run (its lease). Running the command again works from what is stored now.
pub(crate) fn changed_under(e: &RunError) -> bool {
    match e {
        RunError::Commit { source, .. } => {
            source.is_conflict() || matches!(source, CommitError::LeaseLost { .. })
        }
        RunError::TakenOver { .. } => true,
        _ => false,
    }
}

/// What to do about a run that ended without writing its end: continue it with
/// `awaken recover` (nothing, on the memory store, which goes with the process).
pub(crate) fn unwritten_end_hint(args: &Args) -> String {
    if args.store.as_deref() == Some("memory") {
        "the memory store goes with this process: the run is not kept".to_owned()
    } else {
        format!("continue it from there with\n  {}", recover_command(args))
    }
}

/// The exit of an activation that did not start: 3 when the thread changed under it, with what
/// to do; 1 otherwise, saying so when the store failed. (A run that ended without writing its
/// end exits 1, saying how to continue it; one whose lease another process took over exits 3.)
pub(crate) fn not_started(e: RunError, args: &Args) -> Exit {
    if matches!(e, RunError::EndNotWritten { .. }) {
        return anyhow!("{e}\n{}", unwritten_end_hint(args)).into();
    }
    if matches!(e, RunError::TakenOver { .. }) {
        return Exit {
            code: 3,
            error: anyhow!(
                "{e}\nanother process holds the run and goes on with it (`awaken threads` shows \
                 how it ends)"
            ),
        };
    }
    if let RunError::Commit {
        source:
            CommitError::ThreadBusy {
                thread_id,
                run_id,
                status,
            },
        ..
    } = &e
    {
        return Exit {
            code: 3,
            error: anyhow!(
                "thread `{thread_id}` is busy: run `{run_id}` started on it at the same time and is {status}; \
                 nothing of this run was written. One run at a time per thread: run the command \
                 again once that run has ended"
            ),
        };
    }
    if changed_under(&e) {
        return Exit {
            code: 3,
            error: anyhow!(
                "{e}\nthe thread changed while this run started (another process wrote to it or \
                 holds its run); nothing of the run was written: run the command again"
            ),
        };
    }
    if let RunError::Commit {
        source: CommitError::Backend(_),
        ..
    } = &e
    {
        return anyhow!("{e}\nthe store failed; nothing of the run was written").into();
    }
    anyhow!("{e}").into()
}

/// What `run` and `chat` start from: the agent file, its runtime over the store (created when
/// missing) and the thread (`--thread`, else a new one).
pub(crate) async fn start(args: &Args) -> Result<(AgentFile, AgentRuntime, ThreadId), Exit> {
    let file = load_file(args)?;
    let store = open_store(args.store.as_deref(), Open::Create)
        .await
        .map_err(open_failed)?;
    let mcp = mcp_servers(std::slice::from_ref(&file))
        .await
        .map_err(bad_input)?;
    let runtime = runtime(&file, args, store, Purpose::Run, &mcp).map_err(bad_input)?;
    let thread = match &args.thread {
        Some(t) => ThreadId::new(t).map_err(|e| bad_input(anyhow!("--thread: {e}")))?,
        None => new_thread_id()?,
    };
    Ok((file, runtime, thread))
}

/// `awaken resume THREAD --agent FILE (--approve CALL | --deny CALL [--answer JSON])...`.
pub(crate) async fn resume(args: Args) -> Result<u8, Exit> {
    let file = load_file(&args)?;
    let (thread, store, checkpoint) = stored_thread(&args).await?;
    let run = checkpoint.run.as_ref();
    if run.is_none_or(|r| r.status != RunStatus::Waiting) {
        return Err(bad_input(anyhow!(
            "thread `{thread}` is not waiting for decisions{}; continue it with a new run:\n  {} PROMPT",
            run.map(|r| format!(" (its last run {} is {})", r.run_id, r.status))
                .unwrap_or_default(),
            continue_command(&args, &thread, false)
        )));
    }
    let mcp = mcp_servers(std::slice::from_ref(&file))
        .await
        .map_err(bad_input)?;
    let runtime = runtime(&file, &args, store, Purpose::Run, &mcp).map_err(bad_input)?;
    let tickets = runtime
        .waiting_calls(&thread)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let open = undecided(&runtime, &thread).await?;
    if args.decisions.is_empty() {
        return Err(bad_input(anyhow!(
            "give a decision for at least one waiting call.\n{}",
            waiting_instructions(&args, &thread, &open)
        )));
    }
    let mut request = Resume::new(thread.clone());
    let mut named: Vec<&str> = Vec::new();
    for d in &args.decisions {
        if named.contains(&d.call.as_str()) {
            return Err(bad_input(anyhow!("call {} has two decisions", d.call)));
        }
        named.push(&d.call);
        let Some(ticket) = tickets.iter().find(|t| t.call.call_id.as_str() == d.call) else {
            return Err(bad_input(anyhow!(
                "call {} is not waiting for a decision on thread `{thread}`.\n{}",
                d.call,
                waiting_instructions(&args, &thread, &open)
            )));
        };
        if !open.iter().any(|t| t.call.call_id == ticket.call.call_id) {
            return Err(bad_input(anyhow!(
                "call {} already has a decision (from an earlier resume).\n{}",
                d.call,
                waiting_instructions(&args, &thread, &open)
            )));
        }
        let mut decision = if d.approve {
            ToolCallResume::approve(&ticket.call)
        } else {
            ToolCallResume::deny(&ticket.call)
        };
        if let Some(answer) = &d.answer {
            decision = decision.with_payload(answer.clone());
        }
        request = request.with_decision(decision);
    }
    cancel_on_interrupt(request.handle())?;
    let started = Instant::now();
    let sink = Printer::for_args(&args);
    match runtime.resume(request, &sink).await {
        Ok(outcome) => finish(&runtime, &args, &thread, &outcome, started).await,
        Err(e @ (RunError::Decision { .. } | RunError::NotWaiting { .. })) => {
            let open = undecided(&runtime, &thread).await.unwrap_or_default();
            Err(bad_input(anyhow!(
                "{e}\n{}",
                waiting_instructions(&args, &thread, &open)
            )))
        }
        Err(e) => Err(not_started(e, &args)),
    }
}

/// `awaken recover --agent FILE`: claims the store's unfinished runs (those no live process
/// holds a lease on; not those waiting for a decision) and continues each with the agent file's
/// agent, one after another. Exit 1 when a run could not be continued or ended in an error,
/// else 3 when one waits for a decision (or none could be claimed while some still hold their
/// lease), 4 when one was cancelled, else 0.
pub(crate) async fn recover(args: Args) -> Result<u8, Exit> {
    let file = load_file(&args)?;
    let store = open_store(args.store.as_deref(), Open::Existing)
        .await
        .map_err(open_failed)?;
    let mcp = mcp_servers(std::slice::from_ref(&file))
        .await
        .map_err(bad_input)?;
    let runtime = runtime(&file, &args, store.clone(), Purpose::Run, &mcp).map_err(bad_input)?;
    let mut config = RecoverConfig::new(worker_id());
    config.lease_duration = lease_duration().map_err(bad_input)?;
    let sink = Printer::for_args(&args);
    let started = Instant::now();
    let recovered = runtime
        .recover(&config, &sink)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    if recovered.is_empty() {
        let held = running_runs(&*store).await?;
        if held.is_empty() {
            errln!("no unfinished runs to recover");
            return Ok(0);
        }
        errln!(
            "no unfinished run could be claimed: {} still hold a lease ({}).\n             A live process is driving them, or one that stopped did so less than {} s ago: \
             run the command again once its lease has expired",
            held.len(),
            held.join(", "),
            config.lease_duration.as_secs()
        );
        return Ok(3);
    }
    let mut code = 0;
    for run in &recovered {
        let worst = match &run.outcome {
            Ok(outcome) => {
                errln!(
                    "— recovered run {} · {} · thread {} · {} step(s) · {} tokens · {} ms",
                    run.run_id,
                    outcome.termination,
                    run.thread_id,
                    outcome.steps,
                    outcome.usage.total(),
                    started.elapsed().as_millis()
                );
                match outcome.termination {
                    TerminationReason::Error { .. } => 1,
                    TerminationReason::Suspended => {
                        let tickets = undecided(&runtime, &run.thread_id).await?;
                        err!("{}", waiting_instructions(&args, &run.thread_id, &tickets));
                        3
                    }
                    TerminationReason::Cancelled => 4,
                    _ => 0,
                }
            }
            Err(e @ RunError::EndNotWritten { .. }) => {
                errln!("— recovered run {}: {e}", run.run_id);
                1
            }
            Err(e) => {
                errln!(
                    "— run {} on thread {} was not continued: {e}",
                    run.run_id,
                    run.thread_id
                );
                1
            }
        };
        code = match (code, worst) {
            (1, _) | (_, 1) => 1,
            (3, _) | (_, 3) => 3,
            (a, b) => a.max(b),
        };
    }
    Ok(code)
}

/// The prompt: the positional words, else standard input. An empty prompt is refused.
fn prompt(args: &Args) -> Result<String, Exit> {
    let text = if args.positional.is_empty() {
        if std::io::stdin().is_terminal() {
            return Err(bad_input(anyhow!(
                "give a prompt, or pipe one on standard input"
            )));
        }
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| bad_input(anyhow!("cannot read the prompt from standard input: {e}")))?;
        if text.trim().is_empty() {
            return Err(bad_input(anyhow!(
                "the prompt on standard input is empty; give a prompt as an argument or pipe one"
            )));
        }
        text
    } else {
        args.positional.join(" ")
    };
    if text.trim().is_empty() {
        return Err(bad_input(anyhow!("the prompt is empty")));
    }
    Ok(text)
}

/// Cancels the run on the first interrupt (Ctrl-C, SIGINT) and exits on the second, and when
/// standard output is found closed. The handler is installed before this returns, so an
/// interrupt after it is never lost.
fn cancel_on_interrupt(handle: RunHandle) -> Result<(), Exit> {
    let on_close = handle.clone();
    term::on_stdout_closed(move || on_close.cancel());
    let mut interrupts = interrupts()?;
    tokio::spawn(async move {
        if interrupts.recv().await.is_some() {
            handle.cancel();
            errln!("\ncancelling the run (Ctrl-C again exits at once)");
            if interrupts.recv().await.is_some() {
                std::process::exit(130);
            }
        }
    });
    Ok(())
}

/// The stream of interrupts (Ctrl-C).
pub(crate) struct Interrupts {
    #[cfg(unix)]
    signal: tokio::signal::unix::Signal,
}

impl Interrupts {
    /// The next interrupt; `None` when no more can arrive.
    pub(crate) async fn recv(&mut self) -> Option<()> {
        #[cfg(unix)]
        return self.signal.recv().await;
        #[cfg(not(unix))]
        return tokio::signal::ctrl_c().await.ok();
    }
}

/// Starts listening for interrupts (from then on, Ctrl-C no longer ends the process).
pub(crate) fn interrupts() -> Result<Interrupts, Exit> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let signal = signal(SignalKind::interrupt())
            .map_err(|e| anyhow!("cannot install the Ctrl-C handler: {e}"))?;
        Ok(Interrupts { signal })
    }
    #[cfg(not(unix))]
    Ok(Interrupts {})
}

/// A new thread's id, from the clock and 32 random bits: two runs started in the same
/// millisecond, by this process or another, get different threads.
pub(crate) fn new_thread_id() -> Result<ThreadId, Exit> {
    use std::hash::{BuildHasher, RandomState};
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let random = RandomState::new().hash_one(std::process::id()) as u32;
    Ok(ThreadId::new(format!("thread-{millis:x}-{random:08x}")).map_err(|e| anyhow!("{e}"))?)
}

/// The line that ends a run: how it ended, the thread, steps, tokens and time.
pub(crate) fn summary_line(outcome: &RunOutcome, thread: &ThreadId, started: Instant) -> String {
    format!(
        "— {} · thread {} · {} step(s) · {} tokens · {} ms",
        outcome.termination,
        thread,
        outcome.steps,
        outcome.usage.total(),
        started.elapsed().as_millis()
    )
}

/// Prints the final line (and, for a waiting run, how to answer it) and picks the exit code.
async fn finish(
    runtime: &AgentRuntime,
    args: &Args,
    thread: &ThreadId,
    outcome: &RunOutcome,
    started: Instant,
) -> Result<u8, Exit> {
    let kept = !is_memory_store(args.store.as_deref());
    if term::stdout_closed() {
        // The reader went away: the run was cancelled for it, and nothing more is said.
        return Ok(4);
    }
    if !args.json && !args.quiet {
        errln!("{}", summary_line(outcome, thread, started));
    }
    Ok(match &outcome.termination {
        TerminationReason::Suspended if !kept => {
            errln!(
                "the run waits for a decision, but --store memory keeps nothing past this \
                 process, so it cannot be resumed; run with a stored thread (the default SQLite \
                 store) to answer it with `awaken resume`"
            );
            3
        }
        TerminationReason::Suspended => {
            let tickets = undecided(runtime, thread).await?;
            err!("{}", waiting_instructions(args, thread, &tickets));
            3
        }
        TerminationReason::Cancelled if !kept || args.quiet => 4,
        TerminationReason::Cancelled => {
            errln!(
                "the run was cancelled; the thread keeps its checkpoint. Continue it with:\n  {} PROMPT",
                continue_command(args, thread, false)
            );
            4
        }
        TerminationReason::Error { message } => {
            // The summary line says it already, unless quiet or JSON left it out.
            if args.json || args.quiet {
                errln!("awaken: the run ended in an error: {message}");
            }
            1
        }
        _ => 0,
    })
}

/// `awaken run --agent FILE --thread THREAD [--store SPEC] [--model M] [--script FILE]
/// [--supersede]`.
pub(crate) fn continue_command(args: &Args, thread: &ThreadId, supersede: bool) -> String {
    let mut command = thread_command("run", args, thread);
    if supersede {
        command.push_str(" --supersede");
    }
    command
}

/// The calls `thread` waits on that have no recorded decision yet (an earlier resume may have
/// decided some of them; `waiting_calls` leaves those out).
async fn undecided(runtime: &AgentRuntime, thread: &ThreadId) -> Result<Vec<SuspendTicket>, Exit> {
    Ok(runtime
        .waiting_calls(thread)
        .await
        .map_err(|e| anyhow!("{e}"))?)
}
