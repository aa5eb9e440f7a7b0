//! [`HostSampler`]: host and process counters (through sysinfo) with the same ring buffer and
//! window rules as the GPU sampler.
//!
//! Per tick: host CPU utilisation, this process's CPU utilisation (as a share of the whole host)
//! and resident memory, host network bytes/s (every interface but loopback) and this process's
//! disk bytes/s (host-wide disk totals double-count bind mounts in containers). Rates are over
//! the interval that ends at the sample.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use sysinfo::{Networks, Pid, ProcessRefreshKind, ProcessesToUpdate, System};

use crate::ring::Record;
use crate::window::{Integrator, Layout, Series, fold};

/// One reading of the host counters. Totals are cumulative; `None`: not measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostReading {
    /// Host CPU utilisation since the previous reading, 0–1.
    pub host_cpu: Option<f64>,
    /// Process CPU utilisation since the previous reading, 0–1 of the whole host.
    pub process_cpu: Option<f64>,
    /// Process resident memory, bytes.
    pub process_memory: Option<u64>,
    /// Host network bytes received (cumulative).
    pub network_received: Option<u64>,
    /// Host network bytes transmitted (cumulative).
    pub network_transmitted: Option<u64>,
    /// Process disk bytes read (cumulative).
    pub disk_read: Option<u64>,
    /// Process disk bytes written (cumulative).
    pub disk_written: Option<u64>,
}

/// What one host tick reads: [`SysinfoSource`] for real, [`ScriptedHostSource`] in tests.
pub trait HostSource {
    /// Reads the counters at `now`.
    fn sample(&mut self, now: Instant) -> HostReading;
}

/// The real [`HostSource`], on sysinfo.
pub struct SysinfoSource {
    system: System,
    networks: Networks,
    pid: Option<Pid>,
    primed: bool,
}

impl std::fmt::Debug for SysinfoSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SysinfoSource")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl Default for SysinfoSource {
    fn default() -> Self {
        Self::new()
    }
}

impl SysinfoSource {
    /// A source for this process.
    pub fn new() -> Self {
        Self {
            system: System::new(),
            networks: Networks::new_with_refreshed_list(),
            pid: sysinfo::get_current_pid().ok(),
            primed: false,
        }
    }
}

impl HostSource for SysinfoSource {
    fn sample(&mut self, _now: Instant) -> HostReading {
        self.system.refresh_cpu_usage();
        let mut r = HostReading::default();
        let cpus = self.system.cpus().len().max(1) as f64;
        if let Some(pid) = self.pid {
            self.system.refresh_processes_specifics(
                ProcessesToUpdate::Some(&[pid]),
                false,
                ProcessRefreshKind::nothing()
                    .with_cpu()
                    .with_memory()
                    .with_disk_usage(),
            );
            if let Some(p) = self.system.process(pid) {
                if self.primed {
                    r.process_cpu = Some((f64::from(p.cpu_usage()) / 100.0 / cpus).clamp(0.0, 1.0));
                }
                r.process_memory = Some(p.memory());
                let disk = p.disk_usage();
                r.disk_read = Some(disk.total_read_bytes);
                r.disk_written = Some(disk.total_written_bytes);
            }
        }
        if self.primed {
            r.host_cpu = Some((f64::from(self.system.global_cpu_usage()) / 100.0).clamp(0.0, 1.0));
        }
        self.networks.refresh(true);
        let (mut rx, mut tx) = (0u64, 0u64);
        for (name, data) in self.networks.iter() {
            if name == "lo" {
                continue;
            }
            rx = rx.saturating_add(data.total_received());
            tx = tx.saturating_add(data.total_transmitted());
        }
        r.network_received = Some(rx);
        r.network_transmitted = Some(tx);
        // CPU usage needs two refreshes: the first reading has none.
        self.primed = true;
        r
    }
}

type HostScript = dyn FnMut(u64, Instant) -> HostReading + Send;

