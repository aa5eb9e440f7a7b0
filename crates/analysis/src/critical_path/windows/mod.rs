//! Continuous aggregation of critical paths over sliding windows.
//!
//! For each (service, span name) the windows answer: how many seconds of the requests' critical
//! paths did this span own, and what share of end-to-end latency is that — over all requests,
//! and over the slow ones only (those at or above the window's p90 and p99 e2e).
//!
//! Paths are not stored. Each time slot keeps, per (span key, e2e bucket), the critical seconds,
//! and per e2e bucket the request count and summed e2e. e2e buckets are logarithmic
//! (γ = 1.02 by default, so a bucket spans 2%): a window's p90 is found from the merged bucket
//! counts, and the tail sums are the sums over the buckets at or above the p90 (p99) bucket. A
//! request in the same 2% bucket as the percentile counts as "above" it.
//!
//! Distinct (service, span) keys are capped; at the cap a new key takes the place of one that
//! has recorded nothing for `reclaim_after` (its rows moved into the overflow row, counted by
//! [`CriticalPathWindows::reclaimed_keys`], its names handed out by
//! [`CriticalPathWindows::take_reclaimed`]), so a burst of unique span names cannot lock new
//! services out for longer; without such a key, segments are summed under [`OVERFLOW_LABEL`]
//! and counted ([`CriticalPathWindows::overflowed_segments`]).

use std::collections::BTreeMap;

// Span names and services come from clients: foldhash is seeded per process, and far cheaper
// than SipHash on the short keys looked up for every segment of every request.
use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::naming::aggregate_name;
use super::path::CriticalPath;
use crate::dense_buckets::DenseBuckets;
use crate::heap_size::{arc_str_bytes, map_table_bytes};
use crate::rounding::ceil_to_i32;
use infertrace_intern::PairCache;

use crate::text::Text;

mod stored;

/// The service and span label of the entry that collects keys beyond the cap: the label of
/// the KPI series' overflow too, so that one name means "folded past a cap" everywhere.
pub use crate::kpi::OVERFLOW_LABEL;

/// Limits and resolution of [`CriticalPathWindows`].
#[derive(Clone, Debug, PartialEq)]
pub struct CriticalPathWindowsConfig {
    /// Width of one time slot (the resolution of windows).
    pub slot: Duration,
    /// The longest window that can be asked for.
    pub retention: Duration,
    /// Distinct (service, span name) keys kept before folding into [`OVERFLOW_LABEL`].
    pub max_keys: usize,
    /// At the cap, a new key takes the place of one idle this long.
    pub reclaim_after: Duration,
    /// Ratio between consecutive e2e bucket bounds (> 1).
    pub gamma: f64,
}

impl Default for CriticalPathWindowsConfig {
    fn default() -> Self {
        Self {
            slot: Duration::from_secs(10),
            retention: Duration::from_secs(3600),
            max_keys: 256,
            reclaim_after: Duration::from_secs(60),
            gamma: 1.02,
        }
    }
}

/// A value for all requests and for the slow tails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct TailTriple {
    /// Over all requests of the window.
    pub all: f64,
    /// Over the requests at or above the window's p90 e2e.
    pub p90: f64,
    /// Over the requests at or above the window's p99 e2e.
    pub p99: f64,
}

/// One (service, span) line of a [`CriticalPathSummary`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CriticalPathEntry {
    /// `service.name` of the span.
    pub service: Arc<str>,
    /// Span name.
    pub span: Arc<str>,
    /// Critical-path seconds owned by this span, summed over the requests.
    pub seconds: TailTriple,
    /// `seconds` divided by the summed e2e latency of the same requests (0–1).
    pub share: TailTriple,
}

/// The aggregated critical path of a window (`GET /api/critical-path`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CriticalPathSummary {
    /// The window actually covered, seconds (whole slots).
    pub window_seconds: f64,
    /// Requests recorded in the window.
    pub requests: u64,
    /// Requests counted in the p90 and p99 tails (`all` = `requests`).
    pub tail_requests: TailTriple,
    /// Summed e2e seconds of all requests and of the tails (a request whose path is longer
    /// than its e2e counts its path's length: the shares' denominator).
    pub e2e_seconds: TailTriple,
    /// One entry per (service, span), largest `seconds.all` first.
    pub entries: Vec<CriticalPathEntry>,
}

/// Cumulative critical seconds of one (service, span) since start, for the Prometheus counter
/// `infertrace_critical_path_seconds_total`.
#[derive(Clone, Debug, PartialEq)]
pub struct CriticalPathTotal<'a> {
    /// `service.name`.
    pub service: &'a str,
    /// Span name.
    pub span: &'a str,
    /// Seconds since start.
    pub seconds: f64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct BucketRequests {
    count: u64,
    e2e_seconds: f64,
}

#[derive(Debug, Default)]
struct Slot {
    /// The slot number (`now / slot`) whose data this holds; `None` when empty.
    epoch: Option<u64>,
    /// Requests per e2e bucket.
    requests: BucketValues<BucketRequests>,
    /// Critical seconds per e2e bucket, by key.
    seconds: Vec<BucketValues<f64>>,
}

