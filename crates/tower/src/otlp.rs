//! Tracer and meter providers exporting OTLP over gRPC or HTTP/protobuf, configured from code
//! and the standard environment variables.
//!
//! | setting | code ([`OtlpConfig`]) | environment (used when code leaves it unset) |
//! |---|---|---|
//! | endpoint | `endpoint` (base URL) | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `_METRICS_ENDPOINT` (full URL), `OTEL_EXPORTER_OTLP_ENDPOINT` (base) |
//! | protocol | `protocol` | `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, `OTEL_EXPORTER_OTLP_PROTOCOL` (`grpc`, `http/protobuf`); default `http/protobuf`, as the OTLP exporter specification says |
//! | service name | `service_name` | `OTEL_SERVICE_NAME`, then `service.name` in `OTEL_RESOURCE_ATTRIBUTES` |
//! | resource | `resource_attributes` (added) | `OTEL_RESOURCE_ATTRIBUTES` |
//! | sampler | `sampler` | `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`; default `parentbased_always_on` |
//! | metrics on/off | `metrics` | `OTEL_METRICS_EXPORTER=none` turns them off (the infertrace collector takes traces only) |
//!
//! Spans go through infertrace's batch processor ([`SharedSpanProcessor::batch`]: the SDK's
//! batching and `OTEL_BSP_*` variables; a layer hands it whole requests), metrics through a
//! periodic reader
//! (`OTEL_METRIC_EXPORT_INTERVAL`, default 60 s). The gRPC exporter needs a Tokio runtime:
//! call [`init`] from inside one. [`OtlpProviders::shutdown`] flushes both.
//!
//! [`InferenceTraceLayer::with_otlp`](crate::InferenceTraceLayer::with_otlp) wires a layer to
//! what [`init`] built: the layer exports its spans straight to the batch processor of
//! [`OtlpProviders::span_processor`], with the provider's sampler and resource (the direct path,
//! see [`with_span_processor`](crate::InferenceTraceLayer::with_span_processor)), and records its
//! metrics into the meter provider; the handler's own spans go through the tracer provider to the
//! same processor. A layer given only the tracer provider
//! ([`with_tracer_provider`](crate::InferenceTraceLayer::with_tracer_provider)) or using the
//! global one (after [`OtlpProviders::install_global`]) goes through the tracer: the same spans,
//! at a higher cost per request.
//!
//! With HTTP/protobuf (the default) and no compression, the batch processor's export thread
//! encodes the requests a layer hands it straight to OTLP protobuf, without building the
//! SDK's `SpanData` and opentelemetry-otlp's prost messages for them, and sends them through
//! the exporter itself (its endpoint, headers, timeout and retries), together with the
//! handler's own spans of the same batch: the same spans, bytes and all, for a fraction of
//! the CPU time. gRPC, and HTTP with `OTEL_EXPORTER_OTLP_(TRACES_)COMPRESSION` set, export
//! every span through opentelemetry-otlp's own encoding.
//!
//! ```no_run
//! # async fn run() -> Result<(), infertrace_tower::otlp::OtlpError> {
//! use infertrace_tower::otlp::{self, OtlpConfig};
//! let providers = otlp::init(OtlpConfig::grpc("http://127.0.0.1:4317").service_name("demo"))?;
//! providers.install_global(); // for `tracing-opentelemetry` and other instrumentation
//! let layer = infertrace_tower::InferenceTraceLayer::new().with_otlp(&providers); // the direct path
//! // … serve with `layer` …
//! providers.shutdown()?;
//! # Ok(()) }
//! ```

use opentelemetry::KeyValue;
use opentelemetry_otlp::{MetricExporter, SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{SdkTracerProvider, ShouldSample};

/// The SDK's sampler, for [`OtlpConfig::sampler`] (no direct `opentelemetry_sdk` dependency
/// needed).
pub use opentelemetry_sdk::trace::Sampler;

use crate::SharedSpanProcessor;
use crate::export::BatchSettings;
use crate::export::otlp_encode::{EncodingClient, OtlpRequests, Staged, blocking_client};

/// OTLP transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (default port 4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (default port 4318).
    HttpProtobuf,
}

