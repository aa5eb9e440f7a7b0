//! Prometheus exposition of the request metrics (`GET /metrics`), with the names of
//! docs/reference.md#names from `infertrace_semconv::prom`.
//!
//! - `infertrace_requests_total{service,model,operation,outcome}`
//! - classic histograms `infertrace_{request,queue,prefill,decode}_duration_seconds`,
//!   `infertrace_time_to_first_token_seconds`, `infertrace_time_per_output_token_seconds`
//!   `{service,model,operation,outcome}` with the GenAI buckets of `semconv::metric` — the same
//!   buckets on every collector, so `sum by (le, model) (rate(..._bucket[5m]))` aggregates
//!   across a fleet;
//! - `infertrace_tokens_total{service,model,operation,type}` (`type` = `input` | `output`),
//!   `infertrace_goodput_requests_total{service,model,operation}` (ok requests meeting every
//!   SLO), `infertrace_gpu_energy_joules_total{service,model,operation}` (energy *attributed* to
//!   the requests by token share — an estimate; device energy would count a batch once per
//!   request; a series only once a request brought energy),
//!   `infertrace_critical_path_seconds_total{service,span}`,
//!   `infertrace_disagg_phase_duration_seconds{service,model,operation,pool,worker,phase}` (the
//!   disaggregated sub-phases of `ok` requests that crossed prefill and decode pools, with the
//!   phase buckets; `worker` is the worker's `service.name`, empty for the router's `routing`;
//!   at most [`MAX_DISAGG_WORKERS`] workers per series, the rest under `__overflow__`),
//!   `infertrace_alerts_active{alert}` (firing instances of the rule, 0 when none);
//! - the self-metrics of [`InternalEvents`].
//!
//! Cardinality is capped: at most `max_series` (service, model, operation) label sets; the rest
//! are reported under `__overflow__` (as the KPI windows do) and counted in
//! `infertrace_series_overflow_total` by the pipeline. Critical-path (service, span) keys are
//! capped the same way at [`MAX_CRITICAL_PATH_KEYS`].

use foldhash::{HashMap, HashMapExt};
use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use infertrace_analysis::critical_path::{CriticalPath, aggregate_name};
use infertrace_analysis::kpi::{self, Dimension, Labelling, OVERFLOW_LABEL, SeriesKey, SloConfig};
use infertrace_analysis::record::{DisaggPhases, Outcome, RequestRecord};
use infertrace_analysis::text::Text;
use infertrace_intern::{PairCache, RecentTriple};
use infertrace_semconv::{metric, prom};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::internal_events::InternalEvents;
use crate::prom_single_writer::{ClassicHistogram, SingleWriterCounter, Writer};

mod memory;

/// Most distinct (service, span) keys of `critical_path_seconds_total`.
pub const MAX_CRITICAL_PATH_KEYS: usize = 256;

/// Most workers one series' `disagg_phase_duration_seconds` label sets name; more are
/// reported under [`OVERFLOW_LABEL`].
pub const MAX_DISAGG_WORKERS: usize = 64;

/// The content type of the exposition (OpenMetrics text, which Prometheus scrapes natively).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of the per-request metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `service.name` (empty when not a KPI dimension).
    pub service: Arc<str>,
    /// Model (empty when not a KPI dimension).
    pub model: Arc<str>,
    /// Operation (empty when not a KPI dimension).
    pub operation: Arc<str>,
    /// `ok`, `error`, `cancelled` or `rejected`.
    pub outcome: &'static str,
}

/// Labels of per-series counters without an outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SeriesLabels {
    /// `service.name`.
    pub service: Arc<str>,
    /// Model.
    pub model: Arc<str>,
    /// Operation.
    pub operation: Arc<str>,
}

impl SeriesLabels {
    /// The request families' labels of this series and `outcome`.
    fn with_outcome(&self, outcome: Outcome) -> RequestLabels {
        RequestLabels {
            service: self.service.clone(),
            model: self.model.clone(),
            operation: self.operation.clone(),
            outcome: outcome.as_str(),
        }
    }
}

/// Labels of `tokens_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// `service.name`.
    pub service: Arc<str>,
    /// Model.
    pub model: Arc<str>,
    /// Operation.
    pub operation: Arc<str>,
    /// `input` or `output`.
    pub r#type: &'static str,
}

/// Labels of `critical_path_seconds_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CriticalPathLabels {
    /// Service of the span.
    pub service: Arc<str>,
    /// Span name.
    pub span: Arc<str>,
}

/// Labels of `disagg_phase_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DisaggPhaseLabels {
    /// `service.name` of the request (the router's).
    pub service: Arc<str>,
    /// Model.
    pub model: Arc<str>,
    /// Operation.
    pub operation: Arc<str>,
    /// `router`, `prefill` or `decode`.
    pub pool: &'static str,
    /// The worker's `service.name` (empty for the router's own sub-phase).
    pub worker: Arc<str>,
    /// Sub-phase name (`routing`, `bootstrap`, … `decode`).
    pub phase: &'static str,
}

