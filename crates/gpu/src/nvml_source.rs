//! [`NvmlSource`]: the real [`CounterSource`], reading NVIDIA GPUs through NVML
//! (`libnvidia-ml.so.1`, loaded at run time by nvml-wrapper).
//!
//! Per device and tick: utilisation rates, memory info, one field-values call for instant power
//! (`NVML_FI_DEV_POWER_INSTANT`) and, once an energy interval, total energy
//! (`NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION`, the costliest read by far), the SM clock, the die
//! temperature and the throttle reasons; on Hopper and newer, a GPM sample every GPM interval
//! whose difference from the previous one gives SM activity, SM occupancy, tensor activity and
//! DRAM activity. `pcie_throughput` is never called (it blocks ~20 ms).
//!
//! A field that answers `NotSupported` (or whose symbol the installed driver lacks) is remembered
//! and never asked again. A device that answers `GpuLost` is dropped from sampling and looked up
//! again by UUID every `lost_retry`.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::gpm::GpmMetricResult;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_POWER_INSTANT, NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
};
use nvml_wrapper::{Device, GpmSample, Nvml};

use crate::source::{CounterSource, DeviceInfo, DeviceSample, GpmReading};
use crate::visible::VisibleDevices;

/// Why GPU telemetry is off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuUnavailable {
    /// The NVML library could not be loaded (no NVIDIA driver installed).
    LibraryNotFound(String),
    /// The library loaded but the NVIDIA kernel driver is not running.
    DriverNotLoaded,
    /// The process may not talk to the driver.
    NoPermission,
    /// NVML failed to initialise for another reason.
    InitFailed(String),
    /// NVML works but no device is visible to this process.
    NoVisibleDevices,
    /// GPU telemetry was turned off by configuration.
    Disabled,
    /// The sampler thread could not be started.
    ThreadFailed(String),
}

impl GpuUnavailable {
    /// Whether NVML itself loaded and initialised (so a missing sample is a real failure).
    pub fn nvml_loaded(&self) -> bool {
        matches!(self, Self::NoVisibleDevices)
    }
}

impl std::fmt::Display for GpuUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::LibraryNotFound(e) => write!(
                f,
                "NVML library not found ({e}); install the NVIDIA driver or pass its path to use GPU telemetry"
            ),
            Self::DriverNotLoaded => {
                f.write_str("NVIDIA driver not loaded; GPU telemetry is off")
            }
            Self::NoPermission => f.write_str(
                "no permission to talk to the NVIDIA driver (check /dev/nvidia* access); GPU telemetry is off",
            ),
            Self::InitFailed(e) => write!(f, "NVML failed to initialise: {e}; GPU telemetry is off"),
            Self::NoVisibleDevices => f.write_str(
                "NVML loaded but no GPU is visible to this process (check CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES)",
            ),
            Self::Disabled => f.write_str("GPU telemetry disabled by configuration"),
            Self::ThreadFailed(e) => write!(f, "could not start the GPU sampler thread: {e}"),
        }
    }
}

impl std::error::Error for GpuUnavailable {}

/// Library names tried in order when no path is configured.
pub const NVML_LIBRARY_NAMES: [&str; 2] = ["libnvidia-ml.so.1", "libnvidia-ml.so"];

/// Loads and initialises NVML from `path`, or from [`NVML_LIBRARY_NAMES`] in order.
pub fn load_nvml(path: Option<&Path>) -> Result<Nvml, GpuUnavailable> {
    let candidates: Vec<&OsStr> = match path {
        Some(p) => vec![p.as_os_str()],
        None => NVML_LIBRARY_NAMES.iter().map(OsStr::new).collect(),
    };
    let mut not_found: Vec<String> = Vec::new();
    for candidate in candidates {
        match Nvml::builder().lib_path(candidate).init() {
            Ok(nvml) => return Ok(nvml),
            Err(NvmlError::LibloadingError(e)) => not_found.push(e.to_string()),
            Err(NvmlError::DriverNotLoaded) => return Err(GpuUnavailable::DriverNotLoaded),
            Err(NvmlError::NoPermission) => return Err(GpuUnavailable::NoPermission),
            Err(e) => return Err(GpuUnavailable::InitFailed(e.to_string())),
        }
    }
    Err(GpuUnavailable::LibraryNotFound(not_found.join("; ")))
}

