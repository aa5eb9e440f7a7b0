//! A minimal JSON GET over plain HTTP, for talking to a running collector's API.

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// The variable holding the bearer token sent to a collector that requires one (scope `read`).
pub const TOKEN_ENV: &str = "INFERTRACE_TOKEN";

/// GETs `url` and parses the body as JSON, with `Authorization: Bearer $INFERTRACE_TOKEN` when
/// that variable is set. Non-2xx answers are errors carrying the body (terminal-safe: it may be
/// a proxy's, or echo what a trace held).
pub async fn get_json(url: &str) -> anyhow::Result<serde_json::Value> {
    let uri: hyper::Uri = url
        .parse()
        .with_context(|| format!("'{url}' is not a valid URL"))?;
    let mut request = hyper::Request::get(uri);
    if let Some(token) = std::env::var(TOKEN_ENV)
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        request = request.header(
            hyper::header::AUTHORIZATION,
            format!("Bearer {}", token.trim()),
        );
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .with_context(|| format!("{TOKEN_ENV} is not a valid header value"))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let resp = tokio::time::timeout(std::time::Duration::from_secs(10), client.request(request))
        .await
        .with_context(|| format!("GET {url} timed out after 10s"))?
        .with_context(|| {
            format!("cannot reach {url}: is the collector running (infertrace collect)?")
        })?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .with_context(|| format!("reading {url}"))?
        .to_bytes();
    if status == hyper::StatusCode::UNAUTHORIZED || status == hyper::StatusCode::FORBIDDEN {
        bail!(
            "GET {url} answered {status}: the collector requires a token with the `read` scope: \
             set {TOKEN_ENV} ({})",
            crate::render::terminal_safe(String::from_utf8_lossy(&body).trim())
        );
    }
    if !status.is_success() {
        bail!(
            "GET {url} answered {status}: {}",
            crate::render::terminal_safe(String::from_utf8_lossy(&body).trim())
        );
    }
    serde_json::from_slice(&body).with_context(|| format!("GET {url} did not return JSON"))
}
