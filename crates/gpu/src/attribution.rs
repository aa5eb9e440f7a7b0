//! [`EnergyAttribution`]: splits each sampling interval's GPU energy across the requests active
//! in it, by their share of the tokens processed in that interval.
//!
//! **This is an estimate.** Under continuous batching the requests of a batch share every
//! kernel; token share is a reasonable proxy for the work each did, but prefill tokens are far
//! cheaper per token than decode steps, and attention cost grows with context length. Rules:
//! - an interval's energy goes to the requests registered in it, in proportion to the tokens each
//!   reported during that interval ([`RequestEnergy::tokens`]: prompt tokens when prefilled,
//!   output tokens as generated);
//! - if requests were active but none reported a token (e.g. all in a long prefill that reports
//!   at its end), the energy is split equally among them;
//! - an interval with no active request is idle energy and is attributed to nobody;
//! - the devices sampled are assumed to serve all of the process's requests.
//!
//! The request's hot path is one relaxed `fetch_add` on its own counter; registration takes a
//! short lock once per request. The sampler thread reads every active counter once per tick.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// Default number of timeline points kept per request before the timeline is thinned.
pub const DEFAULT_TIMELINE_POINTS: usize = 1024;

#[derive(Debug, Default)]
struct RequestSlot {
    tokens: AtomicU64,
    ended: AtomicBool,
    /// Tokens already accounted for (sampler thread only).
    seen: AtomicU64,
    /// Total attributed joules, as `f64` bits.
    total: AtomicU64,
    /// `(ns since epoch, cumulative joules)`, written by the sampler thread.
    timeline: Mutex<Vec<(u64, f64)>>,
}

impl RequestSlot {
    fn add(&self, interval_start: u64, t: u64, joules: f64, max_points: usize) {
        if joules <= 0.0 {
            return;
        }
        let before = f64::from_bits(self.total.load(Ordering::Relaxed));
        let after = before + joules;
        self.total.store(after.to_bits(), Ordering::Relaxed);
        let mut tl = self.timeline.lock().unwrap_or_else(PoisonError::into_inner);
        if tl.last().is_none_or(|(last_t, _)| *last_t < interval_start) {
            tl.push((interval_start, before));
        }
        tl.push((t, after));
        if tl.len() >= max_points.max(4) {
            thin(&mut tl);
        }
    }

    fn cumulative_at(&self, t: u64) -> f64 {
        let tl = self.timeline.lock().unwrap_or_else(PoisonError::into_inner);
        let i = tl.partition_point(|(pt, _)| *pt <= t);
        match (i.checked_sub(1).and_then(|j| tl.get(j)), tl.get(i)) {
            (None, _) => 0.0,
            (Some((_, c)), None) => *c,
            (Some((t0, c0)), Some((t1, c1))) => {
                let span = t1.saturating_sub(*t0);
                if span == 0 {
                    *c1
                } else {
                    c0 + (c1 - c0) * (t - t0) as f64 / span as f64
                }
            }
        }
    }
}

/// Keeps every other point (the first and last always): halves the time resolution, keeps
/// cumulative values exact at the points that remain.
fn thin(tl: &mut Vec<(u64, f64)>) {
    let last = tl.last().copied();
    let mut i = 0usize;
    tl.retain(|_| {
        let keep = i.is_multiple_of(2);
        i += 1;
        keep
    });
    if let Some(last) = last
        && tl.last() != Some(&last)
    {
        tl.push(last);
    }
}

#[derive(Debug, Default)]
struct ActiveSet {
    slots: Vec<Arc<RequestSlot>>,
    deltas: Vec<u64>,
    last_tick: Option<u64>,
}

#[derive(Debug)]
struct Inner {
    epoch: Instant,
    max_points: usize,
    active: Mutex<ActiveSet>,
}

