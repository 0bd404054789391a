//! Awaken's guard for outbound requests whose URL comes from a model or a remote document
//! (the command's `http_get`, protocol clients): an [`OutboundGuard`] checks a URL's scheme,
//! its host against an optional [`HostAllowList`], the spelling of an IPv4 literal, and every
//! address the host names or resolves to against the refused ranges ([`classify`]: loopback,
//! private, link-local and cloud metadata, CGNAT, documentation, multicast, their IPv6 forms
//! and the IPv4 addresses carried in IPv6), unless an allowed [`IpRange`] contains it.
//! [`OutboundClient`] is HTTP through it: the name is resolved once per connection by the
//! guard's [`Resolver`] and the connection goes to exactly the checked addresses, each
//! redirect is checked again, and bodies are capped and timed. Refusals are
//! [`OutboundError`]s naming the host, the address and the rule.
//!
//! This crate must never know agents, tools, state or the runtime: it gets a URL and a
//! configuration and answers with a response or a typed error.

mod client;
mod config;
mod error;
mod guard;
mod hosts;
mod range;
mod resolve;

#[cfg(test)]
mod tests;

pub use client::{BodyPrefix, OutboundClient, OutboundRequest, OutboundResponse};
pub use config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_REDIRECTS, DEFAULT_TOTAL_TIMEOUT,
    OutboundConfig,
};
pub use error::OutboundError;
pub use guard::{CheckedTarget, OutboundGuard};
pub use hosts::{HostAllowList, HostPatternError};
pub use range::{Blocked, Embedding, IpRange, RangeKind, RangeParseError, classify};
pub use resolve::{Resolver, StaticResolver, SystemResolver};

/// The HTTP types of the request and response API.
pub use reqwest::{Method, StatusCode, header};
/// The URL type.
pub use url::Url;
