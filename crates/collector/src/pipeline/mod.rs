//! [`Pipeline`]: takes decoded batches from the receivers, assembles traces and analyses each
//! completed one.
//!
//! **Ingest** (receiver threads): reserve memory for the batch's spans from the
//! [`MemoryLimiter`] (refusing with [`IngestError::Overloaded`] when it does not fit; when
//! forwarding is on, a place in the forward queue is reserved first and a batch the forwarder
//! cannot take is refused with [`IngestError::ForwardBackpressure`]), then **analyse on
//! arrival** every trace whose spans are all in this batch (`arrival`). Under the assembler's
//! lock each such trace that is new is inserted as a prepared `HeldSpans` (its analysis and
//! the source of its spans, see `held`) and its decoded spans are dropped; the
//! reservation is resized to what the batch will hold before anything is inserted or forwarded
//! (when the analyses do not fit but the spans do, the batch is held as spans). The other spans
//! are pushed into the `TraceAssembler` as spans. A mutex rather than a channel to the
//! assembler answers "overloaded" synchronously with the real state and needs no second queue
//! bound; the lock is held for table work (see `cargo bench -p infertrace-collector --bench
//! pipeline`) and, rarely, to decode a prepared trace's spans again when more of it arrives.
//!
//! **Tick** (one task, every `assembly.tick`): poll the assembler in rounds of at most
//! [`POLL_ROUND`] traces, then, outside its lock, for each completed trace: its request records
//! and critical paths (a prepared trace's are ready; any other trace is analysed now, from all
//! its spans) → [`KpiWindows`], [`CriticalPathWindows`], Prometheus histograms and counters
//! ([`PromRecorder`]), and the bounded ring of recent traces behind `/api/traces/{id}`
//! ([`RecentTraces`]; a prepared trace kept there has its spans decoded again). Late spans are
//! merged into that ring only (see `assembler`). Analysing at arrival rather than at
//! completion is the same function of the same spans: a test checks that the KPIs, critical
//! paths, metrics and stored traces are the same either way.
//!
//! **History** (when the embedded store is on, [`Pipeline::attach_store`]): every one-second
//! slot the KPI windows complete is merged, under the same lock, into the [`StoreFeed`]'s
//! minute (the windows' slot tap; with window settings whose finest slots do not tile a minute,
//! every request is added to the feed instead), and the slowest and failed requests are
//! captured; the feed hands each minute to the store's writer thread (nothing is written on
//! the ingest path). Every tick lets the feed hand over, even a tick without traffic, so
//! minutes reach the store while idle; with each hand-over go the critical-path windows' slots
//! that changed. After a restart both windows are refilled from the store.
//!
//! **Grace period**: the late spans merged into stored traces say how long the assembler
//! should have waited; it waits that long from then on, within `assembly.grace` …
//! `assembly.max_grace` (`pipeline/grace.rs`).
//!
//! **Shutdown**: [`Pipeline::begin_shutdown`] refuses new batches
//! ([`IngestError::ShuttingDown`]); [`Pipeline::flush`] closes every trace in flight, whatever
//! its grace, and records it into the KPIs; [`Pipeline::hand_over_store`] then hands what the
//! feed holds to the writer.

mod arrival;
mod grace;
mod recent;
mod relief;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use infertrace_analysis::critical_path::{
    CriticalPath, CriticalPathOptions, CriticalPathSummary, CriticalPathWindows, windows_paths,
};
use infertrace_analysis::diagnosis::{
    DiagnosisConfig, Finding, WindowDiagnosis, diagnose_snapshot, diagnose_window,
};
use infertrace_analysis::dialect;
use infertrace_analysis::kpi::{KpiSnapshot, KpiWindows};
use infertrace_analysis::record::{Outcome, RequestRecord};
use infertrace_analysis::trace::{Span, SpanId, TraceId};

use self::relief::AssembledBytes;
use crate::assembler::{CompletedTrace, Ready, TraceAssembler};
use crate::config::CollectorConfig;
use crate::forward::ForwardHandle;
use crate::held::{Analysed, HeldSpans, compact_copy, hold_the_body, holds_a_body};
use crate::ingest::{Ingest, IngestBatch, IngestError};
use crate::internal_events::InternalEvents;
use crate::limiter::{FixedMemory, MemoryLimiter, MemoryReservation, span_footprint};
use crate::prom_export::{PromMetrics, PromRecorder};
use crate::resident::ResidentWatch;
use crate::store::{Store, StoreError, StoreFeed, StoreWriter};
use arrival::prepare_runs;
use grace::GraceLearner;

pub use recent::{RecentTraces, StoredRequest, StoredTrace};

/// Grows or shrinks `reservation`, now of `current` bytes, to `wanted`; `false` (unchanged)
/// when growing does not fit the limit.
fn resize(reservation: &mut MemoryReservation, current: usize, wanted: usize) -> bool {
    if wanted > current {
        return reservation.try_grow(wanted - current);
    }
    reservation.shrink(current - wanted);
    true
}

/// Traces closed and analysed per round of a tick.
pub const POLL_ROUND: usize = 4096;

/// `Retry-After` suggested when the memory limiter refuses a batch.
const RETRY_AFTER_SECS: u32 = 1;

/// The spans of the requests a stored trace recorded (none without one).
fn counted_requests(stored: Option<&StoredTrace>) -> Vec<SpanId> {
    stored.map_or_else(Vec::new, |t| {
        t.requests.iter().map(|r| r.record.span_id).collect()
    })
}

