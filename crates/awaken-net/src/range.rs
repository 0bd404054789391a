//! Address ranges: the `IpRange` (CIDR) type, the table of ranges refused by default and
//! [`classify`], which names the refused range an address falls in.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// A CIDR range of IPv4 or IPv6 addresses (`10.0.0.0/8`, `fd00::/8`); a bare address is the
/// range of that one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpRange {
    network: IpAddr,
    prefix: u8,
}

/// Why a text is not an [`IpRange`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RangeParseError {
    /// The part before the `/` is not an IP address.
    #[error("`{input}` is not an IP address or a CIDR range such as \"10.0.0.0/8\": {source}")]
    Address {
        /// The text.
        input: String,
        /// What the address parser said.
        source: std::net::AddrParseError,
    },
    /// The prefix length is not a number from 0 to the address's bit count.
    #[error("`{input}`: the prefix length must be a number from 0 to {max}")]
    Prefix {
        /// The text.
        input: String,
        /// 32 for IPv4, 128 for IPv6.
        max: u8,
    },
    /// Bits after the prefix are set, so the text does not say which range it means.
    #[error("`{input}` has bits set after its prefix; the range it falls in is {range}")]
    HostBits {
        /// The text.
        input: String,
        /// The range with those bits cleared.
        range: IpRange,
    },
}

impl IpRange {
    /// The range of `network/prefix`; bits after the prefix must be clear.
    pub fn new(network: IpAddr, prefix: u8) -> Result<Self, RangeParseError> {
        let range = Self::masked(network, prefix).ok_or_else(|| RangeParseError::Prefix {
            input: format!("{network}/{prefix}"),
            max: bits(network),
        })?;
        if range.network != network {
            return Err(RangeParseError::HostBits {
                input: format!("{network}/{prefix}"),
                range,
            });
        }
        Ok(range)
    }

    /// The range of the one address `address`.
    pub fn single(address: IpAddr) -> Self {
        Self {
            network: address,
            prefix: bits(address),
        }
    }

    /// The first address of the range.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The number of leading bits every address of the range shares with [`Self::network`].
    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// Whether `address` is in the range. An address of the other family never is (an
    /// IPv4-mapped IPv6 address is IPv6 here; the guard also checks its IPv4 form).
    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.network, address) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(a) & mask == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(a) & mask == u128::from(net)
            }
            _ => false,
        }
    }

    /// `address/prefix` with the bits after the prefix cleared; `None` for a prefix too long.
    fn masked(address: IpAddr, prefix: u8) -> Option<Self> {
        if prefix > bits(address) {
            return None;
        }
        let network = match address {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Some(Self { network, prefix })
    }

    const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Self {
        Self {
            network: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            prefix,
        }
    }

    const fn v6(segments: [u16; 8], prefix: u8) -> Self {
        let [a, b, c, d, e, f, g, h] = segments;
        Self {
            network: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
            prefix,
        }
    }
}

impl FromStr for IpRange {
    type Err = RangeParseError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let trimmed = input.trim();
        let (address, prefix) = match trimmed.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (trimmed, None),
        };
        let address: IpAddr = address.parse().map_err(|source| RangeParseError::Address {
            input: input.to_owned(),
            source,
        })?;
        let Some(prefix) = prefix else {
            return Ok(Self::single(address));
        };
        let max = bits(address);
        let prefix = prefix
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= max && prefix.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| RangeParseError::Prefix {
                input: input.to_owned(),
                max,
            })?;
        Self::new(address, prefix).map_err(|e| match e {
            RangeParseError::HostBits { range, .. } => RangeParseError::HostBits {
                input: input.to_owned(),
                range,
            },
            other => other,
        })
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// What a refused range is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RangeKind {
    /// `0.0.0.0`, `::`: connecting to it reaches the local host.
    Unspecified,
    /// `0.0.0.0/8`: "this network".
    ThisNetwork,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918: `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`.
    Private,
    /// `100.64.0.0/10`, carrier-grade NAT.
    SharedAddressSpace,
    /// `169.254.0.0/16`, `fe80::/10`.
    LinkLocal,
    /// An instance metadata or platform endpoint of a cloud provider (`169.254.169.254`,
    /// `fd00:ec2::254`, Alibaba's `100.100.100.200`, Azure's `168.63.129.16`).
    CloudMetadata,
    /// `192.0.0.0/24`, IETF protocol assignments.
    ProtocolAssignments,
    /// `192.0.2.0/24`, `198.51.100.0/24`, `203.0.113.0/24`, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// `198.18.0.0/15`, `2001:2::/48`.
    Benchmarking,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `240.0.0.0/4`, reserved for future use.
    Reserved,
    /// `fc00::/7`, unique-local IPv6.
    UniqueLocal,
    /// `fec0::/10`, the deprecated site-local IPv6 range.
    SiteLocal,
    /// `100::/64`, discard-only.
    Discard,
    /// `2001::/32`, Teredo tunnels (the client address inside is obscured).
    Teredo,
    /// `64:ff9b:1::/48`, NAT64 prefixes for local use.
    LocalNat64,
    /// `::/96`, the deprecated IPv4-compatible IPv6 form.
    Ipv4Compatible,
    /// Outside `2000::/3`, where IPv6 global unicast addresses are.
    NotGlobalUnicast,
}

