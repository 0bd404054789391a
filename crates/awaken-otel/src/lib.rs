//! Export of Awaken's `tracing` spans and the OpenTelemetry GenAI client metrics over
//! OTLP/HTTP, configured by the standard OpenTelemetry environment variables.
//!
//! The runtime emits its spans (`invoke_agent`, `chat`, `execute_tool`, a model pool's
//! attempts) with `tracing` only. This crate is a `tracing_subscriber` [`Layer`] that a program
//! adds to its subscriber: spans become OpenTelemetry spans (named by their `otel.name`
//! field) exported in batches from a background thread, and each closing `chat` span adds to
//! the histograms `gen_ai.client.token.usage` and `gen_ai.client.operation.duration`. The
//! returned [`OtelGuard`] flushes and shuts the export down when dropped (or by
//! [`OtelGuard::shutdown`]), so the last batch is not lost when the program ends.
//!
//! ```no_run
//! use awaken_otel::OtelLayer;
//! use tracing_subscriber::layer::SubscriberExt;
//! use tracing_subscriber::util::SubscriberInitExt;
//! use tracing_subscriber::{Layer, Registry};
//!
//! # fn main() -> Result<(), awaken_otel::OtelError> {
//! // `None` when no OTEL_EXPORTER_OTLP_*ENDPOINT is set or OTEL_SDK_DISABLED=true.
//! let (layer, guard) = awaken_otel::from_env::<Registry>()?.unzip();
//! // The spans at INFO and above, no log events.
//! let layer = layer.map(|l: OtelLayer<Registry>| l.with_filter(awaken_otel::default_filter()));
//! tracing_subscriber::registry().with(layer).init();
//! // ... run agents ...
//! drop(guard); // the last spans and metrics are sent here
//! # Ok(())
//! # }
//! ```
//!
//! This crate must never know the runtime, agents, tools or stores: it sees spans and their
//! fields, and nothing else. It sends no message content of its own accord; the runtime puts
//! content on spans only when its builder's `with_span_content(true)` asks for it.

mod config;
mod error;
mod http;
mod metrics;

#[cfg(test)]
mod tests;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{FilterFn, filter_fn};
use tracing_subscriber::registry::LookupSpan;

pub use config::{
    DEFAULT_SERVICE_NAME, DEFAULT_TIMEOUT, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS,
    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_EXPORTER_OTLP_TIMEOUT,
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_SDK_DISABLED, OTEL_SERVICE_NAME, OtelConfig, Protocol,
};
pub use error::{HeaderProblem, OtelError};
pub use metrics::{OPERATION_DURATION, TOKEN_USAGE};

use crate::http::ExportClient;
use crate::metrics::GenAiMetrics;

/// The instrumentation scope of the exported spans and metrics.
pub const SCOPE: &str = "awaken";

/// The layer [`layer`] returns: boxed, so its type does not name the OpenTelemetry crates.
pub type OtelLayer<S> = Box<dyn Layer<S> + Send + Sync + 'static>;

