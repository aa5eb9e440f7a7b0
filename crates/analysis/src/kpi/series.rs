//! The series table: one [`Series`] per label set, up to the cap, with one ring per window;
//! recording, rolling the finest ring up into the coarser ones, reclaiming and expiring series,
//! and absorbing restored history.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use foldhash::fast::RandomState;
use foldhash::{HashMap, HashMapExt};
use serde::Serialize;
use sketches_ddsketch::Config;

use super::accumulator::Accumulator;
use super::config::KpiConfig;
use super::distribution::sketch_config;
use super::labelling::{Labelling, is_overflow_label};
use super::ring::{Ring, RingSpec};
use crate::heap_size::{arc_str_bytes, list_map_bytes};
use crate::record::RequestRecord;
use infertrace_intern::RecentTriple;

use crate::text::Text;

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
    /// Heap bytes of its three label strings, for memory accounting (each counted whole, as if
    /// not shared).
    pub fn heap_bytes(&self) -> usize {
        arc_str_bytes(self.service.len())
            + arc_str_bytes(self.model.len())
            + arc_str_bytes(self.operation.len())
    }

    pub(super) fn matches(&self, service: &str, model: &str, operation: &str) -> bool {
        &*self.service == service && &*self.model == model && &*self.operation == operation
    }
}

/// One series: its labels and one ring per window length.
#[derive(Clone)]
pub(super) struct Series {
    pub(super) key: SeriesKey,
    pub(super) rings: Vec<Ring>,
    pub(super) last_record_unix_nano: u64,
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

/// Sliding KPI windows of every series. See the [module docs](super).
#[derive(Clone)]
pub struct KpiWindows {
    pub(super) config: KpiConfig,
    pub(super) sketch_config: Config,
    pub(super) specs: Vec<RingSpec>,
    /// Per ring: whether it is filled by rolling up the finest ring (never the finest itself).
    pub(super) rolled: Vec<bool>,
    pub(super) hasher: RandomState,
    pub(super) index: HashMap<u64, Vec<usize>>,
    /// The position of the last record's series; cleared whenever series move (see
    /// [`Self::expire`]).
    pub(super) recent: RecentTriple<Text, usize>,
    pub(super) labelling: Labelling,
    pub(super) series: Vec<Series>,
    pub(super) overflow: Option<Series>,
    pub(super) overflowed_records: u64,
    /// Series reclaimed for new ones under the cap, since start.
    pub(super) reclaimed: u64,
    /// No series can be reclaimed before this time (the least recent one's reclaim time).
    pub(super) next_reclaim_unix_nano: u64,
    /// Series removed (expired or reclaimed) since the last [`KpiWindows::take_removed_series`].
    pub(super) removed: Vec<SeriesKey>,
    pub(super) started_unix_nano: Option<u64>,
    /// Per ring, the restored minutes counted whole in a shorter slot
    /// ([`absorb_restored`](Self::absorb_restored)): (the slot's index, the minute's start).
    /// While such a slot is in a window, the window's rates divide by the time from that
    /// minute's start, which its requests cover.
    pub(super) restored_reach: Vec<Vec<(u64, u64)>>,
    /// Times no collector saw, `[from, to)` ([`set_unseen`](Self::set_unseen)): rates do not
    /// divide by them.
    pub(super) unseen: Vec<(u64, u64)>,
    pub(super) last_sweep_unix_nano: u64,
    /// Completed finest-ring slots for a consumer (see [`KpiWindows::enable_slot_tap`]).
    pub(super) tap: Option<Vec<TappedSlot>>,
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

/// How many of the tap's newest slots a late record looks through for its own series and slot
/// before it is handed on in a slot of its own (a bound on the search, not on correctness).
const TAP_COALESCE_SCAN: usize = 64;

/// One minute, nanoseconds.
pub(super) const MINUTE_NANOS: u64 = 60_000_000_000;

/// Where restored history goes: a series by its position, or the overflow series.
pub(super) enum Restored {
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
        let rings = specs.len();
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
            restored_reach: vec![Vec::new(); rings],
            unseen: Vec::new(),
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

