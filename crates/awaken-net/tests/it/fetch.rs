//! Requests through the client against loopback servers: pinned resolution, redirects checked
//! hop by hop, the body cap and the total timeout.

use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use awaken_net::header::{AUTHORIZATION, HeaderValue};
use awaken_net::{Method, OutboundError, OutboundRequest, Resolver};
use expect_test::expect;
use tokio::sync::oneshot;

use crate::server::{Reply, Server, ok, redirect};
use crate::{client, config, names, render};

#[tokio::test]
async fn a_name_resolving_to_loopback_is_refused_unless_the_range_is_allowed() {
    let mut server = Server::start(vec![ok("hello from loopback")]).await;
    let url = format!("http://service.test:{}/hello", server.addr.port());
    let resolver = || names(&[("service.test", "127.0.0.1")]);

    let refused = client(config(&[]), resolver()).get(&url).await;
    assert!(
        matches!(&refused, Err(OutboundError::Refused { host, .. }) if host == "service.test"),
        "{refused:?}"
    );
    let allowed = client(config(&["127.0.0.0/8"]), resolver()).get(&url).await;
    let port = server.addr.port();
    assert_eq!(
        [render(refused).await, render(allowed).await].join("\n"),
        [
            "error: refused 127.0.0.1 for host `service.test`: 127.0.0.0/8 (loopback) is reached only when an allowed range contains it",
            "200 /hello \"hello from loopback\"",
        ]
        .join("\n")
    );
    // Only the allowed request reached the server, addressed to the name the test resolver
    // answered (system DNS knows no `service.test`).
    assert_eq!(
        server.received(),
        [format!("GET /hello HTTP/1.1 (host service.test:{port})")]
    );
}