/// Which calls a device answered `NotSupported` to (bit per [`Field`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Unsupported(u16);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
enum Field {
    Utilization = 1,
    Memory = 1 << 1,
    PowerInstant = 1 << 2,
    Energy = 1 << 3,
    PowerUsage = 1 << 4,
    SmClock = 1 << 5,
    Temperature = 1 << 6,
    Throttle = 1 << 7,
    Gpm = 1 << 8,
}

impl Unsupported {
    fn has(self, f: Field) -> bool {
        self.0 & f as u16 != 0
    }
    fn set(&mut self, f: Field) {
        self.0 |= f as u16;
    }
}

/// What a failed call means for the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// Never ask again.
    Unsupported,
    /// The device is gone; retry it later.
    Lost,
    /// Try again next tick.
    Transient,
}

fn classify(e: &NvmlError) -> Failure {
    match e {
        NvmlError::NotSupported
        | NvmlError::FunctionNotFound
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::NoPermission
        | NvmlError::InvalidArg => Failure::Unsupported,
        NvmlError::GpuLost | NvmlError::ResetRequired | NvmlError::Uninitialized => Failure::Lost,
        _ => Failure::Transient,
    }
}

fn micros(since: Instant) -> Option<u32> {
    Some(u32::try_from(since.elapsed().as_micros()).unwrap_or(u32::MAX))
}

/// How often the reads that are not made every tick are made.
#[derive(Clone, Copy, Debug)]
struct Intervals {
    gpm: Duration,
    energy: Duration,
}

/// Per-tick state of one device.
struct Tracked<'n> {
    info: DeviceInfo,
    device: Option<Device<'n>>,
    unsupported: Unsupported,
    lost_at: Option<Instant>,
    lost_logged: bool,
    gpm_prev: Option<(GpmSample<'n>, Instant)>,
    /// When the energy counter was last read.
    energy_at: Option<Instant>,
    /// The last tick gave no power reading: the counter is read every tick until one comes.
    power_missing: bool,
}

/// The NVML [`CounterSource`]. Borrows the [`Nvml`] handle, which the sampler thread owns.
pub struct NvmlSource<'n> {
    nvml: &'n Nvml,
    devices: Vec<Tracked<'n>>,
    intervals: Intervals,
    lost_retry: Duration,
}

impl std::fmt::Debug for NvmlSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field(
                "devices",
                &self.devices.iter().map(|d| &d.info).collect::<Vec<_>>(),
            )
            .field("intervals", &self.intervals)
            .finish_non_exhaustive()
    }
}

const GPM_METRICS: [GpmMetricId; 4] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
];

/// The GPM metrics of one `nvmlGpmMetricsGet` (NVML's percentages as 0–1) and how many of
/// them came back as errors.
fn gpm_reading(values: Vec<Result<GpmMetricResult, NvmlError>>) -> (GpmReading, u32) {
    let mut g = GpmReading::default();
    let mut errors = 0;
    for v in values {
        let Ok(v) = v else {
            errors += 1;
            continue;
        };
        let x = Some(v.value / 100.0);
        match v.metric_id {
            GpmMetricId::SmUtil => g.sm_activity = x,
            GpmMetricId::SmOccupancy => g.sm_occupancy = x,
            GpmMetricId::AnyTensorUtil => g.tensor_activity = x,
            GpmMetricId::DramBwUtil => g.dram_activity = x,
            _ => {}
        }
    }
    (g, errors)
}

