//! The embedded history store: SQLite (WAL) at `<data_dir>/infertrace.db`.
//!
//! # What is kept
//! - **Minute rollups**: per series (service, model, operation) and minute, the minute's KPI
//!   [`Accumulator`] in its compact encoding ([`Accumulator::encode`]). Accumulators are
//!   mergeable, so a percentile over any range is computed by merging the minutes' sketches
//!   ([`Store::history`]), never by averaging percentiles, and the collector's 1h window is
//!   rebuilt after a restart from the same rows ([`Store::rollups`] →
//!   `KpiWindows::restore_slots`).
//! - **Requests**: record and critical path of the slowest `slow_per_minute` requests of each
//!   minute and of every failed one (at most `failed_per_minute`) — [`Store::slow_requests`].
//! - **Findings** and **alert transitions**, as JSON with their time — [`Store::findings`],
//!   [`Store::alert_history`].
//!
//! # Writes
//! Nothing is written on the ingest path. The pipeline hands what it collected to a
//! [`StoreFeed`] (in memory, under its own lock); the feed passes it on, at least once a
//! second, through a bounded queue to the [`StoreWriter`]'s thread, which writes everything
//! received in one transaction every `flush_interval` (default 5 s) and then deletes what is
//! older than `retention` (default 7 days). A full queue drops the item and counts it
//! (`infertrace_store_dropped_total{reason="queue_full"}`). A crash (even `kill -9`) loses at
//! most what arrived in the last flush interval plus one hand-over step (≤ 1 s): SQLite's WAL
//! makes each committed flush durable and atomic.
//!
//! # Safety of the file
//! The database carries an `application_id` (`ITRC`) and a schema version (`user_version`).
//! A file that is not SQLite, another application's database, or a newer schema is refused with
//! an error naming the file, and is never modified.
//!
//! # Reads
//! [`Store`] is cheap to clone; reads use their own connection (WAL lets them run while the
//! writer commits) and block: call them from `tokio::task::spawn_blocking` in async code.

mod error;
mod feed;
mod history;
mod options;
mod preflight;
mod schema;
mod time;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use infertrace_analysis::critical_path::CriticalPathWindows;
use infertrace_analysis::kpi::{Accumulator, KpiWindows, SeriesKey};
use rusqlite::{Connection, params};
use serde::Serialize;

use crate::internal_events::InternalEvents;
use time::{sql_time, unix_time};

pub use error::StoreError;
pub use feed::StoreFeed;
pub use history::{DataBounds, HistoryFilter, HistoryPoint, HistoryRead, Runs};
pub use options::StoreOptions;
pub use schema::RetentionStats;
pub use time::{MINUTE_NANOS, minute_end, minute_of, unix_nanos_now};
pub use writer::{CaptureReason, CapturedRequest, StoreWriter};

/// File name of the database inside the data directory.
pub const DB_FILE_NAME: &str = "infertrace.db";
/// The lock file beside the database (see [`Store::open`]).
pub const LOCK_FILE_NAME: &str = "infertrace.db.lock";

/// One series' merged rollups over a time range (see [`Store::rollups`]).
#[derive(Clone, Debug)]
pub struct SeriesRollup {
    /// The series.
    pub key: SeriesKey,
    /// Start of the minute, Unix nanoseconds.
    pub minute_unix_nano: u64,
    /// The minute's accumulator (every hand-over of that minute merged).
    pub accumulator: Accumulator,
}

/// A captured request read back (see [`Store::slow_requests`]).
#[derive(Clone, Debug, Serialize)]
pub struct StoredRequestRow {
    /// Minute it was captured in, Unix nanoseconds.
    pub minute_unix_nano: u64,
    /// Why it was kept: `slow` or `failed`.
    pub reason: String,
    /// Trace id (hex).
    pub trace_id: String,
    /// Service.
    pub service: String,
    /// Model.
    pub model: String,
    /// Operation.
    pub operation: String,
    /// Outcome (`ok`, `error`, …).
    pub outcome: String,
    /// End-to-end latency, seconds.
    pub e2e: f64,
    /// The request record, as `/api/traces/{id}` shows it.
    pub record: serde_json::Value,
    /// Its critical path, `null` when it could not be computed.
    pub critical_path: serde_json::Value,
}

