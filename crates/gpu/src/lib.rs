//! GPU (NVML) and host counter sampling for infertrace: what the GPU and the host were doing
//! during each queue / prefill / decode phase of an inference request.
//!
//! - [`GpuSampler`] samples every visible NVIDIA GPU (respecting `CUDA_VISIBLE_DEVICES` /
//!   `NVIDIA_VISIBLE_DEVICES`, keyed by UUID) on one dedicated OS thread, every 100 ms by
//!   default (GPM metrics every 1 s on Hopper and newer), into per-device lock-free ring buffers
//!   (60 s by default) that any number of threads read without blocking it.
//! - [`GpuSampler::window`] gives [`WindowStats`] for `[start, end]`: time-weighted means and maxima
//!   (the sample held at `start` counts), energy as the interpolated difference of the energy
//!   counter (wrap and reset handled), sample count and UUIDs. [`window_attributes`] turns them
//!   into exactly the `gpu.*` span attributes of `infertrace_semconv::gpu`.
//! - [`HostSampler`] does the same for host and process CPU, process memory, network and disk.
//! - [`EnergyAttribution`] splits each interval's energy across the requests active in it by
//!   their share of tokens — an estimate, documented as such.
//! - [`GpuTelemetry`] bundles all of it behind the handle a tracing layer holds, and registers the
//!   OpenTelemetry hardware metrics (`hw.gpu.utilization`, `hw.power`, `hw.energy`, …).
//!
//! Without NVML (no library, driver not loaded, no permission) the GPU sampler logs one line,
//! reports `available() == false` and produces no `gpu.*` attribute or metric at all — never
//! zeros. Everything builds and is tested without a GPU through [`ScriptedSource`].
//!
//! ```
//! use std::time::{Duration, Instant};
//! use infertrace_gpu::*;
//!
//! let epoch = Instant::now();
//! let devices = vec![DeviceInfo::new(0, "GPU-0000", "scripted")];
//! let source = ScriptedSource::new(devices, |tick, _now, out| {
//!     out.push(DeviceSample {
//!         device: 0,
//!         reading: GpuReading {
//!             utilization: Some(0.5),
//!             power_watts: Some(300.0),
//!             energy_millijoules: Some(tick * 30_000), // 30 J per 100 ms tick
//!             ..GpuReading::default()
//!         },
//!         ..DeviceSample::default()
//!     });
//! });
//! let (sampler, mut ticker) = GpuSampler::manual(GpuSamplerConfig::default(), Box::new(source), epoch);
//! for i in 0..10 {
//!     ticker.tick(epoch + Duration::from_millis(100 * i));
//! }
//! let w = sampler
//!     .window(epoch + Duration::from_millis(250), epoch + Duration::from_millis(750))
//!     .unwrap();
//! assert_eq!(w.utilization_mean(), Some(0.5));
//! assert!((w.energy_joules().unwrap() - 150.0).abs() < 1e-9);
//! assert!(!window_attributes(&w).is_empty());
//! ```
#![warn(missing_docs)]

mod attributes;
mod attribution;
mod counter;
mod host;
mod metrics;
mod nvml_source;
mod probe;
mod ring;
mod sampler;
mod source;
mod telemetry;
mod ticker;
mod visible;
mod window;

pub use attributes::{
    host_window_attributes, push_host_window_attributes, push_window_attributes, window_attributes,
};
pub use attribution::{DEFAULT_TIMELINE_POINTS, EnergyAttribution, RequestEnergy};
pub use host::{
    HOST_SAMPLER_THREAD, HostLatest, HostReading, HostSampler, HostSamplerConfig, HostSource,
    HostTicker, HostWindowStats, ScriptedHostSource, SysinfoSource,
};
pub use metrics::{
    HW_GPU_TASK_GENERAL, HW_SENSOR_GPU_DIE, HW_TYPE_GPU, HW_VENDOR_NVIDIA, register_gpu_metrics,
    register_host_metrics,
};
pub use nvml_source::{GpuUnavailable, NVML_LIBRARY_NAMES, NvmlSource, load_nvml};
pub use probe::{DeviceTally, ProbeTally, ProbeVerdict, unavailable_verdict};
pub use sampler::{
    DeviceWindow, GPU_SAMPLER_THREAD, GpuSampler, GpuSamplerConfig, LatestSample, ManualTicker,
    TickReport, WindowStats,
};
pub use source::{
    CallTimings, CounterSource, DeviceInfo, DeviceSample, GpmReading, GpuReading, ScriptedSource,
};
pub use telemetry::{GpuTelemetry, TelemetryConfig};
pub use visible::{CUDA_VISIBLE_DEVICES, DeviceSelector, NVIDIA_VISIBLE_DEVICES, VisibleDevices};
