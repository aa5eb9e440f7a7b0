//! GPU and host counters on the phase spans: with scripted samplers, the exact `gpu.*`,
//! `host.*` and `process.*` window attributes land on the phase they were sampled in; without
//! telemetry (or without GPUs) no `gpu.*` attribute exists at all — never zeros.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use common::*;
use http_body_util::BodyExt;
use infertrace_gpu::{
    DeviceInfo, DeviceSample, GpuReading, GpuSampler, GpuSamplerConfig, GpuTelemetry, HostReading,
    HostSampler, HostSamplerConfig, HostTicker, ManualTicker, ScriptedHostSource, ScriptedSource,
};
use infertrace_semconv::gpu as attr_names;
use infertrace_tower::{InferenceTraceLayer, RequestRecorder};
use opentelemetry::{Array, Value};
use opentelemetry_sdk::trace::SpanData;
use tower::ServiceExt;

const UUID: &str = "GPU-test-0000";
const GB: u64 = 1_000_000_000;
/// Per phase (queue, prefill, decode): utilisation and memory used.
const UTIL: [f64; 3] = [0.25, 1.0, 0.5];
const MEMORY: [u64; 3] = [GB, 2 * GB, 3 * GB];
/// Constant power; the energy counter integrates it exactly.
const WATTS: f64 = 300.0;
const HOST_CPU: f64 = 0.4;
const PROCESS_CPU: f64 = 0.1;
const PROCESS_MEMORY: u64 = 123_456_789;

/// Manual samplers whose readings follow the phase the handler says it is in.
#[derive(Clone)]
struct Rig {
    gpu: Option<Arc<Mutex<ManualTicker>>>,
    host: Option<Arc<Mutex<HostTicker>>>,
    phase: Arc<AtomicUsize>,
}

impl Rig {
    fn new(with_gpu: bool, with_host: bool) -> (Self, GpuTelemetry) {
        let epoch = Instant::now();
        let phase = Arc::new(AtomicUsize::new(0));
        let p = Arc::clone(&phase);
        let source = ScriptedSource::new(
            vec![DeviceInfo::new(0, UUID, "scripted")],
            move |_tick, now, out| {
                let i = p.load(Ordering::SeqCst);
                let t = now.saturating_duration_since(epoch).as_secs_f64();
                out.push(DeviceSample {
                    device: 0,
                    reading: GpuReading {
                        utilization: Some(UTIL[i]),
                        memory_used: Some(MEMORY[i]),
                        memory_total: Some(80 * GB),
                        power_watts: Some(WATTS),
                        energy_millijoules: Some((WATTS * t * 1000.0) as u64),
                        ..GpuReading::default()
                    },
                    ..DeviceSample::default()
                });
            },
        );
        let (gpu, gpu_ticker) = if with_gpu {
            let (s, t) = GpuSampler::manual(GpuSamplerConfig::default(), Box::new(source), epoch);
            (Some(s), Some(Arc::new(Mutex::new(t))))
        } else {
            (None, None)
        };
        let (host, host_ticker) = if with_host {
            let host_source = ScriptedHostSource::new(|_, _| HostReading {
                host_cpu: Some(HOST_CPU),
                process_cpu: Some(PROCESS_CPU),
                process_memory: Some(PROCESS_MEMORY),
                ..HostReading::default()
            });
            let (s, t) =
                HostSampler::manual(HostSamplerConfig::default(), Box::new(host_source), epoch);
            (Some(s), Some(Arc::new(Mutex::new(t))))
        } else {
            (None, None)
        };
        let rig = Self {
            gpu: gpu_ticker,
            host: host_ticker,
            phase,
        };
        (rig, GpuTelemetry::new(gpu, host))
    }

    /// Switches to `phase`'s readings and samples now.
    fn tick(&self, phase: usize) {
        self.phase.store(phase, Ordering::SeqCst);
        let now = Instant::now();
        if let Some(g) = &self.gpu {
            g.lock().unwrap().tick(now);
        }
        if let Some(h) = &self.host {
            h.lock().unwrap().tick(now);
        }
    }
}

/// ~40 ms queued, ~40 ms prefill, 4 tokens ~15 ms apart; a sample at each phase change.
async fn engine(State(rig): State<Rig>, rec: RequestRecorder) -> &'static str {
    let pause = || tokio::time::sleep(Duration::from_millis(20));
    pause().await;
    rig.tick(0);
    pause().await;
    rec.scheduled();
    rig.tick(1);
    pause().await;
    rig.tick(1);
    pause().await;
    rec.prefilled(100);
    rec.tokens(1);
    rig.tick(2);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(15)).await;
        rec.tokens(1);
        rig.tick(2);
    }
    rec.usage(100, 4);
    rec.finish("stop");
    "done"
}

/// Runs one request through `layer` (no sockets: `oneshot`) and returns the finished spans.
async fn one_request(telemetry: &Telemetry, layer: InferenceTraceLayer, rig: Rig) -> Vec<SpanData> {
    rig.tick(0);
    let app = Router::new()
        .route("/v1/chat/completions", post(engine))
        .with_state(rig)
        .layer(layer);
    let req = http::Request::post("/v1/chat/completions")
        .body(Body::from("{}"))
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    telemetry.wait_for_requests(1).await
}

fn phases(spans: &[SpanData]) -> [SpanData; 3] {
    let request = requests(spans)[0].clone();
    ["queue", "prefill", "decode"].map(|name| {
        child(spans, &request, name)
            .unwrap_or_else(|| panic!("no {name} span"))
            .clone()
    })
}