/// A stored finding or alert transition (see [`Store::findings`], [`Store::alert_history`]).
#[derive(Clone, Debug, Serialize)]
pub struct StoredEvent {
    /// When it was stored (findings) or happened (alert transitions), Unix nanoseconds.
    pub t_unix_nano: u64,
    /// The finding or alert event as JSON.
    pub body: serde_json::Value,
}

struct StoreInner {
    path: PathBuf,
    options: StoreOptions,
    reader: Mutex<Connection>,
    writer_started: AtomicBool,
    /// The lock that keeps a second collector off this store while this one has it open.
    _lock: std::fs::File,
}

/// The history store: a handle for reads and for starting the writer. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<StoreInner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

/// Takes the exclusive lock of the store in `dir` (`infertrace.db.lock`, created if needed),
/// held as long as the returned file is open: each collector's writer replaces a minute's row
/// from its own state, so two collectors on one store would lose each other's requests.
fn lock(dir: &Path) -> Result<std::fs::File, StoreError> {
    let path = dir.join(LOCK_FILE_NAME);
    let io = |source| StoreError::Io {
        path: path.clone(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::InUse {
            path: dir.join(DB_FILE_NAME),
        }),
        Err(std::fs::TryLockError::Error(source)) => Err(io(source)),
    }
}

