//! [`RequestRecord`]: one inference request, normalised from whatever dialect reported it.
//!
//! Every dialect (see [`crate::dialect`]) reduces its spans to this one record, so the KPI
//! windows, the critical path and the diagnosis never care which engine served a request.
//! Durations are seconds as `f64`; a phase that the spans do not tell is `None`, never zero.

use infertrace_semconv as sc;
use serde::Serialize;

use crate::trace::{SpanId, Text, TraceId};

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Completed normally.
    Ok,
    /// Failed: handler or engine error, HTTP 5xx, a non-OK gRPC status, span status ERROR.
    Error,
    /// The client went away before the response completed (HTTP 499, gRPC CANCELLED).
    Cancelled,
    /// Refused by admission control (HTTP 429, gRPC RESOURCE_EXHAUSTED).
    Rejected,
}

impl Outcome {
    /// The `infer.outcome` value of this outcome.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => sc::infer::outcome::OK,
            Self::Error => sc::infer::outcome::ERROR,
            Self::Cancelled => sc::infer::outcome::CANCELLED,
            Self::Rejected => sc::infer::outcome::REJECTED,
        }
    }

    /// Parses an `infer.outcome` value (case-insensitive; `canceled` is accepted too).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        [
            (sc::infer::outcome::OK, Self::Ok),
            (sc::infer::outcome::ERROR, Self::Error),
            (sc::infer::outcome::CANCELLED, Self::Cancelled),
            ("canceled", Self::Cancelled),
            (sc::infer::outcome::REJECTED, Self::Rejected),
        ]
        .into_iter()
        .find(|(name, _)| s.eq_ignore_ascii_case(name))
        .map(|(_, o)| o)
    }
}

/// Which engine's conventions a request was reported in (docs/reference.md#dialects).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// infertrace's own request span with `queue` / `prefill` / `decode` children.
    Infertrace,
    /// vLLM's `llm_request` span.
    Vllm,
    /// SGLang's request tree (bootstrap room, per-role request spans, per-thread spans, stage
    /// slices), or a span carrying `gen_ai.latency.*` under another name than vLLM's.
    Sglang,
    /// text-generation-inference router spans (duration strings).
    Tgi,
    /// Any other SERVER span: e2e latency, rate and errors only.
    Generic,
}

impl Dialect {
    /// Lower-case name (`infertrace`, `vllm`, `sglang`, `tgi`, `generic`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Infertrace => "infertrace",
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
            Self::Tgi => "tgi",
            Self::Generic => "generic",
        }
    }
}

/// Whether a phase's number was read or computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PhaseOrigin {
    /// Read directly: a span's own timestamps or an attribute that states this very phase.
    Measured,
    /// Computed from other numbers (e.g. TTFT = queue + prefill, decode = inference − prefill),
    /// or marked `infer.phase.source = derived` by the middleware that emitted it.
    Derived,
}

/// The origin of each phase of a record; `None` where the phase itself is `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PhaseOrigins {
    /// Origin of [`RequestRecord::queue`].
    pub queue: Option<PhaseOrigin>,
    /// Origin of [`RequestRecord::prefill`].
    pub prefill: Option<PhaseOrigin>,
    /// Origin of [`RequestRecord::ttft`].
    pub ttft: Option<PhaseOrigin>,
    /// Origin of [`RequestRecord::decode`].
    pub decode: Option<PhaseOrigin>,
    /// Origin of [`RequestRecord::tpot`].
    pub tpot: Option<PhaseOrigin>,
}

/// Inter-token latency statistics of one streamed response, seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct InterTokenStats {
    /// Median gap between streamed chunks.
    pub p50: f64,
    /// 99th percentile gap.
    pub p99: f64,
    /// Largest gap.
    pub max: f64,
}

/// A value per phase (GPU statistics are reported per phase span).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PerPhase {
    /// Queue phase.
    pub queue: Option<f64>,
    /// Prefill phase.
    pub prefill: Option<f64>,
    /// Decode phase.
    pub decode: Option<f64>,
    /// The `inference` phase (derived mode, non-streamed: prefill and decode not split).
    pub inference: Option<f64>,
}

impl PerPhase {
    /// True when no phase has a value.
    pub fn is_empty(&self) -> bool {
        self.queue.is_none()
            && self.prefill.is_none()
            && self.decode.is_none()
            && self.inference.is_none()
    }
}

