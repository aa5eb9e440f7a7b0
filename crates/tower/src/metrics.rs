//! The middleware's OpenTelemetry instruments (docs/reference.md#names), with the explicit bucket
//! boundaries the GenAI conventions recommend.

use std::borrow::Cow;
use std::cell::{OnceCell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use opentelemetry::metrics::{BoundHistogram, Histogram, Meter, UpDownCounter};
use opentelemetry::{KeyValue, StringValue};

use infertrace_semconv::{gen_ai, infer, metric, net};

/// Every instrument the layer records into. Cheap to clone (instruments are shared handles).
#[derive(Clone, Debug)]
pub(crate) struct LayerMetrics {
    /// Tells this layer's instruments apart in the per-thread cache of bound instruments
    /// (clones share it: they hold the same instruments).
    id: u64,
    /// Alive while a clone of these instruments is: cached sets of dropped layers are
    /// recognised by their dead `Weak`.
    alive: Arc<()>,
    pub(crate) request_duration: Histogram<f64>,
    pub(crate) time_to_first_token: Histogram<f64>,
    pub(crate) time_per_output_token: Histogram<f64>,
    pub(crate) queue_duration: Histogram<f64>,
    pub(crate) prefill_duration: Histogram<f64>,
    pub(crate) decode_duration: Histogram<f64>,
    pub(crate) token_usage: Histogram<u64>,
    pub(crate) active_requests: UpDownCounter<i64>,
    pub(crate) queue_size: UpDownCounter<i64>,
}

fn seconds(
    meter: &Meter,
    name: &'static str,
    doc: &'static str,
    buckets: &[f64],
) -> Histogram<f64> {
    meter
        .f64_histogram(name)
        .with_unit("s")
        .with_description(doc)
        .with_boundaries(buckets.to_vec())
        .build()
}

impl LayerMetrics {
    pub(crate) fn new(meter: &Meter) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(0);
        Self {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            alive: Arc::new(()),
            request_duration: seconds(
                meter,
                metric::REQUEST_DURATION,
                "GenAI server request duration (arrival to end of response)",
                &metric::REQUEST_DURATION_BUCKETS,
            ),
            time_to_first_token: seconds(
                meter,
                metric::TIME_TO_FIRST_TOKEN,
                "Arrival to first output token",
                &metric::TTFT_BUCKETS,
            ),
            time_per_output_token: seconds(
                meter,
                metric::TIME_PER_OUTPUT_TOKEN,
                "Decode time per output token after the first",
                &metric::TPOT_BUCKETS,
            ),
            queue_duration: seconds(
                meter,
                metric::QUEUE_DURATION,
                "Queue phase duration",
                &metric::PHASE_DURATION_BUCKETS,
            ),
            prefill_duration: seconds(
                meter,
                metric::PREFILL_DURATION,
                "Prefill phase duration",
                &metric::PHASE_DURATION_BUCKETS,
            ),
            decode_duration: seconds(
                meter,
                metric::DECODE_DURATION,
                "Decode phase duration",
                &metric::PHASE_DURATION_BUCKETS,
            ),
            token_usage: meter
                .u64_histogram(metric::TOKEN_USAGE)
                .with_unit("{token}")
                .with_description("Tokens per request, by gen_ai.token.type")
                .with_boundaries(metric::TOKEN_USAGE_BUCKETS.to_vec())
                .build(),
            active_requests: meter
                .i64_up_down_counter(metric::ACTIVE_REQUESTS)
                .with_unit("{request}")
                .with_description("Requests in flight in the layer")
                .build(),
            queue_size: meter
                .i64_up_down_counter(metric::QUEUE_SIZE)
                .with_unit("{request}")
                .with_description("Requests waiting in the layer's admission queue")
                .build(),
        }
    }
}

/// What one finished request contributes to the instruments.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct RequestMeasurements {
    pub(crate) e2e: f64,
    pub(crate) ttft: Option<f64>,
    pub(crate) tpot: Option<f64>,
    pub(crate) queue: Option<f64>,
    pub(crate) prefill: Option<f64>,
    pub(crate) decode: Option<f64>,
    pub(crate) input_tokens: Option<u64>,
    pub(crate) output_tokens: Option<u64>,
}