impl Slot {
    fn reset(&mut self, epoch: u64) {
        self.epoch = Some(epoch);
        // Cleared, not freed: the slot is reused every retention period.
        self.requests.clear();
        for row in &mut self.seconds {
            row.clear();
        }
    }
}

/// Widest bucket range [`BucketValues`] holds densely (256 buckets of γ = 1.02: a factor of
/// ~160 in e2e, e.g. 50 ms to 8 s).
const DENSE_BUCKETS_MAX: usize = 256;

/// Values by e2e bucket: an array over the buckets seen ([`DenseBuckets`]: one indexed add per
/// segment, where hash-map and tree entries cost a measurable share of the CPU at full rate),
/// and a map for the zero bucket and any bucket outside the array's range that it refuses to
/// stretch to (too wide or too empty, see [`DenseBuckets`]): requests whose e2e times are
/// spread over many orders of magnitude cost map entries, as before, not a huge sparse array.
/// The map never holds a bucket inside the array's range: when the array grows over buckets
/// the map holds, they move into it, so a bucket in range costs one indexed add and no map
/// lookup. (The first buckets of a slot are far apart and land in the map; when they stayed
/// there, every add looked the map up first.) A bucket holds a value once something was added
/// to it: values left at `T::default()` are not reported (every value added is a request
/// count or positive seconds).
#[derive(Clone, Debug, Default)]
struct BucketValues<T> {
    dense: DenseBuckets<T, DENSE_BUCKETS_MAX>,
    far: HashMap<i32, T>,
}

impl<T: Copy + Default + PartialEq> BucketValues<T> {
    /// The value of bucket `b`, created at `T::default()`.
    fn get_mut(&mut self, b: i32) -> &mut T {
        if b != i32::MIN {
            // A bucket the map does not hold: the array stretches to it if it may, taking in
            // whatever the map held in its new range.
            if !self.dense.covers(b)
                && !self.far.contains_key(&b)
                && self.dense.reach(b)
                && !self.far.is_empty()
            {
                self.take_in_from_far();
            }
            if self.dense.covers(b)
                && let Some(v) = self.dense.get_mut(b)
            {
                return v;
            }
        }
        self.far.entry(b).or_default()
    }

    /// Moves the map's buckets that the array now covers into it.
    fn take_in_from_far(&mut self) {
        let dense = &mut self.dense;
        let inside: Vec<(i32, T)> = self
            .far
            .extract_if(|b, _| *b != i32::MIN && dense.covers(*b))
            .collect();
        for (b, v) in inside {
            // Outside the range until now: the cell is fresh.
            if let Some(cell) = self.dense.get_mut(b) {
                *cell = v;
            }
        }
    }

    /// The buckets holding a value: the array's in order, then the map's in order. A fixed
    /// order, so that sums over them come out the same in every run: the map's own order
    /// follows its hasher's seed, which differs from process to process.
    fn iter(&self) -> impl Iterator<Item = (i32, &T)> {
        let zero = T::default();
        // Usually empty, and then nothing is allocated.
        let mut far: Vec<(i32, &T)> = self
            .far
            .iter()
            .map(|(b, v)| (*b, v))
            .filter(|(_, v)| **v != zero)
            .collect();
        far.sort_unstable_by_key(|(b, _)| *b);
        self.dense.iter().chain(far)
    }

    /// Bytes on the heap: the array, and the map's table (its capacity, each slot with its
    /// control byte).
    fn heap_bytes(&self) -> usize {
        self.dense.heap_bytes() + map_table_bytes(self.far.capacity(), size_of::<(i32, T)>())
    }

    /// Forgets every value, keeping the allocations (the slot is reused every retention
    /// period, with values like these).
    fn clear(&mut self) {
        self.dense.clear();
        self.far.clear();
    }
}

/// Sliding-window aggregation of critical paths per (service, span name).
///
/// ```
/// use infertrace_analysis::text::Text;
/// use std::time::Duration;
/// use infertrace_analysis::critical_path::{CriticalPath, CriticalPathWindows, Segment};
/// use infertrace_analysis::trace::{SpanId, TraceId};
///
/// let seg = |name: &str, start: u64, end: u64| Segment {
///     span_id: SpanId([1; 8]),
///     name: name.into(),
///     service: Text::from("llm"),
///     start_unix_nano: start,
///     end_unix_nano: end,
/// };
/// let path = CriticalPath {
///     trace_id: TraceId([1; 16]),
///     root: SpanId([1; 8]),
///     segments: vec![seg("queue", 0, 250_000_000), seg("decode", 250_000_000, 1_000_000_000)],
///     adjustments: vec![],
/// };
/// let mut windows = CriticalPathWindows::default();
/// windows.record(&path, 1.0, 5_000_000_000);
/// let summary = windows.snapshot(Duration::from_secs(60), 5_000_000_000);
/// assert_eq!(summary.requests, 1);
/// assert_eq!(&*summary.entries[0].span, "decode");
/// assert!((summary.entries[0].share.all - 0.75).abs() < 1e-9);
/// ```
#[derive(Debug)]
pub struct CriticalPathWindows {
    slot_nanos: u64,
    slots: Vec<Slot>,
    max_keys: usize,
    ln_gamma: f64,
    /// service → span name → key.
    index: HashMap<Arc<str>, HashMap<Arc<str>, u32>>,
    /// key → (service, span name, cumulative seconds).
    keys: Vec<(Arc<str>, Arc<str>, f64)>,
    /// key → when it last recorded a segment (unix nanoseconds).
    last_seen: Vec<u64>,
    reclaim_after_nanos: u64,
    /// No key is idle enough to reclaim before this time (unix nanoseconds).
    no_reclaim_before: u64,
    /// (service, span name) of keys reclaimed since the last [`Self::take_reclaimed`].
    reclaimed: Vec<(Arc<str>, Arc<str>)>,
    reclaimed_keys: u64,
    /// Keys of recently seen (service, name) allocations: most lookups end here.
    recent_keys: PairCache<Text, u32>,
    overflow_key: Option<u32>,
    overflowed_segments: u64,
    late_records: u64,
    /// The oldest slot recorded into since the history store last took the slots
    /// (`stored.rs`).
    unsaved_from: Option<u64>,
}

