//! The samplers through their public API, with scripted sources and hand-computed expectations.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use infertrace_gpu::*;
use infertrace_semconv::{gpu, hw};
use opentelemetry::metrics::MeterProvider;
use opentelemetry::{Array, KeyValue, Value};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

fn approx(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-9, "{a} != {b}");
}

fn at(epoch: Instant, ms: u64) -> Instant {
    epoch + Duration::from_millis(ms)
}

fn sample(device: usize, reading: GpuReading) -> DeviceSample {
    DeviceSample {
        device,
        reading,
        ..DeviceSample::default()
    }
}

fn attrs_map(attrs: &[KeyValue]) -> BTreeMap<String, Value> {
    attrs
        .iter()
        .map(|kv| (kv.key.to_string(), kv.value.clone()))
        .collect()
}

fn f(map: &BTreeMap<String, Value>, key: &str) -> f64 {
    match map.get(key) {
        Some(Value::F64(v)) => *v,
        other => panic!("{key}: {other:?}"),
    }
}

fn i(map: &BTreeMap<String, Value>, key: &str) -> i64 {
    match map.get(key) {
        Some(Value::I64(v)) => *v,
        other => panic!("{key}: {other:?}"),
    }
}

/// One device, ticks every 100 ms at 0, 100, 200, 300 ms:
/// utilisation 0.2 0.4 0.6 0.8, power 100 200 300 300 W, energy counter 0 10 30 60 J (in mJ,
/// from a non-zero base), memory 1 2 4 3 GB.
fn four_ticks() -> (GpuSampler, Instant) {
    let epoch = Instant::now();
    let util = [0.2, 0.4, 0.6, 0.8];
    let power = [100.0, 200.0, 300.0, 300.0];
    let energy = [0u64, 10_000, 30_000, 60_000];
    let mem = [1u64, 2, 4, 3];
    let ticks = (0..4)
        .map(|k| {
            vec![sample(
                0,
                GpuReading {
                    utilization: Some(util[k]),
                    power_watts: Some(power[k]),
                    energy_millijoules: Some(5_000_000 + energy[k]),
                    memory_used: Some(mem[k] * 1_000_000_000),
                    memory_total: Some(141_000_000_000),
                    ..GpuReading::default()
                },
            )]
        })
        .collect();
    let source = ScriptedSource::from_ticks(vec![DeviceInfo::new(0, "GPU-aaaa", "H200")], ticks);
    let (sampler, mut ticker) =
        GpuSampler::manual(GpuSamplerConfig::default(), Box::new(source), epoch);
    for k in 0..4 {
        ticker.tick(at(epoch, k * 100));
    }
    (sampler, epoch)
}

#[test]
fn window_straddling_both_edges_matches_hand_computation() {
    let (sampler, epoch) = four_ticks();
    assert!(sampler.available());
    assert_eq!(sampler.ticks(), 4);
    let w = sampler.window(at(epoch, 50), at(epoch, 250)).unwrap();
    assert_eq!(w.sample_count(), 3);
    // (0.2 × 50 + 0.4 × 100 + 0.6 × 50) / 200
    approx(w.utilization_mean().unwrap(), 0.4);
    approx(w.utilization_max().unwrap(), 0.6);
    // (100 × 50 + 200 × 100 + 300 × 50) / 200
    approx(w.power_mean().unwrap(), 200.0);
    // E(250) − E(50) = 45 − 5
    approx(w.energy_joules().unwrap(), 40.0);
    assert_eq!(w.memory_used_max(), Some(4_000_000_000));
    assert_eq!(w.sm_activity_mean(), None);

    let a = attrs_map(&window_attributes(&w));
    approx(f(&a, gpu::UTILIZATION_MEAN), 0.4);
    approx(f(&a, gpu::UTILIZATION_MAX), 0.6);
    approx(f(&a, gpu::POWER_MEAN), 200.0);
    approx(f(&a, gpu::ENERGY), 40.0);
    assert_eq!(i(&a, gpu::MEMORY_USED_MAX), 4_000_000_000);
    assert_eq!(i(&a, gpu::SAMPLE_COUNT), 3);
    assert_eq!(
        a.get(gpu::UUIDS),
        Some(&Value::Array(Array::String(vec!["GPU-aaaa".into()])))
    );
    // No GPM: no SM activity attribute rather than a zero.
    assert!(!a.contains_key(gpu::SM_ACTIVITY_MEAN));
    assert_eq!(a.len(), 7);
}

