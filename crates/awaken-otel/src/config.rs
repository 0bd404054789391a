//! What the export is configured by: the standard OpenTelemetry variables, read once and
//! checked, so a bad value is reported when the program starts, naming the variable.

use std::fmt;
use std::time::Duration;

use url::Url;

use crate::error::{HeaderProblem, OtelError};

/// The base URL of both signals (`/v1/traces` and `/v1/metrics` are appended to its path).
pub const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The URL spans are sent to, as it is (it replaces the base URL's for traces).
pub const OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// The URL metrics are sent to, as it is (it replaces the base URL's for metrics).
pub const OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT";
/// Headers sent with every export request: `name=value` entries separated by commas, values
/// percent-encoded.
pub const OTEL_EXPORTER_OTLP_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
/// `http/protobuf` (the default) or `http/json`.
pub const OTEL_EXPORTER_OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
/// How long one export request may take, in milliseconds (default 10,000).
pub const OTEL_EXPORTER_OTLP_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
/// The `service.name` resource attribute (default [`DEFAULT_SERVICE_NAME`]).
pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
/// `true` turns the export off whatever else is set.
pub const OTEL_SDK_DISABLED: &str = "OTEL_SDK_DISABLED";

/// The `service.name` of a program that sets no `OTEL_SERVICE_NAME`.
pub const DEFAULT_SERVICE_NAME: &str = "awaken";

/// How long one export request may take when `OTEL_EXPORTER_OTLP_TIMEOUT` is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How the export requests' bodies are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Protocol {
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`).
    #[default]
    HttpProtobuf,
    /// OTLP/HTTP with JSON bodies (`http/json`).
    HttpJson,
}

impl Protocol {
    /// The protocol's name in `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::HttpJson => "http/json",
        }
    }
}

/// Where and how spans and metrics are exported.
///
/// Header values are credentials as often as not: they are kept for the requests and shown
/// nowhere else (`Debug` prints the names only, and no error carries a value).
#[derive(Clone, PartialEq, Eq)]
pub struct OtelConfig {
    traces_endpoint: Option<Url>,
    metrics_endpoint: Option<Url>,
    /// Names and decoded values.
    headers: Vec<(String, String)>,
    protocol: Protocol,
    service_name: String,
    timeout: Duration,
}

