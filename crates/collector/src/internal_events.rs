//! The collector's self-metrics, in one place (after Vector's `internal_events`): every refusal,
//! drop and export is counted here, so nothing is dropped silently and every component counts the
//! same way. Each helper that records an event also logs it where a log line helps.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use infertrace_semconv::prom;

/// Labels of `receiver_spans_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReceiverLabels {
    /// `otlp_grpc` or `otlp_http`.
    pub receiver: &'static str,
    /// `accepted`, `rejected` (invalid spans) or `refused` (whole request refused).
    pub outcome: &'static str,
}

/// Labels of `dropped_spans_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// Why: e.g. `invalid_span`, `decode_error`, `too_large`, `memory_limit`,
    /// `max_spans_per_trace`, `max_traces_in_flight`, `forward_queue_full`, `forward_failed`.
    pub reason: &'static str,
}

/// Labels of `exported_spans_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExportLabels {
    /// Exporter name, e.g. `otlp_forward`.
    pub exporter: &'static str,
    /// `ok` or `failed`.
    pub outcome: &'static str,
}

/// Labels of `auth_failures_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthFailureLabels {
    /// `otlp_grpc`, `otlp_http` or `api`.
    pub listener: &'static str,
    /// `missing_token`, `unknown_token`, `insufficient_scope` or `host_not_allowed`.
    pub reason: &'static str,
}

/// How often one kind of warning may be logged: at most one line per key per interval.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Rate limit for warnings that a client can trigger at will (refusals): at most one line per
/// key per [`LOG_INTERVAL`], the line saying how many were suppressed since the last one, so a
/// flood of bad requests cannot flood the log. Cheap to clone (shared state).
#[derive(Clone, Debug, Default)]
pub struct LogLimiter {
    last: Arc<Mutex<Vec<LastLine>>>,
}

/// When a key was last logged, and how many lines were held back since.
type LastLine = (&'static str, Instant, u64);

impl LogLimiter {
    /// `Some(suppressed)` when a line for `key` may be logged now (with how many were held back
    /// since the previous one), `None` when it must be held back.
    pub fn admit(&self, key: &'static str) -> Option<u64> {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match last.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, at, suppressed)) => {
                if now.duration_since(*at) >= LOG_INTERVAL {
                    *at = now;
                    Some(std::mem::take(suppressed))
                } else {
                    *suppressed += 1;
                    None
                }
            }
            None => {
                last.push((key, now, 0));
                Some(0)
            }
        }
    }
}

/// Every self-metric of the collector. Cheap to clone (counters are `Arc`s inside).
#[derive(Clone, Debug, Default)]
pub struct InternalEvents {
    /// `infertrace_receiver_spans_total{receiver,outcome}`.
    pub receiver_spans: Family<ReceiverLabels, Counter>,
    /// `infertrace_dropped_spans_total{reason}`.
    pub dropped_spans: Family<DropLabels, Counter>,
    /// `infertrace_traces_in_flight`.
    pub traces_in_flight: Gauge,
    /// `infertrace_late_spans_total`.
    pub late_spans: Counter,
    /// `infertrace_exported_spans_total{exporter,outcome}`.
    pub exported_spans: Family<ExportLabels, Counter>,
    /// `infertrace_series_overflow_total`.
    pub series_overflow: Counter,
    /// `infertrace_store_writes_total`: rows written to the history store.
    pub store_writes: Counter,
    /// `infertrace_store_dropped_total{reason}`: history-store items dropped.
    pub store_dropped: Family<DropLabels, Counter>,
    /// `infertrace_recent_traces_not_kept_total`: traces analysed but not kept for
    /// `/api/traces/{id}` (the recent-trace ring's admission rate was used up).
    pub recent_traces_not_kept: Counter,
    /// `infertrace_auth_failures_total{listener,reason}`: requests refused by authentication or
    /// the API's Host allowlist.
    pub auth_failures: Family<AuthFailureLabels, Counter>,
    /// Rate limit of the refusal warnings.
    pub log_limiter: LogLimiter,
}

