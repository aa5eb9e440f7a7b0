//! What `gpu-probe` counts over its run, and when its proof fails: a tick counts only when a
//! device gave a real reading, every device must give one, and GPM errors are counted.

use crate::nvml_source::GpuUnavailable;
use crate::sampler::TickReport;

/// One device's counts over a probe run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceTally {
    /// Ticks on which the device gave a real reading ([`DeviceSample::has_reading`](crate::DeviceSample::has_reading)).
    pub readings: u64,
    /// Ticks on which the device was lost.
    pub lost: u64,
    /// Ticks that closed a GPM interval with at least one metric read.
    pub gpm_readings: u64,
    /// GPM metrics that failed to read ([`DeviceSample::gpm_errors`](crate::DeviceSample::gpm_errors)).
    pub gpm_errors: u64,
}

/// Counts over the ticks a probe saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeTally {
    /// Ticks seen.
    pub ticks: u64,
    /// Ticks on which at least one device gave a real reading.
    pub measured_ticks: u64,
    /// Per device, in the sampler's device order.
    pub devices: Vec<DeviceTally>,
}

/// The probe's conclusion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeVerdict {
    /// Every device gave at least one real reading.
    Proven,
    /// NVML is not available on this machine and no GPU was expected: nothing was proven, and
    /// that is not a failure.
    NotApplicable(String),
    /// The proof failed, and why.
    Failed(String),
}

impl ProbeVerdict {
    /// The process exit status: 0 unless the proof failed (1).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Proven | Self::NotApplicable(_) => 0,
            Self::Failed(_) => 1,
        }
    }

    /// `proven`, `not-applicable` or `failed`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Proven => "proven",
            Self::NotApplicable(_) => "not-applicable",
            Self::Failed(_) => "failed",
        }
    }
}

impl ProbeTally {
    /// An empty tally over `devices` devices.
    pub fn new(devices: usize) -> Self {
        Self {
            devices: vec![DeviceTally::default(); devices],
            ..Self::default()
        }
    }

    /// Counts one tick.
    pub fn add(&mut self, report: &TickReport) {
        self.ticks += 1;
        let mut measured = false;
        for s in &report.samples {
            let Some(d) = self.devices.get_mut(s.device) else {
                continue;
            };
            d.gpm_errors += u64::from(s.gpm_errors);
            if s.lost {
                d.lost += 1;
            } else if s.has_reading() {
                d.readings += 1;
                measured = true;
            }
            if !s.lost && s.gpm.is_some_and(|g| !g.is_empty()) {
                d.gpm_readings += 1;
            }
        }
        if measured {
            self.measured_ticks += 1;
        }
    }

    /// GPM metric errors over all devices.
    pub fn gpm_errors(&self) -> u64 {
        self.devices.iter().map(|d| d.gpm_errors).sum()
    }

    /// Proven when every device gave at least one real reading.
    pub fn verdict(&self) -> ProbeVerdict {
        if self.devices.is_empty() {
            return ProbeVerdict::Failed("NVML loaded but no device was found".into());
        }
        if self.measured_ticks == 0 {
            return ProbeVerdict::Failed(format!(
                "NVML loaded and {} device(s) found, but none of {} ticks had a reading",
                self.devices.len(),
                self.ticks
            ));
        }
        let silent: Vec<String> = (self.devices.iter().enumerate())
            .filter(|(_, d)| d.readings == 0)
            .map(|(i, _)| i.to_string())
            .collect();
        if !silent.is_empty() {
            return ProbeVerdict::Failed(format!(
                "device(s) {} gave no reading in {} ticks",
                silent.join(", "),
                self.ticks
            ));
        }
        ProbeVerdict::Proven
    }
}

