//! Shared helpers of the integration tests: in-memory telemetry, loopback servers, an HTTP
//! client, and span lookups.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use infertrace_tower::{BatchSettings, InferenceTraceLayer, SharedSpanProcessor};
use opentelemetry::trace::{SpanId, SpanKind};
use opentelemetry::{Key, Value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{
    InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor, SpanData,
};

/// Tracer and meter providers writing to memory.
pub struct Telemetry {
    pub spans: InMemorySpanExporter,
    pub tracer_provider: SdkTracerProvider,
    pub metrics: InMemoryMetricExporter,
    pub meter_provider: SdkMeterProvider,
    /// Set by [`Telemetry::direct`]: the processor the layer exports to directly.
    pub direct: Option<SharedSpanProcessor>,
}

impl Telemetry {
    pub fn new() -> Self {
        let spans = InMemorySpanExporter::default();
        let tracer_provider = SdkTracerProvider::builder()
            .with_simple_exporter(spans.clone())
            .build();
        let metrics = InMemoryMetricExporter::default();
        let meter_provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(metrics.clone()).build())
            .build();
        Self {
            spans,
            tracer_provider,
            metrics,
            meter_provider,
            direct: None,
        }
    }

    /// Like [`new`](Self::new), but the layer exports directly to the span processor the tracer
    /// provider uses (`with_span_processor`), so the handler's `tracing` spans and the layer's
    /// spans end up in the same exporter.
    pub fn direct() -> Self {
        Self::sharing(|spans, resource| {
            SharedSpanProcessor::new(SimpleSpanProcessor::new(spans), resource)
        })
    }

    /// Like [`direct`](Self::direct), with infertrace's batch processor
    /// (`SharedSpanProcessor::batch_with`, what `with_otlp` wires): each request is handed over
    /// whole and its spans built on the export thread, exported every 10 ms.
    pub fn handover() -> Self {
        Self::sharing(|spans, resource| {
            let settings = BatchSettings {
                max_queue_size: 4096,
                scheduled_delay: Duration::from_millis(10),
                max_export_batch_size: 512,
            };
            SharedSpanProcessor::batch_with(spans, resource, settings).expect("span export thread")
        })
    }

    /// A tracer provider and the layer sharing the processor `make` builds over the exporter.
    fn sharing(make: impl FnOnce(InMemorySpanExporter, &Resource) -> SharedSpanProcessor) -> Self {
        let spans = InMemorySpanExporter::default();
        let resource = Resource::builder().build();
        let processor = make(spans.clone(), &resource);
        let tracer_provider = SdkTracerProvider::builder()
            .with_span_processor(processor.clone())
            .with_resource(resource)
            .build();
        Self {
            spans,
            tracer_provider,
            direct: Some(processor),
            ..Self::new()
        }
    }

    /// A layer recording into these providers.
    pub fn layer(&self) -> InferenceTraceLayer {
        let layer = InferenceTraceLayer::new()
            .with_tracer_provider(&self.tracer_provider)
            .with_meter_provider(&self.meter_provider);
        match &self.direct {
            Some(processor) => layer.with_span_processor(processor.clone()),
            None => layer,
        }
    }

    /// Waits (up to 5 s) until `n` SERVER spans have ended, then returns every span.
    pub async fn wait_for_requests(&self, n: usize) -> Vec<SpanData> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let spans = self.spans.get_finished_spans().unwrap();
            let servers = spans
                .iter()
                .filter(|s| s.span_kind == SpanKind::Server)
                .count();
            if servers >= n {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "only {servers} of {n} request spans ended: {:#?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Flushes and returns the metrics.
    pub fn finished_metrics(&self) -> Vec<ResourceMetrics> {
        self.meter_provider.force_flush().unwrap();
        self.metrics.get_finished_metrics().unwrap()
    }
}

/// The request (SERVER) spans.
pub fn requests(spans: &[SpanData]) -> Vec<&SpanData> {
    spans
        .iter()
        .filter(|s| s.span_kind == SpanKind::Server)
        .collect()
}

/// The children of `parent` named `name`.
pub fn child<'a>(spans: &'a [SpanData], parent: &SpanData, name: &str) -> Option<&'a SpanData> {
    spans.iter().find(|s| {
        s.name == name
            && s.parent_span_id == parent.span_context.span_id()
            && s.span_context.trace_id() == parent.span_context.trace_id()
    })
}

