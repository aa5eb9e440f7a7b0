//! [`CounterSource`]: what one sample tick reads from the GPUs, and [`ScriptedSource`] for tests.

use std::sync::Arc;
use std::time::Instant;

/// Static facts about one device, read once at start.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    /// NVML index (PCI bus order).
    pub index: u32,
    /// Device UUID (`GPU-…`), the key of everything the sampler keeps.
    pub uuid: Arc<str>,
    /// Product name, e.g. `NVIDIA H200`.
    pub name: Arc<str>,
    /// Total framebuffer memory, bytes.
    pub memory_total: Option<u64>,
    /// Whether MIG mode is enabled (`None`: not supported).
    pub mig_enabled: Option<bool>,
    /// Whether GPM metrics (Hopper and newer) are available.
    pub gpm_supported: bool,
    /// Driver version (system-wide).
    pub driver_version: Option<Arc<str>>,
}

impl DeviceInfo {
    /// A device with just an index, UUID and name (the rest unknown); handy for scripted sources.
    pub fn new(index: u32, uuid: &str, name: &str) -> Self {
        Self {
            index,
            uuid: Arc::from(uuid),
            name: Arc::from(name),
            memory_total: None,
            mig_enabled: None,
            gpm_supported: false,
            driver_version: None,
        }
    }
}

/// The counters of one device at one tick. `None`: not measured (unsupported or failed).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuReading {
    /// Share of the last sample period in which any kernel ran, 0–1.
    pub utilization: Option<f64>,
    /// Framebuffer memory used, bytes.
    pub memory_used: Option<u64>,
    /// Framebuffer memory total, bytes.
    pub memory_total: Option<u64>,
    /// Instant power, watts.
    pub power_watts: Option<f64>,
    /// Raw total energy counter, millijoules (wrap and reset are handled by the sampler).
    pub energy_millijoules: Option<u64>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// GPU die temperature, °C.
    pub temperature_celsius: Option<u32>,
    /// Clock throttle reasons (NVML bitmask).
    pub throttle_reasons: Option<u64>,
}

/// GPM metrics (Hopper and newer) over the last GPM interval, each 0–1.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpmReading {
    /// Share of time each SM had at least one warp assigned (DCGM's "SM active").
    pub sm_activity: Option<f64>,
    /// Warps resident vs the theoretical maximum.
    pub sm_occupancy: Option<f64>,
    /// Share of time any tensor pipe was active.
    pub tensor_activity: Option<f64>,
    /// Share of DRAM bandwidth used.
    pub dram_activity: Option<f64>,
}

/// How long each NVML call of one device's sample took, microseconds (`None`: not called).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallTimings {
    /// `nvmlDeviceGetUtilizationRates`.
    pub utilization_us: Option<u32>,
    /// `nvmlDeviceGetMemoryInfo_v2`.
    pub memory_us: Option<u32>,
    /// `nvmlDeviceGetFieldValues` (instant power, total energy).
    pub field_values_us: Option<u32>,
    /// `nvmlDeviceGetPowerUsage` (fallback when instant power is unsupported).
    pub power_usage_us: Option<u32>,
    /// `nvmlDeviceGetClockInfo(SM)`.
    pub sm_clock_us: Option<u32>,
    /// `nvmlDeviceGetTemperature`.
    pub temperature_us: Option<u32>,
    /// `nvmlDeviceGetCurrentClocksThrottleReasons`.
    pub throttle_us: Option<u32>,
    /// `nvmlGpmSampleGet` + `nvmlGpmMetricsGet`.
    pub gpm_us: Option<u32>,
}

/// One device's result of one tick.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceSample {
    /// Position of the device in [`CounterSource::devices`].
    pub device: usize,
    /// The device fell off the bus (or is otherwise lost): `reading` is empty.
    pub lost: bool,
    /// The counters.
    pub reading: GpuReading,
    /// GPM metrics, present on the ticks that close a GPM interval.
    pub gpm: Option<GpmReading>,
    /// Time spent in each call.
    pub timings: CallTimings,
    /// GPM metrics that failed to read on this tick (a per-metric error, or a failed GPM call
    /// counted once per metric); GPM that is unsupported is not an error.
    pub gpm_errors: u32,
}

impl GpuReading {
    /// Whether no counter was read.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl GpmReading {
    /// Whether no metric was read.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl DeviceSample {
    /// Whether this sample measured something: the device is not lost and at least one
    /// counter or GPM metric was read.
    pub fn has_reading(&self) -> bool {
        !self.lost && (!self.reading.is_empty() || self.gpm.is_some_and(|g| !g.is_empty()))
    }
}

