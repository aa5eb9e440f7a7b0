//! The middleware's OpenTelemetry instruments (REFERENCE.md §1), with the explicit bucket
//! boundaries the GenAI conventions recommend.

use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::metrics::{BoundHistogram, Histogram, Meter, UpDownCounter};
use opentelemetry::{KeyValue, StringValue};

use infertrace_semconv::{gen_ai, infer, metric, net};

/// Every instrument the layer records into. Cheap to clone (instruments are shared handles).
#[derive(Clone, Debug)]
pub(crate) struct LayerMetrics {
    /// Tells this layer's instruments apart in the per-thread cache of bound instruments
    /// (clones share it: they hold the same instruments).
    id: u64,
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
/// `gen_ai.request.model` and `error.type` when known (REFERENCE.md §1), plus
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

    /// The attributes, and how many there are (room is left for the token type).
    fn attributes(&self) -> (Vec<KeyValue>, usize) {
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
        let used = attrs.len();
        (attrs, used)
    }
}

/// The layer's histograms bound to one [`MetricKey`].
struct BoundInstruments {
    /// In the order of [`RequestMeasurements::seconds`].
    seconds: [BoundHistogram<f64>; 6],
    input_tokens: BoundHistogram<u64>,
    output_tokens: BoundHistogram<u64>,
}

/// Bound attribute sets kept per thread (over all layers); a request whose set is not among
/// them is recorded unbound.
const MAX_BOUND_PER_THREAD: usize = 64;

thread_local! {
    /// (layer id, key, instruments): a thread records with its own handles, no lock.
    static BOUND: RefCell<Vec<(u64, MetricKey, Rc<BoundInstruments>)>> =
        const { RefCell::new(Vec::new()) };
}

impl LayerMetrics {
    /// Records one finished request's measurements under `key`: through instruments bound to
    /// `key` (cached per thread: no attribute sorting or lookup per call), else unbound.
    pub(crate) fn record(&self, m: &RequestMeasurements, key: MetricKey) {
        let bound = BOUND.with(|cell| {
            let mut cache = cell.try_borrow_mut().ok()?;
            let found = cache
                .iter()
                .find(|(id, k, _)| *id == self.id && k.same(&key))
                .map(|(_, _, b)| Rc::clone(b));
            if found.is_some() || cache.len() >= MAX_BOUND_PER_THREAD {
                return found;
            }
            let bound = Rc::new(self.bind(&key));
            cache.push((self.id, key.clone(), Rc::clone(&bound)));
            Some(bound)
        });
        match bound {
            Some(b) => b.record(m),
            None => self.record_unbound(m, &key),
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

    fn bind(&self, key: &MetricKey) -> BoundInstruments {
        let (mut attrs, used) = key.attributes();
        let seconds = self.second_histograms().map(|h| h.bind(&attrs[..used]));
        attrs.push(KeyValue::new(gen_ai::TOKEN_TYPE, "input"));
        let input_tokens = self.token_usage.bind(&attrs);
        attrs[used] = KeyValue::new(gen_ai::TOKEN_TYPE, "output");
        let output_tokens = self.token_usage.bind(&attrs);
        BoundInstruments {
            seconds,
            input_tokens,
            output_tokens,
        }
    }

    fn record_unbound(&self, m: &RequestMeasurements, key: &MetricKey) {
        let (mut attrs, used) = key.attributes();
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
    fn record(&self, m: &RequestMeasurements) {
        for (histogram, value) in self.seconds.iter().zip(m.seconds()) {
            if let Some(v) = value {
                histogram.record(v);
            }
        }
        if let Some(n) = m.input_tokens {
            self.input_tokens.record(n);
        }
        if let Some(n) = m.output_tokens {
            self.output_tokens.record(n);
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
    fn bound_and_unbound_recording_agree_and_layers_stay_apart() {
        let (pa, ea) = provider();
        let (pb, eb) = provider();
        let a = LayerMetrics::new(&pa.meter("a"));
        let b = LayerMetrics::new(&pb.meter("b"));
        // More keys than a thread binds: the later ones are recorded unbound.
        for i in 0..(MAX_BOUND_PER_THREAD + 6) {
            for _ in 0..2 {
                a.record(&measurements(1.0), key("ok", format!("m{i}")));
            }
        }
        a.record(&measurements(3.0), key("error", "m0".into()));
        b.record(&measurements(2.0), key("ok", "m0".into()));
        let _ = pa.force_flush();
        let _ = pb.force_flush();
        let got = points(&ea, metric::REQUEST_DURATION);
        assert_eq!(got.len(), MAX_BOUND_PER_THREAD + 7);
        for (attrs, count, sum) in &got {
            if attrs.contains("error") {
                assert_eq!((*count, *sum), (1, 3.0), "{attrs}");
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
}
