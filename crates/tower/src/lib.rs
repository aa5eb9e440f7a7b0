//! Tower middleware that traces LLM inference requests into queue, prefill and decode phases.
//!
//! [`InferenceTraceLayer`] wraps any `http::Request → http::Response` service (axum, tonic, a
//! bare hyper service). For every request it emits, with OpenTelemetry:
//!
//! - a SERVER span `"{gen_ai.operation.name} {gen_ai.request.model}"` carrying the GenAI, HTTP or
//!   RPC semantic-convention attributes, vLLM's `gen_ai.latency.*` and infertrace's `infer.*`
//!   (time to first chunk, inter-token gap p50/p99/max, chunks, outcome, phase source);
//! - `queue`, `prefill` and `decode` child spans (or `queue` + `inference`, see
//!   [`PhaseSource::Derived`]) with exact timestamps;
//! - the GenAI server metrics (request duration, time to first token, time per output token,
//!   phase durations, token usage, active requests, admission-queue size).
//!
//! Phase boundaries come from the engine through the [`RequestRecorder`] found in the request
//! extensions (and as an axum extractor), or, with no engine changes, from the layer's optional
//! admission queue and the response body ([`PhaseSource`]). Incoming W3C `traceparent`,
//! `tracestate` and `baggage` headers (gRPC metadata included) are continued; a malformed one
//! starts a new trace.
//!
//! # Cargo features
//!
//! All three are on by default. A server that needs fewer turns the defaults off
//! (`infertrace-tower = { git = "…", default-features = false, features = ["otlp"] }`, or `path`);
//! the layer itself, [`RequestRecorder`], the metrics, the admission queue, propagation and
//! [`SharedSpanProcessor`] are always there.
//!
//! | feature | brings | packages in the build (`cargo tree -e normal`, this crate included) |
//! |---------|--------|------------------------------------------------------------------|
//! | none    | the layer on tower, tokio, `opentelemetry` and `opentelemetry_sdk` | 62 |
//! | `axum`  | [`RequestRecorder`] as an axum extractor (`MissingRecorder`) and `http.route` from axum's matched route | 83 |
//! | `otlp`  | the `otlp` module: `otlp::init`, `OtlpConfig`, OTLP exporters over gRPC (tonic) and HTTP/protobuf (reqwest), `with_otlp` | 124 |
//! | `gpu`   | `GpuTelemetry`, `TelemetryConfig` and `gpu_telemetry` (crate `infertrace-gpu`: NVML through `nvml-wrapper`, host counters through `sysinfo`) | 82 |
//! | all (default) | | 150 |
//!
//! Counted as distinct packages in `cargo tree -p infertrace-tower -e normal --prefix none
//! --no-default-features [--features …]` on Linux. Without `gpu` the phase spans carry
//! `infer.phase` only, never a `gpu.*`, `host.*` or `process.*` attribute. Without `axum`, an
//! axum router still works with the layer (it is a tower service), but handlers read the
//! recorder from the request extensions and spans carry no `http.route`. A tonic server needs no
//! feature at all: `tests/tonic_layer.rs` runs with the defaults off and has no axum in its build.
//!
//! # axum
//!
//! ```
//! # #[cfg(feature = "axum")] {
//! use axum::{Router, routing::post};
//! use infertrace_tower::{InferenceTraceLayer, RequestRecorder};
//!
//! async fn chat(rec: RequestRecorder) -> &'static str {
//!     rec.scheduled(); rec.tokens(1); rec.finish("stop");
//!     "hi"
//! }
//! let app: Router = Router::new().route("/v1/chat/completions", post(chat))
//!     .layer(InferenceTraceLayer::new().default_model("llama-3.1-8b"));
//! # }
//! ```
//!
//! # tonic
//!
//! ```no_run
//! # #[derive(Clone)] struct GeneratorServer;
//! # impl tonic::server::NamedService for GeneratorServer { const NAME: &'static str = "g.G"; }
//! # impl tower::Service<http::Request<tonic::body::Body>> for GeneratorServer {
//! #     type Response = http::Response<tonic::body::Body>;
//! #     type Error = std::convert::Infallible;
//! #     type Future = std::future::Ready<Result<Self::Response, Self::Error>>;
//! #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>)
//! #         -> std::task::Poll<Result<(), Self::Error>> { std::task::Poll::Ready(Ok(())) }
//! #     fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
//! #         std::future::ready(Ok(http::Response::new(tonic::body::Body::empty())))
//! #     }
//! # }
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use infertrace_tower::InferenceTraceLayer;
//! tonic::transport::Server::builder()
//!     .layer(InferenceTraceLayer::new().default_model("llama-3.1-8b"))
//!     // your generated `…Server::new(service)`
//!     .serve("127.0.0.1:50051".parse()?, GeneratorServer)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! In a tonic handler the recorder is `request.extensions().get::<RequestRecorder>()`. Serving
//! one service (`Server::serve`, `serve_with_incoming`) needs only tonic's `server` feature;
//! `add_service` for several needs tonic's `router` feature, which brings axum in through tonic
//! itself.
//!
//! # GPU and host counters
//!
//! With the `gpu` feature, `InferenceTraceLayer::gpu_telemetry` takes a `GpuTelemetry` (crate
//! `infertrace-gpu`, re-exported here): GPU samplers (NVML, on a dedicated thread, every 100 ms by default) and a
//! host sampler (host and process CPU, process memory). Each `queue` / `prefill` / `decode`
//! span then carries the window statistics of exactly its interval — `gpu.utilization.mean` /
//! `.max`, `gpu.memory.used.max`, `gpu.power.mean`, `gpu.energy`, `gpu.sample.count`,
//! `gpu.uuids`, `host.cpu.utilization.mean`, `process.cpu.utilization.mean`,
//! `process.memory.usage.max` — and `gpu.energy.attributed`, the request's share of the GPU
//! energy: each sampling interval's energy is split across the requests in flight by the tokens
//! each processed in it (an **estimate**; see `infertrace_gpu::EnergyAttribution`). Tokens count
//! as the engine reports them: [`RequestRecorder::tokens`] for output tokens and
//! [`RequestRecorder::prefilled`] for prompt tokens as prefill processes them. The `hw.*` GPU
//! metrics and the host metrics are registered once on the layer's meter.
//!
//! ```no_run
//! # #[cfg(feature = "gpu")] {
//! use infertrace_tower::{GpuTelemetry, InferenceTraceLayer, TelemetryConfig};
//! // Once, at startup: blocks while NVML loads.
//! let telemetry = GpuTelemetry::start(&TelemetryConfig::default());
//! let layer = InferenceTraceLayer::new().gpu_telemetry(telemetry);
//! # let _ = layer;
//! # }
//! ```
//!
//! Without NVML (no library, driver not loaded, no permission) the sampler logs one line and the
//! spans get no `gpu.*` attribute at all — never zeros; the host counters still apply. Without
//! `gpu_telemetry` a phase span carries only `infer.phase`, and the request's cost is unchanged.
//! With it, a request costs more (registration, six window queries, more attributes; see
//! `docs/PERFORMANCE.md`); a token costs one more relaxed atomic add.
//!
//! # How the request span gets its identity up front
//!
//! The spans are built at the end of the request, but the handler's own `tracing` spans (through
//! `tracing-opentelemetry`) and any outgoing calls need the request span's context while the
//! request runs. The layer therefore *starts* the request span at arrival, with its start time
//! set to the arrival instant and the attributes known then (so the sampler sees them), and keeps
//! it owned — unboxed and unlocked for an [`SdkTracerProvider`](opentelemetry_sdk::trace::SdkTracerProvider).
//! The sampling decision and span id are thus real from the start. The inner service's future is
//! polled under an OpenTelemetry [`Context`](opentelemetry::Context) holding that span context
//! (`FutureExt::with_context`): `tracing-opentelemetry` 0.34 gives a new *root* `tracing` span
//! the current OpenTelemetry context as parent, so handler spans nest under the request span.
//! At the end, the response attributes are set in one call, the phase spans are built with
//! exact start and end times, and the request span is ended at the exact end instant.
//!
//! With [`InferenceTraceLayer::with_span_processor`] (or `InferenceTraceLayer::with_otlp` for
//! the providers of `otlp::init`, feature `otlp`) the layer skips the tracer: it makes the request span's ids and sampling
//! decision itself at arrival, runs the handler under the same kind of context, and at the end
//! hands the four spans to the span processor as finished `SpanData` — the same spans, for less
//! CPU (see [`SharedSpanProcessor`]).
//!
//! # Behaviour worth knowing
//!
//! - The request span ends when the response body ends (last frame or trailers), not when the
//!   handler returns; a body dropped before its end (client disconnect, HTTP/2 reset) ends the
//!   request with `infer.outcome = cancelled` and the tokens and chunks counted so far.
//! - `infer.stream.chunks` counts gRPC messages for gRPC and data frames otherwise (see
//!   [`TracedBody`]); inter-token gaps are measured between frames. An SSE frame of comments
//!   alone (`: keep-alive`, axum's `Sse::keep_alive`) or OpenAI's `data: [DONE]` carries no
//!   token: it is no chunk and moves neither the first chunk nor the gaps.
//! - A request that ends while it waits in the admission queue has only the `queue` phase; an
//!   engine-mode request that ends before its response and before `scheduled()` only the
//!   admission queue's (no phase is made up for its wait). `gen_ai.request.stream` is written
//!   when the handler said it or a response went out.
//! - In [`PhaseSource::Derived`] mode a non-streamed response gets `queue` + `inference` instead
//!   of an invented prefill/decode split; a response is "streamed" when it is
//!   `text/event-stream`, a gRPC response of several messages, or the handler said so with
//!   [`RequestRecorder::stream`].
//! - The OpenTelemetry context is attached while the inner service's *future* is polled. Work a
//!   streaming body does later runs outside it: instrument such a stream with a span created in
//!   the handler (`stream.instrument(tracing::Span::current())`) to keep it in the trace.
//! - Errors: a service error, a body error, HTTP 4xx and 5xx (a 400 for a prompt over the
//!   context, a 404: requests the service did not serve; HTTP's conventions would leave a
//!   server span unset on a 4xx, the layer does not), a non-OK `grpc-status` (headers or
//!   trailers), [`RequestRecorder::error`] or a handler that panics (`error.type = panic`) set
//!   span status Error and `error.type`. Admission rejections and the service's own 429 or
//!   RESOURCE_EXHAUSTED are `rejected`, not errors (the server is shedding load as told); a
//!   499 or CANCELLED is `cancelled`. A panicking handler's request ends when the unwinding
//!   reaches the layer, after the panic hook has run: with `RUST_BACKTRACE` set, the printing
//!   of the backtrace (~100 ms) is in its e2e.
//!
//! All instants come from one monotonic clock ([`std::time::Instant`]) and are converted to wall
//! time once per request (`wall time at arrival + offset`), so phases never overlap wrongly or go
//! negative. Per-chunk and per-token marks read the CPU's invariant time-stamp counter where
//! there is one (cheaper than `Instant::now()`), converted against a pair of
//! `Instant` readings taken at arrival and at the end of each request.
//!
//! The cost (criterion, `benches/layer_overhead.rs`) is recorded in `docs/PERFORMANCE.md`.
#![deny(missing_docs)]
#![deny(unsafe_code)]