/// What one sample tick reads. The real implementation is [`NvmlSource`](crate::NvmlSource);
/// tests use [`ScriptedSource`].
pub trait CounterSource {
    /// The devices this source samples (after `CUDA_VISIBLE_DEVICES` filtering), in a fixed
    /// order; [`DeviceSample::device`] indexes this list.
    fn devices(&self) -> Vec<DeviceInfo>;

    /// Reads one tick at `now`, appending one sample per device read to `out`.
    fn sample(&mut self, now: Instant, out: &mut Vec<DeviceSample>);
}

impl<T: CounterSource + ?Sized> CounterSource for Box<T> {
    fn devices(&self) -> Vec<DeviceInfo> {
        (**self).devices()
    }

    fn sample(&mut self, now: Instant, out: &mut Vec<DeviceSample>) {
        (**self).sample(now, out)
    }
}

type ScriptFn = dyn FnMut(u64, Instant, &mut Vec<DeviceSample>) + Send;

/// A [`CounterSource`] driven by a script: a closure called with the tick number (from 0) and
/// the tick's instant.
///
/// ```
/// use infertrace_gpu::{CounterSource, DeviceInfo, DeviceSample, GpuReading, ScriptedSource};
/// let mut source = ScriptedSource::new(vec![DeviceInfo::new(0, "GPU-a", "test")], |tick, _now, out| {
///     out.push(DeviceSample {
///         device: 0,
///         reading: GpuReading { utilization: Some(tick as f64 / 10.0), ..GpuReading::default() },
///         ..DeviceSample::default()
///     });
/// });
/// let mut out = Vec::new();
/// source.sample(std::time::Instant::now(), &mut out);
/// assert_eq!(out[0].reading.utilization, Some(0.0));
/// ```
pub struct ScriptedSource {
    devices: Vec<DeviceInfo>,
    tick: u64,
    script: Box<ScriptFn>,
}

impl std::fmt::Debug for ScriptedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedSource")
            .field("devices", &self.devices)
            .field("tick", &self.tick)
            .finish_non_exhaustive()
    }
}

impl ScriptedSource {
    /// A source over `devices` whose ticks are produced by `script`.
    pub fn new(
        devices: Vec<DeviceInfo>,
        script: impl FnMut(u64, Instant, &mut Vec<DeviceSample>) + Send + 'static,
    ) -> Self {
        Self {
            devices,
            tick: 0,
            script: Box::new(script),
        }
    }

    /// A source that replays `ticks` in order (tick `i` gives `ticks[i]`), then reads nothing.
    pub fn from_ticks(devices: Vec<DeviceInfo>, ticks: Vec<Vec<DeviceSample>>) -> Self {
        Self::new(devices, move |tick, _now, out| {
            if let Some(samples) = usize::try_from(tick).ok().and_then(|i| ticks.get(i)) {
                out.extend_from_slice(samples);
            }
        })
    }
}

impl CounterSource for ScriptedSource {
    fn devices(&self) -> Vec<DeviceInfo> {
        self.devices.clone()
    }

    fn sample(&mut self, now: Instant, out: &mut Vec<DeviceSample>) {
        (self.script)(self.tick, now, out);
        self.tick += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_has_a_reading_only_when_a_counter_was_read() {
        let empty = DeviceSample::default();
        assert!(!empty.has_reading());
        let gpm_empty = DeviceSample {
            gpm: Some(GpmReading::default()),
            ..DeviceSample::default()
        };
        assert!(!gpm_empty.has_reading());
        let gpm = DeviceSample {
            gpm: Some(GpmReading {
                sm_activity: Some(0.5),
                ..GpmReading::default()
            }),
            ..DeviceSample::default()
        };
        assert!(gpm.has_reading());
        let read = DeviceSample {
            reading: GpuReading {
                temperature_celsius: Some(40),
                ..GpuReading::default()
            },
            ..DeviceSample::default()
        };
        assert!(read.has_reading());
        assert!(!DeviceSample { lost: true, ..read }.has_reading());
    }

    #[test]
    fn from_ticks_replays_then_reads_nothing() {
        let sample = DeviceSample {
            device: 0,
            reading: GpuReading {
                power_watts: Some(300.0),
                ..GpuReading::default()
            },
            ..DeviceSample::default()
        };
        let mut s =
            ScriptedSource::from_ticks(vec![DeviceInfo::new(0, "GPU-x", "x")], vec![vec![sample]]);
        let mut out = Vec::new();
        s.sample(Instant::now(), &mut out);
        assert_eq!(out, vec![sample]);
        out.clear();
        s.sample(Instant::now(), &mut out);
        assert!(out.is_empty());
        assert_eq!(s.devices()[0].uuid.as_ref(), "GPU-x");
    }
}
