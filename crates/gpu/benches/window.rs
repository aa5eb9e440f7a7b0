//! Window query cost and the sampler's own CPU use.
//!
//! - `window/10s@100ms/{1,8}gpu`: `GpuSampler::window` over a 10 s window (100 samples per device)
//!   in a 60 s history; `+attributes` adds building the span attributes.
//! - `window/rwlock_vecdeque_baseline`: the same time-weighted fold over a `RwLock<VecDeque>`
//!   copy of the history, the obvious alternative to the seqlock ring (uncontended).
//! - `tick/scripted/{1,8}gpu`: one sampler tick with a scripted source (ring push, energy
//!   counters, attribution over 64 active requests); CPU per second = 10 × this at 100 ms.
//! - After criterion: the sampler *thread's* CPU time (from /proc/thread-self/schedstat, read by
//!   the scripted source on the sampler thread) over 3 s of sampling at 100 ms.

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use infertrace_gpu::*;

fn reading(tick: u64, device: usize) -> DeviceSample {
    let x = ((tick * 7 + device as u64 * 13) % 100) as f64 / 100.0;
    DeviceSample {
        device,
        reading: GpuReading {
            utilization: Some(x),
            memory_used: Some(60_000_000_000 + tick * 1000),
            memory_total: Some(141_000_000_000),
            power_watts: Some(200.0 + 400.0 * x),
            energy_millijoules: Some(tick * 50_000),
            sm_clock_mhz: Some(1980),
            temperature_celsius: Some(60),
            throttle_reasons: Some(0),
        },
        gpm: tick.is_multiple_of(10).then_some(GpmReading {
            sm_activity: Some(x),
            sm_occupancy: Some(x / 2.0),
            tensor_activity: Some(x / 3.0),
            dram_activity: Some(x / 4.0),
        }),
        ..DeviceSample::default()
    }
}

fn source(devices: usize) -> ScriptedSource {
    let infos = (0..devices)
        .map(|i| DeviceInfo::new(i as u32, &format!("GPU-{i:04}"), "H200"))
        .collect();
    ScriptedSource::new(infos, move |tick, _, out| {
        for d in 0..devices {
            out.push(reading(tick, d));
        }
    })
}

/// A sampler with 60 s of history at 100 ms.
fn filled(devices: usize) -> (GpuSampler, Instant) {
    let epoch = Instant::now();
    let (sampler, mut ticker) = GpuSampler::manual(
        GpuSamplerConfig::default(),
        Box::new(source(devices)),
        epoch,
    );
    for k in 0..600u64 {
        ticker.tick(epoch + Duration::from_millis(100 * k));
    }
    (sampler, epoch)
}

