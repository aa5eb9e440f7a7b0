//! [`StoreFeed`]: what the pipeline calls per request — a minute's accumulators per series and
//! the requests worth keeping, handed to the [`StoreWriter`] at least once a second.
//!
//! The minute's accumulators come one of two ways: by adding every request
//! ([`StoreFeed::record`]), or — when the KPI windows' slot tap is on
//! ([`KpiWindows::enable_slot_tap`](infertrace_analysis::kpi::KpiWindows::enable_slot_tap)),
//! as the pipeline arranges — by merging the windows' completed one-second slots
//! ([`StoreFeed::absorb`]), which spares a second sketch update per latency and request.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use std::hash::BuildHasher;
use std::mem::size_of;

use foldhash::fast::RandomState;
use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;
use std::time::Duration;

use infertrace_analysis::critical_path::{CriticalPath, CriticalPathWindows};
use infertrace_analysis::heap_size::list_map_bytes;
use infertrace_analysis::kpi::{
    Accumulator, Dimension, KpiConfig, OVERFLOW_LABEL, SeriesKey, SloConfig, TappedSlot,
    sketch_config,
};
use infertrace_analysis::record::RequestRecord;
use sketches_ddsketch::Config;

use super::options::StoreOptions;
use super::time::minute_of;
use super::writer::{CaptureReason, CapturedRequest, StoreWriter};

/// Longest time between hand-overs to the writer.
const MAX_HANDOVER: Duration = Duration::from_secs(1);

/// An e2e ordered by `f64::total_cmp`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct E2e(f64);

impl Eq for E2e {}

impl PartialOrd for E2e {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for E2e {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Collects the current minute in memory and hands it to the writer. Not thread-safe by itself:
/// the pipeline keeps it beside its KPI windows, under the same lock.
///
/// Series are labelled as `KpiWindows` labels them (its [`KpiConfig::dimensions`]). Fed from
/// the windows' slots ([`use_tapped_slots`](Self::use_tapped_slots), the pipeline's way) the
/// stored series are exactly the windows' own, overflow included (the windows' cap holds a
/// series for as long as it has records in the longest window), and a captured request is
/// filed under the series its record went to ([`record_in`](Self::record_in)). Fed record by
/// record, at most [`KpiConfig::max_series`] series per minute are kept (the rest go to the
/// [`OVERFLOW_LABEL`] series).
#[derive(Debug)]
pub struct StoreFeed {
    writer: StoreWriter,
    sketch: Config,
    slo: SloConfig,
    dimensions: Vec<Dimension>,
    max_series: usize,
    slow_per_minute: usize,
    failed_per_minute: usize,
    handover_nanos: u64,
    minute: Option<u64>,
    last_handover: u64,
    hasher: RandomState,
    index: HashMap<u64, Vec<usize>>,
    series: Vec<(SeriesKey, Accumulator)>,
    overflow: Option<(SeriesKey, Accumulator)>,
    /// The minute's slowest e2e values so far (a min-heap of at most `slow_per_minute`).
    slowest: BinaryHeap<Reverse<E2e>>,
    failed: usize,
    captured: Vec<CapturedRequest>,
    /// Accumulators come from [`absorb`](Self::absorb), not from [`record`](Self::record).
    tapped: bool,
    /// In tapped mode: every record before this time is in the slots absorbed so far.
    absorbed_through: u64,
}

impl StoreFeed {
    /// A feed into `writer` with the store's `options` and the KPI windows' `kpi` config.
    pub fn new(writer: StoreWriter, options: &StoreOptions, kpi: &KpiConfig) -> Self {
        let handover = MAX_HANDOVER.min(options.flush_interval / 4);
        Self {
            writer,
            sketch: sketch_config(),
            slo: kpi.slo,
            dimensions: kpi.dimensions.clone(),
            max_series: kpi.max_series,
            slow_per_minute: options.slow_per_minute,
            failed_per_minute: options.failed_per_minute,
            handover_nanos: u64::try_from(handover.as_nanos()).unwrap_or(u64::MAX),
            minute: None,
            last_handover: 0,
            hasher: RandomState::default(),
            index: HashMap::new(),
            series: Vec::new(),
            overflow: None,
            slowest: BinaryHeap::new(),
            failed: 0,
            captured: Vec::new(),
            tapped: false,
            absorbed_through: 0,
        }
    }