impl<'n> NvmlSource<'n> {
    /// Discovers the visible devices and reads their static facts. GPM samples and energy
    /// counter reads are made once per their interval; a lost device is looked up again every
    /// `lost_retry`.
    pub fn discover(
        nvml: &'n Nvml,
        visible: &VisibleDevices,
        gpm_interval: Duration,
        energy_interval: Duration,
        lost_retry: Duration,
    ) -> Result<Self, GpuUnavailable> {
        let count = nvml
            .device_count()
            .map_err(|e| GpuUnavailable::InitFailed(format!("device count: {e}")))?;
        let driver: Option<Arc<str>> = nvml.sys_driver_version().ok().map(Arc::from);
        let mut found: Vec<Option<(DeviceInfo, Device<'n>)>> = Vec::new();
        for index in 0..count {
            let device = match nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(index, error = %e, "GPU skipped: no handle");
                    continue;
                }
            };
            let uuid = match device.uuid() {
                Ok(u) => u,
                Err(e) => {
                    tracing::warn!(index, error = %e, "GPU skipped: no UUID");
                    continue;
                }
            };
            let mut info = DeviceInfo::new(index, &uuid, "");
            info.driver_version = driver.clone();
            found.push(Some((info, device)));
        }
        let infos: Vec<DeviceInfo> = found.iter().flatten().map(|(i, _)| i.clone()).collect();
        let keep = visible.select(&infos);
        let mut devices = Vec::with_capacity(keep.len());
        for pos in keep {
            let Some((mut info, device)) = found.get_mut(pos).and_then(Option::take) else {
                continue;
            };
            info.name = Arc::from(device.name().unwrap_or_else(|_| "NVIDIA GPU".into()));
            info.memory_total = device.memory_info().ok().map(|m| m.total);
            info.mig_enabled = device.mig_mode().ok().map(|m| m.current == 1);
            info.gpm_supported = device.gpm_support().unwrap_or(false);
            let mut unsupported = Unsupported::default();
            if !info.gpm_supported {
                unsupported.set(Field::Gpm);
            }
            devices.push(Tracked {
                info,
                device: Some(device),
                unsupported,
                lost_at: None,
                lost_logged: false,
                gpm_prev: None,
                energy_at: None,
                power_missing: false,
            });
        }
        if devices.is_empty() {
            return Err(GpuUnavailable::NoVisibleDevices);
        }
        Ok(Self {
            nvml,
            devices,
            intervals: Intervals {
                gpm: gpm_interval,
                energy: energy_interval,
            },
            lost_retry,
        })
    }
}

/// Runs one NVML call unless it is known unsupported; records its time and what a failure means.
fn call<T>(
    unsupported: &mut Unsupported,
    lost: &mut bool,
    field: Field,
    timing: &mut Option<u32>,
    f: impl FnOnce() -> Result<T, NvmlError>,
) -> Option<T> {
    if *lost || unsupported.has(field) {
        return None;
    }
    let started = Instant::now();
    let result = f();
    *timing = micros(started);
    match result {
        Ok(v) => Some(v),
        Err(e) => {
            match classify(&e) {
                Failure::Unsupported => unsupported.set(field),
                Failure::Lost => *lost = true,
                Failure::Transient => {}
            }
            None
        }
    }
}

fn sample_value_f64(v: &SampleValue) -> f64 {
    match *v {
        SampleValue::F64(x) => x,
        SampleValue::U32(x) => f64::from(x),
        SampleValue::U64(x) => x as f64,
        SampleValue::I64(x) => x as f64,
    }
}

fn sample_value_u64(v: &SampleValue) -> Option<u64> {
    match *v {
        SampleValue::F64(x) if x >= 0.0 => Some(x as u64),
        SampleValue::U32(x) => Some(u64::from(x)),
        SampleValue::U64(x) => Some(x),
        SampleValue::I64(x) => u64::try_from(x).ok(),
        SampleValue::F64(_) => None,
    }
}

