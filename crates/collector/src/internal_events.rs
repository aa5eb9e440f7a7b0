//! The collector's self-metrics, in one place (after Vector's `internal_events`): every refusal,
//! drop and export is counted here, so nothing is dropped silently and every component counts the
//! same way. Each helper that records an event also logs it where a log line helps; refusals
//! and early closes log at warn level, at most once per [`LOG_INTERVAL`] per kind, with the
//! count since the last line.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Why: e.g. `invalid_span`, `decode_error`, `too_large`, `memory_limit`, `sender_share`,
    /// `max_spans_per_trace`, `max_traces_in_flight`, `forward_backpressure` (refused: the
    /// forward queue was full), `forward_share` (refused: the sender held its share of a nearly
    /// full forward queue), `forward_failed`, `forward_rejected`.
    pub reason: &'static str,
}

/// Labels of `traces_closed_early_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CloseEarlyLabels {
    /// Why: `max_traces_in_flight` (a new trace found the table full) or `memory` (the memory
    /// limiter passed its soft limit: buffered traces give way before requests are refused).
    pub reason: &'static str,
}

/// Labels of `requests_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// `otlp_grpc` or `otlp_http`.
    pub receiver: &'static str,
    /// Why: `memory_limit`, `sender_share` (a sender over its share of a nearly full memory
    /// limit), `body_timeout`, `too_large`, `shutting_down`, ...
    pub reason: &'static str,
}

/// The listeners, as the `listener` label names them.
const LISTENERS: [&str; 3] = ["otlp_grpc", "otlp_http", "api"];

/// Why a whole request is refused before anything of it is accepted (`requests_refused_total`;
/// its spans, or 1 when they are not known yet, also count in `dropped_spans_total`).
const REFUSAL_REASONS: &[&str] = &[
    "unsupported_content",
    "decode_error",
    "too_large",
    "too_large_for_memory",
    "body_timeout",
    "body_broken",
    "memory_limit",
    "sender_share",
    "forward_backpressure",
    "forward_share",
    "shutting_down",
];

/// Why spans are dropped other than with their whole request (`dropped_spans_total`).
const DROP_REASONS: &[&str] = &[
    "invalid_span",
    "max_spans_per_trace",
    "max_traces_in_flight",
    "late_span_buffer_full",
    "forward_no_body",
    "forward_failed",
    "forward_rejected",
];

/// Why the collector closes a connection (`connections_closed_total`).
const CLOSE_REASONS: &[&str] = &[
    "idle_timeout",
    "header_timeout",
    "send_timeout",
    "keepalive_timeout",
    "tls_handshake",
    "refused",
    "shutdown",
];

/// Shortest time between two warn lines of one kind.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// A warn line at most once per [`LOG_INTERVAL`], carrying how many events it stands for.
#[derive(Debug, Default)]
pub struct RateLimitedLog {
    /// Milliseconds since [`log_epoch`] before which no line is written.
    next_ms: AtomicU64,
    /// Events since the last line.
    pending: AtomicU64,
}