impl InternalEvents {
    /// Registers every self-metric under the `infertrace_` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix(prom::PREFIX);
        r.register(
            prom::RECEIVER_SPANS,
            "Spans received, by receiver and outcome",
            self.receiver_spans.clone(),
        );
        r.register(
            prom::DROPPED_SPANS,
            "Spans dropped or refused, by reason",
            self.dropped_spans.clone(),
        );
        r.register(
            prom::TRACES_IN_FLIGHT,
            "Traces being assembled",
            self.traces_in_flight.clone(),
        );
        r.register(
            prom::LATE_SPANS,
            "Spans that arrived after their trace was completed",
            self.late_spans.clone(),
        );
        r.register(
            prom::EXPORTED_SPANS,
            "Spans exported, by exporter and outcome",
            self.exported_spans.clone(),
        );
        r.register(
            prom::SERIES_OVERFLOW,
            "KPI series refused by the cardinality cap",
            self.series_overflow.clone(),
        );
        r.register(
            prom::STORE_WRITES,
            "Rows written to the history store",
            self.store_writes.clone(),
        );
        r.register(
            prom::STORE_DROPPED,
            "History-store items dropped, by reason",
            self.store_dropped.clone(),
        );
        r.register(
            prom::RECENT_TRACES_NOT_KEPT,
            "Completed traces analysed but not kept in the recent-trace ring",
            self.recent_traces_not_kept.clone(),
        );
        r.register(
            prom::AUTH_FAILURES,
            "Requests refused by authentication or the Host allowlist, by listener and reason",
            self.auth_failures.clone(),
        );
    }

    /// Counts a request refused on `listener` for `reason` (see [`AuthFailureLabels`]) and logs
    /// it at warn level, at most once per reason per [`LOG_INTERVAL`]. Never logs a token.
    pub fn auth_refused(&self, listener: &'static str, reason: &'static str) {
        self.auth_failures
            .get_or_create(&AuthFailureLabels { listener, reason })
            .inc();
        if let Some(suppressed) = self.log_limiter.admit(reason) {
            tracing::warn!(
                listener,
                reason,
                suppressed,
                "request refused (infertrace_auth_failures_total counts them all)"
            );
        }
    }

    /// The number of requests refused on `listener` for `reason` so far (for tests).
    pub fn auth_refusals(&self, listener: &'static str, reason: &'static str) -> u64 {
        self.auth_failures
            .get_or_create(&AuthFailureLabels { listener, reason })
            .get()
    }

    /// Counts `n` history-store items dropped for `reason` (`queue_full`, `write_failed`),
    /// and logs it at warn level.
    pub fn store_items_dropped(&self, reason: &'static str, n: u64) {
        if n > 0 {
            tracing::warn!(reason, n, "history store items dropped");
            self.store_dropped
                .get_or_create(&DropLabels { reason })
                .inc_by(n);
        }
    }

    /// Counts `n` spans received by `receiver` with `outcome`.
    pub fn spans_received(&self, receiver: &'static str, outcome: &'static str, n: u64) {
        self.receiver_spans
            .get_or_create(&ReceiverLabels { receiver, outcome })
            .inc_by(n);
    }

    /// Counts `n` spans dropped for `reason`, and logs it at debug level.
    pub fn spans_dropped(&self, reason: &'static str, n: u64) {
        if n > 0 {
            tracing::debug!(reason, n, "spans dropped");
            self.dropped_spans
                .get_or_create(&DropLabels { reason })
                .inc_by(n);
        }
    }

    /// Counts `n` spans exported by `exporter` with `outcome`.
    pub fn spans_exported(&self, exporter: &'static str, outcome: &'static str, n: u64) {
        self.exported_spans
            .get_or_create(&ExportLabels { exporter, outcome })
            .inc_by(n);
    }

    /// The number of spans dropped for `reason` so far (for tests and reports).
    pub fn dropped(&self, reason: &'static str) -> u64 {
        self.dropped_spans
            .get_or_create(&DropLabels { reason })
            .get()
    }
}
