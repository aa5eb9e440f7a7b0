//! `forward:` — the forwarder's section (see [`crate::forward`] for what it does with it).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::check::{Invalid, Problems, check_headers, check_http_url};
use crate::client_tls::{OptionNames, TlsClientConfig};
use crate::duration::human_duration;

/// `forward:` — OTLP traces on to Jaeger, Tempo or another collector.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ForwardConfig {
    /// Downstream base URL, `http://` or `https://`, e.g. `http://127.0.0.1:4317` (gRPC) or
    /// `https://tempo.example.com:4318` (HTTP; `/v1/traces` is appended). Unset = no forwarding.
    pub endpoint: Option<String>,
    /// TLS of an `https://` endpoint: system roots by default, or a CA file; optional client
    /// certificate (mutual TLS).
    pub tls: TlsClientConfig,
    /// Headers sent with every export (gRPC metadata or HTTP headers), e.g.
    /// `x-api-key: ${TEMPO_API_KEY}` for a hosted Tempo: `${NAME}` is replaced by the
    /// environment variable `NAME` when the config is checked or the collector starts.
    /// Default none.
    pub headers: BTreeMap<String, String>,
    /// `grpc` or `http` (OTLP/HTTP protobuf). Default `grpc`.
    pub protocol: ForwardProtocol,
    /// Export requests waiting to be sent. When full, new requests are refused with a
    /// retryable answer (HTTP 429, gRPC `UNAVAILABLE`; counted as
    /// `dropped_spans_total{reason="forward_backpressure"}`; past `limits.soft_limit_percent` of it
    /// a sender holding its share of the places is refused as `forward_share`), never accepted
    /// and then dropped.
    /// Default 1024.
    pub queue_size: usize,
    /// Most spans per forwarded request (received requests are merged up to this). Default 8192.
    pub max_batch_spans: usize,
    /// Most bytes per forwarded request: a larger batch, or one larger request, is sent in parts
    /// of at most this size (split between resources, scopes or spans; a span larger than this
    /// goes alone). Below the downstream's message limit — 4 MiB by default in grpc-go and tonic
    /// (Jaeger, Tempo, the OpenTelemetry Collector), which refuse a larger one whole.
    /// Default 3 MiB (3145728).
    pub max_batch_bytes: usize,
    /// Longest a request waits for others to merge with. Default 200ms.
    #[serde(with = "human_duration")]
    pub max_batch_delay: Duration,
    /// Timeout of one export attempt (connecting included): a downstream that accepts
    /// connections and never answers costs this per attempt. Default 10s.
    #[serde(with = "human_duration")]
    pub timeout: Duration,
    /// Export requests sent (or being retried) at the same time. Default 4.
    pub max_in_flight: usize,
    /// Retry with exponential backoff and jitter on retryable failures.
    pub retry: RetryConfig,
    /// Check every field of a protobuf request's spans, resources and scopes as a prost-based
    /// downstream reads them (strings UTF-8, wire types, nesting), and reject a span that fails
    /// rather than let it make the downstream refuse the whole batch. Costs about as much as
    /// decoding again (docs/PERFORMANCE.md). Default true; off only for senders that are
    /// trusted to send valid OTLP.
    pub verify_spans: bool,
}

impl Default for ForwardConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            tls: TlsClientConfig::default(),
            headers: BTreeMap::new(),
            protocol: ForwardProtocol::Grpc,
            queue_size: 1024,
            verify_spans: true,
            max_batch_spans: 8192,
            max_batch_bytes: 3 << 20,
            max_batch_delay: Duration::from_millis(200),
            timeout: Duration::from_secs(10),
            max_in_flight: 4,
            retry: RetryConfig::default(),
        }
    }
}

/// Checks that an `https://` (or not) `url` can be used with `tls`, building the TLS
/// configuration (reading the files) as the collector will.
pub(super) fn check_tls(
    tls: &TlsClientConfig,
    url: &str,
    path: &[&'static str],
    names: OptionNames,
) -> Result<(), Invalid> {
    if url.starts_with("https://") {
        crate::client_tls::rustls_config(tls, names).map_err(|m| Invalid::new(path, m))?;
    } else if crate::client_tls::is_set(tls) {
        return Err(Invalid::new(
            path,
            format!("TLS files are set but {url:?} is not https://: use https:// or remove them"),
        ));
    }
    Ok(())
}

/// Forwarding protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForwardProtocol {
    /// OTLP/gRPC.
    Grpc,
    /// OTLP/HTTP with protobuf bodies.
    Http,
}

/// `forward.retry:` — exponential backoff with jitter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// First wait. Default 100ms.
    #[serde(with = "human_duration")]
    pub initial_backoff: Duration,
    /// Longest wait between tries (each wait doubles; each is drawn between half and all of
    /// it). Default 5s.
    #[serde(with = "human_duration")]
    pub max_backoff: Duration,
    /// Give up on spans this long after they ARRIVED (time in the queue included), counting
    /// them as `exported_spans_total{outcome="failed"}` and
    /// `dropped_spans_total{reason="forward_failed"}`. Default 60s.
    #[serde(with = "human_duration")]
    pub max_elapsed: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_elapsed: Duration::from_secs(60),
        }
    }
}

impl ForwardConfig {
    /// Checks the section, adding every problem (called by
    /// [`CollectorConfig::validate`](super::CollectorConfig::validate)).
    pub(super) fn check(&self, p: &mut Problems) {
        if let Some(url) = &self.endpoint {
            if p.check(
                check_http_url(url, "forward.headers")
                    .map_err(|m| Invalid::new(&["forward", "endpoint"], m)),
            ) {
                p.check(check_tls(
                    &self.tls,
                    url,
                    &["forward", "tls"],
                    OptionNames::FORWARD,
                ));
            }
        } else if crate::client_tls::is_set(&self.tls) {
            p.add(
                &["forward", "tls"],
                "set without forward.endpoint: set the endpoint or remove forward.tls",
            );
        }
        p.check(check_headers(&self.headers, &["forward", "headers"]));
        for (key, n) in [
            ("queue_size", self.queue_size),
            ("max_batch_spans", self.max_batch_spans),
            ("max_batch_bytes", self.max_batch_bytes),
            ("max_in_flight", self.max_in_flight),
        ] {
            if n == 0 {
                p.add(&["forward", key], "must be > 0");
            }
        }
        if self.timeout.is_zero() {
            p.add(&["forward", "timeout"], "must be a positive duration");
        }
        let r = &self.retry;
        if r.initial_backoff.is_zero() {
            p.add(
                &["forward", "retry", "initial_backoff"],
                "must be a positive duration",
            );
        }
        if r.max_backoff < r.initial_backoff {
            p.add(
                &["forward", "retry", "max_backoff"],
                "must be at least forward.retry.initial_backoff",
            );
        }
        if r.max_elapsed.is_zero() {
            p.add(
                &["forward", "retry", "max_elapsed"],
                "must be a positive duration",
            );
        }
    }
}