/// The registry of in-flight requests whose energy is attributed. Cheap to clone.
///
/// ```
/// use infertrace_gpu::EnergyAttribution;
/// let epoch = std::time::Instant::now();
/// let attribution = EnergyAttribution::new(epoch);
/// let a = attribution.begin_request();
/// let b = attribution.begin_request();
/// a.tokens(30);
/// b.tokens(10);
/// attribution.distribute(0, Some(0.0)); // first tick: baseline
/// a.tokens(3);
/// b.tokens(1);
/// attribution.distribute(100_000_000, Some(40.0)); // 40 J in (0, 100 ms]
/// assert!((a.attributed() - 30.0).abs() < 1e-9);
/// assert!((b.attributed() - 10.0).abs() < 1e-9);
/// ```
#[derive(Clone, Debug)]
pub struct EnergyAttribution {
    inner: Arc<Inner>,
}

/// One request's handle: report tokens, read the attributed energy. Cheap to clone; the request
/// counts as ended when [`end`](Self::end) is called or the last clone is dropped.
#[derive(Clone, Debug)]
pub struct RequestEnergy {
    guard: Arc<EndGuard>,
    epoch: Instant,
}

#[derive(Debug)]
struct EndGuard(Arc<RequestSlot>);

impl Drop for EndGuard {
    fn drop(&mut self) {
        self.0.ended.store(true, Ordering::Release);
    }
}

