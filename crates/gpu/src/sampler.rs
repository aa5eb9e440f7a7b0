//! [`GpuSampler`]: samples every visible GPU on one dedicated OS thread into per-device ring
//! buffers, and answers window queries from any thread without blocking the sampler.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use crate::attribution::EnergyAttribution;
use crate::counter::{DEFAULT_MAX_WATTS, EnergyCounter};
use crate::nvml_source::{GpuUnavailable, NvmlSource, load_nvml};
use crate::ring::Record;
use crate::source::{CounterSource, DeviceInfo, DeviceSample};
use crate::visible::VisibleDevices;
use crate::window::{EnergyFields, Integrator, Layout, Series, fold};

/// Fields of a GPU ring record.
pub(crate) mod field {
    pub(crate) const UTILIZATION: usize = 0;
    pub(crate) const MEMORY_USED: usize = 1;
    pub(crate) const MEMORY_TOTAL: usize = 2;
    pub(crate) const POWER: usize = 3;
    pub(crate) const ENERGY: usize = 4;
    pub(crate) const SM_CLOCK: usize = 5;
    pub(crate) const TEMPERATURE: usize = 6;
    pub(crate) const THROTTLE: usize = 7;
    /// Raw fields; the running integrals of utilisation and power follow.
    pub(crate) const RAW: usize = 8;
    pub(crate) const COUNT: usize = RAW + 4;

    pub(crate) const GPM_SM_ACTIVITY: usize = 0;
    pub(crate) const GPM_SM_OCCUPANCY: usize = 1;
    pub(crate) const GPM_TENSOR_ACTIVITY: usize = 2;
    pub(crate) const GPM_DRAM_ACTIVITY: usize = 3;
    pub(crate) const GPM_RAW: usize = 4;
    pub(crate) const GPM_COUNT: usize = GPM_RAW + 8;
}

/// Means: utilisation, power; maxima: utilisation, memory used, power.
const GPU_LAYOUT: Layout<2, 3> = Layout {
    means: [field::UTILIZATION, field::POWER],
    integrals_at: field::RAW,
    maxes: [field::UTILIZATION, field::MEMORY_USED, field::POWER],
    energy: Some(EnergyFields {
        counter: field::ENERGY,
        power_mean: 1,
    }),
};
/// Means of the four GPM metrics.
const GPM_LAYOUT: Layout<4, 0> = Layout {
    means: [
        field::GPM_SM_ACTIVITY,
        field::GPM_SM_OCCUPANCY,
        field::GPM_TENSOR_ACTIVITY,
        field::GPM_DRAM_ACTIVITY,
    ],
    integrals_at: field::GPM_RAW,
    maxes: [],
    energy: None,
};

/// Settings of a [`GpuSampler`].
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSamplerConfig {
    /// Time between samples (default 100 ms).
    pub interval: Duration,
    /// Time between GPM samples on Hopper and newer (default 1 s).
    pub gpm_interval: Duration,
    /// Time between reads of the energy counter (default 1 s; at most `interval` reads it every
    /// tick). The counter is by far the costliest read (docs/PERFORMANCE.md, "On hardware");
    /// between reads the energy follows instant power × time from the last read, never
    /// decreasing, and each read brings it back to the counter.
    pub energy_interval: Duration,
    /// How much history each device keeps at least (default 60 s; the ring is rounded up to a
    /// power of two of samples, so 60 s at 100 ms keeps 1024 samples, ~102 s).
    pub retention: Duration,
    /// How often a lost GPU is looked up again (default 10 s).
    pub lost_retry: Duration,
    /// How long a sample's value is held when no newer sample follows, in intervals (default 5).
    pub hold_intervals: u32,
    /// Path of the NVML library (default: `libnvidia-ml.so.1`, then `libnvidia-ml.so`).
    pub nvml_library: Option<PathBuf>,
    /// Which devices to sample (default: from `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES`).
    pub visible: Option<VisibleDevices>,
}

impl Default for GpuSamplerConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(100),
            gpm_interval: Duration::from_secs(1),
            energy_interval: Duration::from_secs(1),
            retention: Duration::from_secs(60),
            lost_retry: Duration::from_secs(10),
            hold_intervals: 5,
            nvml_library: None,
            visible: None,
        }
    }
}