impl Store {
    /// Opens (creating if needed) the store at `<dir>/infertrace.db`, locked for this process
    /// (another collector that opens it meanwhile gets [`StoreError::InUse`]).
    ///
    /// Refuses, without modifying it, a file that is not SQLite, another application's
    /// database, or a newer schema. `options.data_dir` and `options.enabled` are not read
    /// here (see [`Store::open_configured`]).
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        let path = dir.join(DB_FILE_NAME);
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        // Opened first: a file that is no store is refused, with nothing created beside it.
        let reader = schema::open(&path)?;
        let lock = lock(dir)?;
        schema::add_missing_tables(&reader, &path)?;
        Ok(Store {
            inner: Arc::new(StoreInner {
                path,
                options,
                reader: Mutex::new(reader),
                writer_started: AtomicBool::new(false),
                _lock: lock,
            }),
        })
    }

    /// Opens the store configured by `options`: `None` when `enabled` is false (`--no-store`).
    pub fn open_configured(options: &StoreOptions) -> Result<Option<Store>, StoreError> {
        if !options.enabled {
            return Ok(None);
        }
        Store::open(&options.data_dir, options.clone()).map(Some)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The options it was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.inner.options
    }

    /// Starts the writer thread (once per store) and returns its handle; drops and write
    /// failures are counted in `events`.
    pub fn start_writer(&self, events: InternalEvents) -> Result<StoreWriter, StoreError> {
        if self.inner.writer_started.swap(true, Ordering::AcqRel) {
            return Err(StoreError::WriterRunning {
                path: self.inner.path.clone(),
            });
        }
        let conn = schema::open_another(&self.inner.path)?;
        writer::start(
            conn,
            self.inner.path.clone(),
            self.inner.options.clone(),
            events,
        )
    }

    /// Where the store's data begins and ends, as committed ([`DataBounds`]).
    pub fn data_bounds(&self) -> Result<DataBounds, StoreError> {
        history::read_bounds(&self.reader()).map_err(|e| self.sql_error(e))
    }

    /// A [`StoreFeed`] for the pipeline, labelling series by `dimensions` (as `KpiWindows`
    /// does), judging goodput by `slo`, keeping at most `max_series` series per minute (the
    /// rest go to the `__overflow__` series).
    pub fn feed(
        &self,
        writer: StoreWriter,
        kpi: &infertrace_analysis::kpi::KpiConfig,
    ) -> StoreFeed {
        StoreFeed::new(writer, &self.inner.options, kpi)
    }

    fn reader(&self) -> MutexGuard<'_, Connection> {
        self.inner.reader.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn sql_error(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.inner.path.clone(),
            source,
        }
    }

    /// Deletes rows older than `now_unix_nano − retention` (the writer does this at every
    /// flush; exposed for tests and tools).
    pub fn enforce_retention(&self, now_unix_nano: u64) -> Result<RetentionStats, StoreError> {
        let conn = self.reader();
        schema::enforce_retention(&conn, now_unix_nano, self.inner.options.retention)
            .map_err(|e| self.sql_error(e))
    }

    /// Every series' minute rollups with minute start in `[from, to)`, oldest first: what the
    /// collector feeds to `KpiWindows::absorb_slot(&r.key, r.minute_unix_nano, MINUTE_NANOS,
    /// &r.accumulator)` to rebuild its 1h window after a restart.
    pub fn rollups(
        &self,
        from_unix_nano: u64,
        to_unix_nano: u64,
    ) -> Result<Vec<SeriesRollup>, StoreError> {
        let conn = self.reader();
        let run = || -> rusqlite::Result<Vec<SeriesRollup>> {
            let mut stmt = conn.prepare_cached(
                "SELECT r.minute, r.acc, s.service, s.model, s.operation
                 FROM rollups r JOIN series s ON s.id = r.series_id
                 WHERE r.minute >= ?1 AND r.minute < ?2
                 ORDER BY r.minute, s.service, s.model, s.operation",
            )?;
            let mut rows = stmt.query(params![sql_time(from_unix_nano), sql_time(to_unix_nano)])?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                let bytes: Vec<u8> = row.get(1)?;
                let Ok(accumulator) = Accumulator::decode(&bytes) else {
                    tracing::warn!(path = %self.inner.path.display(), "skipping an undecodable rollup");
                    continue;
                };
                out.push(SeriesRollup {
                    key: SeriesKey {
                        service: Arc::from(row.get::<_, String>(2)?),
                        model: Arc::from(row.get::<_, String>(3)?),
                        operation: Arc::from(row.get::<_, String>(4)?),
                    },
                    minute_unix_nano: unix_time(row.get(0)?),
                    accumulator,
                });
            }
            Ok(out)
        };
        run().map_err(|e| self.sql_error(e))
    }

    /// Rebuilds `kpis` after a restart: absorbs every stored minute that started in the
    /// `window` (at most the retention: older minutes are deleted at the first flush, and the
    /// windows must not show what the history no longer has) before `now_unix_nano` (the
    /// current minute included) with `KpiWindows::restore_slots`, which also gives the places
    /// under the cap to the most recently active series. Returns the series-minutes absorbed.
    /// With the default KPI config this refills the 1h window (60-second slots) minute by
    /// minute, and the 1m and 5m windows with every minute whose last instant lies in them
    /// (see `absorb_restored`). The windows' start becomes when the store's data began
    /// ([`DataBounds::since`]): their rates divide by the time since, quiet time included and
    /// the time no collector ran (between [`Runs`], and up to now) left out.
    pub fn restore_kpis(
        &self,
        kpis: &mut KpiWindows,
        now_unix_nano: u64,
        window: Duration,
    ) -> Result<usize, StoreError> {
        let window = window.min(self.inner.options.retention);
        let window = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        let from = minute_of(now_unix_nano.saturating_sub(window));
        let rollups = self.rollups(from, now_unix_nano.saturating_add(1))?;
        let restored = kpis.restore_slots(
            rollups
                .iter()
                .map(|r| (&r.key, r.minute_unix_nano, MINUTE_NANOS, &r.accumulator)),
            now_unix_nano,
        );
        let bounds = self.data_bounds()?;
        if let Some(since) = bounds.since {
            kpis.set_start(since);
        }
        kpis.set_unseen(self.unseen(bounds, from, now_unix_nano)?);
        Ok(restored)
    }

    /// The times in `[from, to)` no collector saw, as far as the store knows ([`Runs::gaps`];
    /// a store that kept no runs yet counts its data as one: [`Runs::of_earlier_data`]).
    fn unseen(
        &self,
        bounds: DataBounds,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        let mut runs =
            history::read_runs(&self.reader(), from, to).map_err(|e| self.sql_error(e))?;
        if runs.known_from().is_none() {
            runs = Runs::of_earlier_data(bounds);
        }
        Ok(runs.gaps(from, to))
    }

    /// Rebuilds the critical-path `windows` after a restart from the stored slots within their
    /// reach at `now_unix_nano` (call before any request is recorded into them). Returns the
    /// slots absorbed; an undecodable slot is skipped and logged.
    pub fn restore_critical_paths(
        &self,
        windows: &mut CriticalPathWindows,
        now_unix_nano: u64,
    ) -> Result<usize, StoreError> {
        let from = windows.reach_start(now_unix_nano);
        let conn = self.reader();
        let slots = || -> rusqlite::Result<Vec<Vec<u8>>> {
            let mut stmt = conn.prepare_cached(
                "SELECT slot FROM critical_slots WHERE start >= ?1 AND start <= ?2 ORDER BY start",
            )?;
            let rows = stmt.query_map(params![sql_time(from), sql_time(now_unix_nano)], |r| {
                r.get(0)
            })?;
            rows.collect()
        };
        let slots = slots().map_err(|e| self.sql_error(e))?;
        let mut absorbed = 0;
        for slot in slots {
            match windows.absorb_slot(&slot, now_unix_nano) {
                Ok(taken) => absorbed += usize::from(taken),
                Err(error) => {
                    tracing::warn!(path = %self.inner.path.display(), %error, "skipping an undecodable critical-path slot");
                }
            }
        }
        Ok(absorbed)
    }

    /// The series with at least one stored minute in `[from, to)`, sorted (for the
    /// dashboard's service and model selectors across restarts).
    pub fn series(
        &self,
        from_unix_nano: u64,
        to_unix_nano: u64,
    ) -> Result<Vec<SeriesKey>, StoreError> {
        let conn = self.reader();
        let run = || -> rusqlite::Result<Vec<SeriesKey>> {
            let mut stmt = conn.prepare_cached(
                "SELECT service, model, operation FROM series s WHERE EXISTS
                    (SELECT 1 FROM rollups r
                     WHERE r.series_id = s.id AND r.minute >= ?1 AND r.minute < ?2)
                 ORDER BY service, model, operation",
            )?;
            let rows = stmt.query_map(
                params![sql_time(from_unix_nano), sql_time(to_unix_nano)],
                |row| {
                    Ok(SeriesKey {
                        service: Arc::from(row.get::<_, String>(0)?),
                        model: Arc::from(row.get::<_, String>(1)?),
                        operation: Arc::from(row.get::<_, String>(2)?),
                    })
                },
            )?;
            rows.collect()
        };
        run().map_err(|e| self.sql_error(e))
    }

    /// The values of `kpi` (a dotted path as in `/api/kpis` and alert rules: `ttft.p99`,
    /// `requests`, `throughput.requests_per_second`, `goodput.ratio`,
    /// `phase_share.all.queue`, …) over `[from, to)` in steps of `step` (rounded to whole
    /// minutes, at least one), for the series matching `filter` merged together. Each point's
    /// value merges that step's minute accumulators (so `ttft.p99` is the p99 of every request
    /// of the step); `None` where the step holds no data for it. Rates divide by the part of
    /// the step within `[from, to)` and within the store's [`DataBounds`].
    pub fn history(
        &self,
        kpi: &str,
        filter: &HistoryFilter,
        from_unix_nano: u64,
        to_unix_nano: u64,
        step: Duration,
    ) -> Result<Vec<HistoryPoint>, StoreError> {
        self.history_within(kpi, filter, from_unix_nano, to_unix_nano, step)
            .map(|read| read.points)
    }

    /// [`history`](Self::history), with the [`DataBounds`] and [`Runs`] its rates divided by:
    /// read in one read transaction with the minutes, so that all describe the same
    /// committed data.
    pub fn history_within(
        &self,
        kpi: &str,
        filter: &HistoryFilter,
        from_unix_nano: u64,
        to_unix_nano: u64,
        step: Duration,
    ) -> Result<HistoryRead, StoreError> {
        let path = history::parse_kpi(kpi)?;
        let mut conn = self.reader();
        let mut run = || -> rusqlite::Result<_> {
            let tx = conn.transaction()?;
            let bounds = history::read_bounds(&tx)?;
            // Over the whole minutes the points cover.
            let runs =
                history::read_runs(&tx, minute_of(from_unix_nano), minute_end(to_unix_nano))?;
            let points = history::query(
                &tx,
                path,
                filter,
                (from_unix_nano, to_unix_nano),
                (bounds, &runs),
                step,
            )?;
            Ok(HistoryRead {
                points,
                bounds,
                runs,
            })
        };
        run().map_err(|e| self.sql_error(e))
    }

    /// Captured requests (slowest per minute and failed) in `[from, to)`, slowest first, at
    /// most `limit`.
    pub fn slow_requests(
        &self,
        from_unix_nano: u64,
        to_unix_nano: u64,
        limit: usize,
    ) -> Result<Vec<StoredRequestRow>, StoreError> {
        let conn = self.reader();
        let run = || -> rusqlite::Result<Vec<StoredRequestRow>> {
            let mut stmt = conn.prepare_cached(
                "SELECT minute, reason, trace_id, service, model, operation, outcome, e2e,
                        record, critical_path
                 FROM requests WHERE minute >= ?1 AND minute < ?2
                 ORDER BY e2e DESC, id LIMIT ?3",
            )?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = stmt.query_map(
                params![sql_time(from_unix_nano), sql_time(to_unix_nano), limit],
                |row| {
                    let json = |i: usize| -> rusqlite::Result<serde_json::Value> {
                        let text: Option<String> = row.get(i)?;
                        Ok(text
                            .and_then(|t| serde_json::from_str(&t).ok())
                            .unwrap_or(serde_json::Value::Null))
                    };
                    Ok(StoredRequestRow {
                        minute_unix_nano: unix_time(row.get(0)?),
                        reason: row.get(1)?,
                        trace_id: row.get(2)?,
                        service: row.get(3)?,
                        model: row.get(4)?,
                        operation: row.get(5)?,
                        outcome: row.get(6)?,
                        e2e: row.get(7)?,
                        record: json(8)?,
                        critical_path: json(9)?,
                    })
                },
            )?;
            rows.collect()
        };
        run().map_err(|e| self.sql_error(e))
    }

    /// Findings stored in `[from, to)`, oldest first.
    pub fn findings(
        &self,
        from_unix_nano: u64,
        to_unix_nano: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.events("findings", from_unix_nano, to_unix_nano)
    }

    /// Alert transitions (pending, firing, resolved) in `[from, to)`, oldest first.
    pub fn alert_history(
        &self,
        from_unix_nano: u64,
        to_unix_nano: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.events("alerts", from_unix_nano, to_unix_nano)
    }

    fn events(
        &self,
        table: &'static str,
        from_unix_nano: u64,
        to_unix_nano: u64,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let conn = self.reader();
        let run = || -> rusqlite::Result<Vec<StoredEvent>> {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT t, body FROM {table} WHERE t >= ?1 AND t < ?2 ORDER BY t, id"
            ))?;
            let rows = stmt.query_map(
                params![sql_time(from_unix_nano), sql_time(to_unix_nano)],
                |row| {
                    let body: String = row.get(1)?;
                    Ok(StoredEvent {
                        t_unix_nano: unix_time(row.get(0)?),
                        body: serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
                    })
                },
            )?;
            rows.collect()
        };
        run().map_err(|e| self.sql_error(e))
    }
}