/// GPU window statistics of a request, from the `gpu.*` attributes of its phase spans.
///
/// Present only when at least one phase span carried `gpu.*` attributes (no GPU → `None`, never
/// zeros).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct GpuRecord {
    /// `gpu.utilization.mean` per phase, 0–1.
    pub utilization_mean: PerPhase,
    /// `gpu.sm.activity.mean` per phase, 0–1 (Hopper GPM, when available).
    pub sm_activity_mean: PerPhase,
    /// `gpu.power.mean` per phase, watts.
    pub power_mean_watts: PerPhase,
    /// Device energy over the request's phases (sum of `gpu.energy`), joules.
    pub energy_joules: Option<f64>,
    /// Energy attributed to this request by token share (sum of `gpu.energy.attributed`),
    /// joules — an estimate.
    pub energy_attributed_joules: Option<f64>,
    /// Largest `gpu.memory.used.max` over the phases, bytes.
    pub memory_used_max_bytes: Option<f64>,
}

/// Sub-phases of a request served by disaggregated prefill and decode pools (SGLang PD, vLLM
/// behind a KV connector, TensorRT-LLM's disaggregated mode), seconds; `None` where the
/// trace does not tell. Names are [`sc::disagg`]'s.
///
/// Along time to first token they follow one another: routing → bootstrap → prefill queue →
/// prefill → KV transfer → decode wait → first token ([`RequestRecord::ttft_breakdown`]).
/// `decode_bootstrap` runs on the decode worker beside the prefill side and is not part of
/// that sum; `decode` follows the first token.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DisaggPhases {
    /// Router: arrival → forwarded to the chosen workers.
    pub routing: Option<f64>,
    /// Prefill worker: handshake with the decode worker, including the wait for its KV
    /// pre-allocation.
    pub bootstrap: Option<f64>,
    /// Prefill worker: waiting queue → forward.
    pub prefill_queue: Option<f64>,
    /// Prefill worker: the prefill forward (all chunks).
    pub prefill: Option<f64>,
    /// KV-cache transfer from the prefill to the decode worker.
    pub kv_transfer: Option<f64>,
    /// Decode worker: handshake and KV-memory allocation wait (concurrent with prefill).
    pub decode_bootstrap: Option<f64>,
    /// Decode worker: KV received → scheduled into a decode batch.
    pub decode_wait: Option<f64>,
    /// Decode worker: scheduled → first token emitted.
    pub first_token: Option<f64>,
    /// Decode worker: first token → last token.
    pub decode: Option<f64>,
    /// `service.name` of the prefill worker's spans.
    pub prefill_worker: Option<Text>,
    /// `service.name` of the decode worker's spans.
    pub decode_worker: Option<Text>,
}

impl DisaggPhases {
    /// The sub-phases' seconds in time order: routing, bootstrap, prefill queue, prefill, KV
    /// transfer, decode bootstrap, decode wait, first token, decode (the order of
    /// `kpi::disagg::SUB_PHASES`).
    pub fn seconds(&self) -> [Option<f64>; 9] {
        [
            self.routing,
            self.bootstrap,
            self.prefill_queue,
            self.prefill,
            self.kv_transfer,
            self.decode_bootstrap,
            self.decode_wait,
            self.first_token,
            self.decode,
        ]
    }

    /// True when no sub-phase and no worker is known.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// True when only the router's `routing` is known: a request routed to a worker that
    /// serves it whole, not across prefill and decode pools.
    pub fn routing_only(&self) -> bool {
        self.routing.is_some()
            && *self
                == Self {
                    routing: self.routing,
                    ..Self::default()
                }
    }
}

/// Time to first token split across the disaggregated sub-phases, in time order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TtftBreakdown {
    /// `(sub-phase name, seconds)` for each sub-phase the trace told, in time order.
    pub parts: Vec<(&'static str, f64)>,
    /// TTFT − the parts: tokenization, dispatch, hand-over gaps, and sub-phases the trace did
    /// not tell (negative only when reported sub-phases overlap).
    pub unattributed: f64,
}

