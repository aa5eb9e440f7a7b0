//! OpenTelemetry metrics from the samplers' latest readings: the hardware conventions for GPUs
//! (`hw.*`, `hw.id` = UUID) and the system / process conventions for the host. Instruments are
//! observable: the callbacks read the rings' latest records without blocking the samplers. A
//! sampler that is unavailable registers nothing; a lost device or a stale reading is skipped.

use std::sync::Arc;
use std::time::Instant;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use infertrace_semconv::{hw, system};

use crate::host::HostSampler;
use crate::sampler::GpuSampler;

/// `hw.type` of a GPU.
pub const HW_TYPE_GPU: &str = "gpu";
/// `hw.vendor` of NVML devices.
pub const HW_VENDOR_NVIDIA: &str = "NVIDIA";
/// `hw.gpu.task` of the overall utilisation.
pub const HW_GPU_TASK_GENERAL: &str = "general";
/// `hw.sensor_location` of the GPU die temperature.
pub const HW_SENSOR_GPU_DIE: &str = "gpu_die";

/// One device's attribute sets, built once.
struct DeviceAttributes {
    uuid: Arc<str>,
    base: Vec<KeyValue>,
    utilization: Vec<KeyValue>,
    temperature: Vec<KeyValue>,
}

/// Reads the fresh, non-lost latest samples and hands each with its attributes to `f`.
fn each_fresh(
    sampler: &GpuSampler,
    attrs: &[DeviceAttributes],
    mut f: impl FnMut(&crate::sampler::LatestSample, &DeviceAttributes),
) {
    let hold = std::time::Duration::from_nanos(sampler.shared().hold_ns);
    let now = Instant::now();
    for latest in sampler.latest() {
        if latest.lost || now.saturating_duration_since(latest.at) > hold {
            continue;
        }
        if let Some(a) = attrs.iter().find(|a| a.uuid == latest.info.uuid) {
            f(&latest, a);
        }
    }
}

/// Registers the `hw.*` GPU instruments on `meter`. Returns `false` (and registers nothing) when
/// the sampler is unavailable.
pub fn register_gpu_metrics(sampler: &GpuSampler, meter: &Meter) -> bool {
    if !sampler.available() {
        return false;
    }
    let attrs: Arc<[DeviceAttributes]> = sampler
        .devices()
        .map(|d| {
            let base = vec![
                KeyValue::new(hw::ID, d.uuid.to_string()),
                KeyValue::new(hw::TYPE, HW_TYPE_GPU),
                KeyValue::new(hw::NAME, d.name.to_string()),
                KeyValue::new(hw::VENDOR, HW_VENDOR_NVIDIA),
            ];
            let mut utilization = base.clone();
            utilization.push(KeyValue::new(hw::GPU_TASK, HW_GPU_TASK_GENERAL));
            let mut temperature = base.clone();
            temperature.push(KeyValue::new(hw::SENSOR_LOCATION, HW_SENSOR_GPU_DIE));
            DeviceAttributes {
                uuid: Arc::clone(&d.uuid),
                base,
                utilization,
                temperature,
            }
        })
        .collect();

    let (s, a) = (sampler.reader(), Arc::clone(&attrs));
    meter
        .f64_observable_gauge(hw::GPU_UTILIZATION)
        .with_unit("1")
        .with_description("Share of time any kernel ran on the GPU")
        .with_callback(move |o| {
            each_fresh(&s, &a, |l, a| {
                if let Some(v) = l.utilization {
                    o.observe(v, &a.utilization);
                }
            })
        })
        .build();
    let (s, a) = (sampler.reader(), Arc::clone(&attrs));
    meter
        .i64_observable_up_down_counter(hw::GPU_MEMORY_USAGE)
        .with_unit("By")
        .with_description("GPU memory used")
        .with_callback(move |o| {
            each_fresh(&s, &a, |l, a| {
                if let Some(v) = l.memory_used {
                    o.observe(i64::try_from(v).unwrap_or(i64::MAX), &a.base);
                }
            })
        })
        .build();
    let (s, a) = (sampler.reader(), Arc::clone(&attrs));
    meter
        .i64_observable_up_down_counter(hw::GPU_MEMORY_LIMIT)
        .with_unit("By")
        .with_description("GPU memory total")
        .with_callback(move |o| {
            each_fresh(&s, &a, |l, a| {
                if let Some(v) = l.memory_total {
                    o.observe(i64::try_from(v).unwrap_or(i64::MAX), &a.base);
                }
            })
        })
        .build();
    let (s, a) = (sampler.reader(), Arc::clone(&attrs));
    meter
        .f64_observable_gauge(hw::POWER)
        .with_unit("W")
        .with_description("GPU instant power")
        .with_callback(move |o| {
            each_fresh(&s, &a, |l, a| {
                if let Some(v) = l.power_watts {
                    o.observe(v, &a.base);
                }
            })
        })
        .build();
    let (s, a) = (sampler.reader(), Arc::clone(&attrs));
    meter
        .f64_observable_counter(hw::ENERGY)
        .with_unit("J")
        .with_description("GPU energy since the sampler started")
        .with_callback(move |o| {
            each_fresh(&s, &a, |l, a| {
                if let Some(v) = l.energy_joules {
                    o.observe(v, &a.base);
                }
            })
        })
        .build();
    let (s, a) = (sampler.reader(), attrs);
    meter
        .f64_observable_gauge(hw::TEMPERATURE)
        .with_unit("Cel")
        .with_description("GPU die temperature")
        .with_callback(move |o| {
            each_fresh(&s, &a, |l, a| {
                if let Some(v) = l.temperature_celsius {
                    o.observe(v, &a.temperature);
                }
            })
        })
        .build();
    true
}

