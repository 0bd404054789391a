//! An OTLP/HTTP receiver on 127.0.0.1: keeps every request sent to `/v1/traces` and
//! `/v1/metrics` and answers 200. It runs on a thread of its own, so a test may block its own
//! thread on the export guard's shutdown while the receiver answers.
//!
//! Protobuf bodies are decoded with the OTLP message types of `opentelemetry-proto`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use tokio::sync::oneshot;

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub content_type: String,
    /// Every header, as `name: value` lines.
    pub headers: String,
    pub body: Vec<u8>,
}

type Store = Arc<Mutex<Vec<Received>>>;

/// The running receiver; stops when dropped.
pub struct Receiver {
    /// `http://127.0.0.1:<port>`: the base URL of both signals.
    pub endpoint: String,
    store: Store,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        let store: Store = Arc::default();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = store.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("receiver runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind a loopback port");
                let addr = listener.local_addr().expect("bound address");
                bound_tx.send(addr).expect("the test waits for the address");
                let app = Router::new()
                    .route("/v1/traces", post(keep))
                    .route("/v1/metrics", post(keep))
                    .with_state(served);
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("the receiver serves");
            });
        });
        let addr = bound_rx.recv().expect("the receiver binds");
        Receiver {
            endpoint: format!("http://{addr}"),
            store,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Every request received so far.
    pub fn received(&self) -> Vec<Received> {
        self.store.lock().expect("store").clone()
    }

    /// The spans of every traces request, decoded.
    pub fn spans(&self) -> Vec<Span> {
        let mut spans = Vec::new();
        for r in self.received().iter().filter(|r| r.path == "/v1/traces") {
            assert_eq!(r.content_type, "application/x-protobuf");
            let request = ExportTraceServiceRequest::decode(r.body.as_slice())
                .expect("a traces request decodes");
            for resource in request.resource_spans {
                for scope in resource.scope_spans {
                    spans.extend(scope.spans);
                }
            }
        }
        spans
    }

    /// The `service.name` of the resources of the traces requests.
    pub fn service_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for r in self.received().iter().filter(|r| r.path == "/v1/traces") {
            let request = ExportTraceServiceRequest::decode(r.body.as_slice()).expect("decodes");
            for resource in request.resource_spans {
                let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
                names.extend(attribute(&attributes, "service.name"));
            }
        }
        names
    }

    /// The histograms of the last metrics request, rendered one data point a line:
    /// `name [unit] {attributes} count=N sum=S` (sums of durations left out: they are times).
    pub fn histograms(&self) -> String {
        let received = self.received();
        let last = received
            .iter()
            .rev()
            .find(|r| r.path == "/v1/metrics")
            .expect("a metrics request");
        assert_eq!(last.content_type, "application/x-protobuf");
        let request = ExportMetricsServiceRequest::decode(last.body.as_slice()).expect("decodes");
        let mut lines = Vec::new();
        for resource in request.resource_metrics {
            for scope in resource.scope_metrics {
                for metric in scope.metrics {
                    let Some(Data::Histogram(h)) = metric.data else {
                        lines.push(format!("{} (not a histogram)", metric.name));
                        continue;
                    };
                    for point in h.data_points {
                        let mut line = format!(
                            "{} [{}] {} count={}",
                            metric.name,
                            metric.unit,
                            render_attributes(&point.attributes),
                            point.count
                        );
                        if metric.unit != "s" {
                            let _ = write!(line, " sum={}", point.sum.unwrap_or_default());
                        }
                        lines.push(line);
                    }
                }
            }
        }
        lines.sort();
        lines.join("\n") + "\n"
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn keep(State(store): State<Store>, uri: Uri, headers: HeaderMap, body: Bytes) -> StatusCode {
    let mut lines = String::new();
    for (name, value) in &headers {
        let _ = writeln!(
            lines,
            "{name}: {}",
            String::from_utf8_lossy(value.as_bytes())
        );
    }
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    store.lock().expect("store").push(Received {
        path: uri.path().to_owned(),
        content_type,
        headers: lines,
        body: body.to_vec(),
    });
    StatusCode::OK
}

/// A value as text (arrays and other kinds in a debug form).
pub fn value_text(value: &AnyValue) -> String {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::ArrayValue(a)) => {
            let items: Vec<String> = a.values.iter().map(value_text).collect();
            format!("[{}]", items.join(","))
        }
        other => format!("{other:?}"),
    }
}

/// The text of attribute `key`, if present.
pub fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .map(value_text)
}

/// `{k=v k=v}` in key order.
pub fn render_attributes(attributes: &[KeyValue]) -> String {
    let sorted: BTreeMap<&str, String> = attributes
        .iter()
        .map(|kv| {
            (
                kv.key.as_str(),
                kv.value.as_ref().map(value_text).unwrap_or_default(),
            )
        })
        .collect();
    let pairs: Vec<String> = sorted.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{{{}}}", pairs.join(" "))
}

/// The spans as a tree: each span's name and attributes (key order), its children below it
/// by start time. Attributes whose values vary between runs are left out (`skip`).
pub fn render_tree(spans: &[Span], skip: &[&str]) -> String {
    let mut out = String::new();
    let ids: Vec<&[u8]> = spans.iter().map(|s| s.span_id.as_slice()).collect();
    let mut roots: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id.is_empty() || !ids.contains(&s.parent_span_id.as_slice()))
        .collect();
    roots.sort_by_key(|s| (s.start_time_unix_nano, s.name.clone()));
    for root in roots {
        render_span(spans, root, 0, skip, &mut out);
    }
    out
}

fn render_span(spans: &[Span], span: &Span, depth: usize, skip: &[&str], out: &mut String) {
    let kept: Vec<KeyValue> = span
        .attributes
        .iter()
        .filter(|kv| !skip.contains(&kv.key.as_str()))
        .cloned()
        .collect();
    let _ = writeln!(
        out,
        "{}{} {}",
        "  ".repeat(depth),
        span.name,
        render_attributes(&kept)
    );
    let mut children: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id == span.span_id && s.trace_id == span.trace_id)
        .collect();
    children.sort_by_key(|s| (s.start_time_unix_nano, s.name.clone()));
    for child in children {
        render_span(spans, child, depth + 1, skip, out);
    }
}