#[tokio::test]
async fn each_redirect_is_checked_like_the_first_url() {
    let mut target = Server::start(vec![]).await;
    let port = target.addr.port();
    let mut server = Server::start(vec![
        redirect(302, "http://169.254.169.254/latest/meta-data/"),
        redirect(301, &format!("http://internal.test:{port}/")),
        redirect(307, &format!("http://[::1]:{port}/")),
        redirect(302, &format!("http://0x7f.1:{port}/")),
        redirect(302, "file:///etc/passwd"),
        redirect(302, "/next"),
        ok("arrived"),
    ])
    .await;
    let client = client(
        config(&["127.0.0.1/32"]),
        names(&[("internal.test", "10.0.0.5")]),
    );
    let mut lines = Vec::new();
    for _ in 0..6 {
        lines.push(render(client.get(&server.url("/start")).await).await);
    }
    let text = lines
        .join("\n")
        .replace(&server.addr.port().to_string(), "SERVER");
    expect![[r#"
        error: redirected from http://127.0.0.1:SERVER/start: refused 169.254.169.254 for host `169.254.169.254`: 169.254.169.254/32 (cloud metadata endpoint) is reached only when an allowed range contains it
        error: redirected from http://127.0.0.1:SERVER/start: refused 10.0.0.5 for host `internal.test`: 10.0.0.0/8 (private) is reached only when an allowed range contains it
        error: redirected from http://127.0.0.1:SERVER/start: refused ::1 for host `[::1]`: ::1/128 (loopback) is reached only when an allowed range contains it
        error: redirected from http://127.0.0.1:SERVER/start: host `0x7f.1` is an IPv4 address in a non-standard spelling (read as 127.0.0.1); write it as 127.0.0.1
        error: redirected from http://127.0.0.1:SERVER/start: `file:///etc/passwd` is not an http or https URL (scheme `file`)
        200 /next "arrived""#]]
    .assert_eq(&text);
    assert_eq!(server.received().len(), 7, "six starts and one /next");
    assert!(
        target.received().is_empty(),
        "no refused target was reached"
    );
}

#[tokio::test]
async fn redirects_stop_at_the_limit() {
    let server = Server::start(vec![
        redirect(302, "/a"),
        redirect(302, "/b"),
        redirect(302, "/c"),
        ok("too far"),
    ])
    .await;
    let client = client(config(&["127.0.0.1"]).with_max_redirects(2), names(&[]));
    let outcome = render(client.get(&server.url("/")).await).await;
    assert_eq!(
        outcome,
        format!(
            "error: http://{}/b redirects again after 2 redirects; stopped there",
            server.addr
        )
    );
}

#[tokio::test]
async fn redirects_change_method_and_drop_credentials_like_browsers() {
    let mut other = Server::start(vec![ok("other origin"), ok("same origin")]).await;
    let other_port = other.addr.port();
    let mut first = Server::start(vec![
        redirect(303, &format!("http://other.test:{other_port}/done")),
        redirect(307, &format!("http://127.0.0.1:{other_port}/kept")),
    ])
    .await;
    let client = client(
        config(&["127.0.0.1"]),
        names(&[("other.test", "127.0.0.1")]),
    );
    let post = || {
        OutboundRequest::new(Method::POST, first.url("/submit"))
            .with_header(AUTHORIZATION, HeaderValue::from_static("Bearer secret"))
            .with_body(b"{}".to_vec())
    };
    let to_other_origin = render(client.send(post()).await).await;
    let first_port = first.addr.port();
    assert_eq!(to_other_origin, "200 /done \"other origin\"");
    let kept = render(client.send(post()).await).await;
    assert_eq!(kept, "200 /kept \"same origin\"");
    assert_eq!(
        first.received(),
        [
            format!("POST /submit HTTP/1.1 (host 127.0.0.1:{first_port}, authorization)"),
            format!("POST /submit HTTP/1.1 (host 127.0.0.1:{first_port}, authorization)"),
        ]
    );
    // A 303 turns the POST into a GET; another origin loses the credentials. A 307 keeps the
    // method; a different port is another origin, so the credentials stay behind there too.
    assert_eq!(
        other.received(),
        [
            format!("GET /done HTTP/1.1 (host other.test:{other_port})"),
            format!("POST /kept HTTP/1.1 (host 127.0.0.1:{other_port})"),
        ]
    );
}

#[tokio::test]
async fn the_body_cap_stops_reading_with_a_typed_error() {
    let server = Server::start(vec![
        Reply::Endless,
        ok(&"y".repeat(200)),
        ok("0123456789abcdef"),
        ok("0123456789"),
    ])
    .await;
    let client = client(config(&["127.0.0.1"]).with_max_body_bytes(100), names(&[]));
    let url = server.url("/big");

    // A body without an end: reading stops at the cap.
    let endless = client.get(&url).await.expect("headers").bytes().await;
    assert!(
        matches!(
            &endless,
            Err(OutboundError::BodyTooLarge { limit: 100, .. })
        ),
        "{endless:?}"
    );
    // A declared length over the cap fails before reading.
    let declared = client.get(&url).await.expect("headers").bytes().await;
    assert!(
        matches!(
            &declared,
            Err(OutboundError::BodyTooLarge { limit: 100, .. })
        ),
        "{declared:?}"
    );
    let cut = client
        .get(&url)
        .await
        .expect("headers")
        .prefix(10)
        .await
        .expect("a prefix");
    assert_eq!(
        (cut.bytes.as_slice(), cut.truncated),
        (&b"0123456789"[..], true)
    );
    let whole = client
        .get(&url)
        .await
        .expect("headers")
        .prefix(10)
        .await
        .expect("a prefix");
    assert_eq!(
        (whole.bytes.as_slice(), whole.truncated),
        (&b"0123456789"[..], false)
    );
    assert_eq!(
        endless.map(|_| ()).map_err(|e| e.to_string()),
        Err(format!(
            "the body of http://{}/big is longer than 100 bytes; reading stopped there",
            server.addr
        ))
    );
}

#[tokio::test]
async fn the_total_timeout_ends_a_request_to_a_silent_server() {
    let (keep_silent, until) = oneshot::channel();
    let server = Server::start(vec![Reply::Silent(until)]).await;
    let client = client(
        config(&["127.0.0.1"]).with_total_timeout(Duration::from_millis(200)),
        names(&[]),
    );
    let outcome = client.get(&server.url("/slow")).await;
    assert!(
        matches!(&outcome, Err(OutboundError::Timeout { after, .. }) if *after == Duration::from_millis(200)),
        "{outcome:?}"
    );
    drop(keep_silent);
}

/// Answers 127.0.0.1 the first time and 10.9.9.9 after, counting the lookups.
#[derive(Clone, Default)]
struct Rebinding {
    lookups: Arc<AtomicUsize>,
    asked: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl Resolver for Rebinding {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        self.asked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(host.to_owned());
        let answer = match self.lookups.fetch_add(1, Ordering::SeqCst) {
            0 => "127.0.0.1",
            _ => "10.9.9.9",
        };
        Ok(vec![answer.parse().expect("an address")])
    }
}

#[tokio::test]
async fn a_name_is_resolved_once_per_connection_and_a_changed_answer_is_checked_again() {
    let mut server = Server::start(vec![ok("first"), ok("second")]).await;
    let rebinding = Rebinding::default();
    let client = client(config(&["127.0.0.0/8"]), rebinding.clone());
    let url = format!("http://rebind.test:{}/", server.addr.port());

    let first = render(client.get(&url).await).await;
    assert_eq!(first, "200 / \"first\"");
    assert_eq!(
        rebinding.lookups.load(Ordering::SeqCst),
        1,
        "one lookup, used to connect"
    );
    // The server closed the connection, so the next request resolves again, and the new
    // answer is checked before anything connects.
    let second = render(client.get(&url).await).await;
    assert_eq!(
        second,
        "error: refused 10.9.9.9 for host `rebind.test`: 10.0.0.0/8 (private) is reached only when an allowed range contains it"
    );
    assert_eq!(
        *rebinding.asked.lock().unwrap_or_else(|p| p.into_inner()),
        ["rebind.test", "rebind.test"]
    );
    assert_eq!(server.received().len(), 1);
}