/// A [`HostSource`] driven by a closure of the tick number (from 0) and instant.
pub struct ScriptedHostSource {
    tick: u64,
    script: Box<HostScript>,
}

impl std::fmt::Debug for ScriptedHostSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedHostSource")
            .field("tick", &self.tick)
            .finish_non_exhaustive()
    }
}

impl ScriptedHostSource {
    /// A source whose readings come from `script`.
    pub fn new(script: impl FnMut(u64, Instant) -> HostReading + Send + 'static) -> Self {
        Self {
            tick: 0,
            script: Box::new(script),
        }
    }
}

impl HostSource for ScriptedHostSource {
    fn sample(&mut self, now: Instant) -> HostReading {
        let r = (self.script)(self.tick, now);
        self.tick += 1;
        r
    }
}

impl<T: HostSource + ?Sized> HostSource for Box<T> {
    fn sample(&mut self, now: Instant) -> HostReading {
        (**self).sample(now)
    }
}

/// Settings of a [`HostSampler`].
#[derive(Clone, Debug, PartialEq)]
pub struct HostSamplerConfig {
    /// Time between samples (default 200 ms, sysinfo's minimum for CPU usage).
    pub interval: Duration,
    /// History kept (default 60 s).
    pub retention: Duration,
    /// How long a sample is held without a newer one, in intervals (default 5).
    pub hold_intervals: u32,
}

impl Default for HostSamplerConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(200),
            retention: Duration::from_secs(60),
            hold_intervals: 5,
        }
    }
}

mod field {
    pub(super) const HOST_CPU: usize = 0;
    pub(super) const PROCESS_CPU: usize = 1;
    pub(super) const PROCESS_MEMORY: usize = 2;
    pub(super) const NET_RX: usize = 3;
    pub(super) const NET_TX: usize = 4;
    pub(super) const DISK_READ: usize = 5;
    pub(super) const DISK_WRITE: usize = 6;
    /// Raw fields; the running integrals of the six means follow.
    pub(super) const RAW: usize = 7;
    pub(super) const COUNT: usize = RAW + 12;
}

/// Means of the CPU and I/O rates; max of the resident memory.
const HOST_LAYOUT: Layout<6, 1> = Layout {
    means: [
        field::HOST_CPU,
        field::PROCESS_CPU,
        field::NET_RX,
        field::NET_TX,
        field::DISK_READ,
        field::DISK_WRITE,
    ],
    integrals_at: field::RAW,
    maxes: [field::PROCESS_MEMORY],
    energy: None,
};

const NONE: u64 = u64::MAX;

#[derive(Debug)]
struct HostShared {
    epoch: Instant,
    ring: Series<{ field::COUNT }, 1>,
    hold_ns: u64,
    /// Latest cumulative totals: rx, tx, read, written (`u64::MAX`: unknown).
    totals: [AtomicU64; 4],
    ticks: AtomicU64,
    stop: AtomicBool,
}