impl GpuSamplerConfig {
    fn ring_capacity(&self, every: Duration) -> usize {
        let every = every.max(Duration::from_millis(1));
        let n = self.retention.as_nanos() / every.as_nanos();
        usize::try_from(n).unwrap_or(usize::MAX).clamp(2, 1 << 20) + 1
    }

    fn hold_ns(&self, every: Duration) -> u64 {
        let hold = every.saturating_mul(self.hold_intervals.max(1));
        u64::try_from(hold.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The history of one device.
#[derive(Debug)]
pub(crate) struct DeviceSeries {
    pub(crate) info: DeviceInfo,
    pub(crate) ring: Series<{ field::COUNT }, 3>,
    pub(crate) gpm: Series<{ field::GPM_COUNT }, 0>,
    pub(crate) lost: AtomicBool,
}

/// Per-call timings of the latest tick, for diagnostics (`gpu-probe`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TickReport {
    /// Tick number since start (from 1).
    pub tick: u64,
    /// When the tick started.
    pub at: Option<Instant>,
    /// How long the whole tick took, microseconds.
    pub duration_us: u32,
    /// What each device read.
    pub samples: Vec<DeviceSample>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) epoch: Instant,
    pub(crate) unavailable: Option<GpuUnavailable>,
    pub(crate) devices: Box<[DeviceSeries]>,
    pub(crate) hold_ns: u64,
    pub(crate) gpm_hold_ns: u64,
    pub(crate) attribution: EnergyAttribution,
    last_tick: Mutex<TickReport>,
    ticks: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    fn new(config: &GpuSamplerConfig, devices: Vec<DeviceInfo>, epoch: Instant) -> Self {
        let cap = config.ring_capacity(config.interval);
        let gpm_cap = config.ring_capacity(config.gpm_interval);
        Self {
            epoch,
            unavailable: None,
            devices: devices
                .into_iter()
                .map(|info| DeviceSeries {
                    info,
                    ring: Series::new(cap),
                    gpm: Series::new(gpm_cap),
                    lost: AtomicBool::new(false),
                })
                .collect(),
            hold_ns: config.hold_ns(config.interval),
            gpm_hold_ns: config.hold_ns(config.gpm_interval),
            attribution: EnergyAttribution::new(epoch),
            last_tick: Mutex::new(TickReport::default()),
            ticks: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }

    fn unavailable(reason: GpuUnavailable) -> Self {
        let epoch = Instant::now();
        Self {
            epoch,
            unavailable: Some(reason),
            devices: Box::new([]),
            hold_ns: 0,
            gpm_hold_ns: 0,
            attribution: EnergyAttribution::new(epoch),
            last_tick: Mutex::new(TickReport::default()),
            ticks: AtomicU64::new(0),
            stop: AtomicBool::new(true),
        }
    }

    pub(crate) fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Window statistics of one device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceWindow {
    /// Device UUID.
    pub uuid: Arc<str>,
    /// Samples counted (the one held at the window's start included).
    pub samples: u32,
    /// Time-weighted mean utilisation, 0–1.
    pub utilization_mean: Option<f64>,
    /// Max utilisation, 0–1.
    pub utilization_max: Option<f64>,
    /// Time-weighted mean GPM SM activity, 0–1 (Hopper and newer).
    pub sm_activity_mean: Option<f64>,
    /// Time-weighted mean GPM SM occupancy, 0–1.
    pub sm_occupancy_mean: Option<f64>,
    /// Time-weighted mean GPM tensor activity, 0–1.
    pub tensor_activity_mean: Option<f64>,
    /// Time-weighted mean GPM DRAM activity, 0–1.
    pub dram_activity_mean: Option<f64>,
    /// Max memory used, bytes.
    pub memory_used_max: Option<u64>,
    /// Time-weighted mean power, watts.
    pub power_mean: Option<f64>,
    /// Max power, watts.
    pub power_max: Option<f64>,
    /// Energy over the window, joules (interpolated counter difference; power × time fallback).
    pub energy_joules: Option<f64>,
}

/// Window statistics of all devices over `[start, end]`.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowStats {
    /// Window start.
    pub start: Instant,
    /// Window end.
    pub end: Instant,
    /// Devices with at least one sample in the window.
    pub devices: Vec<DeviceWindow>,
}

fn mean_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let (mut sum, mut n) = (0.0, 0u32);
    for v in values.flatten() {
        sum += v;
        n += 1;
    }
    (n > 0).then(|| sum / f64::from(n))
}

fn max_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    values.flatten().reduce(f64::max)
}

