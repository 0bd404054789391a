//! The exporters' HTTP client: the workspace's reqwest (rustls), its requests run on the
//! export's own runtime. The SDK's batch processor and periodic reader call an exporter from
//! their own threads, with no Tokio runtime there; an async client needs one, so each request
//! is spawned onto a one-worker runtime that lives as long as the export.

use async_trait::async_trait;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// Sends the exporters' requests with `client` on `runtime`.
#[derive(Debug, Clone)]
pub(crate) struct ExportClient {
    pub(crate) client: reqwest::Client,
    pub(crate) runtime: tokio::runtime::Handle,
}

#[async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let url = request.url().clone();
            let response = client.execute(request).await.inspect_err(|e| {
                // The error names the URL and what failed, never a header.
                tracing::warn!(target: "awaken_otel", error = %e, "OTLP export request failed");
            })?;
            let status = response.status();
            if !status.is_success() {
                // The body is not shown: a collector may echo what it was sent.
                tracing::warn!(
                    target: "awaken_otel",
                    %url,
                    status = status.as_u16(),
                    "OTLP receiver refused an export"
                );
            }
            let headers = response.headers().clone();
            let body = response.bytes().await?;
            let mut answer = Response::builder().status(status).body(body)?;
            *answer.headers_mut() = headers;
            Ok::<_, HttpError>(answer)
        });
        sent.await?
    }
}