    /// From now on the minute's accumulators come from [`absorb`](Self::absorb) only;
    /// [`record`](Self::record) then keeps just the slow and failed requests.
    pub fn use_tapped_slots(&mut self) {
        self.tapped = true;
    }

    /// Merges completed KPI slots into the current minute (a slot of an earlier minute counts
    /// in the current one, as a late record does); every record before `through_unix_nano`
    /// is in them or in slots absorbed before (the windows completed every slot that ended by
    /// then). Call before [`tick`](Self::tick).
    pub fn absorb(&mut self, slots: Vec<TappedSlot>, through_unix_nano: u64) {
        self.absorbed_through = self.absorbed_through.max(through_unix_nano);
        for slot in slots {
            if self.minute.is_none() {
                self.minute = Some(minute_of(slot.start_unix_nano));
            }
            let hash =
                self.hasher
                    .hash_one((&*slot.key.service, &*slot.key.model, &*slot.key.operation));
            let found = self
                .index
                .get(&hash)
                .and_then(|ids| ids.iter().copied().find(|&i| self.series[i].0 == slot.key));
            match found {
                Some(i) => self.series[i].1.merge(&slot.accumulator),
                None => {
                    self.series.push((slot.key, slot.accumulator));
                    self.index
                        .entry(hash)
                        .or_default()
                        .push(self.series.len() - 1);
                }
            }
        }
    }

    /// The writer (for findings and alert transitions).
    pub fn writer(&self) -> &StoreWriter {
        &self.writer
    }

    fn label<'a>(&self, d: Dimension, v: &'a str) -> &'a str {
        if self.dimensions.contains(&d) { v } else { "" }
    }

    /// Adds one request that reached the KPIs at `now_unix_nano` (the same clock and moment as
    /// `KpiWindows::record`), with its critical path when computed. A record whose minute is
    /// older than the current one counts in the current one.
    pub fn record(
        &mut self,
        record: &RequestRecord,
        critical_path: Option<&CriticalPath>,
        now_unix_nano: u64,
    ) {
        self.record_in(record, critical_path, now_unix_nano, false);
    }

    /// [`record`](Self::record), saying whether the KPI windows put the record in their
    /// overflow series (what `KpiWindows::record` returned, negated), so that in tapped mode a
    /// captured request is filed under the series its minute is stored in.
    pub fn record_in(
        &mut self,
        record: &RequestRecord,
        critical_path: Option<&CriticalPath>,
        now_unix_nano: u64,
        overflowed: bool,
    ) {
        self.tick(now_unix_nano);
        let minute = self.minute.unwrap_or_else(|| minute_of(now_unix_nano));
        if self.tapped {
            let series = overflowed.then(|| self.overflow_key());
            self.capture(minute, series, record, critical_path);
            return;
        }
        let (service, model, operation) = (
            self.label(Dimension::Service, &record.service),
            self.label(Dimension::Model, &record.model),
            self.label(Dimension::Operation, &record.operation),
        );
        let hash = self.hasher.hash_one((service, model, operation));
        let found = self.index.get(&hash).and_then(|ids| {
            ids.iter().copied().find(|&i| {
                let k = &self.series[i].0;
                &*k.service == service && &*k.model == model && &*k.operation == operation
            })
        });
        let (key, acc) = match found {
            Some(i) => {
                let (k, a) = &mut self.series[i];
                (&*k, a)
            }
            None if self.series.len() < self.max_series => {
                self.series.push((
                    SeriesKey {
                        service: Arc::from(service),
                        model: Arc::from(model),
                        operation: Arc::from(operation),
                    },
                    Accumulator::default(),
                ));
                let i = self.series.len() - 1;
                self.index.entry(hash).or_default().push(i);
                let (k, a) = &mut self.series[i];
                (&*k, a)
            }
            None => {
                let has = |d| self.dimensions.contains(&d);
                let label = |d| Arc::from(if has(d) { OVERFLOW_LABEL } else { "" });
                let o = self.overflow.get_or_insert_with(|| {
                    (
                        SeriesKey {
                            service: label(Dimension::Service),
                            model: label(Dimension::Model),
                            operation: label(Dimension::Operation),
                        },
                        Accumulator::default(),
                    )
                });
                (&o.0, &mut o.1)
            }
        };
        acc.add(&self.sketch, &self.slo, record);
        let key = key.clone();
        self.capture(minute, Some(key), record, critical_path);
    }