fn sum_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    values.flatten().reduce(|a, b| a + b)
}

impl WindowStats {
    /// Mean utilisation across devices, 0–1.
    pub fn utilization_mean(&self) -> Option<f64> {
        mean_of(self.devices.iter().map(|d| d.utilization_mean))
    }

    /// Max utilisation of any device, 0–1.
    pub fn utilization_max(&self) -> Option<f64> {
        max_of(self.devices.iter().map(|d| d.utilization_max))
    }

    /// Mean SM activity across devices with GPM, 0–1.
    pub fn sm_activity_mean(&self) -> Option<f64> {
        mean_of(self.devices.iter().map(|d| d.sm_activity_mean))
    }

    /// Sum over devices of each device's max memory used, bytes (an upper bound of the peak of
    /// the total).
    pub fn memory_used_max(&self) -> Option<u64> {
        self.devices
            .iter()
            .filter_map(|d| d.memory_used_max)
            .reduce(u64::saturating_add)
    }

    /// Total mean power of the devices, watts.
    pub fn power_mean(&self) -> Option<f64> {
        sum_of(self.devices.iter().map(|d| d.power_mean))
    }

    /// Total energy of the devices over the window, joules.
    pub fn energy_joules(&self) -> Option<f64> {
        sum_of(self.devices.iter().map(|d| d.energy_joules))
    }

    /// Samples per device in the window (the largest count of any device).
    pub fn sample_count(&self) -> u32 {
        self.devices.iter().map(|d| d.samples).max().unwrap_or(0)
    }

    /// UUIDs of the devices in the window.
    pub fn uuids(&self) -> impl Iterator<Item = &Arc<str>> {
        self.devices.iter().map(|d| &d.uuid)
    }
}

/// The latest sample of one device (for metrics and diagnostics).
#[derive(Clone, Debug, PartialEq)]
pub struct LatestSample {
    /// The device.
    pub info: DeviceInfo,
    /// When it was taken.
    pub at: Instant,
    /// Utilisation, 0–1.
    pub utilization: Option<f64>,
    /// Memory used, bytes.
    pub memory_used: Option<u64>,
    /// Memory total, bytes.
    pub memory_total: Option<u64>,
    /// Power, watts.
    pub power_watts: Option<f64>,
    /// Energy since the sampler started, joules (monotonic).
    pub energy_joules: Option<f64>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<f64>,
    /// Temperature, °C.
    pub temperature_celsius: Option<f64>,
    /// Throttle reasons bitmask.
    pub throttle_reasons: Option<u64>,
    /// Latest GPM SM activity, 0–1.
    pub sm_activity: Option<f64>,
    /// Whether the device is currently lost.
    pub lost: bool,
}

fn opt(v: f64) -> Option<f64> {
    (!v.is_nan()).then_some(v)
}

fn opt_u64(v: f64) -> Option<u64> {
    opt(v).filter(|x| *x >= 0.0).map(|x| x as u64)
}

/// Samples GPUs into ring buffers; cheap to clone; every clone reads the same history.
///
/// Without NVML (library absent, driver not loaded, no permission) it logs one line at start,
/// [`available`](Self::available) is `false`, every window is `None`, and no metric is
/// registered: no zeros are ever reported for a GPU that was not measured.
///
/// ```
/// use infertrace_gpu::{GpuSampler, GpuSamplerConfig};
/// let sampler = GpuSampler::start(GpuSamplerConfig::default());
/// if !sampler.available() {
///     let now = std::time::Instant::now();
///     assert!(sampler.window(now, now).is_none());
/// }
/// ```
#[derive(Clone, Debug)]
pub struct GpuSampler {
    shared: Arc<Shared>,
    _stopper: Option<Arc<Stopper>>,
}

