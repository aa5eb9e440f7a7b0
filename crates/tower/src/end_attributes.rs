//! [`EndAttributes`]: the request span's attributes that are known only when the request ends,
//! computed once and written in one pass.
//!
//! Writing goes through an [`AttributeWriter`]: on the direct path the attributes go straight
//! into the span's own vector (one `Vec::push` each), and the OTLP encoder writes them as
//! protobuf without making a `KeyValue` of each.

use std::borrow::Cow;
use std::sync::Arc;

use opentelemetry::{KeyValue, StringValue};

use infertrace_semconv::{gen_ai, infer, latency, net};

use crate::attribute_writer::{AttributeWriter, KeyValues};

/// The response status attribute: HTTP status code or gRPC status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatusCode {
    /// `http.response.status_code`.
    Http(u16),
    /// `rpc.grpc.status_code`.
    Grpc(i32),
}

/// How the request ended, as the request span says it (docs/reference.md#names). `None` fields are
/// not written.
#[derive(Debug, Default)]
pub(crate) struct EndAttributes {
    pub(crate) response_model: Option<StringValue>,
    pub(crate) max_tokens: Option<u64>,
    /// `gen_ai.request.stream`, when known.
    pub(crate) streamed: Option<bool>,
    pub(crate) response_id: Option<Arc<str>>,
    pub(crate) finish_reason: Option<Arc<str>>,
    pub(crate) input_tokens: Option<u64>,
    pub(crate) output_tokens: Option<u64>,
    /// Prompt tokens served from the prefix cache, when the engine reported them.
    pub(crate) cache_read_input_tokens: Option<u64>,
    pub(crate) status: Option<StatusCode>,
    pub(crate) queue: Option<f64>,
    pub(crate) ttft: Option<f64>,
    pub(crate) prefill: Option<f64>,
    pub(crate) decode: Option<f64>,
    pub(crate) inference: Option<f64>,
    pub(crate) e2e: f64,
    pub(crate) tpot: Option<f64>,
    pub(crate) time_to_first_chunk: Option<f64>,
    /// Inter-token gap p50, p99 and max, when there were gaps.
    pub(crate) gaps: Option<(Option<f64>, Option<f64>, Option<f64>)>,
    pub(crate) chunks: u64,
    pub(crate) outcome: &'static str,
    pub(crate) phase_source: Option<&'static str>,
    pub(crate) queue_depth: Option<usize>,
    pub(crate) error_type: Option<Cow<'static, str>>,
}

impl EndAttributes {
    /// Passes every attribute to `push`, in a fixed order.
    #[inline]
    pub(crate) fn write(&self, push: &mut impl FnMut(KeyValue)) {
        self.write_to(&mut KeyValues(push));
    }