/// The requests of a re-opened trace's new part (`spans`) not counted with its earlier part:
/// spans the earlier part holds already (an export sent again), or `spans` holds twice, are
/// dropped from `spans`; both
/// parts are analysed together (a late part of a counted request joins it; a span standing for
/// a request counted under another span — a framework's span beside an engine's — does not
/// count again), keeping the records whose request span is new and was not counted. Without
/// the earlier part (no longer in the recent-trace ring): the new part alone when the earlier
/// part had no request (nothing of it was counted), else nothing — rather a request missed
/// than one counted twice — and the requests missed are counted in `events`
/// (`infertrace_reopened_requests_not_counted_total`).
fn analyse_reopened(
    stored: Option<&StoredTrace>,
    spans: &mut Vec<Span>,
    had_request: bool,
    opts: &CriticalPathOptions,
    events: &InternalEvents,
) -> Analysed {
    let Some(stored) = stored else {
        if had_request {
            // Which of these the earlier part counted cannot be told: none is counted, and
            // every one is said.
            let uncounted = Analysed::of(spans, opts).records.len();
            events.reopened_requests_not_counted(uncounted as u64);
            return Analysed::default();
        }
        return Analysed::of(spans, opts);
    };
    // Each span once: not one the earlier part holds, nor one the new part holds twice.
    let mut known: std::collections::HashSet<SpanId> =
        stored.spans.iter().map(|t| t.span_id).collect();
    spans.retain(|s| known.insert(s.span_id));
    let mut all = stored.spans.clone();
    all.extend_from_slice(spans);
    let together = Analysed::of(&all, opts);
    let counted = |id: &SpanId| stored.requests.iter().any(|r| r.record.span_id == *id);
    // A counted request whose span no longer stands for one was taken into a new one: of its
    // service where there is one (an engine's span beside the framework span counted before),
    // else the first.
    let taken_in: Vec<&str> = stored
        .requests
        .iter()
        .filter(|r| {
            !together
                .records
                .iter()
                .any(|t| t.span_id == r.record.span_id)
        })
        .map(|r| r.record.service.as_str())
        .collect();
    let mut fresh: Vec<(RequestRecord, Option<CriticalPath>)> = together
        .records
        .into_iter()
        .zip(together.paths)
        .filter(|(record, _)| {
            spans.iter().any(|s| s.span_id == record.span_id) && !counted(&record.span_id)
        })
        .collect();
    let mut unmatched = 0;
    for service in taken_in {
        match fresh
            .iter()
            .position(|(r, _)| r.service.as_str() == service)
        {
            Some(i) => {
                fresh.remove(i);
            }
            None => unmatched += 1,
        }
    }
    let mut out = Analysed::default();
    for (record, path) in fresh.into_iter().skip(unmatched) {
        out.records.push(record);
        out.paths.push(path);
    }
    out
}

/// What [`Pipeline::attach_store`] refilled from the history store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Series-minutes absorbed into the KPI windows.
    pub kpi_minutes: usize,
    /// Slots absorbed into the critical-path windows.
    pub critical_path_slots: usize,
}

/// What one tick (or flush) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickStats {
    /// Traces completed and analysed.
    pub traces: usize,
    /// Request records added to the KPIs.
    pub requests: usize,
    /// Late spans merged into stored traces.
    pub late_merged: usize,
    /// The grace period learned from late spans, when it changed.
    pub grace_changed: Option<Duration>,
}

/// Where [`Pipeline::record_request`] put a request.
enum Recorded {
    /// In its own series.
    InItsSeries,
    /// In the overflow series (the series cap was reached).
    InOverflow,
    /// Nowhere: its record is implausible (counted).
    Implausible,
}

struct Analysis {
    kpis: KpiWindows,
    critical: CriticalPathWindows,
    prom: PromRecorder,
    recent: RecentTraces,
    /// The history store's feed, when the store is on.
    store: Option<StoreFeed>,
    /// The aggregates' memory — KPI series, critical-path windows, Prometheus label sets — as
    /// last measured ([`AGGREGATES_MEASURE_INTERVAL`]), held in the limiter as fixed memory
    /// (relief cannot free it; the thresholds apply to the room above it).
    aggregates_memory: FixedMemory,
    /// The recent-trace ring's memory ([`RecentTraces::approx_memory_bytes`]), held in the
    /// limiter and updated at every tick.
    ring_memory: MemoryReservation,
    /// When the aggregates were last measured (`None`: never).
    aggregates_measured_at: Option<Instant>,
    /// The grace period, learned from the late spans merged into `recent`.
    grace: GraceLearner,
    /// The memory limiter's refusals as of the last tick (learning pauses when they grow).
    refusals_seen: u64,
}

/// How often the aggregates' memory is measured — the KPI series, the critical-path windows,
/// the Prometheus label sets and the history store's feed and writer, each walked under the
/// analysis lock (the KPI series' slots are the longest walk; `benches/aggregates_memory.rs`
/// times each at the default bounds) — and held in the memory limiter as fixed memory, so that
/// requests are refused when the aggregates and the data together reach
/// `limits.memory_limit_bytes`. The aggregates themselves are never refused for it: they are
/// bounded by their caps (`limits.max_series`, the windows, the critical-path keys, the workers
/// a series, [`HISTORY_WRITER_SHARE`]).
pub const AGGREGATES_MEASURE_INTERVAL: Duration = Duration::from_secs(1);

/// The history store's writer queue may hold at most this fraction (1/n) of
/// `limits.memory_limit_bytes` in items waiting for the writer: a stalled disk then drops
/// history items (counted as `store_dropped_total{reason="memory_cap"}`), not new data.
pub const HISTORY_WRITER_SHARE: usize = 8;