impl HostShared {
    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Window statistics of the host counters over `[start, end]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostWindowStats {
    /// Samples counted.
    pub samples: u32,
    /// Mean host CPU utilisation, 0–1.
    pub host_cpu_utilization_mean: Option<f64>,
    /// Mean process CPU utilisation, 0–1 of the host.
    pub process_cpu_utilization_mean: Option<f64>,
    /// Max process resident memory, bytes.
    pub process_memory_max: Option<u64>,
    /// Mean network receive rate, bytes/s.
    pub network_receive_bytes_per_second: Option<f64>,
    /// Mean network transmit rate, bytes/s.
    pub network_transmit_bytes_per_second: Option<f64>,
    /// Mean process disk read rate, bytes/s.
    pub disk_read_bytes_per_second: Option<f64>,
    /// Mean process disk write rate, bytes/s.
    pub disk_write_bytes_per_second: Option<f64>,
}

/// The latest host reading (for metrics).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostLatest {
    /// Host CPU utilisation, 0–1.
    pub host_cpu: Option<f64>,
    /// Process CPU utilisation, 0–1.
    pub process_cpu: Option<f64>,
    /// Process resident memory, bytes.
    pub process_memory: Option<u64>,
    /// Cumulative network bytes received / transmitted, process disk bytes read / written.
    pub totals: [Option<u64>; 4],
}

struct HostCore<S> {
    source: S,
    shared: Arc<HostShared>,
    writer: Integrator<{ field::COUNT }, 6, 1>,
    last: Option<(u64, HostReading)>,
}

impl<S: HostSource> HostCore<S> {
    fn tick(&mut self, now: Instant) {
        let t = self.shared.ns(now).max(self.last.map_or(0, |(t, _)| t));
        let r = self.source.sample(now);
        let rate = |cur: Option<u64>, prev: Option<u64>, dt: u64| -> f64 {
            match (cur, prev) {
                (Some(c), Some(p)) if dt > 0 => c.saturating_sub(p) as f64 / (dt as f64 / 1e9),
                _ => f64::NAN,
            }
        };
        let (dt, prev) = match self.last {
            Some((lt, p)) => (t.saturating_sub(lt), p),
            None => (0, HostReading::default()),
        };
        let f = |v: Option<f64>| v.unwrap_or(f64::NAN);
        let mut v = [f64::NAN; field::COUNT];
        v[field::HOST_CPU] = f(r.host_cpu);
        v[field::PROCESS_CPU] = f(r.process_cpu);
        v[field::PROCESS_MEMORY] = f(r.process_memory.map(|x| x as f64));
        v[field::NET_RX] = rate(r.network_received, prev.network_received, dt);
        v[field::NET_TX] = rate(r.network_transmitted, prev.network_transmitted, dt);
        v[field::DISK_READ] = rate(r.disk_read, prev.disk_read, dt);
        v[field::DISK_WRITE] = rate(r.disk_written, prev.disk_written, dt);
        self.writer.push(&self.shared.ring, Record { t, v });
        for (cell, total) in self.shared.totals.iter().zip([
            r.network_received,
            r.network_transmitted,
            r.disk_read,
            r.disk_written,
        ]) {
            cell.store(total.unwrap_or(NONE), Ordering::Relaxed);
        }
        self.last = Some((t, r));
        self.shared.ticks.fetch_add(1, Ordering::Relaxed);
    }

    /// Ticks every `interval` until the sampler is stopped.
    fn run(&mut self, interval: Duration) {
        let shared = self.shared.clone();
        crate::ticker::run_every(&shared.stop, interval, |now| self.tick(now));
    }
}

#[derive(Debug)]
struct HostStopper {
    shared: Arc<HostShared>,
    thread: Thread,
}

impl Drop for HostStopper {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// Drives a [`HostSampler`] by hand.
pub struct HostTicker {
    core: HostCore<Box<dyn HostSource + Send>>,
}

impl std::fmt::Debug for HostTicker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTicker").finish_non_exhaustive()
    }
}

impl HostTicker {
    /// Runs one tick at `now`.
    pub fn tick(&mut self, now: Instant) {
        self.core.tick(now);
    }
}

/// Samples host and process counters on a dedicated thread; cheap to clone.
///
/// ```no_run
/// use infertrace_gpu::{HostSampler, HostSamplerConfig};
/// let host = HostSampler::start(HostSamplerConfig::default()).expect("thread");
/// std::thread::sleep(std::time::Duration::from_millis(500));
/// let now = std::time::Instant::now();
/// let stats = host.window(now - std::time::Duration::from_millis(400), now);
/// assert!(stats.is_some());
/// ```
#[derive(Clone, Debug)]
pub struct HostSampler {
    shared: Arc<HostShared>,
    _stopper: Option<Arc<HostStopper>>,
}

/// Name of the host sampler thread.
pub const HOST_SAMPLER_THREAD: &str = "infertrace-host";

impl HostSampler {
    fn shared(config: &HostSamplerConfig, epoch: Instant) -> Arc<HostShared> {
        let every = config.interval.max(Duration::from_millis(1));
        let cap = usize::try_from(config.retention.as_nanos() / every.as_nanos())
            .unwrap_or(usize::MAX)
            .clamp(2, 1 << 20)
            + 1;
        let hold = every.saturating_mul(config.hold_intervals.max(1));
        Arc::new(HostShared {
            epoch,
            ring: Series::new(cap),
            hold_ns: u64::try_from(hold.as_nanos()).unwrap_or(u64::MAX),
            totals: std::array::from_fn(|_| AtomicU64::new(NONE)),
            ticks: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        })
    }