#[test]
fn empty_window_and_one_sample() {
    let (sampler, epoch) = four_ticks();
    // Entirely after the hold of the last sample (300 ms + 5 × 100 ms).
    assert!(sampler.window(at(epoch, 900), at(epoch, 1000)).is_none());
    // Inverted.
    assert!(sampler.window(at(epoch, 200), at(epoch, 100)).is_none());
    // One sample: [120, 180] sees only the sample held from 100 ms.
    let w = sampler.window(at(epoch, 120), at(epoch, 180)).unwrap();
    assert_eq!(w.sample_count(), 1);
    approx(w.utilization_mean().unwrap(), 0.4);
    approx(w.power_mean().unwrap(), 200.0);
    // The 100→200 pair spreads 20 J over 100 ms: 60 ms of it.
    approx(w.energy_joules().unwrap(), 12.0);
}

#[test]
fn energy_counter_wrap_and_reset_through_the_sampler() {
    let epoch = Instant::now();
    // Raw counter (mJ): 64-bit wrap between ticks 1 and 2, driver reset between 3 and 4.
    let raw = [
        u64::MAX - 19_999, // t=0
        u64::MAX - 9_999,  // +10 J
        10_000,            // +20 J across the wrap
        40_000,            // +30 J
        5_000,             // reset: +5 J since the reset
        15_000,            // +10 J
    ];
    let ticks = raw
        .iter()
        .map(|mj| {
            vec![sample(
                0,
                GpuReading {
                    energy_millijoules: Some(*mj),
                    ..GpuReading::default()
                },
            )]
        })
        .collect();
    let source = ScriptedSource::from_ticks(vec![DeviceInfo::new(0, "GPU-w", "w")], ticks);
    let (sampler, mut ticker) =
        GpuSampler::manual(GpuSamplerConfig::default(), Box::new(source), epoch);
    for k in 0..6 {
        ticker.tick(at(epoch, k * 100));
    }
    let w = sampler.window(at(epoch, 0), at(epoch, 500)).unwrap();
    approx(w.energy_joules().unwrap(), 75.0);
    // Across the wrap only: [50, 150] = 5 J + 10 J.
    let w = sampler.window(at(epoch, 50), at(epoch, 150)).unwrap();
    approx(w.energy_joules().unwrap(), 15.0);
    // Across the reset only: [350, 450] = 2.5 J + 5 J.
    let w = sampler.window(at(epoch, 350), at(epoch, 450)).unwrap();
    approx(w.energy_joules().unwrap(), 7.5);
    // No utilisation, power or memory were measured: only energy, count and UUIDs.
    let a = attrs_map(&window_attributes(&w));
    let keys: Vec<&str> = a.keys().map(String::as_str).collect();
    assert_eq!(keys, vec![gpu::ENERGY, gpu::SAMPLE_COUNT, gpu::UUIDS]);
}

#[test]
fn two_devices_aggregate_and_a_lost_one_drops_out() {
    let epoch = Instant::now();
    let devices = vec![
        DeviceInfo::new(0, "GPU-0", "H200"),
        DeviceInfo::new(1, "GPU-1", "H200"),
    ];
    // Device 1 is lost from tick 3 on.
    let source = ScriptedSource::new(devices, |tick, _, out| {
        out.push(sample(
            0,
            GpuReading {
                utilization: Some(0.2),
                power_watts: Some(100.0),
                memory_used: Some(10),
                ..GpuReading::default()
            },
        ));
        if tick < 3 {
            out.push(sample(
                1,
                GpuReading {
                    utilization: Some(0.6),
                    power_watts: Some(300.0),
                    memory_used: Some(30),
                    ..GpuReading::default()
                },
            ));
        } else {
            out.push(DeviceSample {
                device: 1,
                lost: true,
                ..DeviceSample::default()
            });
        }
    });
    let (sampler, mut ticker) =
        GpuSampler::manual(GpuSamplerConfig::default(), Box::new(source), epoch);
    for k in 0..12 {
        ticker.tick(at(epoch, k * 100));
    }
    let w = sampler.window(at(epoch, 0), at(epoch, 200)).unwrap();
    assert_eq!(w.devices.len(), 2);
    approx(w.utilization_mean().unwrap(), 0.4); // mean of 0.2 and 0.6
    approx(w.utilization_max().unwrap(), 0.6);
    approx(w.power_mean().unwrap(), 400.0); // total
    assert_eq!(w.memory_used_max(), Some(40));
    // Power × time without energy counters: 400 W × 0.2 s.
    approx(w.energy_joules().unwrap(), 80.0);
    let uuids: Vec<&str> = w.uuids().map(|u| u.as_ref()).collect();
    assert_eq!(uuids, vec!["GPU-0", "GPU-1"]);
    // Device 1's last sample (200 ms) is held 500 ms at most: gone from [800, 1100].
    let w = sampler.window(at(epoch, 800), at(epoch, 1100)).unwrap();
    assert_eq!(w.devices.len(), 1);
    let latest = sampler.latest();
    assert!(
        latest
            .iter()
            .any(|l| l.info.uuid.as_ref() == "GPU-1" && l.lost)
    );
    assert!(
        latest
            .iter()
            .any(|l| l.info.uuid.as_ref() == "GPU-0" && !l.lost)
    );
}