/// Holds the recent-trace ring's memory in the limiter, and measures the aggregates' memory
/// into it when [`AGGREGATES_MEASURE_INTERVAL`] has passed since the last measurement (or there
/// was none); returns what the limiter holds for both. Under memory relief
/// ([`MemoryLimiter::relief_excess`]) the ring gives way first: it is a convenience for
/// `/api/traces/{id}`, new data is not.
fn account_analysis_memory(a: &mut Analysis, limiter: &MemoryLimiter, now: Instant) -> usize {
    let excess = limiter.relief_excess();
    if excess > 0 {
        let ring = a.recent.approx_memory_bytes();
        a.recent.shrink_to(ring.saturating_sub(excess));
    }
    a.ring_memory.set_unchecked(a.recent.approx_memory_bytes());
    let due = a
        .aggregates_measured_at
        .is_none_or(|at| now.saturating_duration_since(at) >= AGGREGATES_MEASURE_INTERVAL);
    if due {
        a.aggregates_measured_at = Some(now);
        let history = a.store.as_ref().map_or(0, |feed| {
            feed.approx_memory_bytes() + feed.writer().memory_bytes()
        });
        let bytes = a.kpis.approx_memory_bytes()
            + a.critical.approx_memory_bytes()
            + a.prom.approx_memory_bytes()
            + history;
        a.aggregates_memory.set(bytes);
    }
    a.aggregates_memory.bytes() + a.ring_memory.bytes()
}

/// The pipeline: an [`Ingest`] for the receivers and the source of every KPI the API serves.
pub struct Pipeline {
    assembler: Mutex<TraceAssembler>,
    analysis: Mutex<Analysis>,
    limiter: MemoryLimiter,
    events: InternalEvents,
    forward: Option<ForwardHandle>,
    shutting_down: AtomicBool,
    /// The stop signal came: draining (see [`Pipeline::begin_stopping`]).
    stopping: AtomicBool,
    cp_options: CriticalPathOptions,
    diagnosis: DiagnosisConfig,
    windows: Vec<Duration>,
    requests_recorded: AtomicU64,
    /// The aggregates' and the recent-trace ring's bytes held in the limiter, as last measured
    /// (read by ingest without the analysis lock).
    analysis_bytes: AtomicUsize,
    /// The assembler's tables' bytes held in the limiter, as last published.
    table_bytes: AtomicUsize,
    /// The reservations the assembler's traces hold (what memory relief can free).
    assembled: AssembledBytes,
    /// The process's resident memory against the limit's bound, when watched
    /// ([`watch_resident_memory`](Self::watch_resident_memory)).
    resident: Mutex<Option<ResidentWatch>>,
    /// Wakes the tick early: traces were closed for memory relief.
    tick_wanted: tokio::sync::Notify,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("windows", &self.windows)
            .field("requests_recorded", &self.requests_recorded)
            .finish_non_exhaustive()
    }
}

/// Locks a mutex, recovering from poisoning (a panic elsewhere must not stop the collector).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Now as Unix nanoseconds (the store's clock, re-exported where the pipeline's users look).
pub use crate::store::unix_nanos_now;

impl Pipeline {
    /// A pipeline for `config`, recording Prometheus metrics into `metrics`, self-metrics into
    /// `events`, reserving memory from `limiter`, forwarding through `forward` when set.
    ///
    /// The pipeline is the only writer of `metrics`' request families (they are single-writer
    /// values, see `prom_single_writer`): give each pipeline its own [`PromMetrics`].
    pub fn new(
        config: &CollectorConfig,
        events: InternalEvents,
        metrics: PromMetrics,
        limiter: MemoryLimiter,
        forward: Option<ForwardHandle>,
    ) -> Self {
        let mut assembler = TraceAssembler::new(
            config.assembler_config(),
            events.clone(),
            dialect::completes_trace,
            dialect::may_be_own_request,
        );
        assembler.hold_tables_in(limiter.fixed_memory());
        let prom = PromRecorder::new(
            metrics,
            config.kpi_dimensions(),
            config.slo(),
            config.limits.max_series,
        );
        // Rates in windows longer than the uptime divide by the uptime, counted from now.
        let mut kpis = KpiWindows::new(config.kpi_config());
        kpis.set_start(unix_nanos_now());
        let analysis = Analysis {
            kpis,
            critical: CriticalPathWindows::new(config.critical_path_windows_config()),
            prom,
            recent: RecentTraces::new(config.api.recent_traces, config.api.recent_trace_spans),
            store: None,
            aggregates_memory: limiter.fixed_memory(),
            ring_memory: limiter.empty_reservation(),
            aggregates_measured_at: None,
            grace: GraceLearner::new(config.assembly.grace, config.assembly.max_grace),
            refusals_seen: 0,
        };
        events
            .memory_limit
            .set(i64::try_from(limiter.limit()).unwrap_or(i64::MAX));
        events
            .assembly_grace
            .set(config.assembly.grace.as_secs_f64());
        Self {
            assembler: Mutex::new(assembler),
            analysis: Mutex::new(analysis),
            limiter,
            events,
            forward,
            shutting_down: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            cp_options: config.critical_path_options(),
            diagnosis: config.diagnosis_config(),
            windows: config.kpi.windows.clone(),
            requests_recorded: AtomicU64::new(0),
            analysis_bytes: AtomicUsize::new(0),
            assembled: AssembledBytes::default(),
            table_bytes: AtomicUsize::new(0),
            resident: Mutex::new(None),
            tick_wanted: tokio::sync::Notify::new(),
        }
    }

    /// From now on, at every tick, reads the process's resident memory (as `read` reports it:
    /// [`crate::resident::resident_bytes`]) and has the allocator return the memory it keeps
    /// while it is near the limit's bound (`limits.watch_resident_memory`; see
    /// [`crate::resident`]).
    pub fn watch_resident_memory(&self, read: fn() -> Option<usize>) {
        *lock(&self.resident) = Some(ResidentWatch::new(self.limiter.limit(), read));
    }