    /// The overflow series' key, labelled as the KPI windows label it.
    fn overflow_key(&self) -> SeriesKey {
        let label = |d| {
            Arc::from(if self.dimensions.contains(&d) {
                OVERFLOW_LABEL
            } else {
                ""
            })
        };
        SeriesKey {
            service: label(Dimension::Service),
            model: label(Dimension::Model),
            operation: label(Dimension::Operation),
        }
    }

    /// The series key a record not in the overflow series has.
    fn key_of(&self, record: &RequestRecord) -> SeriesKey {
        SeriesKey {
            service: Arc::from(self.label(Dimension::Service, &record.service)),
            model: Arc::from(self.label(Dimension::Model, &record.model)),
            operation: Arc::from(self.label(Dimension::Operation, &record.operation)),
        }
    }

    /// Keeps `record` when it is among the minute's slowest or failed ones, under `series`
    /// (else the key its labels give).
    fn capture(
        &mut self,
        minute: u64,
        series: Option<SeriesKey>,
        record: &RequestRecord,
        critical_path: Option<&CriticalPath>,
    ) {
        let reason = CaptureReason::of(record.outcome);
        let keep = match reason {
            CaptureReason::Failed => {
                let keep = self.failed < self.failed_per_minute;
                self.failed += usize::from(keep);
                keep
            }
            CaptureReason::Slow => {
                let e2e = E2e(record.e2e);
                if self.slow_per_minute == 0 || !record.e2e.is_finite() {
                    false
                } else if self.slowest.len() < self.slow_per_minute {
                    self.slowest.push(Reverse(e2e));
                    true
                } else if self.slowest.peek().is_some_and(|m| e2e > m.0) {
                    self.slowest.pop();
                    self.slowest.push(Reverse(e2e));
                    true
                } else {
                    false
                }
            }
        };
        if keep {
            let series = series.unwrap_or_else(|| self.key_of(record));
            self.captured.push(CapturedRequest {
                minute_unix_nano: minute,
                reason,
                series,
                record: record.clone(),
                critical_path: critical_path.cloned(),
            });
            self.trim_captured();
        }
    }

    /// Keeps the captured-but-not-handed-over list bounded: slow entries displaced since they
    /// were captured can never be among the minute's slowest, so keep only the slowest ones.
    fn trim_captured(&mut self) {
        let slow = self
            .captured
            .iter()
            .filter(|c| c.reason == CaptureReason::Slow)
            .count();
        if slow <= 2 * self.slow_per_minute.max(1) {
            return;
        }
        let Some(Reverse(E2e(threshold))) = self.slowest.peek().copied() else {
            return;
        };
        self.captured
            .retain(|c| c.reason == CaptureReason::Failed || c.record.e2e >= threshold);
    }

    /// Estimated bytes the feed holds: the current minute's accumulators not yet handed over,
    /// their keys and index, and the captured requests (the collector holds them in its memory
    /// limiter with the aggregates; [`StoreWriter::memory_bytes`] counts what it handed over).
    pub fn approx_memory_bytes(&self) -> usize {
        let series = self.series.capacity() * size_of::<(SeriesKey, Accumulator)>()
            + self
                .series
                .iter()
                .chain(self.overflow.as_ref())
                .map(|(k, a)| k.heap_bytes() + a.heap_bytes())
                .sum::<usize>();
        let index = list_map_bytes(&self.index);
        let captured = self.captured.capacity() * size_of::<CapturedRequest>()
            + self
                .captured
                .iter()
                .filter_map(|c| c.critical_path.as_ref())
                .map(CriticalPath::heap_bytes)
                .sum::<usize>();
        series + index + captured + self.slowest.capacity() * size_of::<Reverse<E2e>>()
    }

