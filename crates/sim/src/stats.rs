//! [`EngineStats`]: counters of the simulated engine, including its busy fraction (the share of
//! time a step was running: a simulated GPU utilisation). While work is waiting, the gap between
//! two steps (the simulator's own CPU time, or a timer late on a busy machine) counts as busy:
//! the simulated GPU idles only while the engine waits for an arrival, so its utilisation does
//! not depend on how loaded the machine running the simulation is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Shared atomic counters the engine updates and handles read.
#[derive(Debug)]
pub(crate) struct StatsCell {
    pub(crate) started: Instant,
    pub(crate) busy_nanos: AtomicU64,
    /// Instant (nanos since `started`) the current step began, or `u64::MAX` when idle.
    pub(crate) step_started: AtomicU64,
    pub(crate) steps: AtomicU64,
    pub(crate) running: AtomicU64,
    pub(crate) waiting: AtomicU64,
    pub(crate) submitted: AtomicU64,
    pub(crate) finished: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) prompt_tokens: AtomicU64,
    pub(crate) output_tokens: AtomicU64,
    /// Tokens held in the KV cache by the running batch (prefilled + generated).
    pub(crate) context_tokens: AtomicU64,
}

const IDLE: u64 = u64::MAX;

impl StatsCell {
    pub(crate) fn new() -> Self {
        Self {
            started: Instant::now(),
            busy_nanos: AtomicU64::new(0),
            step_started: AtomicU64::new(IDLE),
            steps: AtomicU64::new(0),
            running: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            submitted: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            output_tokens: AtomicU64::new(0),
            context_tokens: AtomicU64::new(0),
        }
    }

    fn nanos_since_start(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.started).as_nanos()).unwrap_or(IDLE - 1)
    }

    pub(crate) fn step_begin(&self, at: Instant) {
        self.step_started
            .store(self.nanos_since_start(at), Ordering::Release);
    }

    pub(crate) fn step_end(&self, start: Instant, end: Instant) {
        let busy = u64::try_from(end.saturating_duration_since(start).as_nanos()).unwrap_or(0);
        self.busy_nanos.fetch_add(busy, Ordering::AcqRel);
        self.step_started.store(IDLE, Ordering::Release);
        self.steps.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn snapshot(&self) -> EngineStats {
        let now = Instant::now();
        let mut busy = self.busy_nanos.load(Ordering::Acquire);
        let step = self.step_started.load(Ordering::Acquire);
        if step != IDLE {
            busy += self.nanos_since_start(now).saturating_sub(step);
        }
        let load = |a: &AtomicU64| a.load(Ordering::Acquire);
        EngineStats {
            at: now,
            elapsed: now.saturating_duration_since(self.started),
            busy: Duration::from_nanos(busy),
            steps: load(&self.steps),
            running: load(&self.running),
            waiting: load(&self.waiting),
            submitted: load(&self.submitted),
            finished: load(&self.finished),
            failed: load(&self.failed),
            cancelled: load(&self.cancelled),
            prompt_tokens: load(&self.prompt_tokens),
            output_tokens: load(&self.output_tokens),
            context_tokens: load(&self.context_tokens),
        }
    }
}

/// A snapshot of the engine's counters. Subtract two with
/// [`busy_fraction_since`](Self::busy_fraction_since) to get the utilisation over a window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineStats {
    /// When the snapshot was taken.
    pub at: Instant,
    /// Time since the simulator started.
    pub elapsed: Duration,
    /// Total time steps were running (including the current step so far).
    pub busy: Duration,
    /// Steps completed.
    pub steps: u64,
    /// Sequences in the running batch (current batch size).
    pub running: u64,
    /// Requests waiting for a batch slot (queue length).
    pub waiting: u64,
    /// Requests accepted by `submit`.
    pub submitted: u64,
    /// Requests finished normally.
    pub finished: u64,
    /// Requests failed with an engine error.
    pub failed: u64,
    /// Requests cancelled (stream dropped).
    pub cancelled: u64,
    /// Prompt tokens prefilled.
    pub prompt_tokens: u64,
    /// Output tokens produced.
    pub output_tokens: u64,
    /// Tokens the running batch holds in the KV cache (prompt tokens prefilled so far plus
    /// tokens generated, summed over the running sequences).
    pub context_tokens: u64,
}

impl EngineStats {
    /// Share of time since start that a step was running, 0–1.
    pub fn busy_fraction(&self) -> f64 {
        fraction(self.busy, self.elapsed)
    }

    /// Share of the time between `earlier` and `self` that a step was running, 0–1.
    pub fn busy_fraction_since(&self, earlier: &EngineStats) -> f64 {
        fraction(
            self.busy.saturating_sub(earlier.busy),
            self.at.saturating_duration_since(earlier.at),
        )
    }
}

fn fraction(part: Duration, whole: Duration) -> f64 {
    if whole.is_zero() {
        return 0.0;
    }
    (part.as_secs_f64() / whole.as_secs_f64()).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_fraction_over_a_window() {
        let cell = StatsCell::new();
        let a = cell.snapshot();
        let t = Instant::now();
        cell.step_begin(t);
        std::thread::sleep(Duration::from_millis(20));
        let mid = cell.snapshot();
        assert!(mid.busy >= Duration::from_millis(20), "current step counts");
        cell.step_end(t, t + Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(20));
        let b = cell.snapshot();
        let f = b.busy_fraction_since(&a);
        // 20 ms busy over ≥ 40 ms
        assert!(f > 0.1 && f <= 0.5 + 1e-9, "{f}");
        assert_eq!(b.steps, 1);
        assert_eq!(b.busy, Duration::from_millis(20));
    }
}