/// Labels of `alerts_active`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AlertLabels {
    /// Alert name.
    pub alert: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;
/// The histogram every request family uses (see [`crate::prom_single_writer`]).
type Histogram = ClassicHistogram;
/// The counters of the request families: written by the recorder alone (see
/// [`crate::prom_single_writer`]).
type Counter = SingleWriterCounter<u64>;
type FloatCounter = SingleWriterCounter<f64>;

fn e2e_histogram() -> Histogram {
    Histogram::new(&metric::REQUEST_DURATION_BUCKETS)
}
fn ttft_histogram() -> Histogram {
    Histogram::new(&metric::TTFT_BUCKETS)
}
fn tpot_histogram() -> Histogram {
    Histogram::new(&metric::TPOT_BUCKETS)
}
fn phase_histogram() -> Histogram {
    Histogram::new(&metric::PHASE_DURATION_BUCKETS)
}

/// Every request-derived Prometheus family. Cheap to clone (families are shared). The
/// counters and histograms are single-writer values (`prom_single_writer`): one
/// [`PromRecorder`] writes them, everything else only reads (encodes) them.
#[derive(Clone, Debug)]
pub struct PromMetrics {
    /// `requests_total`.
    pub(crate) requests: Family<RequestLabels, Counter>,
    /// `request_duration_seconds` (e2e).
    pub(crate) request_duration: HistogramFamily<RequestLabels>,
    /// `queue_duration_seconds`.
    pub(crate) queue_duration: HistogramFamily<RequestLabels>,
    /// `prefill_duration_seconds`.
    pub(crate) prefill_duration: HistogramFamily<RequestLabels>,
    /// `decode_duration_seconds`.
    pub(crate) decode_duration: HistogramFamily<RequestLabels>,
    /// `time_to_first_token_seconds`.
    pub(crate) ttft: HistogramFamily<RequestLabels>,
    /// `time_per_output_token_seconds`.
    pub(crate) tpot: HistogramFamily<RequestLabels>,
    /// `tokens_total{type}`.
    pub(crate) tokens: Family<TokenLabels, Counter>,
    /// `goodput_requests_total`.
    pub(crate) goodput: Family<SeriesLabels, Counter>,
    /// `gpu_energy_joules_total` (attributed energy).
    pub(crate) gpu_energy: Family<SeriesLabels, FloatCounter>,
    /// `critical_path_seconds_total{service,span}`.
    pub(crate) critical_path: Family<CriticalPathLabels, FloatCounter>,
    /// `disagg_phase_duration_seconds{…,pool,worker,phase}`.
    pub(crate) disagg_phase_duration: HistogramFamily<DisaggPhaseLabels>,
    /// `alerts_active{alert}`.
    pub(crate) alerts_active: Family<AlertLabels, Gauge>,
    /// Whether a [`PromRecorder`] writes these families already (there may be one).
    recorder_attached: Arc<AtomicBool>,
}

impl Default for PromMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            request_duration: Family::new_with_constructor(e2e_histogram),
            queue_duration: Family::new_with_constructor(phase_histogram),
            prefill_duration: Family::new_with_constructor(phase_histogram),
            decode_duration: Family::new_with_constructor(phase_histogram),
            ttft: Family::new_with_constructor(ttft_histogram),
            tpot: Family::new_with_constructor(tpot_histogram),
            tokens: Family::default(),
            goodput: Family::default(),
            gpu_energy: Family::default(),
            critical_path: Family::default(),
            disagg_phase_duration: Family::new_with_constructor(phase_histogram),
            alerts_active: Family::default(),
            recorder_attached: Arc::default(),
        }
    }
}

impl PromMetrics {
    /// Registers every family under the `infertrace_` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix(prom::PREFIX);
        r.register(
            prom::REQUESTS,
            "Inference requests completed, by outcome",
            self.requests.clone(),
        );
        r.register(
            prom::REQUEST_DURATION,
            "End-to-end request duration in seconds",
            self.request_duration.clone(),
        );
        r.register(
            prom::QUEUE_DURATION,
            "Queue phase duration in seconds (arrival to scheduled)",
            self.queue_duration.clone(),
        );
        r.register(
            prom::PREFILL_DURATION,
            "Prefill phase duration in seconds (scheduled to first token)",
            self.prefill_duration.clone(),
        );
        r.register(
            prom::DECODE_DURATION,
            "Decode phase duration in seconds (first to last token)",
            self.decode_duration.clone(),
        );
        r.register(
            prom::TIME_TO_FIRST_TOKEN,
            "Time to first token in seconds (arrival to first token)",
            self.ttft.clone(),
        );
        r.register(
            prom::TIME_PER_OUTPUT_TOKEN,
            "Time per output token in seconds (decode / (output tokens - 1))",
            self.tpot.clone(),
        );
        r.register(
            prom::TOKENS,
            "Tokens processed, by type (input, output)",
            self.tokens.clone(),
        );
        r.register(
            prom::GOODPUT_REQUESTS,
            "Requests that completed ok and met every configured SLO",
            self.goodput.clone(),
        );
        r.register(
            prom::GPU_ENERGY_JOULES,
            "GPU energy attributed to requests by token share, joules (an estimate)",
            self.gpu_energy.clone(),
        );
        r.register(
            prom::CRITICAL_PATH_SECONDS,
            "Seconds each (service, span name) spent on requests' critical paths",
            self.critical_path.clone(),
        );
        r.register(
            prom::DISAGG_PHASE_DURATION,
            "Disaggregated prefill/decode sub-phases of ok requests, per pool and worker, seconds",
            self.disagg_phase_duration.clone(),
        );
        r.register(
            prom::ALERTS_ACTIVE,
            "Firing instances of each alert rule",
            self.alerts_active.clone(),
        );
    }

    /// Sets `alerts_active{alert}` to the number of firing instances of the rule.
    pub fn set_alert(&self, alert: &str, firing: u64) {
        self.alerts_active
            .get_or_create(&AlertLabels {
                alert: alert.to_owned(),
            })
            .set(i64::try_from(firing).unwrap_or(i64::MAX));
    }
}