/// The instant the rate-limited logs count from.
fn log_epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl RateLimitedLog {
    /// Notes `n` events; returns how many events the line to write now stands for, or `None`
    /// when a line was written less than [`LOG_INTERVAL`] ago.
    pub fn note(&self, n: u64) -> Option<u64> {
        self.pending.fetch_add(n, Ordering::Relaxed);
        self.due()
    }

    /// How many events were noted since the last line, once [`LOG_INTERVAL`] has passed since
    /// it (`None` before, or when there were none): the end of a burst, which
    /// [`note`](Self::note) leaves unsaid until the next event, is said by a periodic call of
    /// this.
    pub fn due(&self) -> Option<u64> {
        if self.pending.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let now = log_epoch().elapsed().as_millis() as u64;
        let next = self.next_ms.load(Ordering::Relaxed);
        if now < next {
            return None;
        }
        let until = now + LOG_INTERVAL.as_millis() as u64;
        self.next_ms
            .compare_exchange(next, until, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        let n = self.pending.swap(0, Ordering::Relaxed);
        (n > 0).then_some(n)
    }

    /// Every event noted since the last line, whatever the interval (`None` when none): for the
    /// last line before the process exits.
    pub fn take(&self) -> Option<u64> {
        let n = self.pending.swap(0, Ordering::Relaxed);
        (n > 0).then_some(n)
    }
}

/// One [`RateLimitedLog`] per kind of event that warns.
#[derive(Debug, Default)]
struct Logs {
    /// Per reason: one reason's count is never read as another's.
    dropped: std::sync::Mutex<Vec<(&'static str, Arc<RateLimitedLog>)>>,
    refused: RateLimitedLog,
    closed_early: RateLimitedLog,
    truncated: RateLimitedLog,
    implausible: RateLimitedLog,
    reclaimed: RateLimitedLog,
    connections_refused: RateLimitedLog,
    accept_errors: RateLimitedLog,
    connections_closed: RateLimitedLog,
    auth_refused: RateLimitedLog,
    aggregates: RateLimitedLog,
    returning_memory: RateLimitedLog,
    store_dropped: RateLimitedLog,
    reopened: RateLimitedLog,
}

impl Logs {
    /// The drop log of `reason` (made on first use).
    fn dropped_log(&self, reason: &'static str) -> Arc<RateLimitedLog> {
        let mut logs = self.dropped.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, log)) = logs.iter().find(|(r, _)| *r == reason) {
            return log.clone();
        }
        let log = Arc::new(RateLimitedLog::default());
        logs.push((reason, log.clone()));
        log
    }

    /// Every reason's drop log so far.
    fn dropped_logs(&self) -> Vec<(&'static str, Arc<RateLimitedLog>)> {
        self.dropped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
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

/// Labels of `auth_failures_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthFailureLabels {
    /// `otlp_grpc`, `otlp_http` or `api`.
    pub listener: &'static str,
    /// `missing_token`, `unknown_token`, `insufficient_scope` or `host_not_allowed`.
    pub reason: &'static str,
}

/// Labels of `connections_open` and `connections_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    /// `otlp_grpc`, `otlp_http` or `api`.
    pub listener: &'static str,
}

/// Labels of `memory_reserved_bytes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemoryPartLabels {
    /// `data`, `aggregates` or `recent_traces`.
    pub part: &'static str,
}

/// Labels of `connections_closed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionCloseLabels {
    /// `otlp_grpc`, `otlp_http` or `api`.
    pub listener: &'static str,
    /// `idle_timeout`, `header_timeout`, `send_timeout`, `keepalive_timeout`, `tls_handshake`,
    /// `refused` or `shutdown`.
    pub reason: &'static str,
}