    /// Writes every attribute to `out`, in a fixed order (the one order of the request span's
    /// end attributes, whatever the destination).
    #[inline]
    pub(crate) fn write_to(&self, out: &mut impl AttributeWriter) {
        if let Some(m) = &self.response_model {
            out.string(gen_ai::RESPONSE_MODEL, m);
        }
        if let Some(n) = self.max_tokens {
            out.i64(gen_ai::REQUEST_MAX_TOKENS, n as i64);
        }
        if let Some(streamed) = self.streamed {
            out.bool(gen_ai::REQUEST_STREAM, streamed);
        }
        if let Some(id) = &self.response_id {
            out.shared(gen_ai::RESPONSE_ID, id);
        }
        if let Some(reason) = &self.finish_reason {
            out.shared_list(gen_ai::RESPONSE_FINISH_REASONS, reason);
        }
        if let Some(n) = self.input_tokens {
            out.i64(gen_ai::USAGE_INPUT_TOKENS, n as i64);
        }
        if let Some(n) = self.output_tokens {
            out.i64(gen_ai::USAGE_OUTPUT_TOKENS, n as i64);
        }
        if let Some(n) = self.cache_read_input_tokens {
            out.i64(gen_ai::USAGE_CACHE_READ_INPUT_TOKENS, n as i64);
        }
        match self.status {
            Some(StatusCode::Grpc(code)) => out.i64(net::RPC_GRPC_STATUS_CODE, i64::from(code)),
            Some(StatusCode::Http(code)) => {
                out.i64(net::HTTP_RESPONSE_STATUS_CODE, i64::from(code));
            }
            None => {}
        }
        let mut seconds = |key: &'static str, v: Option<f64>| {
            if let Some(v) = v {
                out.f64(key, v);
            }
        };
        seconds(latency::TIME_IN_QUEUE, self.queue);
        seconds(latency::TIME_TO_FIRST_TOKEN, self.ttft);
        seconds(latency::TIME_IN_MODEL_PREFILL, self.prefill);
        seconds(latency::TIME_IN_MODEL_DECODE, self.decode);
        seconds(latency::TIME_IN_MODEL_INFERENCE, self.inference);
        seconds(latency::E2E, Some(self.e2e));
        seconds(infer::TIME_PER_OUTPUT_TOKEN, self.tpot);
        seconds(infer::TIME_TO_FIRST_CHUNK, self.time_to_first_chunk);
        if let Some((p50, p99, max)) = self.gaps {
            seconds(infer::INTER_TOKEN_LATENCY_P50, p50);
            seconds(infer::INTER_TOKEN_LATENCY_P99, p99);
            seconds(infer::INTER_TOKEN_LATENCY_MAX, max);
        }
        out.i64(infer::STREAM_CHUNKS, self.chunks as i64);
        out.static_str(infer::OUTCOME, self.outcome);
        if let Some(source) = self.phase_source {
            out.static_str(infer::PHASE_SOURCE, source);
        }
        if let Some(depth) = self.queue_depth {
            out.i64(infer::QUEUE_DEPTH, depth as i64);
        }
        if let Some(kind) = &self.error_type {
            out.cow(net::ERROR_TYPE, kind);
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::{Array, Value};

    use super::*;

    fn keys(end: &EndAttributes) -> Vec<String> {
        let mut out = Vec::new();
        end.write(&mut |kv| out.push(kv.key.as_str().to_owned()));
        out
    }

    #[test]
    fn absent_values_are_not_written() {
        let end = EndAttributes {
            e2e: 0.5,
            outcome: infer::outcome::OK,
            ..EndAttributes::default()
        };
        assert_eq!(
            keys(&end),
            [latency::E2E, infer::STREAM_CHUNKS, infer::OUTCOME]
        );
    }

    #[test]
    fn every_value_is_written_once() {
        let id: Arc<str> = Arc::from("resp-1");
        let reason: Arc<str> = Arc::from("stop");
        let end = EndAttributes {
            response_model: Some(StringValue::from("m")),
            max_tokens: Some(16),
            streamed: Some(true),
            response_id: Some(id),
            finish_reason: Some(reason),
            input_tokens: Some(3),
            output_tokens: Some(4),
            cache_read_input_tokens: Some(2),
            status: Some(StatusCode::Grpc(0)),
            queue: Some(0.1),
            ttft: Some(0.2),
            prefill: Some(0.1),
            decode: Some(0.3),
            inference: Some(0.4),
            e2e: 0.5,
            tpot: Some(0.1),
            time_to_first_chunk: Some(0.2),
            gaps: Some((Some(0.1), Some(0.2), Some(0.3))),
            chunks: 4,
            outcome: infer::outcome::ERROR,
            phase_source: Some(infer::phase_source::ENGINE),
            queue_depth: Some(2),
            error_type: Some(Cow::Borrowed("engine_oom")),
        };
        let all = keys(&end);
        let mut unique = all.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(all.len(), 25);
        assert_eq!(unique.len(), all.len());
        let mut values = Vec::new();
        end.write(&mut |kv| values.push(kv));
        let get = |k: &str| {
            values
                .iter()
                .find(|kv| kv.key.as_str() == k)
                .map(|kv| &kv.value)
        };
        assert_eq!(
            get(gen_ai::RESPONSE_FINISH_REASONS),
            Some(&Value::Array(Array::String(vec![StringValue::from(
                "stop"
            )])))
        );
        assert_eq!(get(net::RPC_GRPC_STATUS_CODE), Some(&Value::I64(0)));
        assert_eq!(get(net::HTTP_RESPONSE_STATUS_CODE), None);
    }
}