    /// Connects the history store: first refills the KPI windows from the minutes `store`
    /// holds for the longest configured window before now (moving the windows' start back so
    /// rates over them stay right across a restart: to when the store's data begins,
    /// [`DataBounds::since`](crate::store::DataBounds), which a fresh store keeps from now)
    /// and the critical-path windows from its slots, then feeds every later request to
    /// `feed`. Call once, before the pipeline receives traffic. Returns what was
    /// restored.
    pub fn attach_store(&self, store: &Store, feed: StoreFeed) -> Result<Restored, StoreError> {
        let longest = self.windows.iter().copied().max().unwrap_or(Duration::ZERO);
        let now = unix_nanos_now();
        let mut a = lock(&self.analysis);
        let restored = Restored {
            kpi_minutes: store.restore_kpis(&mut a.kpis, now, longest)?,
            critical_path_slots: store.restore_critical_paths(&mut a.critical, now)?,
        };
        // A fresh store keeps now as when its data began; every store, that this run began.
        if store.data_bounds()?.since.is_none() {
            feed.writer().write_data_since(now);
        }
        feed.writer().write_run_start(now);
        let mut feed = feed;
        feed.writer()
            .set_memory_cap(self.limiter.limit() / HISTORY_WRITER_SHARE);
        // Minutes from the windows' completed seconds rather than a second sketch per record.
        if a.kpis.enable_slot_tap() {
            feed.use_tapped_slots();
        }
        a.store = Some(feed);
        Ok(restored)
    }

    /// The history store's writer, when a store is attached (for findings and alerts).
    pub fn store_writer(&self) -> Option<StoreWriter> {
        lock(&self.analysis)
            .store
            .as_ref()
            .map(|f| f.writer().clone())
    }

    /// Hands everything the store feed holds to the writer at `now_unix_nano` (shutdown, after
    /// [`flush`](Self::flush)); returns the writer to flush, `None` without a store.
    pub fn hand_over_store(&self, now_unix_nano: u64) -> Option<StoreWriter> {
        let mut guard = lock(&self.analysis);
        let a = &mut *guard;
        let feed = a.store.as_mut()?;
        a.kpis.roll_all();
        feed.absorb(a.kpis.take_tapped(), now_unix_nano);
        feed.hand_over(now_unix_nano);
        feed.hand_over_critical_paths(&mut a.critical, now_unix_nano);
        Some(feed.writer().clone())
    }

    /// The configured KPI windows.
    pub fn windows(&self) -> &[Duration] {
        &self.windows
    }

    /// The self-metrics.
    pub fn events(&self) -> &InternalEvents {
        &self.events
    }

    /// The memory limiter.
    pub fn limiter(&self) -> &MemoryLimiter {
        &self.limiter
    }

    /// What the limiter holds for everything but the aggregates, the recent-trace ring and the
    /// assembler's tables (requests being read, spans and traces buffered, the forward queue):
    /// [`MemoryLimiter::used`] less [`aggregates_memory_bytes`](Self::aggregates_memory_bytes),
    /// [`ring_memory_bytes`](Self::ring_memory_bytes) and
    /// [`table_memory_bytes`](Self::table_memory_bytes).
    pub fn data_memory_bytes(&self) -> usize {
        let a = lock(&self.analysis);
        self.limiter.used().saturating_sub(
            a.aggregates_memory.bytes() + a.ring_memory.bytes() + self.table_memory_bytes(),
        )
    }

    /// The assembler's own tables (its map and queues, spare span slots, the trace index) as
    /// last measured and held in the limiter (part of [`MemoryLimiter::used`]).
    pub fn table_memory_bytes(&self) -> usize {
        self.table_bytes.load(Ordering::Relaxed)
    }

    /// Measures the assembler's tables, holds them in the limiter and publishes the bytes for
    /// [`table_memory_bytes`](Self::table_memory_bytes): after each batch, poll, early close
    /// and flush, so that what they grow is held before the next batch is admitted and what
    /// closing traces frees is given back at once.
    fn publish_tables(&self, assembler: &mut TraceAssembler) {
        self.table_bytes
            .store(assembler.hold_tables(), Ordering::Relaxed);
    }

    /// The recent-trace ring's memory as held in the limiter at the last tick (part of
    /// [`MemoryLimiter::used`]).
    pub fn ring_memory_bytes(&self) -> usize {
        lock(&self.analysis).ring_memory.bytes()
    }

    /// The aggregates' memory (KPI series, critical-path windows, Prometheus label sets, the
    /// history store's feed and writer) as last measured and held in the limiter (part of [`MemoryLimiter::used`]; see
    /// [`AGGREGATES_MEASURE_INTERVAL`]).
    pub fn aggregates_memory_bytes(&self) -> usize {
        lock(&self.analysis).aggregates_memory.bytes()
    }

    /// The aggregates' memory now, by part: KPI series, critical-path windows, Prometheus.
    #[cfg(test)]
    fn aggregates_memory_parts(&self) -> (usize, usize, usize) {
        let a = lock(&self.analysis);
        (
            a.kpis.approx_memory_bytes(),
            a.critical.approx_memory_bytes(),
            a.prom.approx_memory_bytes(),
        )
    }

    /// Request records added to the KPIs since start.
    pub fn requests_recorded(&self) -> u64 {
        self.requests_recorded.load(Ordering::Relaxed)
    }

    /// Traces being assembled.
    pub fn traces_in_flight(&self) -> usize {
        lock(&self.assembler).traces_in_flight()
    }