/// Stops the sampler thread when the last [`GpuSampler`] clone is dropped.
#[derive(Debug)]
struct Stopper {
    shared: Arc<Shared>,
    thread: Option<Thread>,
}

impl Drop for Stopper {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = &self.thread {
            t.unpark();
        }
    }
}

/// Drives a sampler by hand, on the caller's thread (tests, benchmarks, custom loops).
pub struct ManualTicker {
    core: Core<Box<dyn CounterSource + Send>>,
}

impl std::fmt::Debug for ManualTicker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManualTicker").finish_non_exhaustive()
    }
}

impl ManualTicker {
    /// Runs one tick at `now` (instants must not go backwards; earlier ones are clamped).
    pub fn tick(&mut self, now: Instant) {
        self.core.tick(now);
    }
}

/// The integrators of one device's two rings.
struct DeviceWriters {
    main: Integrator<{ field::COUNT }, 2, 3>,
    gpm: Integrator<{ field::GPM_COUNT }, 4, 0>,
}

/// One device's energy total as written to its ring: the counter where it was read this tick,
/// else the last read plus instant power × time since (each power reading held for at most the
/// hold), never below a total written before, also across a lost device. So between reads
/// (default once a second) a window's energy has the shape of the power, and each read brings
/// the total back to the counter: an estimate that ran ahead holds the total until the counter
/// catches up, one that fell behind is made up at the read.
#[derive(Clone, Copy, Debug, Default)]
struct EnergyTrack {
    /// The last counter read, joules.
    read: Option<f64>,
    /// Joules of power × time since that read.
    since_read: f64,
    /// The last power reading: (time ns, watts).
    power: Option<(u64, f64)>,
    /// The previous tick, ns.
    last_t: Option<u64>,
    /// The highest total ever written: the ring's totals never decrease.
    floor: f64,
}

impl EnergyTrack {
    /// The last total written since the device was found (`None` before its first counter read
    /// and after a loss: no total to take a difference from).
    fn written(&self) -> Option<f64> {
        self.read.map(|_| self.floor)
    }

    /// The total to write at `t` (ns), given this tick's counter (monotonic joules) and power.
    fn update(
        &mut self,
        counter: Option<f64>,
        watts: Option<f64>,
        t: u64,
        hold: u64,
    ) -> Option<f64> {
        if let (Some((pt, pw)), Some(last)) = (self.power, self.last_t) {
            let until = t.min(pt.saturating_add(hold));
            self.since_read += pw * until.saturating_sub(last.max(pt)) as f64 / 1e9;
        }
        self.last_t = Some(t);
        if let Some(w) = watts {
            self.power = Some((t, w));
        }
        let estimate = match counter {
            Some(j) => {
                self.read = Some(j);
                self.since_read = 0.0;
                j
            }
            None => self.read? + self.since_read,
        };
        self.floor = estimate.max(self.floor);
        Some(self.floor)
    }

    /// The device was lost: its readings stop counting; the floor stays.
    fn lost(&mut self) {
        *self = Self {
            floor: self.floor,
            ..Self::default()
        };
    }
}

/// The sampling loop's state: the source, the energy counters, the scratch buffer.
struct Core<S> {
    source: S,
    shared: Arc<Shared>,
    writers: Vec<DeviceWriters>,
    counters: Vec<EnergyCounter>,
    energy: Vec<EnergyTrack>,
    last_t: Option<u64>,
    buf: Vec<DeviceSample>,
}

impl<S: CounterSource> Core<S> {
    fn new(source: S, shared: Arc<Shared>) -> Self {
        let n = shared.devices.len();
        let writers = (0..n)
            .map(|_| DeviceWriters {
                main: Integrator::new(GPU_LAYOUT, shared.hold_ns),
                gpm: Integrator::new(GPM_LAYOUT, shared.gpm_hold_ns),
            })
            .collect();
        Self {
            source,
            shared,
            writers,
            counters: vec![EnergyCounter::new(64, DEFAULT_MAX_WATTS); n],
            energy: vec![EnergyTrack::default(); n],
            last_t: None,
            buf: Vec::with_capacity(n),
        }
    }

