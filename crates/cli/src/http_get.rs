//! A minimal JSON GET over plain HTTP, for talking to a running collector's API.

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// GETs `url` and parses the body as JSON. Non-2xx answers are errors carrying the body.
pub async fn get_json(url: &str) -> anyhow::Result<serde_json::Value> {
    let uri: hyper::Uri = url
        .parse()
        .with_context(|| format!("'{url}' is not a valid URL"))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let resp = tokio::time::timeout(std::time::Duration::from_secs(10), client.get(uri))
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
    if !status.is_success() {
        bail!(
            "GET {url} answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        );
    }
    serde_json::from_slice(&body).with_context(|| format!("GET {url} did not return JSON"))
}
