//! [`GpuTelemetry`]: the one handle a tracing layer holds to enrich phase spans with GPU and host
//! window statistics and per-request attributed energy.

use std::time::Instant;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use infertrace_semconv::gpu;

use crate::attributes::{push_host_window_attributes, push_window_attributes};
use crate::attribution::RequestEnergy;
use crate::host::{HostSampler, HostSamplerConfig};
use crate::metrics::{register_gpu_metrics, register_host_metrics};
use crate::nvml_source::GpuUnavailable;
use crate::sampler::{GpuSampler, GpuSamplerConfig};

/// What [`GpuTelemetry::start`] starts.
#[derive(Clone, Debug, PartialEq)]
pub struct TelemetryConfig {
    /// Sample GPUs through NVML (default `true`; off by itself where NVML does not load).
    pub gpu: bool,
    /// GPU sampler settings.
    pub gpu_sampler: GpuSamplerConfig,
    /// Sample host and process counters (default `true`).
    pub host: bool,
    /// Host sampler settings.
    pub host_sampler: HostSamplerConfig,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            gpu: true,
            gpu_sampler: GpuSamplerConfig::default(),
            host: true,
            host_sampler: HostSamplerConfig::default(),
        }
    }
}

/// GPU and host samplers behind one cheap, cloneable handle.
///
/// A layer calls [`begin_request`](Self::begin_request) at arrival (and reports tokens through
/// the returned [`RequestEnergy`]), then, when it builds the phase spans,
/// [`phase_attributes`](Self::phase_attributes) once per phase.
///
/// ```
/// use infertrace_gpu::GpuTelemetry;
/// let telemetry = GpuTelemetry::disabled();
/// let energy = telemetry.begin_request();
/// assert!(energy.is_none());
/// let now = std::time::Instant::now();
/// let mut attrs = Vec::new();
/// telemetry.phase_attributes(now, now, energy.as_ref(), &mut attrs);
/// assert!(attrs.is_empty());
/// ```
#[derive(Clone, Debug)]
pub struct GpuTelemetry {
    gpu: Option<GpuSampler>,
    gpu_off: Option<GpuUnavailable>,
    host: Option<HostSampler>,
}

impl Default for GpuTelemetry {
    fn default() -> Self {
        Self::disabled()
    }
}

impl GpuTelemetry {
    /// Starts the samplers `config` asks for. A GPU sampler that finds no NVML is dropped after
    /// logging why (one line); a host sampler whose thread cannot start is logged and dropped.
    pub fn start(config: &TelemetryConfig) -> Self {
        let gpu = if config.gpu {
            GpuSampler::start(config.gpu_sampler.clone())
        } else {
            GpuSampler::unavailable(GpuUnavailable::Disabled)
        };
        let host = if config.host {
            match HostSampler::start(config.host_sampler.clone()) {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::warn!(error = %e, "could not start the host sampler thread; host counters are off");
                    None
                }
            }
        } else {
            None
        };
        Self::new(Some(gpu), host)
    }

    /// From already started samplers (an unavailable GPU sampler is kept only for its reason).
    pub fn new(gpu: Option<GpuSampler>, host: Option<HostSampler>) -> Self {
        let gpu_off = match &gpu {
            Some(g) => g.unavailable_reason().cloned(),
            None => Some(GpuUnavailable::Disabled),
        };
        Self {
            gpu: gpu.filter(GpuSampler::available),
            gpu_off,
            host,
        }
    }

    /// No sampling at all.
    pub fn disabled() -> Self {
        Self::new(None, None)
    }

    /// The GPU sampler, when GPUs are sampled.
    pub fn gpu(&self) -> Option<&GpuSampler> {
        self.gpu.as_ref()
    }

    /// The host sampler, when host counters are sampled.
    pub fn host(&self) -> Option<&HostSampler> {
        self.host.as_ref()
    }

    /// Why GPUs are not sampled (`None` when they are).
    pub fn gpu_unavailable(&self) -> Option<&GpuUnavailable> {
        self.gpu_off.as_ref()
    }

    /// Registers a request for energy attribution (`None` without GPUs). Keep the handle for the
    /// request's life; report tokens with [`RequestEnergy::tokens`].
    pub fn begin_request(&self) -> Option<RequestEnergy> {
        self.gpu.as_ref().map(|g| g.attribution().begin_request())
    }

    /// Appends the window attributes of `[start, end]` to `out`: the `gpu.*` statistics (none
    /// without GPU samples in the window), `gpu.energy.attributed` for `request`, and the
    /// `host.*` / `process.*` statistics.
    pub fn phase_attributes(
        &self,
        start: Instant,
        end: Instant,
        request: Option<&RequestEnergy>,
        out: &mut Vec<KeyValue>,
    ) {
        if let Some(stats) = self.gpu.as_ref().and_then(|g| g.window(start, end)) {
            push_window_attributes(&stats, out);
            if let Some(r) = request {
                out.push(KeyValue::new(
                    gpu::ENERGY_ATTRIBUTED,
                    r.attributed_between(start, end),
                ));
            }
        }
        if let Some(stats) = self.host.as_ref().and_then(|h| h.window(start, end)) {
            push_host_window_attributes(&stats, out);
        }
    }

    /// Registers the `hw.*` GPU metrics and the host metrics on `meter`.
    pub fn register_metrics(&self, meter: &Meter) {
        if let Some(g) = &self.gpu {
            register_gpu_metrics(g, meter);
        }
        if let Some(h) = &self.host {
            register_host_metrics(h, meter);
        }
    }
}
