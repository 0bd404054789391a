//! [`OtelError`]: a configuration the export cannot use, or an export that could not be set up
//! or finished. No variant carries a header value.

/// Why the export could not be configured, set up or shut down.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtelError {
    /// An endpoint is not a URL.
    #[error("{setting} is not a URL ({source})")]
    EndpointNotUrl {
        /// The variable (or setting) holding it.
        setting: &'static str,
        /// Why it does not parse.
        #[source]
        source: url::ParseError,
    },
    /// An endpoint is a URL of another scheme than `http` or `https`.
    #[error("{setting} must be an http:// or https:// URL, not a {scheme}: one")]
    EndpointScheme {
        /// The variable (or setting) holding it.
        setting: &'static str,
        /// Its scheme.
        scheme: String,
    },
    /// An entry of a header list is not a `name=value` pair that can be sent.
    #[error("{setting}: entry {entry} {problem}")]
    InvalidHeader {
        /// The variable (or setting) holding the list.
        setting: &'static str,
        /// The entry's position in the list (1-based, counting empty entries).
        entry: usize,
        /// What is wrong with it.
        problem: HeaderProblem,
    },
    /// The protocol is not one this exporter speaks (`grpc` among them).
    #[error("{setting} is `{value}`: the export speaks `http/protobuf` and `http/json` only")]
    UnsupportedProtocol {
        /// The variable (or setting) holding it.
        setting: &'static str,
        /// Its value.
        value: String,
    },
    /// The timeout is not a whole number of milliseconds.
    #[error("{setting} is `{value}`, not a whole number of milliseconds")]
    InvalidTimeout {
        /// The variable (or setting) holding it.
        setting: &'static str,
        /// Its value.
        value: String,
    },
    /// The OTLP exporter of a signal refused its configuration (for instance an
    /// `OTEL_EXPORTER_OTLP_COMPRESSION` it cannot apply).
    #[error("cannot build the OTLP {signal} exporter: {source}")]
    Exporter {
        /// `traces` or `metrics`.
        signal: &'static str,
        /// The exporter's reason.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// The HTTP client could not be built (its TLS configuration failed to load).
    #[error("cannot build the HTTP client of the OTLP export: {source}")]
    HttpClient {
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },
    /// The thread the export requests run on could not be started.
    #[error("cannot start the thread of the OTLP export: {source}")]
    ExportThread {
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// Flushing or shutting down a signal's export failed (its last batch may be lost).
    #[error("flushing the OTLP {signal} export failed: {source}")]
    Flush {
        /// `traces` or `metrics`.
        signal: &'static str,
        /// The SDK's error.
        #[source]
        source: opentelemetry_sdk::error::OTelSdkError,
    },
}

/// What is wrong with an entry of a header list. Names the header when its name is valid;
/// never shows a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderProblem {
    /// The entry has no `=`.
    #[error("has no `=` between a name and a value")]
    MissingEquals,
    /// The name before `=` is empty.
    #[error("has an empty name")]
    EmptyName,
    /// The name holds a character an HTTP header name may not.
    #[error("has a name that is not an HTTP header name")]
    InvalidName,
    /// The value is empty.
    #[error("(`{name}`) has an empty value")]
    EmptyValue {
        /// The header's name.
        name: String,
    },
    /// A `%` of the value is not followed by two hexadecimal digits.
    #[error("(`{name}`) has a `%` not followed by two hexadecimal digits in its value")]
    BadPercentEncoding {
        /// The header's name.
        name: String,
    },
    /// The value's percent-decoded bytes are not UTF-8.
    #[error("(`{name}`) has a value that is not UTF-8 once percent-decoded")]
    NotUtf8 {
        /// The header's name.
        name: String,
    },
    /// The value holds a character outside visible ASCII, space and tab.
    #[error("(`{name}`) has a value with a character outside visible ASCII, space and tab")]
    InvalidValue {
        /// The header's name.
        name: String,
    },
}