/// A registry with the request metrics and the self-metrics, ready to encode.
pub fn build_registry(metrics: &PromMetrics, events: &InternalEvents) -> Registry {
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    events.register(&mut registry);
    registry
}

/// Encodes a registry as OpenMetrics text (ends with `# EOF`).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::with_capacity(64 * 1024);
    // Writing into a String cannot fail; an encoding error would be a bug in a label value.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::error!(error = %e, "encoding /metrics failed");
    }
    out
}

/// (service, span name) and its counter.
type CriticalPathKey = (Arc<str>, Arc<str>, FloatCounter);

/// Handles of one (service, model, operation, outcome) series.
#[derive(Debug)]
struct OutcomeHandles {
    e2e: Histogram,
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
    ttft: Histogram,
    tpot: Histogram,
}

/// Handles of one (service, model, operation) series.
#[derive(Debug)]
struct SeriesHandles {
    labels: SeriesLabels,
    /// `requests_total` of each outcome, created at 0 with the series: a counter that first
    /// appears at its first value loses that value to `rate()`, and ratios of two such counters
    /// (goodput, error rate) read past 100 % or miss a model's first errors.
    requests: [Counter; 4],
    /// The duration histograms of each outcome, created with its first request.
    outcomes: [OnceLock<OutcomeHandles>; 4],
    input_tokens: Counter,
    output_tokens: Counter,
    goodput: Counter,
    /// Created with the series' first GPU energy: no GPU, no series (never zeros).
    gpu_energy: OnceLock<FloatCounter>,
}

/// The outcomes in [`outcome_index`] order.
const OUTCOMES: [Outcome; 4] = [
    Outcome::Ok,
    Outcome::Error,
    Outcome::Cancelled,
    Outcome::Rejected,
];

fn outcome_index(o: Outcome) -> usize {
    match o {
        Outcome::Ok => 0,
        Outcome::Error => 1,
        Outcome::Cancelled => 2,
        Outcome::Rejected => 3,
    }
}

/// Records requests and critical paths into [`PromMetrics`], with cached per-series handles
/// (one hash lookup per request, no allocation once a series exists) and the cardinality caps.
#[derive(Debug)]
pub struct PromRecorder {
    metrics: PromMetrics,
    labelling: Labelling,
    slo: SloConfig,
    max_series: usize,
    hasher: RandomState,
    series: HashMap<u64, Vec<Arc<SeriesHandles>>>,
    series_count: usize,
    overflow: Option<Arc<SeriesHandles>>,
    /// The last record's series, and whether it was kept rather than overflowed (cleared when
    /// a series is removed, see [`PromRecorder::forget`]).
    recent: RecentTriple<Text, (Arc<SeriesHandles>, bool)>,
    cp_keys: HashMap<u64, Vec<CriticalPathKey>>,
    /// Counters of recently seen (service, name) allocations: most segments end here.
    cp_recent: PairCache<Text, FloatCounter>,
    cp_count: usize,
    /// Per series with disaggregated requests, the `disagg_phase_duration_seconds` label sets
    /// it created and their histograms (few series, a few dozen sets each: searched in order).
    disagg: Vec<(SeriesLabels, Vec<(DisaggPhaseLabels, Histogram)>)>,
    /// The one writer of `metrics`' request families.
    writer: Writer,
}

impl PromRecorder {
    /// A recorder into `metrics`, labelling by `dimensions` (others are empty), capped at
    /// `max_series` label sets, judging goodput by `slo`.
    pub fn new(
        metrics: PromMetrics,
        dimensions: Vec<Dimension>,
        slo: SloConfig,
        max_series: usize,
    ) -> Self {
        // The request families are single-writer values: a second recorder would lose updates.
        let second = metrics.recorder_attached.swap(true, Ordering::Relaxed);
        debug_assert!(!second, "a second PromRecorder on the same PromMetrics");
        if second {
            tracing::error!(
                "a second Prometheus recorder writes the same metrics: request counts will be \
                 undercounted (give each pipeline its own PromMetrics)"
            );
        }
        Self {
            metrics,
            labelling: Labelling::new(&dimensions),
            slo,
            max_series,
            hasher: RandomState::default(),
            series: HashMap::new(),
            series_count: 0,
            overflow: None,
            recent: RecentTriple::default(),
            cp_keys: HashMap::new(),
            cp_recent: PairCache::default(),
            cp_count: 0,
            disagg: Vec::new(),
            writer: Writer::new(),
        }
    }