#[test]
fn gpm_sm_activity_at_one_second() {
    let epoch = Instant::now();
    let source = ScriptedSource::new(vec![DeviceInfo::new(0, "GPU-h", "H200")], |tick, _, out| {
        let mut s = sample(
            0,
            GpuReading {
                utilization: Some(1.0),
                ..GpuReading::default()
            },
        );
        // Every 10th tick closes a GPM interval: 0.3, then 0.7.
        if tick.is_multiple_of(10) {
            s.gpm = Some(GpmReading {
                sm_activity: Some(if tick < 10 { 0.3 } else { 0.7 }),
                ..GpmReading::default()
            });
        }
        out.push(s);
    });
    let (sampler, mut ticker) =
        GpuSampler::manual(GpuSamplerConfig::default(), Box::new(source), epoch);
    for k in 0..20 {
        ticker.tick(at(epoch, k * 100));
    }
    // [500, 1500]: 0.3 held 500 ms, 0.7 held 500 ms.
    let w = sampler.window(at(epoch, 500), at(epoch, 1500)).unwrap();
    approx(w.sm_activity_mean().unwrap(), 0.5);
    approx(w.utilization_mean().unwrap(), 1.0);
    let a = attrs_map(&window_attributes(&w));
    approx(f(&a, gpu::SM_ACTIVITY_MEAN), 0.5);
}

#[test]
fn attribution_through_sampler_ticks_and_telemetry_attributes() {
    let epoch = Instant::now();
    // 300 W constant, counter +30 J per 100 ms tick.
    let source = ScriptedSource::new(vec![DeviceInfo::new(0, "GPU-e", "H200")], |tick, _, out| {
        out.push(sample(
            0,
            GpuReading {
                utilization: Some(0.9),
                power_watts: Some(300.0),
                energy_millijoules: Some(tick * 30_000),
                memory_used: Some(7),
                ..GpuReading::default()
            },
        ));
    });
    let (sampler, mut ticker) =
        GpuSampler::manual(GpuSamplerConfig::default(), Box::new(source), epoch);
    let host_source = ScriptedHostSource::new(|tick, _| HostReading {
        host_cpu: Some(0.25),
        process_cpu: Some(0.125),
        process_memory: Some(1 << 30),
        network_received: Some(tick * 1000),
        ..HostReading::default()
    });
    let (host, mut host_ticker) =
        HostSampler::manual(HostSamplerConfig::default(), Box::new(host_source), epoch);
    let telemetry = GpuTelemetry::new(Some(sampler.clone()), Some(host));
    assert!(telemetry.gpu_unavailable().is_none());

    ticker.tick(at(epoch, 0));
    host_ticker.tick(at(epoch, 0));
    let a = telemetry.begin_request().unwrap();
    let b = telemetry.begin_request().unwrap();
    // (0, 100]: a 3 tokens, b 1 → 22.5 J / 7.5 J.
    a.tokens(3);
    b.tokens(1);
    ticker.tick(at(epoch, 100));
    // (100, 200]: only a → 30 J.
    a.tokens(5);
    ticker.tick(at(epoch, 200));
    host_ticker.tick(at(epoch, 200));
    approx(a.attributed(), 52.5);
    approx(b.attributed(), 7.5);
    approx(a.attributed() + b.attributed(), 60.0);

    let mut out = Vec::new();
    telemetry.phase_attributes(at(epoch, 100), at(epoch, 200), Some(&a), &mut out);
    let m = attrs_map(&out);
    approx(f(&m, gpu::ENERGY), 30.0);
    approx(f(&m, gpu::ENERGY_ATTRIBUTED), 30.0);
    approx(f(&m, gpu::UTILIZATION_MEAN), 0.9);
    approx(f(&m, gpu::HOST_CPU_UTILIZATION_MEAN), 0.25);
    approx(f(&m, gpu::PROCESS_CPU_UTILIZATION_MEAN), 0.125);
    assert_eq!(i(&m, gpu::PROCESS_MEMORY_USAGE_MAX), 1 << 30);
    let keys: Vec<&str> = m.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        vec![
            gpu::ENERGY,
            gpu::ENERGY_ATTRIBUTED,
            gpu::MEMORY_USED_MAX,
            gpu::POWER_MEAN,
            gpu::SAMPLE_COUNT,
            gpu::UTILIZATION_MAX,
            gpu::UTILIZATION_MEAN,
            gpu::UUIDS,
            gpu::HOST_CPU_UTILIZATION_MEAN,
            gpu::PROCESS_CPU_UTILIZATION_MEAN,
            gpu::PROCESS_MEMORY_USAGE_MAX,
        ]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>()
    );
    // Prefill-like window for b, half of the first interval: 7.5 / 2.
    let mut out = Vec::new();
    telemetry.phase_attributes(at(epoch, 50), at(epoch, 100), Some(&b), &mut out);
    approx(f(&attrs_map(&out), gpu::ENERGY_ATTRIBUTED), 3.75);
}

