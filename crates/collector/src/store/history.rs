//! KPI history: merge the stored minute accumulators of each step, then read one KPI.

use std::sync::Arc;
use std::time::Duration;

use infertrace_analysis::alert::KpiPath;
use infertrace_analysis::kpi::{Accumulator, SeriesKey, SloConfig, series_kpis, sketch_config};
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::time::{MINUTE_NANOS, minute_end, minute_of, sql_time, unix_time};

/// Decoded minutes a step buffers before merging them in one pass (`Accumulator::merge_many`
/// merges each sketch once over a dense array instead of one allocation per pairwise merge).
const MERGE_BATCH: usize = 64;

/// Most points one history query returns; a finer step over a longer range is widened.
pub const MAX_HISTORY_POINTS: u64 = 20_000;

/// Which series a history query merges: each label, when set, must match exactly.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryFilter {
    /// Service.
    pub service: Option<String>,
    /// Model.
    pub model: Option<String>,
    /// Operation.
    pub operation: Option<String>,
}

impl HistoryFilter {
    /// Whether no label is set (every series matches).
    pub fn is_empty(&self) -> bool {
        self.service.is_none() && self.model.is_none() && self.operation.is_none()
    }

    /// Whether `key` is one of the series this filter merges.
    pub fn matches(&self, key: &SeriesKey) -> bool {
        let ok = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        ok(&self.service, &key.service)
            && ok(&self.model, &key.model)
            && ok(&self.operation, &key.operation)
    }
}

/// One point of a KPI's history.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct HistoryPoint {
    /// Start of the step, Unix nanoseconds.
    pub t_unix_nano: u64,
    /// The KPI over the step; `None` when the step holds no data for it: no collector ran in
    /// it, or it is a percentile or ratio of no request (counts and rates read 0 then).
    pub value: Option<f64>,
}

/// A history query's points, with what their rates divided by.
#[derive(Clone, Debug, PartialEq)]
pub struct HistoryRead {
    /// One point a step.
    pub points: Vec<HistoryPoint>,
    /// Where the store's data begins and ends.
    pub bounds: DataBounds,
    /// When collectors ran within the range.
    pub runs: Runs,
}

/// Parses a KPI path as alert rules and `/api/kpis` name them.
pub(super) fn parse_kpi(kpi: &str) -> Result<KpiPath, StoreError> {
    KpiPath::parse(kpi).map_err(|reason| StoreError::UnknownKpi {
        kpi: kpi.to_owned(),
        reason,
    })
}

/// The step in nanoseconds: whole minutes, at least one, widened so that at most
/// [`MAX_HISTORY_POINTS`] points cover `span` nanoseconds.
fn step_nanos(step: Duration, span: u64) -> u64 {
    let asked = u64::try_from(step.as_nanos()).unwrap_or(u64::MAX);
    let minutes = asked.div_ceil(MINUTE_NANOS).max(1);
    let floor = span.div_ceil(MAX_HISTORY_POINTS).div_ceil(MINUTE_NANOS);
    minutes.max(floor).saturating_mul(MINUTE_NANOS)
}

/// Where a store's data begins and ends, as committed: rates over a range that reaches past
/// either divide by the time within them (the store cannot tell a quiet minute it did not
/// see from one it saw).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataBounds {
    /// When the first collector that wrote the store started (kept from its first hand-over;
    /// for a store written before this was kept, its oldest stored minute). `None` for a
    /// store that holds nothing yet.
    pub since: Option<u64>,
    /// The time through which everything the collector recorded is committed: its latest
    /// hand-over's, idle ones included (the store lags the pipeline by up to a hand-over and a
    /// flush interval), kept across restarts. `None` before the first commit.
    pub until: Option<u64>,
}

/// When the collectors that wrote the store ran: each from its start to the latest time its
/// data is committed through (the `runs` table). Time between runs is time no collector saw:
/// a minute within a run that holds no data was quiet (its counts and rates are 0), one
/// outside every run is unknown (`null`), and rates divide by the time runs cover. Stores
/// written by builds that did not keep runs know them only from their first kept one on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Runs {
    /// `[since, through)` of each run read, by start, not overlapping.
    runs: Vec<(u64, u64)>,
    /// The start of the store's first kept run (`None`: none kept).
    first: Option<u64>,
}

impl Runs {
    /// Runs from `[since, through)` pairs in any order (overlaps are merged).
    pub fn new(mut runs: Vec<(u64, u64)>, first: Option<u64>) -> Self {
        runs.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
        for (since, through) in runs {
            match merged.last_mut() {
                Some(last) if since <= last.1 => last.1 = last.1.max(through),
                _ if since < through => merged.push((since, through)),
                _ => {}
            }
        }
        Self {
            runs: merged,
            first,
        }
    }

    /// The data of a store that kept no runs as one run, from when it began to its last
    /// commit: how a later build counts it (the writer records that run at its first commit).
    pub fn of_earlier_data(bounds: DataBounds) -> Self {
        match (bounds.since, bounds.until) {
            (Some(since), Some(until)) => Self::new(vec![(since, until)], Some(since)),
            _ => Self::default(),
        }
    }

