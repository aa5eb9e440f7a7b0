//! Added CPU time per request of `InferenceTraceLayer` against a bare service and two peers, and
//! the added cost per streamed chunk.
//!
//! Every variant serves the same in-process request (POST /v1/chat/completions, host, user agent,
//! content type; no network) with a service that answers at once, and drains the response body.
//! Spans go to a batch span processor whose exporter drops them, so the figures are the cost on
//! the request's own thread. Variants:
//!
//! - `bare`: the service alone (it also looks for a `RequestRecorder` and finds none);
//! - `infertrace`: request span + `queue` / `prefill` / `decode` (the service marks scheduled,
//!   first token, more tokens, usage, finish), ~25 attributes, metrics to a no-op meter;
//! - `infertrace_fast`: the same exported directly to the span processor
//!   (`with_span_processor`: finished `SpanData`, no tracer);
//! - `infertrace_handover`: the same with infertrace's own batch processor
//!   (`SharedSpanProcessor::batch_with`, what `with_otlp` wires): one queue entry per request,
//!   the four spans built on the export thread, tracing only (`without_metrics`, as the peer's
//!   `with_metrics(false)`; `_metrics`: plus every metric into an SDK meter provider);
//! - `infertrace_global`: the same through the global (boxed) tracer;
//! - `infertrace_metrics`: the same plus every metric recorded into an SDK meter provider;
//! - `otel_instrumentation_tower`: `opentelemetry-instrumentation-tower` 0.19, one span, tracing
//!   only (and `_metrics`: with its metrics into the same kind of meter provider);
//! - `tower_http_tracing_otel`: tower-http `TraceLayer` + `tracing-opentelemetry`, one span;
//! - `infertrace_handover_otlp` and `otel_instrumentation_tower_otlp`: the hand-off and the
//!   best peer exporting through a real OTLP/HTTP protobuf exporter to a local receiver (a
//!   child process that reads each request and answers 200), each processor at its default
//!   settings, flushed after every batch's worth of requests inside the measurement so that no
//!   span is dropped: encoding, the HTTP client and every export are in the process CPU
//!   (`infertrace_handover_otlp`: `SharedSpanProcessor::batch` over opentelemetry-otlp's
//!   exporter, every span built as `SpanData` and encoded by opentelemetry-otlp);
//! - `infertrace_otlp`: what `otlp::init` (HTTP/protobuf) and `with_otlp` wire, to the same
//!   receiver, paced the same way: the export thread encodes the layer's requests straight to
//!   OTLP protobuf (no `SpanData`) and sends them through the exporter (its "spans exported"
//!   share counts the spans not dropped by the processor);
//! - `chunks/*`: a streamed (`text/event-stream`) body of 1 and 1025 chunks, bare and traced;
//!   the per-chunk cost is the slope difference;
//! - `sdk/span_1_attr`: the floor, one SDK span with one attribute into the same processor;
//! - `floor/infertrace_no_handoff`: the `infertrace_fast` layer with a span processor that
//!   drops each finished span on the request thread (no batch queue, nothing exported): what
//!   the layer costs without the hand-off to the batch processor and the frees on its thread —
//!   a diagnostic, not a way to run the layer;
//! - `recorder/tokens_1`: one `RequestRecorder::tokens(1)` call (the engine's per-token cost).
//!
//! Every thread (the request loop, the span processors' export threads, the GPU samplers) is
//! pinned to one CPU (`INFERTRACE_BENCH_CPU`: a CPU number, default the first one allowed;
//! `none` to leave them unpinned), so the process CPU time per request is what the work costs,
//! not cross-core traffic. Criterion measures the CPU time of the request's thread
//! (`CLOCK_THREAD_CPUTIME_ID`): time it spends preempted does not count. The summary gives, per
//! variant, the process CPU time (request thread + export threads: what a user pays), the
//! request thread's CPU time, their difference, and wall time. The processors are flushed after
//! each variant, outside the measurement.
//!
//! Run: `cargo bench -p infertrace-tower --bench layer_overhead`. After criterion's own report
//! a summary table prints the medians and the differences the targets are about.