    /// The families recorded into.
    pub fn metrics(&self) -> &PromMetrics {
        &self.metrics
    }

    /// Records one request. Returns `false` when the series cap sent it to the overflow series.
    pub fn record(&mut self, r: &RequestRecord) -> bool {
        self.record_in(r, true)
    }

    /// [`record`](Self::record), saying whether the KPI windows kept the request in its own
    /// series (what `KpiWindows::record` returned): one they put in the overflow series goes
    /// to the overflow series here too, so that both show the same series even when their
    /// caps filled differently (after a restart the KPI windows come back with their series,
    /// the exporter empty).
    pub fn record_in(&mut self, r: &RequestRecord, in_kpi_series: bool) -> bool {
        let cached = self.recent.get(&r.service, &r.model, &r.operation);
        // A series the KPI windows admitted later (another reclaimed) is looked up again.
        if cached.is_none_or(|(_, kept)| *kept != in_kpi_series) {
            let found = if in_kpi_series {
                let (service, model, operation) = self.labelling.labels(r);
                self.series_for(service, model, operation)
            } else {
                (self.overflow_series(), false)
            };
            self.recent.set(&r.service, &r.model, &r.operation, found);
        }
        let Some((handles, kept)) = self.recent.get(&r.service, &r.model, &r.operation) else {
            return false;
        };
        let kept = *kept;
        let o = &handles.outcomes[outcome_index(r.outcome)];
        let h = o.get_or_init(|| {
            let labels = handles.labels.with_outcome(r.outcome);
            let m = &self.metrics;
            OutcomeHandles {
                e2e: m.request_duration.get_or_create_owned(&labels),
                queue: m.queue_duration.get_or_create_owned(&labels),
                prefill: m.prefill_duration.get_or_create_owned(&labels),
                decode: m.decode_duration.get_or_create_owned(&labels),
                ttft: m.ttft.get_or_create_owned(&labels),
                tpot: m.tpot.get_or_create_owned(&labels),
            }
        });
        let w = &self.writer;
        handles.requests[outcome_index(r.outcome)].inc(w);
        h.e2e.observe(w, r.e2e);
        let observe = |hist: &Histogram, v: Option<f64>| {
            if let Some(v) = v.filter(|v| v.is_finite() && *v >= 0.0) {
                hist.observe(w, v);
            }
        };
        observe(&h.queue, r.queue);
        observe(&h.prefill, r.prefill);
        observe(&h.decode, r.decode);
        observe(&h.ttft, r.ttft);
        observe(&h.tpot, r.tpot);
        if let Some(n) = r.input_tokens {
            handles.input_tokens.inc_by(w, n);
        }
        if let Some(n) = r.output_tokens {
            handles.output_tokens.inc_by(w, n);
        }
        if kpi::meets_slos(&self.slo, r) {
            handles.goodput.inc(w);
        }
        if let Some(j) = r
            .gpu
            .as_ref()
            .and_then(|g| g.energy_attributed_joules)
            .filter(|j| j.is_finite() && *j >= 0.0)
        {
            let energy = handles
                .gpu_energy
                .get_or_init(|| self.metrics.gpu_energy.get_or_create_owned(&handles.labels));
            energy.inc_by(w, j);
        }
        if let Some(d) = r.disagg.as_deref().filter(|_| r.outcome == Outcome::Ok) {
            let labels = handles.labels.clone();
            self.record_disagg(&labels, d);
        }
        kept
    }