#[test]
fn no_nvml_means_no_gpu_attributes_and_no_metrics() {
    let sampler = GpuSampler::start(GpuSamplerConfig {
        nvml_library: Some("/nonexistent/libnvidia-ml.so.1".into()),
        ..GpuSamplerConfig::default()
    });
    assert!(!sampler.available());
    assert!(matches!(
        sampler.unavailable_reason(),
        Some(GpuUnavailable::LibraryNotFound(_))
    ));
    let now = Instant::now();
    assert!(sampler.window(now - Duration::from_secs(1), now).is_none());
    assert!(sampler.latest().is_empty());

    let telemetry = GpuTelemetry::new(Some(sampler.clone()), None);
    assert!(telemetry.gpu().is_none());
    assert!(telemetry.begin_request().is_none());
    let mut out = Vec::new();
    telemetry.phase_attributes(now - Duration::from_secs(1), now, None, &mut out);
    assert!(out.is_empty());

    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    assert!(!register_gpu_metrics(&sampler, &provider.meter("test")));
    provider.force_flush().unwrap();
    let names = metric_names(&exporter);
    assert!(names.iter().all(|n| !n.starts_with("hw.")), "{names:?}");
}

#[test]
fn default_start_on_this_machine_reports_why_nvml_is_off() {
    let sampler = GpuSampler::start(GpuSamplerConfig::default());
    if sampler.available() {
        // A machine with a GPU: the sampler must produce samples.
        let started = Instant::now();
        while sampler.ticks() < 2 && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(sampler.ticks() >= 2);
    } else {
        let reason = sampler.unavailable_reason().unwrap();
        assert!(!reason.to_string().is_empty());
    }
}

#[test]
fn threaded_sampler_runs_on_its_own_named_thread() {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen2 = Arc::clone(&seen);
    // Set when the sampler thread drops its source, i.e. when the thread has ended.
    let gone = Arc::new(AtomicBool::new(false));
    let on_drop = SetOnDrop(Arc::clone(&gone));
    let source = ScriptedSource::new(vec![DeviceInfo::new(0, "GPU-t", "t")], move |_, _, out| {
        let _ = &on_drop;
        let name = std::thread::current().name().unwrap_or("").to_string();
        seen2.lock().unwrap().push(name);
        out.push(sample(
            0,
            GpuReading {
                utilization: Some(0.5),
                ..GpuReading::default()
            },
        ));
    });
    let config = GpuSamplerConfig {
        interval: Duration::from_millis(5),
        ..GpuSamplerConfig::default()
    };
    let sampler = GpuSampler::with_source(config, Box::new(source));
    let started = Instant::now();
    while sampler.ticks() < 5 && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(sampler.ticks() >= 5);
    // Every tick so far (a busy machine may leave no tick in any short recent window).
    let w = sampler.window(started, Instant::now()).unwrap();
    approx(w.utilization_mean().unwrap(), 0.5);
    let report = sampler.last_tick();
    assert!(report.tick >= 5);
    assert_eq!(report.samples.len(), 1);
    drop(sampler);
    // The thread stops once the last handle is gone: it ends and drops its source.
    let dropped_at = Instant::now();
    while !gone.load(Ordering::Acquire) && dropped_at.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        gone.load(Ordering::Acquire),
        "sampler still running 10 s after drop"
    );
    assert!(seen.lock().unwrap().iter().all(|t| t == GPU_SAMPLER_THREAD));
}

