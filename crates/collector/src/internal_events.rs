//! The collector's self-metrics, in one place (after Vector's `internal_events`): every refusal,
//! drop and export is counted here, so nothing is dropped silently and every component counts the
//! same way. Each helper that records an event also logs it where a log line helps.

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
    /// `max_spans_per_trace`, `max_traces_in_flight`, `forward_backpressure` (refused: the
    /// forward queue was full), `forward_failed`, `forward_rejected`.
    pub reason: &'static str,
}

/// Labels of `forward_attempts_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    /// `ok`, `timeout` (no answer within `forward.timeout`), `retryable` (e.g. connection
    /// refused, gRPC `UNAVAILABLE`, HTTP 503) or `permanent` (e.g. HTTP 400).
    pub outcome: &'static str,
}

/// Labels of `exported_spans_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExportLabels {
    /// Exporter name, e.g. `otlp_forward`.
    pub exporter: &'static str,
    /// `ok` or `failed`.
    pub outcome: &'static str,
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
    /// `infertrace_forward_attempts_total{outcome}`: export calls to the forward downstream.
    pub forward_attempts: Family<AttemptLabels, Counter>,
    /// `infertrace_forward_pending_spans`: spans accepted for forwarding, not yet exported or
    /// given up.
    pub forward_pending_spans: Gauge,
    /// `infertrace_forward_pending_bytes`: their request-body bytes.
    pub forward_pending_bytes: Gauge,
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
            prom::FORWARD_ATTEMPTS,
            "Export calls to the forward downstream, by outcome",
            self.forward_attempts.clone(),
        );
        r.register(
            prom::FORWARD_PENDING_SPANS,
            "Spans accepted for forwarding and not yet exported or given up",
            self.forward_pending_spans.clone(),
        );
        r.register(
            prom::FORWARD_PENDING_BYTES,
            "Request-body bytes of the spans pending forwarding",
            self.forward_pending_bytes.clone(),
        );
    }

    /// Counts one export call to the forward downstream that ended with `outcome`.
    pub fn forward_attempt(&self, outcome: &'static str) {
        self.forward_attempts
            .get_or_create(&AttemptLabels { outcome })
            .inc();
    }

    /// The number of forward attempts that ended with `outcome` so far.
    pub fn forward_attempts(&self, outcome: &'static str) -> u64 {
        self.forward_attempts
            .get_or_create(&AttemptLabels { outcome })
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

/// Shortest interval between two warn-level lines for the same reason.
pub const WARN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether a warn-level line for `reason` may be logged now: at most one per reason per
/// [`WARN_INTERVAL`], so that a refusal or drop repeated thousands of times a second logs a line
/// every 10 s (its counter counts every one).
pub fn warn_allowed(reason: &'static str) -> bool {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    use std::time::Instant;
    static LAST: OnceLock<Mutex<HashMap<&'static str, Instant>>> = OnceLock::new();
    let mut last = LAST
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    match last.get(reason) {
        Some(t) if now.duration_since(*t) < WARN_INTERVAL => false,
        _ => {
            last.insert(reason, now);
            true
        }
    }
}
