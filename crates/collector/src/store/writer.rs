//! [`StoreWriter`]: the handle of the store's writer thread.
//!
//! Items go through a bounded queue (a full queue drops the item and counts it); the thread
//! keeps what it received in memory and writes it all in one transaction every
//! `flush_interval`, then enforces retention. Minute rollups arrive as deltas (several per
//! minute); the thread merges them with what is already stored for that minute, keeping the
//! last two minutes' merged accumulators in memory so a flush rarely reads back.

use std::collections::HashMap;
use std::mem::size_of;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use infertrace_analysis::alert::AlertEvent;
use infertrace_analysis::critical_path::CriticalPath;
use infertrace_analysis::diagnosis::Finding;
use infertrace_analysis::kpi::{Accumulator, SeriesKey};
use infertrace_analysis::record::{Outcome, RequestRecord};
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::error::StoreError;
use super::options::StoreOptions;
use super::schema::{enforce_retention, prune_series};
use super::time::{MINUTE_NANOS, sql_time, unix_nanos_now};
use crate::internal_events::InternalEvents;

/// Estimated bytes of one finding with its texts (evidence and recommendation strings).
const FINDING_BYTES: usize = 2048;
/// Estimated bytes of one alert transition with its texts.
const ALERT_EVENT_BYTES: usize = 1024;

/// How long [`StoreWriter::flush`] waits for the writer.
const FLUSH_WAIT: Duration = Duration::from_secs(60);
/// How often series no rollup refers to any more are deleted.
const SERIES_PRUNE_INTERVAL: Duration = Duration::from_secs(3600);

/// Why a request was captured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureReason {
    /// Among the slowest of its minute.
    Slow,
    /// It failed (outcome `error` or `rejected`).
    Failed,
}

impl CaptureReason {
    /// `slow` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Slow => "slow",
            Self::Failed => "failed",
        }
    }

    /// The reason a record with `outcome` is captured for.
    pub fn of(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Error | Outcome::Rejected => Self::Failed,
            Outcome::Ok | Outcome::Cancelled => Self::Slow,
        }
    }
}

/// A request kept with its critical path.
#[derive(Clone, Debug)]
pub struct CapturedRequest {
    /// Start of the minute it was captured in, Unix nanoseconds.
    pub minute_unix_nano: u64,
    /// Why.
    pub reason: CaptureReason,
    /// Its labels as its series has them.
    pub series: SeriesKey,
    /// The record.
    pub record: RequestRecord,
    /// Its critical path, if it was computed.
    pub critical_path: Option<CriticalPath>,
}

enum WriteOp {
    Rollups {
        minute: u64,
        series: Vec<(SeriesKey, Accumulator)>,
    },
    Requests(Vec<CapturedRequest>),
    Findings {
        t: u64,
        findings: Vec<Finding>,
    },
    Alerts {
        t: u64,
        events: Vec<AlertEvent>,
    },
    CriticalSlots {
        width: u64,
        keep_from: u64,
        slots: Vec<(u64, Vec<u8>)>,
    },
    /// Everything the feed recorded before this time has been sent (see
    /// [`StoreWriter::write_through`]).
    Through(u64),
    /// The store holds data since this time, kept unless already known (see
    /// [`StoreWriter::write_data_since`]).
    DataSince(u64),
    /// This collector started at this time (see [`StoreWriter::write_run_start`]).
    RunStart(u64),
    Flush(SyncSender<Result<(), String>>),
}

impl WriteOp {
    /// Estimated bytes it holds (the series keys' strings are shared with the feed and not
    /// counted), for the writer's memory accounting; sent with it through the queue.
    fn approx_bytes(&self) -> usize {
        match self {
            Self::Rollups { series, .. } => {
                series.capacity() * size_of::<(SeriesKey, Accumulator)>()
                    + series.iter().map(|(_, a)| a.heap_bytes()).sum::<usize>()
            }
            Self::Requests(r) => {
                r.capacity() * size_of::<CapturedRequest>()
                    + r.iter()
                        .filter_map(|c| c.critical_path.as_ref())
                        .map(CriticalPath::heap_bytes)
                        .sum::<usize>()
            }
            Self::Findings { findings, .. } => findings.capacity() * FINDING_BYTES,
            Self::Alerts { events, .. } => events.capacity() * ALERT_EVENT_BYTES,
            Self::CriticalSlots { slots, .. } => {
                slots.capacity() * size_of::<(u64, Vec<u8>)>()
                    + slots.iter().map(|(_, b)| b.capacity()).sum::<usize>()
            }
            Self::Through(_) | Self::DataSince(_) | Self::RunStart(_) | Self::Flush(_) => 0,
        }
    }