use std::collections::BTreeMap;
use std::future::{Future, ready};
use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::Criterion;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use infertrace_tower::{BatchSettings, InferenceTraceLayer, RequestRecorder, SharedSpanProcessor};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter, SpanProcessor};
use tower::{Layer, Service};
use tracing_subscriber::layer::SubscriberExt as _;

mod support;

use support::{Engine, RECEIVER_ENV, one, run_receiver, start_receiver};

/// A span processor that drops every span where it ends (`floor/infertrace_no_handoff`).
#[derive(Debug)]
struct DropInPlace;

impl SpanProcessor for DropInPlace {
    fn on_start(&self, _: &mut opentelemetry_sdk::trace::Span, _: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        black_box(&span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Spans the no-op exporter received (to check the batch processor kept up).
static EXPORTED: AtomicU64 = AtomicU64::new(0);

#[derive(Debug)]
struct DropExporter;

impl SpanExporter for DropExporter {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        EXPORTED.fetch_add(batch.len() as u64, Ordering::Relaxed);
        drop(batch);
        ready(Ok(()))
    }
}

/// Per benchmark, per criterion sample: (thread CPU ns, process CPU ns, wall ns) per iteration.
static SAMPLES: Mutex<BTreeMap<String, Vec<[f64; 3]>>> = Mutex::new(BTreeMap::new());

/// CPU clocks: the request thread's CPU time is what criterion measures (robust to the machine
/// being shared: time the thread is not running does not count); the process CPU time adds
/// what the SDK's batch-export thread spends on the spans; wall time for reference.
struct CpuClocks {
    thread: Duration,
    process: Duration,
    wall: Instant,
}

#[cfg(target_os = "linux")]
fn cpu_clock(id: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock ids are Linux constants.
    if unsafe { libc::clock_gettime(id, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

#[cfg(target_os = "linux")]
use libc::{CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID};

#[cfg(not(target_os = "linux"))]
fn cpu_clock(_id: i32) -> Duration {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed()
}

#[cfg(not(target_os = "linux"))]
const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
#[cfg(not(target_os = "linux"))]
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

/// Pins this thread, and so every thread it starts later (the span processors' export
/// threads, the GPU samplers), to one CPU: `INFERTRACE_BENCH_CPU` (a CPU number, or `none` to
/// leave threads where the scheduler puts them), by default the first CPU this process may
/// use. On one core the process CPU time is the work itself, not cross-core traffic. Returns
/// the CPU pinned to.
#[cfg(target_os = "linux")]
fn pin_to_one_cpu() -> Option<usize> {
    let wanted = std::env::var("INFERTRACE_BENCH_CPU").ok();
    if wanted.as_deref() == Some("none") {
        return None;
    }
    // SAFETY: `set` is a plain bit set, zero-initialised and then read and written only through
    // libc's CPU_* helpers with its own size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        if libc::sched_getaffinity(0, size, &mut set) != 0 {
            return None;
        }
        let cpu = match wanted.and_then(|w| w.trim().parse::<usize>().ok()) {
            Some(cpu) => cpu,
            None => (0..libc::CPU_SETSIZE as usize).find(|&c| libc::CPU_ISSET(c, &set))?,
        };
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        (libc::sched_setaffinity(0, size, &set) == 0).then_some(cpu)
    }
}

#[cfg(not(target_os = "linux"))]
fn pin_to_one_cpu() -> Option<usize> {
    None
}

impl CpuClocks {
    fn now() -> Self {
        Self {
            wall: Instant::now(),
            process: cpu_clock(CLOCK_PROCESS_CPUTIME_ID),
            thread: cpu_clock(CLOCK_THREAD_CPUTIME_ID),
        }
    }

    /// Records the sample under `key` and returns the thread CPU time for criterion.
    fn elapsed(&self, key: &str, iters: u64) -> Duration {
        let thread = cpu_clock(CLOCK_THREAD_CPUTIME_ID).saturating_sub(self.thread);
        let process = cpu_clock(CLOCK_PROCESS_CPUTIME_ID).saturating_sub(self.process);
        let wall = self.wall.elapsed();
        let per = |d: Duration| d.as_nanos() as f64 / iters.max(1) as f64;
        if let Ok(mut s) = SAMPLES.lock() {
            s.entry(key.to_owned())
                .or_default()
                .push([per(thread), per(process), per(wall)]);
        }
        thread
    }
}
static REQUESTS: AtomicU64 = AtomicU64::new(0);

/// The CPU every thread runs on, if pinned.
static PINNED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();

/// Per variant: spans per request, spans emitted, spans the exporter received (for the
/// summary: a span dropped at a full queue is never exported, and its cost is partly missing).
static SPANS: Mutex<BTreeMap<String, [u64; 3]>> = Mutex::new(BTreeMap::new());

/// The span processors the variants export to, flushed after each variant (outside the
/// measurement), so one variant's queued spans are not exported during the next one's.
static PROCESSORS: Mutex<Vec<SharedSpanProcessor>> = Mutex::new(Vec::new());

fn flush_processors() {
    if let Ok(processors) = PROCESSORS.lock() {
        for p in processors.iter() {
            let _ = p.force_flush();
        }
    }
}

fn bench_service<S, B>(c: &mut Criterion, group: &str, name: &str, svc: S, spans_per_request: u64)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
{
    bench_paced(c, group, name, svc, spans_per_request, None);
}

/// [`bench_service`], flushing `pace.0` after every `pace.1` requests inside the measurement:
/// the request thread waits while the export thread exports what is queued, so no span is
/// dropped at a full queue and the process CPU includes the export of every span. With
/// `pace.1` a batch's worth of requests, exports happen as often as the processor's own
/// batching would make them.
fn bench_paced<S, B>(
    c: &mut Criterion,
    group: &str,
    name: &str,
    mut svc: S,
    spans_per_request: u64,
    pace: Option<(&SharedSpanProcessor, u64)>,
) where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
{
    let key = format!("{group}/{name}");
    let exported_before = EXPORTED.load(Ordering::Relaxed);
    let mut emitted = 0;
    c.benchmark_group(group).bench_function(name, |b| {
        b.iter_custom(|iters| {
            let start = CpuClocks::now();
            for i in 1..=iters {
                one(&mut svc);
                if let Some((processor, every)) = pace
                    && (i % every == 0 || i == iters)
                {
                    let _ = processor.force_flush();
                }
            }
            let elapsed = start.elapsed(&key, iters);
            REQUESTS.fetch_add(iters * spans_per_request, Ordering::Relaxed);
            emitted += iters * spans_per_request;
            elapsed
        })
    });
    flush_processors();
    let exported = EXPORTED.load(Ordering::Relaxed) - exported_before;
    if let Ok(mut spans) = SPANS.lock() {
        spans.insert(key, [spans_per_request, emitted, exported]);
    }
}

/// A batch span processor with a queue deep enough that the export thread keeps up on a small
/// machine: a span dropped at a full queue is freed on the request thread, which would make
/// variants emitting more spans look cheaper than they are.
///
/// The processor is shared: the provider (every tracer-based variant and peer) and the
/// `infertrace_fast` layer (direct export) feed the same queue and exporter.
fn batch_provider() -> (SdkTracerProvider, SharedSpanProcessor) {
    let config = opentelemetry_sdk::trace::BatchConfigBuilder::default()
        .with_max_queue_size(1 << 16)
        .with_max_export_batch_size(4096)
        .build();
    let processor = opentelemetry_sdk::trace::BatchSpanProcessor::builder(DropExporter)
        .with_batch_config(config)
        .build();
    let resource = opentelemetry_sdk::Resource::builder().build();
    let processor = SharedSpanProcessor::new(processor, &resource);
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor.clone())
        .with_resource(resource)
        .build();
    (provider, processor)
}

/// An exporter that counts what `E` exported (into [`EXPORTED`]).
#[derive(Debug)]
struct Counting<E>(E);

impl<E: SpanExporter> SpanExporter for Counting<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let spans = batch.len() as u64;
        let export = self.0.export(batch);
        async move {
            let result = export.await;
            if result.is_ok() {
                EXPORTED.fetch_add(spans, Ordering::Relaxed);
            }
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.0.set_resource(resource);
    }
}

/// An OTLP/HTTP protobuf span exporter to the receiver at `base`, counting what it exports.
/// The exporter's own blocking client, given explicitly: the test build turns on
/// opentelemetry-otlp's async client too, which the exporter would otherwise pick.
fn otlp_exporter(base: &str) -> Option<Counting<opentelemetry_otlp::SpanExporter>> {
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(reqwest::blocking::Client::builder().build().ok()?)
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(format!("{base}/v1/traces"))
        .build()
        .ok()
        .map(Counting)
}

fn meter_provider() -> SdkMeterProvider {
    SdkMeterProvider::builder()
        .with_reader(
            PeriodicReader::builder(InMemoryMetricExporter::default())
                .with_interval(Duration::from_secs(3600))
                .build(),
        )
        .build()
}

fn benches(c: &mut Criterion, receiver: Option<&str>) {
    let (tracer_provider, processor) = batch_provider();
    if let Ok(mut processors) = PROCESSORS.lock() {
        processors.push(processor.clone());
    }
    opentelemetry::global::set_tracer_provider(tracer_provider.clone());
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let engine = Engine { chunks: 1 };

    bench_service(c, "request", "bare", engine, 0);
    let layer = InferenceTraceLayer::new()
        .with_tracer_provider(&tracer_provider)
        .default_model("llama-3.1-8b");
    bench_service(c, "request", "infertrace", layer.layer(engine), 4);
    let fast = InferenceTraceLayer::new()
        .with_tracer_provider(&tracer_provider)
        .with_span_processor(processor.clone())
        .default_model("llama-3.1-8b");
    bench_service(c, "request", "infertrace_fast", fast.layer(engine), 4);
    // The direct path into infertrace's batch processor (what `with_otlp` wires): each request
    // handed over as one queue entry, its spans built on the export thread. Same exporter; the
    // default batch of 512 entries (requests: 2,048 spans a call — larger batches cost the
    // export thread more, see docs/PERFORMANCE.md), a queue of 16,384 requests so that the
    // export thread's building never fills it.
    let own = SharedSpanProcessor::batch_with(
        DropExporter,
        &opentelemetry_sdk::Resource::builder().build(),
        BatchSettings {
            max_queue_size: 1 << 14,
            scheduled_delay: Duration::from_secs(5),
            max_export_batch_size: 512,
        },
    )
    .expect("export thread");
    if let Ok(mut processors) = PROCESSORS.lock() {
        processors.push(own.clone());
    }
    // Tracing only, as the peer's variant (`with_metrics(false)`).
    let handover = InferenceTraceLayer::new()
        .with_tracer_provider(&tracer_provider)
        .with_span_processor(own.clone())
        .without_metrics()
        .default_model("llama-3.1-8b");
    bench_service(
        c,
        "request",
        "infertrace_handover",
        handover.layer(engine),
        4,
    );
    let handover_meters = meter_provider();
    let handover_metrics = InferenceTraceLayer::new()
        .with_tracer_provider(&tracer_provider)
        .with_span_processor(own.clone())
        .with_meter_provider(&handover_meters)
        .default_model("llama-3.1-8b");
    bench_service(
        c,
        "request",
        "infertrace_handover_metrics",
        handover_metrics.layer(engine),
        4,
    );
    // The layer without the hand-off: its spans are built, then dropped on the request thread
    // (metrics to the global no-op meter, as for `infertrace_fast`).
    let no_handoff = InferenceTraceLayer::new()
        .with_span_processor(SharedSpanProcessor::new(
            DropInPlace,
            &opentelemetry_sdk::Resource::builder().build(),
        ))
        .default_model("llama-3.1-8b");
    bench_service(
        c,
        "floor",
        "infertrace_no_handoff",
        no_handoff.layer(engine),
        0,
    );

    let global = InferenceTraceLayer::new().default_model("llama-3.1-8b");
    bench_service(c, "request", "infertrace_global", global.layer(engine), 4);
    let meters = meter_provider();
    let with_metrics = InferenceTraceLayer::new()
        .with_tracer_provider(&tracer_provider)
        .with_meter_provider(&meters)
        .default_model("llama-3.1-8b");
    bench_service(
        c,
        "request",
        "infertrace_metrics",
        with_metrics.layer(engine),
        4,
    );
    // GPU and host telemetry: samplers on their threads (100 ms) over scripted sources, so the
    // request pays energy registration, the per-token add, and six window queries.
    let with_gpu = InferenceTraceLayer::new()
        .with_tracer_provider(&tracer_provider)
        .default_model("llama-3.1-8b")
        .gpu_telemetry(scripted_telemetry());
    bench_service(c, "request", "infertrace_gpu", with_gpu.layer(engine), 4);

    // Peers, same tracer provider (global), same exporter.
    if let Ok(peer) = opentelemetry_instrumentation_tower::http::server::LayerBuilder::builder()
        .with_metrics(false)
        .build()
    {
        bench_service(
            c,
            "request",
            "otel_instrumentation_tower",
            peer.layer(engine),
            1,
        );
    }
    opentelemetry::global::set_meter_provider(meter_provider());
    if let Ok(peer) =
        opentelemetry_instrumentation_tower::http::server::LayerBuilder::builder().build()
    {
        bench_service(
            c,
            "request",
            "otel_instrumentation_tower_metrics",
            peer.layer(engine),
            1,
        );
    }
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer_provider.tracer("bench")));
    tracing::subscriber::with_default(subscriber, || {
        let trace = tower_http::trace::TraceLayer::new_for_http();
        bench_service(
            c,
            "request",
            "tower_http_tracing_otel",
            trace.layer(engine),
            1,
        );
    });

    // Through a real OTLP/HTTP exporter (protobuf encoding, loopback HTTP) to the receiver,
    // each processor at its defaults (the `OTEL_BSP_*` variables): the hand-off as `with_otlp`
    // wires it, and the best peer through the SDK's batch processor.
    // Tracing only, like the peer's variant (`with_metrics(false)`): the SDK meter provider made
    // global above for the peer's metrics variant would otherwise give the infertrace layers
    // built below their metrics too.
    opentelemetry::global::set_meter_provider(opentelemetry::metrics::NoopMeterProvider::new());
    if let Some(base) = receiver
        && let (Some(ours), Some(theirs)) = (otlp_exporter(base), otlp_exporter(base))
    {
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("bench")
            .build();
        if let Ok(own) = SharedSpanProcessor::batch(ours, &resource) {
            if let Ok(mut processors) = PROCESSORS.lock() {
                processors.push(own.clone());
            }
            let provider = SdkTracerProvider::builder()
                .with_span_processor(own.clone())
                .with_resource(resource.clone())
                .build();
            let layer = InferenceTraceLayer::new()
                .with_tracer_provider(&provider)
                .with_span_processor(own.clone())
                .default_model("llama-3.1-8b");
            // A batch's worth: 512 entries, one a request (as the peer's 512 spans).
            bench_paced(
                c,
                "request",
                "infertrace_handover_otlp",
                layer.layer(engine),
                4,
                Some((&own, 512)),
            );
        }
        // What `otlp::init` + `with_otlp` wire: the layer's requests encoded straight to OTLP.
        let config = infertrace_tower::otlp::OtlpConfig::http(base)
            .service_name("bench")
            .metrics(false);
        if let Ok(providers) = infertrace_tower::otlp::init(config) {
            let own = providers.span_processor.clone();
            // The export thread encodes the layer's requests itself (not through `SpanData`).
            assert!(
                format!("{own:?}").contains("request_export: true"),
                "infertrace_otlp must take the layer's own OTLP encoding: {own:?}"
            );
            if let Ok(mut processors) = PROCESSORS.lock() {
                processors.push(own.clone());
            }
            let layer = InferenceTraceLayer::new()
                .with_otlp(&providers)
                .default_model("llama-3.1-8b");
            let dropped = own.dropped_spans().unwrap_or(0);
            bench_paced(
                c,
                "request",
                "infertrace_otlp",
                layer.layer(engine),
                4,
                Some((&own, 512)),
            );
            // Its exporter is not wrapped in `Counting`: what the processor did not drop.
            let dropped = own.dropped_spans().unwrap_or(0) - dropped;
            if let Ok(mut spans) = SPANS.lock()
                && let Some(entry) = spans.get_mut("request/infertrace_otlp")
            {
                entry[2] = entry[1].saturating_sub(dropped);
                EXPORTED.fetch_add(entry[2], Ordering::Relaxed);
            }
        }
        let sdk = opentelemetry_sdk::trace::BatchSpanProcessor::builder(theirs).build();
        let sdk = SharedSpanProcessor::new(sdk, &resource);
        if let Ok(mut processors) = PROCESSORS.lock() {
            processors.push(sdk.clone());
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(sdk.clone())
            .with_resource(resource)
            .build();
        // The peer uses the global provider: this one from now on.
        opentelemetry::global::set_tracer_provider(provider);
        if let Ok(peer) = opentelemetry_instrumentation_tower::http::server::LayerBuilder::builder()
            .with_metrics(false)
            .build()
        {
            bench_paced(
                c,
                "request",
                "otel_instrumentation_tower_otlp",
                peer.layer(engine),
                1,
                Some((&sdk, 512)),
            );
        }
    }

    for chunks in [1usize, 1025] {
        let engine = Engine { chunks };
        bench_service(c, "chunks", &format!("bare_{chunks}"), engine, 0);
        bench_service(
            c,
            "chunks",
            &format!("infertrace_{chunks}"),
            layer.layer(engine),
            4,
        );
    }

    // The floor: one SDK span with one attribute, started and ended, into the same processor.
    let tracer = tracer_provider.tracer("floor");
    let key = "sdk/span_1_attr".to_owned();
    c.benchmark_group("sdk").bench_function("span_1_attr", |b| {
        use opentelemetry::trace::{Span as _, SpanBuilder, Tracer as _};
        b.iter_custom(|iters| {
            let start = CpuClocks::now();
            for _ in 0..iters {
                let mut span =
                    tracer.build(SpanBuilder::from_name("decode").with_attributes(vec![
                        opentelemetry::KeyValue::new("infer.phase", "decode"),
                    ]));
                span.end();
            }
            let elapsed = start.elapsed(&key, iters);
            REQUESTS.fetch_add(iters, Ordering::Relaxed);
            elapsed
        })
    });

    c.benchmark_group("recorder")
        .bench_function("tokens_1", |b| {
            let rec = RequestRecorder::new();
            rec.scheduled();
            b.iter(|| rec.tokens(black_box(1)))
        });

    let _ = tracer_provider.force_flush();
    let _ = own.force_flush();
}

