//! `GET /api/traces`: the recently completed requests, slowest (or newest) first, for the
//! dashboard's slow-request list. A click on one opens `GET /api/traces/{trace_id}`.
//!
//! | parameter | meaning | default |
//! |---|---|---|
//! | `limit` | most entries returned (1–[`MAX_LIMIT`]) | [`DEFAULT_LIMIT`] |
//! | `sort` | `slowest` (e2e descending) or `newest` (arrival descending) | `slowest` |
//! | `service`, `model` | keep only that series (empty = any) | any |
//! | `outcome` | `ok`, `error`, `cancelled`, `rejected`, or `failed` (anything but `ok`) | any |
//!
//! The answer is `{"held": N, "traces": [{trace_id, span_id, service, model, operation, outcome,
//! e2e, queue, prefill, ttft, decode, tpot, output_tokens, start_unix_nano}, …]}` where `held`
//! counts the requests of the ring before filtering. Only what the collector still holds in its
//! bounded ring of recent traces (`api.recent_traces`) is listed.

use infertrace_analysis::record::{Outcome, RequestRecord};
use serde::{Deserialize, Serialize};

use crate::pipeline::StoredTrace;

/// Entries returned when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 50;
/// The largest `limit` honoured.
pub const MAX_LIMIT: usize = 500;

/// Where the list comes from: the collector's ring of recently completed traces.
///
/// The pipeline implements it (see the dashboard docs for the wiring); tests can implement it
/// over any set of [`StoredTrace`]s.
pub trait RecentTraceSource: Send + Sync + 'static {
    /// Calls `visit` once for every recently completed trace still held, oldest first.
    fn visit_recent_traces(&self, visit: &mut dyn FnMut(&StoredTrace));
}

impl RecentTraceSource for crate::pipeline::Pipeline {
    fn visit_recent_traces(&self, visit: &mut dyn FnMut(&StoredTrace)) {
        crate::pipeline::Pipeline::visit_recent_traces(self, visit);
    }
}

/// The order of the list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceSort {
    /// Longest e2e first (ties: newest first).
    #[default]
    Slowest,
    /// Latest arrival first.
    Newest,
}

/// Which outcomes to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutcomeFilter {
    /// `ok` only.
    Ok,
    /// `error` only.
    Error,
    /// `cancelled` only.
    Cancelled,
    /// `rejected` only.
    Rejected,
    /// Anything but `ok`.
    Failed,
}

impl OutcomeFilter {
    fn keeps(self, outcome: Outcome) -> bool {
        match self {
            Self::Ok => outcome == Outcome::Ok,
            Self::Error => outcome == Outcome::Error,
            Self::Cancelled => outcome == Outcome::Cancelled,
            Self::Rejected => outcome == Outcome::Rejected,
            Self::Failed => outcome != Outcome::Ok,
        }
    }
}

/// The query string of `GET /api/traces`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TraceListQuery {
    /// Most entries returned (clamped to 1–[`MAX_LIMIT`]).
    pub limit: Option<usize>,
    /// Order.
    #[serde(default)]
    pub sort: TraceSort,
    /// Keep only this service (empty = any).
    pub service: Option<String>,
    /// Keep only this model (empty = any).
    pub model: Option<String>,
    /// Keep only these outcomes.
    pub outcome: Option<OutcomeFilter>,
}

/// One request of the list.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceSummary {
    /// Trace id, hex.
    pub trace_id: String,
    /// The request span's id, hex.
    pub span_id: String,
    /// `service.name`.
    pub service: String,
    /// Model.
    pub model: String,
    /// Operation.
    pub operation: String,
    /// `ok`, `error`, `cancelled` or `rejected`.
    pub outcome: Outcome,
    /// End-to-end latency, seconds.
    pub e2e: f64,
    /// Queue time, seconds.
    pub queue: Option<f64>,
    /// Prefill time, seconds.
    pub prefill: Option<f64>,
    /// Time to first token, seconds.
    pub ttft: Option<f64>,
    /// Decode time, seconds.
    pub decode: Option<f64>,
    /// Time per output token, seconds.
    pub tpot: Option<f64>,
    /// Generated tokens.
    pub output_tokens: Option<u64>,
    /// Arrival, Unix nanoseconds.
    pub start_unix_nano: u64,
}

impl TraceSummary {
    fn of(record: &RequestRecord) -> Self {
        Self {
            trace_id: record.trace_id.to_hex(),
            span_id: record.span_id.to_hex(),
            service: record.service.to_string(),
            model: record.model.to_string(),
            operation: record.operation.to_string(),
            outcome: record.outcome,
            e2e: record.e2e,
            queue: record.queue,
            prefill: record.prefill,
            ttft: record.ttft,
            decode: record.decode,
            tpot: record.tpot,
            output_tokens: record.output_tokens,
            start_unix_nano: record.arrival_unix_nano,
        }
    }
}

/// The answer of `GET /api/traces`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TraceList {
    /// Requests held in the ring before filtering.
    pub held: usize,
    /// The selected requests, in the asked order.
    pub traces: Vec<TraceSummary>,
}