    /// When the store's kept runs begin: before it nothing is known of when collectors ran.
    pub fn known_from(&self) -> Option<u64> {
        self.first
    }

    /// Nanoseconds of `[from, to)` within a run.
    pub fn seen(&self, from: u64, to: u64) -> u64 {
        self.runs
            .iter()
            .map(|&(a, b)| b.min(to).saturating_sub(a.max(from)))
            .sum()
    }

    /// The parts of `[from, to)` after [`known_from`](Self::known_from) that no run covers.
    pub fn gaps(&self, from: u64, to: u64) -> Vec<(u64, u64)> {
        let Some(first) = self.first else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut at = from.max(first);
        for &(a, b) in &self.runs {
            if a > at && at < to {
                out.push((at, a.min(to)));
            }
            at = at.max(b);
        }
        if at < to {
            out.push((at, to));
        }
        out
    }
}

/// The [`Runs`] of a store open on `conn` that overlap `[from, to)`.
pub(super) fn read_runs(conn: &Connection, from: u64, to: u64) -> rusqlite::Result<Runs> {
    let first: Option<i64> = conn
        .prepare_cached("SELECT MIN(since) FROM runs")?
        .query_row([], |r| r.get(0))?;
    let mut stmt =
        conn.prepare_cached("SELECT since, through FROM runs WHERE through > ?1 AND since < ?2")?;
    let runs = stmt
        .query_map(params![sql_time(from), sql_time(to)], |r| {
            Ok((unix_time(r.get(0)?), unix_time(r.get(1)?)))
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(Runs::new(runs, first.map(unix_time)))
}

/// The [`DataBounds`] a store open on `conn` holds.
pub(super) fn read_bounds(conn: &Connection) -> rusqlite::Result<DataBounds> {
    let mut kept = conn.prepare_cached("SELECT value FROM meta WHERE key = ?1")?;
    let mut value = |key: &str| -> rusqlite::Result<Option<i64>> {
        kept.query_row([key], |r| r.get(0)).optional()
    };
    let until = value("through")?;
    let since = match value("data_since")? {
        Some(t) => Some(t),
        None => conn
            .prepare_cached("SELECT MIN(minute) FROM rollups")?
            .query_row([], |r| r.get(0))?,
    };
    Ok(DataBounds {
        since: since.map(unix_time),
        until: until.map(unix_time),
    })
}

/// The points of `kpi` over the whole minutes from the one `from` falls in to the one `to`
/// falls in (the store keeps minutes), for the series `filter` merges. Each step's rates
/// divide by the time within it that collectors saw: within [`Runs`], and before the first
/// kept run within [`DataBounds`]. A step without data reads 0 (counts and rates; `None`
/// for percentiles) when a run covers some of it, `None` otherwise.
pub(super) fn query(
    conn: &Connection,
    kpi: KpiPath,
    filter: &HistoryFilter,
    (from_unix_nano, to_unix_nano): (u64, u64),
    (data, runs): (DataBounds, &Runs),
    step: Duration,
) -> rusqlite::Result<Vec<HistoryPoint>> {
    let start = minute_of(from_unix_nano);
    if to_unix_nano <= start {
        return Ok(Vec::new());
    }
    let step = step_nanos(step, to_unix_nano - start);
    let points = usize::try_from((to_unix_nano - start).div_ceil(step)).unwrap_or(usize::MAX);
    let mut steps: Vec<Vec<Accumulator>> = vec![Vec::new(); points];
    let ids: Vec<i64> = {
        let mut stmt = conn.prepare_cached(
            "SELECT id FROM series WHERE (?1 IS NULL OR service = ?1)
               AND (?2 IS NULL OR model = ?2) AND (?3 IS NULL OR operation = ?3)",
        )?;
        let rows = stmt.query_map(
            params![filter.service, filter.model, filter.operation],
            |r| r.get(0),
        )?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut stmt = conn.prepare_cached(
        "SELECT minute, acc FROM rollups WHERE series_id = ?1 AND minute >= ?2 AND minute < ?3",
    )?;
    for id in ids {
        let mut rows = stmt.query(params![id, sql_time(start), sql_time(to_unix_nano)])?;
        while let Some(row) = rows.next()? {
            let minute = unix_time(row.get(0)?);
            let blob = row.get_ref(1)?.as_blob()?;
            let Ok(acc) = Accumulator::decode(blob) else {
                continue;
            };
            let i = usize::try_from((minute.saturating_sub(start)) / step).unwrap_or(usize::MAX);
            if let Some(slot) = steps.get_mut(i) {
                slot.push(acc);
                if slot.len() >= MERGE_BATCH {
                    let merged = merge(std::mem::take(slot));
                    slot.extend(merged);
                }
            }
        }
    }
    let config = sketch_config();
    // Goodput comes from the stored counts; the SLOs only set the disaggregated KPIs' SLO
    // attainment, which no history path reads.
    let slo = SloConfig::default();
    let key = SeriesKey {
        service: Arc::from(filter.service.as_deref().unwrap_or("")),
        model: Arc::from(filter.model.as_deref().unwrap_or("")),
        operation: Arc::from(filter.operation.as_deref().unwrap_or("")),
    };
    Ok(steps
        .into_iter()
        .enumerate()
        .map(|(i, parts)| {
            let t = start + i as u64 * step;
            // The last step holds the whole minute `to` falls in.
            let end = t.saturating_add(step).min(minute_end(to_unix_nano));
            // Runs say what was seen from the first kept one on; before it, the time within
            // the store's data bounds counts (up to `to`, for a store without a commit).
            let runs_from = runs.known_from().map_or(end, |f| f.clamp(t, end));
            let seen = runs.seen(runs_from, end);
            let covered = seen + within_bounds(t, runs_from.min(to_unix_nano), data);
            let kpis = |acc: &Accumulator, seconds: u64| {
                kpi.value(&series_kpis(&config, &slo, &key, acc, seconds as f64 / 1e9))
            };
            let value = match merge(parts) {
                Some(acc) if covered > 0 => kpis(&acc, covered),
                Some(acc) => kpis(&acc, end - t),
                None if seen > 0 => kpis(&Accumulator::default(), covered),
                None => None,
            };
            HistoryPoint {
                t_unix_nano: t,
                value,
            }
        })
        .collect())
}

/// Nanoseconds of `[from, to)` within the store's data bounds.
fn within_bounds(from: u64, to: u64, data: DataBounds) -> u64 {
    let to = data.until.map_or(to, |u| to.min(u));
    let from = data.since.map_or(from, |s| from.max(s));
    to.saturating_sub(from)
}

/// One accumulator from several; `None` from none.
fn merge(mut parts: Vec<Accumulator>) -> Option<Accumulator> {
    if parts.len() <= 1 {
        return parts.pop();
    }
    let refs: Vec<&Accumulator> = parts.iter().collect();
    Some(Accumulator::merge_many(&refs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_and_leave_gaps_only_after_the_first_kept_one() {
        let runs = Runs::new(vec![(50, 60), (10, 20), (15, 30), (40, 40)], Some(10));
        assert_eq!(runs.seen(0, 100), 30);
        assert_eq!(runs.seen(25, 55), 10);
        assert_eq!(runs.gaps(0, 100), [(30, 50), (60, 100)]);
        assert_eq!(runs.gaps(12, 55), [(30, 50)]);
        assert_eq!(runs.gaps(52, 58), []);
        assert!(Runs::new(Vec::new(), None).gaps(0, 100).is_empty());
        // A store without runs: its data is one run; before it nothing is known.
        let earlier = Runs::of_earlier_data(DataBounds {
            since: Some(10),
            until: Some(30),
        });
        assert_eq!(earlier.gaps(0, 50), [(30, 50)]);
        assert!(
            Runs::of_earlier_data(DataBounds::default())
                .gaps(0, 50)
                .is_empty()
        );
    }

    /// What a quiet step (a collector ran, no request) reads: counts and rates 0, the rest
    /// (percentiles, ratios of nothing) `None`.
    #[test]
    fn a_step_without_requests_reads_zero_counts_and_no_percentiles() {
        let quiet = |kpi: &str| {
            let path = parse_kpi(kpi).unwrap();
            let kpis = series_kpis(
                &sketch_config(),
                &SloConfig::default(),
                &SeriesKey {
                    service: Arc::from("s"),
                    model: Arc::from(""),
                    operation: Arc::from(""),
                },
                &Accumulator::default(),
                60.0,
            );
            path.value(&kpis)
        };
        for kpi in [
            "requests",
            "throughput.requests_per_second",
            "throughput.output_tokens_per_second",
            "goodput.requests_per_second",
        ] {
            assert_eq!(quiet(kpi), Some(0.0), "{kpi}");
        }
        for kpi in ["e2e.p99", "ttft.p50", "goodput.ratio", "error_rate"] {
            assert_eq!(quiet(kpi), None, "{kpi}");
        }
    }

    #[test]
    fn steps_are_whole_minutes_and_bounded_in_number() {
        let hour = 3_600_000_000_000;
        assert_eq!(step_nanos(Duration::from_secs(1), hour), MINUTE_NANOS);
        assert_eq!(step_nanos(Duration::from_secs(90), hour), 2 * MINUTE_NANOS);
        assert_eq!(step_nanos(Duration::from_secs(3600), hour), hour);
        // A year at 1-minute steps is widened to at most MAX_HISTORY_POINTS points.
        let year = 365 * 24 * hour;
        let s = step_nanos(Duration::from_secs(60), year);
        assert!(year.div_ceil(s) <= MAX_HISTORY_POINTS);
        assert!(parse_kpi("ttft.p99").is_ok());
        assert!(matches!(
            parse_kpi("ttft.p42"),
            Err(StoreError::UnknownKpi { .. })
        ));
    }
}
