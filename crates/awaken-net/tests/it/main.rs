//! Integration tests of awaken-net: one binary, a module per feature. Every connection goes to
//! a loopback server, and every name is answered by a test resolver.

mod fetch;
mod refusals;
mod server;

use std::sync::Arc;
use std::time::Duration;

use awaken_net::{
    IpRange, OutboundClient, OutboundConfig, OutboundError, OutboundGuard, OutboundResponse,
    Resolver, StaticResolver,
};

/// A configuration allowing `ranges` (CIDR texts), with short limits for tests.
pub(crate) fn config(ranges: &[&str]) -> OutboundConfig {
    OutboundConfig::new()
        .with_allowed_ranges(
            ranges
                .iter()
                .map(|r| r.parse::<IpRange>().expect("a range")),
        )
        .with_connect_timeout(Duration::from_secs(5))
        .with_total_timeout(Duration::from_secs(20))
}

/// A client over `config`, resolving through `resolver`.
pub(crate) fn client(config: OutboundConfig, resolver: impl Resolver + 'static) -> OutboundClient {
    OutboundClient::new(OutboundGuard::with_resolver(config, Arc::new(resolver))).expect("a client")
}

/// A resolver answering only the names given, each with one address.
pub(crate) fn names(pairs: &[(&str, &str)]) -> StaticResolver {
    pairs.iter().fold(StaticResolver::new(), |r, (name, ip)| {
        r.with_host(name, [ip.parse().expect("an address")])
    })
}

/// A request's outcome as one line: the status, final path and body, or the error.
pub(crate) async fn render(result: Result<OutboundResponse, OutboundError>) -> String {
    match result {
        Ok(response) => {
            let status = response.status().as_u16();
            let path = response.url().path().to_owned();
            match response.bytes().await {
                Ok(body) => format!("{status} {path} {:?}", String::from_utf8_lossy(&body)),
                Err(e) => format!("{status} {path} body error: {e}"),
            }
        }
        Err(e) => format!("error: {e}"),
    }
}