impl Tracked<'_> {
    fn read(&mut self, nvml: &Nvml, now: Instant, intervals: Intervals) -> DeviceSample {
        let mut s = DeviceSample::default();
        let Some(device) = self.device.as_ref() else {
            s.lost = true;
            return s;
        };
        let mut lost = false;
        let t = &mut s.timings;
        let u = &mut self.unsupported;
        let r = &mut s.reading;

        r.utilization = call(
            u,
            &mut lost,
            Field::Utilization,
            &mut t.utilization_us,
            || device.utilization_rates(),
        )
        .map(|x| f64::from(x.gpu) / 100.0);
        if let Some(m) = call(u, &mut lost, Field::Memory, &mut t.memory_us, || {
            device.memory_info()
        }) {
            r.memory_used = Some(m.used);
            r.memory_total = Some(m.total);
        }

        // One field-values call for the two counters still supported, the (costly) energy
        // counter only once an energy interval.
        let mut ids: [Option<u32>; 2] = [None, None];
        if !u.has(Field::PowerInstant) {
            ids[0] = Some(NVML_FI_DEV_POWER_INSTANT);
        }
        // A tenth of the interval early rather than a tick late (ticks wake a little late).
        let energy_due = self.power_missing
            || self.energy_at.is_none_or(|at| {
                now.saturating_duration_since(at) + intervals.energy / 10 >= intervals.energy
            });
        if !u.has(Field::Energy) && energy_due {
            ids[1] = Some(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION);
        }
        let request: Vec<FieldId> = ids.iter().flatten().map(|id| FieldId(*id)).collect();
        if !request.is_empty() && !lost {
            let started = Instant::now();
            let result = device.field_values_for(&request);
            t.field_values_us = micros(started);
            match result {
                Ok(values) => {
                    for (id, value) in request.iter().zip(values) {
                        let field = if id.0 == NVML_FI_DEV_POWER_INSTANT {
                            Field::PowerInstant
                        } else {
                            Field::Energy
                        };
                        match value.map(|v| v.value) {
                            Ok(Ok(v)) => match field {
                                // Instant power is reported in milliwatts.
                                Field::PowerInstant => {
                                    r.power_watts = Some(sample_value_f64(&v) / 1000.0)
                                }
                                _ => {
                                    r.energy_millijoules = sample_value_u64(&v);
                                    self.energy_at = Some(now);
                                }
                            },
                            Ok(Err(e)) | Err(e) => match classify(&e) {
                                Failure::Unsupported => u.set(field),
                                Failure::Lost => lost = true,
                                Failure::Transient => {}
                            },
                        }
                    }
                }
                Err(e) => match classify(&e) {
                    Failure::Unsupported => {
                        u.set(Field::PowerInstant);
                        u.set(Field::Energy);
                    }
                    Failure::Lost => lost = true,
                    Failure::Transient => {}
                },
            }
        }
        if r.power_watts.is_none() && u.has(Field::PowerInstant) {
            // Older drivers: the (1 s averaged) power usage instead.
            r.power_watts = call(
                u,
                &mut lost,
                Field::PowerUsage,
                &mut t.power_usage_us,
                || device.power_usage(),
            )
            .map(|mw| f64::from(mw) / 1000.0);
        }
        r.sm_clock_mhz = call(u, &mut lost, Field::SmClock, &mut t.sm_clock_us, || {
            device.clock_info(Clock::SM)
        });
        r.temperature_celsius = call(
            u,
            &mut lost,
            Field::Temperature,
            &mut t.temperature_us,
            || device.temperature(TemperatureSensor::Gpu),
        );
        r.throttle_reasons = call(u, &mut lost, Field::Throttle, &mut t.throttle_us, || {
            device.current_throttle_reasons()
        })
        .map(|b| b.bits());

        if !lost && !u.has(Field::Gpm) {
            let due = self
                .gpm_prev
                .as_ref()
                .is_none_or(|(_, at)| now.saturating_duration_since(*at) >= intervals.gpm);
            if due {
                let started = Instant::now();
                match device.gpm_sample() {
                    Ok(sample) => {
                        if let Some((prev, _)) = self.gpm_prev.take() {
                            match nvml_wrapper::gpm::gpm_metrics_get(
                                nvml,
                                &prev,
                                &sample,
                                &GPM_METRICS,
                            ) {
                                Ok(values) => {
                                    let (g, errors) = gpm_reading(values);
                                    s.gpm = Some(g);
                                    s.gpm_errors += errors;
                                }
                                Err(e) if classify(&e) == Failure::Unsupported => u.set(Field::Gpm),
                                Err(e) if classify(&e) == Failure::Lost => lost = true,
                                Err(_) => s.gpm_errors += GPM_METRICS.len() as u32,
                            }
                        }
                        self.gpm_prev = Some((sample, now));
                    }
                    Err(e) => match classify(&e) {
                        Failure::Unsupported => u.set(Field::Gpm),
                        Failure::Lost => lost = true,
                        Failure::Transient => s.gpm_errors += GPM_METRICS.len() as u32,
                    },
                }
                t.gpm_us = micros(started);
            }
        }

        self.power_missing = s.reading.power_watts.is_none();
        if lost {
            if !self.lost_logged {
                self.lost_logged = true;
                tracing::warn!(
                    uuid = %self.info.uuid,
                    "GPU lost (fell off the bus or needs a reset); retrying it periodically"
                );
            }
            self.device = None;
            self.gpm_prev = None;
            self.energy_at = None;
            self.lost_at = Some(now);
            s = DeviceSample {
                lost: true,
                ..DeviceSample::default()
            };
        }
        s
    }
}