impl Default for CriticalPathWindows {
    fn default() -> Self {
        Self::new(CriticalPathWindowsConfig::default())
    }
}

impl CriticalPathWindows {
    /// Empty windows. A zero slot is taken as one second, a `gamma` not above 1 as 1.02.
    pub fn new(config: CriticalPathWindowsConfig) -> Self {
        // A zero slot is taken as one second; otherwise at least a millisecond.
        let slot_nanos = if config.slot.is_zero() {
            1_000_000_000
        } else {
            u64::try_from(config.slot.as_nanos())
                .unwrap_or(u64::MAX)
                .clamp(1_000_000, u64::MAX / 4)
        };
        let retention = u64::try_from(config.retention.as_nanos()).unwrap_or(u64::MAX);
        // One extra slot: the current, partly filled one.
        let count =
            usize::try_from(retention.div_ceil(slot_nanos).clamp(1, 100_000) + 1).unwrap_or(2);
        let gamma = if config.gamma.is_finite() && config.gamma > 1.0 {
            config.gamma
        } else {
            1.02
        };
        Self {
            slot_nanos,
            slots: (0..count).map(|_| Slot::default()).collect(),
            max_keys: config.max_keys,
            ln_gamma: gamma.ln(),
            index: HashMap::new(),
            keys: Vec::new(),
            last_seen: Vec::new(),
            reclaim_after_nanos: u64::try_from(config.reclaim_after.as_nanos()).unwrap_or(u64::MAX),
            no_reclaim_before: 0,
            reclaimed: Vec::new(),
            reclaimed_keys: 0,
            recent_keys: PairCache::default(),
            overflow_key: None,
            overflowed_segments: 0,
            late_records: 0,
            unsaved_from: None,
        }
    }

    /// Adds one request's critical path, whose end-to-end latency was `e2e_seconds`, at time
    /// `now_unix_nano` (normally when the request ended or was assembled).
    ///
    /// A record older than the retention is not added to any window (counted by
    /// [`late_records`](Self::late_records)) but still counts in the cumulative totals.
    ///
    /// The request falls in the tail bucket of `e2e_seconds`; its share denominator is the
    /// longer of that and the path itself, so that a path clocked past the e2e an engine
    /// reported (vLLM's spans end a little after its `gen_ai.latency.e2e`) cannot make the
    /// shares add up to more than 100 %.
    pub fn record(&mut self, path: &CriticalPath, e2e_seconds: f64, now_unix_nano: u64) {
        let e2e_seconds = if e2e_seconds.is_finite() && e2e_seconds > 0.0 {
            e2e_seconds
        } else {
            0.0
        };
        let bucket = self.bucket(e2e_seconds);
        let epoch = now_unix_nano / self.slot_nanos;
        let slot_index = self.slot_index(epoch);
        let in_window = match self.slots[slot_index].epoch {
            Some(e) if e == epoch => true,
            Some(e) if e > epoch => false,
            _ => {
                self.slots[slot_index].reset(epoch);
                true
            }
        };
        let mut path_seconds = 0.0;
        for seg in &path.segments {
            let secs = seg.duration_nanos() as f64 / 1e9;
            if secs <= 0.0 {
                continue;
            }
            path_seconds += secs;
            let key = match self.recent_keys.get(&seg.service, &seg.name) {
                Some(&k) => k,
                None => match self.key(&seg.service, &seg.name, Some(now_unix_nano)) {
                    Some(k) => k,
                    None => {
                        self.overflowed_segments += 1;
                        self.overflow_key()
                    }
                },
            };
            self.keys[key as usize].2 += secs;
            let seen = &mut self.last_seen[key as usize];
            *seen = (*seen).max(now_unix_nano);
            if in_window {
                let rows = &mut self.slots[slot_index].seconds;
                if rows.len() <= key as usize {
                    rows.resize_with(key as usize + 1, BucketValues::default);
                }
                *rows[key as usize].get_mut(bucket) += secs;
            }
        }
        if in_window {
            let r = self.slots[slot_index].requests.get_mut(bucket);
            r.count += 1;
            r.e2e_seconds += e2e_seconds.max(path_seconds);
            self.unsaved_from = Some(self.unsaved_from.map_or(epoch, |e| e.min(epoch)));
        } else {
            self.late_records += 1;
        }
    }