/// Builds the list from a source.
pub fn list_traces(source: &dyn RecentTraceSource, query: &TraceListQuery) -> TraceList {
    let mut held = 0usize;
    let mut kept: Vec<TraceSummary> = Vec::new();
    let service = query.service.as_deref().filter(|s| !s.is_empty());
    let model = query.model.as_deref().filter(|s| !s.is_empty());
    source.visit_recent_traces(&mut |trace| {
        for request in &trace.requests {
            held += 1;
            let r = &request.record;
            if service.is_some_and(|s| s != &*r.service)
                || model.is_some_and(|m| r.model != m)
                || query.outcome.is_some_and(|o| !o.keeps(r.outcome))
            {
                continue;
            }
            kept.push(TraceSummary::of(r));
        }
    });
    let newest_first =
        |a: &TraceSummary, b: &TraceSummary| b.start_unix_nano.cmp(&a.start_unix_nano);
    match query.sort {
        TraceSort::Slowest => kept.sort_by(|a, b| b.e2e.total_cmp(&a.e2e).then(newest_first(a, b))),
        TraceSort::Newest => kept.sort_by(newest_first),
    }
    kept.truncate(query.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT));
    TraceList { held, traces: kept }
}

#[cfg(test)]
mod tests {
    use infertrace_analysis::record::{Dialect, PhaseOrigins};
    use infertrace_analysis::trace::{SpanId, TraceId};

    use super::*;
    use crate::pipeline::StoredRequest;
    use infertrace_analysis::text::Text;

    fn record(id: u8, service: &str, model: &str, outcome: Outcome, e2e: f64) -> RequestRecord {
        RequestRecord {
            trace_id: TraceId([id; 16]),
            span_id: SpanId([id; 8]),
            service: Text::from(service),
            model: model.into(),
            operation: "chat".into(),
            outcome,
            dialect: Dialect::Infertrace,
            arrival_unix_nano: 1_000 * u64::from(id),
            end_unix_nano: 1_000 * u64::from(id) + (e2e * 1e9) as u64,
            e2e,
            queue: Some(e2e / 4.0),
            prefill: None,
            ttft: None,
            decode: None,
            inference: None,
            tpot: None,
            time_to_first_chunk: None,
            itl: None,
            input_tokens: None,
            output_tokens: Some(7),
            stream_chunks: None,
            queue_depth: None,
            gpu: None,
            origins: PhaseOrigins::default(),
            disagg: None,
            cache_read_input_tokens: None,
            preemptions: None,
            lora_adapter: None,
        }
    }

    struct Fixed(Vec<StoredTrace>);

    impl RecentTraceSource for Fixed {
        fn visit_recent_traces(&self, visit: &mut dyn FnMut(&StoredTrace)) {
            self.0.iter().for_each(visit);
        }
    }

    fn source() -> Fixed {
        let specs = [
            (1, "a", "m1", Outcome::Ok, 0.5),
            (2, "a", "m2", Outcome::Error, 0.1),
            (3, "b", "m1", Outcome::Ok, 2.0),
            (4, "a", "m1", Outcome::Cancelled, 0.9),
            (5, "a", "m1", Outcome::Ok, 0.5),
        ];
        Fixed(
            specs
                .into_iter()
                .map(|(id, s, m, o, e)| StoredTrace {
                    trace_id: TraceId([id; 16]),
                    requests: vec![StoredRequest {
                        record: record(id, s, m, o, e),
                        critical_path: None,
                    }],
                    spans: Vec::new(),
                    late_spans: 0,
                    grace_from: None,
                })
                .collect(),
        )
    }

    fn ids(list: &TraceList) -> Vec<String> {
        list.traces
            .iter()
            .map(|t| t.trace_id[..2].to_owned())
            .collect()
    }

    #[test]
    fn slowest_first_ties_newest_first() {
        let list = list_traces(&source(), &TraceListQuery::default());
        assert_eq!(list.held, 5);
        assert_eq!(ids(&list), ["03", "04", "05", "01", "02"]);
        assert_eq!(list.traces[0].e2e, 2.0);
        assert_eq!(list.traces[0].queue, Some(0.5));
        assert_eq!(list.traces[0].start_unix_nano, 3_000);
    }

    #[test]
    fn newest_and_filters_and_limit() {
        let q = TraceListQuery {
            sort: TraceSort::Newest,
            ..TraceListQuery::default()
        };
        assert_eq!(
            ids(&list_traces(&source(), &q)),
            ["05", "04", "03", "02", "01"]
        );
        let q = TraceListQuery {
            service: Some("a".into()),
            model: Some("m1".into()),
            ..TraceListQuery::default()
        };
        assert_eq!(ids(&list_traces(&source(), &q)), ["04", "05", "01"]);
        let q = TraceListQuery {
            outcome: Some(OutcomeFilter::Failed),
            ..TraceListQuery::default()
        };
        assert_eq!(ids(&list_traces(&source(), &q)), ["04", "02"]);
        let q = TraceListQuery {
            limit: Some(2),
            service: Some(String::new()),
            ..TraceListQuery::default()
        };
        let list = list_traces(&source(), &q);
        assert_eq!(ids(&list), ["03", "04"]);
        assert_eq!(list.held, 5);
        let q = TraceListQuery {
            limit: Some(0),
            ..TraceListQuery::default()
        };
        assert_eq!(
            list_traces(&source(), &q).traces.len(),
            1,
            "limit clamps to 1"
        );
    }

    #[test]
    fn query_parses() {
        let q: TraceListQuery =
            serde_json::from_value(serde_json::json!({"sort": "newest", "outcome": "failed"}))
                .unwrap();
        assert_eq!(q.sort, TraceSort::Newest);
        assert_eq!(q.outcome, Some(OutcomeFilter::Failed));
    }
}
