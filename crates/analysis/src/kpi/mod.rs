//! KPI windows: per-series sliding windows of mergeable aggregates, queried as [`KpiSnapshot`]s.
//!
//! # Model
//! A *series* is one (service, model, operation) — or fewer dimensions, see
//! [`KpiConfig::dimensions`]. Each series keeps, for every configured window length `W`, a ring
//! of [`KpiConfig::slots_per_window`] time slots of `W / slots` each (1m → 1 s slots, 5m → 5 s,
//! 1h → 60 s with the default 60). A slot holds an [`Accumulator`]: exact counters, token sums,
//! phase sums, and sparse DDSketches ([`Distribution`], relative error
//! [`SKETCH_RELATIVE_ACCURACY`]) of every latency. Memory grows with the occupied sketch buckets
//! of each slot (8 bytes per bucket and latency, 48 per e2e bucket for tail phase sums), so it
//! follows traffic; fewer slots per window trade sliding granularity for memory.
//! A snapshot merges the slots of the window; slots older than the window are ignored and reused.
//!
//! A record is added to the finest ring only; when that ring moves on to a new slot, the slots
//! it completed are *rolled up* — merged once into the slot of every coarser ring whose slot
//! length is a multiple of the finest one (all of them with the default windows). A snapshot
//! of a coarser window adds the finest ring's slots not yet rolled up. Each record thus costs
//! one sketch update per latency instead of one per window (the windows' contents are exactly
//! what adding to each would give); a coarser ring whose slots are not a multiple of the
//! finest ones gets every record directly instead.
//!
//! # Which time counts
//! A record lands in the slot of `now_unix_nano`, the moment it reached the KPIs (the collector's
//! clock), not its span's end time: remote clocks may be skewed, and the assembler hands each
//! request over within its grace period of the request's end. The clock passed in is expected to
//! be non-decreasing; a record older than a ring's whole window is left out of that ring.
//!
//! # Which window a snapshot reads
//! The window covers the current (partial) slot and the `n − 1` slots before it, where `n` is the
//! number of slots of the window asked for. Rates (`throughput`, `goodput.requests_per_second`)
//! divide by the time covered: from the start of the oldest slot read, or from the start of
//! the KPIs (see [`KpiWindows::set_start`]) if that is later, to `now`. So a collector running
//! for 10 s reports a true per-second rate in its 1h window, not one diluted 360 times.
//!
//! # What counts where
//! - `requests` counts every outcome; `errors`, `cancelled`, `rejected` by outcome.
//! - Latency distributions and phase shares count `ok` requests only (a rejected request's
//!   zero latency or an error's early exit would otherwise make an overloaded service look
//!   fast); tokens and GPU energy count every outcome.
//! - Goodput: an `ok` request is *good* when it meets every SLO that applies — an SLO applies
//!   when it is configured and the request has that value (a generic-dialect request without
//!   TTFT is judged on e2e only). `ratio = good / (requests − cancelled)`: errors and rejections
//!   count as not good; cancelled requests are left out (the client ended them).
//! - Phase shares: Σ queue, Σ prefill, Σ decode over Σ e2e, over `ok` requests that have all
//!   three phases. The p90 / p99 shares cover the requests whose e2e falls in the e2e sketch's
//!   bucket of the window's p90 / p99 or above (exact up to bucket resolution, ±α).
//!
//! # Cardinality
//! At most [`KpiConfig::max_series`] series. A new series that finds the cap reached takes the
//! place of the least recently recorded series if that one has had no record for
//! [`KpiConfig::series_reclaim_after`] (default 1 min; counted in
//! [`KpiWindows::reclaimed_series`]) — so a burst of junk names cannot lock a real model out for
//! longer than that, and series restored from history are reclaimable as soon as they are that
//! old. Otherwise its records go to one overflow series labelled [`OVERFLOW_LABEL`] and are
//! counted ([`KpiWindows::overflowed_records`]). A series with no record for longer than the
//! longest window is dropped, freeing its place. Every series removed either way is handed out
//! by [`KpiWindows::take_removed_series`], so that a consumer labelling alike (the Prometheus
//! exporter) can remove it too.

mod accumulator;
mod codec;
mod distribution;
mod ring;
mod snapshot;

use std::hash::BuildHasher;

use crate::text::RecentTriple;

use foldhash::fast::RandomState;
use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sketches_ddsketch::Config;

use crate::record::RequestRecord;
use ring::{Ring, RingSpec};

pub use accumulator::{Accumulator, Counts, PhaseSums, meets_slos};
pub use codec::DecodeError;
pub use distribution::{
    Distribution, SKETCH_RELATIVE_ACCURACY, ZERO_BUCKET, bucket_of, bucket_value, sketch_config,
};
pub use snapshot::{
    Goodput, GpuKpis, GpuPhaseUtilization, KpiSnapshot, LatencyStats, PhaseShare, PhaseShares,
    SeriesKpis, Throughput, TokenTotals,
};

/// Label value of every configured dimension of the overflow series.
pub const OVERFLOW_LABEL: &str = "__overflow__";

/// Service-level objectives goodput is judged against; `None` disables one.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SloConfig {
    /// Time to first token, seconds. Default 1.0 (interactive chat: the first word within a
    /// second).
    pub ttft_seconds: Option<f64>,
    /// Time per output token, seconds. Default 0.1 (10 tokens/s, faster than people read).
    pub tpot_seconds: Option<f64>,
    /// End-to-end, seconds. Default 30.
    pub e2e_seconds: Option<f64>,
}

impl Default for SloConfig {
    fn default() -> Self {
        Self {
            ttft_seconds: Some(1.0),
            tpot_seconds: Some(0.1),
            e2e_seconds: Some(30.0),
        }
    }
}

/// A label series are split by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dimension {
    /// `service.name`.
    Service,
    /// Model.
    Model,
    /// Operation.
    Operation,
}

/// Which of service, model and operation label a series (the configured [`Dimension`]s), looked
/// up once rather than per record; the others are left empty. The KPI windows and the
/// Prometheus exporter label alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Labelling([bool; 3]);

impl Labelling {
    /// The labelling by `dimensions`.
    pub fn new(dimensions: &[Dimension]) -> Self {
        Self(
            [Dimension::Service, Dimension::Model, Dimension::Operation]
                .map(|d| dimensions.contains(&d)),
        )
    }