impl fmt::Display for RangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RangeKind::Unspecified => "unspecified",
            RangeKind::ThisNetwork => "this network",
            RangeKind::Loopback => "loopback",
            RangeKind::Private => "private",
            RangeKind::SharedAddressSpace => "shared address space (carrier-grade NAT)",
            RangeKind::LinkLocal => "link-local",
            RangeKind::CloudMetadata => "cloud metadata endpoint",
            RangeKind::ProtocolAssignments => "IETF protocol assignments",
            RangeKind::Documentation => "documentation",
            RangeKind::Benchmarking => "benchmarking",
            RangeKind::Multicast => "multicast",
            RangeKind::Broadcast => "broadcast",
            RangeKind::Reserved => "reserved",
            RangeKind::UniqueLocal => "unique-local",
            RangeKind::SiteLocal => "site-local",
            RangeKind::Discard => "discard-only",
            RangeKind::Teredo => "Teredo",
            RangeKind::LocalNat64 => "local-use NAT64",
            RangeKind::Ipv4Compatible => "IPv4-compatible IPv6",
            RangeKind::NotGlobalUnicast => "outside IPv6 global unicast",
        })
    }
}

/// How an IPv6 address carries the IPv4 address it was refused for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Embedding {
    /// `::ffff:a.b.c.d`: a dual-stack socket connects to `a.b.c.d` itself.
    Ipv4Mapped,
    /// `::a.b.c.d` (deprecated).
    Ipv4Compatible,
    /// `64:ff9b::a.b.c.d`: a NAT64 gateway forwards to `a.b.c.d`.
    Nat64,
    /// `2002:aabb:ccdd::/48`: a 6to4 relay forwards to `a.b.c.d`.
    SixToFour,
}

impl fmt::Display for Embedding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Embedding::Ipv4Mapped => "IPv4-mapped",
            Embedding::Ipv4Compatible => "IPv4-compatible",
            Embedding::Nat64 => "NAT64",
            Embedding::SixToFour => "6to4",
        })
    }
}

/// The refused range an address falls in, and what it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Blocked {
    /// The range.
    pub range: IpRange,
    /// What the range is for.
    pub kind: RangeKind,
    /// Set when an IPv6 address is refused for the IPv4 address inside it: how it carries it
    /// (`range` is then an IPv4 range).
    pub via: Option<Embedding>,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.range, self.kind)?;
        if let Some(via) = self.via {
            write!(f, " inside its {via} IPv6 form")?;
        }
        Ok(())
    }
}

/// The IPv4 ranges refused by default, most specific first.
const V4: &[(IpRange, RangeKind)] = &[
    (IpRange::v4(0, 0, 0, 0, 32), RangeKind::Unspecified),
    (IpRange::v4(0, 0, 0, 0, 8), RangeKind::ThisNetwork),
    (IpRange::v4(10, 0, 0, 0, 8), RangeKind::Private),
    (
        IpRange::v4(100, 100, 100, 200, 32),
        RangeKind::CloudMetadata,
    ),
    (
        IpRange::v4(100, 64, 0, 0, 10),
        RangeKind::SharedAddressSpace,
    ),
    (IpRange::v4(127, 0, 0, 0, 8), RangeKind::Loopback),
    (IpRange::v4(168, 63, 129, 16, 32), RangeKind::CloudMetadata),
    (
        IpRange::v4(169, 254, 169, 254, 32),
        RangeKind::CloudMetadata,
    ),
    (IpRange::v4(169, 254, 0, 0, 16), RangeKind::LinkLocal),
    (IpRange::v4(172, 16, 0, 0, 12), RangeKind::Private),
    (
        IpRange::v4(192, 0, 0, 0, 24),
        RangeKind::ProtocolAssignments,
    ),
    (IpRange::v4(192, 0, 2, 0, 24), RangeKind::Documentation),
    (IpRange::v4(192, 168, 0, 0, 16), RangeKind::Private),
    (IpRange::v4(198, 18, 0, 0, 15), RangeKind::Benchmarking),
    (IpRange::v4(198, 51, 100, 0, 24), RangeKind::Documentation),
    (IpRange::v4(203, 0, 113, 0, 24), RangeKind::Documentation),
    (IpRange::v4(224, 0, 0, 0, 4), RangeKind::Multicast),
    (IpRange::v4(255, 255, 255, 255, 32), RangeKind::Broadcast),
    (IpRange::v4(240, 0, 0, 0, 4), RangeKind::Reserved),
];

