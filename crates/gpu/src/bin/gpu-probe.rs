//! `gpu-probe`: starts the GPU sampler and prints what it finds as JSON lines — the devices, then
//! N samples with the time each NVML call took, then the window statistics over the run, then a
//! summary (per-device readings, lost ticks, GPM readings and GPM errors, and the verdict).
//!
//! A tick counts as measured only when a device gave a real reading (a counter or a GPM metric,
//! not just a sample that was not lost). Exit status: 0 when every device gave readings, or when
//! NVML is not available on this machine and no GPU was expected (said on stderr and as a JSON
//! line); 1 when NVML loaded but a device gave no reading, or when no GPU was found and
//! `--expect-gpu` was given; 2 on bad arguments.
//!
//! ```text
//! gpu-probe [--samples N] [--interval-ms MS] [--library PATH] [--expect-gpu]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use infertrace_gpu::{
    CallTimings, DeviceSample, GpuSampler, GpuSamplerConfig, ProbeTally, ProbeVerdict, TickReport,
    unavailable_verdict, window_attributes,
};
use serde_json::{Value, json};

struct Args {
    samples: u64,
    interval: Duration,
    library: Option<PathBuf>,
    expect_gpu: bool,
}

/// `--help`.
const HELP: &str = "\
gpu-probe: starts infertrace's GPU sampler (NVML) and prints JSON lines: the devices, each
sample with the time every NVML call took, the window statistics over the run, and a summary
with the verdict.

usage: gpu-probe [OPTIONS]

  --samples N          ticks to take (default 20)
  --interval-ms MS     time between ticks (default 100)
  --library PATH       the NVML library to load (default: the system's libnvidia-ml.so.1)
  --expect-gpu         exit 1 when no GPU or no NVML is found, instead of 0
  -h, --help           this text

Exit status: 0 when every device gave readings (or no NVML and no --expect-gpu), 1 when a
device gave none or an expected GPU is missing, 2 on bad arguments.
";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        samples: 20,
        interval: Duration::from_millis(100),
        library: None,
        expect_gpu: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--samples" => {
                let v = value("--samples")?;
                args.samples = v
                    .parse()
                    .map_err(|_| format!("--samples: not a number: {v}"))?;
            }
            "--interval-ms" => {
                let v = value("--interval-ms")?;
                let ms: u64 = v
                    .parse()
                    .map_err(|_| format!("--interval-ms: not a number: {v}"))?;
                args.interval = Duration::from_millis(ms.max(1));
            }
            "--library" => args.library = Some(PathBuf::from(value("--library")?)),
            "--expect-gpu" => args.expect_gpu = true,
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}; try --help")),
        }
    }
    Ok(args)
}

fn timings(t: &CallTimings) -> Value {
    json!({
        "utilization": t.utilization_us,
        "memory_info": t.memory_us,
        "field_values": t.field_values_us,
        "power_usage": t.power_usage_us,
        "sm_clock": t.sm_clock_us,
        "temperature": t.temperature_us,
        "throttle_reasons": t.throttle_us,
        "gpm": t.gpm_us,
    })
}

fn device_sample(s: &DeviceSample, uuid: &str) -> Value {
    let r = &s.reading;
    json!({
        "uuid": uuid,
        "lost": s.lost,
        "utilization": r.utilization,
        "memory_used": r.memory_used,
        "memory_total": r.memory_total,
        "power_watts": r.power_watts,
        "energy_millijoules": r.energy_millijoules,
        "sm_clock_mhz": r.sm_clock_mhz,
        "temperature_celsius": r.temperature_celsius,
        "throttle_reasons": r.throttle_reasons,
        "gpm": s.gpm.map(|g| json!({
            "sm_activity": g.sm_activity,
            "sm_occupancy": g.sm_occupancy,
            "tensor_activity": g.tensor_activity,
            "dram_activity": g.dram_activity,
        })),
        "gpm_errors": s.gpm_errors,
        "has_reading": s.has_reading(),
        "call_us": timings(&s.timings),
    })
}

