//! Name resolution behind the guard: the [`Resolver`] trait, the system's resolver and a
//! fixed table for tests and for hosts pinned by configuration.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;

use async_trait::async_trait;

/// Turns a host name into addresses. The guard calls it once for each connection it opens to
/// a named host (never for an IP literal), checks every address it returns, and connects only
/// to those; it is never asked again for the same connection.
#[async_trait]
pub trait Resolver: Send + Sync {
    /// The addresses of `host` (lower case, as the URL parser normalised it). An `Err` ends the
    /// request with `OutboundError::Resolve`; an empty list with `OutboundError::NoAddresses`.
    /// May run concurrently for different requests.
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>>;
}

/// The operating system's resolver (`getaddrinfo` through tokio).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait]
impl Resolver for SystemResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        let found = tokio::net::lookup_host((host, 0)).await?;
        Ok(found.map(|a| a.ip()).collect())
    }
}

/// A fixed table of answers: each name resolves to the addresses given for it, any other name
/// fails with `NotFound`. No lookup leaves the process.
#[derive(Debug, Clone, Default)]
pub struct StaticResolver {
    hosts: HashMap<String, Vec<IpAddr>>,
}

impl StaticResolver {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The table with `host` answering `addresses` (in that order; an empty list is an empty
    /// answer). Names are matched ignoring case and a trailing dot.
    pub fn with_host(mut self, host: &str, addresses: impl IntoIterator<Item = IpAddr>) -> Self {
        self.hosts
            .insert(normalise(host), addresses.into_iter().collect());
        self
    }
}

#[async_trait]
impl Resolver for StaticResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        self.hosts.get(&normalise(host)).cloned().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("`{host}` is not in the resolver's table"),
            )
        })
    }
}

fn normalise(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}