    /// Hands what was collected to the writer when a minute ended or a hand-over step passed.
    /// Call it on every pipeline tick (records call it too). Returns whether it handed over:
    /// the moment to [`hand_over_critical_paths`](Self::hand_over_critical_paths) too.
    pub fn tick(&mut self, now_unix_nano: u64) -> bool {
        let minute = minute_of(now_unix_nano);
        match self.minute {
            None => {
                self.minute = Some(minute);
                self.last_handover = now_unix_nano;
                false
            }
            Some(current) if minute > current => {
                self.hand_over(now_unix_nano);
                self.minute = Some(minute);
                self.index.clear();
                self.series.clear();
                self.overflow = None;
                self.slowest.clear();
                self.failed = 0;
                true
            }
            Some(_) => {
                let due = now_unix_nano.saturating_sub(self.last_handover) >= self.handover_nanos;
                if due {
                    self.hand_over(now_unix_nano);
                }
                due
            }
        }
    }

    /// Hands the critical-path `windows`' slots recorded into since they last reached the
    /// writer ([`CriticalPathWindows::unsaved_slots`]), each replacing its stored version;
    /// slots older than the windows reach are deleted from the store. Slots the writer's
    /// queue refuses are handed again next time. Call when [`tick`](Self::tick) handed over,
    /// and with [`hand_over`](Self::hand_over) at shutdown: the store then holds what the
    /// rollups hold.
    pub fn hand_over_critical_paths(
        &mut self,
        windows: &mut CriticalPathWindows,
        now_unix_nano: u64,
    ) {
        let slots = windows.unsaved_slots(now_unix_nano);
        if slots.is_empty() {
            return;
        }
        let keep_from = windows.reach_start(now_unix_nano);
        if self
            .writer
            .write_critical_slots(windows.slot_nanos(), keep_from, slots)
        {
            windows.mark_saved();
        }
    }