/// Sets its flag when dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

fn metric_names(exporter: &InMemoryMetricExporter) -> Vec<String> {
    let mut names = Vec::new();
    for rm in exporter.get_finished_metrics().unwrap() {
        for sm in rm.scope_metrics() {
            for m in sm.metrics() {
                names.push(m.name().to_string());
            }
        }
    }
    names
}

#[test]
fn hardware_metrics_carry_the_device_attributes() {
    let epoch = Instant::now();
    let mut info = DeviceInfo::new(0, "GPU-m", "NVIDIA H200");
    info.memory_total = Some(141);
    let source = ScriptedSource::new(vec![info], |tick, _, out| {
        out.push(sample(
            0,
            GpuReading {
                utilization: Some(0.75),
                memory_used: Some(100),
                memory_total: Some(141),
                power_watts: Some(450.0),
                energy_millijoules: Some(tick * 45_000),
                temperature_celsius: Some(61),
                ..GpuReading::default()
            },
        ));
    });
    let (sampler, mut ticker) =
        GpuSampler::manual(GpuSamplerConfig::default(), Box::new(source), epoch);
    let now = Instant::now();
    ticker.tick(now);
    ticker.tick(now + Duration::from_millis(100));

    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    assert!(register_gpu_metrics(&sampler, &provider.meter("test")));
    provider.force_flush().unwrap();

    let mut found = BTreeMap::new();
    for rm in exporter.get_finished_metrics().unwrap() {
        for sm in rm.scope_metrics() {
            for m in sm.metrics() {
                let (value, attrs): (f64, Vec<KeyValue>) = match m.data() {
                    AggregatedMetrics::F64(MetricData::Gauge(g)) => {
                        let p = g.data_points().next().unwrap();
                        (p.value(), p.attributes().cloned().collect())
                    }
                    AggregatedMetrics::F64(MetricData::Sum(s)) => {
                        let p = s.data_points().next().unwrap();
                        (p.value(), p.attributes().cloned().collect())
                    }
                    AggregatedMetrics::I64(MetricData::Sum(s)) => {
                        let p = s.data_points().next().unwrap();
                        (p.value() as f64, p.attributes().cloned().collect())
                    }
                    other => panic!("{}: {other:?}", m.name()),
                };
                found.insert(m.name().to_string(), (value, attrs_map(&attrs)));
            }
        }
    }
    let names: Vec<&str> = found.keys().map(String::as_str).collect();
    let mut expected = vec![
        hw::ENERGY,
        hw::GPU_MEMORY_LIMIT,
        hw::GPU_MEMORY_USAGE,
        hw::GPU_UTILIZATION,
        hw::POWER,
        hw::TEMPERATURE,
    ];
    expected.sort();
    assert_eq!(names, expected);
    let (util, a) = &found[hw::GPU_UTILIZATION];
    approx(*util, 0.75);
    assert_eq!(a.get(hw::ID), Some(&Value::from("GPU-m")));
    assert_eq!(a.get(hw::TYPE), Some(&Value::from(HW_TYPE_GPU)));
    assert_eq!(a.get(hw::NAME), Some(&Value::from("NVIDIA H200")));
    assert_eq!(a.get(hw::VENDOR), Some(&Value::from(HW_VENDOR_NVIDIA)));
    assert_eq!(a.get(hw::GPU_TASK), Some(&Value::from(HW_GPU_TASK_GENERAL)));
    let (temp, a) = &found[hw::TEMPERATURE];
    approx(*temp, 61.0);
    assert!(a.contains_key(hw::SENSOR_LOCATION));
    approx(found[hw::POWER].0, 450.0);
    approx(found[hw::ENERGY].0, 45.0);
    approx(found[hw::GPU_MEMORY_USAGE].0, 100.0);
    approx(found[hw::GPU_MEMORY_LIMIT].0, 141.0);
}