    /// Marks when the KPIs started (e.g. the collector's start), so rates in windows longer than
    /// the uptime divide by the uptime. Without it the first record's `now` is used.
    pub fn set_start(&mut self, start_unix_nano: u64) {
        self.started_unix_nano = Some(start_unix_nano);
    }

    /// Marks times since the start when no collector was running (`[from, to)`, e.g. between
    /// the restored history's last commit and this collector's start): rates in windows over
    /// them divide by the time that was seen, as a collector that never stopped would.
    pub fn set_unseen(&mut self, gaps: Vec<(u64, u64)>) {
        self.unseen = gaps;
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
    pub(super) fn reclaim_idle(&mut self, now_unix_nano: u64) -> bool {
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
        self.fold_into_overflow(&series);
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

    /// Folds a reclaimed series' slots into the overflow series, so that its requests stay in
    /// every window's totals: a reclaim frees a place, it does not take requests out of a
    /// window (the critical-path windows fold a reclaimed key alike). `series` has handed all
    /// its finest slots on (rolled up, tapped); they join the overflow's finest ring as settled
    /// slots, so neither the coarser rings nor the tap see them a second time.
    fn fold_into_overflow(&mut self, series: &Series) {
        self.open_overflow();
        let Some(overflow) = self.overflow.as_mut() else {
            return;
        };
        // A settled slot cannot join one still collecting live records: the overflow's own
        // slots up to the folded ones' are completed first (a later record there is handled
        // as any late record).
        let before = series.rings[0].newest().map_or(0, |n| n.saturating_add(1));
        roll_up(
            &self.specs,
            &self.rolled,
            overflow,
            before,
            self.tap.as_mut(),
        );
        for (pos, (ring, spec)) in series.rings.iter().zip(&self.specs).enumerate() {
            overflow.rings[pos].merge_from(spec, ring, pos == 0);
        }
        overflow.last_record_unix_nano = overflow
            .last_record_unix_nano
            .max(series.last_record_unix_nano);
    }

    /// Makes the overflow series if there is none yet.
    fn open_overflow(&mut self) {
        if self.overflow.is_none() {
            let (service, model, operation) = self.labelling.overflow_labels();
            self.overflow = Some(self.new_series(service, model, operation));
        }
    }

    /// The labels of the overflow series.
    fn overflow_key(&self) -> SeriesKey {
        let (service, model, operation) = self.labelling.overflow_labels();
        SeriesKey {
            service: Arc::from(service),
            model: Arc::from(model),
            operation: Arc::from(operation),
        }
    }

    pub(super) fn key_hash(&self, key: &SeriesKey) -> u64 {
        self.hasher
            .hash_one((&*key.service, &*key.model, &*key.operation))
    }

    /// Approximate bytes held by every series' slots (sketch bins, tail buckets, slot and
    /// series overhead), their label strings and the index of them, for the collector's memory
    /// accounting. Walks every series' slots: call it seldom (the collector does once a
    /// second), not per record.
    pub fn approx_memory_bytes(&self) -> usize {
        let series: usize = self
            .series
            .iter()
            .chain(self.overflow.as_ref())
            .map(|s| s.key.heap_bytes() + s.rings.iter().map(Ring::heap_bytes).sum::<usize>())
            .sum();
        (self.series.capacity() + 1) * std::mem::size_of::<Series>()
            + series
            + list_map_bytes(&self.index)
    }

    /// Series kept, the overflow series not counted.
    pub fn series_count(&self) -> usize {
        self.series.len()
    }

    pub(super) fn new_series(&self, service: &str, model: &str, operation: &str) -> Series {
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
        self.sweep(now_unix_nano);
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
                self.open_overflow();
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
            // Not in a slot the tap will see: added to what the tap holds for this series and
            // slot. Late records come in runs (a tick that ran past a slot's end records every
            // trace it analyses there), and the consumer merges each accumulator whole.
            let fine = self.specs[0].slot_nanos;
            let start_unix_nano = fine_index.saturating_mul(fine);
            let scan_from = tap.len().saturating_sub(TAP_COALESCE_SCAN);
            let pending = tap[scan_from..]
                .iter()
                .rposition(|t| t.start_unix_nano == start_unix_nano && t.key == series.key);
            let at = match pending {
                Some(i) => scan_from + i,
                None => {
                    tap.push(TappedSlot {
                        key: series.key.clone(),
                        start_unix_nano,
                        length_nanos: fine,
                        accumulator: Accumulator::default(),
                    });
                    tap.len() - 1
                }
            };
            tap[at]
                .accumulator
                .add(&self.sketch_config, &self.config.slo, record);
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
        let end = slot_start_unix_nano.saturating_add(length_nanos);
        self.absorb_span(key, slot_start_unix_nano, length_nanos, accumulator, end)
    }

    /// [`absorb_slot`](Self::absorb_slot), the series counting as last recorded at `last` (at
    /// most the slot's end) for reclaim and expiry.
    fn absorb_span(
        &mut self,
        key: &SeriesKey,
        slot_start_unix_nano: u64,
        length_nanos: u64,
        accumulator: &Accumulator,
        last: u64,
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
        series.last_record_unix_nano = series.last_record_unix_nano.max(last.min(end));
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

    /// The series `key` for restored history: the overflow series for a stored overflow row
    /// (either label: it never takes a place under the cap, and is never reclaimed as a
    /// series), else the series found, or created while under the cap, else the overflow
    /// series (counting `requests` as overflowed).
    pub(super) fn restored_series(&mut self, key: &SeriesKey, requests: u64) -> Restored {
        if is_overflow_key(key) {
            self.open_overflow();
            return Restored::Overflow;
        }
        match self.find(key) {
            Some(i) => Restored::Series(i),
            None if self.series.len() < self.config.max_series => {
                let s = self.new_series(&key.service, &key.model, &key.operation);
                self.series.push(s);
                let i = self.series.len() - 1;
                let hash = self.key_hash(key);
                self.index.entry(hash).or_default().push(i);
                Restored::Series(i)
            }
            None => {
                self.overflowed_records += requests;
                self.open_overflow();
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
    /// edge: a restored minute counts whole in a short window that holds its last instant, and
    /// the window's rates divide by the time from that minute's start (`restored_reach`).
    /// Call it before recording (at start): it lands only in slots without live records. The
    /// series counts as last recorded at the slot's end, or `now` if earlier (for reclaim).
    /// To restore many slots, [`restore_slots`](Self::restore_slots) chooses which series get
    /// the places under the cap.
    pub fn absorb_restored(
        &mut self,
        key: &SeriesKey,
        slot_start_unix_nano: u64,
        length_nanos: u64,
        accumulator: &Accumulator,
        now_unix_nano: u64,
    ) -> bool {
        if accumulator.is_empty() || length_nanos == 0 {
            return false;
        }
        let last = slot_start_unix_nano
            .saturating_add(length_nanos - 1)
            .min(now_unix_nano);
        let mut landed =
            self.absorb_span(key, slot_start_unix_nano, length_nanos, accumulator, last);
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
            if series.rings[pos].absorb_settled(&self.specs[pos], index, accumulator) {
                landed = true;
                self.restored_reach[pos].push((index, slot_start_unix_nano));
            }
        }
        series.last_record_unix_nano = series.last_record_unix_nano.max(last);
        self.started_unix_nano = Some(
            self.started_unix_nano
                .map_or(slot_start_unix_nano, |s| s.min(slot_start_unix_nano)),
        );
        landed
    }

    /// Restores stored slots, each `(key, slot start, slot length, accumulator)` in time order
    /// (the history store's minute rollups), with [`absorb_restored`](Self::absorb_restored).
    /// Returns how many landed.
    ///
    /// The places left under the cap go first to the series with the newest slot end (known
    /// to the store's minute), then the most requests, then by label: restoring in stored
    /// order would give them to the oldest series (a burst of junk names) and send a model
    /// active just before the restart to the overflow series. The slots of the other series
    /// join the overflow series (counted as overflowed), as stored overflow rows do; so every
    /// restored request stays in the windows' totals, and one overflow row holds the rest.
    pub fn restore_slots<'a>(
        &mut self,
        slots: impl IntoIterator<Item = (&'a SeriesKey, u64, u64, &'a Accumulator)>,
        now_unix_nano: u64,
    ) -> usize {
        let slots: Vec<_> = slots.into_iter().collect();
        // Per new series: (newest slot end, requests).
        let mut seen: HashMap<&SeriesKey, (u64, u64)> = HashMap::new();
        for &(key, start, length, acc) in &slots {
            if acc.is_empty() || is_overflow_key(key) || self.find(key).is_some() {
                continue;
            }
            let e = seen.entry(key).or_default();
            e.0 = e.0.max(start.saturating_add(length));
            e.1 += acc.counts.requests;
        }
        let mut ranked: Vec<_> = seen.into_iter().collect();
        ranked.sort_by(|(a, (a_end, a_n)), (b, (b_end, b_n))| {
            (b_end, b_n).cmp(&(a_end, a_n)).then_with(|| a.cmp(b))
        });
        let places = self.config.max_series.saturating_sub(self.series.len());
        let spilled: std::collections::HashSet<&SeriesKey> =
            ranked.iter().skip(places).map(|(k, _)| *k).collect();
        let overflow_key = self.overflow_key();
        let mut landed = 0;
        for (key, start, length, acc) in slots {
            let spill = spilled.contains(key);
            let key = if spill { &overflow_key } else { key };
            if self.absorb_restored(key, start, length, acc, now_unix_nano) {
                landed += 1;
                if spill {
                    self.overflowed_records += acc.counts.requests;
                }
            }
        }
        landed
    }

    /// The position of series `key`, if kept.
    fn find(&self, key: &SeriesKey) -> Option<usize> {
        self.index
            .get(&self.key_hash(key))
            .and_then(|ids| ids.iter().copied().find(|&i| self.series[i].key == *key))
    }

    pub(super) fn sweep_interval(&self) -> u64 {
        self.specs
            .first()
            .map_or(1_000_000_000, |s| s.slot_nanos)
            .max(1_000_000_000)
    }

    /// [`Self::expire`] when a sweep is due (once per finest slot, at most once a second):
    /// every record sweeps, and so should an idle caller's clock, or idle series outlive a
    /// collector that stopped receiving. Returns how many series it removed.
    pub fn sweep(&mut self, now_unix_nano: u64) -> usize {
        if now_unix_nano.saturating_sub(self.last_sweep_unix_nano) < self.sweep_interval() {
            return 0;
        }
        self.last_sweep_unix_nano = now_unix_nano;
        self.expire(now_unix_nano)
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
}

/// Rolling the finest ring's completed slots up into the coarser rings, and the slot tap.
impl KpiWindows {
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
    /// new records does not complete its last slot by itself); returns when the slot
    /// `now_unix_nano` falls in began: every record before it is in a completed slot.
    pub fn roll_due(&mut self, now_unix_nano: u64) -> u64 {
        let fine = self.specs[0].slot_nanos;
        let before = now_unix_nano / fine;
        self.roll_every_series(before);
        before * fine
    }

    /// Completes every finest-ring slot, the current one included (shutdown: nothing is
    /// recorded after it).
    pub fn roll_all(&mut self) {
        self.roll_every_series(u64::MAX);
    }

    pub(super) fn roll_every_series(&mut self, before: u64) {
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

/// Whether `key` is an overflow series' (every label the overflow label, old or current, or
/// empty: a dimension not labelled), e.g. a stored overflow row.
fn is_overflow_key(key: &SeriesKey) -> bool {
    let labels = [&*key.service, &*key.model, &*key.operation];
    labels.iter().any(|l| is_overflow_label(l))
        && labels.iter().all(|l| l.is_empty() || is_overflow_label(l))
}