/// What a request's metrics are recorded under: `gen_ai.operation.name`, `infer.outcome`,
/// `gen_ai.request.model` and `error.type` when known (docs/reference.md#names), plus
/// `gen_ai.token.type` for token usage.
#[derive(Clone, Debug)]
pub(crate) struct MetricKey {
    pub(crate) operation: Cow<'static, str>,
    pub(crate) outcome: &'static str,
    pub(crate) model: Option<StringValue>,
    pub(crate) error_type: Option<Cow<'static, str>>,
}

fn same_str(a: &str, b: &str) -> bool {
    (a.as_ptr() == b.as_ptr() && a.len() == b.len())
        || crate::interning::same_bytes(a.as_bytes(), b.as_bytes())
}

impl MetricKey {
    fn same(&self, other: &Self) -> bool {
        same_str(self.outcome, other.outcome)
            && same_str(&self.operation, &other.operation)
            && match (&self.model, &other.model) {
                (Some(a), Some(b)) => same_str(a.as_str(), b.as_str()),
                (None, None) => true,
                _ => false,
            }
            && match (&self.error_type, &other.error_type) {
                (Some(a), Some(b)) => same_str(a, b),
                (None, None) => true,
                _ => false,
            }
    }

    /// The attributes (the token type, where it applies, is added after them).
    fn attributes(&self) -> Vec<KeyValue> {
        let mut attrs = Vec::with_capacity(5);
        attrs.push(KeyValue::new(
            gen_ai::OPERATION_NAME,
            self.operation.clone(),
        ));
        attrs.push(KeyValue::new(infer::OUTCOME, self.outcome));
        if let Some(m) = &self.model {
            attrs.push(KeyValue::new(gen_ai::REQUEST_MODEL, m.clone()));
        }
        if let Some(kind) = &self.error_type {
            attrs.push(KeyValue::new(net::ERROR_TYPE, kind.clone()));
        }
        attrs
    }
}

/// The layer's histograms bound to one [`MetricKey`], each bound on its first value: binding
/// makes the SDK export the series, so a histogram the requests of this set never record (TTFT
/// of embeddings, say) must stay unbound, as it would be unrecorded without binding.
struct BoundInstruments {
    /// The key's attributes.
    attributes: Vec<KeyValue>,
    /// In the order of [`RequestMeasurements::seconds`].
    seconds: [OnceCell<BoundHistogram<f64>>; 6],
    input_tokens: OnceCell<BoundHistogram<u64>>,
    output_tokens: OnceCell<BoundHistogram<u64>>,
}

/// Bound attribute sets kept per thread (over all layers). When full, sets of layers that are
/// gone are dropped first, then the oldest set is replaced (round robin), so new sets (new
/// models, a new layer) are bound too.
const MAX_BOUND_PER_THREAD: usize = 64;

/// One cached set: whose it is, its key, its instruments.
struct BoundEntry {
    layer: u64,
    alive: Weak<()>,
    key: MetricKey,
    instruments: Rc<BoundInstruments>,
}

#[derive(Default)]
struct BoundCache {
    entries: Vec<BoundEntry>,
    /// The next entry to replace when full.
    hand: usize,
}

impl BoundCache {
    /// The instruments of `layer` bound to `key`, cached now if they were not.
    fn get_or_insert(&mut self, layer: &LayerMetrics, key: MetricKey) -> Rc<BoundInstruments> {
        if let Some(e) = self
            .entries
            .iter()
            .find(|e| e.layer == layer.id && e.key.same(&key))
        {
            return Rc::clone(&e.instruments);
        }
        let attributes = key.attributes();
        let instruments = Rc::new(BoundInstruments::new(attributes));
        let entry = BoundEntry {
            layer: layer.id,
            alive: Arc::downgrade(&layer.alive),
            key,
            instruments: Rc::clone(&instruments),
        };
        if self.entries.len() >= MAX_BOUND_PER_THREAD {
            self.entries.retain(|e| e.alive.strong_count() > 0);
        }
        if self.entries.len() < MAX_BOUND_PER_THREAD {
            self.entries.push(entry);
        } else {
            let victim = self.hand % MAX_BOUND_PER_THREAD;
            self.hand = victim + 1;
            self.entries[victim] = entry;
        }
        instruments
    }
}

thread_local! {
    /// A thread records with its own handles: no lock.
    static BOUND: RefCell<BoundCache> = RefCell::new(BoundCache::default());
}