    /// Hands everything collected so far to the writer now (call before shutting down, then
    /// [`StoreWriter::flush`]).
    pub fn hand_over(&mut self, now_unix_nano: u64) {
        self.last_handover = now_unix_nano;
        let Some(minute) = self.minute else { return };
        let rollups: Vec<(SeriesKey, Accumulator)> = self
            .series
            .iter_mut()
            .chain(self.overflow.as_mut())
            .filter(|(_, a)| !a.is_empty())
            .map(|(k, a)| (k.clone(), std::mem::take(a)))
            .collect();
        if !rollups.is_empty() {
            self.writer.write_rollups(minute, rollups);
        }
        if !self.captured.is_empty() {
            self.writer
                .write_requests(std::mem::take(&mut self.captured));
        }
        // Records reach the feed as they reach the KPIs, or with their completed slots.
        let through = if self.tapped {
            self.absorbed_through
        } else {
            now_unix_nano
        };
        self.writer.write_through(through);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::internal_events::InternalEvents;
    use crate::store::{MINUTE_NANOS, Store};
    use infertrace_analysis::record::{Dialect, Outcome};
    use infertrace_analysis::text::Text;
    use infertrace_analysis::trace::{SpanId, TraceId};

    fn rec(model: &str, e2e: f64, outcome: Outcome) -> RequestRecord {
        let mut r = RequestRecord::new(
            TraceId([2; 16]),
            SpanId([2; 8]),
            Text::from("svc"),
            Dialect::Generic,
            0,
            0,
        );
        r.model = model.into();
        r.e2e = e2e;
        r.outcome = outcome;
        r
    }

    #[test]
    fn minutes_from_tapped_kpi_slots_equal_minutes_from_every_record() {
        use crate::store::HistoryFilter;
        use infertrace_analysis::kpi::KpiWindows;
        let kpi = KpiConfig::default();
        let open = |dir: &std::path::Path| {
            let store = Store::open(dir, StoreOptions::default()).unwrap();
            let writer = store.start_writer(InternalEvents::default()).unwrap();
            let feed = store.feed(writer.clone(), &kpi);
            (store, writer, feed)
        };
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (store_a, writer_a, mut every) = open(dir_a.path());
        let (store_b, writer_b, mut tapped) = open(dir_b.path());
        tapped.use_tapped_slots();
        let mut windows = KpiWindows::new(kpi.clone());
        assert!(windows.enable_slot_tap());
        let minute = minute_of(crate::store::unix_nanos_now()) - 5 * MINUTE_NANOS;
        let mut x = 7u64;
        let mut last = minute;
        for k in 0..3_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let model = ["a", "b", "c"][(x >> 60) as usize % 3];
            let outcome = if x.is_multiple_of(17) {
                Outcome::Error
            } else {
                Outcome::Ok
            };
            let mut r = rec(model, (x >> 11) as f64 / (1u64 << 53) as f64 * 5.0, outcome);
            r.ttft = Some(r.e2e / 4.0);
            // Spread over 170 s across three minutes, some late by 3 s (into seconds already
            // rolled up, across minute boundaries too); the pipeline's order on every tick:
            // completed seconds first, then the feed's tick, then the records.
            let now = minute + 5_000_000_000 + k * 170 * 1_000_000_000 / 3_000;
            let at = if x.is_multiple_of(29) {
                now.saturating_sub(3_000_000_000).max(minute)
            } else {
                now
            };
            let through = windows.roll_due(now);
            tapped.absorb(windows.take_tapped(), through);
            tapped.tick(now);
            every.record(&r, None, at);
            windows.record(&r, at);
            tapped.record(&r, None, at);
            last = now;
        }
        windows.roll_all();
        tapped.absorb(windows.take_tapped(), last);
        every.hand_over(last);
        tapped.hand_over(last);
        writer_a.flush().unwrap();
        writer_b.flush().unwrap();
        let from = minute - MINUTE_NANOS;
        let to = minute + 4 * MINUTE_NANOS;
        for model in ["a", "b", "c"] {
            let filter = HistoryFilter {
                model: Some(model.to_owned()),
                ..HistoryFilter::default()
            };
            for kpi in [
                "requests",
                "error_rate",
                "e2e.p50",
                "e2e.p99",
                "ttft.p90",
                "goodput.ratio",
            ] {
                let step = Duration::from_secs(60);
                let a = store_a.history(kpi, &filter, from, to, step).unwrap();
                let b = store_b.history(kpi, &filter, from, to, step).unwrap();
                let values = |h: &[crate::store::HistoryPoint]| {
                    h.iter().map(|p| p.value).collect::<Vec<_>>()
                };
                assert_eq!(values(&a), values(&b), "{model} {kpi}");
                let minutes_with_data = values(&a).iter().filter(|v| v.is_some()).count();
                assert_eq!(minutes_with_data, 3, "{model} {kpi}: {:?}", values(&a));
            }
        }
        let slow = |store: &Store| {
            let mut e2e: Vec<f64> = store
                .slow_requests(minute, minute + 3 * MINUTE_NANOS, 1000)
                .unwrap()
                .iter()
                .map(|r| r.e2e)
                .collect();
            e2e.sort_by(f64::total_cmp);
            e2e
        };
        assert_eq!(slow(&store_a), slow(&store_b), "same captured requests");
    }

