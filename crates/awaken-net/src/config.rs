//! [`OutboundConfig`]: what a guarded client may reach and how long and how much it reads.

use std::time::Duration;

use crate::hosts::HostAllowList;
use crate::range::IpRange;

/// Redirects followed at most unless configured otherwise.
pub const DEFAULT_MAX_REDIRECTS: usize = 5;
/// Most bytes of a response body read unless configured otherwise (10 MiB).
pub const DEFAULT_MAX_BODY_BYTES: u64 = 10 * 1024 * 1024;
/// How long connecting may take unless configured otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a whole request may take, redirects and body included, unless configured
/// otherwise.
pub const DEFAULT_TOTAL_TIMEOUT: Duration = Duration::from_secs(60);

/// The guard's settings. By default any host name is allowed, and every address outside the
/// refused ranges ([`crate::classify`]) is reached; nothing in a refused range is reached
/// unless an allowed range contains it.
#[derive(Debug, Clone)]
pub struct OutboundConfig {
    hosts: Option<HostAllowList>,
    allowed_ranges: Vec<IpRange>,
    max_redirects: usize,
    max_body_bytes: u64,
    connect_timeout: Duration,
    total_timeout: Duration,
    user_agent: Option<String>,
}

impl Default for OutboundConfig {
    fn default() -> Self {
        Self {
            hosts: None,
            allowed_ranges: Vec::new(),
            max_redirects: DEFAULT_MAX_REDIRECTS,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            total_timeout: DEFAULT_TOTAL_TIMEOUT,
            user_agent: None,
        }
    }
}

impl OutboundConfig {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only these hosts, checked on every URL before its addresses, redirects included.
    #[must_use]
    pub fn with_allowed_hosts(mut self, hosts: HostAllowList) -> Self {
        self.hosts = Some(hosts);
        self
    }

    /// Also reach addresses in `range`, although a refused range contains them.
    #[must_use]
    pub fn with_allowed_range(mut self, range: IpRange) -> Self {
        self.allowed_ranges.push(range);
        self
    }

    /// Also reach addresses in each of `ranges`.
    #[must_use]
    pub fn with_allowed_ranges(mut self, ranges: impl IntoIterator<Item = IpRange>) -> Self {
        self.allowed_ranges.extend(ranges);
        self
    }

    /// Follow at most `max` redirects (0: return the redirect response itself).
    #[must_use]
    pub fn with_max_redirects(mut self, max: usize) -> Self {
        self.max_redirects = max;
        self
    }

    /// Read at most `max` bytes of a body.
    #[must_use]
    pub fn with_max_body_bytes(mut self, max: u64) -> Self {
        self.max_body_bytes = max;
        self
    }

    /// Give up connecting after `timeout`.
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Give up on a request after `timeout`, counting every redirect and the body's reading.
    #[must_use]
    pub fn with_total_timeout(mut self, timeout: Duration) -> Self {
        self.total_timeout = timeout;
        self
    }

    /// Send this `User-Agent` (none by default).
    #[must_use]
    pub fn with_user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = Some(user_agent.into());
        self
    }

    /// The host list, if there is one.
    pub fn allowed_hosts(&self) -> Option<&HostAllowList> {
        self.hosts.as_ref()
    }

    /// The ranges reached although refused by default.
    pub fn allowed_ranges(&self) -> &[IpRange] {
        &self.allowed_ranges
    }

    /// Redirects followed at most.
    pub fn max_redirects(&self) -> usize {
        self.max_redirects
    }

    /// Most bytes of a body read.
    pub fn max_body_bytes(&self) -> u64 {
        self.max_body_bytes
    }

    /// How long connecting may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// How long a whole request may take.
    pub fn total_timeout(&self) -> Duration {
        self.total_timeout
    }

    /// The `User-Agent` sent, if any.
    pub fn user_agent(&self) -> Option<&str> {
        self.user_agent.as_deref()
    }
}
