use std::net::IpAddr;

use expect_test::expect;

use crate::hosts::written_host;
use crate::range::table_ranges;
use crate::{HostAllowList, IpRange, classify};

/// Each address with the refused range it falls in, or `reached`.
fn render_classes(addresses: &[&str]) -> String {
    addresses
        .iter()
        .map(|a| {
            let ip: IpAddr = a.parse().expect("an address");
            match classify(ip) {
                Some(blocked) => format!("{a} -> {blocked}"),
                None => format!("{a} -> reached"),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_refused_ipv4_range_is_named_and_its_neighbours_are_reached() {
    expect![[r#"
        0.0.0.0 -> 0.0.0.0/32 (unspecified)
        0.1.2.3 -> 0.0.0.0/8 (this network)
        1.0.0.0 -> reached
        10.0.0.1 -> 10.0.0.0/8 (private)
        10.255.255.255 -> 10.0.0.0/8 (private)
        11.0.0.0 -> reached
        100.63.255.255 -> reached
        100.64.0.1 -> 100.64.0.0/10 (shared address space (carrier-grade NAT))
        100.100.100.200 -> 100.100.100.200/32 (cloud metadata endpoint)
        100.127.255.255 -> 100.64.0.0/10 (shared address space (carrier-grade NAT))
        100.128.0.0 -> reached
        127.0.0.1 -> 127.0.0.0/8 (loopback)
        127.255.255.254 -> 127.0.0.0/8 (loopback)
        128.0.0.0 -> reached
        168.63.129.16 -> 168.63.129.16/32 (cloud metadata endpoint)
        169.254.169.254 -> 169.254.169.254/32 (cloud metadata endpoint)
        169.254.0.1 -> 169.254.0.0/16 (link-local)
        169.255.0.0 -> reached
        172.15.255.255 -> reached
        172.16.0.1 -> 172.16.0.0/12 (private)
        172.31.255.255 -> 172.16.0.0/12 (private)
        172.32.0.0 -> reached
        192.0.0.8 -> 192.0.0.0/24 (IETF protocol assignments)
        192.0.2.1 -> 192.0.2.0/24 (documentation)
        192.88.99.1 -> reached
        192.168.1.1 -> 192.168.0.0/16 (private)
        198.18.0.1 -> 198.18.0.0/15 (benchmarking)
        198.19.255.255 -> 198.18.0.0/15 (benchmarking)
        198.20.0.0 -> reached
        198.51.100.7 -> 198.51.100.0/24 (documentation)
        203.0.113.9 -> 203.0.113.0/24 (documentation)
        224.0.0.1 -> 224.0.0.0/4 (multicast)
        239.255.255.255 -> 224.0.0.0/4 (multicast)
        240.0.0.1 -> 240.0.0.0/4 (reserved)
        255.255.255.255 -> 255.255.255.255/32 (broadcast)
        8.8.8.8 -> reached
        93.184.215.14 -> reached"#]]
    .assert_eq(&render_classes(&[
        "0.0.0.0",
        "0.1.2.3",
        "1.0.0.0",
        "10.0.0.1",
        "10.255.255.255",
        "11.0.0.0",
        "100.63.255.255",
        "100.64.0.1",
        "100.100.100.200",
        "100.127.255.255",
        "100.128.0.0",
        "127.0.0.1",
        "127.255.255.254",
        "128.0.0.0",
        "168.63.129.16",
        "169.254.169.254",
        "169.254.0.1",
        "169.255.0.0",
        "172.15.255.255",
        "172.16.0.1",
        "172.31.255.255",
        "172.32.0.0",
        "192.0.0.8",
        "192.0.2.1",
        "192.88.99.1",
        "192.168.1.1",
        "198.18.0.1",
        "198.19.255.255",
        "198.20.0.0",
        "198.51.100.7",
        "203.0.113.9",
        "224.0.0.1",
        "239.255.255.255",
        "240.0.0.1",
        "255.255.255.255",
        "8.8.8.8",
        "93.184.215.14",
    ]));
}

#[test]
fn every_refused_ipv6_range_and_each_ipv4_carrying_form_is_named() {
    expect![[r#"
        :: -> ::/128 (unspecified)
        ::1 -> ::1/128 (loopback)
        ::ffff:127.0.0.1 -> 127.0.0.0/8 (loopback) inside its IPv4-mapped IPv6 form
        ::ffff:169.254.169.254 -> 169.254.169.254/32 (cloud metadata endpoint) inside its IPv4-mapped IPv6 form
        ::ffff:10.1.2.3 -> 10.0.0.0/8 (private) inside its IPv4-mapped IPv6 form
        ::ffff:8.8.8.8 -> reached
        ::127.0.0.1 -> 127.0.0.0/8 (loopback) inside its IPv4-compatible IPv6 form
        ::8.8.8.8 -> ::/96 (IPv4-compatible IPv6)
        64:ff9b::127.0.0.1 -> 127.0.0.0/8 (loopback) inside its NAT64 IPv6 form
        64:ff9b::169.254.169.254 -> 169.254.169.254/32 (cloud metadata endpoint) inside its NAT64 IPv6 form
        64:ff9b::8.8.8.8 -> reached
        64:ff9b:1::1 -> 64:ff9b:1::/48 (local-use NAT64)
        2002:7f00:1::1 -> 127.0.0.0/8 (loopback) inside its 6to4 IPv6 form
        2002:c0a8:101::1 -> 192.168.0.0/16 (private) inside its 6to4 IPv6 form
        2002:808:808::1 -> reached
        100::1 -> 100::/64 (discard-only)
        2001::1 -> 2001::/32 (Teredo)
        2001:2::1 -> 2001:2::/48 (benchmarking)
        2001:db8::1 -> 2001:db8::/32 (documentation)
        3fff::1 -> 3fff::/20 (documentation)
        fd00:ec2::254 -> fd00:ec2::254/128 (cloud metadata endpoint)
        fd12:3456::1 -> fc00::/7 (unique-local)
        fc00::1 -> fc00::/7 (unique-local)
        fe80::1 -> fe80::/10 (link-local)
        febf:ffff::1 -> fe80::/10 (link-local)
        fec0::1 -> fec0::/10 (site-local)
        ff02::1 -> ff00::/8 (multicast)
        ::ffff:0:127.0.0.1 -> 2000::/3 (outside IPv6 global unicast)
        4000::1 -> 2000::/3 (outside IPv6 global unicast)
        2606:4700::1111 -> reached
        2a00:1450:4001::200e -> reached"#]]
    .assert_eq(&render_classes(&[
        "::",
        "::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "::ffff:10.1.2.3",
        "::ffff:8.8.8.8",
        "::127.0.0.1",
        "::8.8.8.8",
        "64:ff9b::127.0.0.1",
        "64:ff9b::169.254.169.254",
        "64:ff9b::8.8.8.8",
        "64:ff9b:1::1",
        "2002:7f00:1::1",
        "2002:c0a8:101::1",
        "2002:808:808::1",
        "100::1",
        "2001::1",
        "2001:2::1",
        "2001:db8::1",
        "3fff::1",
        "fd00:ec2::254",
        "fd12:3456::1",
        "fc00::1",
        "fe80::1",
        "febf:ffff::1",
        "fec0::1",
        "ff02::1",
        "::ffff:0:127.0.0.1",
        "4000::1",
        "2606:4700::1111",
        "2a00:1450:4001::200e",
    ]));
}

#[test]
fn the_default_tables_hold_only_well_formed_ranges() {
    for range in table_ranges() {
        let reparsed: IpRange = range
            .to_string()
            .parse()
            .unwrap_or_else(|e| panic!("{range} does not parse back: {e}"));
        assert_eq!(reparsed, range);
        assert!(range.contains(range.network()), "{range}");
    }
}

#[test]
fn ranges_parse_with_or_without_a_prefix_and_bad_ones_say_why() {
    let render = |input: &str| match input.parse::<IpRange>() {
        Ok(r) => format!("{input:?} -> {r}"),
        Err(e) => format!("{input:?} -> error: {e}"),
    };
    let inputs = [
        "10.0.0.0/8",
        " 127.0.0.1 ",
        "::1",
        "fd00::/8",
        "0.0.0.0/0",
        "10.0.0.1/8",
        "10.0.0.0/33",
        "10.0.0.0/+8",
        "10.0.0.0/",
        "fd00::/129",
        "localhost",
        "0x7f.1/8",
    ];
    expect![[r#"
        "10.0.0.0/8" -> 10.0.0.0/8
        " 127.0.0.1 " -> 127.0.0.1/32
        "::1" -> ::1/128
        "fd00::/8" -> fd00::/8
        "0.0.0.0/0" -> 0.0.0.0/0
        "10.0.0.1/8" -> error: `10.0.0.1/8` has bits set after its prefix; the range it falls in is 10.0.0.0/8
        "10.0.0.0/33" -> error: `10.0.0.0/33`: the prefix length must be a number from 0 to 32
        "10.0.0.0/+8" -> error: `10.0.0.0/+8`: the prefix length must be a number from 0 to 32
        "10.0.0.0/" -> error: `10.0.0.0/`: the prefix length must be a number from 0 to 32
        "fd00::/129" -> error: `fd00::/129`: the prefix length must be a number from 0 to 128
        "localhost" -> error: `localhost` is not an IP address or a CIDR range such as "10.0.0.0/8": invalid IP address syntax
        "0x7f.1/8" -> error: `0x7f.1/8` is not an IP address or a CIDR range such as "10.0.0.0/8": invalid IP address syntax"#]]
    .assert_eq(&inputs.map(render).join("\n"));
}

#[test]
fn a_range_contains_exactly_its_addresses_and_never_the_other_family() {
    let range = |s: &str| s.parse::<IpRange>().expect("a range");
    let ip = |s: &str| s.parse::<IpAddr>().expect("an address");
    assert!(range("10.0.0.0/8").contains(ip("10.255.0.1")));
    assert!(!range("10.0.0.0/8").contains(ip("11.0.0.0")));
    assert!(!range("10.0.0.0/8").contains(ip("::ffff:10.0.0.1")));
    assert!(range("0.0.0.0/0").contains(ip("203.0.113.1")));
    assert!(!range("0.0.0.0/0").contains(ip("::1")));
    assert!(range("127.0.0.1").contains(ip("127.0.0.1")));
    assert!(!range("127.0.0.1").contains(ip("127.0.0.2")));
    assert!(range("fd00::/8").contains(ip("fd00:ec2::254")));
    assert!(!range("fd00::/8").contains(ip("fc00::1")));
    assert!(range("::/0").contains(ip("2001:db8::1")));
}

#[test]
fn allowed_hosts_match_exactly_or_as_subdomains() {
    let list = HostAllowList::new(["127.0.0.1", "*.example.com", "::1", "Docs.Example.org."])
        .expect("valid");
    let allowed = |h: &str| list.allows(h);
    assert!(allowed("127.0.0.1"));
    assert!(allowed("api.example.com"));
    assert!(allowed("A.B.Example.COM."));
    assert!(allowed("[::1]"));
    assert!(allowed("docs.example.org"));
    assert!(!allowed("example.com"));
    assert!(!allowed("evilexample.com"));
    assert!(!allowed("127.0.0.2"));
    assert!(!allowed("localhost"));
    for bad in [
        "",
        "http://example.com",
        "example.com:8080",
        "a b",
        "u@example.com",
        "a\\b",
    ] {
        let err = HostAllowList::new(["fine.example", bad]).expect_err(bad);
        assert_eq!((err.index, err.entry.as_str()), (1, bad));
    }
}

#[test]
fn the_written_host_is_taken_as_the_url_standard_splits_it() {
    let cases = [
        "http://0x7f.1/",
        "http://user:pw@2130706433:8080/x",
        "HTTP://0177.0.0.1",
        "http:\\\\127.1\\x",
        "http:127.0.0.1/x",
        "https://[::ffff:127.0.0.1]:443/",
        "http://12\t7.0.0.1/",
        "http://a@b@127.0.0.1/",
        "//127.0.0.1./path",
        "\\\\host\\path",
        "/just/a/path",
        "relative?x=//evil",
        "http://example.com?q#f",
    ];
    expect![[r#"
        "http://0x7f.1/" -> Some("0x7f.1")
        "http://user:pw@2130706433:8080/x" -> Some("2130706433")
        "HTTP://0177.0.0.1" -> Some("0177.0.0.1")
        "http:\\\\127.1\\x" -> Some("127.1")
        "http:127.0.0.1/x" -> Some("127.0.0.1")
        "https://[::ffff:127.0.0.1]:443/" -> Some("[::ffff:127.0.0.1]")
        "http://12\t7.0.0.1/" -> Some("127.0.0.1")
        "http://a@b@127.0.0.1/" -> Some("127.0.0.1")
        "//127.0.0.1./path" -> Some("127.0.0.1.")
        "\\\\host\\path" -> Some("host")
        "/just/a/path" -> None
        "relative?x=//evil" -> None
        "http://example.com?q#f" -> Some("example.com")"#]]
    .assert_eq(
        &cases
            .map(|c| format!("{c:?} -> {:?}", written_host(c)))
            .join("\n"),
    );
}