/// One inference request, normalised.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RequestRecord {
    /// Trace of the request.
    pub trace_id: TraceId,
    /// The request span.
    pub span_id: SpanId,
    /// `service.name` of the request span's resource.
    pub service: Text,
    /// Model (response model, else request model, else [`UNKNOWN`]).
    pub model: Text,
    /// Operation (`gen_ai.operation.name`, else the dialect's best knowledge, else [`UNKNOWN`]).
    pub operation: Text,
    /// How the request ended.
    pub outcome: Outcome,
    /// Which dialect reported it.
    pub dialect: Dialect,
    /// Arrival (the request span's start), Unix nanoseconds.
    pub arrival_unix_nano: u64,
    /// End (the request span's end), Unix nanoseconds.
    pub end_unix_nano: u64,
    /// Arrival → response complete, seconds.
    pub e2e: f64,
    /// Arrival → scheduled, seconds.
    pub queue: Option<f64>,
    /// Scheduled → first token, seconds.
    pub prefill: Option<f64>,
    /// Arrival → first token, seconds.
    pub ttft: Option<f64>,
    /// First token → last token, seconds.
    pub decode: Option<f64>,
    /// Prefill + decode when not split (infertrace's `inference` phase, vLLM's
    /// `time_in_model_inference`, TGI's `inference_time`), seconds.
    pub inference: Option<f64>,
    /// Time per output token = decode / (output tokens − 1), seconds.
    pub tpot: Option<f64>,
    /// Arrival → first response chunk on the wire (`infer.time_to_first_chunk`), seconds.
    pub time_to_first_chunk: Option<f64>,
    /// Inter-token latency statistics of a streamed response.
    pub itl: Option<InterTokenStats>,
    /// Prompt tokens.
    pub input_tokens: Option<u64>,
    /// Generated tokens.
    pub output_tokens: Option<u64>,
    /// Streamed chunks (SSE events / gRPC messages).
    pub stream_chunks: Option<u64>,
    /// Admission-queue length at arrival (`infer.queue.depth`).
    pub queue_depth: Option<u64>,
    /// GPU window statistics, when the phase spans carry them (boxed: most records have none,
    /// and a record held through the grace period should stay small).
    pub gpu: Option<Box<GpuRecord>>,
    /// Whether each phase was measured or derived.
    pub origins: PhaseOrigins,
    /// Disaggregated sub-phases, when the request crossed prefill and decode pools (boxed:
    /// most records have none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disagg: Option<Box<DisaggPhases>>,
    /// Prompt tokens served from the prefix cache (`gen_ai.usage.cache_read.input_tokens`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
    /// Times the engine preempted the request (`infer.preemptions`, or SGLang's repeated
    /// prefill after a retraction).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preemptions: Option<u64>,
    /// The LoRA adapter that served the request (`infer.lora.adapter`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_adapter: Option<Text>,
}

/// Model or operation value used when the spans do not tell.
pub const UNKNOWN: &str = "unknown";

/// [`UNKNOWN`] as one shared [`Text`] (records start with it; no allocation per record).
static UNKNOWN_TEXT: std::sync::LazyLock<Text> = std::sync::LazyLock::new(|| Text::leaked(UNKNOWN));

/// TPOT by the GenAI definition: decode time / (output tokens − 1); `None` below two tokens.
pub fn tpot_from(decode: f64, output_tokens: u64) -> Option<f64> {
    (output_tokens >= 2 && decode.is_finite() && decode >= 0.0)
        .then(|| decode / (output_tokens - 1) as f64)
}

/// Longest time a request's record may report, end to end or for any phase: one day. No
/// inference request runs that long; a span that says so has a broken clock or a corrupt
/// timestamp (an end of 2⁶⁴ − 1 ns reads as 584 years), and one such record would add its
/// years to `request_duration_seconds_sum` for good.
pub const MAX_REQUEST_SECONDS: f64 = 86_400.0;

/// Most tokens (or streamed chunks) a request's record may report in one count: a billion, a
/// hundred times the longest context window. More is a corrupt attribute, which would make the
/// token counters and throughput meaningless for good.
pub const MAX_REQUEST_TOKENS: u64 = 1_000_000_000;

impl RequestRecord {
    /// Caps TTFT, queue, prefill, decode and inference at e2e: no part of a request outlasts
    /// it. Spans that outlive their request (TGI's `queued` and `infer` after a cancelled
    /// stream) or a host whose clock runs apart from the request's would otherwise report a
    /// phase longer than the request. A derived TPOT of a capped decode is derived again.
    pub fn cap_at_e2e(&mut self) {
        let e2e = self.e2e;
        let cap = |v: &mut Option<f64>| match v {
            Some(x) if *x > e2e => {
                *x = e2e;
                true
            }
            _ => false,
        };
        for v in [
            &mut self.queue,
            &mut self.prefill,
            &mut self.ttft,
            &mut self.inference,
        ] {
            cap(v);
        }
        if cap(&mut self.decode)
            && self.origins.tpot == Some(PhaseOrigin::Derived)
            && let (Some(d), Some(n)) = (self.decode, self.output_tokens)
        {
            self.tpot = tpot_from(d, n);
        }
    }