    fn tick(&mut self, now: Instant) {
        let started = Instant::now();
        let t = self.shared.ns(now).max(self.last_t.unwrap_or(0));
        let dt_s = self.last_t.map(|l| t.saturating_sub(l) as f64 / 1e9);
        self.buf.clear();
        self.source.sample(now, &mut self.buf);
        let mut tick_energy: Option<f64> = None;
        for s in &self.buf {
            let Some(series) = self.shared.devices.get(s.device) else {
                continue;
            };
            series.lost.store(s.lost, Ordering::Relaxed);
            if s.lost {
                self.energy[s.device].lost();
                continue;
            }
            let r = &s.reading;
            let counter = r
                .energy_millijoules
                .map(|mj| self.counters[s.device].update(mj, t));
            let track = &mut self.energy[s.device];
            let prev_j = track.written();
            let energy = track.update(counter, r.power_watts, t, self.shared.hold_ns);
            let device_energy = match (energy, prev_j) {
                (Some(now_j), Some(prev_j)) => Some(now_j - prev_j),
                _ => r.power_watts.zip(dt_s).map(|(w, dt)| w * dt),
            };
            if let Some(e) = device_energy {
                *tick_energy.get_or_insert(0.0) += e;
            }
            let f = |v: Option<f64>| v.unwrap_or(f64::NAN);
            let mut v = [f64::NAN; field::COUNT];
            v[field::UTILIZATION] = f(r.utilization);
            v[field::MEMORY_USED] = f(r.memory_used.map(|x| x as f64));
            v[field::MEMORY_TOTAL] = f(r.memory_total.map(|x| x as f64));
            v[field::POWER] = f(r.power_watts);
            v[field::ENERGY] = f(energy);
            v[field::SM_CLOCK] = f(r.sm_clock_mhz.map(f64::from));
            v[field::TEMPERATURE] = f(r.temperature_celsius.map(f64::from));
            v[field::THROTTLE] = f(r.throttle_reasons.map(|x| x as f64));
            self.writers[s.device]
                .main
                .push(&series.ring, Record { t, v });
            if let Some(g) = &s.gpm {
                let mut v = [f64::NAN; field::GPM_COUNT];
                v[field::GPM_SM_ACTIVITY] = f(g.sm_activity);
                v[field::GPM_SM_OCCUPANCY] = f(g.sm_occupancy);
                v[field::GPM_TENSOR_ACTIVITY] = f(g.tensor_activity);
                v[field::GPM_DRAM_ACTIVITY] = f(g.dram_activity);
                self.writers[s.device]
                    .gpm
                    .push(&series.gpm, Record { t, v });
            }
        }
        self.shared.attribution.distribute(t, tick_energy);
        self.last_t = Some(t);
        let n = self.shared.ticks.fetch_add(1, Ordering::Relaxed) + 1;
        let mut report = self
            .shared
            .last_tick
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        report.tick = n;
        report.at = Some(now);
        report.duration_us = u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX);
        report.samples.clear();
        report.samples.extend_from_slice(&self.buf);
    }

    /// Ticks every `interval` until the sampler is stopped.
    fn run(&mut self, interval: Duration) {
        let shared = self.shared.clone();
        crate::ticker::run_every(&shared.stop, interval, |now| self.tick(now));
    }
}

/// Name of the sampler thread.
pub const GPU_SAMPLER_THREAD: &str = "infertrace-gpu";

impl GpuSampler {
    /// Starts sampling the visible NVIDIA GPUs through NVML on a dedicated thread. Blocks until
    /// NVML is loaded and the devices are discovered (or found unavailable, which is logged once).
    pub fn start(config: GpuSamplerConfig) -> Self {
        let interval = config.interval;
        Self::spawn(move |reply| {
            let nvml = match load_nvml(config.nvml_library.as_deref()) {
                Ok(n) => n,
                Err(e) => {
                    let _ = reply.send(Arc::new(Shared::unavailable(e)));
                    return;
                }
            };
            let visible = config
                .visible
                .clone()
                .unwrap_or_else(VisibleDevices::from_env);
            let source = match NvmlSource::discover(
                &nvml,
                &visible,
                config.gpm_interval,
                config.energy_interval,
                config.lost_retry,
            ) {
                Ok(s) => s,
                Err(e) => {
                    let _ = reply.send(Arc::new(Shared::unavailable(e)));
                    return;
                }
            };
            let shared = Arc::new(Shared::new(&config, source.devices(), Instant::now()));
            let mut core = Core::new(source, Arc::clone(&shared));
            if reply.send(shared).is_ok() {
                core.run(interval);
            }
        })
    }