pub fn children_names(spans: &[SpanData], parent: &SpanData) -> Vec<String> {
    let mut names: Vec<String> = spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_context.span_id())
        .map(|s| s.name.to_string())
        .collect();
    names.sort();
    names
}

pub fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == Key::new(key.to_owned()))
        .map(|kv| &kv.value)
}

pub fn attr_f64(span: &SpanData, key: &str) -> f64 {
    match attr(span, key) {
        Some(Value::F64(v)) => *v,
        other => panic!("{key} is not a double on {}: {other:?}", span.name),
    }
}

pub fn attr_i64(span: &SpanData, key: &str) -> i64 {
    match attr(span, key) {
        Some(Value::I64(v)) => *v,
        other => panic!("{key} is not an int on {}: {other:?}", span.name),
    }
}

pub fn attr_str(span: &SpanData, key: &str) -> String {
    match attr(span, key) {
        Some(Value::String(v)) => v.as_str().to_owned(),
        other => panic!("{key} is not a string on {}: {other:?}", span.name),
    }
}

/// A span's duration in seconds.
pub fn secs(span: &SpanData) -> f64 {
    span.end_time
        .duration_since(span.start_time)
        .unwrap_or_default()
        .as_secs_f64()
}

/// Seconds from `a` to `b` (negative if `b` is earlier).
pub fn between(a: SystemTime, b: SystemTime) -> f64 {
    match b.duration_since(a) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// Asserts `actual` is within `tol` seconds of `expected`.
#[track_caller]
pub fn assert_close(what: &str, actual: f64, expected: f64, tol: f64) {
    assert!(
        (actual - expected).abs() <= tol,
        "{what}: {actual:.6} s, expected {expected:.6} s ± {tol}"
    );
}

/// When the test knows an instant the layer marked: the clock read just before and just after
/// the call that made the mark (or, for a response chunk, when the body yielded it and when the
/// server polled the body again). Offsets in seconds from the request's arrival. A preempted
/// thread on a busy machine widens the bracket instead of breaking the test.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Bracket {
    /// Read before the mark.
    pub lo: f64,
    /// Read after the mark.
    pub hi: f64,
}

impl Bracket {
    /// Brackets whatever `mark` records: reads the clock (as seconds since `arrival`) before
    /// and after calling it.
    pub fn around(arrival: std::time::Instant, mark: impl FnOnce()) -> Bracket {
        let lo = arrival.elapsed().as_secs_f64();
        mark();
        Bracket {
            lo,
            hi: arrival.elapsed().as_secs_f64(),
        }
    }

    /// An instant known exactly (the request's arrival is 0).
    pub fn exact(at: f64) -> Bracket {
        Bracket { lo: at, hi: at }
    }
}

/// What the layer's clock may differ from `Instant` by: chunk instants are read from the CPU's
/// time-stamp counter and converted with the request's own (Instant, ticks) pairs, which are
/// read back to back.
pub const CLOCK_SLACK: f64 = 0.001;

/// Asserts a measured duration fits between two bracketed instants: at least `to.lo - from.hi`
/// and at most `to.hi - from.lo`, give or take [`CLOCK_SLACK`].
#[track_caller]
pub fn assert_between(what: &str, actual: f64, from: Bracket, to: Bracket) {
    let (min, max) = (to.lo - from.hi - CLOCK_SLACK, to.hi - from.lo + CLOCK_SLACK);
    assert!(
        (min..=max).contains(&actual),
        "{what}: {actual:.6} s, expected between {min:.6} and {max:.6} s ({from:?} to {to:?})"
    );
}