fn ns_since(epoch: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

impl RequestEnergy {
    /// Reports `n` tokens processed for this request (prompt tokens at prefill, output tokens as
    /// they are generated). One relaxed atomic add.
    #[inline]
    pub fn tokens(&self, n: u64) {
        self.guard.0.tokens.fetch_add(n, Ordering::Relaxed);
    }

    /// Marks the request finished: it takes part in the current interval, then leaves.
    pub fn end(&self) {
        self.guard.0.ended.store(true, Ordering::Release);
    }

    /// Energy attributed so far, joules (an estimate; covers completed sampling intervals only).
    pub fn attributed(&self) -> f64 {
        f64::from_bits(self.guard.0.total.load(Ordering::Relaxed))
    }

    /// Energy attributed within `[start, end]`, joules: each interval's share is spread evenly
    /// over the interval. Covers completed sampling intervals only (the one in progress at `end`
    /// is not included).
    pub fn attributed_between(&self, start: Instant, end: Instant) -> f64 {
        if end <= start {
            return 0.0;
        }
        let slot = &self.guard.0;
        let (s, e) = (ns_since(self.epoch, start), ns_since(self.epoch, end));
        (slot.cumulative_at(e) - slot.cumulative_at(s)).max(0.0)
    }
}

impl EnergyAttribution {
    /// A registry whose tick times are nanoseconds since `epoch`.
    pub fn new(epoch: Instant) -> Self {
        Self::with_timeline_points(epoch, DEFAULT_TIMELINE_POINTS)
    }

    /// Like [`new`](Self::new), keeping at most `max_points` timeline points per request (the
    /// timeline is thinned to half its resolution when full).
    pub fn with_timeline_points(epoch: Instant, max_points: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                epoch,
                max_points,
                active: Mutex::new(ActiveSet::default()),
            }),
        }
    }

    /// Registers a request; it takes part in every interval until it ends.
    pub fn begin_request(&self) -> RequestEnergy {
        let slot = Arc::new(RequestSlot::default());
        self.inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .slots
            .push(Arc::clone(&slot));
        RequestEnergy {
            guard: Arc::new(EndGuard(slot)),
            epoch: self.inner.epoch,
        }
    }

    /// Requests currently registered (ended ones leave at the next tick).
    pub fn active_requests(&self) -> usize {
        self.inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .slots
            .len()
    }

    /// Splits `joules` (the devices' energy over the interval ending at `t_ns`, `None` when
    /// unknown) across the active requests. Called by the sampler once per tick.
    pub fn distribute(&self, t_ns: u64, joules: Option<f64>) {
        let mut guard = self
            .inner
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let set = &mut *guard;
        let interval_start = set.last_tick.unwrap_or(t_ns);
        set.last_tick = Some(t_ns);
        set.deltas.clear();
        let mut total: u64 = 0;
        for slot in &set.slots {
            let now = slot.tokens.load(Ordering::Relaxed);
            let delta = now.saturating_sub(slot.seen.swap(now, Ordering::Relaxed));
            total = total.saturating_add(delta);
            set.deltas.push(delta);
        }
        if let Some(e) = joules.filter(|e| *e > 0.0 && e.is_finite())
            && !set.slots.is_empty()
        {
            let n = set.slots.len() as f64;
            for (slot, delta) in set.slots.iter().zip(&set.deltas) {
                let share = if total > 0 {
                    *delta as f64 / total as f64
                } else {
                    1.0 / n
                };
                slot.add(interval_start, t_ns, e * share, self.inner.max_points);
            }
        }
        set.slots.retain(|s| !s.ended.load(Ordering::Acquire));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    fn approx(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-9, "{a} != {b}");
    }

    #[test]
    fn splits_by_token_share_per_interval() {
        let epoch = Instant::now();
        let attr = EnergyAttribution::new(epoch);
        let a = attr.begin_request();
        let b = attr.begin_request();
        attr.distribute(0, None);
        a.tokens(3);
        b.tokens(1);
        attr.distribute(100 * MS, Some(100.0)); // a 75, b 25
        a.tokens(1);
        b.tokens(1);
        attr.distribute(200 * MS, Some(50.0)); // a 25, b 25
        approx(a.attributed(), 100.0);
        approx(b.attributed(), 50.0);
        // Within (0, 100]: a got 75 J spread evenly; half of it in [50, 100].
        let at = |ms: u64| epoch + Duration::from_millis(ms);
        approx(a.attributed_between(at(50), at(100)), 37.5);
        approx(a.attributed_between(at(0), at(200)), 100.0);
        approx(a.attributed_between(at(150), at(1000)), 12.5);
        approx(a.attributed_between(at(300), at(400)), 0.0);
    }

    #[test]
    fn no_tokens_means_an_equal_split_and_no_requests_means_idle() {
        let attr = EnergyAttribution::new(Instant::now());
        attr.distribute(0, None);
        attr.distribute(100 * MS, Some(30.0)); // idle: nobody
        let a = attr.begin_request();
        let b = attr.begin_request();
        let c = attr.begin_request();
        attr.distribute(200 * MS, Some(30.0));
        for r in [&a, &b, &c] {
            approx(r.attributed(), 10.0);
        }
    }

    #[test]
    fn ended_requests_take_part_in_their_last_interval_then_leave() {
        let attr = EnergyAttribution::new(Instant::now());
        let a = attr.begin_request();
        let b = attr.begin_request();
        attr.distribute(0, None);
        a.tokens(1);
        b.tokens(1);
        a.end();
        attr.distribute(100 * MS, Some(10.0));
        approx(a.attributed(), 5.0);
        assert_eq!(attr.active_requests(), 1);
        b.tokens(1);
        attr.distribute(200 * MS, Some(10.0));
        approx(a.attributed(), 5.0);
        approx(b.attributed(), 15.0);
        drop(b);
        attr.distribute(300 * MS, Some(10.0));
        assert_eq!(attr.active_requests(), 0);
    }

    #[test]
    fn unknown_energy_attributes_nothing_but_consumes_tokens() {
        let attr = EnergyAttribution::new(Instant::now());
        let a = attr.begin_request();
        let b = attr.begin_request();
        attr.distribute(0, None);
        a.tokens(100);
        attr.distribute(100 * MS, None);
        b.tokens(1);
        attr.distribute(200 * MS, Some(8.0));
        // a's 100 tokens belonged to the unknown interval: b gets everything.
        approx(a.attributed(), 0.0);
        approx(b.attributed(), 8.0);
    }

    #[test]
    fn timelines_are_thinned_but_totals_stay_exact() {
        let epoch = Instant::now();
        let attr = EnergyAttribution::with_timeline_points(epoch, 16);
        let a = attr.begin_request();
        attr.distribute(0, None);
        for i in 1..=100u64 {
            a.tokens(1);
            attr.distribute(i * 10 * MS, Some(1.0));
        }
        approx(a.attributed(), 100.0);
        let len = a.guard.0.timeline.lock().unwrap().len();
        assert!(len < 16, "{len}");
        let at = |ms: u64| epoch + Duration::from_millis(ms);
        approx(a.attributed_between(at(0), at(1000)), 100.0);
        // Linear in between (1 J per 10 ms throughout).
        let mid = a.attributed_between(at(0), at(500));
        assert!((mid - 50.0).abs() < 1.0, "{mid}");
    }
}
