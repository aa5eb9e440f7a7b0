//! Span attributes from window statistics: exactly the `gpu.*`, `host.*` and `process.*` names
//! of [`infertrace_semconv::gpu`]. A statistic that was not measured is left out, never zero.

use opentelemetry::{Array, KeyValue, StringValue, Value};

use infertrace_semconv::gpu;

use crate::host::HostWindowStats;
use crate::sampler::WindowStats;

/// Appends the `gpu.*` attributes of `stats` to `out` (`gpu.energy.attributed` is added by
/// [`GpuTelemetry`](crate::GpuTelemetry), which knows the request).
pub fn push_window_attributes(stats: &WindowStats, out: &mut Vec<KeyValue>) {
    if stats.devices.is_empty() {
        return;
    }
    let mut push = |key: &'static str, v: Option<f64>| {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            out.push(KeyValue::new(key, v));
        }
    };
    push(gpu::UTILIZATION_MEAN, stats.utilization_mean());
    push(gpu::UTILIZATION_MAX, stats.utilization_max());
    push(gpu::SM_ACTIVITY_MEAN, stats.sm_activity_mean());
    push(gpu::POWER_MEAN, stats.power_mean());
    push(gpu::ENERGY, stats.energy_joules());
    if let Some(m) = stats.memory_used_max() {
        out.push(KeyValue::new(
            gpu::MEMORY_USED_MAX,
            i64::try_from(m).unwrap_or(i64::MAX),
        ));
    }
    out.push(KeyValue::new(
        gpu::SAMPLE_COUNT,
        i64::from(stats.sample_count()),
    ));
    out.push(KeyValue::new(
        gpu::UUIDS,
        Value::Array(Array::String(
            stats
                .uuids()
                .map(|u| StringValue::from(u.clone()))
                .collect(),
        )),
    ));
}

/// The `gpu.*` attributes of `stats`.
///
/// ```
/// # use infertrace_gpu::{window_attributes, WindowStats};
/// let now = std::time::Instant::now();
/// let empty = WindowStats { start: now, end: now, devices: vec![] };
/// assert!(window_attributes(&empty).is_empty());
/// ```
pub fn window_attributes(stats: &WindowStats) -> Vec<KeyValue> {
    let mut out = Vec::with_capacity(8);
    push_window_attributes(stats, &mut out);
    out
}

/// Appends the `host.*` / `process.*` attributes of `stats` to `out`.
pub fn push_host_window_attributes(stats: &HostWindowStats, out: &mut Vec<KeyValue>) {
    if let Some(v) = stats.host_cpu_utilization_mean {
        out.push(KeyValue::new(gpu::HOST_CPU_UTILIZATION_MEAN, v));
    }
    if let Some(v) = stats.process_cpu_utilization_mean {
        out.push(KeyValue::new(gpu::PROCESS_CPU_UTILIZATION_MEAN, v));
    }
    if let Some(v) = stats.process_memory_max {
        out.push(KeyValue::new(
            gpu::PROCESS_MEMORY_USAGE_MAX,
            i64::try_from(v).unwrap_or(i64::MAX),
        ));
    }
}

/// The `host.*` / `process.*` attributes of `stats`.
pub fn host_window_attributes(stats: &HostWindowStats) -> Vec<KeyValue> {
    let mut out = Vec::with_capacity(3);
    push_host_window_attributes(stats, &mut out);
    out
}