    /// Starts sampling this host and process with sysinfo on a dedicated thread.
    pub fn start(config: HostSamplerConfig) -> std::io::Result<Self> {
        Self::with_source(config, Box::new(SysinfoSource::new()))
    }

    /// Starts sampling `source` on a dedicated thread.
    pub fn with_source(
        config: HostSamplerConfig,
        source: Box<dyn HostSource + Send>,
    ) -> std::io::Result<Self> {
        let shared = Self::shared(&config, Instant::now());
        let mut core = HostCore {
            source,
            writer: Integrator::new(HOST_LAYOUT, shared.hold_ns),
            shared: Arc::clone(&shared),
            last: None,
        };
        let interval = config.interval;
        let (tx, rx) = mpsc::sync_channel::<()>(1);
        let handle = thread::Builder::new()
            .name(HOST_SAMPLER_THREAD.into())
            .spawn(move || {
                // The first tick primes CPU usage before anyone reads a window.
                core.tick(Instant::now());
                let _ = tx.send(());
                core.run(interval);
            })?;
        let _ = rx.recv();
        Ok(Self {
            _stopper: Some(Arc::new(HostStopper {
                shared: Arc::clone(&shared),
                thread: handle.thread().clone(),
            })),
            shared,
        })
    }

    /// A sampler over `source` driven by the returned [`HostTicker`]; times measured from `epoch`.
    pub fn manual(
        config: HostSamplerConfig,
        source: Box<dyn HostSource + Send>,
        epoch: Instant,
    ) -> (Self, HostTicker) {
        let shared = Self::shared(&config, epoch);
        (
            Self {
                shared: Arc::clone(&shared),
                _stopper: None,
            },
            HostTicker {
                core: HostCore {
                    source,
                    writer: Integrator::new(HOST_LAYOUT, shared.hold_ns),
                    shared,
                    last: None,
                },
            },
        )
    }

    /// Ticks run so far.
    pub fn ticks(&self) -> u64 {
        self.shared.ticks.load(Ordering::Relaxed)
    }

    /// A handle that reads the same history but does not keep the sampler thread running.
    pub(crate) fn reader(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            _stopper: None,
        }
    }

    /// Window statistics over `[start, end]`, `None` without samples.
    pub fn window(&self, start: Instant, end: Instant) -> Option<HostWindowStats> {
        if end < start {
            return None;
        }
        let f = fold(
            &self.shared.ring,
            &HOST_LAYOUT,
            self.shared.ns(start),
            self.shared.ns(end),
            self.shared.hold_ns,
        )?;
        let m = &f.means;
        Some(HostWindowStats {
            samples: f.samples,
            host_cpu_utilization_mean: m[0],
            process_cpu_utilization_mean: m[1],
            process_memory_max: f.maxes[0].map(|x| x.max(0.0) as u64),
            network_receive_bytes_per_second: m[2],
            network_transmit_bytes_per_second: m[3],
            disk_read_bytes_per_second: m[4],
            disk_write_bytes_per_second: m[5],
        })
    }