impl LayerMetrics {
    /// Records one finished request's measurements under `key`: through instruments bound to
    /// `key` (cached per thread: no attribute sorting or lookup per call), or unbound if the
    /// cache is busy (re-entered).
    pub(crate) fn record(&self, m: &RequestMeasurements, key: MetricKey) {
        let bound = BOUND.with(|cell| match cell.try_borrow_mut() {
            Ok(mut cache) => Ok(cache.get_or_insert(self, key)),
            Err(_) => Err(key),
        });
        match bound {
            Ok(b) => b.record(self, m),
            Err(key) => self.record_unbound(m, &key),
        }
    }

    /// The histograms in seconds, in the order of [`RequestMeasurements::seconds`].
    fn second_histograms(&self) -> [&Histogram<f64>; 6] {
        [
            &self.request_duration,
            &self.time_to_first_token,
            &self.time_per_output_token,
            &self.queue_duration,
            &self.prefill_duration,
            &self.decode_duration,
        ]
    }

    fn record_unbound(&self, m: &RequestMeasurements, key: &MetricKey) {
        let mut attrs = key.attributes();
        let used = attrs.len();
        for (histogram, value) in self.second_histograms().into_iter().zip(m.seconds()) {
            if let Some(v) = value {
                histogram.record(v, &attrs[..used]);
            }
        }
        attrs.push(KeyValue::new(gen_ai::TOKEN_TYPE, "input"));
        for (kind, count) in [("input", m.input_tokens), ("output", m.output_tokens)] {
            if let Some(n) = count {
                attrs[used] = KeyValue::new(gen_ai::TOKEN_TYPE, kind);
                self.token_usage.record(n, &attrs);
            }
        }
    }
}

impl RequestMeasurements {
    /// e2e, TTFT, TPOT, queue, prefill, decode: the values recorded in seconds.
    fn seconds(&self) -> [Option<f64>; 6] {
        [
            Some(self.e2e),
            self.ttft,
            self.tpot,
            self.queue,
            self.prefill,
            self.decode,
        ]
    }
}

impl BoundInstruments {
    fn new(attributes: Vec<KeyValue>) -> Self {
        Self {
            attributes,
            seconds: Default::default(),
            input_tokens: OnceCell::new(),
            output_tokens: OnceCell::new(),
        }
    }

    /// The token histogram bound to the key's attributes and `gen_ai.token.type = kind`.
    fn bind_tokens(&self, metrics: &LayerMetrics, kind: &'static str) -> BoundHistogram<u64> {
        let mut attrs = Vec::with_capacity(self.attributes.len() + 1);
        attrs.extend(self.attributes.iter().cloned());
        attrs.push(KeyValue::new(gen_ai::TOKEN_TYPE, kind));
        metrics.token_usage.bind(&attrs)
    }