/// One scripted GPU (constant readings, energy counter at 300 W) and scripted host counters,
/// each sampled every 100 ms on its own thread.
fn scripted_telemetry() -> infertrace_gpu::GpuTelemetry {
    use infertrace_gpu::*;
    let epoch = Instant::now();
    let gpu = ScriptedSource::new(
        vec![DeviceInfo::new(0, "GPU-bench", "scripted")],
        move |_, now, out| {
            let t = now.saturating_duration_since(epoch).as_secs_f64();
            out.push(DeviceSample {
                device: 0,
                reading: GpuReading {
                    utilization: Some(0.9),
                    memory_used: Some(20_000_000_000),
                    power_watts: Some(300.0),
                    energy_millijoules: Some((300_000.0 * t) as u64),
                    ..GpuReading::default()
                },
                ..DeviceSample::default()
            });
        },
    );
    let host = ScriptedHostSource::new(|_, _| HostReading {
        host_cpu: Some(0.5),
        process_cpu: Some(0.2),
        process_memory: Some(1 << 30),
        ..HostReading::default()
    });
    let gpu = GpuSampler::with_source(GpuSamplerConfig::default(), Box::new(gpu));
    let host = HostSampler::with_source(HostSamplerConfig::default(), Box::new(host)).ok();
    GpuTelemetry::new(Some(gpu), host)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn summary() {
    let Ok(samples) = SAMPLES.lock() else { return };
    // Median over criterion's samples of clock `i` (0 thread CPU, 1 process CPU, 2 wall).
    let m = |k: &str, i: usize| {
        samples
            .get(k)
            .map(|v| median(&v.iter().map(|s| s[i]).collect::<Vec<_>>()))
            .unwrap_or(f64::NAN)
    };
    let spans = SPANS.lock().map(|s| s.clone()).unwrap_or_default();
    match PINNED.get().copied().flatten() {
        Some(cpu) => println!("\nEvery thread pinned to CPU {cpu} (INFERTRACE_BENCH_CPU)."),
        None => println!("\nThreads not pinned (INFERTRACE_BENCH_CPU=none, or pinning failed)."),
    }
    println!("\n## layer_overhead summary (median over criterion samples, ns per request)");
    println!(
        "Process CPU: every thread (request thread + span processors' export threads); \
         request thread: the thread serving the request; other threads: the difference."
    );
    println!(
        "| variant | spans | process CPU | added | request thread CPU | added | other threads | wall | added | spans exported |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let bare: Vec<f64> = (0..3).map(|i| m("request/bare", i)).collect();
    for name in [
        "bare",
        "infertrace",
        "infertrace_fast",
        "infertrace_handover",
        "infertrace_handover_metrics",
        "infertrace_global",
        "infertrace_metrics",
        "infertrace_gpu",
        "otel_instrumentation_tower",
        "otel_instrumentation_tower_metrics",
        "tower_http_tracing_otel",
        "infertrace_handover_otlp",
        "infertrace_otlp",
        "otel_instrumentation_tower_otlp",
    ] {
        let k = format!("request/{name}");
        if !samples.contains_key(&k) {
            continue;
        }
        let v: Vec<f64> = (0..3).map(|i| m(&k, i)).collect();
        let [per_request, emitted, exported] = spans.get(&k).copied().unwrap_or_default();
        let delivered = if emitted == 0 {
            "—".to_owned()
        } else {
            format!("{:.1} %", 100.0 * exported as f64 / emitted as f64)
        };
        println!(
            "| {name} | {per_request} | {:.0} | {:+.0} | {:.0} | {:+.0} | {:.0} | {:.0} | {:+.0} | {delivered} |",
            v[1],
            v[1] - bare[1],
            v[0],
            v[0] - bare[0],
            v[1] - v[0],
            v[2],
            v[2] - bare[2],
        );
    }
    if samples.contains_key("sdk/span_1_attr") {
        let floor = m("sdk/span_1_attr", 0);
        println!(
            "\nSDK floor (thread CPU): one span with one attribute {floor:.0} ns (4 spans ≈ {:.0} ns)",
            4.0 * floor
        );
    }
    if samples.contains_key("floor/infertrace_no_handoff") {
        let v = m("floor/infertrace_no_handoff", 0);
        println!(
            "layer without the hand-off (spans dropped on the request thread, thread CPU): {v:.0} ns ({:+.0} over bare)",
            v - m("request/bare", 0)
        );
    }
    if samples.contains_key("chunks/infertrace_1025") {
        let per_chunk = |p: &str, i: usize| {
            (m(&format!("chunks/{p}_1025"), i) - m(&format!("chunks/{p}_1"), i)) / 1024.0
        };
        let (b, t) = (per_chunk("bare", 0), per_chunk("infertrace", 0));
        println!(
            "per streamed chunk (thread CPU): bare {b:.1} ns, infertrace {t:.1} ns, added {:.1} ns",
            t - b
        );
    }
    let emitted = REQUESTS.load(Ordering::Relaxed);
    let exported = EXPORTED.load(Ordering::Relaxed);
    println!(
        "spans emitted ≈ {emitted}, exported by the batch processor {exported} ({:.1} %)",
        100.0 * exported as f64 / emitted.max(1) as f64
    );
    println!(
        "A variant with less than 99 % of its spans exported had its export thread fall behind: \
         the full queue dropped entries (freed on the request thread), and the work of building \
         and exporting their spans is missing from its process CPU."
    );
}

/// Also the entry point of `layer_overhead_mimalloc` (this file as a module).
pub(crate) fn main() {
    if std::env::var_os(RECEIVER_ENV).is_some() {
        run_receiver();
        return;
    }
    let mut receiver = start_receiver();
    let _ = PINNED.set(pin_to_one_cpu());
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c, receiver.as_ref().map(|(_, url)| url.as_str()));
    c.final_summary();
    summary();
    if let Some((child, _)) = &mut receiver {
        let _ = child.kill();
        let _ = child.wait();
    }
}
