//! The middleware's OpenTelemetry instruments (REFERENCE.md §1), with the explicit bucket
//! boundaries the GenAI conventions recommend.

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, Meter, UpDownCounter};

use infertrace_semconv::metric;

/// Every instrument the layer records into. Cheap to clone (instruments are shared handles).
#[derive(Clone, Debug)]
pub(crate) struct LayerMetrics {
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
        Self {
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

/// A request's metric attributes: operation, outcome, model?, error type?, and one spare slot
/// for `gen_ai.token.type`. Fixed size so recording allocates nothing.
pub(crate) type MetricAttributes = [KeyValue; 5];

impl LayerMetrics {
    /// Records one request. `attrs[..used]` are the request's attributes (`used` ≤ 4); the
    /// token histogram adds `gen_ai.token.type` in the next slot.
    pub(crate) fn record(
        &self,
        m: &RequestMeasurements,
        attrs: &mut MetricAttributes,
        used: usize,
    ) {
        let used = used.min(attrs.len() - 1);
        let base = &attrs[..used];
        self.request_duration.record(m.e2e, base);
        let pairs = [
            (&self.time_to_first_token, m.ttft),
            (&self.time_per_output_token, m.tpot),
            (&self.queue_duration, m.queue),
            (&self.prefill_duration, m.prefill),
            (&self.decode_duration, m.decode),
        ];
        for (instrument, value) in pairs {
            if let Some(v) = value {
                instrument.record(v, base);
            }
        }
        let token_type = infertrace_semconv::gen_ai::TOKEN_TYPE;
        for (kind, count) in [("input", m.input_tokens), ("output", m.output_tokens)] {
            if let Some(n) = count {
                attrs[used] = KeyValue::new(token_type, kind);
                self.token_usage.record(n, &attrs[..=used]);
            }
        }
    }
}
