//! [`OutboundError`]: what a guarded request refused or where it failed, worded for the model
//! that asked for it.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use crate::range::Blocked;

/// Why a guarded request was refused or failed. Each variant names the URL or host and, for
/// a refusal, the address and the rule; `Display` is a sentence a tool can return as its error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboundError {
    /// The text is not a URL.
    #[error("`{url}` is not a URL: {source}")]
    InvalidUrl {
        /// The text.
        url: String,
        /// What the URL parser said.
        source: url::ParseError,
    },
    /// The URL's scheme is not `http` or `https`.
    #[error("`{url}` is not an http or https URL (scheme `{scheme}`)")]
    Scheme {
        /// The URL.
        url: String,
        /// Its scheme.
        scheme: String,
    },
    /// The URL has no host.
    #[error("`{url}` has no host")]
    NoHost {
        /// The URL.
        url: String,
    },
    /// The host is not on the configured host list.
    #[error("host `{host}` is not allowed (allowed: {})", allowed.join(", "))]
    HostNotAllowed {
        /// The host, as the URL parser normalised it.
        host: String,
        /// The list's entries.
        allowed: Vec<String>,
    },
    /// The host is an IPv4 address written in another form than four decimal numbers
    /// (`0x7f.1`, `2130706433`, `0177.0.0.1`, `127.1`, percent-encoded): parsers disagree on
    /// such spellings, so they are refused even for an address that would be allowed.
    #[error(
        "host `{written}` is an IPv4 address in a non-standard spelling (read as {address}); write it as {address}"
    )]
    AmbiguousHost {
        /// The host as the URL wrote it.
        written: String,
        /// The address the URL parser reads it as.
        address: Ipv4Addr,
    },
    /// The host is, or resolves to, an address in a refused range that no allowed range
    /// contains. For a name with several addresses, one refused address refuses them all.
    #[error(
        "refused {address} for host `{host}`: {blocked} is reached only when an allowed range contains it"
    )]
    Refused {
        /// The host, as the URL parser normalised it.
        host: String,
        /// The refused address.
        address: IpAddr,
        /// The range it is in and what that range is for.
        blocked: Blocked,
    },
    /// The resolver failed.
    #[error("cannot resolve `{host}`: {source}")]
    Resolve {
        /// The host name.
        host: String,
        /// The resolver's error.
        source: Arc<std::io::Error>,
    },
    /// The resolver answered no address.
    #[error("`{host}` resolves to no address")]
    NoAddresses {
        /// The host name.
        host: String,
    },
    /// A redirect's target was refused or could not be reached.
    #[error("redirected from {from}: {error}")]
    Redirect {
        /// The URL that redirected.
        from: String,
        /// Why its target failed.
        error: Box<OutboundError>,
    },
    /// A redirect's `Location` is not a URL.
    #[error("{url} redirects to `{location}`, which is not a URL: {source}")]
    InvalidRedirect {
        /// The URL that redirected.
        url: String,
        /// The `Location` value.
        location: String,
        /// What the URL parser said.
        source: url::ParseError,
    },
    /// More redirects than configured.
    #[error("{url} redirects again after {limit} redirects; stopped there")]
    TooManyRedirects {
        /// The URL whose redirect was not followed.
        url: String,
        /// The configured most.
        limit: usize,
    },
    /// The request, redirects and body included, took longer than the total timeout.
    #[error("{url} did not answer in full within {after:?}")]
    Timeout {
        /// The URL being fetched or read when time ran out.
        url: String,
        /// The total timeout.
        after: Duration,
    },
    /// The body is longer than the configured most; reading stopped there.
    #[error("the body of {url} is longer than {limit} bytes; reading stopped there")]
    BodyTooLarge {
        /// The URL.
        url: String,
        /// The configured most.
        limit: u64,
    },
    /// Connecting, sending or reading failed.
    #[error("request to {url} failed: {}", chain(source))]
    Request {
        /// The URL.
        url: String,
        /// The HTTP client's error.
        source: reqwest::Error,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {}", chain(source))]
    Client {
        /// The HTTP client's error.
        source: reqwest::Error,
    },
}

impl OutboundError {
    /// A copy of a refusal or resolution failure (what the connection's resolver raises, and
    /// the client takes back out of the HTTP client's error); `None` for other variants.
    pub(crate) fn copy_of_resolution(&self) -> Option<OutboundError> {
        Some(match self {
            OutboundError::Refused {
                host,
                address,
                blocked,
            } => OutboundError::Refused {
                host: host.clone(),
                address: *address,
                blocked: *blocked,
            },
            OutboundError::Resolve { host, source } => OutboundError::Resolve {
                host: host.clone(),
                source: Arc::clone(source),
            },
            OutboundError::NoAddresses { host } => {
                OutboundError::NoAddresses { host: host.clone() }
            }
            _ => return None,
        })
    }
}

/// An error and its sources, `: `-separated.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}