// Modules from the bottom up; each uses only modules above it in this list
// (`scripts/module-cycles.py` checks there is no cycle).
// Helpers with no layer of their own.
mod admission;
mod counters;
#[cfg(feature = "axum")]
mod extract;
mod gaps;
mod grpc;
mod interning;
mod metrics;
mod propagation;
mod recorder;
mod tick_clock;
// Plain data: a request's arrival facts, its end values, the finished request, and the one
// interface their attributes are written through.
mod attribute_writer;
mod end_attributes;
mod finished;
mod request_facts;
// Configuration every request of a layer reads.
mod config;
// Where spans go: `SpanSink` and its tracer, direct and batch sinks.
mod export;
// One request in flight.
mod phases;
mod record;
// The tower service and the response body.
mod body;
mod service;
// The builder users configure, and the OTLP setup it can take.
mod layer;
#[cfg(feature = "otlp")]
pub mod otlp;

pub use admission::AdmissionConfig;
pub use body::TracedBody;
pub use config::PhaseSource;
pub use export::{BatchSettings, MAX_QUEUE_ENTRIES, SharedSpanProcessor};
#[cfg(feature = "axum")]
pub use extract::MissingRecorder;
#[cfg(feature = "gpu")]
pub use infertrace_gpu::{GpuTelemetry, TelemetryConfig};
pub use layer::{DEFAULT_PROVIDER, InferenceTraceLayer};
pub use recorder::{RecorderSnapshot, RequestRecorder};
pub use request_facts::{MODEL_HEADER, OPERATION_HEADER, RequestDescription, RequestHead};
pub use service::{InferenceTraceService, ResponseFuture};
