//! Writing to the terminal without panicking: standard output that notices a closed pipe
//! (`awaken show T | head`), standard error that ignores write failures, and the one-line
//! status (the waiting indicator) that other output clears before it prints.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once standard output is found closed; later writes are skipped.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Called once when standard output is found closed (the running command cancels its run).
static ON_CLOSED: Mutex<Option<Box<dyn FnOnce() + Send>>> = Mutex::new(None);

/// Whether a status line is on standard error now (it ends without a newline).
static STATUS_SHOWN: AtomicBool = AtomicBool::new(false);

/// Prints to standard output; a closed pipe is remembered, not a panic.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::term::write_stdout(format_args!($($arg)*))
    };
}

/// Prints a line to standard output; a closed pipe is remembered, not a panic.
macro_rules! outln {
    () => { $crate::term::write_stdout(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::term::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Prints a line to standard error (failures ignored).
macro_rules! errln {
    () => { $crate::term::write_stderr(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::term::write_stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Prints to standard error (failures ignored).
macro_rules! err {
    ($($arg:tt)*) => {
        $crate::term::write_stderr(format_args!($($arg)*))
    };
}

pub(crate) use {err, errln, out, outln};

/// Writes to standard output and flushes. A broken pipe marks standard output closed and calls
/// the hook set by [`on_stdout_closed`]; other failures are ignored as well (there is nowhere
/// left to report them).
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    clear_status();
    let mut out = std::io::stdout().lock();
    let result = out.write_fmt(args).and_then(|()| out.flush());
    if let Err(e) = result
        && e.kind() == std::io::ErrorKind::BrokenPipe
        && !STDOUT_CLOSED.swap(true, Ordering::Relaxed)
    {
        let hook = ON_CLOSED.lock().ok().and_then(|mut h| h.take());
        if let Some(hook) = hook {
            hook();
        }
    }
}

/// Writes to standard error, ignoring failures.
pub(crate) fn write_stderr(args: std::fmt::Arguments<'_>) {
    clear_status();
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(args).and_then(|()| err.flush());
}

/// Whether standard output was found closed.
pub(crate) fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

/// Sets what to do when standard output is found closed (replacing an earlier hook).
pub(crate) fn on_stdout_closed(hook: impl FnOnce() + Send + 'static) {
    if let Ok(mut slot) = ON_CLOSED.lock() {
        *slot = Some(Box::new(hook));
    }
}

/// Whether standard error is a terminal (status lines and colours are shown only then).
pub(crate) fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// Shows `text` as the status line on standard error, replacing the one shown.
pub(crate) fn show_status(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "\r\x1b[2K{text}").and_then(|()| err.flush());
    STATUS_SHOWN.store(true, Ordering::Relaxed);
}

/// Erases the status line, if one is shown.
pub(crate) fn clear_status() {
    if STATUS_SHOWN.swap(false, Ordering::Relaxed) {
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K").and_then(|()| err.flush());
    }
}

/// The writer log lines go through: standard error, after erasing the status line.
pub(crate) struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        clear_status();
        std::io::stderr().lock().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().lock().flush()
    }
}