    /// Observes a disaggregated request's sub-phases, labelled with their pool and worker.
    fn record_disagg(&mut self, series: &SeriesLabels, d: &DisaggPhases) {
        use infertrace_semconv::disagg as sd;
        let pos = match self.disagg.iter().position(|(l, _)| l == series) {
            Some(i) => i,
            None => {
                self.disagg.push((series.clone(), Vec::new()));
                self.disagg.len() - 1
            }
        };
        let sets = &mut self.disagg[pos].1;
        let (router, prefill, decode) = (sd::role::ROUTER, sd::role::PREFILL, sd::role::DECODE);
        let pw = d.prefill_worker.as_deref().unwrap_or("");
        let dw = d.decode_worker.as_deref().unwrap_or("");
        for (pool, worker, phase, v) in [
            (router, "", sd::ROUTING, d.routing),
            (prefill, pw, sd::BOOTSTRAP, d.bootstrap),
            (prefill, pw, sd::PREFILL_QUEUE, d.prefill_queue),
            (prefill, pw, sd::PREFILL, d.prefill),
            (prefill, pw, sd::KV_TRANSFER, d.kv_transfer),
            (decode, dw, sd::DECODE_BOOTSTRAP, d.decode_bootstrap),
            (decode, dw, sd::DECODE_WAIT, d.decode_wait),
            (decode, dw, sd::FIRST_TOKEN, d.first_token),
            (decode, dw, sd::DECODE, d.decode),
        ] {
            let Some(v) = v.filter(|v| v.is_finite() && *v >= 0.0) else {
                continue;
            };
            let known = |w: &str| sets.iter().any(|(l, _)| &*l.worker == w);
            let worker = if known(worker) {
                worker
            } else {
                let mut workers: Vec<&str> = sets.iter().map(|(l, _)| &*l.worker).collect();
                workers.sort_unstable();
                workers.dedup();
                if workers.len() >= MAX_DISAGG_WORKERS {
                    OVERFLOW_LABEL
                } else {
                    worker
                }
            };
            let found = sets
                .iter()
                .find(|(l, _)| l.phase == phase && l.pool == pool && &*l.worker == worker);
            let hist = match found {
                Some((_, h)) => h.clone(),
                None => {
                    let labels = DisaggPhaseLabels {
                        service: series.service.clone(),
                        model: series.model.clone(),
                        operation: series.operation.clone(),
                        pool,
                        worker: Arc::from(worker),
                        phase,
                    };
                    let h = self
                        .metrics
                        .disagg_phase_duration
                        .get_or_create_owned(&labels);
                    sets.push((labels, h.clone()));
                    h
                }
            };
            hist.observe(&self.writer, v);
        }
    }

    /// The `__overflow__` series' handles, created on first use (it takes no place under the
    /// cap).
    fn overflow_series(&mut self) -> Arc<SeriesHandles> {
        if let Some(o) = &self.overflow {
            return o.clone();
        }
        let (service, model, operation) = self.labelling.overflow_labels();
        let o = Arc::new(self.new_series(service, model, operation));
        self.overflow = Some(o.clone());
        o
    }

    fn series_for(
        &mut self,
        service: &str,
        model: &str,
        operation: &str,
    ) -> (Arc<SeriesHandles>, bool) {
        let hash = self.hasher.hash_one((service, model, operation));
        if let Some(found) = self.series.get(&hash).and_then(|v| {
            v.iter().find(|s| {
                &*s.labels.service == service
                    && &*s.labels.model == model
                    && &*s.labels.operation == operation
            })
        }) {
            return (found.clone(), true);
        }
        if self.series_count >= self.max_series {
            return (self.overflow_series(), false);
        }
        let s = Arc::new(self.new_series(service, model, operation));
        self.series.entry(hash).or_default().push(s.clone());
        self.series_count += 1;
        (s, true)
    }