    /// The aggregate over the last `window` (rounded up to whole slots, at most the retention)
    /// ending at `now_unix_nano`.
    pub fn snapshot(&self, window: Duration, now_unix_nano: u64) -> CriticalPathSummary {
        let now_epoch = now_unix_nano / self.slot_nanos;
        let wanted = u64::try_from(window.as_nanos())
            .unwrap_or(u64::MAX)
            .div_ceil(self.slot_nanos)
            .max(1);
        let span = wanted.min(self.slots.len() as u64 - 1).max(1);
        let oldest = now_epoch.saturating_sub(span - 1);
        let live = || {
            self.slots
                .iter()
                .filter(move |s| s.epoch.is_some_and(|e| e >= oldest && e <= now_epoch))
        };

        let mut requests: BTreeMap<i32, BucketRequests> = BTreeMap::new();
        for slot in live() {
            for (b, r) in slot.requests.iter() {
                let m = requests.entry(b).or_default();
                m.count += r.count;
                m.e2e_seconds += r.e2e_seconds;
            }
        }
        let total: u64 = requests.values().map(|r| r.count).sum();
        let p90 = percentile_bucket(&requests, total, 0.90);
        let p99 = percentile_bucket(&requests, total, 0.99);
        let mut tail_requests = TailTriple {
            all: total as f64,
            ..TailTriple::default()
        };
        let mut e2e = TailTriple::default();
        for (b, r) in &requests {
            e2e.all += r.e2e_seconds;
            if *b >= p90 {
                tail_requests.p90 += r.count as f64;
                e2e.p90 += r.e2e_seconds;
            }
            if *b >= p99 {
                tail_requests.p99 += r.count as f64;
                e2e.p99 += r.e2e_seconds;
            }
        }

        let mut per_key: HashMap<u32, TailTriple> = HashMap::new();
        for slot in live() {
            for (key, row) in slot.seconds.iter().enumerate() {
                for (b, secs) in row.iter() {
                    let t = per_key.entry(key as u32).or_default();
                    t.all += secs;
                    if b >= p90 {
                        t.p90 += secs;
                    }
                    if b >= p99 {
                        t.p99 += secs;
                    }
                }
            }
        }
        let ratio = |num: f64, den: f64| if den > 0.0 { num / den } else { 0.0 };
        let mut entries: Vec<CriticalPathEntry> = per_key
            .into_iter()
            .map(|(key, seconds)| {
                let (service, span, _) = &self.keys[key as usize];
                CriticalPathEntry {
                    service: service.clone(),
                    span: span.clone(),
                    seconds,
                    share: TailTriple {
                        all: ratio(seconds.all, e2e.all),
                        p90: ratio(seconds.p90, e2e.p90),
                        p99: ratio(seconds.p99, e2e.p99),
                    },
                }
            })
            .collect();
        entries.sort_by(|a, b| {
            b.seconds
                .all
                .total_cmp(&a.seconds.all)
                .then_with(|| a.service.cmp(&b.service))
                .then_with(|| a.span.cmp(&b.span))
        });
        CriticalPathSummary {
            window_seconds: (span * self.slot_nanos) as f64 / 1e9,
            requests: total,
            tail_requests,
            e2e_seconds: e2e,
            entries,
        }
    }