impl OtlpProtocol {
    /// Parses an `OTEL_EXPORTER_OTLP_PROTOCOL` value.
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim() {
            "grpc" => Some(Self::Grpc),
            "http/protobuf" => Some(Self::HttpProtobuf),
            _ => None,
        }
    }
}

/// What [`init`] builds. Every `None` falls back to the environment (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct OtlpConfig {
    /// Base endpoint, e.g. `http://127.0.0.1:4317` (gRPC) or `http://127.0.0.1:4318` (HTTP; the
    /// `/v1/traces` and `/v1/metrics` paths are appended).
    pub endpoint: Option<String>,
    /// Transport.
    pub protocol: Option<OtlpProtocol>,
    /// `service.name` of the resource.
    pub service_name: Option<String>,
    /// Extra resource attributes.
    pub resource_attributes: Vec<KeyValue>,
    /// Sampler; when unset the SDK reads `OTEL_TRACES_SAMPLER(_ARG)`, default parent-based
    /// always-on.
    pub sampler: Option<Sampler>,
    /// Whether to build the meter provider too (default `true`).
    pub metrics: Option<bool>,
}

impl OtlpConfig {
    /// Everything from the environment.
    pub fn from_env() -> Self {
        Self::default()
    }

    /// OTLP/gRPC to `endpoint`, e.g. `http://127.0.0.1:4317`.
    pub fn grpc(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: Some(endpoint.into()),
            protocol: Some(OtlpProtocol::Grpc),
            ..Self::default()
        }
    }

    /// OTLP/HTTP protobuf to the base `endpoint`, e.g. `http://127.0.0.1:4318`.
    pub fn http(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: Some(endpoint.into()),
            protocol: Some(OtlpProtocol::HttpProtobuf),
            ..Self::default()
        }
    }

    /// Sets the service name.
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = Some(name.into());
        self
    }

    /// Sets the sampler.
    pub fn sampler(mut self, sampler: Sampler) -> Self {
        self.sampler = Some(sampler);
        self
    }

    /// Builds (or not) the meter provider.
    pub fn metrics(mut self, enabled: bool) -> Self {
        self.metrics = Some(enabled);
        self
    }

    /// Whether to build the meter provider: the code's choice, else `OTEL_METRICS_EXPORTER`
    /// (`none` turns metrics off, as the SDK environment specification says), else on.
    fn metrics_enabled(&self, env: impl Fn(&str) -> Option<String>) -> bool {
        self.metrics
            .unwrap_or_else(|| env("OTEL_METRICS_EXPORTER").is_none_or(|v| v.trim() != "none"))
    }

    /// The protocol this config resolves to with `env` as the environment.
    fn resolve_protocol(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<OtlpProtocol, OtlpError> {
        if let Some(p) = self.protocol {
            return Ok(p);
        }
        for var in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(v) = env(var).filter(|v| !v.trim().is_empty()) {
                return OtlpProtocol::parse(&v).ok_or(OtlpError::Protocol { var, value: v });
            }
        }
        // The OTLP exporter specification's default.
        Ok(OtlpProtocol::HttpProtobuf)
    }
}