/// The filter to put on the layer: spans at `INFO` and above (the runtime's and a pool's), and
/// no log events. Events are left out because a log line may quote what a tool or a provider
/// answered; a failure is on its span as `error.type`.
pub fn default_filter() -> FilterFn<fn(&Metadata<'_>) -> bool> {
    fn wanted(metadata: &Metadata<'_>) -> bool {
        metadata.is_span() && *metadata.level() <= Level::INFO
    }
    filter_fn(wanted as fn(&Metadata<'_>) -> bool)
}

/// The layer and guard for the process's environment ([`OtelConfig::from_env`]); `None` when
/// the export is disabled or no endpoint is set. Fails on a variable that does not hold what
/// it takes, or when the export cannot be set up.
pub fn from_env<S>() -> Result<Option<(OtelLayer<S>, OtelGuard)>, OtelError>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync + 'static,
{
    match OtelConfig::from_env()? {
        Some(config) => layer(&config).map(Some),
        None => Ok(None),
    }
}

/// A layer exporting to `config`'s endpoints, and the guard that ends the export.
///
/// - Spans (when `config` has a traces endpoint) go through a batch processor: a closing span
///   is queued (a bounded queue; spans past its size are dropped, never waited for) and a
///   background thread sends the queue in batches. `OTEL_BSP_SCHEDULE_DELAY`,
///   `OTEL_BSP_MAX_QUEUE_SIZE` and `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` tune it.
/// - Metrics (when `config` has a metrics endpoint) are collected from the closing `chat`
///   spans and sent every `OTEL_METRIC_EXPORT_INTERVAL` milliseconds (default 60,000) and at
///   shutdown.
///
/// Every span the layer sees is exported, and every event inside one as a span event: add a
/// filter for the ones wanted ([`default_filter`]). Must be called outside the export's thread, from a Tokio runtime or
/// not. Fails when the export thread or HTTP client cannot be started, or an exporter
/// refuses its configuration.
pub fn layer<S>(config: &OtelConfig) -> Result<(OtelLayer<S>, OtelGuard), OtelError>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("awaken-otel")
        .enable_all()
        .build()
        .map_err(|source| OtelError::ExportThread { source })?;
    let client = reqwest::Client::builder()
        .timeout(config.timeout())
        .build()
        .map_err(|source| OtelError::HttpClient { source })?;
    let http = ExportClient {
        client,
        runtime: runtime.handle().clone(),
    };
    // Headers are handed over percent-encoded, as the exporter decodes them once more.
    let headers: std::collections::HashMap<String, String> = config
        .headers()
        .iter()
        .map(|(name, value)| (name.clone(), value.replace('%', "%25")))
        .collect();
    let protocol = match config.protocol() {
        Protocol::HttpProtobuf => opentelemetry_otlp::Protocol::HttpBinary,
        Protocol::HttpJson => opentelemetry_otlp::Protocol::HttpJson,
    };
    let resource = Resource::builder()
        .with_service_name(config.service_name().to_owned())
        .build();

    let tracer_provider = match config.traces_endpoint() {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(http.clone())
                .with_endpoint(endpoint.as_str())
                .with_protocol(protocol)
                .with_timeout(config.timeout())
                .with_headers(headers.clone())
                .build()
                .map_err(|source| OtelError::Exporter {
                    signal: "traces",
                    source,
                })?;
            Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(resource.clone())
                    .build(),
            )
        }
        None => None,
    };
    let meter_provider = match config.metrics_endpoint() {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_http_client(http)
                .with_endpoint(endpoint.as_str())
                .with_protocol(protocol)
                .with_timeout(config.timeout())
                .with_headers(headers)
                .build()
                .map_err(|source| OtelError::Exporter {
                    signal: "metrics",
                    source,
                })?;
            Some(
                SdkMeterProvider::builder()
                    .with_reader(PeriodicReader::builder(exporter).build())
                    .with_resource(resource)
                    .build(),
            )
        }
        None => None,
    };

    // Span attributes are the spans' own fields: no source location, thread or target
    // attributes, and no busy/idle time (an `Instant` read at every poll of a run's future).
    let spans = tracer_provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(SCOPE))
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_context_activation(false)
    });
    let metrics = meter_provider
        .as_ref()
        .map(|provider| GenAiMetrics::new(&provider.meter(SCOPE)));
    // `Layer::and_then`, not `Option::and_then`: either half may be absent.
    let layer = Layer::<S>::and_then(spans, metrics).boxed();
    Ok((
        layer,
        OtelGuard {
            tracer_provider,
            meter_provider,
            runtime: Some(runtime),
        },
    ))
}

/// Keeps the export running; dropping it (or [`OtelGuard::shutdown`]) sends what is queued
/// and the metrics' last values, then stops the export. Spans that close afterwards are not
/// exported.
#[must_use = "dropping the guard ends the export"]
pub struct OtelGuard {
    tracer_provider: Option<SdkTracerProvider>,
    meter_provider: Option<SdkMeterProvider>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for OtelGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtelGuard")
            .field("traces", &self.tracer_provider.is_some())
            .field("metrics", &self.meter_provider.is_some())
            .finish()
    }
}

impl OtelGuard {
    /// Sends the queued spans and the metrics now, waiting for the receiver's answers. Blocks
    /// the calling thread (not a Tokio worker's: the requests run on the export's own thread).
    pub fn flush(&self) -> Result<(), OtelError> {
        let traces = self
            .tracer_provider
            .as_ref()
            .map(|p| p.force_flush())
            .transpose_flush("traces");
        let metrics = self
            .meter_provider
            .as_ref()
            .map(|p| p.force_flush())
            .transpose_flush("metrics");
        traces.and(metrics)
    }

    /// Sends what is queued and stops the export (what dropping the guard does), reporting a
    /// signal whose last export failed.
    pub fn shutdown(mut self) -> Result<(), OtelError> {
        self.close()
    }

    fn close(&mut self) -> Result<(), OtelError> {
        let traces = self
            .tracer_provider
            .take()
            .map(|p| p.shutdown())
            .transpose_flush("traces");
        let metrics = self
            .meter_provider
            .take()
            .map(|p| p.shutdown())
            .transpose_flush("metrics");
        if let Some(runtime) = self.runtime.take() {
            // Nothing is in flight after the shutdowns; this never blocks, so the guard may be
            // dropped inside an async context.
            runtime.shutdown_background();
        }
        traces.and(metrics)
    }
}

impl Drop for OtelGuard {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(target: "awaken_otel", error = %e, "ending the OTLP export");
        }
    }
}

/// An SDK result of a signal's flush or shutdown as this crate's.
trait TransposeFlush {
    fn transpose_flush(self, signal: &'static str) -> Result<(), OtelError>;
}

impl TransposeFlush for Option<opentelemetry_sdk::error::OTelSdkResult> {
    fn transpose_flush(self, signal: &'static str) -> Result<(), OtelError> {
        match self {
            None | Some(Ok(())) => Ok(()),
            Some(Err(source)) => Err(OtelError::Flush { signal, source }),
        }
    }
}