    /// Cumulative critical seconds per (service, span) since these windows were created.
    pub fn totals(&self) -> impl Iterator<Item = CriticalPathTotal<'_>> {
        self.keys
            .iter()
            .map(|(service, span, seconds)| CriticalPathTotal {
                service,
                span,
                seconds: *seconds,
            })
    }

    /// Segments whose (service, span) came after the key cap was reached and were summed under
    /// [`OVERFLOW_LABEL`].
    pub fn overflowed_segments(&self) -> u64 {
        self.overflowed_segments
    }

    /// Records whose time was older than the retention (kept only in the cumulative totals).
    pub fn late_records(&self) -> u64 {
        self.late_records
    }

    /// Approximate bytes held — every slot's bucket values (arrays and maps, kept while the
    /// slot is reused), the keys and their index — for the collector's memory accounting. At
    /// the defaults (361 slots, up to 257 keys) it walks up to ~93,000 rows: call it seldom
    /// (the collector does once a second), not per record.
    pub fn approx_memory_bytes(&self) -> usize {
        let slots: usize = self
            .slots
            .iter()
            .map(|s| {
                s.requests.heap_bytes()
                    + s.seconds.capacity() * size_of::<BucketValues<f64>>()
                    + s.seconds
                        .iter()
                        .map(BucketValues::heap_bytes)
                        .sum::<usize>()
            })
            .sum();
        let names: usize = self
            .keys
            .iter()
            .map(|(service, span, _)| arc_str_bytes(service.len()) + arc_str_bytes(span.len()))
            .sum();
        let index_entry = size_of::<(Arc<str>, HashMap<Arc<str>, u32>)>();
        let index: usize = map_table_bytes(self.index.capacity(), index_entry)
            + self
                .index
                .values()
                .map(|m| map_table_bytes(m.capacity(), size_of::<(Arc<str>, u32)>()))
                .sum::<usize>();
        size_of::<Self>()
            + self.slots.capacity() * size_of::<Slot>()
            + slots
            + self.keys.capacity() * size_of::<(Arc<str>, Arc<str>, f64)>()
            + self.last_seen.capacity() * size_of::<u64>()
            + names
            + index
    }

    /// The oldest slot a snapshot at `now_epoch` reads (its longest window).
    fn oldest_epoch(&self, now_epoch: u64) -> u64 {
        now_epoch.saturating_sub(self.slots.len() as u64 - 2)
    }

    fn slot_index(&self, epoch: u64) -> usize {
        (epoch % self.slots.len() as u64) as usize
    }

    fn bucket(&self, e2e_seconds: f64) -> i32 {
        if e2e_seconds <= 0.0 {
            return i32::MIN;
        }
        // Saturating float → int conversion keeps extreme values in the end buckets.
        ceil_to_i32(e2e_seconds.ln() / self.ln_gamma).max(i32::MIN + 1)
    }

    /// The key of (`service`, `span`), added if new; at the key cap, one idle for
    /// `reclaim_after` at `now_unix_nano` is reused (never when `now_unix_nano` is `None`);
    /// `None` when there is none (the caller folds it into
    /// [`overflow_key`](Self::overflow_key)).
    fn key(&mut self, service: &Text, span: &Text, now_unix_nano: Option<u64>) -> Option<u32> {
        let name = aggregate_name(span.as_str());
        if let Some(&k) = self.index.get(service.as_str()).and_then(|m| m.get(name)) {
            self.recent_keys.insert(service, span, k);
            return Some(k);
        }
        let names = (Arc::from(service.as_str()), Arc::from(name));
        let k = if self.keys.len() - usize::from(self.overflow_key.is_some()) < self.max_keys {
            self.push_key(names.0, names.1)
        } else {
            self.reclaim_key(names, now_unix_nano?)?
        };
        self.recent_keys.insert(service, span, k);
        self.index
            .entry(self.keys[k as usize].0.clone())
            .or_default()
            .insert(self.keys[k as usize].1.clone(), k);
        Some(k)
    }

    /// The key of [`OVERFLOW_LABEL`], created on first use.
    fn overflow_key(&mut self) -> u32 {
        match self.overflow_key {
            Some(k) => k,
            None => {
                let k = self.push_key(Arc::from(OVERFLOW_LABEL), Arc::from(OVERFLOW_LABEL));
                self.overflow_key = Some(k);
                k
            }
        }
    }

    fn push_key(&mut self, service: Arc<str>, span: Arc<str>) -> u32 {
        let k = u32::try_from(self.keys.len()).unwrap_or(u32::MAX);
        self.keys.push((service, span, 0.0));
        self.last_seen.push(0);
        k
    }

    /// Gives the key idle longest to `names`, when it has been idle for `reclaim_after` at
    /// `now`: its rows move into the overflow row of every slot, its old names leave the index
    /// (and are kept for [`take_reclaimed`](Self::take_reclaimed)).
    fn reclaim_key(&mut self, names: (Arc<str>, Arc<str>), now: u64) -> Option<u32> {
        if now < self.no_reclaim_before {
            return None;
        }
        let overflow = self.overflow_key.map(|k| k as usize);
        let (k, seen) = self
            .last_seen
            .iter()
            .enumerate()
            .filter(|&(k, _)| Some(k) != overflow)
            .min_by_key(|&(_, &seen)| seen)
            .map(|(k, &seen)| (k, seen))?;
        if seen.saturating_add(self.reclaim_after_nanos) > now {
            self.no_reclaim_before = seen.saturating_add(self.reclaim_after_nanos);
            return None;
        }
        // Its seconds join the overflow row: the windows' totals and shares stay whole.
        let o = self.overflow_key() as usize;
        for slot in &mut self.slots {
            let Some(row) = slot.seconds.get_mut(k).map(std::mem::take) else {
                continue;
            };
            if slot.seconds.len() <= o {
                slot.seconds.resize_with(o + 1, BucketValues::default);
            }
            for (b, secs) in row.iter() {
                *slot.seconds[o].get_mut(b) += *secs;
            }
        }
        let (old_service, old_span, _) =
            std::mem::replace(&mut self.keys[k], (names.0, names.1, 0.0));
        if let Some(spans) = self.index.get_mut(&old_service) {
            spans.remove(&old_span);
            if spans.is_empty() {
                self.index.remove(&old_service);
            }
        }
        // Cached lookups may point at the key under its old names.
        self.recent_keys.clear();
        self.last_seen[k] = now;
        self.reclaimed.push((old_service, old_span));
        self.reclaimed_keys += 1;
        u32::try_from(k).ok()
    }

    /// Whether (`service`, `span`) has a key of its own (not folded into the overflow).
    pub fn has_key(&self, service: &str, span: &str) -> bool {
        self.index
            .get(service)
            .is_some_and(|m| m.contains_key(aggregate_name(span)))
    }

    /// Keys given to new (service, span) pairs since start (see the module docs).
    pub fn reclaimed_keys(&self) -> u64 {
        self.reclaimed_keys
    }

    /// The (service, span name) pairs whose keys were reclaimed since the last call, so that
    /// what mirrors the keys (the Prometheus exporter) forgets them too.
    pub fn take_reclaimed(&mut self) -> Vec<(Arc<str>, Arc<str>)> {
        std::mem::take(&mut self.reclaimed)
    }
}

