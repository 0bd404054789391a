//! The chat page at `/`: a few static files compiled into the binary that talk to the `/v1`
//! API from the browser. The page itself needs no token (it holds no data); its API calls do.

use std::sync::LazyLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use crate::app::AgentServer;
use crate::error::ApiError;

/// Only the page's own files, scripts and API calls; no inline code, no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
    form-action 'self'; frame-ancestors 'none'";

/// One file of the page.
struct Asset {
    /// Its name under `/assets/` (`index.html` is served at `/`).
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const ASSETS: [Asset; 4] = [
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../assets/index.html"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../assets/app.js"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../assets/style.css"),
    },
    Asset {
        name: "icon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../assets/icon.svg"),
    },
];

/// Each asset's ETag: a quoted prefix of its content's SHA-256, in the order of [`ASSETS`].
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            let digest = Sha256::digest(a.body);
            let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
            format!("\"{hex}\"")
        })
        .collect()
});

/// `GET /` (the page) and `GET /assets/{name}` (its files).
pub(crate) fn routes() -> Router<AgentServer> {
    Router::new()
        .route("/", get(index))
        .route("/assets/{name}", get(asset))
}

async fn index(headers: HeaderMap) -> Response {
    serve_asset("index.html", &headers)
}

async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    serve_asset(&name, &headers)
}

/// The asset named `name` (304 when the client's copy is current), or 404 for an unknown one.
/// (With the page turned off, the router has none of these routes.)
fn serve_asset(name: &str, headers: &HeaderMap) -> Response {
    let Some(at) = ASSETS.iter().position(|a| a.name == name) else {
        return ApiError::not_found("not_found", "no such route").into_response();
    };
    let asset = &ASSETS[at];
    let etag = ETAGS[at].as_str();
    let current = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|tag| tag.trim() == etag));
    let mut response = if current {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, asset.content_type)], asset.body).into_response()
    };
    let out = response.headers_mut();
    if let Ok(tag) = HeaderValue::from_str(etag) {
        out.insert(header::ETAG, tag);
    }
    // Revalidated on each load: a new binary's page is never mixed with an old one's files.
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    out.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    out.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    out.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}
