//! Log output: a `tracing` subscriber writing to standard error. `RUST_LOG` picks what is
//! shown when set; otherwise `-q` shows errors, the default warnings (a retried model call, a
//! hook that failed), `-v` adds information and `-vv` the awaken crates' debug lines.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::args::{Args, LogFormat};
use crate::term::{LogWriter, stderr_is_terminal};

/// The filter for `args` when `RUST_LOG` is not set.
pub(crate) fn default_filter(args: &Args) -> &'static str {
    match (args.quiet, args.verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => {
            "info,awaken=debug,awaken_cli=debug,awaken_runtime=debug,awaken_llm=debug,\
             awaken_store=debug,awaken_plugin=debug,awaken_resolver=debug,awaken_phase=debug,\
             awaken_tool=debug,awaken_context=debug"
        }
        (false, _) => "trace",
    }
}

struct Stderr;

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter
    }
}

/// Installs the subscriber. A `RUST_LOG` that does not parse is reported, and the default
/// filter used instead.
pub(crate) fn init(args: &Args) {
    let mut bad_env = None;
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            bad_env = Some(format!("RUST_LOG={spec:?} is not a log filter ({e})"));
            EnvFilter::new(default_filter(args))
        }),
        _ => EnvFilter::new(default_filter(args)),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(Stderr);
    let installed = match args.log_format {
        LogFormat::Pretty => builder
            .with_ansi(stderr_is_terminal())
            .with_target(args.verbose > 0)
            .without_time()
            .compact()
            .try_init(),
        LogFormat::Json => builder.json().with_current_span(false).try_init(),
    };
    if installed.is_ok()
        && let Some(warning) = bad_env
    {
        tracing::warn!("{warning}; using the default filter");
    }
}