/// `network.io.direction` values.
const NET_DIRECTIONS: [&str; 2] = ["receive", "transmit"];
/// `disk.io.direction` values.
const DISK_DIRECTIONS: [&str; 2] = ["read", "write"];

/// Registers the host and process instruments on `meter`.
pub fn register_host_metrics(sampler: &HostSampler, meter: &Meter) {
    let s = sampler.reader();
    meter
        .f64_observable_gauge(system::CPU_UTILIZATION)
        .with_unit("1")
        .with_description("Host CPU utilisation")
        .with_callback(move |o| {
            if let Some(v) = s.latest().and_then(|l| l.host_cpu) {
                o.observe(v, &[]);
            }
        })
        .build();
    let s = sampler.reader();
    meter
        .f64_observable_gauge(system::PROCESS_CPU_UTILIZATION)
        .with_unit("1")
        .with_description("Process CPU utilisation, share of the whole host")
        .with_callback(move |o| {
            if let Some(v) = s.latest().and_then(|l| l.process_cpu) {
                o.observe(v, &[]);
            }
        })
        .build();
    let s = sampler.reader();
    meter
        .i64_observable_up_down_counter(system::PROCESS_MEMORY_USAGE)
        .with_unit("By")
        .with_description("Process resident memory")
        .with_callback(move |o| {
            if let Some(v) = s.latest().and_then(|l| l.process_memory) {
                o.observe(i64::try_from(v).unwrap_or(i64::MAX), &[]);
            }
        })
        .build();
    let s = sampler.reader();
    let net: [Vec<KeyValue>; 2] =
        NET_DIRECTIONS.map(|d| vec![KeyValue::new(system::NETWORK_IO_DIRECTION, d)]);
    meter
        .u64_observable_counter(system::NETWORK_IO)
        .with_unit("By")
        .with_description("Host network bytes (all interfaces but loopback)")
        .with_callback(move |o| {
            if let Some(l) = s.latest() {
                for (total, attrs) in l.totals[..2].iter().zip(&net) {
                    if let Some(v) = total {
                        o.observe(*v, attrs);
                    }
                }
            }
        })
        .build();
    let s = sampler.reader();
    let disk: [Vec<KeyValue>; 2] =
        DISK_DIRECTIONS.map(|d| vec![KeyValue::new(system::DISK_IO_DIRECTION, d)]);
    meter
        .u64_observable_counter(system::PROCESS_DISK_IO)
        .with_unit("By")
        .with_description("Process disk bytes")
        .with_callback(move |o| {
            if let Some(l) = s.latest() {
                for (total, attrs) in l.totals[2..].iter().zip(&disk) {
                    if let Some(v) = total {
                        o.observe(*v, attrs);
                    }
                }
            }
        })
        .build();
}