    /// Removes the label sets of series `key` (labelled as the KPI windows label it) from every
    /// request family, freeing its place under the cap: the KPI windows removed it (expired, or
    /// reclaimed for a new series), and both must keep the same series. Returns whether it was
    /// there.
    pub fn forget(&mut self, key: &SeriesKey) -> bool {
        let (service, model, operation) = (&*key.service, &*key.model, &*key.operation);
        let hash = self.hasher.hash_one((service, model, operation));
        let Some(list) = self.series.get_mut(&hash) else {
            return false;
        };
        let Some(pos) = list.iter().position(|s| {
            &*s.labels.service == service
                && &*s.labels.model == model
                && &*s.labels.operation == operation
        }) else {
            return false;
        };
        let handles = list.swap_remove(pos);
        if list.is_empty() {
            self.series.remove(&hash);
        }
        self.series_count -= 1;
        self.recent.clear();
        let labels = &handles.labels;
        let m = &self.metrics;
        for outcome in OUTCOMES {
            let request = labels.with_outcome(outcome);
            m.requests.remove(&request);
            if handles.outcomes[outcome_index(outcome)].get().is_none() {
                continue;
            }
            for h in [
                &m.request_duration,
                &m.queue_duration,
                &m.prefill_duration,
                &m.decode_duration,
                &m.ttft,
                &m.tpot,
            ] {
                h.remove(&request);
            }
        }
        for r#type in ["input", "output"] {
            m.tokens.remove(&TokenLabels {
                service: labels.service.clone(),
                model: labels.model.clone(),
                operation: labels.operation.clone(),
                r#type,
            });
        }
        m.goodput.remove(labels);
        m.gpu_energy.remove(labels);
        if let Some(i) = self.disagg.iter().position(|(l, _)| l == labels) {
            for (l, _) in self.disagg.swap_remove(i).1 {
                m.disagg_phase_duration.remove(&l);
            }
        }
        true
    }

    fn new_series(&self, service: &str, model: &str, operation: &str) -> SeriesHandles {
        let labels = SeriesLabels {
            service: Arc::from(service),
            model: Arc::from(model),
            operation: Arc::from(operation),
        };
        let token = |t: &'static str| TokenLabels {
            service: labels.service.clone(),
            model: labels.model.clone(),
            operation: labels.operation.clone(),
            r#type: t,
        };
        let m = &self.metrics;
        let requests = OUTCOMES.map(|outcome| {
            m.requests
                .get_or_create_owned(&labels.with_outcome(outcome))
        });
        SeriesHandles {
            requests,
            input_tokens: m.tokens.get_or_create_owned(&token("input")),
            output_tokens: m.tokens.get_or_create_owned(&token("output")),
            goodput: m.goodput.get_or_create_owned(&labels),
            gpu_energy: OnceLock::new(),
            outcomes: Default::default(),
            labels,
        }
    }

    /// Removes the `critical_path_seconds_total` series of (`service`, `span`), whose key the
    /// critical-path windows gave to a new pair (the same cap, the same keys): its place is
    /// free for that pair. Returns whether it was there.
    pub fn forget_critical_path(&mut self, service: &str, span: &str) -> bool {
        let hash = self.hasher.hash_one((service, span));
        let Some(list) = self.cp_keys.get_mut(&hash) else {
            return false;
        };
        let Some(pos) = list
            .iter()
            .position(|(s, n, _)| &**s == service && &**n == span)
        else {
            return false;
        };
        let (service, span, _) = list.swap_remove(pos);
        if list.is_empty() {
            self.cp_keys.remove(&hash);
        }
        self.cp_count -= 1;
        self.cp_recent.clear();
        self.metrics
            .critical_path
            .remove(&CriticalPathLabels { service, span });
        true
    }

    /// Adds a request's critical-path segments to `critical_path_seconds_total`. A segment
    /// whose (service, span) has no series yet gets one when `kept(service, span)` — the
    /// critical-path windows keep that key (the pipeline passes their
    /// [`has_key`](infertrace_analysis::critical_path::CriticalPathWindows::has_key)), so that
    /// both fold the same keys into `__overflow__` — and the exporter's own cap has room; else
    /// it is added to the `__overflow__` series.
    pub fn record_critical_path(&mut self, path: &CriticalPath, kept: &dyn Fn(&str, &str) -> bool) {
        for seg in &path.segments {
            let secs = seg.duration_nanos() as f64 / 1e9;
            if secs <= 0.0 {
                continue;
            }
            // The usual case: the same service and name allocations as a recent segment.
            if let Some(c) = self.cp_recent.get(&seg.service, &seg.name) {
                c.inc_by(&self.writer, secs);
                continue;
            }
            let name = aggregate_name(seg.name.as_str());
            let hash = self.hasher.hash_one((&*seg.service, name));
            if let Some((_, _, c)) = self.cp_keys.get(&hash).and_then(|v| {
                v.iter()
                    .find(|(s, n, _)| **s == *seg.service && **n == *name)
            }) {
                c.inc_by(&self.writer, secs);
                self.cp_recent.insert(&seg.service, &seg.name, c.clone());
                continue;
            }
            let overflow =
                self.cp_count >= MAX_CRITICAL_PATH_KEYS || !kept(&seg.service, seg.name.as_str());
            let (service, span, h) = if overflow {
                let o: Arc<str> = Arc::from(OVERFLOW_LABEL);
                (
                    o.clone(),
                    o,
                    self.hasher.hash_one((OVERFLOW_LABEL, OVERFLOW_LABEL)),
                )
            } else {
                (Arc::from(seg.service.as_str()), Arc::from(name), hash)
            };
            let existing = self.cp_keys.get(&h).and_then(|v| {
                v.iter()
                    .find(|(s, n, _)| *s == service && *n == span)
                    .map(|(_, _, c)| c.clone())
            });
            let counter = match existing {
                Some(c) => c,
                None => {
                    let c = self
                        .metrics
                        .critical_path
                        .get_or_create_owned(&CriticalPathLabels {
                            service: service.clone(),
                            span: span.clone(),
                        });
                    self.cp_keys
                        .entry(h)
                        .or_default()
                        .push((service, span, c.clone()));
                    // The overflow series takes no place under the cap.
                    self.cp_count += usize::from(!overflow);
                    c
                }
            };
            counter.inc_by(&self.writer, secs);
            self.cp_recent.insert(&seg.service, &seg.name, counter);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infertrace_analysis::record::{Dialect, GpuRecord};
    use infertrace_analysis::text::Text;
    use infertrace_analysis::trace::{SpanId, TraceId};

    fn record(model: &str, e2e: f64) -> RequestRecord {
        let mut r = RequestRecord::new(
            TraceId([1; 16]),
            SpanId([1; 8]),
            Text::from("svc"),
            Dialect::Infertrace,
            0,
            (e2e * 1e9) as u64,
        );
        r.model = model.into();
        r.operation = "chat".into();
        r.e2e = e2e;
        r
    }

    fn recorder(max_series: usize) -> (PromRecorder, Registry) {
        let metrics = PromMetrics::default();
        let registry = build_registry(&metrics, &InternalEvents::default());
        let rec = PromRecorder::new(
            metrics,
            vec![Dimension::Service, Dimension::Model, Dimension::Operation],
            SloConfig::default(),
            max_series,
        );
        (rec, registry)
    }

    #[test]
    fn histograms_use_the_genai_buckets_and_count() {
        let (mut rec, registry) = recorder(10);
        let mut r = record("m", 0.05);
        r.ttft = Some(0.03);
        r.tpot = Some(0.02);
        r.queue = Some(0.0015);
        r.input_tokens = Some(100);
        r.output_tokens = Some(7);
        assert!(rec.record(&r));
        assert!(rec.record(&record("m", 3.0)));
        let text = encode(&registry);
        let l = r#"service="svc",model="m",operation="chat",outcome="ok""#;
        assert!(
            text.contains(&format!("infertrace_requests_total{{{l}}} 2")),
            "{text}"
        );
        // 0.05 falls in (0.04, 0.08]; 3.0 in (2.56, 5.12].
        assert!(
            text.contains(&format!(
                "infertrace_request_duration_seconds_bucket{{le=\"0.04\",{l}}} 0"
            )),
            "{text}"
        );
        assert!(text.contains(&format!(
            "infertrace_request_duration_seconds_bucket{{le=\"0.08\",{l}}} 1"
        )));
        assert!(text.contains(&format!(
            "infertrace_request_duration_seconds_bucket{{le=\"5.12\",{l}}} 2"
        )));
        assert!(text.contains(&format!(
            "infertrace_request_duration_seconds_sum{{{l}}} 3.05"
        )));
        assert!(text.contains(&format!(
            "infertrace_time_to_first_token_seconds_bucket{{le=\"0.04\",{l}}} 1"
        )));
        assert!(text.contains(&format!(
            "infertrace_queue_duration_seconds_bucket{{le=\"0.002\",{l}}} 1"
        )));
        assert!(text.contains(
            r#"infertrace_tokens_total{service="svc",model="m",operation="chat",type="output"} 7"#
        ));
        assert!(text.contains(
            r#"infertrace_goodput_requests_total{service="svc",model="m",operation="chat"} 2"#
        ));
        assert!(
            !text.contains("infertrace_gpu_energy_joules_total{"),
            "no GPU, no energy series: {text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    /// An overloaded server's TTFT past the conventions' last bucket (10 s) lands in a bucket
    /// of its own, so `histogram_quantile` does not read it as 10 s.
    #[test]
    fn times_past_the_conventions_last_bucket_keep_a_bound() {
        let (mut rec, registry) = recorder(10);
        let mut r = record("m", 120.0);
        r.ttft = Some(15.0);
        r.queue = Some(100.0);
        assert!(rec.record(&r));
        let text = encode(&registry);
        let l = r#"service="svc",model="m",operation="chat",outcome="ok""#;
        for (family, empty, holds) in [
            ("time_to_first_token", "10.0", "20.0"),
            ("request_duration", "81.92", "163.84"),
            ("queue_duration", "81.92", "163.84"),
        ] {
            for (le, n) in [(empty, 0), (holds, 1)] {
                let line = format!("infertrace_{family}_seconds_bucket{{le=\"{le}\",{l}}} {n}");
                assert!(text.contains(&line), "{line}\n{text}");
            }
        }
    }

    #[test]
    fn gpu_energy_is_a_series_once_a_request_brings_energy() {
        let (mut rec, registry) = recorder(10);
        assert!(rec.record(&record("m", 1.0)));
        let mut r = record("m", 1.0);
        r.gpu = Some(Box::new(GpuRecord {
            energy_attributed_joules: Some(2.5),
            ..GpuRecord::default()
        }));
        assert!(rec.record(&r));
        assert!(rec.record(&r));
        let text = encode(&registry);
        assert!(
            text.contains(
                r#"infertrace_gpu_energy_joules_total{service="svc",model="m",operation="chat"} 5.0"#
            ),
            "{text}"
        );
    }

    #[test]
    fn disaggregated_sub_phases_are_histograms_per_pool_and_worker_and_go_with_their_series() {
        let (mut rec, registry) = recorder(10);
        let pd = |prefill: &str, kv: f64| {
            let mut r = record("m", 1.0);
            r.disagg = Some(Box::new(DisaggPhases {
                routing: Some(0.001),
                prefill: Some(0.03),
                kv_transfer: Some(kv),
                decode_wait: Some(0.003),
                prefill_worker: Some(Text::from(prefill)),
                decode_worker: Some(Text::from("pd-decode-0")),
                ..DisaggPhases::default()
            }));
            r
        };
        rec.record(&pd("pd-prefill-0", 0.0015));
        rec.record(&pd("pd-prefill-0", 0.05));
        rec.record(&pd("pd-prefill-1", 0.05));
        let mut failed = pd("pd-prefill-1", 0.05);
        failed.outcome = Outcome::Error;
        rec.record(&failed);
        let text = encode(&registry);
        let l = r#"service="svc",model="m",operation="chat""#;
        let count = |pool: &str, worker: &str, phase: &str| {
            let line = format!(
                "infertrace_disagg_phase_duration_seconds_count{{{l},pool=\"{pool}\",worker=\"{worker}\",phase=\"{phase}\"}} "
            );
            text.lines()
                .find_map(|x| x.strip_prefix(line.as_str()))
                .and_then(|n| n.parse::<u64>().ok())
        };
        assert_eq!(
            count("prefill", "pd-prefill-0", "kv_transfer"),
            Some(2),
            "{text}"
        );
        // The failed request is not observed.
        assert_eq!(count("prefill", "pd-prefill-1", "kv_transfer"), Some(1));
        assert_eq!(count("decode", "pd-decode-0", "decode_wait"), Some(3));
        assert_eq!(count("router", "", "routing"), Some(3));
        // Sub-phases the records did not carry have no label set.
        assert_eq!(count("prefill", "pd-prefill-0", "bootstrap"), None);
        // 0.0015 s falls in the phase buckets' (0.001, 0.002] bucket.
        assert!(text.contains(&format!(
            "infertrace_disagg_phase_duration_seconds_bucket{{le=\"0.002\",{l},pool=\"prefill\",worker=\"pd-prefill-0\",phase=\"kv_transfer\"}} 1"
        )), "{text}");
        // The series' removal takes its disaggregated label sets along.
        assert!(rec.forget(&SeriesKey {
            service: Arc::from("svc"),
            model: Arc::from("m"),
            operation: Arc::from("chat"),
        }));
        let text = encode(&registry);
        assert!(
            !text.contains("infertrace_disagg_phase_duration_seconds_count{"),
            "{text}"
        );
    }

    #[test]
    fn series_are_capped_into_overflow() {
        let (mut rec, registry) = recorder(2);
        assert!(rec.record(&record("a", 1.0)));
        assert!(rec.record(&record("b", 1.0)));
        assert!(!rec.record(&record("c", 1.0)));
        assert!(!rec.record(&record("d", 1.0)));
        assert!(
            rec.record(&record("a", 1.0)),
            "existing series still recorded"
        );
        let text = encode(&registry);
        assert!(text.contains(
            r#"infertrace_requests_total{service="__overflow__",model="__overflow__",operation="__overflow__",outcome="ok"} 2"#
        ), "{text}");
        assert!(!text.contains(r#"model="c""#));
    }

    /// After a restart the KPI windows come back with their series and the exporter empty: a
    /// request the KPI windows put in their overflow series goes there here too, and once
    /// they admit its series (another reclaimed), it gets its own label set.
    #[test]
    fn requests_follow_the_kpi_windows_into_overflow() {
        let (mut rec, registry) = recorder(10);
        assert!(!rec.record_in(&record("real", 1.0), false));
        assert!(!rec.record_in(&record("real", 1.0), false));
        let text = encode(&registry);
        assert!(text.contains(
            r#"infertrace_requests_total{service="__overflow__",model="__overflow__",operation="__overflow__",outcome="ok"} 2"#
        ), "{text}");
        assert!(!text.contains(r#"model="real""#), "{text}");
        assert!(rec.record_in(&record("real", 1.0), true));
        assert!(
            encode(&registry).contains(r#"model="real",operation="chat",outcome="ok"} 1"#),
            "{}",
            encode(&registry)
        );
    }

    #[test]
    fn outcomes_are_separate_series_and_errors_are_not_goodput() {
        let (mut rec, registry) = recorder(10);
        let mut r = record("m", 0.1);
        r.outcome = Outcome::Error;
        rec.record(&r);
        let text = encode(&registry);
        assert!(text.contains(r#"outcome="error"} 1"#), "{text}");
        assert!(
            !text.contains(r#"goodput_requests_total{service="svc",model="m",operation="chat"} 1"#)
        );
    }

    /// Refused (a panic) in debug builds, logged in release builds: holds under both.
    #[test]
    fn a_second_recorder_on_the_same_metrics_is_refused_in_debug_builds() {
        let metrics = PromMetrics::default();
        let _first = PromRecorder::new(metrics.clone(), vec![], SloConfig::default(), 10);
        let second = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            PromRecorder::new(metrics, vec![], SloConfig::default(), 10)
        }));
        assert_eq!(second.is_err(), cfg!(debug_assertions));
    }

    #[test]
    fn dimensions_left_out_are_empty() {
        let metrics = PromMetrics::default();
        let registry = build_registry(&metrics, &InternalEvents::default());
        let mut rec = PromRecorder::new(metrics, vec![Dimension::Model], SloConfig::default(), 10);
        rec.record(&record("m", 0.1));
        let text = encode(&registry);
        assert!(
            text.contains(
                r#"infertrace_requests_total{service="",model="m",operation="",outcome="ok"} 1"#
            ),
            "{text}"
        );
    }

    #[test]
    fn alerts_gauge() {
        let (rec, registry) = recorder(10);
        rec.metrics().set_alert("slow", 1);
        assert!(encode(&registry).contains(r#"infertrace_alerts_active{alert="slow"} 1"#));
        rec.metrics().set_alert("slow", 0);
        assert!(encode(&registry).contains(r#"infertrace_alerts_active{alert="slow"} 0"#));
    }
}