    fn record(&self, metrics: &LayerMetrics, m: &RequestMeasurements) {
        let histograms = metrics.second_histograms();
        for ((cell, histogram), value) in self.seconds.iter().zip(histograms).zip(m.seconds()) {
            if let Some(v) = value {
                cell.get_or_init(|| histogram.bind(&self.attributes))
                    .record(v);
            }
        }
        if let Some(n) = m.input_tokens {
            self.input_tokens
                .get_or_init(|| self.bind_tokens(metrics, "input"))
                .record(n);
        }
        if let Some(n) = m.output_tokens {
            self.output_tokens
                .get_or_init(|| self.bind_tokens(metrics, "output"))
                .record(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
    use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

    use super::*;

    fn provider() -> (SdkMeterProvider, InMemoryMetricExporter) {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        (provider, exporter)
    }

    fn key(outcome: &'static str, model: String) -> MetricKey {
        MetricKey {
            operation: Cow::Borrowed("chat"),
            outcome,
            model: Some(StringValue::from(model)),
            error_type: None,
        }
    }

    /// (sorted attribute values, count, sum) of histogram `name`, sorted.
    fn points(exporter: &InMemoryMetricExporter, name: &str) -> Vec<(String, u64, f64)> {
        let mut out = Vec::new();
        for rm in exporter.get_finished_metrics().unwrap_or_default() {
            for sm in rm.scope_metrics() {
                for m in sm.metrics().filter(|m| m.name() == name) {
                    let AggregatedMetrics::F64(MetricData::Histogram(h)) = m.data() else {
                        continue;
                    };
                    for p in h.data_points() {
                        let mut attrs: Vec<String> =
                            p.attributes().map(|kv| kv.value.to_string()).collect();
                        attrs.sort();
                        out.push((attrs.join(","), p.count(), p.sum()));
                    }
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn measurements(e2e: f64) -> RequestMeasurements {
        RequestMeasurements {
            e2e,
            ttft: Some(e2e / 10.0),
            input_tokens: Some(3),
            output_tokens: Some(5),
            ..RequestMeasurements::default()
        }
    }

    #[test]
    fn every_set_is_recorded_and_layers_stay_apart() {
        let (pa, ea) = provider();
        let (pb, eb) = provider();
        let a = LayerMetrics::new(&pa.meter("a"));
        let b = LayerMetrics::new(&pb.meter("b"));
        // More sets than a thread keeps bound: older ones are replaced and bound again.
        for _ in 0..2 {
            for i in 0..(MAX_BOUND_PER_THREAD + 6) {
                a.record(&measurements(1.0), key("ok", format!("m{i}")));
            }
        }
        a.record(&measurements(3.0), key("error", "m0".into()));
        b.record(&measurements(2.0), key("ok", "m0".into()));
        // Unbound (as when the cache is in use) lands in the same series.
        a.record_unbound(&measurements(1.0), &key("ok", "m1".into()));
        let _ = pa.force_flush();
        let _ = pb.force_flush();
        let got = points(&ea, metric::REQUEST_DURATION);
        assert_eq!(got.len(), MAX_BOUND_PER_THREAD + 7);
        for (attrs, count, sum) in &got {
            if attrs.contains("error") {
                assert_eq!((*count, *sum), (1, 3.0), "{attrs}");
            } else if attrs == "chat,m1,ok" {
                assert_eq!((*count, *sum), (3, 3.0), "{attrs}");
            } else {
                assert_eq!((*count, *sum), (2, 2.0), "{attrs}");
            }
        }
        assert_eq!(
            points(&eb, metric::REQUEST_DURATION),
            [("chat,m0,ok".to_owned(), 1, 2.0)]
        );
        assert_eq!(points(&ea, metric::TIME_TO_FIRST_TOKEN).len(), got.len());
    }

    #[test]
    fn a_histogram_no_request_of_a_set_recorded_exports_nothing() {
        let (p, e) = provider();
        let layer = LayerMetrics::new(&p.meter("a"));
        let embeddings = RequestMeasurements {
            e2e: 0.5,
            ..RequestMeasurements::default()
        };
        layer.record(&embeddings, key("ok", "embedder".into()));
        let _ = p.force_flush();
        assert_eq!(points(&e, metric::REQUEST_DURATION).len(), 1);
        for name in [
            metric::TIME_TO_FIRST_TOKEN,
            metric::TIME_PER_OUTPUT_TOKEN,
            metric::QUEUE_DURATION,
            metric::DECODE_DURATION,
        ] {
            assert!(points(&e, name).is_empty(), "{name}");
        }
    }

    #[test]
    fn sets_of_dropped_layers_make_room_first() {
        let (p, _e) = provider();
        let keep = LayerMetrics::new(&p.meter("keep"));
        keep.record(&measurements(1.0), key("ok", "kept".into()));
        {
            let gone = LayerMetrics::new(&p.meter("gone"));
            for i in 0..MAX_BOUND_PER_THREAD - 1 {
                gone.record(&measurements(1.0), key("ok", format!("g{i}")));
            }
        }
        // The cache is full; the next set purges the dropped layer's sets, not `keep`'s.
        BOUND.with(|cell| assert_eq!(cell.borrow().entries.len(), MAX_BOUND_PER_THREAD));
        keep.record(&measurements(1.0), key("ok", "new".into()));
        BOUND.with(|cell| {
            let cache = cell.borrow();
            let models: Vec<String> = cache
                .entries
                .iter()
                .filter_map(|e| e.key.model.as_ref().map(|m| m.as_str().to_owned()))
                .collect();
            assert!(models.contains(&"kept".to_owned()), "{models:?}");
            assert!(models.contains(&"new".to_owned()), "{models:?}");
            assert!(cache.entries.iter().all(|e| e.alive.strong_count() > 0));
        });
    }
}