/// Labels of `reloads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// What was reloaded: `tokens`, `tls_otlp_grpc`, `tls_otlp_http` or `tls_api`.
    pub what: &'static str,
    /// `ok` (in force now) or `failed` (the previous one stays in force).
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
    /// `infertrace_assembly_grace_seconds`: the grace period in use (learned from late spans).
    pub assembly_grace: Gauge<f64, AtomicU64>,
    /// `infertrace_late_spans_total`.
    pub late_spans: Counter,
    /// `infertrace_duplicate_spans_total`.
    pub duplicate_spans: Counter,
    /// `infertrace_implausible_requests_total{reason}`: requests left out of the aggregates
    /// because a duration or a count cannot be true (`RequestRecord::implausible`).
    pub implausible_requests: Family<DropLabels, Counter>,
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
    /// `infertrace_reopened_requests_not_counted_total`: requests of re-opened traces left
    /// uncounted because the trace's earlier part had left the recent-trace ring.
    pub reopened_requests_not_counted: Counter,
    /// `infertrace_traces_closed_early_total{reason}`: traces closed before their grace period
    /// ended to make room for new ones.
    pub traces_closed_early: Family<CloseEarlyLabels, Counter>,
    /// `infertrace_texts_truncated_total`: strings cut to the longest text kept, and string
    /// arrays cut to the most strings kept.
    pub texts_truncated: Counter,
    /// `infertrace_series_reclaimed_total`: idle KPI series and critical-path keys reclaimed
    /// for new ones under their caps.
    pub series_reclaimed: Counter,
    /// `infertrace_requests_refused_total{receiver,reason}`: requests refused before they were
    /// accepted (the sender was told to retry, or why not).
    pub requests_refused: Family<RefusalLabels, Counter>,
    logs: Arc<Logs>,
    /// `infertrace_connections_open{listener}`.
    pub connections_open: Family<ListenerLabels, Gauge>,
    /// `infertrace_connections_refused_total{listener}`: connections closed at once because the
    /// listener held its `connections.max`.
    pub connections_refused: Family<ListenerLabels, Counter>,
    /// `infertrace_accept_errors_total{listener}`: accepts that failed (out of file
    /// descriptors, nearly always).
    pub accept_errors: Family<ListenerLabels, Counter>,
    /// `infertrace_connections_closed_total{listener,reason}`: connections the collector closed.
    pub connections_closed: Family<ConnectionCloseLabels, Counter>,
    /// `infertrace_auth_failures_total{listener,reason}`: requests refused by authentication or
    /// the API's Host allowlist.
    pub auth_failures: Family<AuthFailureLabels, Counter>,
    /// `infertrace_reloads_total{what,outcome}`: reloads on SIGHUP (tokens, each listener's
    /// TLS files), and whether they took effect.
    pub reloads: Family<ReloadLabels, Counter>,
    /// `infertrace_forward_attempts_total{outcome}`: export calls to the forward downstream.
    pub forward_attempts: Family<AttemptLabels, Counter>,
    /// `infertrace_alertmanager_posts_total{outcome}`: POSTs of alerts to Alertmanager (`ok`,
    /// `failed`).
    pub alertmanager_posts: Family<AttemptLabels, Counter>,
    /// `infertrace_forward_pending_spans`: spans accepted for forwarding, not yet exported or
    /// given up.
    pub forward_pending_spans: Gauge,
    /// `infertrace_forward_pending_bytes`: their request-body bytes.
    pub forward_pending_bytes: Gauge,
    /// `infertrace_memory_reserved_bytes{part}`: what the memory limiter holds, by part.
    pub memory_reserved: Family<MemoryPartLabels, Gauge>,
    /// `infertrace_memory_limit_bytes`: the memory limit.
    pub memory_limit: Gauge,
    /// `infertrace_resident_memory_bytes`: the process's resident set at the last tick (when
    /// `limits.watch_resident_memory` is on).
    pub resident_memory: Gauge,
    /// `infertrace_memory_returned_ticks_total`: ticks at which the allocator was told to
    /// return the freed memory it keeps (the resident set near its bound).
    pub memory_returned_ticks: Counter,
}

impl InternalEvents {
    /// Creates at 0 the label sets that alerts and dashboards watch, so that the first event
    /// shows as a step from 0 (`increase()` and `rate()` see nothing in a series born at 1) and
    /// panels read 0 rather than "No data".
    fn zero_known_series(&self) {
        for &reason in REFUSAL_REASONS.iter().chain(DROP_REASONS) {
            let _ = self.dropped_spans.get_or_create(&DropLabels { reason });
        }
        for receiver in ["otlp_grpc", "otlp_http"] {
            for reason in REFUSAL_REASONS {
                let _ = self
                    .requests_refused
                    .get_or_create(&RefusalLabels { receiver, reason });
            }
            for outcome in ["accepted", "rejected", "refused"] {
                let _ = self
                    .receiver_spans
                    .get_or_create(&ReceiverLabels { receiver, outcome });
            }
        }
        for listener in LISTENERS {
            let _ = self
                .connections_refused
                .get_or_create(&ListenerLabels { listener });
            let _ = self
                .accept_errors
                .get_or_create(&ListenerLabels { listener });
            for reason in CLOSE_REASONS {
                let _ = self
                    .connections_closed
                    .get_or_create(&ConnectionCloseLabels { listener, reason });
            }
        }
        for reason in ["queue_full", "writer_stopped", "write_failed", "memory_cap"] {
            let _ = self.store_dropped.get_or_create(&DropLabels { reason });
        }
        for reason in ["duration", "tokens"] {
            let _ = self
                .implausible_requests
                .get_or_create(&DropLabels { reason });
        }
        for reason in ["max_traces_in_flight", "memory"] {
            let _ = self
                .traces_closed_early
                .get_or_create(&CloseEarlyLabels { reason });
        }
        for listener in LISTENERS {
            for reason in [
                "missing_token",
                "unknown_token",
                "insufficient_scope",
                "host_not_allowed",
            ] {
                // gRPC checks no Host (browsers cannot speak it): a series that could not grow.
                if listener == "otlp_grpc" && reason == "host_not_allowed" {
                    continue;
                }
                let _ = self
                    .auth_failures
                    .get_or_create(&AuthFailureLabels { listener, reason });
            }
        }
        for outcome in ["ok", "failed"] {
            let _ = self
                .alertmanager_posts
                .get_or_create(&AttemptLabels { outcome });
        }
        for what in ["tokens", "tls_otlp_grpc", "tls_otlp_http", "tls_api"] {
            for outcome in ["ok", "failed"] {
                let _ = self.reloads.get_or_create(&ReloadLabels { what, outcome });
            }
        }
    }