    /// Items it carries, for drop counts.
    fn items(&self) -> u64 {
        match self {
            Self::Rollups { series, .. } => series.len() as u64,
            Self::Requests(r) => r.len() as u64,
            Self::Findings { findings, .. } => findings.len() as u64,
            Self::Alerts { events, .. } => events.len() as u64,
            Self::CriticalSlots { slots, .. } => slots.len() as u64,
            Self::Through(_) | Self::DataSince(_) | Self::RunStart(_) | Self::Flush(_) => 0,
        }
    }
}

/// What the writer holds, estimated: items in its queue, and what its thread keeps between
/// flushes (items received and not yet written, the last two minutes' merged accumulators).
/// A write that stalls (a slow or hung disk) fills the queue; `cap` bounds it in bytes as the
/// queue's capacity bounds it in items.
#[derive(Debug)]
struct WriterMemory {
    queued: AtomicUsize,
    thread: AtomicUsize,
    cap: AtomicUsize,
}

/// The bytes of one item in the queue, counted in [`WriterMemory::queued`] for as long as the
/// item lives: given back when the writer takes it, and when the queue drops it (the writer's
/// thread gone, a panic included), so the count never outlives what it counts.
#[derive(Debug)]
struct Queued {
    memory: Arc<WriterMemory>,
    bytes: usize,
}