fn gpu_keys(span: &SpanData) -> Vec<String> {
    span.attributes
        .iter()
        .map(|kv| kv.key.as_str().to_owned())
        .filter(|k| k.starts_with("gpu."))
        .collect()
}

#[tokio::test]
async fn scripted_gpu_and_host_counters_land_on_the_right_phase_spans() {
    let telemetry = Telemetry::new();
    let (rig, gpu) = Rig::new(true, true);
    let layer = telemetry.layer().gpu_telemetry(gpu);
    let spans = one_request(&telemetry, layer, rig).await;
    let request = requests(&spans)[0].clone();
    assert!(
        gpu_keys(&request).is_empty(),
        "the request span has no window stats"
    );
    for (i, span) in phases(&spans).iter().enumerate() {
        let name = span.name.to_string();
        let dur = secs(span);
        assert_eq!(attr_str(span, infertrace_semconv::infer::PHASE), name);
        // The sample held at the window's start belongs to the previous phase for the
        // microseconds between the mark and the tick (ms if the thread is preempted): ±0.05
        // still tells the three phases' 0.25 / 1.0 / 0.5 apart.
        assert_close(
            &format!("{name} utilization mean"),
            attr_f64(span, attr_names::UTILIZATION_MEAN),
            UTIL[i],
            0.05,
        );
        assert_eq!(
            attr_i64(span, attr_names::MEMORY_USED_MAX),
            MEMORY[i] as i64,
            "{name}: memory rises phase by phase, so the max is this phase's"
        );
        assert_close(
            &format!("{name} power"),
            attr_f64(span, attr_names::POWER_MEAN),
            WATTS,
            1e-9,
        );
        let energy = attr_f64(span, attr_names::ENERGY);
        assert_close(&format!("{name} energy"), energy, WATTS * dur, 0.02);
        // One request in flight: all the energy of its intervals is its own.
        let attributed = attr_f64(span, attr_names::ENERGY_ATTRIBUTED);
        assert_close(&format!("{name} attributed"), attributed, energy, 0.02);
        assert!(attr_i64(span, attr_names::SAMPLE_COUNT) >= 1, "{name}");
        assert_eq!(
            attr(span, attr_names::UUIDS),
            Some(&Value::Array(Array::String(vec![UUID.into()]))),
            "{name}"
        );
        // Time-weighted means of a constant (through running integrals: float rounding only).
        assert_close(
            "host cpu",
            attr_f64(span, attr_names::HOST_CPU_UTILIZATION_MEAN),
            HOST_CPU,
            1e-9,
        );
        assert_close(
            "process cpu",
            attr_f64(span, attr_names::PROCESS_CPU_UTILIZATION_MEAN),
            PROCESS_CPU,
            1e-9,
        );
        assert_eq!(
            attr_i64(span, attr_names::PROCESS_MEMORY_USAGE_MAX),
            PROCESS_MEMORY as i64
        );
    }
    let [queue, prefill, decode] = phases(&spans);
    assert_close(
        "queue max",
        attr_f64(&queue, attr_names::UTILIZATION_MAX),
        UTIL[0],
        1e-9,
    );
    assert_close(
        "prefill max",
        attr_f64(&prefill, attr_names::UTILIZATION_MAX),
        UTIL[1],
        1e-9,
    );
    assert!(attr_f64(&decode, attr_names::UTILIZATION_MAX) >= UTIL[2]);
    // The hardware metrics were registered on the layer's meter.
    let metrics = telemetry.finished_metrics();
    let names: Vec<String> = metrics
        .iter()
        .flat_map(|rm| rm.scope_metrics())
        .flat_map(|sm| sm.metrics())
        .map(|m| m.name().to_owned())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n == infertrace_semconv::hw::GPU_UTILIZATION),
        "{names:?}"
    );
}

#[tokio::test]
async fn without_telemetry_phase_spans_carry_only_the_phase() {
    let telemetry = Telemetry::new();
    let (rig, _unused) = Rig::new(true, true);
    let spans = one_request(&telemetry, telemetry.layer(), rig).await;
    for span in phases(&spans) {
        let keys: Vec<&str> = span.attributes.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys, [infertrace_semconv::infer::PHASE], "{}", span.name);
    }
}

#[tokio::test]
async fn disabled_telemetry_adds_nothing() {
    let telemetry = Telemetry::new();
    let (rig, _unused) = Rig::new(false, false);
    let layer = telemetry.layer().gpu_telemetry(GpuTelemetry::disabled());
    let spans = one_request(&telemetry, layer, rig).await;
    for span in phases(&spans) {
        assert_eq!(span.attributes.len(), 1, "{:?}", span.attributes);
    }
}

#[tokio::test]
async fn host_counters_without_a_gpu_emit_no_gpu_attributes() {
    let telemetry = Telemetry::new();
    let (rig, gpu) = Rig::new(false, true);
    assert!(gpu.gpu().is_none());
    let spans = one_request(&telemetry, telemetry.layer().gpu_telemetry(gpu), rig).await;
    for span in phases(&spans) {
        assert!(
            gpu_keys(&span).is_empty(),
            "{}: {:?}",
            span.name,
            span.attributes
        );
        assert_close(
            "host cpu",
            attr_f64(&span, attr_names::HOST_CPU_UTILIZATION_MEAN),
            HOST_CPU,
            1e-9,
        );
    }
}
