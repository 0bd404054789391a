//! A chat-completions server on 127.0.0.1 that answers every request 429 (rate limited),
//! keeping the `Authorization` header of each request.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;

/// The running server (it stops with the test's runtime).
pub struct RateLimited {
    /// `http://127.0.0.1:<port>/v1`.
    pub base_url: String,
    authorizations: Arc<Mutex<Vec<String>>>,
}

impl RateLimited {
    pub async fn start() -> RateLimited {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("bound address");
        let authorizations: Arc<Mutex<Vec<String>>> = Arc::default();
        let app = Router::new()
            .route("/v1/chat/completions", post(limited))
            .with_state(authorizations.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        RateLimited {
            base_url: format!("http://{addr}/v1"),
            authorizations,
        }
    }

    /// The `Authorization` header of each request, in order.
    pub fn authorizations(&self) -> Vec<String> {
        self.authorizations.lock().expect("authorizations").clone()
    }
}

async fn limited(
    State(seen): State<Arc<Mutex<Vec<String>>>>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    seen.lock().expect("authorizations").push(authorization);
    (
        StatusCode::TOO_MANY_REQUESTS,
        [("content-type", "application/json")],
        r#"{"error":{"message":"slow down","type":"rate_limit_exceeded"}}"#,
    )
}