    /// Why this record cannot be true and must stay out of the aggregates: `"duration"` when
    /// its end-to-end time, its span's own length (which the critical path walks, where a
    /// dialect reads e2e from an attribute) or a phase passes [`MAX_REQUEST_SECONDS`],
    /// `"tokens"` when a token or chunk count passes [`MAX_REQUEST_TOKENS`]; `None` for every
    /// plausible record.
    pub fn implausible(&self) -> Option<&'static str> {
        let itl = self.itl.as_ref();
        let span_seconds = self.end_unix_nano.saturating_sub(self.arrival_unix_nano) as f64 / 1e9;
        let own = [
            Some(self.e2e),
            Some(span_seconds),
            self.queue,
            self.prefill,
            self.ttft,
            self.decode,
            self.inference,
            self.tpot,
            self.time_to_first_chunk,
            itl.map(|i| i.max),
            itl.map(|i| i.p99),
        ];
        let sub_phases = self.disagg.as_deref().map(DisaggPhases::seconds);
        let seconds = own.into_iter().chain(sub_phases.into_iter().flatten());
        if seconds.flatten().any(|s| s > MAX_REQUEST_SECONDS) {
            return Some("duration");
        }
        let counts = [
            self.input_tokens,
            self.output_tokens,
            self.cache_read_input_tokens,
            self.stream_chunks,
        ];
        if counts.into_iter().flatten().any(|n| n > MAX_REQUEST_TOKENS) {
            return Some("tokens");
        }
        None
    }

    /// A record with only the identity, times and e2e set; every phase `None`, outcome `Ok`.
    ///
    /// Dialects start from this and fill in what their spans tell; tests use it to build
    /// records by hand.
    pub fn new(
        trace_id: TraceId,
        span_id: SpanId,
        service: Text,
        dialect: Dialect,
        arrival_unix_nano: u64,
        end_unix_nano: u64,
    ) -> Self {
        Self {
            trace_id,
            span_id,
            service,
            model: UNKNOWN_TEXT.clone(),
            operation: UNKNOWN_TEXT.clone(),
            outcome: Outcome::Ok,
            dialect,
            arrival_unix_nano,
            end_unix_nano,
            e2e: end_unix_nano.saturating_sub(arrival_unix_nano) as f64 / 1e9,
            queue: None,
            prefill: None,
            ttft: None,
            decode: None,
            inference: None,
            tpot: None,
            time_to_first_chunk: None,
            itl: None,
            input_tokens: None,
            output_tokens: None,
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

    /// TTFT split across the disaggregated sub-phases ([`DisaggPhases`]); `None` without a TTFT
    /// or without sub-phases.
    pub fn ttft_breakdown(&self) -> Option<TtftBreakdown> {
        let ttft = self.ttft?;
        let d = self.disagg.as_deref()?;
        let parts: Vec<(&'static str, f64)> = [
            (sc::disagg::ROUTING, d.routing),
            (sc::disagg::BOOTSTRAP, d.bootstrap),
            (sc::disagg::PREFILL_QUEUE, d.prefill_queue),
            (sc::disagg::PREFILL, d.prefill),
            (sc::disagg::KV_TRANSFER, d.kv_transfer),
            (sc::disagg::DECODE_WAIT, d.decode_wait),
            (sc::disagg::FIRST_TOKEN, d.first_token),
        ]
        .into_iter()
        .filter_map(|(name, v)| Some((name, v?)))
        .collect();
        if parts.is_empty() {
            return None;
        }
        let unattributed = ttft - parts.iter().map(|(_, v)| v).sum::<f64>();
        Some(TtftBreakdown {
            parts,
            unattributed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TGI's `queued` span outlives a stream cancelled while it waited: 1.198 s of queue in a
    /// 0.799 s request (a review's trace). Nothing outlasts the request; a derived TPOT
    /// follows its capped decode, a measured one stays.
    #[test]
    fn phases_are_capped_at_e2e() {
        let mut r = RequestRecord::new(
            TraceId([1; 16]),
            SpanId([1; 8]),
            Text::from("tgi"),
            Dialect::Tgi,
            0,
            799_000_000,
        );
        (r.queue, r.prefill, r.ttft) = (Some(1.198), Some(0.2), Some(0.9));
        (r.decode, r.output_tokens) = (Some(1.5), Some(11));
        (r.tpot, r.origins.tpot) = (tpot_from(1.5, 11), Some(PhaseOrigin::Derived));
        r.cap_at_e2e();
        assert_eq!(
            (r.queue, r.prefill, r.ttft),
            (Some(0.799), Some(0.2), Some(0.799))
        );
        assert_eq!(r.decode, Some(0.799));
        assert_eq!(r.tpot, tpot_from(0.799, 11));
        r.decode = Some(2.0);
        (r.tpot, r.origins.tpot) = (Some(0.5), Some(PhaseOrigin::Measured));
        r.cap_at_e2e();
        assert_eq!((r.decode, r.tpot), (Some(0.799), Some(0.5)));
    }

    #[test]
    fn outcome_round_trips_and_serializes_lowercase() {
        for o in [
            Outcome::Ok,
            Outcome::Error,
            Outcome::Cancelled,
            Outcome::Rejected,
        ] {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
            assert_eq!(
                serde_json::to_string(&o).unwrap(),
                format!("\"{}\"", o.as_str())
            );
        }
        assert_eq!(Outcome::parse(" Canceled "), Some(Outcome::Cancelled));
        assert_eq!(Outcome::parse("weird"), None);
    }

    #[test]
    fn dialect_serializes_as_its_name() {
        for d in [
            Dialect::Infertrace,
            Dialect::Vllm,
            Dialect::Sglang,
            Dialect::Tgi,
            Dialect::Generic,
        ] {
            assert_eq!(
                serde_json::to_string(&d).unwrap(),
                format!("\"{}\"", d.as_str())
            );
        }
    }

    #[test]
    fn tpot_uses_output_tokens_minus_one() {
        assert_eq!(tpot_from(0.9, 10), Some(0.1));
        assert_eq!(tpot_from(0.9, 1), None);
        assert_eq!(tpot_from(0.9, 0), None);
        assert_eq!(tpot_from(f64::NAN, 5), None);
    }

    #[test]
    fn new_record_computes_e2e_and_leaves_phases_empty() {
        let r = RequestRecord::new(
            TraceId([1; 16]),
            SpanId([2; 8]),
            crate::text::Text::from("svc"),
            Dialect::Generic,
            1_000_000_000,
            3_500_000_000,
        );
        assert_eq!(r.e2e, 2.5);
        assert!(r.queue.is_none() && r.ttft.is_none() && r.gpu.is_none());
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["outcome"], "ok");
        assert_eq!(json["dialect"], "generic");
        assert_eq!(json["trace_id"], "01".repeat(16));
    }

    #[test]
    fn implausible_durations_and_counts_are_named() {
        let record = |start: u64, end: u64| {
            RequestRecord::new(
                TraceId([1; 16]),
                SpanId([2; 8]),
                crate::text::Text::from("svc"),
                Dialect::Generic,
                start,
                end,
            )
        };
        let day = 86_400 * 1_000_000_000u64;
        assert_eq!(record(1, day + 1).implausible(), None, "a day is allowed");
        assert_eq!(record(1, day + 2).implausible(), Some("duration"));
        assert_eq!(record(1, u64::MAX).implausible(), Some("duration"));
        // vLLM's e2e comes from an attribute: a sane one does not hide a broken span clock,
        // whose length the critical path would walk.
        let mut r = record(1, u64::MAX);
        r.e2e = 1.2;
        assert_eq!(r.implausible(), Some("duration"));
        let mut r = record(1, 2);
        r.ttft = Some(1e300);
        assert_eq!(r.implausible(), Some("duration"));
        let mut r = record(1, 2);
        r.disagg = Some(Box::new(DisaggPhases {
            kv_transfer: Some(MAX_REQUEST_SECONDS * 2.0),
            ..DisaggPhases::default()
        }));
        assert_eq!(r.implausible(), Some("duration"));
        let mut r = record(1, 2);
        r.input_tokens = Some(MAX_REQUEST_TOKENS);
        r.output_tokens = Some(128_000);
        assert_eq!(r.implausible(), None);
        r.input_tokens = Some(i64::MAX as u64);
        assert_eq!(r.implausible(), Some("tokens"));
    }
}