impl fmt::Debug for OtelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OtelConfig")
            .field(
                "traces_endpoint",
                &self.traces_endpoint.as_ref().map(Url::as_str),
            )
            .field(
                "metrics_endpoint",
                &self.metrics_endpoint.as_ref().map(Url::as_str),
            )
            .field("header_names", &self.header_names().collect::<Vec<_>>())
            .field("protocol", &self.protocol)
            .field("service_name", &self.service_name)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl OtelConfig {
    /// Exports both signals under `endpoint` (a base URL such as `http://127.0.0.1:4318`:
    /// spans to `/v1/traces`, metrics to `/v1/metrics` below its path), as `http/protobuf`,
    /// with no headers, service name [`DEFAULT_SERVICE_NAME`] and timeout [`DEFAULT_TIMEOUT`].
    /// Fails when `endpoint` is not an `http` or `https` URL.
    pub fn new(endpoint: &str) -> Result<Self, OtelError> {
        let base = parse_endpoint("the OTLP endpoint", endpoint)?;
        Ok(Self {
            traces_endpoint: Some(signal_url(&base, "v1/traces")),
            metrics_endpoint: Some(signal_url(&base, "v1/metrics")),
            headers: Vec::new(),
            protocol: Protocol::default(),
            service_name: DEFAULT_SERVICE_NAME.to_owned(),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The configuration the process's environment describes; `None` when `OTEL_SDK_DISABLED`
    /// is `true` or no endpoint is set (see [`OtelConfig::from_vars`]).
    pub fn from_env() -> Result<Option<Self>, OtelError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The configuration the variables `lookup` answers describe (a name to its value, `None`
    /// when unset; an empty value counts as unset):
    ///
    /// - `OTEL_SDK_DISABLED=true`: `None`, whatever else is set.
    /// - `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` and `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` are
    ///   used as they are; a signal without its own takes `OTEL_EXPORTER_OTLP_ENDPOINT` with
    ///   `/v1/traces` or `/v1/metrics` appended to its path. `None` when neither signal has an
    ///   endpoint; a signal without one is not exported.
    /// - `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_PROTOCOL`,
    ///   `OTEL_EXPORTER_OTLP_TIMEOUT` and `OTEL_SERVICE_NAME` as their constants say.
    ///
    /// A value that is not what its variable takes is an [`OtelError`] naming the variable
    /// (header values are never part of it).
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, OtelError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        if get(OTEL_SDK_DISABLED).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let base = get(OTEL_EXPORTER_OTLP_ENDPOINT)
            .map(|v| parse_endpoint(OTEL_EXPORTER_OTLP_ENDPOINT, &v))
            .transpose()?;
        let signal = |own: &'static str, path: &str| -> Result<Option<Url>, OtelError> {
            match get(own) {
                Some(v) => parse_endpoint(own, &v).map(Some),
                None => Ok(base.as_ref().map(|b| signal_url(b, path))),
            }
        };
        let traces_endpoint = signal(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "v1/traces")?;
        let metrics_endpoint = signal(OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, "v1/metrics")?;
        let headers = match get(OTEL_EXPORTER_OTLP_HEADERS) {
            Some(v) => parse_headers(OTEL_EXPORTER_OTLP_HEADERS, &v)?,
            None => Vec::new(),
        };
        let protocol = match get(OTEL_EXPORTER_OTLP_PROTOCOL) {
            None => Protocol::default(),
            Some(v) => match v.trim() {
                "http/protobuf" => Protocol::HttpProtobuf,
                "http/json" => Protocol::HttpJson,
                other => {
                    return Err(OtelError::UnsupportedProtocol {
                        setting: OTEL_EXPORTER_OTLP_PROTOCOL,
                        value: other.to_owned(),
                    });
                }
            },
        };
        let timeout = match get(OTEL_EXPORTER_OTLP_TIMEOUT) {
            None => DEFAULT_TIMEOUT,
            Some(v) => v
                .trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| OtelError::InvalidTimeout {
                    setting: OTEL_EXPORTER_OTLP_TIMEOUT,
                    value: v.trim().to_owned(),
                })?,
        };
        if traces_endpoint.is_none() && metrics_endpoint.is_none() {
            return Ok(None);
        }
        Ok(Some(Self {
            traces_endpoint,
            metrics_endpoint,
            headers,
            protocol,
            service_name: get(OTEL_SERVICE_NAME)
                .map(|v| v.trim().to_owned())
                .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned()),
            timeout,
        }))
    }

    /// Sets how the bodies are encoded.
    pub fn with_protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// Sets the `service.name` resource attribute.
    pub fn with_service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = name.into();
        self
    }

    /// Sets how long one export request may take.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Adds a header sent with every export request (`value` as it is, not percent-encoded).
    /// Fails when `name` is not an HTTP header name or `value` holds a character outside
    /// visible ASCII, space and tab.
    pub fn with_header(mut self, name: &str, value: &str) -> Result<Self, OtelError> {
        let entry = self.headers.len() + 1;
        let setting = "a header of the OTLP configuration";
        let (name, value) = checked_header(setting, entry, name, value.to_owned())?;
        self.headers.push((name, value));
        Ok(self)
    }

    /// Where spans go (`None`: spans are not exported).
    pub fn traces_endpoint(&self) -> Option<&Url> {
        self.traces_endpoint.as_ref()
    }

    /// Where metrics go (`None`: metrics are not exported).
    pub fn metrics_endpoint(&self) -> Option<&Url> {
        self.metrics_endpoint.as_ref()
    }

    /// How the bodies are encoded.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The `service.name` resource attribute.
    pub fn service_name(&self) -> &str {
        &self.service_name
    }

    /// How long one export request may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The names of the headers sent (their values are not shown).
    pub fn header_names(&self) -> impl Iterator<Item = &str> {
        self.headers.iter().map(|(name, _)| name.as_str())
    }

    /// The headers with their values, for the exporters only.
    pub(crate) fn headers(&self) -> &[(String, String)] {
        &self.headers
    }
}

