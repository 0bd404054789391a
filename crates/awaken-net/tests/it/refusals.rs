//! What the guard refuses before any connection: URL forms, IP literals in every spelling,
//! and names whose answers hold a refused address.

use std::sync::Arc;

use awaken_net::{
    OutboundConfig, OutboundError, OutboundGuard, RangeKind, Resolver, StaticResolver,
};
use expect_test::expect;

use crate::{config, names};

/// Each URL's verdict: the addresses it may be reached at, or the error.
async fn verdicts(guard: &OutboundGuard, urls: &[&str]) -> String {
    let mut lines = Vec::new();
    for url in urls {
        let line = match guard.check(url).await {
            Ok(target) => format!(
                "{url} -> reached at {}",
                target
                    .addresses
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Err(e) => format!("{url} -> {e}"),
        };
        lines.push(line);
    }
    lines.join("\n")
}

fn guard(config: OutboundConfig, resolver: impl Resolver + 'static) -> OutboundGuard {
    OutboundGuard::with_resolver(config, Arc::new(resolver))
}

#[tokio::test]
async fn ip_literals_in_every_spelling_are_recognised_before_any_check() {
    let guard = guard(config(&[]), StaticResolver::new());
    expect![[r#"
        http://127.0.0.1/ -> refused 127.0.0.1 for host `127.0.0.1`: 127.0.0.0/8 (loopback) is reached only when an allowed range contains it
        http://[::1]:8080/ -> refused ::1 for host `[::1]`: ::1/128 (loopback) is reached only when an allowed range contains it
        http://[::ffff:127.0.0.1]/ -> refused ::ffff:127.0.0.1 for host `[::ffff:7f00:1]`: 127.0.0.0/8 (loopback) inside its IPv4-mapped IPv6 form is reached only when an allowed range contains it
        http://[0:0:0:0:0:ffff:7f00:1]/ -> refused ::ffff:127.0.0.1 for host `[::ffff:7f00:1]`: 127.0.0.0/8 (loopback) inside its IPv4-mapped IPv6 form is reached only when an allowed range contains it
        http://[::127.0.0.1]/ -> refused ::7f00:1 for host `[::7f00:1]`: 127.0.0.0/8 (loopback) inside its IPv4-compatible IPv6 form is reached only when an allowed range contains it
        http://2130706433/ -> refused 127.0.0.1 for host `127.0.0.1`: 127.0.0.0/8 (loopback) is reached only when an allowed range contains it
        http://0177.0.0.1/ -> refused 127.0.0.1 for host `127.0.0.1`: 127.0.0.0/8 (loopback) is reached only when an allowed range contains it
        http://0x7f.1/ -> refused 127.0.0.1 for host `127.0.0.1`: 127.0.0.0/8 (loopback) is reached only when an allowed range contains it
        http://127.1/ -> refused 127.0.0.1 for host `127.0.0.1`: 127.0.0.0/8 (loopback) is reached only when an allowed range contains it
        http://0x7F000001/ -> refused 127.0.0.1 for host `127.0.0.1`: 127.0.0.0/8 (loopback) is reached only when an allowed range contains it
        http://%31%32%37.0.0.1/ -> refused 127.0.0.1 for host `127.0.0.1`: 127.0.0.0/8 (loopback) is reached only when an allowed range contains it
        http://127.0.0.1./ -> refused 127.0.0.1 for host `127.0.0.1`: 127.0.0.0/8 (loopback) is reached only when an allowed range contains it
        http://0/ -> refused 0.0.0.0 for host `0.0.0.0`: 0.0.0.0/32 (unspecified) is reached only when an allowed range contains it
        http://[::]/ -> refused :: for host `[::]`: ::/128 (unspecified) is reached only when an allowed range contains it
        http://169.254.169.254/latest/meta-data/ -> refused 169.254.169.254 for host `169.254.169.254`: 169.254.169.254/32 (cloud metadata endpoint) is reached only when an allowed range contains it
        http://0xa9.0xfe.0xa9.0xfe/ -> refused 169.254.169.254 for host `169.254.169.254`: 169.254.169.254/32 (cloud metadata endpoint) is reached only when an allowed range contains it
        http://[fd00:ec2::254]/ -> refused fd00:ec2::254 for host `[fd00:ec2::254]`: fd00:ec2::254/128 (cloud metadata endpoint) is reached only when an allowed range contains it
        http://[64:ff9b::a9fe:a9fe]/ -> refused 64:ff9b::a9fe:a9fe for host `[64:ff9b::a9fe:a9fe]`: 169.254.169.254/32 (cloud metadata endpoint) inside its NAT64 IPv6 form is reached only when an allowed range contains it
        https://10.1.2.3/ -> refused 10.1.2.3 for host `10.1.2.3`: 10.0.0.0/8 (private) is reached only when an allowed range contains it
        http://100.64.0.1/ -> refused 100.64.0.1 for host `100.64.0.1`: 100.64.0.0/10 (shared address space (carrier-grade NAT)) is reached only when an allowed range contains it
        http://[fe80::1]/ -> refused fe80::1 for host `[fe80::1]`: fe80::/10 (link-local) is reached only when an allowed range contains it
        http://[fe80::1%25eth0]/ -> `http://[fe80::1%25eth0]/` is not a URL: invalid IPv6 address
        http://1.2.3.4.5/ -> `http://1.2.3.4.5/` is not a URL: invalid IPv4 address
        http://08.0.0.1/ -> `http://08.0.0.1/` is not a URL: invalid IPv4 address
        http://0x8.8.8.8/ -> host `0x8.8.8.8` is an IPv4 address in a non-standard spelling (read as 8.8.8.8); write it as 8.8.8.8
        http://8.8.8.8/ -> reached at 8.8.8.8:80
        https://[2606:4700::1111]/ -> reached at [2606:4700::1111]:443
        file:///etc/passwd -> `file:///etc/passwd` is not an http or https URL (scheme `file`)
        gopher://127.0.0.1/ -> `gopher://127.0.0.1/` is not an http or https URL (scheme `gopher`)
        not a url -> `not a url` is not a URL: relative URL without a base"#]]
    .assert_eq(
        &verdicts(
            &guard,
            &[
                "http://127.0.0.1/",
                "http://[::1]:8080/",
                "http://[::ffff:127.0.0.1]/",
                "http://[0:0:0:0:0:ffff:7f00:1]/",
                "http://[::127.0.0.1]/",
                "http://2130706433/",
                "http://0177.0.0.1/",
                "http://0x7f.1/",
                "http://127.1/",
                "http://0x7F000001/",
                "http://%31%32%37.0.0.1/",
                "http://127.0.0.1./",
                "http://0/",
                "http://[::]/",
                "http://169.254.169.254/latest/meta-data/",
                "http://0xa9.0xfe.0xa9.0xfe/",
                "http://[fd00:ec2::254]/",
                "http://[64:ff9b::a9fe:a9fe]/",
                "https://10.1.2.3/",
                "http://100.64.0.1/",
                "http://[fe80::1]/",
                "http://[fe80::1%25eth0]/",
                "http://1.2.3.4.5/",
                "http://08.0.0.1/",
                "http://0x8.8.8.8/",
                "http://8.8.8.8/",
                "https://[2606:4700::1111]/",
                "file:///etc/passwd",
                "gopher://127.0.0.1/",
                "not a url",
            ],
        )
        .await,
    );
}

#[tokio::test]
async fn an_allowed_range_lets_its_addresses_through_but_not_other_spellings_of_them() {
    let guard = guard(
        config(&["127.0.0.0/8", "fd00:ec2::254"]),
        StaticResolver::new(),
    );
    expect![[r#"
        http://127.0.0.1:9/ -> reached at 127.0.0.1:9
        http://[::ffff:127.0.0.1]:9/ -> reached at [::ffff:127.0.0.1]:9
        http://[fd00:ec2::254]/ -> reached at [fd00:ec2::254]:80
        http://127.1:9/ -> host `127.1` is an IPv4 address in a non-standard spelling (read as 127.0.0.1); write it as 127.0.0.1
        http://2130706433/ -> host `2130706433` is an IPv4 address in a non-standard spelling (read as 127.0.0.1); write it as 127.0.0.1
        http://[::1]/ -> refused ::1 for host `[::1]`: ::1/128 (loopback) is reached only when an allowed range contains it
        http://[::127.0.0.1]/ -> refused ::7f00:1 for host `[::7f00:1]`: 127.0.0.0/8 (loopback) inside its IPv4-compatible IPv6 form is reached only when an allowed range contains it
        http://169.254.169.254/ -> refused 169.254.169.254 for host `169.254.169.254`: 169.254.169.254/32 (cloud metadata endpoint) is reached only when an allowed range contains it"#]]
    .assert_eq(
        &verdicts(
            &guard,
            &[
                "http://127.0.0.1:9/",
                "http://[::ffff:127.0.0.1]:9/",
                "http://[fd00:ec2::254]/",
                "http://127.1:9/",
                "http://2130706433/",
                "http://[::1]/",
                "http://[::127.0.0.1]/",
                "http://169.254.169.254/",
            ],
        )
        .await,
    );
}

#[tokio::test]
async fn names_are_checked_by_every_address_they_resolve_to() {
    let resolver = names(&[
        ("intranet.test", "10.0.0.7"),
        ("metadata.google.internal", "169.254.169.254"),
        ("six.test", "::ffff:192.168.0.1"),
        ("public.test", "93.184.215.14"),
    ])
    .with_host(
        "mixed.test",
        ["93.184.215.14", "10.0.0.1"].map(|a| a.parse().expect("an address")),
    )
    .with_host("empty.test", []);
    let guard = guard(config(&[]), resolver);
    expect![[r#"
        http://intranet.test/ -> refused 10.0.0.7 for host `intranet.test`: 10.0.0.0/8 (private) is reached only when an allowed range contains it
        http://metadata.google.internal/computeMetadata/v1/ -> refused 169.254.169.254 for host `metadata.google.internal`: 169.254.169.254/32 (cloud metadata endpoint) is reached only when an allowed range contains it
        http://six.test/ -> refused ::ffff:192.168.0.1 for host `six.test`: 192.168.0.0/16 (private) inside its IPv4-mapped IPv6 form is reached only when an allowed range contains it
        http://mixed.test/ -> refused 10.0.0.1 for host `mixed.test`: 10.0.0.0/8 (private) is reached only when an allowed range contains it
        http://public.test:8443/ -> reached at 93.184.215.14:8443
        http://empty.test/ -> `empty.test` resolves to no address
        http://unknown.test/ -> cannot resolve `unknown.test`: `unknown.test` is not in the resolver's table"#]]
    .assert_eq(
        &verdicts(
            &guard,
            &[
                "http://intranet.test/",
                "http://metadata.google.internal/computeMetadata/v1/",
                "http://six.test/",
                "http://mixed.test/",
                "http://public.test:8443/",
                "http://empty.test/",
                "http://unknown.test/",
            ],
        )
        .await,
    );
    // The refusal is typed: host, address and rule are fields.
    match guard.check("http://mixed.test/").await {
        Err(OutboundError::Refused {
            host,
            address,
            blocked,
        }) => {
            assert_eq!(host, "mixed.test");
            assert_eq!(address.to_string(), "10.0.0.1");
            assert_eq!(blocked.kind, RangeKind::Private);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn the_host_list_comes_first_and_every_url_still_passes_the_address_rules() {
    let hosts = awaken_net::HostAllowList::new(["*.corp.test", "127.0.0.1"]).expect("valid");
    let guard = guard(
        config(&[]).with_allowed_hosts(hosts),
        names(&[("wiki.corp.test", "10.1.1.1"), ("evil.test", "127.0.0.1")]),
    );
    expect![[r#"
        http://evil.test/ -> host `evil.test` is not allowed (allowed: *.corp.test, 127.0.0.1)
        http://wiki.corp.test/ -> refused 10.1.1.1 for host `wiki.corp.test`: 10.0.0.0/8 (private) is reached only when an allowed range contains it
        http://127.0.0.1/ -> refused 127.0.0.1 for host `127.0.0.1`: 127.0.0.0/8 (loopback) is reached only when an allowed range contains it"#]]
    .assert_eq(
        &verdicts(
            &guard,
            &[
                "http://evil.test/",
                "http://wiki.corp.test/",
                "http://127.0.0.1/",
            ],
        )
        .await,
    );
}