    /// Starts sampling `source` on a dedicated thread (e.g. a [`ScriptedSource`](crate::ScriptedSource)).
    pub fn with_source(config: GpuSamplerConfig, source: Box<dyn CounterSource + Send>) -> Self {
        let interval = config.interval;
        Self::spawn(move |reply| {
            let shared = Arc::new(Shared::new(&config, source.devices(), Instant::now()));
            let mut core = Core::new(source, Arc::clone(&shared));
            if reply.send(shared).is_ok() {
                core.run(interval);
            }
        })
    }

    /// A sampler over `source` driven by the returned [`ManualTicker`] instead of a thread;
    /// window times are measured from `epoch`.
    pub fn manual(
        config: GpuSamplerConfig,
        source: Box<dyn CounterSource + Send>,
        epoch: Instant,
    ) -> (Self, ManualTicker) {
        let shared = Arc::new(Shared::new(&config, source.devices(), epoch));
        let sampler = Self {
            shared: Arc::clone(&shared),
            _stopper: None,
        };
        (
            sampler,
            ManualTicker {
                core: Core::new(source, shared),
            },
        )
    }

    /// A sampler that is off, for `reason` (e.g. [`GpuUnavailable::Disabled`]).
    pub fn unavailable(reason: GpuUnavailable) -> Self {
        Self {
            shared: Arc::new(Shared::unavailable(reason)),
            _stopper: None,
        }
    }

    fn spawn(body: impl FnOnce(mpsc::SyncSender<Arc<Shared>>) + Send + 'static) -> Self {
        let (tx, rx) = mpsc::sync_channel(1);
        let handle = thread::Builder::new()
            .name(GPU_SAMPLER_THREAD.into())
            .spawn(move || body(tx));
        let handle = match handle {
            Ok(h) => h,
            Err(e) => {
                return Self::logged(Shared::unavailable(GpuUnavailable::ThreadFailed(
                    e.to_string(),
                )));
            }
        };
        let thread = handle.thread().clone();
        match rx.recv() {
            Ok(shared) if shared.unavailable.is_some() => Self::logged_arc(shared),
            Ok(shared) => {
                tracing::info!(
                    devices = shared.devices.len(),
                    uuids = ?shared.devices.iter().map(|d| d.info.uuid.as_ref()).collect::<Vec<_>>(),
                    "GPU sampler started"
                );
                Self {
                    _stopper: Some(Arc::new(Stopper {
                        shared: Arc::clone(&shared),
                        thread: Some(thread),
                    })),
                    shared,
                }
            }
            Err(_) => Self::logged(Shared::unavailable(GpuUnavailable::ThreadFailed(
                "the sampler thread ended during start".into(),
            ))),
        }
    }

    fn logged(shared: Shared) -> Self {
        Self::logged_arc(Arc::new(shared))
    }

    fn logged_arc(shared: Arc<Shared>) -> Self {
        if let Some(reason) = &shared.unavailable {
            tracing::warn!("{reason}");
        }
        Self {
            shared,
            _stopper: None,
        }
    }

    /// Whether GPUs are being sampled.
    pub fn available(&self) -> bool {
        self.shared.unavailable.is_none()
    }

    /// Why GPUs are not sampled.
    pub fn unavailable_reason(&self) -> Option<&GpuUnavailable> {
        self.shared.unavailable.as_ref()
    }

    /// The devices sampled.
    pub fn devices(&self) -> impl Iterator<Item = &DeviceInfo> {
        self.shared.devices.iter().map(|d| &d.info)
    }

    /// The instant window times are measured from.
    pub fn epoch(&self) -> Instant {
        self.shared.epoch
    }