#[test]
fn back_to_back_phases_get_their_own_statistics() {
    // The way the layer will call it: arrival + phase offsets, one call per phase.
    // Idle (0 %, 100 W) until 300 ms, prefill-like (50 %, 400 W) until 500 ms, then decode-like
    // (100 %, 600 W); the counter follows the power exactly.
    let epoch = Instant::now();
    let level = |t_ms: u64| match t_ms {
        0..300 => (0.0, 100.0),
        300..500 => (0.5, 400.0),
        _ => (1.0, 600.0),
    };
    let source = ScriptedSource::new(
        vec![DeviceInfo::new(0, "GPU-p", "H200")],
        move |tick, _, out| {
            let t = tick * 100;
            // Energy at t: ∫ power over [0, t].
            let energy_j: f64 = (0..tick).map(|k| level(k * 100).1 * 0.1).sum();
            let (util, power) = level(t);
            out.push(sample(
                0,
                GpuReading {
                    utilization: Some(util),
                    power_watts: Some(power),
                    energy_millijoules: Some((energy_j * 1000.0).round() as u64),
                    ..GpuReading::default()
                },
            ));
        },
    );
    let (sampler, mut ticker) =
        GpuSampler::manual(GpuSamplerConfig::default(), Box::new(source), epoch);
    let telemetry = GpuTelemetry::new(Some(sampler.clone()), None);
    ticker.tick(at(epoch, 0));
    let request = telemetry.begin_request().unwrap();
    for k in 1..=15u64 {
        // The request processes 1 token per interval after it is scheduled at 300 ms.
        if k * 100 > 300 {
            request.tokens(1);
        }
        ticker.tick(at(epoch, k * 100));
    }
    let arrival = epoch;
    let phases = [
        ("queue", 0, 300),
        ("prefill", 300, 500),
        ("decode", 500, 1500),
    ];
    let mut total_energy = 0.0;
    let mut total_attributed = 0.0;
    let mut counts = 0;
    for (name, s, e) in phases {
        let (start, end) = (
            arrival + Duration::from_millis(s),
            arrival + Duration::from_millis(e),
        );
        let mut out = Vec::new();
        telemetry.phase_attributes(start, end, Some(&request), &mut out);
        let m = attrs_map(&out);
        let (util, power) = level(s);
        approx(f(&m, gpu::UTILIZATION_MEAN), util);
        approx(f(&m, gpu::UTILIZATION_MAX), util);
        approx(f(&m, gpu::POWER_MEAN), power);
        let energy = f(&m, gpu::ENERGY);
        approx(energy, power * (e - s) as f64 / 1000.0);
        total_energy += energy;
        total_attributed += f(&m, gpu::ENERGY_ATTRIBUTED);
        counts += i(&m, gpu::SAMPLE_COUNT);
        assert!(!m.contains_key(gpu::SM_ACTIVITY_MEAN), "{name}");
    }
    // The phases tile [0, 1500]: every sample counted once, energy split exactly.
    assert_eq!(counts, 15);
    approx(total_energy, 30.0 + 80.0 + 600.0);
    // Only request active: every interval's energy went to it (the idle queue interval (0, 300]
    // had no token but one active request, so it was split equally — to it).
    approx(request.attributed(), total_energy);
    approx(total_attributed, total_energy);
}

/// A sampler over `source`, ticked at 0, 100, …, 100 × `last` ms after `epoch`.
fn ticked_every_100ms(source: ScriptedSource, epoch: Instant, last: u64) -> GpuSampler {
    let (sampler, mut ticker) =
        GpuSampler::manual(GpuSamplerConfig::default(), Box::new(source), epoch);
    for k in 0..=last {
        ticker.tick(at(epoch, 100 * k));
    }
    sampler
}

/// The energy of the window from `a` to `b` ms after `epoch`.
fn window_energy(sampler: &GpuSampler, epoch: Instant, a: u64, b: u64) -> f64 {
    sampler
        .window(at(epoch, a), at(epoch, b))
        .unwrap()
        .energy_joules()
        .unwrap()
}