    /// `value` when `d` labels series, else "".
    pub fn label<'a>(&self, d: Dimension, value: &'a str) -> &'a str {
        let i = match d {
            Dimension::Service => 0,
            Dimension::Model => 1,
            Dimension::Operation => 2,
        };
        if self.0[i] { value } else { "" }
    }

    /// A record's (service, model, operation) labels.
    pub fn labels<'a>(&self, r: &'a RequestRecord) -> (&'a str, &'a str, &'a str) {
        (
            self.label(Dimension::Service, &r.service),
            self.label(Dimension::Model, &r.model),
            self.label(Dimension::Operation, &r.operation),
        )
    }

    /// The labels of the overflow series ([`OVERFLOW_LABEL`] for each labelling dimension).
    pub fn overflow_labels(&self) -> (&'static str, &'static str, &'static str) {
        (
            self.label(Dimension::Service, OVERFLOW_LABEL),
            self.label(Dimension::Model, OVERFLOW_LABEL),
            self.label(Dimension::Operation, OVERFLOW_LABEL),
        )
    }
}

/// Configuration of [`KpiWindows`].
#[derive(Clone, Debug, PartialEq)]
pub struct KpiConfig {
    /// Window lengths. Default 1m, 5m, 1h. Zero lengths are ignored; none at all means 1m.
    pub windows: Vec<Duration>,
    /// SLOs for goodput.
    pub slo: SloConfig,
    /// Dimensions series are split by (default all three); a dimension left out is reported as
    /// an empty string.
    pub dimensions: Vec<Dimension>,
    /// Maximum series (default 1000), the overflow series not counted.
    pub max_series: usize,
    /// Slots per window (default 60): the window slides in steps of `window / slots`.
    pub slots_per_window: u32,
    /// How long a series must have had no record before a new series may take its place when
    /// the cap is reached (default 1 min).
    pub series_reclaim_after: Duration,
}

impl Default for KpiConfig {
    fn default() -> Self {
        Self {
            windows: vec![
                Duration::from_secs(60),
                Duration::from_secs(300),
                Duration::from_secs(3600),
            ],
            slo: SloConfig::default(),
            dimensions: vec![Dimension::Service, Dimension::Model, Dimension::Operation],
            max_series: 1000,
            slots_per_window: 60,
            series_reclaim_after: Duration::from_secs(60),
        }
    }
}

/// The labels of a series.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SeriesKey {
    /// Service (empty when not a dimension).
    pub service: Arc<str>,
    /// Model (empty when not a dimension).
    pub model: Arc<str>,
    /// Operation (empty when not a dimension).
    pub operation: Arc<str>,
}

impl SeriesKey {
    fn matches(&self, service: &str, model: &str, operation: &str) -> bool {
        &*self.service == service && &*self.model == model && &*self.operation == operation
    }
}

/// One series: its labels and one ring per window length.
#[derive(Clone)]
struct Series {
    key: SeriesKey,
    rings: Vec<Ring>,
    last_record_unix_nano: u64,
}

/// The accumulated KPIs of one slot, for per-slot history.
#[derive(Clone)]
pub struct SlotHistory {
    /// Start of the slot, Unix nanoseconds.
    pub start_unix_nano: u64,
    /// Slot length, nanoseconds.
    pub length_nanos: u64,
    /// What the slot accumulated.
    pub accumulator: Accumulator,
}

/// Sliding KPI windows of every series. See the [module docs](self).
#[derive(Clone)]
pub struct KpiWindows {
    config: KpiConfig,
    sketch_config: Config,
    specs: Vec<RingSpec>,
    /// Per ring: whether it is filled by rolling up the finest ring (never the finest itself).
    rolled: Vec<bool>,
    hasher: RandomState,
    index: HashMap<u64, Vec<usize>>,
    /// The position of the last record's series; cleared whenever series move (see
    /// [`Self::expire`]).
    recent: RecentTriple<usize>,
    labelling: Labelling,
    series: Vec<Series>,
    overflow: Option<Series>,
    overflowed_records: u64,
    /// Series reclaimed for new ones under the cap, since start.
    reclaimed: u64,
    /// No series can be reclaimed before this time (the least recent one's reclaim time).
    next_reclaim_unix_nano: u64,
    /// Series removed (expired or reclaimed) since the last [`KpiWindows::take_removed_series`].
    removed: Vec<SeriesKey>,
    started_unix_nano: Option<u64>,
    last_sweep_unix_nano: u64,
    /// Completed finest-ring slots for a consumer (see [`KpiWindows::enable_slot_tap`]).
    tap: Option<Vec<TappedSlot>>,
}

/// A finest-ring slot handed to the tap: what one series accumulated over
/// `[start_unix_nano, start_unix_nano + length_nanos)`.
#[derive(Clone)]
pub struct TappedSlot {
    /// The series (labelled as the windows label it, overflow included).
    pub key: SeriesKey,
    /// Start of the slot, Unix nanoseconds.
    pub start_unix_nano: u64,
    /// Slot length, nanoseconds.
    pub length_nanos: u64,
    /// What the slot accumulated.
    pub accumulator: Accumulator,
}

/// One minute, nanoseconds.
const MINUTE_NANOS: u64 = 60_000_000_000;

/// Where restored history goes: a series by its position, or the overflow series.
enum Restored {
    Series(usize),
    Overflow,
}