/// The bucket holding the request of rank ⌊q·(n − 1)⌋ (0-based): the rank rule of the KPI
/// sketches (`Distribution::quantile_bucket`), so that the tail split here and the e2e
/// percentile of `/api/kpis` take the same rank. The two bucket e2e on their own scales, so
/// they agree to a bucket, not request for request (docs/reference.md).
fn percentile_bucket(requests: &BTreeMap<i32, BucketRequests>, total: u64, q: f64) -> i32 {
    if total == 0 {
        return i32::MAX;
    }
    let rank = (q * (total - 1) as f64) as u64;
    let mut seen = 0;
    for (b, r) in requests {
        seen += r.count;
        if seen > rank {
            return *b;
        }
    }
    i32::MAX
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::critical_path::Segment;
    use crate::trace::{SpanId, TraceId};

    /// A path of one segment per (service, span, seconds), back to back from 0.
    pub(super) fn path(parts: &[(&str, &str, f64)]) -> CriticalPath {
        let mut t = 0u64;
        let segments = parts
            .iter()
            .map(|(service, name, secs)| {
                let start = t;
                t += (secs * 1e9).round() as u64;
                Segment {
                    span_id: SpanId([1; 8]),
                    name: (*name).into(),
                    service: Text::from(*service),
                    start_unix_nano: start,
                    end_unix_nano: t,
                }
            })
            .collect();
        CriticalPath {
            trace_id: TraceId([1; 16]),
            root: SpanId([1; 8]),
            segments,
            adjustments: vec![],
        }
    }

    const S: u64 = 1_000_000_000;

    fn entry<'a>(s: &'a CriticalPathSummary, span: &str) -> &'a CriticalPathEntry {
        s.entries.iter().find(|e| &*e.span == span).unwrap()
    }

    /// The tail starts where `/api/kpis`'s e2e percentile lies (the sketches' rank rule,
    /// ⌊q·(n − 1)⌋): of five requests the p90 is the fourth, so the p90 tail holds two.
    #[test]
    fn the_tail_starts_at_the_kpis_percentile() {
        let mut w = CriticalPathWindows::default();
        for e2e in [0.5, 0.72, 1.35, 1.6, 2.1] {
            w.record(&path(&[("llm", "decode", e2e)]), e2e, S);
        }
        let s = w.snapshot(Duration::from_secs(60), 2 * S);
        assert_eq!(s.tail_requests.p90, 2.0);
        // ⌊0.99·4⌋ = 3 as well: with five requests the p99 is the fourth too.
        assert_eq!(s.tail_requests.p99, 2.0);
    }

    /// Spans named per request (SGLang's `"decode Req <rid>"`) share one key: a thousand
    /// requests take one place under a cap of two, nothing overflows.
    #[test]
    fn spans_named_per_request_share_one_key() {
        let mut w = CriticalPathWindows::new(CriticalPathWindowsConfig {
            max_keys: 2,
            ..Default::default()
        });
        for rid in 0..1_000u32 {
            let name = format!("decode Req {:08x}", rid.wrapping_mul(2_654_435_761));
            w.record(&path(&[("sglang", &name, 0.01)]), 0.01, S);
        }
        let s = w.snapshot(Duration::from_secs(60), S);
        assert_eq!(s.entries.len(), 1, "{:?}", s.entries);
        assert_eq!(&*s.entries[0].span, "decode Req");
        assert!((s.entries[0].seconds.all - 10.0).abs() < 1e-9);
        assert_eq!(w.overflowed_segments(), 0);
        assert!(w.has_key("sglang", "decode Req 0000abcd"));
    }

    /// A path 10 ms longer than the e2e its engine reported: the shares still add up to 1.
    #[test]
    fn a_path_longer_than_its_e2e_keeps_the_shares_within_one() {
        let mut w = CriticalPathWindows::default();
        for _ in 0..5 {
            w.record(
                &path(&[("vllm", "queue", 0.2), ("vllm", "llm_request", 1.01)]),
                1.2,
                S,
            );
        }
        let s = w.snapshot(Duration::from_secs(60), 2 * S);
        let total: f64 = s.entries.iter().map(|e| e.share.all).sum();
        assert!((total - 1.0).abs() < 1e-9, "{total}");
    }

    #[test]
    fn tails_sum_only_the_slow_requests() {
        let mut w = CriticalPathWindows::default();
        // 98 fast requests (1 s: 0.1 queue + 0.9 decode), 2 slow ones (10 s: 8 queue + 2 decode).
        for i in 0..98 {
            w.record(
                &path(&[("llm", "queue", 0.1), ("llm", "decode", 0.9)]),
                1.0,
                i * 1_000_000,
            );
        }
        for _ in 0..2 {
            w.record(
                &path(&[("llm", "queue", 8.0), ("llm", "decode", 2.0)]),
                10.0,
                S,
            );
        }
        let s = w.snapshot(Duration::from_secs(60), 2 * S);
        assert_eq!(s.requests, 100);
        // Rank ⌊0.9·99⌋ = 89 (0-based) is a fast request: the p90 tail is everyone.
        assert_eq!(s.tail_requests.p90, 100.0);
        // Rank ⌊0.99·99⌋ = 98 is slow: the p99 tail is the two slow requests only.
        assert_eq!(s.tail_requests.p99, 2.0);
        let q = entry(&s, "queue");
        assert!((q.seconds.all - (98.0 * 0.1 + 16.0)).abs() < 1e-6);
        assert!((q.seconds.p99 - 16.0).abs() < 1e-6);
        assert!((q.share.p99 - 0.8).abs() < 1e-9);
        assert!((q.share.all - (9.8 + 16.0) / 118.0).abs() < 1e-9);
        let d = entry(&s, "decode");
        assert!((d.share.p99 - 0.2).abs() < 1e-9);
        // Shares of one tail add up to 1 when paths tile e2e.
        assert!((q.share.p90 + d.share.p90 - 1.0).abs() < 1e-9);
    }

    #[test]
    fn old_slots_leave_the_window() {
        let mut w = CriticalPathWindows::default();
        w.record(&path(&[("a", "x", 1.0)]), 1.0, 0);
        w.record(&path(&[("a", "y", 1.0)]), 1.0, 100 * S);
        let s = w.snapshot(Duration::from_secs(30), 100 * S);
        assert_eq!(s.requests, 1);
        assert_eq!(s.entries.len(), 1);
        assert_eq!(&*s.entries[0].span, "y");
        let s = w.snapshot(Duration::from_secs(120), 100 * S);
        assert_eq!(s.requests, 2);
        // After the retention the slot is reused and the old data is gone.
        // Epoch 361 lands in slot 0 again (361 slots).
        w.record(&path(&[("a", "z", 1.0)]), 1.0, 3610 * S);
        let s = w.snapshot(Duration::from_secs(3600), 3610 * S);
        assert_eq!(s.requests, 2);
        assert!(s.entries.iter().all(|e| &*e.span != "x"));
        // A record older than the retention is refused by the windows, kept in the totals.
        w.record(&path(&[("a", "x", 2.0)]), 1.0, 0);
        assert_eq!(w.late_records(), 1);
        let x = w.totals().find(|t| t.span == "x").unwrap();
        assert!((x.seconds - 3.0).abs() < 1e-9);
    }

    #[test]
    fn keys_beyond_the_cap_are_folded_and_counted() {
        let mut w = CriticalPathWindows::new(CriticalPathWindowsConfig {
            max_keys: 2,
            ..CriticalPathWindowsConfig::default()
        });
        w.record(
            &path(&[
                ("a", "x", 1.0),
                ("a", "y", 1.0),
                ("a", "z", 1.0),
                ("b", "x", 1.0),
            ]),
            4.0,
            0,
        );
        assert_eq!(w.overflowed_segments(), 2);
        let s = w.snapshot(Duration::from_secs(10), 0);
        assert_eq!(s.entries.len(), 3);
        let o = entry(&s, OVERFLOW_LABEL);
        assert!((o.seconds.all - 2.0).abs() < 1e-9);
        assert_eq!(w.totals().count(), 3);
    }

    /// At the cap, a new key takes the place of the key idle longest once it has been idle for
    /// `reclaim_after`; its rows join the overflow row and its names are handed out once.
    #[test]
    fn an_idle_key_is_reclaimed_for_a_new_one() {
        let mut w = CriticalPathWindows::new(CriticalPathWindowsConfig {
            max_keys: 2,
            reclaim_after: Duration::from_secs(60),
            ..CriticalPathWindowsConfig::default()
        });
        w.record(&path(&[("a", "x", 1.0), ("a", "y", 1.0)]), 2.0, S);
        // 30 s later: no key idle for 60 s, the new one is folded.
        w.record(&path(&[("b", "z", 1.0)]), 1.0, 31 * S);
        assert_eq!((w.overflowed_segments(), w.reclaimed_keys()), (1, 0));
        // 70 s after the first: "y" was used meanwhile, "x" has been idle for 70 s.
        w.record(&path(&[("a", "y", 1.0)]), 1.0, 65 * S);
        w.record(&path(&[("b", "z", 2.0)]), 2.0, 71 * S);
        assert_eq!((w.overflowed_segments(), w.reclaimed_keys()), (1, 1));
        let taken = w.take_reclaimed();
        assert_eq!(taken.len(), 1);
        assert_eq!((&*taken[0].0, &*taken[0].1), ("a", "x"));
        assert!(w.take_reclaimed().is_empty());
        let s = w.snapshot(Duration::from_secs(600), 71 * S);
        let names: Vec<_> = s.entries.iter().map(|e| (&*e.service, &*e.span)).collect();
        assert!(!names.contains(&("a", "x")), "{names:?}");
        assert!((entry(&s, "z").seconds.all - 2.0).abs() < 1e-9, "{names:?}");
        assert!((entry(&s, "y").seconds.all - 2.0).abs() < 1e-9);
        // The folded segment and the reclaimed key's second: the totals stay whole.
        assert!((entry(&s, OVERFLOW_LABEL).seconds.all - 2.0).abs() < 1e-9);
        let total: f64 = s.entries.iter().map(|e| e.seconds.all).sum();
        assert!((total - 6.0).abs() < 1e-9, "{total}");
        // The new key is found again (not folded, not reclaimed again).
        w.record(&path(&[("b", "z", 1.0)]), 1.0, 72 * S);
        assert_eq!((w.overflowed_segments(), w.reclaimed_keys()), (1, 1));
    }

    #[test]
    fn empty_window_is_empty() {
        let w = CriticalPathWindows::default();
        let s = w.snapshot(Duration::from_secs(60), 10 * S);
        assert_eq!(s.requests, 0);
        assert!(s.entries.is_empty());
        assert_eq!(s.window_seconds, 60.0);
    }

    #[test]
    fn bucket_values_hold_what_a_map_would() {
        // Near buckets (dense, grown both ways), the zero bucket, and buckets far apart.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut buckets: Vec<i32> = (0..5000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 400) as i32 - 200
            })
            .collect();
        buckets.extend([
            i32::MIN,
            i32::MIN + 1,
            i32::MAX,
            1_000_000,
            -1_000_000,
            5,
            i32::MIN,
        ]);
        let mut values = BucketValues::<f64>::default();
        let mut reference: std::collections::HashMap<i32, f64> = Default::default();
        for (i, b) in buckets.iter().enumerate() {
            let v = 0.5 + (i % 7) as f64;
            *values.get_mut(*b) += v;
            *reference.entry(*b).or_default() += v;
        }
        let mut got: Vec<(i32, f64)> = values.iter().map(|(b, v)| (b, *v)).collect();
        let mut want: Vec<(i32, f64)> = reference.into_iter().collect();
        got.sort_by_key(|e| e.0);
        want.sort_by_key(|e| e.0);
        assert_eq!(got.len(), want.len());
        for ((gb, gv), (wb, wv)) in got.iter().zip(&want) {
            assert_eq!(gb, wb);
            assert!((gv - wv).abs() < 1e-9, "{gb}: {gv} vs {wv}");
        }
        assert!(values.dense.span() <= DENSE_BUCKETS_MAX);
        assert!(
            values
                .far
                .keys()
                .all(|b| *b == i32::MIN || !values.dense.covers(*b)),
            "the map holds no bucket the array covers"
        );
        values.clear();
        assert_eq!(values.iter().count(), 0);
    }

    #[test]
    fn a_slots_first_buckets_move_into_the_array_once_it_reaches_them() {
        // What one slot sees: e2e buckets over ~200 of the array's 256. The first few are far
        // apart and go to the map; once the array has grown over them, the map is empty and
        // every add is an indexed one.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut values = BucketValues::<f64>::default();
        let mut total = 0.0;
        for _ in 0..3000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *values.get_mut((x % 200) as i32 + 40) += 1.0;
            total += 1.0;
        }
        assert!(
            values.far.is_empty(),
            "{} buckets in the map",
            values.far.len()
        );
        assert_eq!(values.iter().map(|(_, v)| *v).sum::<f64>(), total);
        assert_eq!(values.iter().count(), 200);
    }

    #[test]
    fn bucket_values_stay_small_for_values_spread_thin_and_at_the_ends() {
        // Two requests per key and slot, far apart (1 ns and years): map entries, no array.
        let mut v = BucketValues::<f64>::default();
        *v.get_mut(-1000) += 1.0;
        *v.get_mut(1000) += 1.0;
        // Two a couple of hundred buckets apart: too empty an array to grow.
        *v.get_mut(200) += 1.0;
        assert!(
            v.dense.span() <= crate::dense_buckets::MIN_OCCUPANCY,
            "{}",
            v.dense.span()
        );
        assert_eq!(v.iter().count(), 3);
        // The ends of the bucket range, including the last one, are reported, not overflowed.
        let mut ends = BucketValues::<u64>::default();
        *ends.get_mut(i32::MAX) += 1;
        *ends.get_mut(i32::MAX - 1) += 1;
        *ends.get_mut(i32::MIN) += 1;
        *ends.get_mut(i32::MIN + 1) += 1;
        let mut got: Vec<i32> = ends.iter().map(|(b, _)| b).collect();
        got.sort_unstable();
        assert_eq!(got, vec![i32::MIN, i32::MIN + 1, i32::MAX - 1, i32::MAX]);
    }

    #[test]
    fn buckets_are_read_in_one_order_whatever_the_maps_seed() {
        // Buckets far apart all land in the map, whose own order follows a per-process seed:
        // read in that order, a summary's float sums differed in their last digits from run
        // to run of `analyze` on the same file.
        let mut v = BucketValues::<f64>::default();
        for b in (0..40).map(|i| (i * 7919) % 40 * 1000 - 20_000) {
            *v.get_mut(b) += 1.0;
        }
        let read: Vec<i32> = v.iter().map(|(b, _)| b).collect();
        let mut sorted = read.clone();
        sorted.sort_unstable();
        assert_eq!(read, sorted);
        assert_eq!(read.len(), 40);
    }
}