/// The energy counter read once a second (ticks 0, 10 and 20 of 100 ms), 300 W of instant power
/// throughout: between reads the total follows power × time, each read brings it back to the
/// counter, and it never decreases — so windows keep the power's shape, long windows and the
/// attributed energy add up to the counter.
#[test]
fn a_counter_read_once_a_second_is_carried_between_reads_by_instant_power() {
    let epoch = Instant::now();
    // The counter: +310 J over the first second, +250 J over the second (the power reads 300 W).
    let counter_mj = |tick: u64| match tick {
        0 => Some(1_000_000),
        10 => Some(1_310_000),
        20 => Some(1_560_000),
        _ => None,
    };
    let source = ScriptedSource::new(
        vec![DeviceInfo::new(0, "GPU-s", "H200")],
        move |tick, _, out| {
            out.push(sample(
                0,
                GpuReading {
                    power_watts: Some(300.0),
                    energy_millijoules: counter_mj(tick),
                    ..GpuReading::default()
                },
            ));
        },
    );
    let (sampler, mut ticker) =
        GpuSampler::manual(GpuSamplerConfig::default(), Box::new(source), epoch);
    let request = sampler.attribution().begin_request();
    request.tokens(1);
    for k in 0..=21 {
        ticker.tick(at(epoch, 100 * k));
    }
    let energy = |a: u64, b: u64| window_energy(&sampler, epoch, a, b);
    // Half a second: power × time. The whole first second: the counter's 310 J.
    approx(energy(0, 500), 150.0);
    approx(energy(0, 1000), 310.0);
    // The second second's power (300 J) passes its counter (250 J): the total stays at 580 J
    // from tick 19 until the counter catches up (tick 21: 560 + 30 = 590), so over both
    // seconds and the tick after it is the counter's 560 J + 30 J.
    approx(energy(1000, 1900), 270.0);
    approx(energy(1900, 2000), 0.0);
    approx(energy(0, 2100), 590.0);
    approx(request.attributed(), 590.0);
}

/// A tick without a power reading holds the last one (for at most the hold), so the energy
/// between counter reads does not lose those ticks.
#[test]
fn a_missing_power_reading_is_held_between_counter_reads() {
    let epoch = Instant::now();
    let source = ScriptedSource::new(vec![DeviceInfo::new(0, "GPU-p", "H200")], |tick, _, out| {
        out.push(sample(
            0,
            GpuReading {
                power_watts: (!matches!(tick, 3 | 4)).then_some(300.0),
                energy_millijoules: match tick {
                    0 => Some(0),
                    10 => Some(300_000),
                    _ => None,
                },
                ..GpuReading::default()
            },
        ));
    });
    let sampler = ticked_every_100ms(source, epoch, 10);
    let energy = |a: u64, b: u64| window_energy(&sampler, epoch, a, b);
    approx(energy(0, 900), 270.0);
    approx(energy(300, 600), 90.0);
    approx(energy(0, 1000), 300.0);
}

/// A device lost after an estimate that ran ahead of its counter comes back below the total
/// already written: the total holds there, so windows still add up and never go negative.
#[test]
fn a_device_lost_and_back_never_takes_its_energy_total_down() {
    let epoch = Instant::now();
    let source = ScriptedSource::new(vec![DeviceInfo::new(0, "GPU-l", "H200")], |tick, _, out| {
        if tick == 11 {
            out.push(DeviceSample {
                device: 0,
                lost: true,
                ..DeviceSample::default()
            });
            return;
        }
        // 300 W of power, but the counter says 100 J in the first second and 10 J after.
        let counter = match tick {
            0 => Some(1_000_000),
            10 => Some(1_100_000),
            12 => Some(1_110_000),
            _ => None,
        };
        out.push(sample(
            0,
            GpuReading {
                power_watts: Some(300.0),
                energy_millijoules: counter,
                ..GpuReading::default()
            },
        ));
    });
    let sampler = ticked_every_100ms(source, epoch, 13);
    let energy = |a: u64, b: u64| window_energy(&sampler, epoch, a, b);
    approx(energy(0, 1000), 270.0);
    approx(energy(1000, 1300), 0.0);
    approx(energy(0, 1300), energy(0, 1000) + energy(1000, 1300));
}