/// The verdict when the sampler could not start: a failure when NVML loaded (it found no GPU)
/// or when a GPU was expected (`--expect-gpu`), otherwise not applicable.
pub fn unavailable_verdict(reason: &GpuUnavailable, expect_gpu: bool) -> ProbeVerdict {
    let failed =
        expect_gpu || reason.nvml_loaded() || matches!(reason, GpuUnavailable::ThreadFailed(_));
    if failed {
        ProbeVerdict::Failed(reason.to_string())
    } else {
        ProbeVerdict::NotApplicable(reason.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{
        DeviceInfo, DeviceSample, GpmReading, GpuReading, GpuSampler, GpuSamplerConfig,
        ScriptedSource,
    };

    /// Runs `ticks` ticks of a sampler over two scripted devices whose samples `script` makes,
    /// and tallies them as the probe does.
    fn probe(
        ticks: u64,
        script: impl FnMut(u64, Instant, &mut Vec<DeviceSample>) + Send + 'static,
    ) -> ProbeTally {
        let devices = vec![
            DeviceInfo::new(0, "GPU-a", "scripted"),
            DeviceInfo::new(1, "GPU-b", "scripted"),
        ];
        let epoch = Instant::now();
        let source = Box::new(ScriptedSource::new(devices, script));
        let (sampler, mut ticker) = GpuSampler::manual(GpuSamplerConfig::default(), source, epoch);
        let mut tally = ProbeTally::new(sampler.devices().count());
        for i in 0..ticks {
            ticker.tick(epoch + Duration::from_millis(100 * i));
            tally.add(&sampler.last_tick());
        }
        tally
    }

    fn reading() -> GpuReading {
        GpuReading {
            utilization: Some(0.5),
            power_watts: Some(300.0),
            ..GpuReading::default()
        }
    }

    #[test]
    fn samples_that_are_not_lost_but_empty_prove_nothing() {
        let tally = probe(10, |_, _, out| {
            for device in 0..2 {
                out.push(DeviceSample {
                    device,
                    gpm: Some(GpmReading::default()),
                    ..DeviceSample::default()
                });
            }
        });
        assert_eq!((tally.ticks, tally.measured_ticks), (10, 0));
        assert!(matches!(tally.verdict(), ProbeVerdict::Failed(_)));
        assert_eq!(tally.verdict().exit_code(), 1);
    }

    #[test]
    fn a_device_that_never_reads_fails_the_proof() {
        let tally = probe(5, |_, _, out| {
            out.push(DeviceSample {
                device: 0,
                reading: reading(),
                ..DeviceSample::default()
            });
            out.push(DeviceSample {
                device: 1,
                lost: true,
                ..DeviceSample::default()
            });
        });
        assert_eq!(tally.measured_ticks, 5);
        assert_eq!(tally.devices[1].lost, 5);
        assert_eq!(
            tally.verdict(),
            ProbeVerdict::Failed("device(s) 1 gave no reading in 5 ticks".into())
        );
    }

    #[test]
    fn gpm_errors_are_counted_and_readings_prove() {
        let tally = probe(10, |tick, _, out| {
            for device in 0..2 {
                let closes_gpm = tick % 5 == 4;
                out.push(DeviceSample {
                    device,
                    reading: reading(),
                    gpm: closes_gpm.then_some(GpmReading {
                        sm_activity: Some(0.4),
                        ..GpmReading::default()
                    }),
                    // Device 1's tensor, occupancy and DRAM metrics fail each interval.
                    gpm_errors: if closes_gpm && device == 1 { 3 } else { 0 },
                    ..DeviceSample::default()
                });
            }
        });
        assert_eq!(tally.verdict(), ProbeVerdict::Proven);
        assert_eq!(tally.gpm_errors(), 6);
        assert_eq!(tally.devices[1].gpm_errors, 6);
        assert_eq!(tally.devices[0].gpm_errors, 0);
        assert_eq!(tally.devices[0].gpm_readings, 2);
    }

    #[test]
    fn no_gpu_fails_only_when_one_is_expected_or_nvml_loaded() {
        let missing = GpuUnavailable::LibraryNotFound("libnvidia-ml.so.1".into());
        assert_eq!(unavailable_verdict(&missing, false).exit_code(), 0);
        assert_eq!(
            unavailable_verdict(&missing, false).label(),
            "not-applicable"
        );
        assert_eq!(unavailable_verdict(&missing, true).exit_code(), 1);
        let none_visible = GpuUnavailable::NoVisibleDevices;
        assert_eq!(unavailable_verdict(&none_visible, false).exit_code(), 1);
        assert_eq!(
            unavailable_verdict(&GpuUnavailable::DriverNotLoaded, true).label(),
            "failed"
        );
    }
}