fn bench_window(c: &mut Criterion) {
    let mut g = c.benchmark_group("window");
    for devices in [1usize, 8] {
        let (sampler, epoch) = filled(devices);
        // 10 s in the middle, edges between samples.
        let start = epoch + Duration::from_millis(25_050);
        let end = epoch + Duration::from_millis(35_050);
        assert_eq!(
            sampler.window(start, end).map(|w| w.sample_count()),
            Some(101)
        );
        g.bench_function(format!("10s@100ms/{devices}gpu"), |b| {
            b.iter(|| black_box(sampler.window(black_box(start), black_box(end))))
        });
        let (s60, e60) = (epoch, epoch + Duration::from_millis(59_950));
        g.bench_function(format!("60s@100ms/{devices}gpu"), |b| {
            b.iter(|| black_box(sampler.window(black_box(s60), black_box(e60))))
        });
        g.bench_function(format!("10s@100ms/{devices}gpu+attributes"), |b| {
            b.iter(|| {
                let w = sampler.window(black_box(start), black_box(end));
                black_box(w.map(|w| window_attributes(&w)))
            })
        });
    }

    // Baseline: the same fold (3 gauges, time-weighted mean and max) over a RwLock<VecDeque>.
    let history: RwLock<VecDeque<(u64, [f64; 8])>> = RwLock::new(
        (0..600u64)
            .map(|k| {
                let r = reading(k, 0).reading;
                (
                    k * 100_000_000,
                    [
                        r.utilization.unwrap_or(f64::NAN),
                        r.power_watts.unwrap_or(f64::NAN),
                        r.memory_used.map_or(f64::NAN, |m| m as f64),
                        0.0,
                        0.0,
                        0.0,
                        0.0,
                        0.0,
                    ],
                )
            })
            .collect(),
    );
    let (s, e) = (25_050_000_000u64, 35_050_000_000u64);
    g.bench_function("rwlock_vecdeque_baseline/1gpu", |b| {
        b.iter(|| {
            let h = history
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let first = h.partition_point(|(t, _)| *t <= s).saturating_sub(1);
            let (mut w, mut sum, mut max) = (0.0f64, [0.0f64; 3], [f64::MIN; 3]);
            let mut it = h.range(first..).peekable();
            while let Some((t, v)) = it.next() {
                if *t > e {
                    break;
                }
                let next = it.peek().map_or(e, |(nt, _)| *nt);
                let d = (next.min(e).saturating_sub((*t).max(s))) as f64;
                w += d;
                for i in 0..3 {
                    sum[i] += v[i] * d;
                    max[i] = max[i].max(v[i]);
                }
            }
            black_box((sum.map(|x| x / w), max))
        })
    });
    g.finish();
}

fn bench_tick(c: &mut Criterion) {
    let mut g = c.benchmark_group("tick");
    for devices in [1usize, 8] {
        let epoch = Instant::now();
        let (sampler, mut ticker) = GpuSampler::manual(
            GpuSamplerConfig::default(),
            Box::new(source(devices)),
            epoch,
        );
        let requests: Vec<RequestEnergy> = (0..64)
            .map(|_| sampler.attribution().begin_request())
            .collect();
        let mut k = 0u64;
        g.bench_function(format!("scripted/{devices}gpu+64requests"), |b| {
            b.iter(|| {
                for r in &requests {
                    r.tokens(1);
                }
                k += 1;
                ticker.tick(epoch + Duration::from_millis(100 * k));
            })
        });
    }
    g.finish();
}

/// CPU time of the calling thread, ns (Linux).
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn sampler_thread_cpu() {
    let cpu: Arc<Mutex<Vec<(Instant, u64)>>> = Arc::default();
    let cpu2 = Arc::clone(&cpu);
    let infos = vec![DeviceInfo::new(0, "GPU-0000", "H200")];
    // Thread CPU read at tick 0 and tick 30 only (reading /proc costs more than a tick).
    let src = ScriptedSource::new(infos, move |tick, now, out| {
        out.push(reading(tick, 0));
        if (tick == 0 || tick == 30)
            && let Some(ns) = thread_cpu_ns()
        {
            cpu2.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((now, ns));
        }
    });
    let sampler = GpuSampler::with_source(GpuSamplerConfig::default(), Box::new(src));
    let requests: Vec<RequestEnergy> = (0..64)
        .map(|_| sampler.attribution().begin_request())
        .collect();
    let until = Instant::now() + Duration::from_millis(3300);
    while Instant::now() < until {
        for r in &requests {
            r.tokens(1);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(sampler);
    let v = cpu
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match (v.first(), v.last()) {
        (Some((t0, c0)), Some((t1, c1))) if t1 > t0 => {
            let wall = t1.duration_since(*t0).as_secs_f64();
            let per_s = (c1 - c0) as f64 / 1e3 / wall;
            println!(
                "sampler thread CPU (scripted source, 1 GPU, 64 requests, 100 ms, wake-ups included): {per_s:.1} µs per second of sampling over 30 ticks ({:.4}% of a core)",
                per_s / 1e4
            );
        }
        _ => println!("sampler thread CPU: /proc/thread-self/schedstat not readable"),
    }
}

criterion_group!(benches, bench_window, bench_tick);

fn main() {
    benches();
    sampler_thread_cpu();
    Criterion::default().configure_from_args().final_summary();
}
