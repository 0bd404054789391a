//! [`OutboundGuard`]: the checks every URL and every address goes through before a
//! connection is opened.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use url::{Host, Url};

use crate::config::OutboundConfig;
use crate::error::OutboundError;
use crate::hosts::written_host;
use crate::range::classify;
use crate::resolve::{Resolver, SystemResolver};

/// The checks, over one configuration and one resolver; cheap to clone.
///
/// A URL passes when its scheme is http or https, its host is on the host list (if the
/// configuration has one), an IPv4 literal is written as four decimal numbers, and every
/// address it names or resolves to is outside the refused ranges ([`crate::classify`]) or
/// inside an allowed range.
#[derive(Clone)]
pub struct OutboundGuard {
    config: Arc<OutboundConfig>,
    resolver: Arc<dyn Resolver>,
}

/// A URL that passed the guard with the addresses it may be reached at, for a caller that
/// opens the connection itself (and must use exactly these addresses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedTarget {
    /// The parsed URL.
    pub url: Url,
    /// Every address of the host (one for an IP literal), with the URL's port.
    pub addresses: Vec<SocketAddr>,
}

impl std::fmt::Debug for OutboundGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboundGuard")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl OutboundGuard {
    /// A guard resolving names with the system's resolver.
    pub fn new(config: OutboundConfig) -> Self {
        Self::with_resolver(config, Arc::new(SystemResolver))
    }

    /// A guard resolving names with `resolver`.
    pub fn with_resolver(config: OutboundConfig, resolver: Arc<dyn Resolver>) -> Self {
        Self {
            config: Arc::new(config),
            resolver,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &OutboundConfig {
        &self.config
    }

    /// Whether `address` may be reached for `host` (the host only names it in the error). An
    /// IPv4-mapped IPv6 address is allowed when an allowed range contains it or its IPv4
    /// address.
    pub fn check_address(&self, host: &str, address: IpAddr) -> Result<(), OutboundError> {
        let canonical = address.to_canonical();
        let allowed = self
            .config
            .allowed_ranges()
            .iter()
            .any(|r| r.contains(address) || r.contains(canonical));
        match classify(address) {
            Some(blocked) if !allowed => {
                tracing::debug!(%host, %address, %blocked, "outbound address refused");
                Err(OutboundError::Refused {
                    host: host.to_owned(),
                    address,
                    blocked,
                })
            }
            _ => Ok(()),
        }
    }

    /// Parses `url` and checks everything that needs no lookup: scheme, host list, spelling
    /// and address of an IP literal. A named host is checked when it is resolved.
    pub fn parse_url(&self, url: &str) -> Result<Url, OutboundError> {
        let parsed = Url::parse(url).map_err(|source| OutboundError::InvalidUrl {
            url: url.to_owned(),
            source,
        })?;
        self.check_url(url, &parsed)?;
        Ok(parsed)
    }

    /// Resolves `host` through the resolver and checks every address; the request is refused
    /// when any one is refused, so a mixed answer cannot steer the connection.
    pub async fn resolve_checked(&self, host: &str) -> Result<Vec<IpAddr>, OutboundError> {
        let addresses =
            self.resolver
                .resolve(host)
                .await
                .map_err(|source| OutboundError::Resolve {
                    host: host.to_owned(),
                    source: Arc::new(source),
                })?;
        if addresses.is_empty() {
            return Err(OutboundError::NoAddresses {
                host: host.to_owned(),
            });
        }
        for address in &addresses {
            self.check_address(host, *address)?;
        }
        Ok(addresses)
    }

    /// Parses and checks `url`, then resolves a named host and checks its addresses: the
    /// addresses a caller opening its own connection must use.
    pub async fn check(&self, url: &str) -> Result<CheckedTarget, OutboundError> {
        let parsed = self.parse_url(url)?;
        let port = parsed.port_or_known_default().unwrap_or(80);
        let addresses = match parsed.host() {
            Some(Host::Ipv4(v4)) => vec![IpAddr::V4(v4)],
            Some(Host::Ipv6(v6)) => vec![IpAddr::V6(v6)],
            Some(Host::Domain(name)) => self.resolve_checked(name).await?,
            None => {
                return Err(OutboundError::NoHost {
                    url: url.to_owned(),
                });
            }
        };
        Ok(CheckedTarget {
            addresses: addresses
                .into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect(),
            url: parsed,
        })
    }

    /// The checks of [`Self::parse_url`] on a URL already parsed from `written` (the text the
    /// URL or a redirect's `Location` came from, for the spelling check).
    pub(crate) fn check_url(&self, written: &str, url: &Url) -> Result<(), OutboundError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(OutboundError::Scheme {
                url: url.to_string(),
                scheme: url.scheme().to_owned(),
            });
        }
        let (Some(host), Some(host_text)) = (url.host(), url.host_str()) else {
            return Err(OutboundError::NoHost {
                url: url.to_string(),
            });
        };
        if let Some(list) = self.config.allowed_hosts()
            && !list.allows(host_text)
        {
            return Err(OutboundError::HostNotAllowed {
                host: host_text.to_owned(),
                allowed: list.entries().to_vec(),
            });
        }
        match host {
            Host::Ipv4(v4) => {
                self.check_address(host_text, IpAddr::V4(v4))?;
                match written_host(written) {
                    Some(w) if w != v4.to_string() => Err(OutboundError::AmbiguousHost {
                        written: w,
                        address: v4,
                    }),
                    _ => Ok(()),
                }
            }
            Host::Ipv6(v6) => self.check_address(host_text, IpAddr::V6(v6)),
            Host::Domain(_) => Ok(()),
        }
    }
}