impl Queued {
    fn new(memory: &Arc<WriterMemory>, bytes: usize) -> Self {
        memory.queued.fetch_add(bytes, Ordering::Relaxed);
        Self {
            memory: Arc::clone(memory),
            bytes,
        }
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.memory.queued.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// The writer thread's handle: cheap to clone, never blocks (except [`Self::flush`]).
#[derive(Clone, Debug)]
pub struct StoreWriter {
    /// Items, each with its [`WriteOp::approx_bytes`] counted while it waits.
    tx: SyncSender<(WriteOp, Queued)>,
    events: InternalEvents,
    path: Arc<PathBuf>,
    memory: Arc<WriterMemory>,
}

impl StoreWriter {
    /// Says that everything recorded before `t_unix_nano` has been sent: it is committed with
    /// the items sent before it, as the store's [`DataBounds::until`](super::DataBounds), so
    /// that a rate over a range reaching now divides by the time the store holds, not by the
    /// time its writer has yet to commit. Sent at every hand-over, idle ones included; skipped
    /// when the queue is full (the next one carries a later time).
    pub fn write_through(&self, t_unix_nano: u64) {
        self.send_marker(WriteOp::Through(t_unix_nano));
    }

    /// Keeps `t_unix_nano` as the store's [`DataBounds::since`](super::DataBounds) unless it
    /// already has one (the first collector's start stays). `false` when the queue is full.
    pub fn write_data_since(&self, t_unix_nano: u64) -> bool {
        self.send_marker(WriteOp::DataSince(t_unix_nano))
    }

    /// Says that this collector started at `t_unix_nano`: from its next commit on, the store
    /// keeps its run (see [`Runs`](super::Runs)) from then to the latest time committed
    /// through ([`write_through`](Self::write_through)). `false` when the queue is full.
    pub fn write_run_start(&self, t_unix_nano: u64) -> bool {
        self.send_marker(WriteOp::RunStart(t_unix_nano))
    }

    /// Sends an op that carries no items (nothing to count or drop): `false` when the queue
    /// is full.
    fn send_marker(&self, op: WriteOp) -> bool {
        self.tx.try_send((op, Queued::new(&self.memory, 0))).is_ok()
    }

    fn send(&self, op: WriteOp) -> bool {
        let n = op.items();
        if n == 0 {
            return true;
        }
        let bytes = op.approx_bytes();
        let m = &self.memory;
        // The queue is what a stalled disk grows; the thread's recent minutes are a cache that
        // only newer items prune, so they must not hold the gate shut.
        if m.queued.load(Ordering::Relaxed).saturating_add(bytes) > m.cap.load(Ordering::Relaxed) {
            self.events.store_items_dropped("memory_cap", n);
            return false;
        }
        // An item refused here is dropped with its count.
        let reason = match self.tx.try_send((op, Queued::new(m, bytes))) {
            Ok(()) => return true,
            Err(TrySendError::Full(_)) => "queue_full",
            Err(TrySendError::Disconnected(_)) => "writer_stopped",
        };
        self.events.store_items_dropped(reason, n);
        false
    }

    /// Bounds what the writer's queue may hold, estimated: an item that would take the items
    /// waiting in it past `bytes` is dropped (`store_dropped_total{reason="memory_cap"}`).
    /// Unbounded until set.
    pub fn set_memory_cap(&self, bytes: usize) {
        self.memory.cap.store(bytes, Ordering::Relaxed);
    }

    /// Estimated bytes the writer holds: its queued items and what its thread keeps between
    /// flushes (the collector holds them in its memory limiter with the aggregates).
    pub fn memory_bytes(&self) -> usize {
        let m = &self.memory;
        m.queued.load(Ordering::Relaxed) + m.thread.load(Ordering::Relaxed)
    }

    /// Adds `series` accumulators to minute `minute_unix_nano` (merged with what the minute
    /// already holds: send deltas, each record once). `false` when dropped (queue full).
    pub fn write_rollups(
        &self,
        minute_unix_nano: u64,
        series: Vec<(SeriesKey, Accumulator)>,
    ) -> bool {
        self.send(WriteOp::Rollups {
            minute: minute_unix_nano - minute_unix_nano % MINUTE_NANOS,
            series,
        })
    }

    /// Stores captured requests; slow ones beyond the configured number per minute are
    /// trimmed to the slowest at each flush. `false` when dropped.
    pub fn write_requests(&self, requests: Vec<CapturedRequest>) -> bool {
        self.send(WriteOp::Requests(requests))
    }

    /// Stores findings current at `t_unix_nano`. `false` when dropped.
    pub fn write_findings(&self, t_unix_nano: u64, findings: Vec<Finding>) -> bool {
        self.send(WriteOp::Findings {
            t: t_unix_nano,
            findings,
        })
    }

    /// Stores alert transitions that happened at `t_unix_nano`. `false` when dropped.
    pub fn write_alert_events(&self, t_unix_nano: u64, events: Vec<AlertEvent>) -> bool {
        self.send(WriteOp::Alerts {
            t: t_unix_nano,
            events,
        })
    }

    /// Stores critical-path slots of `width_nanos` as (start, encoded slot), each replacing
    /// every stored slot that started within it (slots of a narrower width written before a
    /// configuration change, which the windows merged into it on restoring), and deletes the
    /// slots that started before `keep_from_unix_nano` (older than the windows reach).
    /// `false` when dropped.
    pub fn write_critical_slots(
        &self,
        width_nanos: u64,
        keep_from_unix_nano: u64,
        slots: Vec<(u64, Vec<u8>)>,
    ) -> bool {
        self.send(WriteOp::CriticalSlots {
            width: width_nanos,
            keep_from: keep_from_unix_nano,
            slots,
        })
    }

    /// Writes everything sent before this call now, and returns when it is committed (for
    /// shutdown and tests). Blocks (up to a minute): not for async contexts.
    pub fn flush(&self) -> Result<(), StoreError> {
        let stopped = || StoreError::WriterStopped {
            path: self.path.to_path_buf(),
        };
        let (ack, done) = mpsc::sync_channel(1);
        self.tx
            .send((WriteOp::Flush(ack), Queued::new(&self.memory, 0)))
            .map_err(|_| stopped())?;
        match done.recv_timeout(FLUSH_WAIT) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(StoreError::FlushFailed {
                path: self.path.to_path_buf(),
                message,
            }),
            Err(_) => Err(stopped()),
        }
    }
}

/// Starts the writer thread on `conn`.
pub(super) fn start(
    conn: Connection,
    path: PathBuf,
    options: StoreOptions,
    events: InternalEvents,
) -> Result<StoreWriter, StoreError> {
    let (tx, rx) = mpsc::sync_channel(options.queue_capacity.max(1));
    let path = Arc::new(path);
    let memory = Arc::new(WriterMemory {
        queued: AtomicUsize::new(0),
        thread: AtomicUsize::new(0),
        cap: AtomicUsize::new(usize::MAX),
    });
    let mut state = WriterState {
        memory: Arc::clone(&memory),
        conn,
        options,
        events: events.clone(),
        path: Arc::clone(&path),
        series_ids: HashMap::new(),
        recent: HashMap::new(),
        pending: Pending::default(),
        run_since: None,
        last_prune: Instant::now(),
    };
    std::thread::Builder::new()
        .name("infertrace-store".into())
        .spawn(move || state.run(rx))
        .map_err(|source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(StoreWriter {
        tx,
        events,
        path: Arc::clone(&path),
        memory,
    })
}

#[derive(Default)]
struct Pending {
    rollups: HashMap<(SeriesKey, u64), Accumulator>,
    requests: Vec<CapturedRequest>,
    findings: Vec<(u64, Finding)>,
    alerts: Vec<(u64, AlertEvent)>,
    /// The latest encoding of each critical-path slot, by start, with its width.
    critical: HashMap<u64, (u64, Vec<u8>)>,
    /// Critical-path slots that started before this are deleted.
    critical_keep_from: u64,
    /// The latest [`WriteOp::Through`] received: everything recorded before it is in this
    /// pending set or was written before.
    through: u64,
    /// A [`WriteOp::DataSince`] to keep, unless the store has one.
    data_since: Option<u64>,
}

impl Pending {
    fn items(&self) -> u64 {
        (self.rollups.len()
            + self.requests.len()
            + self.findings.len()
            + self.alerts.len()
            + self.critical.len()) as u64
    }
}

/// Records a store's data so far as one run when it has none (a store written by builds that
/// kept no runs): from when its data began (its oldest minute, for a store older still) to its
/// last commit. Run before this run's first commit raises `through`.
const EARLIER_DATA_AS_ONE_RUN: &str = "
INSERT INTO runs (since, through)
SELECT since, through FROM (SELECT
    COALESCE((SELECT value FROM meta WHERE key = 'data_since'),
             (SELECT MIN(minute) FROM rollups)) AS since,
    (SELECT value FROM meta WHERE key = 'through') AS through)
WHERE since < through AND NOT EXISTS (SELECT 1 FROM runs)";

struct WriterState {
    memory: Arc<WriterMemory>,
    conn: Connection,
    options: StoreOptions,
    events: InternalEvents,
    path: Arc<PathBuf>,
    series_ids: HashMap<SeriesKey, i64>,
    /// Merged accumulators of recently written minutes, by (series id, minute).
    recent: HashMap<(i64, u64), Accumulator>,
    pending: Pending,
    /// When this collector started ([`WriteOp::RunStart`]): every commit extends its run.
    run_since: Option<u64>,
    last_prune: Instant,
}

/// What the thread held is freed with it (a panic included): its count goes too.
impl Drop for WriterState {
    fn drop(&mut self) {
        self.memory.thread.store(0, Ordering::Relaxed);
    }
}

impl WriterState {
    fn run(&mut self, rx: Receiver<(WriteOp, Queued)>) {
        let interval = self.options.flush_interval.max(Duration::from_millis(1));
        let mut deadline = Instant::now() + interval;
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok((WriteOp::Flush(ack), _)) => {
                    let result = self.flush(unix_nanos_now());
                    // The caller may have given up waiting; nothing to do then.
                    let _ = ack.send(result.map_err(|e| e.to_string()));
                }
                Ok((op, queued)) => self.receive(op, queued),
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.flush(unix_nanos_now());
                    deadline = Instant::now() + interval;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let _ = self.flush(unix_nanos_now());
                    return;
                }
            }
        }
    }

    /// Takes `op` into what the next flush writes, its bytes moved from the queue's count to
    /// the thread's.
    fn receive(&mut self, op: WriteOp, queued: Queued) {
        // An upper bound: rollups merge.
        self.memory
            .thread
            .fetch_add(queued.bytes, Ordering::Relaxed);
        drop(queued);
        if let WriteOp::RunStart(t) = op {
            self.run_since = Some(t);
            return;
        }
        let p = &mut self.pending;
        match op {
            WriteOp::Rollups { minute, series } => {
                for (key, acc) in series {
                    match p.rollups.entry((key, minute)) {
                        std::collections::hash_map::Entry::Occupied(mut e) => {
                            e.get_mut().merge(&acc)
                        }
                        std::collections::hash_map::Entry::Vacant(e) => {
                            e.insert(acc);
                        }
                    }
                }
            }
            WriteOp::Requests(r) => p.requests.extend(r),
            WriteOp::Findings { t, findings } => {
                p.findings.extend(findings.into_iter().map(|f| (t, f)));
            }
            WriteOp::Alerts { t, events } => p.alerts.extend(events.into_iter().map(|e| (t, e))),
            WriteOp::CriticalSlots {
                width,
                keep_from,
                slots,
            } => {
                // Replaced versions stay in the thread's count until the flush (an upper bound).
                p.critical
                    .extend(slots.into_iter().map(|(start, s)| (start, (width, s))));
                p.critical_keep_from = p.critical_keep_from.max(keep_from);
            }
            WriteOp::Through(t) => p.through = p.through.max(t),
            WriteOp::DataSince(t) => p.data_since = Some(p.data_since.map_or(t, |d| d.min(t))),
            WriteOp::RunStart(_) | WriteOp::Flush(_) => {}
        }
    }

    /// Writes everything pending in one transaction, then enforces retention.
    fn flush(&mut self, now_unix_nano: u64) -> Result<(), StoreError> {
        let result = self.write_pending(now_unix_nano);
        // Pending is written (or dropped); what stays is the recent minutes' state.
        let recent: usize = self
            .recent
            .values()
            .map(|a| size_of::<((i64, u64), Accumulator)>() + a.heap_bytes())
            .sum();
        self.memory.thread.store(recent, Ordering::Relaxed);
        result
    }

    fn write_pending(&mut self, now_unix_nano: u64) -> Result<(), StoreError> {
        let pending = std::mem::take(&mut self.pending);
        let items = pending.items();
        let prune = self.last_prune.elapsed() >= SERIES_PRUNE_INTERVAL;
        let result = self.write(pending, now_unix_nano, prune);
        match result {
            Ok(rows) => {
                self.events.store_writes.inc_by(rows);
                if prune {
                    self.last_prune = Instant::now();
                }
                // Keep the merged state of the newest two minutes only.
                if let Some(newest) = self.recent.keys().map(|k| k.1).max() {
                    let oldest_kept = newest.saturating_sub(MINUTE_NANOS);
                    self.recent.retain(|k, _| k.1 >= oldest_kept);
                }
                Ok(())
            }
            Err(source) => {
                // Ids and merged minutes may come from the rolled-back transaction.
                self.series_ids.clear();
                self.recent.clear();
                self.events.store_items_dropped("write_failed", items);
                if crate::internal_events::warn_allowed("history_write_failed") {
                    tracing::error!(path = %self.path.display(), error = %source, "history store write failed (logged at most every 10 s)");
                }
                Err(StoreError::Sqlite {
                    path: self.path.to_path_buf(),
                    source,
                })
            }
        }
    }

    /// Writes everything `p` holds in one transaction (see [`WriteOp`]).
    fn write(&mut self, p: Pending, now_unix_nano: u64, prune: bool) -> rusqlite::Result<u64> {
        let tx = self.conn.transaction()?;
        let mut rows = 0u64;
        if let Some(since) = p.data_since {
            tx.prepare_cached("INSERT OR IGNORE INTO meta (key, value) VALUES ('data_since', ?1)")?
                .execute(params![sql_time(since)])?;
        }
        // In the transaction that commits what it covers: a reader sees both or neither.
        if p.through > 0 {
            let run = self.run_since.filter(|&s| s < p.through);
            if run.is_some() {
                // A store written by builds that kept no runs: its data so far is one run
                // (as those builds' rates assumed), ending where their last commit did.
                tx.prepare_cached(EARLIER_DATA_AS_ONE_RUN)?.execute([])?;
            }
            tx.prepare_cached(
                "INSERT INTO meta (key, value) VALUES ('through', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = MAX(value, excluded.value)",
            )?
            .execute(params![sql_time(p.through)])?;
            if let Some(since) = run {
                tx.prepare_cached(
                    "INSERT INTO runs (since, through) VALUES (?1, ?2)
                     ON CONFLICT (since) DO UPDATE SET through = MAX(through, excluded.through)",
                )?
                .execute(params![sql_time(since), sql_time(p.through)])?;
            }
        }
        for ((key, minute), acc) in p.rollups {
            let id = series_id(&tx, &mut self.series_ids, &key)?;
            let merged = match self.recent.remove(&(id, minute)) {
                Some(mut stored) => {
                    stored.merge(&acc);
                    stored
                }
                None => match stored_rollup(&tx, id, minute)? {
                    Some(mut stored) => {
                        stored.merge(&acc);
                        stored
                    }
                    None => acc,
                },
            };
            tx.prepare_cached(
                "INSERT OR REPLACE INTO rollups (series_id, minute, requests, acc)
                 VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                id,
                sql_time(minute),
                sql_time(merged.counts.requests),
                merged.to_bytes()
            ])?;
            self.recent.insert((id, minute), merged);
            rows += 1;
        }
        let mut slow_minutes: Vec<u64> = Vec::new();
        for r in &p.requests {
            insert_request(&tx, r)?;
            if r.reason == CaptureReason::Slow {
                slow_minutes.push(r.minute_unix_nano);
            }
            rows += 1;
        }
        slow_minutes.sort_unstable();
        slow_minutes.dedup();
        let keep = i64::try_from(self.options.slow_per_minute).unwrap_or(i64::MAX);
        for minute in slow_minutes {
            tx.prepare_cached(
                "DELETE FROM requests WHERE minute = ?1 AND reason = 'slow' AND id NOT IN
                    (SELECT id FROM requests WHERE minute = ?1 AND reason = 'slow'
                     ORDER BY e2e DESC, id LIMIT ?2)",
            )?
            .execute(params![sql_time(minute), keep])?;
        }
        for (t, f) in &p.findings {
            let body = serde_json::to_string(f).unwrap_or_else(|_| "null".into());
            tx.prepare_cached(
                "INSERT INTO findings (t, rule_id, service, model, operation, body)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                sql_time(*t),
                f.rule_id,
                f.service,
                f.model,
                f.operation,
                body
            ])?;
            rows += 1;
        }
        for (t, e) in &p.alerts {
            let body = serde_json::to_string(e).unwrap_or_else(|_| "null".into());
            let state = serde_json::to_value(e.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            tx.prepare_cached(
                "INSERT INTO alerts (t, alert, state, service, model, operation, body)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                sql_time(*t),
                e.alert,
                state,
                e.service,
                e.model,
                e.operation,
                body
            ])?;
            rows += 1;
        }
        for (start, (width, slot)) in &p.critical {
            tx.prepare_cached("DELETE FROM critical_slots WHERE start >= ?1 AND start < ?2")?
                .execute(params![
                    sql_time(*start),
                    sql_time(start.saturating_add(*width))
                ])?;
            tx.prepare_cached("INSERT INTO critical_slots (start, slot) VALUES (?1, ?2)")?
                .execute(params![sql_time(*start), slot])?;
            rows += 1;
        }
        if p.critical_keep_from > 0 {
            tx.prepare_cached("DELETE FROM critical_slots WHERE start < ?1")?
                .execute(params![sql_time(p.critical_keep_from)])?;
        }
        enforce_retention(&tx, now_unix_nano, self.options.retention)?;
        if prune && prune_series(&tx)? > 0 {
            self.series_ids.clear();
            self.recent.clear();
        }
        tx.commit()?;
        Ok(rows)
    }
}

