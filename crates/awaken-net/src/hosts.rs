//! Host names: the [`HostAllowList`] a caller may put in front of the address rules, and the
//! host as a URL text wrote it (to tell a dotted-quad IPv4 address from other spellings).

/// Host names or IP addresses a client may reach; `*.example.com` allows the subdomains of
/// `example.com` (not `example.com` itself). Matching ignores case and a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAllowList {
    entries: Vec<String>,
}

/// An entry of a host list that is not a host name, an IP address or a `*.` pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "entry {index} ({entry:?}): expected a host name such as \"example.com\" or \"*.example.com\" (no scheme, port or path)"
)]
pub struct HostPatternError {
    /// The entry's position in the list, from 0.
    pub index: usize,
    /// The entry.
    pub entry: String,
}

impl HostAllowList {
    /// The list of `entries`; an entry with a scheme, a port, a path, user information or
    /// spaces is an error naming it.
    pub fn new<I, S>(entries: I) -> Result<Self, HostPatternError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let entries: Vec<String> = entries.into_iter().map(Into::into).collect();
        if let Some((index, entry)) = entries.iter().enumerate().find(|(_, h)| {
            h.trim().is_empty()
                || h.contains(['/', ' ', '@', '\\'])
                || (h.contains(':')
                    && h.trim_start_matches('[')
                        .trim_end_matches(']')
                        .parse::<std::net::Ipv6Addr>()
                        .is_err())
        }) {
            return Err(HostPatternError {
                index,
                entry: entry.clone(),
            });
        }
        Ok(Self { entries })
    }

    /// The entries as given.
    pub fn entries(&self) -> &[String] {
        &self.entries
    }

    /// Whether `host` (as a URL gives it; IPv6 in brackets) matches an entry: equal ignoring
    /// case and a trailing dot, or a subdomain of `suffix` for an entry `*.suffix`.
    pub fn allows(&self, host: &str) -> bool {
        let host = unbracket(host).trim_end_matches('.').to_ascii_lowercase();
        self.entries.iter().any(|entry| {
            let entry = unbracket(entry).trim_end_matches('.').to_ascii_lowercase();
            match entry.strip_prefix("*.") {
                Some(suffix) => host
                    .strip_suffix(suffix)
                    .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
                None => entry == host,
            }
        })
    }
}

fn unbracket(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The host as `input` (an absolute URL, or a reference such as a `Location` value) writes
/// it, before any decoding; `None` when the reference has no authority and keeps its base's
/// host. Follows the URL standard's splitting for http(s): tabs and newlines are dropped,
/// backslashes count as slashes, the host ends at the first `/`, `\`, `?` or `#`, after the
/// last `@` and before the port.
pub(crate) fn written_host(input: &str) -> Option<String> {
    let cleaned: String = input
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    let cleaned = cleaned.trim_matches(|c: char| c <= ' ');
    let rest = match scheme_end(cleaned) {
        Some(colon) => cleaned[colon + 1..].trim_start_matches(['/', '\\']),
        None => {
            let slashes = cleaned.len() - cleaned.trim_start_matches(['/', '\\']).len();
            if slashes < 2 {
                return None;
            }
            &cleaned[slashes..]
        }
    };
    let authority = rest.split(['/', '\\', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    let host = if host_port.starts_with('[') {
        host_port
            .find(']')
            .map_or(host_port, |end| &host_port[..=end])
    } else {
        host_port.split(':').next().unwrap_or_default()
    };
    Some(host.to_owned())
}

/// The index of the `:` ending a URL scheme at the start of `input`, if it has one.
fn scheme_end(input: &str) -> Option<usize> {
    let colon = input.find(':')?;
    let scheme = &input[..colon];
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(colon)
}
