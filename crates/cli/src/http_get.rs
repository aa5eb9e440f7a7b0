//! A minimal JSON GET client for a running collector's API, over `http://` or `https://`.

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use infertrace_collector::client_tls::{self, HttpsConnector, OptionNames, TlsClientConfig};

/// The variable holding the bearer token sent to a collector that requires one (scope `read`).
pub const TOKEN_ENV: &str = "INFERTRACE_TOKEN";

/// How long one GET may take, connection and TLS handshake included.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A client of one collector's API: TLS as given for an `https://` base URL (the server checked
/// against `tls.ca_file`, else the system's roots; a client certificate for mutual TLS), and
/// `Authorization: Bearer $INFERTRACE_TOKEN` on every request when that variable is set.
pub struct ApiClient {
    client: Client<HttpsConnector, Empty<Bytes>>,
    token: Option<String>,
}

impl ApiClient {
    /// A client for the API at `base`. TLS options with an `http://` URL are an error (they
    /// would silently not apply), as is an unreadable CA, certificate or key file.
    pub fn new(base: &str, tls: &TlsClientConfig) -> anyhow::Result<Self> {
        let https = base.starts_with("https://");
        if !https && !base.starts_with("http://") {
            bail!("'{base}' is not an http:// or https:// URL");
        }
        if !https && client_tls::is_set(tls) {
            bail!(
                "--ca-file, --cert-file and --key-file are for an https:// URL (a collector \
                 with api.tls); '{base}' is http://"
            );
        }
        let connector =
            client_tls::https_connector(HttpConnector::new(), tls, https, OptionNames::FLAGS)
                .map_err(|e| anyhow::anyhow!(e))?;
        let token = std::env::var(TOKEN_ENV)
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        Ok(Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
            token,
        })
    }

    /// GETs `url` and parses the body as JSON. Non-2xx answers are errors carrying the body
    /// (terminal-safe: it may be a proxy's, or echo what a trace held).
    pub async fn get_json(&self, url: &str) -> anyhow::Result<serde_json::Value> {
        let uri: hyper::Uri = url
            .parse()
            .with_context(|| format!("'{url}' is not a valid URL"))?;
        let mut request = hyper::Request::get(uri);
        if let Some(token) = &self.token {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .with_context(|| format!("{TOKEN_ENV} is not a valid header value"))?;
        let resp = tokio::time::timeout(TIMEOUT, self.client.request(request))
            .await
            .with_context(|| format!("GET {url} timed out after {}s", TIMEOUT.as_secs()))?
            .map_err(|e| {
                let e = anyhow::Error::new(e);
                let certificate = e.chain().any(|c| c.to_string().contains("certificate"));
                let ca_as_leaf = e
                    .chain()
                    .any(|c| c.to_string().contains("CaUsedAsEndEntity"));
                let hint = if ca_as_leaf {
                    "the API serves a CA certificate as its own (openssl req -x509 makes one by \
                     default), which TLS clients such as this one refuse: serve a certificate \
                     signed by that CA, or one made with -addext basicConstraints=critical,CA:FALSE"
                } else if certificate {
                    "its TLS certificate is not trusted here: give the CA that signed it with \
                     --ca-file (and --cert-file/--key-file when the API asks for a client \
                     certificate)"
                } else {
                    "is the collector running (infertrace collect), and does the scheme match \
                     its API (https:// when api.tls is set)?"
                };
                e.context(format!("cannot reach {url}: {hint}"))
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
                "GET {url} answered {status}: the collector requires a token with the `read` \
                 scope: set {TOKEN_ENV} ({})",
                crate::render::terminal_safe(String::from_utf8_lossy(&body).trim())
            );
        }
        if !status.is_success() {
            // The API's errors are `{"error": "…"}`: the sentence, not the JSON.
            let text = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).trim().to_owned());
            if text.is_empty() {
                bail!("GET {url} answered {status} (no body): is --url the collector's API?");
            }
            bail!(
                "GET {url} answered {status}: {}",
                crate::render::terminal_safe(&text)
            );
        }
        serde_json::from_slice(&body).with_context(|| format!("GET {url} did not return JSON"))
    }
}