    /// Adds a batch received at `now` (the [`Ingest`] implementation uses the current time).
    /// Returns how many of its spans a bound kept out (`max_spans_per_trace`, a full table of
    /// traces or of late spans), which the receiver reports rejected.
    pub fn ingest_at(&self, mut batch: IngestBatch, now: Instant) -> Result<u64, IngestError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(IngestError::ShuttingDown);
        }
        // A place in the forward queue (and memory for the body) first: a request the
        // forwarder cannot take is refused, never accepted and then dropped.
        let forward = match &self.forward {
            Some(f) => Some(f.reserve(&mut batch)?),
            None => None,
        };
        let bytes = batch.spans.iter().map(span_footprint).sum::<usize>() + batch.text_bytes;
        let Some(mut reservation) = self.limiter.try_reserve(bytes) else {
            self.relieve_memory(&mut lock(&self.assembler), now);
            return Err(IngestError::Overloaded {
                retry_after_secs: RETRY_AFTER_SECS,
            });
        };
        // Traces whose spans all came in this batch are analysed now, while in cache.
        let (mut runs, source_bytes) = prepare_runs(&mut batch, &self.cp_options);
        let mut assembler = lock(&self.assembler);
        self.relieve_memory(&mut assembler, now);
        assembler.warm_index(runs.iter().map(|r| &r.trace_id));
        // Spans of a trace held as prepared turn it back into spans: reserve those too. (The
        // runs' own traces are looked up with `would_take` below.)
        let mut taken_back = 0;
        if assembler.prepared_in_flight() > 0 {
            let spans = &batch.spans;
            let mut run_starts = runs.iter().map(|r| r.start).peekable();
            for (i, s) in spans.iter().enumerate() {
                if i > 0 && spans[i - 1].trace_id == s.trace_id {
                    continue;
                }
                if run_starts.next_if_eq(&i).is_none() {
                    taken_back += assembler.prepared_span_bytes(&s.trace_id);
                }
            }
        }
        // What the batch holds when its new traces are prepared: their analyses instead of
        // their spans, and the source of those spans (decoded again if needed): the body, or a
        // compact copy of the spans.
        let mut with_prepared = bytes + taken_back;
        let (mut taken_runs, mut taken_spans) = (0, 0);
        for run in &runs {
            if assembler.would_take(&run.trace_id, run.len) {
                taken_runs += 1;
                taken_spans += run.len;
                with_prepared =
                    with_prepared - run.prepared.span_bytes() + run.prepared.footprint();
            } else {
                // Pushed as spans: to a prepared trace, perhaps, which takes its spans back.
                let back = assembler.prepared_span_bytes(&run.trace_id);
                taken_back += back;
                with_prepared += back;
            }
        }
        // A body is held for the traces the assembler takes: when it turns most of them down
        // (already in flight, or at its bound), the few it takes get a compact copy of their
        // spans instead of holding the whole body (rare: under the lock).
        let mut source_bytes = source_bytes;
        if taken_runs > 0 && holds_a_body(&runs) && !hold_the_body(source_bytes, taken_spans) {
            match compact_copy(&batch.spans, &mut runs) {
                Some(len) => source_bytes = len,
                None => taken_runs = 0,
            }
        }
        with_prepared += source_bytes;
        let prepared = taken_runs > 0 && resize(&mut reservation, bytes, with_prepared);
        if !prepared {
            // Held as spans (when the analyses do not fit, the spans may still).
            runs.clear();
            if !resize(&mut reservation, bytes, bytes + taken_back) {
                self.relieve_memory(&mut assembler, now);
                return Err(IngestError::Overloaded {
                    retry_after_secs: RETRY_AFTER_SECS,
                });
            }
        }
        let hold = self.assembled.hold(reservation);
        let mut taken = vec![false; batch.spans.len()];
        if prepared {
            assembler.insert_prepared(runs, &mut taken, &hold, now);
            self.publish_tables(&mut assembler);
        }
        drop(assembler);
        let mut spans = batch.spans;
        if prepared {
            // The spans of the traces taken as prepared are dropped here, outside the lock, in
            // place; the others are pushed as spans.
            let mut i = 0;
            spans.retain(|_| {
                i += 1;
                !taken[i - 1]
            });
        }
        let kept_out = if spans.is_empty() {
            Vec::new()
        } else {
            let mut assembler = lock(&self.assembler);
            let kept_out = assembler.push(spans, Some(hold), now);
            self.publish_tables(&mut assembler);
            kept_out
        };
        if let Some(mut permit) = forward {
            if !kept_out.is_empty() {
                // Back to places in the batch as decoded, where `span_ranges` are.
                let places = if prepared {
                    places_among_not_taken(&taken, &kept_out)
                } else {
                    kept_out.clone()
                };
                permit.leave_out(&places, &batch.span_ranges);
            }
            permit.send();
        }
        Ok(kept_out.len() as u64)
    }

    /// Under memory relief ([`MemoryLimiter::relief_excess`]), closes early the oldest traces
    /// in flight in proportion to the memory to free and wakes the tick, which releases them:
    /// buffered traces give way to new data before any request is refused. What they hold is
    /// counted exactly ([`relief`]); above [`relief::ASSEMBLER_KEEPS_PERCENT`] of the room
    /// only, so that requests in transit filling the memory are refused instead.
    fn relieve_memory(&self, assembler: &mut TraceAssembler, now: Instant) {
        let excess = self.limiter.relief_excess();
        if excess == 0 {
            return;
        }
        let keeps = self
            .limiter
            .percent_of_room(relief::ASSEMBLER_KEEPS_PERCENT);
        let traces = assembler.traces_in_flight();
        let n = relief::traces_to_close(traces, excess, self.assembled.get(), keeps);
        let closed = assembler.close_oldest_for_memory(n, now);
        self.publish_tables(assembler);
        if closed > 0 {
            self.tick_wanted.notify_one();
        }
    }

    /// Resolves when ingest wants a tick before the next one is due (traces were closed early
    /// for memory: the tick releases their memory).
    pub async fn tick_wanted(&self) {
        self.tick_wanted.notified().await;
    }

    /// Closes the traces due now and analyses them.
    pub fn tick(&self) -> TickStats {
        self.tick_at(Instant::now(), unix_nanos_now())
    }

    /// Closes the traces due at `now` and analyses them as of `now_unix_nano`.
    pub fn tick_at(&self, now: Instant, now_unix_nano: u64) -> TickStats {
        // The assembler's tables first, so that this tick's memory figures include them.
        {
            let mut assembler = lock(&self.assembler);
            assembler.shrink_tables_when_due(now);
            self.publish_tables(&mut assembler);
        }
        if let Some((resident, returning, started)) =
            lock(&self.resident).as_mut().and_then(ResidentWatch::check)
        {
            self.events
                .resident_memory_read(resident, returning, started);
        }
        // In rounds of at most `POLL_ROUND` traces (see `TraceAssembler::poll_some`).
        let mut stats = TickStats::default();
        loop {
            let ready = {
                let mut assembler = lock(&self.assembler);
                let ready = assembler.poll_some(now, POLL_ROUND);
                self.publish_tables(&mut assembler);
                ready
            };
            let full = ready.completed.len() >= POLL_ROUND;
            let round = self.analyse(ready, now, now_unix_nano);
            stats.traces += round.traces;
            stats.requests += round.requests;
            stats.late_merged += round.late_merged;
            if let Some(grace) = round.grace_changed {
                lock(&self.assembler).set_grace(grace);
                self.events.assembly_grace.set(grace.as_secs_f64());
                tracing::info!(
                    grace = ?grace,
                    "assembly grace period now {grace:?}: spans of completed traces arrived that \
                     late in the last ten minutes (bounds: assembly.grace, assembly.max_grace)"
                );
                stats.grace_changed = Some(grace);
            }
            if !full {
                self.events.flush_logs();
                return stats;
            }
        }
    }

    /// Marks the collector as stopping: requests being drained are still taken in, but
    /// `/health` answers 503 from now on, so that load balancers send new work elsewhere.
    pub fn begin_stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// Refuses every later batch with [`IngestError::ShuttingDown`] (after the drain).
    pub fn begin_shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        self.shutting_down.store(true, Ordering::Release);
    }

    /// Whether [`begin_stopping`](Self::begin_stopping) or
    /// [`begin_shutdown`](Self::begin_shutdown) was called.
    pub fn is_shutting_down(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Closes every trace in flight, whatever its grace, and records it (shutdown).
    pub fn flush(&self) -> TickStats {
        let now = Instant::now();
        let ready = {
            let mut assembler = lock(&self.assembler);
            let ready = assembler.flush(now);
            self.publish_tables(&mut assembler);
            ready
        };
        self.analyse(ready, now, unix_nanos_now())
    }

    /// Holds the analysis' memory in the limiter ([`account_analysis_memory`]), publishes it to
    /// ingest, and reports it ([`InternalEvents::memory_held`]).
    fn hold_analysis_memory(&self, a: &mut Analysis, now: Instant) {
        let held = account_analysis_memory(a, &self.limiter, now);
        self.analysis_bytes.store(held, Ordering::Relaxed);
        let tables = self.table_memory_bytes();
        self.events.memory_held(
            self.limiter.used().saturating_sub(held + tables),
            a.aggregates_memory.bytes(),
            a.ring_memory.bytes(),
            tables,
            self.limiter.limit(),
        );
    }

    /// Feeds one request's record and critical path to everything that aggregates them: the
    /// KPI windows, the Prometheus exporter, the critical-path windows (along `windows_path`,
    /// see [`windows_paths`]; nothing when `None`) and the store's feed. The windows decide
    /// which series and keys stay under their caps; the exporter follows.
    fn record_request(
        &self,
        a: &mut Analysis,
        record: &RequestRecord,
        path: Option<&CriticalPath>,
        windows_path: Option<&CriticalPath>,
        now_unix_nano: u64,
    ) -> Recorded {
        if let Some(reason) = record.implausible() {
            self.events.implausible_request(reason);
            return Recorded::Implausible;
        }
        let reclaimed_before = a.kpis.reclaimed_series();
        let kept = a.kpis.record(record, now_unix_nano);
        // Series the windows removed leave the exporter too (same labels, same cap).
        for key in a.kpis.take_removed_series() {
            a.prom.forget(&key);
        }
        self.events
            .series_reclaimed(a.kpis.reclaimed_series() - reclaimed_before);
        // The KPI windows and the exporter apply the same cap to the same labels.
        a.prom.record_in(record, kept);
        // A disaggregated request's time is aggregated along its sub-phases across the
        // services (the span tree gives it all to the router's waiting span), a request whose
        // engine reports its phases as attributes along those phases, a trace once; the span
        // path stays what the waterfall and the store show.
        if let Some(p) = windows_path {
            a.critical.record(p, record.e2e, now_unix_nano);
            // Keys the windows reclaimed leave the exporter too (same cap, same keys).
            let reclaimed = a.critical.take_reclaimed();
            for (service, span) in &reclaimed {
                a.prom.forget_critical_path(service, span);
            }
            self.events.series_reclaimed(reclaimed.len() as u64);
            let Analysis { critical, prom, .. } = a;
            prom.record_critical_path(p, &|service, span| critical.has_key(service, span));
        }
        if let Some(f) = &mut a.store {
            f.record_in(record, path, now_unix_nano, !kept);
        }
        if kept {
            Recorded::InItsSeries
        } else {
            Recorded::InOverflow
        }
    }

    fn analyse(&self, ready: Ready, now: Instant, now_unix_nano: u64) -> TickStats {
        let Ready {
            completed,
            late,
            longest_wait,
        } = ready;
        let mut stats = TickStats {
            traces: completed.len(),
            ..TickStats::default()
        };
        if completed.is_empty() && late.is_empty() {
            // Minutes reach the store without traffic too.
            let mut a = lock(&self.analysis);
            feed_store(&mut a, now_unix_nano);
            expire_idle_series(&mut a, now_unix_nano);
            self.hold_analysis_memory(&mut a, now);
            (_, stats.grace_changed) = self.merge_late_and_learn(&mut a, late, longest_wait, now);
            return stats;
        }
        let mut overflowed = 0u64;
        let mut not_kept = 0u64;
        let mut a = lock(&self.analysis);
        feed_store(&mut a, now_unix_nano);
        for trace in completed {
            let CompletedTrace {
                trace_id,
                mut held,
                holds,
                reopened,
                grace_from,
                ..
            } = trace;
            // Read in place: a prepared trace's analysis is not moved out of its box (its inline
            // record is a few hundred bytes); only a kept trace clones its records.
            let fresh;
            let analysed = match (&mut held, reopened) {
                (HeldSpans::Prepared(p), _) => &p.analysed,
                (HeldSpans::Decoded(spans), Some(had_request)) => {
                    fresh = analyse_reopened(
                        a.recent.get(&trace_id),
                        spans,
                        had_request,
                        &self.cp_options,
                        &self.events,
                    );
                    &fresh
                }
                (HeldSpans::Decoded(spans), None) => {
                    fresh = Analysed::of(spans, &self.cp_options);
                    &fresh
                }
            };
            let Analysed { records, paths } = analysed;
            let failed = records.iter().any(|r| r.outcome != Outcome::Ok);
            let keep = a.recent.admit(now_unix_nano, failed);
            not_kept += u64::from(!keep);
            let counted = match reopened {
                Some(_) => counted_requests(a.recent.get(&trace_id)),
                None => Vec::new(),
            };
            let (recorded, in_overflow) =
                self.record_analysed(&mut a, analysed, &counted, now_unix_nano);
            stats.requests += recorded;
            overflowed += in_overflow;
            // The spans leave the limiter's accounting here; those the ring keeps come back into
            // it with the ring's reservation, set at the end of this tick.
            drop(holds);
            if keep {
                let requests = records
                    .iter()
                    .zip(paths)
                    .map(|(record, critical_path)| StoredRequest {
                        record: record.clone(),
                        critical_path: critical_path.clone(),
                    })
                    .collect();
                a.recent.insert(StoredTrace {
                    trace_id,
                    requests,
                    spans: held.into_spans(),
                    late_spans: 0,
                    grace_from,
                });
            }
        }
        let (late_requests, late_overflowed) =
            self.record_late_requests(&mut a, &late, now_unix_nano);
        stats.requests += late_requests;
        overflowed += late_overflowed;
        (stats.late_merged, stats.grace_changed) =
            self.merge_late_and_learn(&mut a, late, longest_wait, now);
        self.hold_analysis_memory(&mut a, now);
        drop(a);
        if overflowed > 0 {
            self.events.series_overflow.inc_by(overflowed);
        }
        if not_kept > 0 {
            self.events.recent_traces_not_kept.inc_by(not_kept);
        }
        self.requests_recorded
            .fetch_add(stats.requests as u64, Ordering::Relaxed);
        stats
    }

    /// Records every request of `analysed` ([`Self::record_request`]); returns how many were
    /// recorded (the implausible are not) and how many of them went to the overflow series.
    /// `counted`: the spans of this trace's requests recorded before (a late or re-opened
    /// part's trace), whose time the critical-path windows hold already ([`windows_paths`]).
    fn record_analysed(
        &self,
        a: &mut Analysis,
        analysed: &Analysed,
        counted: &[SpanId],
        now_unix_nano: u64,
    ) -> (usize, u64) {
        let (mut recorded, mut overflowed) = (0, 0);
        let windows = windows_paths(&analysed.records, &analysed.paths, counted);
        for ((record, path), windows_path) in
            analysed.records.iter().zip(&analysed.paths).zip(&windows)
        {
            match self.record_request(
                a,
                record,
                path.as_ref(),
                windows_path.as_deref(),
                now_unix_nano,
            ) {
                Recorded::Implausible => {}
                Recorded::InOverflow => {
                    recorded += 1;
                    overflowed += 1;
                }
                Recorded::InItsSeries => recorded += 1,
            }
        }
        (recorded, overflowed)
    }

    /// Records the requests that `late` spans stand for and their stored traces did not count:
    /// a generic server span exported after its trace completed (a gateway's, whose exporter
    /// waits longer than the grace period) is analysed with the stored trace it joins, as a
    /// re-opened trace's new part is ([`analyse_reopened`]), and the stored trace keeps what
    /// it recorded, so that a resend counts nothing. A trace no longer stored counts nothing:
    /// its late spans stay late spans. Returns the requests recorded and those of them that
    /// went to the overflow series.
    fn record_late_requests(
        &self,
        a: &mut Analysis,
        late: &[Span],
        now_unix_nano: u64,
    ) -> (usize, u64) {
        let mut traces: Vec<TraceId> = late
            .iter()
            .filter(|s| dialect::may_be_late_request(s))
            .map(|s| s.trace_id)
            .collect();
        traces.sort_unstable();
        traces.dedup();
        let (mut recorded, mut overflowed) = (0, 0);
        for id in traces {
            let Some(stored) = a.recent.get(&id) else {
                continue;
            };
            let mut part: Vec<Span> = late.iter().filter(|s| s.trace_id == id).cloned().collect();
            let fresh = analyse_reopened(
                Some(stored),
                &mut part,
                true,
                &self.cp_options,
                &self.events,
            );
            let counted = counted_requests(Some(stored));
            let (n, in_overflow) = self.record_analysed(a, &fresh, &counted, now_unix_nano);
            recorded += n;
            overflowed += in_overflow;
            let Analysed { records, paths } = fresh;
            a.recent.add_requests(
                &id,
                records
                    .into_iter()
                    .zip(paths)
                    .map(|(record, critical_path)| StoredRequest {
                        record,
                        critical_path,
                    })
                    .collect(),
            );
        }
        (recorded, overflowed)
    }

    /// Merges `late` spans into their stored traces, and learns the grace period from how
    /// late they came and from `longest_wait` (spans that came in time, after the floor): see
    /// `grace.rs`. Nothing is learned while memory is short (above the soft limit, or a
    /// request refused since the last tick), when spans come late because their senders were
    /// refused and retried, and a longer wait would hold more. Returns the spans merged and
    /// the grace period when it changed.
    fn merge_late_and_learn(
        &self,
        a: &mut Analysis,
        late: Vec<Span>,
        longest_wait: Option<Duration>,
        now: Instant,
    ) -> (usize, Option<Duration>) {
        let refusals = self.limiter.refusals();
        let learning = self.limiter.relief_excess() == 0 && refusals == a.refusals_seen;
        a.refusals_seen = refusals;
        let grace = &mut a.grace;
        let mut past_ceiling: Option<Duration> = None;
        let mut learn = |need: Duration| {
            if learning && grace.observe(now, need) {
                past_ceiling = Some(past_ceiling.map_or(need, |p| p.max(need)));
            }
        };
        let merged = a.recent.merge_late(late, &self.cp_options, now, &mut learn);
        if let Some(wait) = longest_wait {
            learn(wait);
        }
        if let Some(need) = past_ceiling
            && crate::internal_events::warn_allowed("grace_ceiling")
        {
            tracing::warn!(
                late_by = ?need,
                "spans of completed traces arrive up to {need:?} after their request span, \
                 past assembly.max_grace: they are shown in the stored trace but not read into \
                 its request's record; raise assembly.max_grace or shorten the services' \
                 export delay (OTEL_BSP_SCHEDULE_DELAY) (logged at most every 10 s)"
            );
        }
        (merged, a.grace.refresh(now))
    }

    /// The KPIs of `window` now.
    pub fn kpis(&self, window: Duration) -> KpiSnapshot {
        lock(&self.analysis).kpis.snapshot(window, unix_nanos_now())
    }

    /// The aggregated critical path of `window` now.
    pub fn critical_path(&self, window: Duration) -> CriticalPathSummary {
        lock(&self.analysis)
            .critical
            .snapshot(window, unix_nanos_now())
    }

    /// The KPIs and critical path of `window` at one instant (for diagnosis and alerts).
    pub fn window_state(&self, window: Duration) -> (KpiSnapshot, CriticalPathSummary) {
        let now = unix_nanos_now();
        let a = lock(&self.analysis);
        (
            a.kpis.snapshot(window, now),
            a.critical.snapshot(window, now),
        )
    }

    /// The findings of `window` now, per series.
    pub fn findings(&self, window: Duration) -> Vec<Finding> {
        let (kpis, critical) = self.window_state(window);
        diagnose_snapshot(&kpis, Some(&critical), &self.diagnosis)
    }

    /// The diagnosis of `window`: its findings, and the series too quiet in it to judge.
    pub fn diagnosis(&self, window: Duration) -> WindowDiagnosis {
        let (kpis, critical) = self.window_state(window);
        diagnose_window(&kpis, Some(&critical), &self.diagnosis)
    }

    /// Calls `visit` for every recently completed trace still held, oldest first (under the
    /// analysis lock: keep `visit` short).
    pub fn visit_recent_traces(&self, visit: &mut dyn FnMut(&StoredTrace)) {
        for t in lock(&self.analysis).recent.iter() {
            visit(t);
        }
    }

    /// A recently completed trace, if still held.
    pub fn trace(&self, id: &TraceId) -> Option<StoredTrace> {
        lock(&self.analysis).recent.get(id).cloned()
    }
}

