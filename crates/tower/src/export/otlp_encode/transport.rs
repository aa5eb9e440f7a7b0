//! [`EncodingClient`]: the HTTP client given to opentelemetry-otlp's HTTP span exporter, which
//! sends the layer's own encoded spans in that exporter's requests.
//!
//! The export thread stages the body it encoded ([`Staged`]) and then calls the exporter with
//! the batch's other spans (the handler's, from the tracer provider), possibly none. The
//! exporter encodes those, and for each attempt (it retries) calls this client, which sends
//! the staged body in their place (no other spans) or after them: protobuf concatenates
//! repeated fields, so the receiver decodes one `ExportTraceServiceRequest` holding both
//! `ResourceSpans`. Endpoint, headers, timeout, retries and the handling of the response stay
//! the exporter's own.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};

/// The body the export thread staged for the exporter's next request.
#[derive(Clone, Debug, Default)]
pub(crate) struct Staged(Arc<Mutex<Option<StagedBody>>>);

#[derive(Clone, Debug)]
struct StagedBody {
    body: Bytes,
    /// The exporter's own body has no span: send the staged one instead.
    replace: bool,
}

impl Staged {
    /// Stages `body` for the requests of the next export call; `replace`: the exporter is
    /// given no span of its own.
    pub(crate) fn set(&self, body: Bytes, replace: bool) {
        if let Ok(mut staged) = self.0.lock() {
            *staged = Some(StagedBody { body, replace });
        }
    }

    /// Unstages the body (the export call returned).
    pub(crate) fn clear(&self) {
        if let Ok(mut staged) = self.0.lock() {
            *staged = None;
        }
    }

    fn get(&self) -> Option<StagedBody> {
        self.0.lock().ok().and_then(|staged| staged.clone())
    }
}

/// opentelemetry-otlp's blocking reqwest client, sending what [`Staged`] holds.
#[derive(Debug)]
pub(crate) struct EncodingClient {
    inner: reqwest::blocking::Client,
    staged: Staged,
}

/// The client opentelemetry-otlp builds itself with only its `reqwest-blocking-client`
/// feature (blocking reqwest, `timeout`). Given to every HTTP exporter explicitly: when an
/// application's own dependencies turn on opentelemetry-otlp's `reqwest-client` or
/// `hyper-client` too, the exporter would otherwise pick that async client, which panics on the
/// export threads (no Tokio runtime there). Built on a thread of its own, as opentelemetry-otlp
/// does: the blocking client cannot be built inside an async runtime.
pub(crate) fn blocking_client(timeout: std::time::Duration) -> Option<reqwest::blocking::Client> {
    std::thread::Builder::new()
        .name("infertrace-http-client".into())
        .spawn(move || {
            reqwest::blocking::Client::builder()
                .timeout(timeout)
                .build()
        })
        .ok()?
        .join()
        .ok()?
        .ok()
}

impl EncodingClient {
    /// A [`blocking_client`] sending what `staged` holds.
    pub(crate) fn new(timeout: std::time::Duration, staged: Staged) -> Option<Self> {
        let inner = blocking_client(timeout)?;
        Some(Self { inner, staged })
    }
}

#[async_trait::async_trait]
impl HttpClient for EncodingClient {
    async fn send_bytes(&self, mut request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        if let Some(staged) = self.staged.get() {
            if request
                .headers()
                .contains_key(http::header::CONTENT_ENCODING)
            {
                // Compression is checked for before this client is used (`otlp::init`).
                return Err(
                    "OTLP compression is not supported with the layer's own encoding".into(),
                );
            }
            let body = if staged.replace {
                staged.body
            } else {
                let own = request.body();
                let mut both = Vec::with_capacity(own.len() + staged.body.len());
                both.extend_from_slice(own);
                both.extend_from_slice(&staged.body);
                Bytes::from(both)
            };
            *request.body_mut() = body;
        }
        self.inner.send_bytes(request).await
    }
}
