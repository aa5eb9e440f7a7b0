//! KPI history: merge the stored minute accumulators of each step, then read one KPI.

use std::sync::Arc;
use std::time::Duration;

use infertrace_analysis::alert::KpiPath;
use infertrace_analysis::kpi::{Accumulator, SeriesKey, SloConfig, series_kpis, sketch_config};
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::time::{MINUTE_NANOS, minute_of, sql_time, unix_time};

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
    /// The KPI over the step; `None` when the step holds no data for it.
    pub value: Option<f64>,
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

pub(super) fn query(
    conn: &Connection,
    kpi: KpiPath,
    filter: &HistoryFilter,
    (from_unix_nano, to_unix_nano): (u64, u64),
    data: DataBounds,
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
            // A step reaching past the store's data holds data within it only.
            let end = (t + step).min(to_unix_nano);
            let end = data.until.filter(|&u| u > t).map_or(end, |u| end.min(u));
            let begin = data.since.map_or(t, |s| s.max(t).min(end));
            let covered = if begin < end { end - begin } else { end - t };
            let value = merge(parts).and_then(|acc| {
                kpi.value(&series_kpis(
                    &config,
                    &slo,
                    &key,
                    &acc,
                    covered as f64 / 1e9,
                ))
            });
            HistoryPoint {
                t_unix_nano: t,
                value,
            }
        })
        .collect())
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
