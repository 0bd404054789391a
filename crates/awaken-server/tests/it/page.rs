//! The chat page at `/`: its files with their content types and security headers, revalidation
//! by ETag, 404 for an unknown file or a page turned off, and no token needed for the page while
//! the API behind it still needs one.

use expect_test::expect;
use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap};

use crate::support::*;

/// A response's status and the headers the page's files are served with, one per line.
fn describe(path: &str, status: StatusCode, headers: &HeaderMap) -> String {
    let get = |name: header::HeaderName| {
        headers
            .get(&name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    format!(
        "{path} {}\n  content-type: {}\n  cache-control: {}\n  x-content-type-options: {}\n  content-security-policy: {}\n",
        status.as_u16(),
        get(header::CONTENT_TYPE),
        get(header::CACHE_CONTROL),
        get(header::X_CONTENT_TYPE_OPTIONS),
        get(header::CONTENT_SECURITY_POLICY),
    )
}

/// The `/assets/…` paths the page's HTML refers to, in order.
fn asset_paths(html: &str) -> Vec<String> {
    html.split("\"/assets/")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(|name| format!("/assets/{name}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_and_its_files_are_served_without_the_token_the_api_needs() {
    let rig = Rig::memory(Vec::new());
    let server = TestServer::start(rig.runtime(), config().with_auth_token("s3cret")).await;

    let page = server.get("/").await;
    let mut shown = describe("/", page.status(), page.headers());
    let etag = page
        .headers()
        .get(header::ETAG)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .expect("the page has an ETag");
    let html = page.text().await.expect("the page's body");
    assert!(html.starts_with("<!doctype html>"), "{html}");
    let assets = asset_paths(&html);
    assert_eq!(
        assets,
        ["/assets/icon.svg", "/assets/style.css", "/assets/app.js"]
    );
    for path in &assets {
        let file = server.get(path).await;
        shown.push_str(&describe(path, file.status(), file.headers()));
        assert!(file.headers().contains_key(header::ETAG), "{path}");
        let body = file.bytes().await.expect("the file's body");
        assert!(!body.is_empty(), "{path} is empty");
    }
    for path in ["/assets/nope.js", "/assets/", "/assets/index.html/x"] {
        let missing = server.get(path).await;
        shown.push_str(&format!("{path} {}\n", missing.status().as_u16()));
    }
    expect![[r#"
        / 200
          content-type: text/html; charset=utf-8
          cache-control: no-cache
          x-content-type-options: nosniff
          content-security-policy: default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'
        /assets/icon.svg 200
          content-type: image/svg+xml
          cache-control: no-cache
          x-content-type-options: nosniff
          content-security-policy: default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'
        /assets/style.css 200
          content-type: text/css; charset=utf-8
          cache-control: no-cache
          x-content-type-options: nosniff
          content-security-policy: default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'
        /assets/app.js 200
          content-type: text/javascript; charset=utf-8
          cache-control: no-cache
          x-content-type-options: nosniff
          content-security-policy: default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'
        /assets/nope.js 404
        /assets/ 404
        /assets/index.html/x 404
    "#]]
    .assert_eq(&shown);

    // A copy the client holds is revalidated, not sent again.
    let again = server
        .client
        .get(server.url("/"))
        .header(header::IF_NONE_MATCH, &etag)
        .send()
        .await
        .expect("request");
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(
        again
            .headers()
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok()),
        Some(etag.as_str())
    );
    let stale = server
        .client
        .get(server.url("/"))
        .header(header::IF_NONE_MATCH, "\"an-old-copy\"")
        .send()
        .await
        .expect("request");
    assert_eq!(stale.status(), StatusCode::OK);

    // The API the page calls still needs the token.
    assert_eq!(
        server.get("/v1/agents").await.status(),
        StatusCode::UNAUTHORIZED
    );
    let agents = server
        .client
        .get(server.url("/v1/agents"))
        .bearer_auth("s3cret")
        .send()
        .await
        .expect("request");
    assert_eq!(agents.status(), StatusCode::OK);
    // The page takes only GET.
    let posted = server
        .client
        .post(server.url("/"))
        .send()
        .await
        .expect("request");
    assert_eq!(posted.status(), StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_the_page_turned_off_serves_none_of_it() {
    let rig = Rig::memory(Vec::new());
    let server = TestServer::start(rig.runtime(), config().with_chat_page(false)).await;
    for path in ["/", "/assets/app.js", "/assets/style.css"] {
        assert_eq!(
            server.get(path).await.status(),
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    assert_eq!(server.get("/v1/agents").await.status(), StatusCode::OK);
}
