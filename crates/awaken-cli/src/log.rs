//! Log output: a `tracing` subscriber writing to standard error. `RUST_LOG` picks what is
//! shown when set; otherwise `-q` shows errors, the default warnings (a retried model call, a
//! hook that failed), `-v` adds information (each run, inference and tool call as its span
//! closes) and `-vv` the awaken crates' debug lines.
//!
//! With the `otel` feature and an `OTEL_EXPORTER_OTLP_*ENDPOINT` variable set, the same
//! subscriber also exports the runtime's spans and the GenAI metrics over OTLP (whatever the
//! log filter shows), until the [`Telemetry`] that [`init`] returns is dropped.

use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

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

/// Whether the runtimes this command builds put message content on their spans: only while
/// spans are exported and `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` is `true`.
static SPAN_CONTENT: AtomicBool = AtomicBool::new(false);

/// The variable that opts the exported spans in to message content.
#[cfg(feature = "otel")]
pub(crate) const CAPTURE_MESSAGE_CONTENT: &str =
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";

/// Whether runtimes should record message content on their spans (set by [`init`]).
pub(crate) fn span_content() -> bool {
    SPAN_CONTENT.load(Ordering::Relaxed)
}

/// What the command keeps while it runs: the OTLP export, when there is one. Dropping it at
/// the end of the command sends the spans and metrics not sent yet.
pub(crate) struct Telemetry {
    #[cfg(feature = "otel")]
    _otel: Option<awaken_otel::OtelGuard>,
}

/// Installs the subscriber. A `RUST_LOG` that does not parse is reported, and the default
/// filter used instead; an OTLP configuration that cannot be used is reported, and nothing
/// exported.
pub(crate) fn init(args: &Args) -> Telemetry {
    let mut warnings = Vec::new();
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            warnings.push(format!(
                "RUST_LOG={spec:?} is not a log filter ({e}); using the default filter"
            ));
            EnvFilter::new(default_filter(args))
        }),
        _ => EnvFilter::new(default_filter(args)),
    };
    // A span the filter lets through is shown when it closes, with its fields and timing: the
    // run's `invoke_agent`, `chat` and `execute_tool` spans are at INFO (`-v`).
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(Stderr)
        .with_span_events(FmtSpan::CLOSE);
    let fmt = match args.log_format {
        LogFormat::Pretty => fmt
            .with_ansi(stderr_is_terminal())
            .with_target(args.verbose > 0)
            .without_time()
            .compact()
            .boxed(),
        LogFormat::Json => fmt.json().with_current_span(false).boxed(),
    };
    let logs = tracing_subscriber::registry().with(fmt.with_filter(filter));
    #[cfg(feature = "otel")]
    let (installed, telemetry) = {
        let (otel, guard) = match awaken_otel::from_env() {
            Ok(Some((layer, guard))) => {
                let content = std::env::var(CAPTURE_MESSAGE_CONTENT)
                    .is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
                SPAN_CONTENT.store(content, Ordering::Relaxed);
                (
                    Some(layer.with_filter(awaken_otel::default_filter())),
                    Some(guard),
                )
            }
            Ok(None) => (None, None),
            Err(e) => {
                warnings.push(format!("spans are not exported: {e}"));
                (None, None)
            }
        };
        (logs.with(otel).try_init(), Telemetry { _otel: guard })
    };
    #[cfg(not(feature = "otel"))]
    let (installed, telemetry) = (logs.try_init(), Telemetry {});
    if installed.is_ok() {
        for warning in warnings {
            tracing::warn!("{warning}");
        }
    }
    telemetry
}