impl CounterSource for NvmlSource<'_> {
    fn devices(&self) -> Vec<DeviceInfo> {
        self.devices.iter().map(|d| d.info.clone()).collect()
    }

    fn sample(&mut self, now: Instant, out: &mut Vec<DeviceSample>) {
        for (pos, d) in self.devices.iter_mut().enumerate() {
            if d.device.is_none() {
                let due = d
                    .lost_at
                    .is_none_or(|at| now.saturating_duration_since(at) >= self.lost_retry);
                let found = if due {
                    d.lost_at = Some(now);
                    self.nvml.device_by_uuid(d.info.uuid.as_ref()).ok()
                } else {
                    None
                };
                match found {
                    Some(device) => d.device = Some(device),
                    None => {
                        out.push(DeviceSample {
                            device: pos,
                            lost: true,
                            ..DeviceSample::default()
                        });
                        continue;
                    }
                }
            }
            let mut s = d.read(self.nvml, now, self.intervals);
            if !s.lost && d.lost_logged {
                d.lost_logged = false;
                tracing::info!(uuid = %d.info.uuid, "GPU back; sampling it again");
            }
            s.device = pos;
            out.push(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpm_metric_errors_are_counted_not_dropped() {
        let metric = |metric_id, value| {
            Ok(GpmMetricResult {
                metric_id,
                value,
                metric_info: nvml_wrapper::struct_wrappers::gpm::GpmMetricInfo {
                    short_name: String::new(),
                    long_name: String::new(),
                    unit: String::new(),
                },
            })
        };
        let (g, errors) = gpm_reading(vec![
            metric(GpmMetricId::SmUtil, 50.0),
            Err(NvmlError::Unknown),
            metric(GpmMetricId::AnyTensorUtil, 25.0),
            Err(NvmlError::InvalidArg),
        ]);
        assert_eq!(errors, 2);
        assert_eq!(g.sm_activity, Some(0.5));
        assert_eq!(g.tensor_activity, Some(0.25));
        assert_eq!((g.sm_occupancy, g.dram_activity), (None, None));
        assert_eq!(gpm_reading(Vec::new()), (GpmReading::default(), 0));
    }

    #[test]
    fn errors_are_classified() {
        assert_eq!(classify(&NvmlError::NotSupported), Failure::Unsupported);
        assert_eq!(
            classify(&NvmlError::FailedToLoadSymbol("x".into())),
            Failure::Unsupported
        );
        assert_eq!(classify(&NvmlError::GpuLost), Failure::Lost);
        assert_eq!(classify(&NvmlError::Timeout), Failure::Transient);
    }

    #[test]
    fn unsupported_calls_are_not_made_again() {
        let mut u = Unsupported::default();
        let mut lost = false;
        let mut timing = None;
        let mut calls = 0;
        for _ in 0..3 {
            let r: Option<u32> = call(&mut u, &mut lost, Field::SmClock, &mut timing, || {
                calls += 1;
                Err(NvmlError::NotSupported)
            });
            assert_eq!(r, None);
        }
        assert_eq!(calls, 1);
        assert!(u.has(Field::SmClock));
        assert!(!u.has(Field::Temperature));
        assert!(!lost);
    }

    #[test]
    fn a_lost_gpu_stops_the_remaining_calls_of_the_tick() {
        let mut u = Unsupported::default();
        let mut lost = false;
        let mut timing = None;
        let r: Option<u32> = call(&mut u, &mut lost, Field::Utilization, &mut timing, || {
            Err(NvmlError::GpuLost)
        });
        assert_eq!(r, None);
        assert!(lost);
        assert!(timing.is_some());
        let mut called = false;
        let _: Option<u32> = call(&mut u, &mut lost, Field::Memory, &mut timing, || {
            called = true;
            Ok(1)
        });
        assert!(!called);
    }

    #[test]
    fn loading_a_missing_library_says_so() {
        let err = load_nvml(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).unwrap_err();
        assert!(matches!(err, GpuUnavailable::LibraryNotFound(_)), "{err:?}");
        assert!(!err.nvml_loaded());
        assert!(err.to_string().contains("NVML library not found"));
    }
}