/// The IPv6 ranges refused by default, most specific first; the forms that carry an IPv4
/// address and the rest outside `2000::/3` are handled in [`classify`].
const V6: &[(IpRange, RangeKind)] = &[
    (IpRange::v6([0; 8], 128), RangeKind::Unspecified),
    (
        IpRange::v6([0, 0, 0, 0, 0, 0, 0, 1], 128),
        RangeKind::Loopback,
    ),
    (
        IpRange::v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),
        RangeKind::LocalNat64,
    ),
    (
        IpRange::v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64),
        RangeKind::Discard,
    ),
    (
        IpRange::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32),
        RangeKind::Teredo,
    ),
    (
        IpRange::v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48),
        RangeKind::Benchmarking,
    ),
    (
        IpRange::v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
        RangeKind::Documentation,
    ),
    (
        IpRange::v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
        RangeKind::Documentation,
    ),
    (
        IpRange::v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128),
        RangeKind::CloudMetadata,
    ),
    (
        IpRange::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),
        RangeKind::UniqueLocal,
    ),
    (
        IpRange::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),
        RangeKind::LinkLocal,
    ),
    (
        IpRange::v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10),
        RangeKind::SiteLocal,
    ),
    (
        IpRange::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),
        RangeKind::Multicast,
    ),
];

const IPV4_COMPATIBLE: IpRange = IpRange::v6([0; 8], 96);
const NAT64: IpRange = IpRange::v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96);
const SIX_TO_FOUR: IpRange = IpRange::v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16);
const GLOBAL_UNICAST: IpRange = IpRange::v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

/// The refused range `address` falls in, or `None` for an address the guard lets through
/// without an explicit allowance. An IPv6 address carrying an IPv4 address (mapped, NAT64,
/// 6to4, the deprecated compatible form) is refused for the IPv4 address's range.
pub fn classify(address: IpAddr) -> Option<Blocked> {
    let v6 = match address {
        IpAddr::V4(v4) => return classify_v4(v4),
        IpAddr::V6(v6) => v6,
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return classify_v4(v4).map(|b| b.via(Embedding::Ipv4Mapped));
    }
    if let Some(&(range, kind)) = V6.iter().find(|(r, _)| r.contains(address)) {
        return Some(Blocked {
            range,
            kind,
            via: None,
        });
    }
    let bits = u128::from(v6);
    let low32 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    if IPV4_COMPATIBLE.contains(address) {
        return Some(
            classify_v4(low32)
                .map(|b| b.via(Embedding::Ipv4Compatible))
                .unwrap_or(Blocked {
                    range: IPV4_COMPATIBLE,
                    kind: RangeKind::Ipv4Compatible,
                    via: None,
                }),
        );
    }
    if NAT64.contains(address) {
        return classify_v4(low32).map(|b| b.via(Embedding::Nat64));
    }
    if SIX_TO_FOUR.contains(address) {
        let carried = Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32);
        return classify_v4(carried).map(|b| b.via(Embedding::SixToFour));
    }
    (!GLOBAL_UNICAST.contains(address)).then_some(Blocked {
        range: GLOBAL_UNICAST,
        kind: RangeKind::NotGlobalUnicast,
        via: None,
    })
}

fn classify_v4(address: Ipv4Addr) -> Option<Blocked> {
    V4.iter()
        .find(|(r, _)| r.contains(IpAddr::V4(address)))
        .map(|&(range, kind)| Blocked {
            range,
            kind,
            via: None,
        })
}

impl Blocked {
    fn via(self, via: Embedding) -> Self {
        Self {
            via: Some(via),
            ..self
        }
    }
}

fn bits(address: IpAddr) -> u8 {
    match address {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// Every range of the default tables, for the tests that check each entry's form.
#[cfg(test)]
pub(crate) fn table_ranges() -> impl Iterator<Item = IpRange> {
    V4.iter().chain(V6).map(|(r, _)| *r).chain([
        IPV4_COMPATIBLE,
        NAT64,
        SIX_TO_FOUR,
        GLOBAL_UNICAST,
    ])
}