/// Serves an axum router on a loopback port.
#[cfg(feature = "axum")]
pub async fn serve_axum(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

/// An HTTP/1.1 client.
pub fn http1_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// An HTTP/2 (prior knowledge) client, as gRPC uses.
pub fn h2_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// POSTs `body` with `headers` and collects the response body.
pub async fn send(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (http::StatusCode, http::HeaderMap, Bytes) {
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .header("user-agent", "infertrace-test");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let response = http1_client()
        .request(req.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, body)
}

/// Checks the structural invariants every request trace must hold: phase spans are INTERNAL
/// children of the request span, inside it, in order, never negative.
#[track_caller]
pub fn assert_well_formed(spans: &[SpanData], request: &SpanData) {
    assert_eq!(request.span_kind, SpanKind::Server);
    let mut previous_end = request.start_time;
    for name in ["queue", "prefill", "decode", "inference"] {
        if let Some(p) = child(spans, request, name) {
            assert_eq!(p.span_kind, SpanKind::Internal, "{name}");
            assert_eq!(attr_str(p, "infer.phase"), name);
            assert!(p.start_time <= p.end_time, "{name} negative");
            assert!(
                p.start_time >= previous_end,
                "{name} starts before the previous phase ends"
            );
            assert!(
                p.end_time <= request.end_time,
                "{name} ends after the request"
            );
            previous_end = p.end_time;
        }
    }
    assert_ne!(request.span_context.span_id(), SpanId::INVALID);
}

/// One histogram data point: (attributes as strings, count, sum).
pub type Point = (Vec<(String, String)>, u64, f64);

/// The data points of histogram `name` (f64).
pub fn f64_histogram(metrics: &[ResourceMetrics], name: &str) -> Vec<Point> {
    let mut out = Vec::new();
    for rm in metrics {
        for sm in rm.scope_metrics() {
            for m in sm.metrics() {
                if m.name() != name {
                    continue;
                }
                if let AggregatedMetrics::F64(MetricData::Histogram(h)) = m.data() {
                    for dp in h.data_points() {
                        let attrs = dp
                            .attributes()
                            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                            .collect();
                        out.push((attrs, dp.count(), dp.sum()));
                    }
                }
            }
        }
    }
    out
}

/// The bucket bounds of histogram `name` (f64).
pub fn f64_histogram_bounds(metrics: &[ResourceMetrics], name: &str) -> Vec<f64> {
    for rm in metrics {
        for sm in rm.scope_metrics() {
            for m in sm.metrics() {
                if m.name() == name
                    && let AggregatedMetrics::F64(MetricData::Histogram(h)) = m.data()
                    && let Some(dp) = h.data_points().next()
                {
                    return dp.bounds().collect();
                }
            }
        }
    }
    Vec::new()
}

/// (token type, count, sum) of `infer.server.token.usage`.
pub fn token_usage(metrics: &[ResourceMetrics]) -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    for rm in metrics {
        for sm in rm.scope_metrics() {
            for m in sm.metrics() {
                if m.name() != "infer.server.token.usage" {
                    continue;
                }
                if let AggregatedMetrics::U64(MetricData::Histogram(h)) = m.data() {
                    for dp in h.data_points() {
                        let ty = dp
                            .attributes()
                            .find(|kv| kv.key.as_str() == "gen_ai.token.type")
                            .map(|kv| kv.value.to_string())
                            .unwrap_or_default();
                        out.push((ty, dp.count(), dp.sum()));
                    }
                }
            }
        }
    }
    out
}

/// The value of up-down counter `name` (summed over attribute sets).
pub fn i64_sum(metrics: &[ResourceMetrics], name: &str) -> Option<i64> {
    let mut found = None;
    for rm in metrics {
        for sm in rm.scope_metrics() {
            for m in sm.metrics() {
                if m.name() == name
                    && let AggregatedMetrics::I64(MetricData::Sum(s)) = m.data()
                {
                    found = Some(s.data_points().map(|d| d.value()).sum());
                }
            }
        }
    }
    found
}