/// Expires the KPI series idle past the longest window, and their label sets in the exporter,
/// when a sweep is due. Recording sweeps too; this is for the ticks without traffic, so that a
/// collector that stopped receiving gives the series' memory back.
fn expire_idle_series(a: &mut Analysis, now_unix_nano: u64) {
    if a.kpis.sweep(now_unix_nano) > 0 {
        for key in a.kpis.take_removed_series() {
            a.prom.forget(&key);
        }
    }
}

/// Hands the store feed the KPI seconds completed by `now_unix_nano`, then lets it hand a
/// minute (or a second's progress) to the writer.
fn feed_store(a: &mut Analysis, now_unix_nano: u64) {
    let Some(feed) = &mut a.store else { return };
    let through = a.kpis.roll_due(now_unix_nano);
    feed.absorb(a.kpis.take_tapped(), through);
    if feed.tick(now_unix_nano) {
        feed.hand_over_critical_paths(&mut a.critical, now_unix_nano);
    }
}

impl Ingest for Pipeline {
    fn ingest(&self, batch: IngestBatch) -> Result<u64, IngestError> {
        self.ingest_at(batch, Instant::now())
    }
}

/// The places in the whole batch of `positions` (ascending) among the spans not `taken`.
fn places_among_not_taken(taken: &[bool], positions: &[usize]) -> Vec<usize> {
    let mut positions = positions.iter().copied().peekable();
    taken
        .iter()
        .enumerate()
        .filter(|(_, taken)| !**taken)
        .enumerate()
        .filter_map(|(position, (place, _))| positions.next_if_eq(&position).map(|_| place))
        .collect()
}

#[cfg(test)]
mod tests;