    /// Ticks run so far.
    pub fn ticks(&self) -> u64 {
        self.shared.ticks.load(Ordering::Relaxed)
    }

    /// The latest tick's samples and call timings.
    pub fn last_tick(&self) -> TickReport {
        self.shared
            .last_tick
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The energy attribution registry fed by this sampler's ticks.
    pub fn attribution(&self) -> &EnergyAttribution {
        &self.shared.attribution
    }

    /// Window statistics over `[start, end]`; `None` when no device has a sample in it (or GPU
    /// telemetry is off).
    ///
    /// A sample's value is held from its time until the next sample (at most
    /// [`hold_intervals`](GpuSamplerConfig::hold_intervals) intervals). The sample held at
    /// `start` counts, as does every sample in `(start, end)`; a sample exactly at `end` belongs
    /// to what follows, so back-to-back phases share no sample. Means are time-weighted (a
    /// zero-length window takes the held sample); maxima are over the counted samples; energy
    /// is the device energy total interpolated at both edges (the counter, wrap and reset
    /// removed, carried between its reads by instant power: see
    /// [`energy_interval`](GpuSamplerConfig::energy_interval); the last rate extended for at
    /// most the hold past the last sample), or held power × time where there is no counter.
    /// Costs O(log n + n/16) reads per device, no lock.
    pub fn window(&self, start: Instant, end: Instant) -> Option<WindowStats> {
        if end < start || self.shared.devices.is_empty() {
            return None;
        }
        let (s, e) = (self.shared.ns(start), self.shared.ns(end));
        let mut devices = Vec::with_capacity(self.shared.devices.len());
        for series in self.shared.devices.iter() {
            let Some(main) = fold(&series.ring, &GPU_LAYOUT, s, e, self.shared.hold_ns) else {
                continue;
            };
            let gpm = if series.info.gpm_supported || series.gpm.ring().bounds().1 > 0 {
                fold(&series.gpm, &GPM_LAYOUT, s, e, self.shared.gpm_hold_ns)
            } else {
                None
            };
            let gm = |i: usize| gpm.as_ref().and_then(|x| x.means[i]);
            devices.push(DeviceWindow {
                uuid: Arc::clone(&series.info.uuid),
                samples: main.samples,
                utilization_mean: main.means[0],
                utilization_max: main.maxes[0],
                sm_activity_mean: gm(0),
                sm_occupancy_mean: gm(1),
                tensor_activity_mean: gm(2),
                dram_activity_mean: gm(3),
                memory_used_max: main.maxes[1].filter(|x| *x >= 0.0).map(|x| x as u64),
                power_mean: main.means[1],
                power_max: main.maxes[2],
                energy_joules: main.energy,
            });
        }
        (!devices.is_empty()).then_some(WindowStats {
            start,
            end,
            devices,
        })
    }

    /// The latest sample of every device that has one.
    pub fn latest(&self) -> Vec<LatestSample> {
        self.shared
            .devices
            .iter()
            .filter_map(|series| {
                let r = series.ring.ring().latest()?;
                let g = series.gpm.ring().latest();
                let v = &r.v;
                Some(LatestSample {
                    info: series.info.clone(),
                    at: self.shared.epoch + Duration::from_nanos(r.t),
                    utilization: opt(v[field::UTILIZATION]),
                    memory_used: opt_u64(v[field::MEMORY_USED]),
                    memory_total: opt_u64(v[field::MEMORY_TOTAL]),
                    power_watts: opt(v[field::POWER]),
                    energy_joules: opt(v[field::ENERGY]),
                    sm_clock_mhz: opt(v[field::SM_CLOCK]),
                    temperature_celsius: opt(v[field::TEMPERATURE]),
                    throttle_reasons: opt_u64(v[field::THROTTLE]),
                    sm_activity: g.and_then(|g| opt(g.v[field::GPM_SM_ACTIVITY])),
                    lost: series.lost.load(Ordering::Relaxed),
                })
            })
            .collect()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// A handle that reads the same history but does not keep the sampler thread running.
    pub(crate) fn reader(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            _stopper: None,
        }
    }
}
