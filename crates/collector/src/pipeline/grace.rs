//! [`GraceLearner`]: how long a trace waits for its late spans, learned from the spans that
//! came too late.
//!
//! `assembly.grace` is the least wait after a trace's request span arrives. When a request's
//! parts come from several services that export separately — a router and its prefill and
//! decode workers, each through its own batch processor (5 s by default in the OpenTelemetry
//! SDKs) — they arrive seconds apart, and those after the wait are late: shown in the stored
//! trace, left out of the request's record. Each late span merged into a stored trace says how
//! long the wait would have had to be (from the request span's arrival to its own), and so
//! does each span that arrived in time but after `grace` (which keeps a learned wait once it
//! holds the parts); the wait becomes the longest such need of the last ten minutes plus a
//! tenth, within `[grace, max_grace]`, and falls back to `grace` once none has come for ten
//! minutes. A need beyond `max_grace` is left out (no wait within bounds would help it), and
//! so is a span the stored trace already holds (an exporter's retry, not a late part).
//!
//! Late spans are seen only for traces still in the recent-trace ring (at high rates a sample
//! of them), and at the tick that handles them (up to one tick later than they arrived). An
//! outer service's request span arriving late re-opens its trace instead (a request of its
//! own): it teaches nothing here.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long a need is remembered.
const MEMORY: Duration = Duration::from_secs(600);
/// The needs are kept per minute (their maximum).
const BIN: Duration = Duration::from_secs(60);

/// The grace period in use, learned within its bounds (see the module docs).
#[derive(Debug)]
pub(crate) struct GraceLearner {
    floor: Duration,
    ceiling: Duration,
    current: Duration,
    origin: Option<Instant>,
    /// (minute since `origin`, the longest need seen in it), oldest first.
    needs: VecDeque<(u64, Duration)>,
}

impl GraceLearner {
    /// Waits `floor` (`assembly.grace`) until a late span says more is needed, at most
    /// `ceiling` (`assembly.max_grace`; at or below `floor`, nothing is learned).
    pub(crate) fn new(floor: Duration, ceiling: Duration) -> Self {
        Self {
            floor,
            ceiling: ceiling.max(floor),
            current: floor,
            origin: None,
            needs: VecDeque::new(),
        }
    }

    /// The grace period in use.
    #[cfg(test)]
    pub(crate) fn current(&self) -> Duration {
        self.current
    }

    /// A span of a completed trace arrived `need` after the trace's grace period began.
    /// Returns whether that is past the ceiling (no wait within bounds would have included it).
    pub(crate) fn observe(&mut self, now: Instant, need: Duration) -> bool {
        if need > self.ceiling {
            return self.ceiling > self.floor;
        }
        if need <= self.floor {
            return false;
        }
        let bin = self.bin(now);
        match self.needs.back_mut() {
            Some((b, longest)) if *b == bin => *longest = (*longest).max(need),
            _ => self.needs.push_back((bin, need)),
        }
        false
    }

    /// The grace period from `now` (needs older than ten minutes forgotten): `Some` when it
    /// changed.
    pub(crate) fn refresh(&mut self, now: Instant) -> Option<Duration> {
        let bin = self.bin(now);
        let kept = MEMORY.as_secs() / BIN.as_secs();
        while self.needs.front().is_some_and(|(b, _)| b + kept <= bin) {
            self.needs.pop_front();
        }
        let longest = self.needs.iter().map(|(_, n)| *n).max();
        let grace = longest.map_or(self.floor, |n| (n + n / 10).clamp(self.floor, self.ceiling));
        (grace != self.current).then(|| {
            self.current = grace;
            grace
        })
    }

    fn bin(&mut self, now: Instant) -> u64 {
        let origin = *self.origin.get_or_insert(now);
        now.saturating_duration_since(origin).as_secs() / BIN.as_secs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(f64) -> Duration = Duration::from_secs_f64;

    #[test]
    fn the_wait_follows_the_longest_need_within_its_bounds_and_falls_back() {
        let t0 = Instant::now();
        let mut g = GraceLearner::new(S(2.0), S(10.0));
        assert_eq!(g.refresh(t0), None, "nothing learned yet");
        g.observe(t0, S(1.5));
        assert_eq!(g.refresh(t0), None, "within the floor: nothing to learn");
        g.observe(t0, S(5.0));
        assert_eq!(g.refresh(t0), Some(S(5.5)), "the need and a tenth");
        g.observe(t0 + S(30.0), S(4.0));
        assert_eq!(
            g.refresh(t0 + S(30.0)),
            None,
            "a shorter need changes nothing"
        );
        g.observe(t0 + S(90.0), S(9.5));
        assert_eq!(
            g.refresh(t0 + S(90.0)),
            Some(S(10.0)),
            "at most the ceiling"
        );
        assert!(g.observe(t0 + S(100.0), S(60.0)), "past the ceiling: said");
        assert_eq!(
            g.refresh(t0 + S(100.0)),
            None,
            "a need past the ceiling is left out"
        );
        // Ten minutes on, the 9.5 s need's minute is still remembered; after its own ten, no
        // need is left: back to the floor.
        assert_eq!(g.refresh(t0 + S(650.0)), None);
        assert_eq!(g.refresh(t0 + S(720.0)), Some(S(2.0)));
        assert_eq!(g.current(), S(2.0));
    }

    #[test]
    fn a_ceiling_at_the_floor_learns_nothing() {
        let t0 = Instant::now();
        let mut g = GraceLearner::new(S(2.0), S(2.0));
        assert!(
            !g.observe(t0, S(5.0)),
            "no learning asked for: nothing to say"
        );
        assert_eq!(g.refresh(t0), None);
        assert_eq!(g.current(), S(2.0));
    }
}
