//! The per-chunk clock: the CPU's invariant time-stamp counter where there is one, else the
//! monotonic clock in nanoseconds.
//!
//! Reading the counter is cheaper than `Instant::now()`, and the body wrapper reads a clock on
//! every chunk. Ticks are never converted with a global calibration: a request takes an
//! (`Instant`, ticks) pair at arrival and another at its end, and converts the ticks in between
//! with that pair's own ratio ([`TickSpan`]). Results are clamped into the request's
//! `[arrival, end]`, so even a misbehaving counter can only blur gap statistics, never produce a
//! negative or out-of-range time.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Current ticks (monotonic; unit depends on the source, see module docs).
#[inline]
pub(crate) fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    if *INVARIANT_TSC.get_or_init(invariant_tsc) {
        return rdtsc();
    }
    monotonic_nanos()
}

/// The time-stamp counter. The crate's only `unsafe`: `_rdtsc` is an `unsafe fn` in `core`,
/// and it is what keeps the per-chunk cost low (docs/PERFORMANCE.md, per streamed chunk).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline]
fn rdtsc() -> u64 {
    // SAFETY: `rdtsc` has no preconditions on x86_64; it only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(target_arch = "x86_64")]
static INVARIANT_TSC: OnceLock<bool> = OnceLock::new();

/// CPUID 0x8000_0007 EDX bit 8: the TSC ticks at a constant rate in every power state, and
/// the kernel keeps it synchronised across cores.
#[cfg(target_arch = "x86_64")]
fn invariant_tsc() -> bool {
    use core::arch::x86_64::__cpuid;
    __cpuid(0x8000_0000).eax >= 0x8000_0007 && (__cpuid(0x8000_0007).edx >> 8) & 1 == 1
}

fn monotonic_nanos() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Two (instant, ticks) anchors and the conversion between them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TickSpan {
    start_ticks: u64,
    /// The span in ticks and in nanoseconds, as floats: converted once per span, not per mark.
    span_ticks: f64,
    span_nanos: f64,
}

impl TickSpan {
    /// The anchors `(start, start_ticks)` and `(end, end_ticks)`.
    pub(crate) fn new(start: Instant, start_ticks: u64, end: Instant, end_ticks: u64) -> Self {
        Self {
            start_ticks,
            span_ticks: end_ticks.saturating_sub(start_ticks) as f64,
            span_nanos: end.saturating_duration_since(start).as_nanos() as f64,
        }
    }

    /// A tick count (a gap) as a duration.
    pub(crate) fn duration(&self, ticks: u64) -> Duration {
        if self.span_ticks == 0.0 {
            return Duration::ZERO;
        }
        let ns = (ticks as f64) * self.span_nanos / self.span_ticks;
        Duration::from_nanos(ns.min(self.span_nanos) as u64)
    }

    /// Time from the start anchor to the instant read as `at` ticks, within the span.
    pub(crate) fn offset(&self, at: u64) -> Duration {
        self.duration(at.saturating_sub(self.start_ticks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_follow_the_monotonic_clock() {
        let (i0, t0) = (Instant::now(), ticks());
        std::thread::sleep(Duration::from_millis(20));
        let tm = ticks();
        std::thread::sleep(Duration::from_millis(20));
        let (i1, t1) = (Instant::now(), ticks());
        assert!(t0 < tm && tm < t1);
        let span = TickSpan::new(i0, t0, i1, t1);
        let mid = span.offset(tm).as_secs_f64();
        let total = i1.duration_since(i0).as_secs_f64();
        // The midpoint read lies between the two sleeps: at least 20 ms in, at least 20 ms left.
        assert!(mid >= 0.019 && mid <= total - 0.019, "mid {mid} of {total}");
    }

    #[test]
    fn conversion_is_clamped() {
        let now = Instant::now();
        let span = TickSpan::new(now, 100, now + Duration::from_micros(10), 200);
        assert_eq!(span.offset(150), Duration::from_micros(5));
        assert_eq!(span.offset(50), Duration::ZERO);
        assert_eq!(span.offset(10_000), Duration::from_micros(10));
        let empty = TickSpan::new(now, 5, now, 5);
        assert_eq!(empty.duration(1_000), Duration::ZERO);
    }
}