/// Why [`init`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    /// An unsupported protocol in the environment.
    #[error("{var}={value:?} is not supported: use `grpc` or `http/protobuf`")]
    Protocol {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The exporter could not be built (bad endpoint, …).
    #[error("cannot build the OTLP {signal} exporter: {source}; check the endpoint and protocol")]
    Exporter {
        /// `traces` or `metrics`.
        signal: &'static str,
        /// The exporter's error.
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// Flushing or shutting down failed.
    #[error("OTLP shutdown failed: {0}")]
    Shutdown(String),
    /// The span export thread could not be started.
    #[error("cannot start the span export thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// The providers [`init`] built. Give them to a layer with
/// [`InferenceTraceLayer::with_otlp`](crate::InferenceTraceLayer::with_otlp).
#[derive(Clone, Debug)]
pub struct OtlpProviders {
    /// The tracer provider (infertrace's batch span processor).
    pub tracer_provider: SdkTracerProvider,
    /// The meter provider (periodic reader), unless metrics were turned off.
    pub meter_provider: Option<SdkMeterProvider>,
    /// The tracer provider's only span processor (infertrace's batch processor,
    /// [`SharedSpanProcessor::batch`]), shared: a layer given it hands each finished request
    /// to it whole (the direct path).
    pub span_processor: SharedSpanProcessor,
    /// The tracer provider's sampler, which the direct path uses for request spans too.
    pub(crate) sampler: Box<dyn ShouldSample>,
    /// Whether `sampler` may look at a span's attributes (a sampler from the environment or a
    /// plain `Sampler` never does, so the direct path need not list them for it).
    pub(crate) sampler_reads_attributes: bool,
}

impl OtlpProviders {
    /// Makes these the global providers: what `InferenceTraceLayer::new()` exports through by
    /// default, and `opentelemetry::global::tracer` gives other instrumentation.
    /// `tracing-opentelemetry` does not read them: give its layer a tracer of
    /// [`tracer_provider`](Self::tracer_provider) (`.with_tracer(..)`, as the README shows) for
    /// the handlers' `tracing` spans to nest under the request span.
    pub fn install_global(&self) {
        opentelemetry::global::set_tracer_provider(self.tracer_provider.clone());
        if let Some(m) = &self.meter_provider {
            opentelemetry::global::set_meter_provider(m.clone());
        }
    }

    /// Flushes pending spans and metrics and shuts both providers down.
    pub fn shutdown(&self) -> Result<(), OtlpError> {
        let traces = self.tracer_provider.shutdown();
        let metrics = self.meter_provider.as_ref().map(|m| m.shutdown());
        let mut errors = Vec::new();
        if let Err(e) = traces {
            errors.push(format!("traces: {e}"));
        }
        if let Some(Err(e)) = metrics {
            errors.push(format!("metrics: {e}"));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(OtlpError::Shutdown(errors.join("; ")))
        }
    }
}

fn http_url(base: &str, path: &str) -> String {
    format!("{}{}", base.trim_end_matches('/'), path)
}

/// Whether `OTEL_EXPORTER_OTLP_TRACES_COMPRESSION` or `OTEL_EXPORTER_OTLP_COMPRESSION` asks
/// for a compressed body (any value but empty or `none`, as opentelemetry-otlp reads them).
fn compression_requested(env: impl Fn(&str) -> Option<String>) -> bool {
    for var in [
        opentelemetry_otlp::OTEL_EXPORTER_OTLP_TRACES_COMPRESSION,
        opentelemetry_otlp::OTEL_EXPORTER_OTLP_COMPRESSION,
    ] {
        if let Some(v) = env(var).filter(|v| !v.is_empty()) {
            return !v.eq_ignore_ascii_case("none");
        }
    }
    false
}

/// The HTTP timeout opentelemetry-otlp gives its own client for traces:
/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT` (milliseconds), else
/// 10 s.
fn http_timeout(env: impl Fn(&str) -> Option<String>) -> std::time::Duration {
    signal_timeout(opentelemetry_otlp::OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, env)
}

/// [`http_timeout`] for the signal whose own variable is `signal_var`.
fn signal_timeout(signal_var: &str, env: impl Fn(&str) -> Option<String>) -> std::time::Duration {
    [signal_var, opentelemetry_otlp::OTEL_EXPORTER_OTLP_TIMEOUT]
        .into_iter()
        .find_map(|var| env(var).and_then(|v| v.parse::<u64>().ok()))
        .map(std::time::Duration::from_millis)
        .unwrap_or(opentelemetry_otlp::OTEL_EXPORTER_OTLP_TIMEOUT_DEFAULT)
}

fn resource(config: &OtlpConfig) -> Resource {
    // `Resource::builder()` reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
    let mut builder = Resource::builder().with_attributes(config.resource_attributes.clone());
    if let Some(name) = &config.service_name {
        builder = builder.with_service_name(name.clone());
    }
    builder.build()
}

/// Builds OTLP tracer and meter providers from `config` and the environment.
pub fn init(config: OtlpConfig) -> Result<OtlpProviders, OtlpError> {
    let protocol = config.resolve_protocol(|v| std::env::var(v).ok())?;
    let resource = resource(&config);
    // With HTTP/protobuf the layer's requests are encoded by the export thread and sent in the
    // exporter's own requests (`export/otlp_encode`), unless the body must be compressed.
    let env = |v: &str| std::env::var(v).ok();
    let (client, staged) = if protocol == OtlpProtocol::HttpProtobuf && !compression_requested(env)
    {
        let staged = Staged::default();
        match EncodingClient::new(http_timeout(env), staged.clone()) {
            Some(client) => (Some(client), Some(staged)),
            // No client of ours: the exporter builds its own and encodes every span.
            None => (None, None),
        }
    } else {
        (None, None)
    };
    let spans = match protocol {
        OtlpProtocol::Grpc => {
            let mut b = SpanExporter::builder().with_tonic();
            if let Some(e) = &config.endpoint {
                b = b.with_endpoint(e.clone());
            }
            b.build()
        }
        OtlpProtocol::HttpProtobuf => {
            let mut b = SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
            if let Some(e) = &config.endpoint {
                b = b.with_endpoint(http_url(e, "/v1/traces"));
            }
            // Our client, else a blocking one like it (`blocking_client`: never the async
            // client the application's features may have turned on).
            if let Some(client) = client {
                b = b.with_http_client(client);
            } else if let Some(client) = blocking_client(http_timeout(env)) {
                b = b.with_http_client(client);
            }
            b.build()
        }
    }
    .map_err(|source| OtlpError::Exporter {
        signal: "traces",
        source,
    })?;
    // One batch processor (infertrace's, `export/batch`: the SDK's batching, same `OTEL_BSP_*`
    // variables), shared by the provider (the handler's own spans) and by any layer given these
    // providers (`with_otlp`), which hands each finished request to it whole.
    let processor = match staged {
        Some(staged) => SharedSpanProcessor::batch_with_requests(
            spans,
            &resource,
            BatchSettings::from_env(),
            Box::new(OtlpRequests::new(&resource, staged)),
        )?,
        None => SharedSpanProcessor::batch(spans, &resource)?,
    };
    // Only a parent-based sampler given in code may hold a custom sampler that reads attributes.
    let sampler_reads_attributes = matches!(config.sampler, Some(Sampler::ParentBased(_)));
    let sampler: Box<dyn ShouldSample> = match config.sampler.clone() {
        Some(sampler) => Box::new(sampler),
        // What the SDK reads from OTEL_TRACES_SAMPLER(_ARG) when no sampler is given.
        None => opentelemetry_sdk::trace::Config::default().sampler,
    };
    let tracer_provider = SdkTracerProvider::builder()
        .with_span_processor(processor.clone())
        .with_resource(resource.clone())
        .with_sampler(sampler.clone())
        .build();

    let meter_provider = if config.metrics_enabled(|v| std::env::var(v).ok()) {
        let exporter = match protocol {
            OtlpProtocol::Grpc => {
                let mut b = MetricExporter::builder().with_tonic();
                if let Some(e) = &config.endpoint {
                    b = b.with_endpoint(e.clone());
                }
                b.build()
            }
            OtlpProtocol::HttpProtobuf => {
                let mut b = MetricExporter::builder()
                    .with_http()
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
                if let Some(e) = &config.endpoint {
                    b = b.with_endpoint(http_url(e, "/v1/metrics"));
                }
                let timeout =
                    signal_timeout(opentelemetry_otlp::OTEL_EXPORTER_OTLP_METRICS_TIMEOUT, env);
                if let Some(client) = blocking_client(timeout) {
                    b = b.with_http_client(client);
                }
                b.build()
            }
        }
        .map_err(|source| OtlpError::Exporter {
            signal: "metrics",
            source,
        })?;
        Some(
            SdkMeterProvider::builder()
                .with_reader(PeriodicReader::builder(exporter).build())
                .with_resource(resource)
                .build(),
        )
    } else {
        None
    };
    Ok(OtlpProviders {
        tracer_provider,
        meter_provider,
        span_processor: processor,
        sampler,
        sampler_reads_attributes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn metrics_exporter_none_turns_metrics_off() {
        assert!(OtlpConfig::default().metrics_enabled(env_of(&[])));
        let none = env_of(&[("OTEL_METRICS_EXPORTER", "none")]);
        assert!(!OtlpConfig::default().metrics_enabled(&none));
        let otlp = env_of(&[("OTEL_METRICS_EXPORTER", "otlp")]);
        assert!(OtlpConfig::default().metrics_enabled(&otlp));
        // Code wins over the environment.
        assert!(OtlpConfig::default().metrics(true).metrics_enabled(&none));
    }

    #[test]
    fn protocol_precedence() {
        let none = env_of(&[]);
        assert_eq!(
            OtlpConfig::default().resolve_protocol(&none).unwrap(),
            OtlpProtocol::HttpProtobuf
        );
        let http = env_of(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]);
        assert_eq!(
            OtlpConfig::default().resolve_protocol(&http).unwrap(),
            OtlpProtocol::HttpProtobuf
        );
        let traces = env_of(&[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ]);
        assert_eq!(
            OtlpConfig::default().resolve_protocol(&traces).unwrap(),
            OtlpProtocol::Grpc
        );
        // Code wins over the environment.
        assert_eq!(
            OtlpConfig::grpc("http://x:4317")
                .resolve_protocol(&http)
                .unwrap(),
            OtlpProtocol::Grpc
        );
        let bad = env_of(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")]);
        assert!(matches!(
            OtlpConfig::default().resolve_protocol(&bad),
            Err(OtlpError::Protocol { .. })
        ));
    }

    #[test]
    fn compression_or_not_and_the_http_timeout_read_as_opentelemetry_otlp_reads_them() {
        assert!(!compression_requested(env_of(&[])));
        assert!(!compression_requested(env_of(&[(
            "OTEL_EXPORTER_OTLP_COMPRESSION",
            "none"
        )])));
        assert!(compression_requested(env_of(&[(
            "OTEL_EXPORTER_OTLP_COMPRESSION",
            "gzip"
        )])));
        // The traces variable first.
        assert!(!compression_requested(env_of(&[
            ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ])));
        assert_eq!(
            http_timeout(env_of(&[])),
            std::time::Duration::from_secs(10)
        );
        assert_eq!(
            http_timeout(env_of(&[
                ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "junk"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ])),
            std::time::Duration::from_millis(2500)
        );
        assert_eq!(
            http_timeout(env_of(&[
                ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "100"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ])),
            std::time::Duration::from_millis(100)
        );
    }

    #[test]
    fn http_paths_are_appended_to_the_base() {
        assert_eq!(
            http_url("http://h:4318/", "/v1/traces"),
            "http://h:4318/v1/traces"
        );
        assert_eq!(
            http_url("http://h:4318", "/v1/metrics"),
            "http://h:4318/v1/metrics"
        );
    }

    #[test]
    fn explicit_service_name_wins() {
        let r = resource(&OtlpConfig::default().service_name("svc-a"));
        let name = r.get(&opentelemetry::Key::from_static_str(
            infertrace_semconv::resource::SERVICE_NAME,
        ));
        assert_eq!(
            name.map(|v| v.as_str().into_owned()),
            Some("svc-a".to_owned())
        );
    }

    #[tokio::test]
    async fn builds_both_protocols_and_shuts_down() {
        for cfg in [
            OtlpConfig::grpc("http://127.0.0.1:1"),
            OtlpConfig::http("http://127.0.0.1:1"),
        ] {
            let providers = init(cfg.service_name("t")).unwrap();
            assert!(providers.meter_provider.is_some());
            // Nothing was recorded, so there is nothing to send to the closed port.
            let _ = providers.shutdown();
        }
    }

    /// Providers shaped like `init`'s, exporting to memory.
    fn in_memory(
        sampler: Sampler,
    ) -> (
        OtlpProviders,
        opentelemetry_sdk::trace::InMemorySpanExporter,
        opentelemetry_sdk::metrics::InMemoryMetricExporter,
    ) {
        use opentelemetry_sdk::metrics::InMemoryMetricExporter;
        use opentelemetry_sdk::trace::{InMemorySpanExporter, SimpleSpanProcessor};
        let spans = InMemorySpanExporter::default();
        let metrics = InMemoryMetricExporter::default();
        let resource = Resource::builder().with_service_name("svc").build();
        let processor =
            SharedSpanProcessor::new(SimpleSpanProcessor::new(spans.clone()), &resource);
        let tracer_provider = SdkTracerProvider::builder()
            .with_span_processor(processor.clone())
            .with_sampler(sampler.clone())
            .build();
        let meter_provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(metrics.clone()).build())
            .build();
        let providers = OtlpProviders {
            tracer_provider,
            meter_provider: Some(meter_provider),
            span_processor: processor,
            sampler: Box::new(sampler),
            sampler_reads_attributes: false,
        };
        (providers, spans, metrics)
    }

    async fn one_request(layer: crate::InferenceTraceLayer) {
        use http_body_util::BodyExt as _;
        use tower::{Layer as _, ServiceExt as _};
        let svc = layer.layer(tower::service_fn(|req: http::Request<String>| async move {
            if let Some(rec) = req.extensions().get::<crate::RequestRecorder>() {
                rec.scheduled();
                rec.tokens(2);
                rec.finish("stop");
            }
            Ok::<_, std::convert::Infallible>(http::Response::new(String::from("{}")))
        }));
        let req = http::Request::post("/v1/chat/completions")
            .body(String::new())
            .unwrap();
        let response = svc.oneshot(req).await.unwrap();
        response.into_body().collect().await.unwrap();
    }

    #[tokio::test]
    async fn with_otlp_exports_directly_with_the_providers_sampler_and_meters() {
        let (providers, spans, metrics) = in_memory(Sampler::AlwaysOn);
        let layer = crate::InferenceTraceLayer::new().with_otlp(&providers);
        assert!(format!("{layer:?}").contains("direct_export: true"));
        one_request(layer).await;
        let got = spans.get_finished_spans().unwrap();
        let mut names: Vec<_> = got.iter().map(|s| s.name.to_string()).collect();
        names.sort();
        assert_eq!(names, ["chat", "decode", "prefill", "queue"]);
        // The resource given to the shared processor, the layer's scope.
        assert!(
            got.iter()
                .all(|s| s.instrumentation_scope.name() == "infertrace-tower")
        );
        providers
            .meter_provider
            .as_ref()
            .unwrap()
            .force_flush()
            .unwrap();
        let exported = metrics.get_finished_metrics().unwrap();
        let names: Vec<String> = exported
            .iter()
            .flat_map(|rm| rm.scope_metrics())
            .flat_map(|sm| sm.metrics())
            .map(|m| m.name().to_owned())
            .collect();
        assert!(
            names.iter().any(|n| n == "gen_ai.server.request.duration"),
            "{names:?}"
        );

        // The providers' sampler decides on the direct path too.
        let (providers, spans, _) = in_memory(Sampler::AlwaysOff);
        one_request(crate::InferenceTraceLayer::new().with_otlp(&providers)).await;
        assert!(spans.get_finished_spans().unwrap().is_empty());
    }

    #[test]
    fn the_tracer_provider_alone_keeps_the_tracer_path_in_any_order() {
        let (providers, _, _) = in_memory(Sampler::AlwaysOn);
        let tracer_only =
            crate::InferenceTraceLayer::new().with_tracer_provider(&providers.tracer_provider);
        assert!(format!("{tracer_only:?}").contains("direct_export: false"));
        // Giving the processor before the provider keeps the direct path.
        let either_order = crate::InferenceTraceLayer::new()
            .with_span_processor(providers.span_processor.clone())
            .with_tracer_provider(&providers.tracer_provider);
        assert!(format!("{either_order:?}").contains("direct_export: true"));
    }
}
