//! The history routes, served from the embedded store ([`crate::store`]):
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/history?kpi=ttft.p99&service=&model=&operation=&from=-1h&to=now&step=60` | `{"kpi","from","to","step_seconds","points":[[unix_seconds, value_or_null], …]}` |
//! | `GET /api/history/slow-requests?from=&to=&limit=50` | `{"from","to","requests":[…]}`: the slowest and failed requests kept, slowest first |
//! | `GET /api/history/alerts?from=&to=` | `{"from","to","events":[{"t_unix_nano","body"}…]}`: alert transitions |
//! | `GET /api/history/findings?from=&to=` | `{"from","to","events":[…]}`: findings stored once a minute |
//!
//! **Times** (`from`, `to`): Unix seconds (`1767225600`, fractions allowed), `now`, or relative
//! to now: `-1h`, `now-90m`, `-30s`, `-3600` (humantime units; a bare number is seconds). Defaults: `to=now`, `from=to-1h`.
//! `from` and `to` in the answers are Unix seconds.
//!
//! **Step**: seconds (`60`) or a duration (`5m`); rounded up to whole minutes (the store keeps
//! minutes) and widened so that one answer has at most 20,000 points. Default `60`. Each point
//! merges the step's minutes (a `ttft.p99` point is the p99 of every request of the step),
//! from the minute `from` falls in through the one `to` falls in (whole minutes: a `to`
//! inside a minute takes all of that minute the store holds). When no stored series in the
//! range matches the `service`/`model`/`operation` asked for, a `"note"` says so and lists
//! those that have data.
//!
//! **What rates divide by.** Rates (`throughput.*`, `goodput.requests_per_second`) divide by
//! the time within the step that a collector ran, up to the last commit:
//! - The store lags the collector by a flush interval, a hand-over and the KPI second still
//!   open (up to ~7 s at the defaults): when `to` is past what it has committed,
//!   `"data_until"` (Unix seconds) says where its data ends.
//! - `"data_since"` says where its data begins, when after the first step's start (a store
//!   younger than the range; also at or after `to`: the range then holds none of its data).
//! - Time when no collector ran (between a stop and the next start) is left out, and
//!   `"unseen_seconds"` says how much there was.
//!
//! A step in which a collector ran but no request matched reads 0 (counts and rates; `null`
//! for percentiles and ratios); a step no collector saw reads `null`, and so does a step
//! wholly past the last commit (not yet committed: at the defaults, the current minute for
//! its first few seconds). All of it is read with the minutes, in one read transaction.
//!
//! `kpi` is a dotted path as in `/api/kpis` and alert rules (`e2e.p50`, `requests`,
//! `goodput.ratio`, `phase_share.all.queue`, …); an unknown one is a 400. Without a store
//! (`--no-store`) every history route answers 404 saying so. Reads run on the blocking pool.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use infertrace_analysis::kpi::SeriesKey;
use serde::Deserialize;
use serde_json::{Value, json};

use super::state::{ApiState, error};
use crate::duration::parse_duration;
use crate::store::{
    HistoryFilter, HistoryRead, MINUTE_NANOS, Store, StoreError, minute_end, minute_of,
    unix_nanos_now,
};

/// Default range of a history query.
const DEFAULT_RANGE: Duration = Duration::from_secs(3600);
/// Default number of requests of `/api/history/slow-requests`.
const DEFAULT_LIMIT: usize = 50;
/// Most requests one `/api/history/slow-requests` answer lists.
const MAX_LIMIT: usize = 1000;

/// Query of `GET /api/history`.
#[derive(Debug, Default, Deserialize)]
pub struct HistoryQuery {
    /// KPI path, e.g. `ttft.p99`.
    pub kpi: Option<String>,
    /// Only this service.
    pub service: Option<String>,
    /// Only this model.
    pub model: Option<String>,
    /// Only this operation.
    pub operation: Option<String>,
    /// Start (see the module docs).
    pub from: Option<String>,
    /// End (see the module docs).
    pub to: Option<String>,
    /// Step, seconds or a duration.
    pub step: Option<String>,
}

/// Query of the other history routes.
#[derive(Debug, Default, Deserialize)]
pub struct RangeQuery {
    /// Start (see the module docs).
    pub from: Option<String>,
    /// End (see the module docs).
    pub to: Option<String>,
    /// Most rows (slow requests only).
    pub limit: Option<usize>,
}

/// Parses one time of a history query as Unix nanoseconds: Unix seconds, `now`, `-1h` or
/// `now-1h`.
pub fn parse_time(s: &str, now_unix_nano: u64) -> Result<u64, String> {
    let t = s.trim();
    if t == "now" {
        return Ok(now_unix_nano);
    }
    let relative = t.strip_prefix("now-").or_else(|| t.strip_prefix('-'));
    if let Some(ago) = relative {
        // A bare number counts seconds: `-3600` is `-1h`.
        let d = match ago.parse::<f64>() {
            Ok(secs) => {
                Duration::try_from_secs_f64(secs).map_err(|e| format!("time {s:?}: {e}"))?
            }
            Err(_) => parse_duration(ago).map_err(|e| format!("time {s:?}: {e}"))?,
        };
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        return Ok(now_unix_nano.saturating_sub(nanos));
    }
    match t.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 && secs * 1e9 < u64::MAX as f64 => {
            Ok((secs * 1e9) as u64)
        }
        Ok(secs) if secs > 0.0 => Err(format!(
            "time {s:?} is too far ahead: Unix seconds go up to {} here",
            u64::MAX / 1_000_000_000
        )),
        _ => Err(format!(
            "time {s:?} is neither Unix seconds nor relative to now; write e.g. 1767225600, \
             now, -1h or now-30m"
        )),
    }
}

/// Parses `step`: seconds (`60`) or a duration (`5m`).
pub fn parse_step(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if let Ok(secs) = t.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("step {s:?} must be a positive number of seconds"));
    }
    parse_duration(t).map_err(|e| format!("step {s:?}: {e}"))
}

/// The `[from, to)` range of a query, Unix nanoseconds, with the defaults applied.
pub fn parse_range(from: Option<&str>, to: Option<&str>, now: u64) -> Result<(u64, u64), String> {
    let to = to.map_or(Ok(now), |t| parse_time(t, now))?;
    let default_from = to.saturating_sub(DEFAULT_RANGE.as_nanos() as u64);
    let from = from.map_or(Ok(default_from), |f| parse_time(f, now))?;
    if from >= to {
        return Err("from must be before to".into());
    }
    Ok((from, to))
}

fn secs(unix_nano: u64) -> f64 {
    unix_nano as f64 / 1e9
}

fn no_store() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no history: this collector runs without its history store (`collect --no-store`, \
         store.enabled: false, or `infertrace demo`, which keeps none); `infertrace collect` \
         keeps it under store.data_dir (or --data-dir PATH)",
    )
}

fn store_error(e: StoreError) -> Response {
    match e {
        StoreError::UnknownKpi { .. } => error(StatusCode::BAD_REQUEST, e.to_string()),
        _ => {
            // The store failing a read (a damaged file, a full disk) is the operator's to see,
            // not only the API client's; a polling dashboard must not flood the log with it.
            if crate::internal_events::warn_allowed("history_read_failed") {
                tracing::error!(error = %e, "history store read failed; the API answered 500");
            }
            error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
    }
}

/// Runs a blocking store read on the blocking pool.
async fn read<T: Send + 'static>(
    store: &Store,
    f: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Response> {
    let store = store.clone();
    match tokio::task::spawn_blocking(move || f(&store)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(store_error(e)),
        Err(e) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("history read failed: {e}"),
        )),
    }
}

fn nonempty(s: Option<String>) -> Option<String> {
    s.filter(|v| !v.is_empty())
}

/// `GET /api/history`.
pub(super) async fn history(
    State(s): State<Arc<ApiState>>,
    Query(q): Query<HistoryQuery>,
) -> Response {
    let Some(store) = &s.store else {
        return no_store();
    };
    let Some(kpi) = nonempty(q.kpi) else {
        return error(
            StatusCode::BAD_REQUEST,
            "kpi is required, e.g. /api/history?kpi=ttft.p99&from=-1h",
        );
    };
    let (from, to) = match parse_range(q.from.as_deref(), q.to.as_deref(), unix_nanos_now()) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let step = match q.step.as_deref().map(parse_step).transpose() {
        Ok(s) => s.unwrap_or(Duration::from_secs(60)),
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let filter = HistoryFilter {
        service: nonempty(q.service),
        model: nonempty(q.model),
        operation: nonempty(q.operation),
    };
    let name = kpi.clone();
    let asked = filter.clone();
    let HistoryRead {
        points,
        bounds: data,
        runs,
    } = match read(store, move |st| {
        st.history_within(&kpi, &filter, from, to, step)
    })
    .await
    {
        Ok(p) => p,
        Err(r) => return r,
    };
    let mut note = None;
    // No value but 0 (a minute a collector saw without a match) or null: is it a quiet
    // series or one that is not there?
    if !asked.is_empty() && points.iter().all(|p| p.value.is_none_or(|v| v == 0.0)) {
        // From the minute `from` falls in, as the history query counts it.
        match read(store, move |st| st.series(minute_of(from), to)).await {
            Ok(series) => note = no_match_note(&asked, &series),
            Err(r) => return r,
        }
    }
    let asked_minutes = (step.as_nanos() as u64).div_ceil(MINUTE_NANOS).max(1);
    let step_nanos = match points.as_slice() {
        [a, b, ..] => b.t_unix_nano - a.t_unix_nano,
        _ => asked_minutes * MINUTE_NANOS,
    };
    let first = points.first().map(|p| p.t_unix_nano);
    let points: Vec<Value> = points
        .iter()
        .map(|p| json!([secs(p.t_unix_nano), p.value]))
        .collect();
    let mut answer = json!({
        "kpi": name,
        "from": secs(from),
        "to": secs(to),
        "step_seconds": secs(step_nanos),
        "points": points,
    });
    // What the rates divided by: where the store's data begins after the range's first
    // minute (at or past `to` too: the range then holds none of it) or ends before `to`.
    let after_first = |t: &u64| first.is_some_and(|f| *t > f);
    let inside = |t: &u64| after_first(t) && *t < to;
    if let Some(since) = data.since.filter(after_first) {
        answer["data_since"] = json!(secs(since));
    }
    if let Some(until) = data.until.filter(inside) {
        answer["data_until"] = json!(secs(until));
    }
    // Time within the data no collector saw (it stopped, then started again).
    if let Some(first) = first {
        let from = data.since.map_or(first, |s| s.max(first));
        let to = data.until.map_or(to, |u| u.min(minute_end(to)));
        let unseen: u64 = runs.gaps(from, to).iter().map(|(a, b)| b - a).sum();
        if unseen > 0 {
            answer["unseen_seconds"] = json!(secs(unseen));
        }
    }
    if let Some(note) = note {
        answer["note"] = Value::String(note);
    }
    Json(answer).into_response()
}

/// Most series a note lists.
const NOTE_SERIES: usize = 20;

/// When no stored series in the range matches the filter (a misspelt model, say), says so and
/// lists the series that do have data, so an answer of zeros and `null`s is not mistaken for
/// a quiet series.
fn no_match_note(filter: &HistoryFilter, series: &[SeriesKey]) -> Option<String> {
    if series.iter().any(|k| filter.matches(k)) {
        return None;
    }
    let asked: Vec<String> = [
        ("service", &filter.service),
        ("model", &filter.model),
        ("operation", &filter.operation),
    ]
    .iter()
    .filter_map(|(label, v)| v.as_deref().map(|v| format!("{label}={v}")))
    .collect();
    let known: Vec<String> = series
        .iter()
        .take(NOTE_SERIES)
        .map(|k| format!("{}/{}/{}", k.service, k.model, k.operation))
        .collect();
    let asked = asked.join(", ");
    if known.is_empty() {
        return Some(format!("no series has data in this range (asked {asked})"));
    }
    let more = match series.len().saturating_sub(NOTE_SERIES) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    Some(format!(
        "no series matches {asked} in this range; series with data \
         (service/model/operation): {}{more}",
        known.join(", ")
    ))
}

/// `GET /api/history/slow-requests`.
pub(super) async fn slow_requests(
    State(s): State<Arc<ApiState>>,
    Query(q): Query<RangeQuery>,
) -> Response {
    let Some(store) = &s.store else {
        return no_store();
    };
    let (from, to) = match parse_range(q.from.as_deref(), q.to.as_deref(), unix_nanos_now()) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT);
    match read(store, move |st| st.slow_requests(from, to, limit)).await {
        Ok(rows) => {
            Json(json!({"from": secs(from), "to": secs(to), "requests": rows})).into_response()
        }
        Err(r) => r,
    }
}

/// `GET /api/history/alerts`.
pub(super) async fn alerts(
    State(s): State<Arc<ApiState>>,
    Query(q): Query<RangeQuery>,
) -> Response {
    events(&s, q, Store::alert_history).await
}

/// `GET /api/history/findings`.
pub(super) async fn findings(
    State(s): State<Arc<ApiState>>,
    Query(q): Query<RangeQuery>,
) -> Response {
    events(&s, q, Store::findings).await
}

async fn events(
    s: &ApiState,
    q: RangeQuery,
    get: fn(&Store, u64, u64) -> Result<Vec<crate::store::StoredEvent>, StoreError>,
) -> Response {
    let Some(store) = &s.store else {
        return no_store();
    };
    let (from, to) = match parse_range(q.from.as_deref(), q.to.as_deref(), unix_nanos_now()) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match read(store, move |st| get(st, from, to)).await {
        Ok(events) => {
            Json(json!({"from": secs(from), "to": secs(to), "events": events})).into_response()
        }
        Err(r) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_767_225_600_000_000_000;

    #[test]
    fn times_parse() {
        assert_eq!(parse_time("now", NOW), Ok(NOW));
        assert_eq!(parse_time("-1h", NOW), Ok(NOW - 3_600_000_000_000));
        assert_eq!(parse_time("now-90s", NOW), Ok(NOW - 90_000_000_000));
        assert_eq!(parse_time("-3600", NOW), Ok(NOW - 3_600_000_000_000));
        assert_eq!(parse_time("1767225600", NOW), Ok(NOW));
        assert_eq!(parse_time("1767225600.5", NOW), Ok(NOW + 500_000_000));
        assert!(parse_time("yesterday", NOW).is_err());
        assert!(parse_time("-1 fortnight", NOW).is_err());
        // Past what Unix nanoseconds hold: said so, not clamped into "from must be before to".
        let far = parse_time("1e11", NOW).unwrap_err();
        assert!(far.contains("too far ahead"), "{far}");
        assert!(parse_time("18446744073", NOW).is_ok());
    }

    #[test]
    fn ranges_default_to_the_last_hour() {
        assert_eq!(
            parse_range(None, None, NOW),
            Ok((NOW - 3_600_000_000_000, NOW))
        );
        assert_eq!(
            parse_range(Some("-2h"), Some("-1h"), NOW),
            Ok((NOW - 7_200_000_000_000, NOW - 3_600_000_000_000))
        );
        assert!(parse_range(Some("now"), Some("-1h"), NOW).is_err());
    }

    #[test]
    fn steps_parse() {
        assert_eq!(parse_step("60"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_step("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_step("-3").is_err());
        assert!(parse_step("often").is_err());
    }
}