    #[test]
    fn tapped_captures_of_overflowed_records_are_filed_under_the_overflow_series() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let writer = store.start_writer(InternalEvents::default()).unwrap();
        let mut feed = store.feed(writer.clone(), &KpiConfig::default());
        feed.use_tapped_slots();
        let minute = minute_of(crate::store::unix_nanos_now()) - 5 * MINUTE_NANOS;
        feed.record_in(&rec("kept", 1.0, Outcome::Error), None, minute + 1, false);
        feed.record_in(&rec("over", 1.0, Outcome::Error), None, minute + 2, true);
        feed.hand_over(minute + 3);
        writer.flush().unwrap();
        let mut models: Vec<String> = store
            .slow_requests(minute, minute + MINUTE_NANOS, 10)
            .unwrap()
            .into_iter()
            .map(|r| r.model)
            .collect();
        models.sort();
        assert_eq!(models, [OVERFLOW_LABEL, "kept"]);
    }

    #[test]
    fn keeps_the_slowest_bounded_and_caps_series_and_failures() {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            slow_per_minute: 3,
            failed_per_minute: 2,
            ..StoreOptions::default()
        };
        let store = Store::open(dir.path(), options).unwrap();
        let writer = store.start_writer(InternalEvents::default()).unwrap();
        let kpi = KpiConfig {
            max_series: 2,
            ..KpiConfig::default()
        };
        let mut feed = store.feed(writer.clone(), &kpi);
        let minute = minute_of(crate::store::unix_nanos_now()) - 5 * MINUTE_NANOS;
        // Ever slower requests within one minute: each one enters the top 3, yet the buffer
        // of captured requests stays bounded.
        for k in 0..500u64 {
            let model = ["a", "b", "c"][(k % 3) as usize];
            feed.record(&rec(model, k as f64, Outcome::Ok), None, minute + k);
            assert!(feed.captured.len() <= 2 * 3 + 1, "{}", feed.captured.len());
        }
        for k in 0..5u64 {
            feed.record(&rec("a", 0.1, Outcome::Error), None, minute + 600 + k);
        }
        feed.hand_over(minute + 1000);
        writer.flush().unwrap();
        let kept = store
            .slow_requests(minute, minute + MINUTE_NANOS, 100)
            .unwrap();
        let slow: Vec<f64> = kept
            .iter()
            .filter(|r| r.reason == "slow")
            .map(|r| r.e2e)
            .collect();
        assert_eq!(slow, [499.0, 498.0, 497.0]);
        assert_eq!(kept.iter().filter(|r| r.reason == "failed").count(), 2);
        let rollups = store.rollups(minute, minute + MINUTE_NANOS).unwrap();
        let models: Vec<&str> = rollups.iter().map(|r| &*r.key.model).collect();
        assert_eq!(models, ["__overflow__", "a", "b"]);
        let total: u64 = rollups.iter().map(|r| r.accumulator.counts.requests).sum();
        assert_eq!(total, 505);
    }

    #[test]
    fn the_feed_and_the_writer_count_what_they_hold_and_the_writer_is_capped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let events = InternalEvents::default();
        let writer = store.start_writer(events.clone()).unwrap();
        let mut feed = store.feed(writer.clone(), &KpiConfig::default());
        let minute = minute_of(crate::store::unix_nanos_now()) - 5 * MINUTE_NANOS;
        let empty = feed.approx_memory_bytes();
        for k in 0..300u64 {
            let model = format!("m{}", k % 30);
            feed.record(
                &rec(&model, k as f64 / 100.0, Outcome::Ok),
                None,
                minute + k,
            );
        }
        let collected = feed.approx_memory_bytes();
        assert!(
            collected > empty + 30 * 1024,
            "30 series' minute: {collected} B"
        );
        // Handed over: the accumulators move to the writer (queued, or received by its thread:
        // counted either way until written).
        feed.hand_over(minute + 400);
        let handed = writer.memory_bytes();
        assert!(feed.approx_memory_bytes() < collected);
        assert!(
            feed.approx_memory_bytes() + handed >= collected && handed > 30 * 1024,
            "feed {} B, writer {handed} B of {collected} B",
            feed.approx_memory_bytes()
        );
        // An item that would take the queue past its cap is dropped and counted, not queued
        // (the cap bounds the queue: the first minute, received, does not count against it).
        writer.set_memory_cap(handed / 2);
        for k in 0..300u64 {
            let model = format!("m{}", k % 30);
            feed.record(&rec(&model, 1.0, Outcome::Ok), None, minute + 500 + k);
        }
        feed.hand_over(minute + 900);
        let dropped = |reason| {
            events
                .store_dropped
                .get_or_create(&crate::internal_events::DropLabels { reason })
                .get()
        };
        assert_eq!(dropped("memory_cap"), 30, "30 series' rollups dropped");
        assert_eq!(writer.memory_bytes(), handed);
        // Written: the writer keeps the merged minute only.
        writer.flush().unwrap();
        let kept = writer.memory_bytes();
        assert!(kept > 0 && kept <= handed, "{kept} B after the flush");
        let rollups = store.rollups(minute, minute + MINUTE_NANOS).unwrap();
        let total: u64 = rollups.iter().map(|r| r.accumulator.counts.requests).sum();
        assert_eq!(
            total, 300,
            "the first hand-over written, the capped one not"
        );
    }
}