    /// Registers every self-metric under the `infertrace_` prefix (the watched label sets at 0).
    pub fn register(&self, registry: &mut Registry) {
        self.zero_known_series();
        let r = registry.sub_registry_with_prefix(prom::PREFIX);
        r.register(
            prom::RECEIVER_SPANS,
            "Spans received, by receiver and outcome",
            self.receiver_spans.clone(),
        );
        r.register(
            prom::DROPPED_SPANS,
            "Spans dropped or refused, by reason (a request refused before its spans were counted adds 1; requests_refused_total counts requests)",
            self.dropped_spans.clone(),
        );
        r.register(
            prom::TRACES_IN_FLIGHT,
            "Traces being assembled",
            self.traces_in_flight.clone(),
        );
        r.register(
            prom::ASSEMBLY_GRACE_SECONDS,
            "Grace period in use after a trace's request span, seconds: assembly.grace, raised up to assembly.max_grace while spans arrive later than it",
            self.assembly_grace.clone(),
        );
        r.register(
            prom::LATE_SPANS,
            "Spans that arrived after their trace was completed",
            self.late_spans.clone(),
        );
        r.register(
            prom::DUPLICATE_SPANS,
            "Spans received again while their trace was assembled (a client's retry); kept once",
            self.duplicate_spans.clone(),
        );
        r.register(
            prom::IMPLAUSIBLE_REQUESTS,
            "Requests left out of the KPIs, metrics and critical paths because a duration (over a day) or a token count (over a billion) cannot be true, by reason",
            self.implausible_requests.clone(),
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
            prom::TRACES_CLOSED_EARLY,
            "Traces closed before their grace period ended, to make room for new traces, by reason",
            self.traces_closed_early.clone(),
        );
        r.register(
            prom::TEXTS_TRUNCATED,
            "Span names, service names and attribute values cut to the longest text kept, and string arrays to the most strings kept",
            self.texts_truncated.clone(),
        );
        r.register(
            prom::SERIES_RECLAIMED,
            "Idle KPI series and critical-path keys reclaimed for new ones under their caps (their Prometheus series go with them)",
            self.series_reclaimed.clone(),
        );
        r.register(
            prom::REQUESTS_REFUSED,
            "Export requests refused before acceptance, by receiver and reason",
            self.requests_refused.clone(),
        );
        r.register(
            prom::RECENT_TRACES_NOT_KEPT,
            "Completed traces analysed but not kept in the recent-trace ring",
            self.recent_traces_not_kept.clone(),
        );
        r.register(
            prom::REOPENED_REQUESTS_NOT_COUNTED,
            "Requests of traces re-opened after completion left uncounted (a request span sent again counts too): the trace's earlier part had left the recent-trace ring",
            self.reopened_requests_not_counted.clone(),
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
            prom::ACCEPT_ERRORS,
            "Accepts that failed, by listener (nearly always: out of file descriptors)",
            self.accept_errors.clone(),
        );
        r.register(
            prom::CONNECTIONS_CLOSED,
            "Connections closed by the collector, by listener and reason",
            self.connections_closed.clone(),
        );
        r.register(
            prom::AUTH_FAILURES,
            "Requests refused by authentication or the Host allowlist, by listener and reason",
            self.auth_failures.clone(),
        );
        r.register(
            prom::RELOADS,
            "Reloads on SIGHUP (tokens, TLS files of each listener), by what and outcome",
            self.reloads.clone(),
        );
        r.register(
            prom::FORWARD_ATTEMPTS,
            "Export calls to the forward downstream, by outcome",
            self.forward_attempts.clone(),
        );
        r.register(
            prom::ALERTMANAGER_POSTS,
            "POSTs of alerts to Alertmanager, by outcome",
            self.alertmanager_posts.clone(),
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
        r.register(
            prom::MEMORY_RESERVED_BYTES,
            "Bytes held in the memory limiter, by part (data, aggregates, recent_traces)",
            self.memory_reserved.clone(),
        );
        r.register(
            prom::MEMORY_LIMIT_BYTES,
            "The memory limit (limits.memory_limit_bytes)",
            self.memory_limit.clone(),
        );
        r.register(
            prom::RESIDENT_MEMORY_BYTES,
            "The process's resident memory at the last tick (limits.watch_resident_memory)",
            self.resident_memory.clone(),
        );
        r.register(
            prom::MEMORY_RETURNED_TICKS,
            "Ticks at which the allocator was told to return the freed memory it keeps: the \
             resident memory within 32 MiB of memory_limit_bytes plus 64 MiB",
            self.memory_returned_ticks.clone(),
        );
    }

    /// Counts a request refused on `listener` for `reason` (see [`AuthFailureLabels`]) and logs
    /// it (warn, rate-limited). Never logs a token.
    pub fn auth_refused(&self, listener: &'static str, reason: &'static str) {
        self.auth_failures
            .get_or_create(&AuthFailureLabels { listener, reason })
            .inc();
        if let Some(count) = self.logs.auth_refused.note(1) {
            tracing::warn!(
                listener,
                reason,
                requests = count,
                "requests refused by authentication (the latest reason; all of them since the \
                 last line; see infertrace_auth_failures_total)"
            );
        }
    }

    /// The number of requests refused on `listener` for `reason` so far (for tests).
    pub fn auth_refusals(&self, listener: &'static str, reason: &'static str) -> u64 {
        self.auth_failures
            .get_or_create(&AuthFailureLabels { listener, reason })
            .get()
    }

    /// Counts one reload of `what` (`tokens`, `tls_otlp_grpc`, `tls_otlp_http`, `tls_api`) that
    /// took effect (`ok`) or left the previous state in force. The caller logs it (with the
    /// reason of a failure).
    pub fn reloaded(&self, what: &'static str, ok: bool) {
        let outcome = if ok { "ok" } else { "failed" };
        self.reloads
            .get_or_create(&ReloadLabels { what, outcome })
            .inc();
    }

    /// The number of reloads of `what` that took effect (`ok`) or failed, so far.
    pub fn reloads(&self, what: &'static str, ok: bool) -> u64 {
        let outcome = if ok { "ok" } else { "failed" };
        self.reloads
            .get_or_create(&ReloadLabels { what, outcome })
            .get()
    }

    /// Counts a connection refused by `listener` (over its `max` open connections), and logs
    /// it at warn level (rate-limited).
    pub fn connection_refused(&self, listener: &'static str, max: usize) {
        self.connections_refused
            .get_or_create(&ListenerLabels { listener })
            .inc();
        if let Some(count) = self.logs.connections_refused.note(1) {
            tracing::warn!(
                listener,
                max,
                connections = count,
                "connection refused: the listener holds its connections.max open connections; \
                 raise connections.max or look for idle or stuck clients"
            );
        }
    }

    /// Counts an accept of `listener` that failed with `error` and logs it at warn level
    /// (rate-limited): out of file descriptors, nearly always, while clients wait in the
    /// kernel's backlog.
    pub fn accept_failed(&self, listener: &'static str, error: &std::io::Error) {
        self.accept_errors
            .get_or_create(&ListenerLabels { listener })
            .inc();
        if let Some(count) = self.logs.accept_errors.note(1) {
            tracing::warn!(
                listener,
                %error,
                failures = count,
                "accepting connections failed (the latest error; all of them since the last \
                 line; see infertrace_accept_errors_total): if it says too many open files, \
                 raise the process's open-files limit (ulimit -n, LimitNOFILE=) or lower \
                 connections.max"
            );
        }
    }

    /// Counts a connection `listener` closed for `reason` (`idle_timeout`, `header_timeout`,
    /// `send_timeout`, `keepalive_timeout`, `tls_handshake`, `refused`, `shutdown`), and logs it
    /// at warn level (rate-limited) except for idle timeouts, which are ordinary.
    pub fn connection_closed(&self, listener: &'static str, reason: &'static str) {
        self.connections_closed
            .get_or_create(&ConnectionCloseLabels { listener, reason })
            .inc();
        if reason != "idle_timeout"
            && let Some(count) = self.logs.connections_closed.note(1)
        {
            tracing::warn!(
                listener,
                reason,
                connections = count,
                "connections closed by the collector (the latest reason; all of them since the \
                 last line; see infertrace_connections_closed_total)"
            );
        }
    }

    /// The gauge of `listener`'s open connections.
    pub fn connections_open_gauge(&self, listener: &'static str) -> Gauge {
        self.connections_open
            .get_or_create(&ListenerLabels { listener })
            .clone()
    }

    /// Counts one export call to the forward downstream that ended with `outcome`.
    pub fn forward_attempt(&self, outcome: &'static str) {
        self.forward_attempts
            .get_or_create(&AttemptLabels { outcome })
            .inc();
    }

    /// Counts one POST of alerts to Alertmanager that Alertmanager took (`ok`) or not.
    pub fn alerts_posted(&self, ok: bool) {
        let outcome = if ok { "ok" } else { "failed" };
        self.alertmanager_posts
            .get_or_create(&AttemptLabels { outcome })
            .inc();
    }

    /// The number of forward attempts that ended with `outcome` so far.
    pub fn forward_attempts(&self, outcome: &'static str) -> u64 {
        self.forward_attempts
            .get_or_create(&AttemptLabels { outcome })
            .get()
    }

    /// Counts `n` history-store items dropped for `reason` (`queue_full`, `write_failed`,
    /// …), and logs it at warn level (rate-limited: a full disk fails every flush).
    pub fn store_items_dropped(&self, reason: &'static str, n: u64) {
        if n > 0 {
            if let Some(items) = self.logs.store_dropped.note(n) {
                tracing::warn!(
                    reason,
                    items,
                    "history store items dropped (the latest reason; all of them since the last \
                     line; see infertrace_store_dropped_total)"
                );
            }
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

    /// Counts `n` spans dropped or refused for `reason`, and logs it (warn, rate-limited).
    pub fn spans_dropped(&self, reason: &'static str, n: u64) {
        if n > 0 {
            if let Some(count) = self.logs.dropped_log(reason).note(n) {
                tracing::warn!(
                    reason,
                    spans = count,
                    "spans dropped or refused for this reason (all of them since its last line; \
                     see infertrace_dropped_spans_total)"
                );
            }
            self.dropped_spans
                .get_or_create(&DropLabels { reason })
                .inc_by(n);
        }
    }

    /// Counts one request refused by `receiver` for `reason` before it was accepted, and logs
    /// it (warn, rate-limited).
    pub fn request_refused(&self, receiver: &'static str, reason: &'static str) {
        if let Some(count) = self.logs.refused.note(1) {
            tracing::warn!(
                receiver,
                reason,
                requests = count,
                "export requests refused (the latest reason; all of them since the last line; \
                 see infertrace_requests_refused_total)"
            );
        }
        self.requests_refused
            .get_or_create(&RefusalLabels { receiver, reason })
            .inc();
    }

    /// Counts `n` traces closed early to make room for `reason` (see [`CloseEarlyLabels`]), and
    /// logs it (warn, rate-limited).
    pub fn traces_closed_early(&self, reason: &'static str, n: usize) {
        if n == 0 {
            return;
        }
        self.traces_closed_early
            .get_or_create(&CloseEarlyLabels { reason })
            .inc_by(n as u64);
        if let Some(count) = self.logs.closed_early.note(n as u64) {
            tracing::warn!(
                traces = count,
                reason,
                "traces in flight closed before their grace period ended, the oldest first \
                 (late children of those traces are counted as late spans): at \
                 limits.max_traces_in_flight (reason max_traces_in_flight) or past \
                 limits.soft_limit_percent of the memory limit left above the aggregates \
                 (reason memory); raise the limit if this persists"
            );
        }
    }

    /// Traces closed early for `reason` so far.
    pub fn closed_early(&self, reason: &'static str) -> u64 {
        self.traces_closed_early
            .get_or_create(&CloseEarlyLabels { reason })
            .get()
    }

    /// Sets `memory_reserved_bytes` by part — `data`, `aggregates` (the KPI series,
    /// critical-path windows and Prometheus label sets), `recent_traces`, `tables` (the
    /// assembler's map, queues, spare span slots and trace index) — and warns
    /// (rate-limited) while the aggregates hold more than half of `limit`: they are never freed
    /// for data, so past that the buffered traces and requests share what is left, and memory
    /// relief closes traces early sooner.
    pub fn memory_held(
        &self,
        data: usize,
        aggregates: usize,
        recent_traces: usize,
        tables: usize,
        limit: usize,
    ) {
        for (part, bytes) in [
            ("data", data),
            ("aggregates", aggregates),
            ("recent_traces", recent_traces),
            ("tables", tables),
        ] {
            self.memory_reserved
                .get_or_create(&MemoryPartLabels { part })
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        if aggregates > limit / 2 && self.logs.aggregates.note(1).is_some() {
            tracing::warn!(
                aggregates_bytes = aggregates,
                limit_bytes = limit,
                "the aggregates (KPI series, critical-path windows, Prometheus label sets, \
                 history store queue) hold \
                 more than half of limits.memory_limit_bytes, leaving less for traces in flight: \
                 raise the limit, or lower limits.max_series or the longest kpi.windows"
            );
        }
    }

    /// Sets `resident_memory_bytes`; when `returning`, counts the tick in
    /// `memory_returned_ticks_total` and, at its start (`started`), warns (rate-limited) that
    /// the allocator now returns freed memory at once.
    pub fn resident_memory_read(&self, resident: usize, returning: bool, started: bool) {
        self.resident_memory
            .set(i64::try_from(resident).unwrap_or(i64::MAX));
        if returning {
            self.memory_returned_ticks.inc();
        }
        if started && let Some(count) = self.logs.returning_memory.note(1) {
            tracing::warn!(
                resident_bytes = resident,
                times = count,
                "the resident memory came within 32 MiB of limits.memory_limit_bytes plus 64 MiB: \
                 freed memory is returned to the system at once until it is back below (slower); \
                 if this repeats, raise the limit or the memory of the machine"
            );
        }
    }

    /// Counts `n` strings cut to the longest text kept, and logs it (warn, rate-limited).
    pub fn texts_truncated(&self, n: u64) {
        if n > 0 {
            self.texts_truncated.inc_by(n);
            if let Some(count) = self.logs.truncated.note(n) {
                tracing::warn!(
                    texts = count,
                    "span names, service names or attribute values longer than the longest text \
                     kept were cut"
                );
            }
        }
    }

    /// Counts a request left out of the aggregates for `reason` (see
    /// `RequestRecord::implausible`), and logs it (warn, rate-limited).
    pub fn implausible_request(&self, reason: &'static str) {
        self.implausible_requests
            .get_or_create(&DropLabels { reason })
            .inc();
        if let Some(count) = self.logs.implausible.note(1) {
            tracing::warn!(
                requests = count,
                reason,
                "requests left out of the KPIs, metrics and critical paths: a duration over a \
                 day (reason duration) or a token count over a billion (reason tokens) cannot \
                 be true; look for a broken clock or a corrupt exporter (the traces are still \
                 forwarded and shown in /api/traces)"
            );
        }
    }

    /// Counts `n` requests of a re-opened trace left uncounted (its earlier part had left the
    /// recent-trace ring), and logs it (warn, rate-limited).
    pub fn reopened_requests_not_counted(&self, n: u64) {
        if n > 0 {
            self.reopened_requests_not_counted.inc_by(n);
            if let Some(count) = self.logs.reopened.note(n) {
                tracing::warn!(
                    requests = count,
                    "requests of traces re-opened after completion (an agent's next call in the \
                     same trace, or a service exporting after assembly.grace) were not counted: \
                     the trace's earlier part had left the recent-trace ring, so the requests it \
                     counted could not be told from new ones; raise api.recent_traces (and its \
                     admission rate with it) or assembly.grace"
                );
            }
        }
    }

    /// Counts `n` idle KPI series or critical-path keys reclaimed under their caps, and logs it
    /// (warn, rate-limited).
    pub fn series_reclaimed(&self, n: u64) {
        if n > 0 {
            self.series_reclaimed.inc_by(n);
            if let Some(count) = self.logs.reclaimed.note(n) {
                tracing::warn!(
                    series = count,
                    "series cap reached (KPI series, or critical-path keys): idle series were \
                     reclaimed for new ones"
                );
            }
        }
    }

    /// Says what the end of a burst left unsaid: for each kind of warning with events since its
    /// last line, once [`LOG_INTERVAL`] has passed, one line with their count (the details of
    /// the latest went with the line before). The pipeline calls this on every tick.
    pub fn flush_logs(&self) {
        self.say_pending(RateLimitedLog::due);
    }

    /// The last lines before the process exits: every count not yet said, whatever the
    /// interval (a burst at shutdown would otherwise go unsaid).
    pub fn flush_logs_at_exit(&self) {
        self.say_pending(RateLimitedLog::take);
    }

    fn say_pending(&self, pending: fn(&RateLimitedLog) -> Option<u64>) {
        let l = &self.logs;
        for (reason, log) in l.dropped_logs() {
            if let Some(spans) = pending(&log) {
                tracing::warn!(
                    reason,
                    spans,
                    "spans dropped or refused for this reason since its last line (see \
                     infertrace_dropped_spans_total)"
                );
            }
        }
        for (log, what) in [
            (
                &l.refused,
                "export requests refused (see infertrace_requests_refused_total)",
            ),
            (
                &l.closed_early,
                "traces closed early (see infertrace_traces_closed_early_total)",
            ),
            (
                &l.truncated,
                "texts cut (see infertrace_texts_truncated_total)",
            ),
            (
                &l.implausible,
                "implausible requests left out (see infertrace_implausible_requests_total)",
            ),
            (
                &l.reclaimed,
                "KPI series or critical-path keys reclaimed (see infertrace_series_reclaimed_total)",
            ),
            (
                &l.connections_refused,
                "connections refused (see infertrace_connections_refused_total)",
            ),
            (
                &l.accept_errors,
                "accepts failed (see infertrace_accept_errors_total)",
            ),
            (
                &l.connections_closed,
                "connections closed by the collector (see infertrace_connections_closed_total)",
            ),
            (
                &l.auth_refused,
                "requests refused by authentication (see infertrace_auth_failures_total)",
            ),
            (
                &l.store_dropped,
                "history store items dropped (see infertrace_store_dropped_total)",
            ),
        ] {
            if let Some(count) = pending(log) {
                tracing::warn!(count, "{what} since the last line");
            }
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

/// Whether a warn-level line for `reason` may be logged now: the keyed form of
/// [`RateLimitedLog`] for components that log their own lines (at most one per reason per
/// [`LOG_INTERVAL`]; the counters count every event).
pub fn warn_allowed(reason: &'static str) -> bool {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static LOGS: OnceLock<Mutex<HashMap<&'static str, &'static RateLimitedLog>>> = OnceLock::new();
    let mut logs = LOGS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let log: &'static RateLimitedLog = logs
        .entry(reason)
        .or_insert_with(|| Box::leak(Box::default()));
    log.note(1).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watched_series_exist_at_zero_before_their_first_event() {
        let events = InternalEvents::default();
        let mut registry = Registry::default();
        events.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"infertrace_reloads_total{what="tokens",outcome="failed"} 0"#,
            r#"infertrace_dropped_spans_total{reason="memory_limit"} 0"#,
            r#"infertrace_traces_closed_early_total{reason="memory"} 0"#,
            r#"infertrace_auth_failures_total{listener="api",reason="unknown_token"} 0"#,
            r#"infertrace_store_dropped_total{reason="memory_cap"} 0"#,
            r#"infertrace_dropped_spans_total{reason="too_large"} 0"#,
            r#"infertrace_dropped_spans_total{reason="forward_rejected"} 0"#,
            r#"infertrace_requests_refused_total{receiver="otlp_http",reason="body_timeout"} 0"#,
            r#"infertrace_receiver_spans_total{receiver="otlp_grpc",outcome="refused"} 0"#,
            r#"infertrace_connections_refused_total{listener="api"} 0"#,
            r#"infertrace_accept_errors_total{listener="otlp_http"} 0"#,
            r#"infertrace_alertmanager_posts_total{outcome="failed"} 0"#,
            r#"infertrace_connections_closed_total{listener="otlp_grpc",reason="header_timeout"} 0"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }

    #[test]
    fn a_bursts_end_is_said_once_its_interval_has_passed() {
        let log = RateLimitedLog::default();
        assert_eq!(log.due(), None, "nothing noted");
        assert_eq!(log.note(1), Some(1), "the first event is said at once");
        assert_eq!(log.note(4), None);
        assert_eq!(log.due(), None, "within the interval");
        // The interval passes (moved back by hand rather than waited for).
        log.next_ms.store(0, Ordering::Relaxed);
        assert_eq!(
            log.due(),
            Some(4),
            "the rest of the burst, without a new event"
        );
        assert_eq!(log.due(), None, "said once");
        log.next_ms.store(0, Ordering::Relaxed);
        assert_eq!(log.due(), None, "nothing since");
        assert_eq!(
            log.note(2),
            Some(2),
            "a new event after the interval is said at once"
        );
    }
}