    /// The latest reading.
    pub fn latest(&self) -> Option<HostLatest> {
        let r = self.shared.ring.ring().latest()?;
        let opt = |v: f64| (!v.is_nan()).then_some(v);
        Some(HostLatest {
            host_cpu: opt(r.v[field::HOST_CPU]),
            process_cpu: opt(r.v[field::PROCESS_CPU]),
            process_memory: opt(r.v[field::PROCESS_MEMORY]).map(|x| x.max(0.0) as u64),
            totals: std::array::from_fn(|i| {
                let v = self.shared.totals[i].load(Ordering::Relaxed);
                (v != NONE).then_some(v)
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approx(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-6, "{a} != {b}");
    }

    #[test]
    fn window_over_scripted_readings() {
        let epoch = Instant::now();
        // Every 200 ms: host CPU 0.1, 0.3, 0.5; RSS grows; 1 MB received per tick.
        let source = ScriptedHostSource::new(|tick, _| HostReading {
            host_cpu: Some(0.1 + 0.2 * tick as f64),
            process_cpu: Some(0.05),
            process_memory: Some(1_000 + tick * 100),
            network_received: Some(tick * 1_000_000),
            network_transmitted: Some(0),
            disk_read: None,
            disk_written: None,
        });
        let (host, mut ticker) =
            HostSampler::manual(HostSamplerConfig::default(), Box::new(source), epoch);
        let at = |ms: u64| epoch + Duration::from_millis(ms);
        for i in 0..3 {
            ticker.tick(at(i * 200));
        }
        assert_eq!(host.ticks(), 3);
        // [100, 500]: 0.1 × 100 + 0.3 × 200 + 0.5 × 100 = 120 / 400 = 0.3.
        let w = host.window(at(100), at(500)).unwrap();
        assert_eq!(w.samples, 3);
        approx(w.host_cpu_utilization_mean.unwrap(), 0.3);
        approx(w.process_cpu_utilization_mean.unwrap(), 0.05);
        assert_eq!(w.process_memory_max, Some(1_200));
        // The first sample has no rate; then 1 MB per 200 ms = 5 MB/s.
        approx(w.network_receive_bytes_per_second.unwrap(), 5_000_000.0);
        approx(w.network_transmit_bytes_per_second.unwrap(), 0.0);
        assert_eq!(w.disk_read_bytes_per_second, None);
        let latest = host.latest().unwrap();
        assert_eq!(latest.totals[0], Some(2_000_000));
        assert_eq!(latest.totals[2], None);
        assert!(host.window(at(500), at(100)).is_none());
    }

    #[test]
    fn sysinfo_source_reads_this_process() {
        let mut s = SysinfoSource::new();
        let first = s.sample(Instant::now());
        assert_eq!(first.host_cpu, None, "CPU usage needs two readings");
        assert!(first.process_memory.is_some_and(|m| m > 0));
        std::thread::sleep(sysinfo::MINIMUM_CPU_UPDATE_INTERVAL);
        let second = s.sample(Instant::now());
        let cpu = second.host_cpu.unwrap();
        assert!((0.0..=1.0).contains(&cpu), "{cpu}");
        assert!(second.process_cpu.is_some());
    }

    #[test]
    fn threaded_sampler_ticks_and_stops_on_drop() {
        let source = ScriptedHostSource::new(|_, _| HostReading {
            host_cpu: Some(0.5),
            ..HostReading::default()
        });
        let config = HostSamplerConfig {
            interval: Duration::from_millis(5),
            ..HostSamplerConfig::default()
        };
        let host = HostSampler::with_source(config, Box::new(source)).unwrap();
        let started = Instant::now();
        while host.ticks() < 3 && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(host.ticks() >= 3);
        let now = Instant::now();
        let w = host.window(now - Duration::from_millis(10), now).unwrap();
        approx(w.host_cpu_utilization_mean.unwrap(), 0.5);
        let shared = Arc::clone(&host.shared);
        drop(host);
        assert!(shared.stop.load(Ordering::Acquire));
    }
}