/// The id of series `key`, inserting it if new.
fn series_id(
    tx: &Transaction<'_>,
    cache: &mut HashMap<SeriesKey, i64>,
    key: &SeriesKey,
) -> rusqlite::Result<i64> {
    if let Some(id) = cache.get(key) {
        return Ok(*id);
    }
    tx.prepare_cached(
        "INSERT OR IGNORE INTO series (service, model, operation) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![&*key.service, &*key.model, &*key.operation])?;
    let id: i64 = tx
        .prepare_cached(
            "SELECT id FROM series WHERE service = ?1 AND model = ?2 AND operation = ?3",
        )?
        .query_row(params![&*key.service, &*key.model, &*key.operation], |r| {
            r.get(0)
        })?;
    cache.insert(key.clone(), id);
    Ok(id)
}

/// The stored accumulator of (series, minute); an undecodable one is replaced (and logged).
fn stored_rollup(
    tx: &Transaction<'_>,
    id: i64,
    minute: u64,
) -> rusqlite::Result<Option<Accumulator>> {
    let bytes: Option<Vec<u8>> = tx
        .prepare_cached("SELECT acc FROM rollups WHERE series_id = ?1 AND minute = ?2")?
        .query_row(params![id, sql_time(minute)], |r| r.get(0))
        .optional()?;
    Ok(bytes.and_then(|b| match Accumulator::decode(&b) {
        Ok(a) => Some(a),
        Err(e) => {
            tracing::warn!(error = %e, minute, "replacing an undecodable stored rollup");
            None
        }
    }))
}

fn insert_request(tx: &Transaction<'_>, r: &CapturedRequest) -> rusqlite::Result<()> {
    let record = serde_json::to_string(&r.record).unwrap_or_else(|_| "null".into());
    let critical_path = r
        .critical_path
        .as_ref()
        .and_then(|c| serde_json::to_string(c).ok());
    tx.prepare_cached(
        "INSERT INTO requests (minute, reason, trace_id, service, model, operation, outcome,
                               e2e, record, critical_path)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        sql_time(r.minute_unix_nano),
        r.reason.as_str(),
        r.record.trace_id.to_hex(),
        &*r.series.service,
        &*r.series.model,
        &*r.series.operation,
        r.record.outcome.as_str(),
        if r.record.e2e.is_finite() {
            r.record.e2e
        } else {
            0.0
        },
        record,
        critical_path
    ])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> Arc<WriterMemory> {
        Arc::new(WriterMemory {
            queued: AtomicUsize::new(0),
            thread: AtomicUsize::new(0),
            cap: AtomicUsize::new(usize::MAX),
        })
    }

    #[test]
    fn queued_bytes_go_with_the_queue_when_the_writer_is_gone() {
        let m = memory();
        let (tx, rx) = mpsc::sync_channel::<(WriteOp, Queued)>(4);
        for _ in 0..3 {
            tx.send((WriteOp::Requests(Vec::new()), Queued::new(&m, 100)))
                .unwrap();
        }
        assert_eq!(m.queued.load(Ordering::Relaxed), 300);
        // One taken by the writer, then the writer's end dropped (its thread gone).
        drop(rx.recv().unwrap());
        assert_eq!(m.queued.load(Ordering::Relaxed), 200);
        drop(rx);
        assert_eq!(m.queued.load(Ordering::Relaxed), 0);
        // And one refused afterwards gives its bytes back at once.
        assert!(
            tx.try_send((WriteOp::Requests(Vec::new()), Queued::new(&m, 50)))
                .is_err()
        );
        assert_eq!(m.queued.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_thread_count_goes_with_the_thread() {
        let m = memory();
        let state = WriterState {
            memory: Arc::clone(&m),
            conn: Connection::open_in_memory().unwrap(),
            options: StoreOptions::default(),
            events: InternalEvents::default(),
            path: Arc::new(PathBuf::new()),
            series_ids: HashMap::new(),
            recent: HashMap::new(),
            pending: Pending::default(),
            run_since: None,
            last_prune: Instant::now(),
        };
        m.thread.store(4096, Ordering::Relaxed);
        drop(state);
        assert_eq!(m.thread.load(Ordering::Relaxed), 0);
    }
}