fn tick_line(report: &TickReport, uuids: &[String], since: Instant) -> Value {
    let devices: Vec<Value> = report
        .samples
        .iter()
        .map(|s| device_sample(s, uuids.get(s.device).map_or("?", String::as_str)))
        .collect();
    json!({
        "tick": report.tick,
        "t_ms": report.at.map(|a| a.saturating_duration_since(since).as_secs_f64() * 1000.0),
        "tick_us": report.duration_us,
        "devices": devices,
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gpu-probe: {e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let sampler = GpuSampler::start(GpuSamplerConfig {
        interval: args.interval,
        nvml_library: args.library,
        ..GpuSamplerConfig::default()
    });
    let init_ms = started.elapsed().as_secs_f64() * 1000.0;
    if let Some(reason) = sampler.unavailable_reason() {
        let verdict = unavailable_verdict(reason, args.expect_gpu);
        println!(
            "{}",
            json!({"nvml": "unavailable", "reason": reason.to_string(), "init_ms": init_ms,
                   "expect_gpu": args.expect_gpu, "verdict": verdict.label()})
        );
        eprintln!("gpu-probe: {reason} ({})", verdict.label());
        return ExitCode::from(verdict.exit_code());
    }
    println!("{}", json!({"nvml": "loaded", "init_ms": init_ms}));
    let uuids: Vec<String> = sampler.devices().map(|d| d.uuid.to_string()).collect();
    for d in sampler.devices() {
        println!(
            "{}",
            json!({"device": {
                "index": d.index,
                "uuid": d.uuid.as_ref(),
                "name": d.name.as_ref(),
                "memory_total": d.memory_total,
                "mig_enabled": d.mig_enabled,
                "gpm_supported": d.gpm_supported,
                "driver_version": d.driver_version.as_deref(),
            }})
        );
    }

    let first = Instant::now();
    let budget = args
        .interval
        .saturating_mul(u32::try_from(args.samples.saturating_mul(3)).unwrap_or(u32::MAX))
        .saturating_add(Duration::from_secs(5));
    let deadline = first
        .checked_add(budget)
        .unwrap_or(first + Duration::from_secs(3600));
    let mut printed = 0u64;
    let mut last_tick = 0u64;
    let mut tally = ProbeTally::new(uuids.len());
    while printed < args.samples && Instant::now() < deadline {
        std::thread::sleep(args.interval / 4);
        let report = sampler.last_tick();
        if report.tick == last_tick {
            continue;
        }
        last_tick = report.tick;
        tally.add(&report);
        println!("{}", tick_line(&report, &uuids, first));
        printed += 1;
    }
    let end = Instant::now();
    if let Some(stats) = sampler.window(first, end) {
        let attrs: serde_json::Map<String, Value> = window_attributes(&stats)
            .into_iter()
            .map(|kv| (kv.key.to_string(), Value::String(kv.value.to_string())))
            .collect();
        println!(
            "{}",
            json!({"window_s": end.duration_since(first).as_secs_f64(), "attributes": attrs})
        );
    }
    let verdict = tally.verdict();
    let devices: Vec<Value> = tally
        .devices
        .iter()
        .zip(&uuids)
        .map(|(d, uuid)| {
            json!({"uuid": uuid, "readings": d.readings, "lost": d.lost,
                   "gpm_readings": d.gpm_readings, "gpm_errors": d.gpm_errors})
        })
        .collect();
    let reason = match &verdict {
        ProbeVerdict::Failed(why) | ProbeVerdict::NotApplicable(why) => Some(why.as_str()),
        ProbeVerdict::Proven => None,
    };
    println!(
        "{}",
        json!({"summary": {
            "ticks": tally.ticks,
            "measured_ticks": tally.measured_ticks,
            "gpm_errors": tally.gpm_errors(),
            "devices": devices,
            "verdict": verdict.label(),
            "reason": reason,
        }})
    );
    eprintln!(
        "gpu-probe: {}: {} ticks, {} with readings, {} device(s), {} GPM errors{}",
        verdict.label(),
        tally.ticks,
        tally.measured_ticks,
        uuids.len(),
        tally.gpm_errors(),
        reason.map(|r| format!(" ({r})")).unwrap_or_default()
    );
    ExitCode::from(verdict.exit_code())
}
