//! [`EnergyCounter`]: turns a device's raw energy counter into a monotonic total, across counter
//! wrap-around and resets (driver reload, GPU reset).
//!
//! A decrease is a wrap if the wrapped difference is physically plausible (at most `max_watts`
//! for the time between the readings), else a reset, after which the new raw value is the energy
//! since the reset (if that is plausible; otherwise nothing is added). An implausible jump upwards
//! is ignored the same way. Totals start at 0 J at the first reading.

/// Upper bound on one device's power used to tell wrap from reset, in watts (generous: an H200
/// board draws at most ~700 W, a GB200 superchip ~2.7 kW).
pub(crate) const DEFAULT_MAX_WATTS: f64 = 5_000.0;

/// Monotonic joules from a raw millijoule counter of `bits` bits.
#[derive(Clone, Debug)]
pub(crate) struct EnergyCounter {
    bits: u32,
    max_watts: f64,
    last: Option<(u64, u64)>,
    total_joules: f64,
}

impl EnergyCounter {
    /// A counter of `bits` bits (1–64) in millijoules.
    pub(crate) fn new(bits: u32, max_watts: f64) -> Self {
        Self {
            bits: bits.clamp(1, 64),
            max_watts,
            last: None,
            total_joules: 0.0,
        }
    }

    /// Feeds a raw reading (mJ) taken at `t_ns`; returns the monotonic total in joules.
    pub(crate) fn update(&mut self, raw_mj: u64, t_ns: u64) -> f64 {
        let modulus: u128 = 1u128 << self.bits;
        let raw = u128::from(raw_mj) % modulus;
        if let Some((last_raw, last_t)) = self.last {
            let last_raw = u128::from(last_raw);
            let dt_s = t_ns.saturating_sub(last_t) as f64 / 1e9;
            // mJ; one extra joule of slack absorbs timestamp jitter.
            let plausible = self.max_watts * dt_s * 1000.0 + 1000.0;
            let delta_mj = if raw >= last_raw {
                let d = (raw - last_raw) as f64;
                if d <= plausible { d } else { 0.0 }
            } else {
                let wrapped = (modulus - last_raw + raw) as f64;
                if wrapped <= plausible {
                    wrapped
                } else if (raw as f64) <= plausible {
                    raw as f64
                } else {
                    0.0
                }
            };
            self.total_joules += delta_mj / 1000.0;
        }
        self.last = Some((raw as u64, t_ns));
        self.total_joules
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn counts_from_zero_at_the_first_reading() {
        let mut c = EnergyCounter::new(64, DEFAULT_MAX_WATTS);
        assert_eq!(c.update(1_000_000, 0), 0.0);
        assert_eq!(c.update(1_500_000, S), 500.0);
        assert_eq!(c.update(1_500_250, 2 * S), 500.25);
    }

    #[test]
    fn wraps_a_32_bit_counter() {
        let mut c = EnergyCounter::new(32, DEFAULT_MAX_WATTS);
        let max = u64::from(u32::MAX);
        // 100_000 mJ short of the modulus (2^32 = max + 1), then 50 J past it.
        c.update(max + 1 - 100_000, 0);
        let total = c.update(50_000, S);
        assert!((total - 150.0).abs() < 1e-9, "{total}");
    }

    #[test]
    fn wraps_a_64_bit_counter() {
        let mut c = EnergyCounter::new(64, DEFAULT_MAX_WATTS);
        c.update(u64::MAX - 9, 0);
        assert!((c.update(20, S / 10) - 0.030).abs() < 1e-12);
    }

    #[test]
    fn a_reset_counts_the_energy_since_the_reset() {
        let mut c = EnergyCounter::new(64, DEFAULT_MAX_WATTS);
        c.update(900_000_000, 0);
        c.update(900_100_000, S); // +100 J
        // Driver reload: the counter restarts near zero.
        let total = c.update(40_000, 2 * S);
        assert!((total - 140.0).abs() < 1e-9, "{total}");
        assert!((c.update(90_000, 3 * S) - 190.0).abs() < 1e-9);
    }

    #[test]
    fn implausible_jumps_are_ignored() {
        let mut c = EnergyCounter::new(64, DEFAULT_MAX_WATTS);
        c.update(0, 0);
        // 1 GJ in 100 ms is not a GPU.
        assert_eq!(c.update(1_000_000_000_000, S / 10), 0.0);
        assert!((c.update(1_000_000_010_000, S / 5) - 10.0).abs() < 1e-9);
    }
}
