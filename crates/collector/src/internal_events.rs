//! The collector's self-metrics, in one place (after Vector's `internal_events`): every refusal,
//! drop and export is counted here, so nothing is dropped silently and every component counts the
//! same way. Each helper that records an event also logs it where a log line helps.

use std::collections::HashMap;
use std::sync::Mutex;
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

/// Labels of `connections_open` and `connections_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    /// `otlp_grpc`, `otlp_http` or `api`.
    pub listener: &'static str,
}

/// Labels of `connections_closed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionCloseLabels {
    /// `otlp_grpc`, `otlp_http` or `api`.
    pub listener: &'static str,
    /// `idle_timeout`, `header_timeout`, `keepalive_timeout`, `tls_handshake` or `shutdown`.
    pub reason: &'static str,
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
    /// `infertrace_connections_open{listener}`.
    pub connections_open: Family<ListenerLabels, Gauge>,
    /// `infertrace_connections_refused_total{listener}`: connections closed at once because the
    /// listener held its `connections.max`.
    pub connections_refused: Family<ListenerLabels, Counter>,
    /// `infertrace_connections_closed_total{listener,reason}`: connections the collector closed.
    pub connections_closed: Family<ConnectionCloseLabels, Counter>,
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
            prom::CONNECTIONS_OPEN,
            "Connections open, by listener",
            self.connections_open.clone(),
        );
        r.register(
            prom::CONNECTIONS_REFUSED,
            "Connections closed at once because the listener held its connections.max",
            self.connections_refused.clone(),
        );
        r.register(
            prom::CONNECTIONS_CLOSED,
            "Connections closed by the collector, by listener and reason",
            self.connections_closed.clone(),
        );
    }

    /// Counts a connection refused by `listener` (over its `max` open connections), and logs
    /// it at warn level (rate-limited).
    pub fn connection_refused(&self, listener: &'static str, max: usize) {
        self.connections_refused
            .get_or_create(&ListenerLabels { listener })
            .inc();
        if log_allowed("connection_refused", listener) {
            tracing::warn!(
                listener,
                max,
                "connection refused: the listener holds its connections.max open connections; \
                 raise connections.max or look for idle or stuck clients"
            );
        }
    }

    /// Counts a connection `listener` closed for `reason` (`idle_timeout`, `header_timeout`,
    /// `keepalive_timeout`, `tls_handshake`, `shutdown`), and logs it at warn level (rate-limited) except for idle
    /// timeouts, which are ordinary.
    pub fn connection_closed(&self, listener: &'static str, reason: &'static str) {
        self.connections_closed
            .get_or_create(&ConnectionCloseLabels { listener, reason })
            .inc();
        if reason != "idle_timeout" && log_allowed(reason, listener) {
            tracing::warn!(listener, reason, "connection closed by the collector");
        }
    }

    /// The gauge of `listener`'s open connections.
    pub fn connections_open_gauge(&self, listener: &'static str) -> Gauge {
        self.connections_open
            .get_or_create(&ListenerLabels { listener })
            .clone()
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

/// How often one (reason, subject) pair may log a warn line.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Whether a warn line for `reason` about `subject` may be logged now: at most one per
/// [`LOG_INTERVAL`] per pair, so a flood of refusals costs a counter increment, not a log line.
pub fn log_allowed(reason: &'static str, subject: &'static str) -> bool {
    static LAST: Mutex<Option<HashMap<(&'static str, &'static str), Instant>>> = Mutex::new(None);
    let now = Instant::now();
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    let map = last.get_or_insert_with(HashMap::new);
    match map.get(&(reason, subject)) {
        Some(t) if now.duration_since(*t) < LOG_INTERVAL => false,
        _ => {
            map.insert((reason, subject), now);
            true
        }
    }
}