/// `value` as an export endpoint: an absolute `http` or `https` URL (the URL parser requires
/// their host).
fn parse_endpoint(setting: &'static str, value: &str) -> Result<Url, OtelError> {
    let url =
        Url::parse(value.trim()).map_err(|source| OtelError::EndpointNotUrl { setting, source })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(OtelError::EndpointScheme {
            setting,
            scheme: url.scheme().to_owned(),
        });
    }
    Ok(url)
}

/// `base` with `path` (`v1/traces`, `v1/metrics`) appended to its path.
fn signal_url(base: &Url, path: &str) -> Url {
    let mut url = base.clone();
    let joined = format!("{}/{path}", base.path().trim_end_matches('/'));
    url.set_path(&joined);
    url
}

/// The `name=value,name=value` list of `OTEL_EXPORTER_OTLP_HEADERS`: names and values
/// trimmed, values percent-decoded, empty entries skipped.
pub(crate) fn parse_headers(
    setting: &'static str,
    value: &str,
) -> Result<Vec<(String, String)>, OtelError> {
    let mut headers = Vec::new();
    for (index, entry) in value.split(',').enumerate() {
        let entry_no = index + 1;
        if entry.trim().is_empty() {
            continue;
        }
        let fail = |problem| OtelError::InvalidHeader {
            setting,
            entry: entry_no,
            problem,
        };
        let Some((name, raw)) = entry.split_once('=') else {
            return Err(fail(HeaderProblem::MissingEquals));
        };
        let name = checked_name(name.trim()).map_err(fail)?;
        let decoded = percent_decode(raw.trim()).map_err(|problem| {
            fail(match problem {
                DecodeProblem::BadEscape => {
                    HeaderProblem::BadPercentEncoding { name: name.clone() }
                }
                DecodeProblem::NotUtf8 => HeaderProblem::NotUtf8 { name: name.clone() },
            })
        })?;
        let value = checked_value(&name, decoded).map_err(fail)?;
        headers.push((name, value));
    }
    Ok(headers)
}

/// `name` and `value` when they can go in an HTTP request.
fn checked_header(
    setting: &'static str,
    entry: usize,
    name: &str,
    value: String,
) -> Result<(String, String), OtelError> {
    let fail = |problem| OtelError::InvalidHeader {
        setting,
        entry,
        problem,
    };
    let name = checked_name(name).map_err(fail)?;
    let value = checked_value(&name, value).map_err(fail)?;
    Ok((name, value))
}

/// `name` in lower case when it is an HTTP header name.
fn checked_name(name: &str) -> Result<String, HeaderProblem> {
    if name.is_empty() {
        return Err(HeaderProblem::EmptyName);
    }
    if !name.bytes().all(is_token_byte) {
        return Err(HeaderProblem::InvalidName);
    }
    Ok(name.to_ascii_lowercase())
}

/// `value` when it is not empty and holds only visible ASCII, spaces and tabs.
fn checked_value(name: &str, value: String) -> Result<String, HeaderProblem> {
    if value.is_empty() {
        return Err(HeaderProblem::EmptyValue {
            name: name.to_owned(),
        });
    }
    if !value.chars().all(|c| c == '\t' || (' '..='~').contains(&c)) {
        return Err(HeaderProblem::InvalidValue {
            name: name.to_owned(),
        });
    }
    Ok(value)
}

/// A byte of an HTTP token (a header name): letters, digits and ``!#$%&'*+-.^_`|~``.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Why a value did not percent-decode (before its header's name is known).
enum DecodeProblem {
    BadEscape,
    NotUtf8,
}

/// `value` with each `%XY` replaced by the byte it encodes.
fn percent_decode(value: &str) -> Result<String, DecodeProblem> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or(DecodeProblem::BadEscape)?;
            let high = hex_digit(hex[0]).ok_or(DecodeProblem::BadEscape)?;
            let low = hex_digit(hex[1]).ok_or(DecodeProblem::BadEscape)?;
            out.push(high << 4 | low);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| DecodeProblem::NotUtf8)
}

fn hex_digit(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}