impl KpiWindows {
    /// Empty windows.
    pub fn new(config: KpiConfig) -> Self {
        let labelling = Labelling::new(&config.dimensions);
        let slots = u64::from(config.slots_per_window.max(1));
        let mut specs: Vec<RingSpec> = config
            .windows
            .iter()
            .map(|w| u64::try_from(w.as_nanos()).unwrap_or(u64::MAX))
            .filter(|w| *w > 0)
            .map(|window_nanos| RingSpec {
                window_nanos,
                slot_nanos: window_nanos.div_ceil(slots).max(1),
                slots,
            })
            .collect();
        if specs.is_empty() {
            specs.push(RingSpec {
                window_nanos: 60_000_000_000,
                slot_nanos: 60_000_000_000u64.div_ceil(slots),
                slots,
            });
        }
        specs.sort_by_key(|s| s.window_nanos);
        specs.dedup_by_key(|s| s.window_nanos);
        let finest = specs[0].slot_nanos;
        let rolled = specs
            .iter()
            .enumerate()
            .map(|(i, s)| i > 0 && s.slot_nanos % finest == 0)
            .collect();
        Self {
            config,
            sketch_config: sketch_config(),
            specs,
            rolled,
            hasher: RandomState::default(),
            index: HashMap::new(),
            recent: RecentTriple::default(),
            labelling,
            series: Vec::new(),
            overflow: None,
            overflowed_records: 0,
            reclaimed: 0,
            next_reclaim_unix_nano: 0,
            removed: Vec::new(),
            started_unix_nano: None,
            last_sweep_unix_nano: 0,
            tap: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &KpiConfig {
        &self.config
    }

    /// The window lengths kept, shortest first.
    pub fn windows(&self) -> Vec<Duration> {
        self.specs
            .iter()
            .map(|s| Duration::from_nanos(s.window_nanos))
            .collect()
    }

    /// Turns on the slot tap: from now on every slot of the finest ring is handed, once
    /// complete, to [`take_tapped`](Self::take_tapped) (with any record that bypassed it, as a
    /// slot of its own) — so a consumer that needs per-minute totals (the history store) gets
    /// them without adding every record a second time. Only when the finest slots tile a
    /// minute exactly and are shorter than it (1 s with the default windows); returns whether
    /// it is on. A consumer must call `take_tapped` regularly (with
    /// [`roll_due`](Self::roll_due) before it), or the tapped slots pile up.
    pub fn enable_slot_tap(&mut self) -> bool {
        let fine = self.specs[0].slot_nanos;
        let ok = fine < MINUTE_NANOS && MINUTE_NANOS.is_multiple_of(fine);
        if ok && self.tap.is_none() {
            self.tap = Some(Vec::new());
        }
        ok
    }

    /// Completes every finest-ring slot that ended before `now_unix_nano` (a series without
    /// new records does not complete its last slot by itself).
    pub fn roll_due(&mut self, now_unix_nano: u64) {
        let before = now_unix_nano / self.specs[0].slot_nanos;
        self.roll_every_series(before);
    }

    /// Completes every finest-ring slot, the current one included (shutdown: nothing is
    /// recorded after it).
    pub fn roll_all(&mut self) {
        self.roll_every_series(u64::MAX);
    }

    fn roll_every_series(&mut self, before: u64) {
        let Self {
            specs,
            rolled,
            series,
            overflow,
            tap,
            ..
        } = self;
        for s in series.iter_mut().chain(overflow.as_mut()) {
            // Scans the finest ring once; nothing happens when no slot is due.
            roll_up(specs, rolled, s, before, tap.as_mut());
        }
    }

    /// The slots completed since the last call (empty without [`enable_slot_tap`](Self::enable_slot_tap)).
    pub fn take_tapped(&mut self) -> Vec<TappedSlot> {
        self.tap.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Marks when the KPIs started (e.g. the collector's start), so rates in windows longer than
    /// the uptime divide by the uptime. Without it the first record's `now` is used.
    pub fn set_start(&mut self, start_unix_nano: u64) {
        self.started_unix_nano = Some(start_unix_nano);
    }

    /// Records that went to the overflow series because of the series cap.
    pub fn overflowed_records(&self) -> u64 {
        self.overflowed_records
    }

    /// Idle series whose place a new series took under the cap, since start.
    pub fn reclaimed_series(&self) -> u64 {
        self.reclaimed
    }

    /// The series removed (expired, or reclaimed under the cap) since the last call.
    pub fn take_removed_series(&mut self) -> Vec<SeriesKey> {
        std::mem::take(&mut self.removed)
    }

    /// Frees a place under the cap by removing the least recently recorded series, if it has
    /// had no record for [`KpiConfig::series_reclaim_after`] at `now_unix_nano`. Looks at most
    /// once until that could be true (a scan of the series per look).
    fn reclaim_idle(&mut self, now_unix_nano: u64) -> bool {
        if now_unix_nano < self.next_reclaim_unix_nano {
            return false;
        }
        let after = u64::try_from(self.config.series_reclaim_after.as_nanos()).unwrap_or(u64::MAX);
        let Some((i, last)) = self
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.last_record_unix_nano))
            .min_by_key(|&(_, last)| last)
        else {
            return false;
        };
        if last.saturating_add(after) > now_unix_nano {
            self.next_reclaim_unix_nano = last.saturating_add(after);
            return false;
        }
        let mut series = self.series.swap_remove(i);
        // Its slots not yet handed to the tap (the history store) are handed over now.
        roll_up(
            &self.specs,
            &self.rolled,
            &mut series,
            u64::MAX,
            self.tap.as_mut(),
        );
        let hash = self.key_hash(&series.key);
        if let Some(ids) = self.index.get_mut(&hash) {
            ids.retain(|&j| j != i);
            if ids.is_empty() {
                self.index.remove(&hash);
            }
        }
        // The last series moved into place `i`.
        let moved = self.series.len();
        if i < moved {
            let hash = self.key_hash(&self.series[i].key);
            if let Some(j) = self
                .index
                .get_mut(&hash)
                .and_then(|ids| ids.iter_mut().find(|j| **j == moved))
            {
                *j = i;
            }
        }
        self.recent.clear();
        self.reclaimed += 1;
        self.removed.push(series.key);
        true
    }

    fn key_hash(&self, key: &SeriesKey) -> u64 {
        self.hasher
            .hash_one((&*key.service, &*key.model, &*key.operation))
    }

    /// Approximate bytes held by every series' slots (sketch bins, tail buckets, slot and
    /// series overhead), for the collector's memory accounting. Walks every slot: call it
    /// seldom (e.g. once per scrape), not per record.
    pub fn approx_memory_bytes(&self) -> usize {
        self.series
            .iter()
            .chain(self.overflow.as_ref())
            .map(|s| {
                std::mem::size_of::<Series>()
                    + s.key.service.len()
                    + s.key.model.len()
                    + s.key.operation.len()
                    + s.rings.iter().map(Ring::heap_bytes).sum::<usize>()
            })
            .sum()
    }

    /// Series kept, the overflow series not counted.
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    fn new_series(&self, service: &str, model: &str, operation: &str) -> Series {
        Series {
            key: SeriesKey {
                service: Arc::from(service),
                model: Arc::from(model),
                operation: Arc::from(operation),
            },
            rings: vec![Ring::default(); self.specs.len()],
            last_record_unix_nano: 0,
        }
    }

    /// Adds a request at `now_unix_nano`. Returns `false` when the series cap sent it to the
    /// overflow series.
    pub fn record(&mut self, record: &RequestRecord, now_unix_nano: u64) -> bool {
        if self.started_unix_nano.is_none() {
            self.started_unix_nano = Some(now_unix_nano);
        }
        if now_unix_nano.saturating_sub(self.last_sweep_unix_nano) >= self.sweep_interval() {
            self.expire(now_unix_nano);
            self.last_sweep_unix_nano = now_unix_nano;
        }
        let (service, model, operation) = self.labelling.labels(record);
        let recent = self
            .recent
            .get(&record.service, &record.model, &record.operation)
            .copied();
        let (found, hash) = match recent {
            Some(i) => (Some(i), None),
            None => {
                let hash = self.hasher.hash_one((service, model, operation));
                let found = self.index.get(&hash).and_then(|ids| {
                    ids.iter()
                        .copied()
                        .find(|&i| self.series[i].key.matches(service, model, operation))
                });
                (found, Some(hash))
            }
        };
        let (series, kept) = match found {
            Some(i) => {
                if recent.is_none() {
                    self.recent
                        .set(&record.service, &record.model, &record.operation, i);
                }
                (&mut self.series[i], true)
            }
            None if self.series.len() < self.config.max_series
                || self.reclaim_idle(now_unix_nano) =>
            {
                let s = self.new_series(service, model, operation);
                self.series.push(s);
                let i = self.series.len() - 1;
                let hash =
                    hash.unwrap_or_else(|| self.hasher.hash_one((service, model, operation)));
                self.index.entry(hash).or_default().push(i);
                self.recent
                    .set(&record.service, &record.model, &record.operation, i);
                (&mut self.series[i], true)
            }
            None => {
                self.overflowed_records += 1;
                if self.overflow.is_none() {
                    let (service, model, operation) = self.labelling.overflow_labels();
                    self.overflow = Some(self.new_series(service, model, operation));
                }
                match self.overflow.as_mut() {
                    Some(s) => (s, false),
                    None => return false,
                }
            }
        };
        series.last_record_unix_nano = series.last_record_unix_nano.max(now_unix_nano);
        let fine_index = now_unix_nano / self.specs[0].slot_nanos;
        if series.rings[0].newest().is_some_and(|n| fine_index > n) {
            roll_up(
                &self.specs,
                &self.rolled,
                series,
                fine_index,
                self.tap.as_mut(),
            );
        }
        let (finest, coarser) = series.rings.split_at_mut(1);
        // Into a slot already rolled up (a record older than the newest): straight into every
        // ring, as the roll-up will not see it.
        let handed_on = finest[0].add(
            &self.specs[0],
            now_unix_nano,
            &self.sketch_config,
            &self.config.slo,
            record,
        );
        if handed_on && let Some(tap) = &mut self.tap {
            // Not in a slot the tap will see: hand it on alone.
            let mut accumulator = Accumulator::default();
            accumulator.add(&self.sketch_config, &self.config.slo, record);
            let fine = self.specs[0].slot_nanos;
            tap.push(TappedSlot {
                key: series.key.clone(),
                start_unix_nano: fine_index.saturating_mul(fine),
                length_nanos: fine,
                accumulator,
            });
        }
        for ((ring, spec), rolled) in coarser
            .iter_mut()
            .zip(&self.specs[1..])
            .zip(&self.rolled[1..])
        {
            if handed_on || !rolled {
                ring.add(
                    spec,
                    now_unix_nano,
                    &self.sketch_config,
                    &self.config.slo,
                    record,
                );
            }
        }
        kept
    }

    /// Merges a stored slot's accumulator (e.g. a minute rollup read back from the collector's
    /// history store after a restart) into series `key` — labels as the series would have, see
    /// [`KpiConfig::dimensions`] — for the time `[slot_start_unix_nano, + length_nanos)`.
    ///
    /// It lands in every window whose slots are at least that long and hold that whole span
    /// (with the default 60 slots, a one-minute rollup aligned to the minute fills one slot of
    /// the 1h window; the 1m and 5m windows, with 1 s and 5 s slots, are left as they are), and
    /// only if that slot is still inside the window at the newest time seen. The KPIs' start
    /// ([`Self::set_start`]) moves back to the slot's start, so rates cover the restored time.
    /// Returns whether it landed anywhere; the series cap applies as for records.
    pub fn absorb_slot(
        &mut self,
        key: &SeriesKey,
        slot_start_unix_nano: u64,
        length_nanos: u64,
        accumulator: &Accumulator,
    ) -> bool {
        if accumulator.is_empty() || length_nanos == 0 {
            return false;
        }
        let end = slot_start_unix_nano.saturating_add(length_nanos);
        let fits: Vec<(usize, u64)> = self
            .specs
            .iter()
            .enumerate()
            .filter(|(_, spec)| {
                spec.slot_nanos >= length_nanos
                    && slot_start_unix_nano / spec.slot_nanos == (end - 1) / spec.slot_nanos
            })
            .map(|(i, spec)| (i, slot_start_unix_nano / spec.slot_nanos))
            .collect();
        if fits.is_empty() {
            return false;
        }
        let series = match self.restored_series(key, accumulator.counts.requests) {
            Restored::Series(i) => &mut self.series[i],
            Restored::Overflow => match self.overflow.as_mut() {
                Some(s) => s,
                None => return false,
            },
        };
        series.last_record_unix_nano = series.last_record_unix_nano.max(end);
        // Into the finest ring's slot not yet rolled up, the roll-up carries it on. A newer slot
        // first completes the older ones (it may reuse one's place in the ring), as a record
        // would. (With the slot tap on, the finest slots are shorter than anything restored,
        // so restored data never reaches the tap.)
        if let Some(&(0, index)) = fits.first()
            && series.rings[0].newest().is_some_and(|n| index > n)
        {
            roll_up(&self.specs, &self.rolled, series, index, self.tap.as_mut());
        }
        let pending_in_finest = fits.first().is_some_and(|&(pos, index)| {
            pos == 0 && !series.rings[0].absorb(&self.specs[0], index, accumulator)
        });
        for (pos, index) in fits {
            if pos == 0 || (pending_in_finest && self.rolled[pos]) {
                continue;
            }
            series.rings[pos].absorb(&self.specs[pos], index, accumulator);
        }
        self.started_unix_nano = Some(
            self.started_unix_nano
                .map_or(slot_start_unix_nano, |s| s.min(slot_start_unix_nano)),
        );
        true
    }

    /// The series `key` for restored history: found, or created while under the cap, else the
    /// overflow series (counting `requests` as overflowed).
    fn restored_series(&mut self, key: &SeriesKey, requests: u64) -> Restored {
        let hash = self.key_hash(key);
        let found = self
            .index
            .get(&hash)
            .and_then(|ids| ids.iter().copied().find(|&i| self.series[i].key == *key));
        match found {
            Some(i) => Restored::Series(i),
            None if self.series.len() < self.config.max_series => {
                let s = self.new_series(&key.service, &key.model, &key.operation);
                self.series.push(s);
                let i = self.series.len() - 1;
                self.index.entry(hash).or_default().push(i);
                Restored::Series(i)
            }
            None => {
                self.overflowed_records += requests;
                if self.overflow.is_none() {
                    let (service, model, operation) = self.labelling.overflow_labels();
                    self.overflow = Some(self.new_series(service, model, operation));
                }
                Restored::Overflow
            }
        }
    }

    /// Restores a stored slot (a minute rollup read back from the history store) as
    /// [`absorb_slot`](Self::absorb_slot) does, and also into the windows whose slots are
    /// shorter than it (with the defaults, the 1m and 5m windows), which `absorb_slot` leaves
    /// out: there the whole slot lands in the short slot holding its last instant, or `now`
    /// when it has not ended yet (the minute a crash interrupted), if that lies inside the
    /// window. So a restart keeps the short windows too, at the cost of precision at their
    /// edge: a restored minute counts whole in a short window that holds its last instant.
    /// Call it before recording (at start): it lands only in slots without live records.
    pub fn absorb_restored(
        &mut self,
        key: &SeriesKey,
        slot_start_unix_nano: u64,
        length_nanos: u64,
        accumulator: &Accumulator,
        now_unix_nano: u64,
    ) -> bool {
        let mut landed = self.absorb_slot(key, slot_start_unix_nano, length_nanos, accumulator);
        if accumulator.is_empty() || length_nanos == 0 {
            return landed;
        }
        let last = slot_start_unix_nano
            .saturating_add(length_nanos - 1)
            .min(now_unix_nano);
        let finer: Vec<(usize, u64)> = self
            .specs
            .iter()
            .enumerate()
            .filter(|(_, spec)| {
                spec.slot_nanos < length_nanos
                    && last.saturating_add(spec.window_nanos) > now_unix_nano
            })
            .map(|(i, spec)| (i, last / spec.slot_nanos))
            .collect();
        if finer.is_empty() {
            return landed;
        }
        let series = match self.restored_series(key, 0) {
            Restored::Series(i) => &mut self.series[i],
            Restored::Overflow => match self.overflow.as_mut() {
                Some(s) => s,
                None => return landed,
            },
        };
        for (pos, index) in finer {
            landed |= series.rings[pos].absorb_settled(&self.specs[pos], index, accumulator);
        }
        series.last_record_unix_nano = series.last_record_unix_nano.max(last);
        self.started_unix_nano = Some(
            self.started_unix_nano
                .map_or(slot_start_unix_nano, |s| s.min(slot_start_unix_nano)),
        );
        landed
    }

    fn sweep_interval(&self) -> u64 {
        self.specs
            .first()
            .map_or(1_000_000_000, |s| s.slot_nanos)
            .max(1_000_000_000)
    }

    /// Drops series with no record within the longest window; returns how many.
    pub fn expire(&mut self, now_unix_nano: u64) -> usize {
        let longest = self.specs.last().map_or(0, |s| s.window_nanos);
        let before = self.series.len();
        let removed = &mut self.removed;
        self.series.retain(|s| {
            let live = s.last_record_unix_nano.saturating_add(longest) > now_unix_nano;
            if !live {
                removed.push(s.key.clone());
            }
            live
        });
        if self
            .overflow
            .as_ref()
            .is_some_and(|s| s.last_record_unix_nano.saturating_add(longest) <= now_unix_nano)
        {
            self.overflow = None;
        }
        let removed = before - self.series.len();
        if removed > 0 {
            self.recent.clear();
            self.index.clear();
            for (i, s) in self.series.iter().enumerate() {
                let k = &s.key;
                let hash = self
                    .hasher
                    .hash_one((&*k.service, &*k.model, &*k.operation));
                self.index.entry(hash).or_default().push(i);
            }
        }
        removed
    }

    /// The ring that serves `window`: the configured one of that length, else the shortest
    /// longer one, else the longest. Returns its position and the slots to read.
    fn ring_for(&self, window: Duration) -> (usize, u64) {
        let w = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX).max(1);
        let pos = self
            .specs
            .iter()
            .position(|s| s.window_nanos >= w)
            .unwrap_or(self.specs.len() - 1);
        let spec = &self.specs[pos];
        let n = w.div_ceil(spec.slot_nanos).clamp(1, spec.slots);
        (pos, n)
    }

    /// Seconds of time the slots `(current − n, current]` cover up to `now`, from the KPIs'
    /// start if later.
    fn covered_seconds(&self, spec: &RingSpec, n: u64, now: u64) -> f64 {
        let current = now / spec.slot_nanos;
        let oldest_start = (current + 1)
            .saturating_sub(n)
            .saturating_mul(spec.slot_nanos);
        let from = self
            .started_unix_nano
            .map_or(oldest_start, |s| s.max(oldest_start));
        now.saturating_sub(from) as f64 / 1e9
    }

    /// The finest ring's slots not yet rolled up into ring `pos`, as (index in ring `pos`,
    /// accumulator); nothing when `pos` is not filled by roll-up.
    fn pending<'a>(
        &'a self,
        series: &'a Series,
        pos: usize,
    ) -> impl Iterator<Item = (u64, &'a Accumulator)> + 'a {
        let ratio = self.specs[pos].slot_nanos / self.specs[0].slot_nanos;
        let on = self.rolled[pos];
        series.rings[0]
            .unrolled()
            .filter(move |_| on)
            .map(move |s| (s.index / ratio.max(1), &s.acc))
    }

    /// Merges one series' slots of the window.
    fn merged(&self, series: &Series, pos: usize, n: u64, now: u64) -> Accumulator {
        let current = now / self.specs[pos].slot_nanos;
        let in_window = |i: u64| i <= current && i.saturating_add(n) > current;
        let slots: Vec<&Accumulator> = series.rings[pos]
            .live(current, n)
            .map(|s| &s.acc)
            .chain(
                self.pending(series, pos)
                    .filter(|(i, _)| in_window(*i))
                    .map(|(_, a)| a),
            )
            .collect();
        Accumulator::merge_many(&slots)
    }

    fn series_kpis(&self, key: &SeriesKey, acc: &Accumulator, seconds: f64) -> SeriesKpis {
        series_kpis(&self.sketch_config, key, acc, seconds)
    }

    /// The KPIs of every series with data in `window` at `now_unix_nano`.
    ///
    /// `window` is served by the configured window of that length, else by the shortest longer
    /// one read only as far back as `window` reaches (at its slot granularity), else by the
    /// longest (and `window_seconds` then says the longest's length).
    pub fn snapshot(&self, window: Duration, now_unix_nano: u64) -> KpiSnapshot {
        let (pos, n) = self.ring_for(window);
        let spec = &self.specs[pos];
        let seconds = self.covered_seconds(spec, n, now_unix_nano);
        let window_seconds = window.as_secs_f64().min(spec.window_nanos as f64 / 1e9);
        let mut series: Vec<SeriesKpis> = Vec::new();
        let mut order: Vec<&Series> = self.series.iter().collect();
        order.sort_by(|a, b| a.key.cmp(&b.key));
        for s in order.into_iter().chain(self.overflow.as_ref()) {
            let acc = self.merged(s, pos, n, now_unix_nano);
            if !acc.is_empty() {
                series.push(self.series_kpis(&s.key, &acc, seconds));
            }
        }
        KpiSnapshot {
            window_seconds,
            series,
        }
    }

    /// The merged accumulator of one series over `window` (e.g. for Prometheus export or
    /// tests); `None` for an unknown series. The overflow series has [`OVERFLOW_LABEL`] labels.
    pub fn series_accumulator(
        &self,
        key: &SeriesKey,
        window: Duration,
        now_unix_nano: u64,
    ) -> Option<Accumulator> {
        let (pos, n) = self.ring_for(window);
        let s = self
            .series
            .iter()
            .chain(self.overflow.as_ref())
            .find(|s| &s.key == key)?;
        Some(self.merged(s, pos, n, now_unix_nano))
    }

    /// The keys of every series kept, overflow series last.
    pub fn series_keys(&self) -> Vec<SeriesKey> {
        self.series
            .iter()
            .chain(self.overflow.as_ref())
            .map(|s| s.key.clone())
            .collect()
    }

    /// Per-slot history of one series over `window`, oldest first (slots without records are
    /// left out). Cheap: clones the slots' accumulators.
    pub fn series_history(
        &self,
        key: &SeriesKey,
        window: Duration,
        now_unix_nano: u64,
    ) -> Vec<SlotHistory> {
        let (pos, n) = self.ring_for(window);
        let spec = &self.specs[pos];
        let current = now_unix_nano / spec.slot_nanos;
        let Some(s) = self
            .series
            .iter()
            .chain(self.overflow.as_ref())
            .find(|s| &s.key == key)
        else {
            return Vec::new();
        };
        let mut out: Vec<SlotHistory> = s.rings[pos]
            .live(current, n)
            .map(|slot| SlotHistory {
                start_unix_nano: slot.index.saturating_mul(spec.slot_nanos),
                length_nanos: spec.slot_nanos,
                accumulator: slot.acc.clone(),
            })
            .collect();
        for (index, acc) in self.pending(s, pos) {
            if index > current || index.saturating_add(n) <= current {
                continue;
            }
            let start = index.saturating_mul(spec.slot_nanos);
            match out.iter_mut().find(|h| h.start_unix_nano == start) {
                Some(h) => h.accumulator.merge(acc),
                None => out.push(SlotHistory {
                    start_unix_nano: start,
                    length_nanos: spec.slot_nanos,
                    accumulator: acc.clone(),
                }),
            }
        }
        out.sort_by_key(|h| h.start_unix_nano);
        out
    }
}

/// Rolls every slot of the finest ring older than `before` that is not rolled up yet into the
/// rolled-up rings of `series`, and hands it to `tap` when on.
fn roll_up(
    specs: &[RingSpec],
    rolled: &[bool],
    series: &mut Series,
    before: u64,
    mut tap: Option<&mut Vec<TappedSlot>>,
) {
    let (finest, coarser) = series.rings.split_at_mut(1);
    let fine = specs[0].slot_nanos;
    let key = &series.key;
    finest[0].roll_up(before, |index, acc| {
        if let Some(tap) = tap.as_deref_mut() {
            tap.push(TappedSlot {
                key: key.clone(),
                start_unix_nano: index.saturating_mul(fine),
                length_nanos: fine,
                accumulator: acc.clone(),
            });
        }
        for ((ring, spec), on) in coarser.iter_mut().zip(&specs[1..]).zip(&rolled[1..]) {
            if *on {
                ring.absorb(spec, index.saturating_mul(fine) / spec.slot_nanos, acc);
            }
        }
    });
}

/// The KPIs of series `key` from a merged accumulator covering `seconds` of time (rates divide
/// by it): what a snapshot reports, for accumulators merged elsewhere (e.g. stored minutes).
pub fn series_kpis(
    config: &Config,
    key: &SeriesKey,
    acc: &Accumulator,
    seconds: f64,
) -> SeriesKpis {
    let c = &acc.counts;
    let cfg = config;
    SeriesKpis {
        service: key.service.to_string(),
        model: key.model.to_string(),
        operation: key.operation.to_string(),
        requests: c.requests,
        errors: c.errors,
        cancelled: c.cancelled,
        rejected: c.rejected,
        e2e: acc.e2e.stats(cfg),
        queue: acc.queue.stats(cfg),
        ttft: acc.ttft.stats(cfg),
        prefill: acc.prefill.stats(cfg),
        decode: acc.decode.stats(cfg),
        tpot: acc.tpot.stats(cfg),
        itl: acc.itl_stats(cfg),
        tokens: acc.tokens(),
        throughput: Throughput {
            requests_per_second: accumulator::per_second(c.requests, seconds),
            input_tokens_per_second: accumulator::per_second(c.input_tokens, seconds),
            output_tokens_per_second: accumulator::per_second(c.output_tokens, seconds),
        },
        goodput: acc.goodput(seconds),
        phase_share: acc.phase_shares(),
        gpu: acc.gpu(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Dialect;
    use crate::text::Text;
    use crate::trace::{SpanId, TraceId};

    const SEC: u64 = 1_000_000_000;

    fn rec(e2e: f64) -> RequestRecord {
        let mut r = RequestRecord::new(
            TraceId([1; 16]),
            SpanId([1; 8]),
            Text::from("s"),
            Dialect::Generic,
            0,
            0,
        );
        r.e2e = e2e;
        r
    }

    fn model_rec(model: &str) -> RequestRecord {
        let mut r = rec(0.5);
        r.model = Text::from(model);
        r
    }

    #[test]
    fn a_burst_of_junk_series_locks_a_real_one_out_only_until_they_are_reclaimable() {
        let mut w = KpiWindows::new(KpiConfig {
            max_series: 10,
            ..KpiConfig::default()
        });
        let t = 10_000 * SEC;
        for i in 0..11 {
            w.record(&model_rec(&format!("junk-{i}")), t);
        }
        assert_eq!(w.overflowed_records(), 1);
        // Within the reclaim horizon the real model has to wait in the overflow series.
        assert!(!w.record(&model_rec("llama"), t + 30 * SEC));
        assert_eq!(w.reclaimed_series(), 0);
        // One junk series stays busy; the others are idle past the horizon.
        w.record(&model_rec("junk-3"), t + 50 * SEC);
        assert!(
            w.record(&model_rec("llama"), t + 61 * SEC),
            "takes an idle one's place"
        );
        assert!(w.record(&model_rec("llama"), t + 62 * SEC), "and keeps it");
        assert_eq!(w.reclaimed_series(), 1);
        assert_eq!(w.series_count(), 10);
        let removed = w.take_removed_series();
        assert_eq!(removed.len(), 1);
        assert!(removed[0].model.starts_with("junk-") && &*removed[0].model != "junk-3");
        assert!(w.take_removed_series().is_empty());
        // Every series is still found where it is (the index follows the swap).
        for m in ["junk-3", "llama"] {
            let before = w.overflowed_records();
            assert!(w.record(&model_rec(m), t + 63 * SEC));
            assert_eq!(w.overflowed_records(), before);
        }
        let snap = w.snapshot(Duration::from_secs(60), t + 63 * SEC);
        let llama = snap.series.iter().find(|s| s.model == "llama").unwrap();
        assert_eq!(llama.requests, 3);
        // Nine more new series: eight idle junk series are reclaimable, junk-3 is not yet.
        for i in 0..9 {
            w.record(&model_rec(&format!("new-{i}")), t + 64 * SEC);
        }
        assert_eq!(w.reclaimed_series(), 9);
        assert_eq!(w.series_count(), 10);
    }

    #[test]
    fn restored_minutes_refill_the_short_windows_once() {
        let minute = 60 * SEC;
        let now = 1_000 * minute + 20 * SEC;
        let mut w = KpiWindows::new(KpiConfig::default());
        w.enable_slot_tap();
        let key = SeriesKey {
            service: Arc::from("s"),
            model: Arc::from(""),
            operation: Arc::from(""),
        };
        let minute_of = |n: u64| {
            let mut acc = Accumulator::default();
            for _ in 0..n {
                acc.add(&sketch_config(), &SloConfig::default(), &rec(0.5));
            }
            acc
        };
        // Minutes 994 and 996..=999 ended before now; minute 1000 was interrupted 20 s in.
        for (m, n) in [(994, 1), (996, 2), (997, 3), (998, 4), (999, 5), (1000, 6)] {
            assert!(w.absorb_restored(&key, m * minute, minute, &minute_of(n), now));
        }
        let requests = |w: &KpiWindows, window: u64, at: u64| -> u64 {
            w.snapshot(Duration::from_secs(window), at)
                .series
                .iter()
                .map(|s| s.requests)
                .sum()
        };
        assert_eq!(
            requests(&w, 60, now),
            5 + 6,
            "minutes ending in the last minute"
        );
        assert_eq!(
            requests(&w, 300, now),
            2 + 3 + 4 + 5 + 6,
            "minute 994 ended 5m20s ago"
        );
        assert_eq!(requests(&w, 3600, now), 21, "the hour, minute by minute");
        // Live records add to it; the restored slots are never handed on a second time.
        w.record(&rec(0.5), now + SEC);
        w.roll_due(now + 2 * SEC);
        let tapped: u64 = w
            .take_tapped()
            .iter()
            .map(|t| t.accumulator.counts.requests)
            .sum();
        assert_eq!(
            tapped, 1,
            "only the live record reaches the history store again"
        );
        assert_eq!(requests(&w, 60, now + 2 * SEC), 12);
        assert_eq!(requests(&w, 3600, now + 2 * SEC), 22);
    }

    #[test]
    fn restored_series_are_reclaimable_once_idle() {
        let mut w = KpiWindows::new(KpiConfig {
            max_series: 2,
            ..KpiConfig::default()
        });
        let minute = 60 * SEC;
        let t = 1_000 * minute;
        for model in ["junk-a", "junk-b"] {
            let key = SeriesKey {
                service: Arc::from("s"),
                model: Arc::from(model),
                operation: Arc::from(""),
            };
            let mut acc = Accumulator::default();
            acc.add(&sketch_config(), &SloConfig::default(), &model_rec(model));
            assert!(w.absorb_slot(&key, t - 5 * minute, minute, &acc));
        }
        assert_eq!(w.series_count(), 2);
        assert!(
            w.record(&model_rec("llama"), t),
            "restored history does not lock it out"
        );
        assert_eq!(w.reclaimed_series(), 1);
    }

    #[test]
    fn ring_geometry_follows_the_config() {
        let w = KpiWindows::new(KpiConfig {
            windows: vec![
                Duration::from_secs(3600),
                Duration::ZERO,
                Duration::from_secs(60),
            ],
            slots_per_window: 12,
            ..KpiConfig::default()
        });
        assert_eq!(
            w.windows(),
            vec![Duration::from_secs(60), Duration::from_secs(3600)]
        );
        assert_eq!(w.specs[0].slot_nanos, 5 * SEC);
        assert_eq!(w.specs[1].slot_nanos, 300 * SEC);
        let none = KpiWindows::new(KpiConfig {
            windows: vec![],
            ..KpiConfig::default()
        });
        assert_eq!(none.windows(), vec![Duration::from_secs(60)]);
    }

    #[test]
    fn a_record_older_than_a_ring_is_left_out_of_it_only() {
        let mut w = KpiWindows::new(KpiConfig::default());
        let t = 10_000 * SEC;
        w.record(&rec(1.0), t);
        w.record(&rec(2.0), t - 120 * SEC); // the clock went back two minutes
        let requests = |window| {
            w.snapshot(Duration::from_secs(window), t)
                .series
                .first()
                .map_or(0, |s| s.requests)
        };
        assert_eq!(requests(60), 1);
        assert_eq!(requests(300), 2);
        assert_eq!(requests(3600), 2);
    }

    #[test]
    fn memory_estimate_grows_with_data() {
        let mut w = KpiWindows::new(KpiConfig::default());
        let empty = w.approx_memory_bytes();
        for k in 0..100u64 {
            w.record(&rec(0.1 + k as f64 * 0.01), 10_000 * SEC + k * SEC);
        }
        assert!(w.approx_memory_bytes() > empty);
    }

    #[test]
    fn records_find_their_series_through_the_recent_cache_and_after_an_expiry() {
        let mut w = KpiWindows::new(KpiConfig::default());
        let (a, b) = (Text::from("svc-a"), Text::from("svc-b"));
        let of = |service: &Text| {
            let mut r = rec(1.0);
            r.service = service.clone();
            r
        };
        let t = 10_000 * SEC;
        // Alternating series, repeats of one, and an equal text in another allocation.
        for service in [&a, &a, &b, &a, &b, &b, &Text::from("svc-a")] {
            w.record(&of(service), t);
        }
        let count = |w: &KpiWindows, name: &str, now| {
            w.snapshot(Duration::from_secs(60), now)
                .series
                .iter()
                .find(|s| s.service == name)
                .map_or(0, |s| s.requests)
        };
        w.record(&of(&b), t);
        assert_eq!((count(&w, "svc-a", t), count(&w, "svc-b", t)), (4, 4));
        assert_eq!(w.series_count(), 2);
        // The last record was b's, the second series. a goes quiet past the longest window
        // (an hour) and the next record's sweep expires it: b moves to the first position, so
        // a cached position would now be wrong.
        let later = t + 5400 * SEC;
        w.record(&of(&b), later);
        assert_eq!(w.series_count(), 1, "a expired");
        w.record(&of(&b), later);
        w.record(&of(&a), later);
        assert_eq!(w.series_count(), 2);
        assert_eq!(
            (count(&w, "svc-a", later), count(&w, "svc-b", later)),
            (1, 2)
        );
    }

    #[test]
    fn minutes_absorbed_into_the_finest_ring_reach_the_rolled_up_ring() {
        // Windows whose finest slots are minutes: restored minutes land in the finest ring,
        // and 119 of them wrap its 60 slots; none may be lost from the two-hour window, which
        // must hold what a two-hour window alone would.
        let config = sketch_config();
        let slo = SloConfig::default();
        let windows = |w: &[u64]| {
            KpiWindows::new(KpiConfig {
                windows: w.iter().map(|s| Duration::from_secs(*s)).collect(),
                ..KpiConfig::default()
            })
        };
        let (mut both, mut hour, mut two_hours) =
            (windows(&[3600, 7200]), windows(&[3600]), windows(&[7200]));
        let now = 1_000_000 * 60 * SEC;
        let key = SeriesKey {
            service: Arc::from("s"),
            model: Arc::from(crate::record::UNKNOWN),
            operation: Arc::from(crate::record::UNKNOWN),
        };
        for m in (1..=119u64).rev() {
            let mut acc = Accumulator::default();
            acc.add(&config, &slo, &rec(1.0));
            for w in [&mut both, &mut hour, &mut two_hours] {
                w.absorb_slot(&key, now - m * 60 * SEC, 60 * SEC, &acc);
            }
        }
        let requests = |w: &KpiWindows, window: u64| {
            w.snapshot(Duration::from_secs(window), now).series[0].requests
        };
        assert_eq!(requests(&both, 7200), requests(&two_hours, 7200));
        assert!(requests(&both, 7200) >= 118);
        assert_eq!(requests(&both, 3600), requests(&hour, 3600));
    }

    #[test]
    fn absorbed_minutes_fill_the_hour_window() {
        let config = sketch_config();
        let slo = SloConfig::default();
        let mut w = KpiWindows::new(KpiConfig::default());
        let now = 100_000 * SEC;
        w.set_start(now - SEC);
        let key = SeriesKey {
            service: Arc::from("s"),
            model: Arc::from(crate::record::UNKNOWN),
            operation: Arc::from(crate::record::UNKNOWN),
        };
        let minute = |m: u64| (now / (60 * SEC) - m) * 60 * SEC;
        for m in 1..=3u64 {
            let mut acc = Accumulator::default();
            for _ in 0..m {
                acc.add(&config, &slo, &rec(m as f64));
            }
            assert!(w.absorb_slot(&key, minute(m), 60 * SEC, &acc));
        }
        // Not aligned to any 1h slot: refused.
        assert!(!w.absorb_slot(&key, minute(5) + SEC, 60 * SEC, &{
            let mut a = Accumulator::default();
            a.add(&config, &slo, &rec(1.0));
            a
        }));
        w.record(&rec(10.0), now);
        let hour = w.snapshot(Duration::from_secs(3600), now);
        assert_eq!(hour.series.len(), 1);
        assert_eq!(hour.series[0].requests, 1 + 2 + 3 + 1);
        // Rates cover the restored minutes, not just the uptime.
        let rps = hour.series[0].throughput.requests_per_second;
        let covered = (now - minute(3)) as f64 / 1e9;
        assert!((rps - 7.0 / covered).abs() < 1e-9, "{rps}");
        // The 1m window holds only the live record.
        assert_eq!(
            w.snapshot(Duration::from_secs(60), now).series[0].requests,
            1
        );
    }
}
