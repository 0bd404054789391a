//! The GenAI client metrics, computed from the `chat` spans as they close: the runtime records
//! an inference's provider, models, usage and error on its span, and this layer turns them
//! into the two histograms of the OpenTelemetry GenAI conventions, so the runtime needs no
//! metrics API of its own.

use std::sync::Arc;
use std::time::Instant;

use opentelemetry::metrics::{Histogram, Meter};
use opentelemetry::{KeyValue, StringValue, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The token-usage histogram: tokens per inference, by `gen_ai.token.type`.
pub const TOKEN_USAGE: &str = "gen_ai.client.token.usage";
/// The duration histogram: seconds per inference, with `error.type` when it failed.
pub const OPERATION_DURATION: &str = "gen_ai.client.operation.duration";

/// The buckets the conventions advise for token counts (powers of 4 up to 4^13).
const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// The buckets the conventions advise for durations in seconds (10 ms doubling to 82 s).
const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// The field a pool's attempt span carries: such a span is one try inside an inference, not
/// an inference of its own, and is not counted.
const POOL_MEMBER_FIELD: &str = "awaken.pool.member";

/// Records the GenAI histograms when a `chat` span closes.
pub(crate) struct GenAiMetrics {
    token_usage: Histogram<u64>,
    duration: Histogram<f64>,
}

impl GenAiMetrics {
    pub(crate) fn new(meter: &Meter) -> Self {
        Self {
            token_usage: meter
                .u64_histogram(TOKEN_USAGE)
                .with_unit("{token}")
                .with_description("Number of input and output tokens used")
                .with_boundaries(TOKEN_BUCKETS.to_vec())
                .build(),
            duration: meter
                .f64_histogram(OPERATION_DURATION)
                .with_unit("s")
                .with_description("GenAI operation duration")
                .with_boundaries(DURATION_BUCKETS.to_vec())
                .build(),
        }
    }
}

/// Whether spans of `metadata` are inferences this layer measures: named `chat`, with a
/// `gen_ai.operation.name`, and not a pool's attempt.
fn measured(metadata: &Metadata<'_>) -> bool {
    let fields = metadata.fields();
    metadata.name() == "chat"
        && fields.field("gen_ai.operation.name").is_some()
        && fields.field(POOL_MEMBER_FIELD).is_none()
}

/// What a measured span has recorded so far. The strings are shared: the SDK copies an
/// attribute list at every recording, and a shared string's copy is a count.
struct Inference {
    started: Instant,
    operation: Option<Arc<str>>,
    provider: Option<Arc<str>>,
    request_model: Option<Arc<str>>,
    response_model: Option<Arc<str>>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    error_type: Option<Arc<str>>,
}

impl Inference {
    /// The attributes every data point of the inference has, its strings moved out.
    fn take_attributes(&mut self) -> Vec<KeyValue> {
        let mut attributes = Vec::with_capacity(6);
        let fields = [
            ("gen_ai.operation.name", self.operation.take()),
            ("gen_ai.provider.name", self.provider.take()),
            ("gen_ai.request.model", self.request_model.take()),
            ("gen_ai.response.model", self.response_model.take()),
        ];
        for (key, value) in fields {
            if let Some(value) = value {
                attributes.push(KeyValue::new(key, shared(value)));
            }
        }
        attributes
    }
}

/// `value` as an attribute value that copies by count.
fn shared(value: Arc<str>) -> Value {
    Value::String(StringValue::from(value))
}

impl Visit for Inference {
    fn record_str(&mut self, field: &Field, value: &str) {
        let slot = match field.name() {
            "gen_ai.operation.name" => &mut self.operation,
            "gen_ai.provider.name" => &mut self.provider,
            "gen_ai.request.model" => &mut self.request_model,
            "gen_ai.response.model" => &mut self.response_model,
            "error.type" => &mut self.error_type,
            _ => return,
        };
        *slot = Some(Arc::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "gen_ai.usage.input_tokens" => self.input_tokens = Some(value),
            "gen_ai.usage.output_tokens" => self.output_tokens = Some(value),
            _ => {}
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if let Ok(value) = u64::try_from(value) {
            self.record_u64(field, value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // Values recorded with `%` arrive here; only the string fields are kept.
        if matches!(
            field.name(),
            "gen_ai.operation.name"
                | "gen_ai.provider.name"
                | "gen_ai.request.model"
                | "gen_ai.response.model"
                | "error.type"
        ) {
            self.record_str(field, &format!("{value:?}"));
        }
    }
}

impl<S> Layer<S> for GenAiMetrics
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if !measured(attrs.metadata()) {
            return;
        }
        let mut inference = Inference {
            started: Instant::now(),
            operation: None,
            provider: None,
            request_model: None,
            response_model: None,
            input_tokens: None,
            output_tokens: None,
            error_type: None,
        };
        attrs.record(&mut inference);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(inference);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        if !measured(span.metadata()) {
            return;
        }
        if let Some(inference) = span.extensions_mut().get_mut::<Inference>() {
            values.record(inference);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(mut inference) = span.extensions_mut().remove::<Inference>() else {
            return;
        };
        let seconds = inference.started.elapsed().as_secs_f64();
        let mut attributes = inference.take_attributes();
        let tokens = [
            ("input", inference.input_tokens),
            ("output", inference.output_tokens),
        ];
        for (kind, count) in tokens {
            if let Some(count) = count {
                attributes.push(KeyValue::new("gen_ai.token.type", kind));
                self.token_usage.record(count, &attributes);
                attributes.pop();
            }
        }
        if let Some(error_type) = inference.error_type {
            attributes.push(KeyValue::new("error.type", shared(error_type)));
        }
        self.duration.record(seconds, &attributes);
    }
}
