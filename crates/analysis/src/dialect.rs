//! Engine dialects (docs/reference.md#dialects): which spans are inference requests, and how each
//! engine's spans become one [`RequestRecord`].
//!
//! # Detection rules, in order
//! 0. A span carrying `infer.phase` is an infertrace phase span, never a request.
//! 1. A span named `llm_request` is **vLLM**'s request span.
//! 2. A span carrying any of infertrace's own request attributes (`infer.outcome`,
//!    `infer.phase.source`, `infer.time_per_output_token`, `infer.stream.chunks`,
//!    `infer.queue.depth`) is an **infertrace** request span (it may carry the
//!    `gen_ai.latency.*` family too). In a whole trace, a SERVER span with a child carrying
//!    `infer.phase` is one as well.
//! 3. SGLang's request tree: a `Bootstrap Room 0x…` span (or one carrying `bootstrap_room`)
//!    and a per-role `"{role} Req {rid}"` span carrying `rid` are **SGLang**'s (see [`sglang`]:
//!    the room is the request, the role spans, thread spans and stage slices below it are
//!    read into its one record, across services). A `prefill Req …` span is recognised only
//!    with its trace: the prefill side ends long before the decode side, and its arrival must
//!    not complete the trace before the decode side's spans and the room arrive.
//! 4. Any other span carrying the `gen_ai.latency.*` family (e2e, time to first token, time in
//!    queue, prefill or decode) is read as **SGLang**'s too (older versions, and engines that
//!    copied vLLM's attributes, such as TensorRT-LLM, under another span name): vLLM always
//!    names its span `llm_request`, so the name decides. (The instrumentation scope would be a
//!    second signal, but the span model does not keep it.)
//! 5. A span named `generate`, `generate_stream`, `completions` or `chat_completions` carrying a
//!    TGI timing field (`total_time`, `validation_time`, `queue_time`, `inference_time`,
//!    `time_per_token`) is **TGI**'s request span. TGI records those fields only on success; in
//!    a whole trace, the outermost such-named span with a `queued` or `infer` descendant is one
//!    too (TGI's inner `Infer::generate*` spans of the same names are not).
//! 6. Any other SERVER span is **generic**: e2e latency, rate and errors. In a whole trace, a
//!    generic span is not a request of its own when it is an ancestor or descendant of a
//!    recognised request span of the same service (the HTTP span around TGI's `generate`, a
//!    `TraceLayer` span around infertrace's).
//!
//! A request span nested inside a same-service request span of the same dialect is the same
//! request (the outermost stands); an SGLang room or role span below another one, of any
//! service, is part of that one's request.
//!
//! # Outcome
//! `infer.outcome` if present; else a non-OK `rpc.grpc.status_code` (1 CANCELLED → cancelled,
//! 8 RESOURCE_EXHAUSTED → rejected, others → error); else `http.response.status_code` 429 →
//! rejected, 499 → cancelled, 5xx → error; else span status ERROR or `error.type` → error; else
//! ok. When the request span says nothing at all, the nearest same-service ancestor that does
//! decides (TGI's status lives on the HTTP span around it).
//!
//! Phase extraction per dialect is documented in [`infertrace`], [`latency_attrs`],
//! [`sglang`] and [`tgi`].
//!
//! # Every dialect
//! Prefix-cache hits (`gen_ai.usage.cache_read.input_tokens`), preemptions
//! (`infer.preemptions`) and the LoRA adapter (`infer.lora.adapter`) are read from the request
//! span when present.

pub mod infertrace;
pub mod latency_attrs;
pub mod sglang;
pub mod tgi;

use foldhash::{HashMap, HashMapExt};

use infertrace_semconv as sc;

use smallvec::SmallVec;

use crate::record::{Dialect, GpuRecord, InterTokenStats, Outcome, PerPhase, RequestRecord};
use crate::trace::{Span, SpanId, SpanKind, StatusCode};

pub use tgi::parse_duration;

/// infertrace's own request attributes: any of them marks an infertrace request span.
const INFERTRACE_REQUEST_KEYS: [&str; 5] = [
    sc::infer::OUTCOME,
    sc::infer::PHASE_SOURCE,
    sc::infer::TIME_PER_OUTPUT_TOKEN,
    sc::infer::STREAM_CHUNKS,
    sc::infer::QUEUE_DEPTH,
];

/// The `gen_ai.latency.*` attributes that mark a vLLM / SGLang request span.
const LATENCY_KEYS: [&str; 5] = [
    sc::latency::E2E,
    sc::latency::TIME_TO_FIRST_TOKEN,
    sc::latency::TIME_IN_QUEUE,
    sc::latency::TIME_IN_MODEL_PREFILL,
    sc::latency::TIME_IN_MODEL_DECODE,
];

/// Whether `span` is a request span, and of which dialect, from the span alone.
///
/// The collector's assembler uses it to know a trace's request span has arrived. A few request
/// spans are only recognisable with their trace ([`extract_requests`] sees those too): TGI
/// request spans of failed requests, and infertrace request spans stripped of `infer.*`.
pub fn detect(span: &Span) -> Option<Dialect> {
    if span.attr(sc::infer::PHASE).is_some() {
        return None; // an infertrace phase span, whatever else it carries
    }
    if span.name == sc::span::VLLM_REQUEST {
        return Some(Dialect::Vllm);
    }
    if INFERTRACE_REQUEST_KEYS
        .iter()
        .any(|k| span.attr(k).is_some())
    {
        return Some(Dialect::Infertrace);
    }
    if sglang::is_request_tree(span) {
        // The prefill side's role span ends long before the decode side's: it must not start
        // the grace period that completes the trace (the whole trace still classifies it).
        return (!sglang::is_prefill_role(span)).then_some(Dialect::Sglang);
    }
    if LATENCY_KEYS.iter().any(|k| span.attr(k).is_some()) {
        return Some(Dialect::Sglang);
    }
    if tgi::is_request_name(&span.name) && tgi::has_timing_fields(span) {
        return Some(Dialect::Tgi);
    }
    (span.kind == SpanKind::Server).then_some(Dialect::Generic)
}

/// Every request record in one trace's spans (order: request spans in slice order).
pub fn extract_requests(spans: &[Span]) -> Vec<RequestRecord> {
    extract_requests_detected::<Vec<_>>(spans).0
}

/// [`extract_requests`], and whether [`detect`] finds a request span among `spans` (what a
/// collector needs to know to complete the trace after its grace period), in the same pass.
/// The records are collected into `C` (a collector holding one trace's records for seconds
/// keeps them inline rather than in a vector of their own).
pub fn extract_requests_detected<C: Default + RecordSink>(spans: &[Span]) -> (C, bool) {
    let mut records = C::default();
    let detected = extract_requests_into(spans, &mut records);
    (records, detected)
}

/// [`extract_requests_detected`] appending to `out`, each record written in place (a record is
/// ~300 bytes: built on the stack and moved from call to call, it was copied several times);
/// returns whether [`detect`] finds a request span.
pub fn extract_requests_into(spans: &[Span], out: &mut impl RecordSink) -> bool {
    let trace = TraceView::new(spans);
    // A trace has one or two request spans as a rule: no allocation for those.
    let mut specific: SmallVec<[(usize, Dialect); 4]> = SmallVec::new();
    let mut generic: SmallVec<[usize; 4]> = SmallVec::new();
    let mut detected_any = false;
    for (i, span) in spans.iter().enumerate() {
        let (class, detected) = trace.classify_detected(span);
        detected_any |= detected;
        match class {
            Some(Dialect::Generic) => generic.push(i),
            Some(d) => specific.push((i, d)),
            None => {}
        }
    }
    // SGLang: the room span is the request; its role spans (of any service) are part of it.
    specific.retain(|&mut (i, d)| {
        d != Dialect::Sglang
            || !sglang::is_request_tree(&spans[i])
            || !sglang::is_part_of_other(&spans[i], i, &trace)
    });
    // infertrace across services: a prefill / decode worker's request span below another
    // role-marked request span is part of that request.
    specific.retain(|&mut (i, d)| {
        d != Dialect::Infertrace || !infertrace::is_worker_part(&spans[i], &trace)
    });
    // One request, one record: a request span nested in a same-service request span of the same
    // dialect (SGLang's latency attributes on nested spans, two layers stacked) is not another
    // request; the outermost stands.
    let nested: SmallVec<[usize; 4]> = specific
        .iter()
        .filter(|&&(i, d)| {
            specific.iter().any(|&(j, e)| {
                j != i
                    && e == d
                    && spans[j].service == spans[i].service
                    && trace.is_ancestor(&spans[j], &spans[i])
            })
        })
        .map(|&(i, _)| i)
        .collect();
    specific.retain(|(i, _)| !nested.contains(i));
    generic.retain(|g| {
        !specific.iter().any(|&(s, _)| {
            let (gs, ss) = (&spans[*g], &spans[s]);
            gs.service == ss.service && (trace.is_ancestor(gs, ss) || trace.is_ancestor(ss, gs))
        })
    });
    let mut all = specific;
    all.extend(generic.into_iter().map(|g| (g, Dialect::Generic)));
    all.sort_by_key(|&(i, _)| i);
    for (i, d) in all {
        let span = &spans[i];
        let r = out.push_record(base_record(span, d, &trace));
        match d {
            Dialect::Infertrace => infertrace::refine(span, &trace, r),
            Dialect::Sglang if sglang::is_request_tree(span) => sglang::refine(span, &trace, r),
            Dialect::Vllm | Dialect::Sglang => latency_attrs::refine(span, r),
            Dialect::Tgi => tgi::refine(span, &trace, r),
            Dialect::Generic => {}
        }
    }
    detected_any
}

/// A vector of request records that [`extract_requests_into`] appends to (`Vec`, `SmallVec`).
pub trait RecordSink {
    /// Appends `r` and returns it, in its place.
    fn push_record(&mut self, r: RequestRecord) -> &mut RequestRecord;
}

impl<V> RecordSink for V
where
    V: Extend<RequestRecord> + std::ops::DerefMut<Target = [RequestRecord]>,
{
    fn push_record(&mut self, r: RequestRecord) -> &mut RequestRecord {
        let at = self.len();
        self.extend(std::iter::once(r));
        &mut self[at]
    }
}

/// One trace's spans with the lookups the dialects need. Small traces are scanned linearly
/// (no allocation); traces over [`TraceView::INDEX_THRESHOLD`] spans get an id index, so TGI
/// traces with one `infer` span per decode step stay linear-time.
pub struct TraceView<'a> {
    /// The spans.
    pub spans: &'a [Span],
    by_id: Option<HashMap<SpanId, usize>>,
}

impl<'a> TraceView<'a> {
    /// Traces longer than this get an id index.
    pub const INDEX_THRESHOLD: usize = 24;

    /// A view of one trace's spans.
    pub fn new(spans: &'a [Span]) -> Self {
        let by_id = (spans.len() > Self::INDEX_THRESHOLD).then(|| {
            let mut map = HashMap::with_capacity(spans.len());
            for (i, s) in spans.iter().enumerate() {
                map.entry(s.span_id).or_insert(i);
            }
            map
        });
        Self { spans, by_id }
    }

    /// The span with this id.
    pub fn get(&self, id: SpanId) -> Option<&'a Span> {
        match &self.by_id {
            Some(map) => map.get(&id).map(|&i| &self.spans[i]),
            None => self.spans.iter().find(|s| s.span_id == id),
        }
    }

    /// The direct children of `span`.
    pub fn children(&self, span: &'a Span) -> impl Iterator<Item = &'a Span> + 'a {
        let id = span.span_id;
        self.spans
            .iter()
            .filter(move |s| s.parent_span_id == Some(id) && s.span_id != id)
    }

    /// The ancestors of `span`, nearest first (cycle-safe).
    pub fn ancestors<'v>(&'v self, span: &'a Span) -> impl Iterator<Item = &'a Span> + 'v {
        let view = self;
        let mut next = span.parent_span_id;
        let mut left = self.spans.len();
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            left -= 1;
            let parent = view.get(next?)?;
            next = parent.parent_span_id;
            Some(parent)
        })
    }

    /// True when `a` is a (strict) ancestor of `b`.
    pub fn is_ancestor(&self, a: &Span, b: &'a Span) -> bool {
        if b.parent_span_id.is_none() {
            return false;
        }
        self.ancestors(b).any(|s| s.span_id == a.span_id)
    }

    /// The (strict) descendants of `span`.
    pub fn descendants<'v>(&'v self, span: &'a Span) -> impl Iterator<Item = &'a Span> + 'v {
        let view = self;
        self.spans
            .iter()
            .filter(move |s| s.span_id != span.span_id && view.is_ancestor(span, s))
    }

    /// [`detect`] extended with what the whole trace tells, and whether [`detect`] alone
    /// recognised the span.
    fn classify_detected(&self, span: &'a Span) -> (Option<Dialect>, bool) {
        let detected = detect(span);
        (self.classify_with(span, detected), detected.is_some())
    }

    /// The dialect of `span`, whose [`detect`] result is `detected`.
    fn classify_with(&self, span: &'a Span, detected: Option<Dialect>) -> Option<Dialect> {
        if matches!(detected, Some(d) if d != Dialect::Generic) {
            return detected;
        }
        if sglang::is_role_request(span) {
            return Some(Dialect::Sglang);
        }
        if tgi::is_request_name(&span.name)
            && !self.ancestors(span).any(|a| tgi::is_request_name(&a.name))
            && self
                .descendants(span)
                .any(|d| d.name == sc::span::TGI_QUEUED || d.name == sc::span::TGI_INFER)
        {
            return Some(Dialect::Tgi);
        }
        if span.kind == SpanKind::Server
            && self
                .children(span)
                .any(|c| c.attr(sc::infer::PHASE).is_some())
        {
            return Some(Dialect::Infertrace);
        }
        detected
    }
}

/// A non-negative, finite number of seconds from a numeric attribute.
pub(crate) fn seconds_attr(span: &Span, key: &str) -> Option<f64> {
    span.attr_f64(key).filter(|v| v.is_finite() && *v >= 0.0)
}

/// A non-negative integer attribute.
pub(crate) fn count_attr(span: &Span, key: &str) -> Option<u64> {
    span.attr_i64(key).and_then(|v| u64::try_from(v).ok())
}

/// The explicit outcome a span states, if any (see the module docs for the order).
fn outcome_signal(span: &Span) -> Option<Outcome> {
    if let Some(o) = span.attr_str(sc::infer::OUTCOME).and_then(Outcome::parse) {
        return Some(o);
    }
    let grpc = span.attr_i64(sc::net::RPC_GRPC_STATUS_CODE);
    match grpc {
        Some(0) | None => {}
        Some(1) => return Some(Outcome::Cancelled),
        Some(8) => return Some(Outcome::Rejected),
        Some(_) => return Some(Outcome::Error),
    }
    let http = span.attr_i64(sc::net::HTTP_RESPONSE_STATUS_CODE);
    match http {
        Some(429) => return Some(Outcome::Rejected),
        Some(499) => return Some(Outcome::Cancelled),
        Some(c) if c >= 500 => return Some(Outcome::Error),
        _ => {}
    }
    if span.status == StatusCode::Error || span.attr(sc::net::ERROR_TYPE).is_some() {
        return Some(Outcome::Error);
    }
    (grpc.is_some() || http.is_some() || span.status == StatusCode::Ok).then_some(Outcome::Ok)
}

/// The outcome of a request span: its own signal, else its nearest same-service ancestor's.
pub(crate) fn outcome_of(span: &Span, trace: &TraceView<'_>) -> Outcome {
    outcome_signal(span)
        .or_else(|| {
            trace
                .ancestors(span)
                .take_while(|a| a.service == span.service)
                .find_map(outcome_signal)
        })
        .unwrap_or(Outcome::Ok)
}

/// The record every dialect starts from: identity, times, e2e from the span, model, operation,
/// outcome, tokens and infertrace's streaming attributes where present.
pub(crate) fn base_record(span: &Span, dialect: Dialect, trace: &TraceView<'_>) -> RequestRecord {
    let mut r = RequestRecord::new(
        span.trace_id,
        span.span_id,
        span.service.clone(),
        dialect,
        span.start_unix_nano,
        span.end_unix_nano,
    );
    if let Some(m) = span
        .attr_text(sc::gen_ai::RESPONSE_MODEL)
        .or_else(|| span.attr_text(sc::gen_ai::REQUEST_MODEL))
        .filter(|m| !m.is_empty())
    {
        r.model = m.clone();
    }
    if let Some(op) = span
        .attr_text(sc::gen_ai::OPERATION_NAME)
        .filter(|m| !m.is_empty())
    {
        r.operation = op.clone();
    }
    r.outcome = outcome_of(span, trace);
    r.input_tokens = count_attr(span, sc::gen_ai::USAGE_INPUT_TOKENS)
        .or_else(|| count_attr(span, sc::gen_ai::USAGE_PROMPT_TOKENS));
    r.output_tokens = count_attr(span, sc::gen_ai::USAGE_OUTPUT_TOKENS)
        .or_else(|| count_attr(span, sc::gen_ai::USAGE_COMPLETION_TOKENS));
    r.stream_chunks = count_attr(span, sc::infer::STREAM_CHUNKS);
    r.queue_depth = count_attr(span, sc::infer::QUEUE_DEPTH);
    r.time_to_first_chunk = seconds_attr(span, sc::infer::TIME_TO_FIRST_CHUNK);
    r.cache_read_input_tokens = count_attr(span, sc::gen_ai::USAGE_CACHE_READ_INPUT_TOKENS);
    r.preemptions = count_attr(span, sc::infer::PREEMPTIONS);
    r.lora_adapter = span
        .attr_text(sc::infer::LORA_ADAPTER)
        .filter(|a| !a.is_empty())
        .cloned();
    let itl = |k| seconds_attr(span, k);
    // One after the other: a span without the first (most) is not scanned for the others.
    if let Some(p50) = itl(sc::infer::INTER_TOKEN_LATENCY_P50)
        && let Some(p99) = itl(sc::infer::INTER_TOKEN_LATENCY_P99)
        && let Some(max) = itl(sc::infer::INTER_TOKEN_LATENCY_MAX)
    {
        r.itl = Some(InterTokenStats { p50, p99, max });
    }
    r
}

/// Which phase a span of an infertrace request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Queue,
    Prefill,
    Decode,
    Inference,
}

impl Phase {
    pub(crate) fn of(span: &Span) -> Option<Self> {
        let name = span.attr_str(sc::infer::PHASE).unwrap_or(&span.name);
        match name {
            sc::span::QUEUE => Some(Self::Queue),
            sc::span::PREFILL => Some(Self::Prefill),
            sc::span::DECODE => Some(Self::Decode),
            sc::span::INFERENCE => Some(Self::Inference),
            _ => None,
        }
    }

    fn slot(self, p: &mut PerPhase) -> &mut Option<f64> {
        match self {
            Self::Queue => &mut p.queue,
            Self::Prefill => &mut p.prefill,
            Self::Decode => &mut p.decode,
            Self::Inference => &mut p.inference,
        }
    }
}

/// GPU window statistics from phase spans' `gpu.*` attributes; `None` when none has any.
pub(crate) fn gpu_record<'a>(
    phases: impl Iterator<Item = (Phase, &'a Span)>,
) -> Option<Box<GpuRecord>> {
    let mut g = GpuRecord::default();
    let mut any = false;
    let add = |acc: &mut Option<f64>, v: Option<f64>| {
        if let Some(v) = v {
            *acc = Some(acc.unwrap_or(0.0) + v);
        }
    };
    for (phase, span) in phases {
        let [util, sm, power, energy, attributed, memory] = gpu_values(span);
        if [util, sm, power, energy, attributed, memory]
            .iter()
            .all(Option::is_none)
        {
            continue;
        }
        any = true;
        *phase.slot(&mut g.utilization_mean) = util;
        *phase.slot(&mut g.sm_activity_mean) = sm;
        *phase.slot(&mut g.power_mean_watts) = power;
        add(&mut g.energy_joules, energy);
        add(&mut g.energy_attributed_joules, attributed);
        if let Some(m) = memory {
            g.memory_used_max_bytes = Some(g.memory_used_max_bytes.map_or(m, |x| x.max(m)));
        }
    }
    any.then(|| Box::new(g))
}

/// The `gpu.*` window statistics of one phase span — utilisation, SM activity, power, energy,
/// attributed energy, memory — each as [`Span::attr_f64`] reads it (the first attribute with
/// the key, if a non-negative finite number), in one pass over the attributes rather than a
/// scan per key.
fn gpu_values(span: &Span) -> [Option<f64>; 6] {
    let mut first: [Option<Option<f64>>; 6] = [None; 6];
    for (k, v) in &span.attributes {
        if !k.starts_with("gpu.") {
            continue;
        }
        let i = match *k {
            sc::gpu::UTILIZATION_MEAN => 0,
            sc::gpu::SM_ACTIVITY_MEAN => 1,
            sc::gpu::POWER_MEAN => 2,
            sc::gpu::ENERGY => 3,
            sc::gpu::ENERGY_ATTRIBUTED => 4,
            sc::gpu::MEMORY_USED_MAX => 5,
            _ => continue,
        };
        first[i].get_or_insert_with(|| v.as_f64().filter(|v| v.is_finite() && *v >= 0.0));
    }
    first.map(Option::flatten)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::Text;
    use crate::trace::TraceId;

    fn span(id: u8, parent: Option<u8>) -> Span {
        Span {
            trace_id: TraceId([1; 16]),
            span_id: SpanId([id; 8]),
            parent_span_id: parent.map(|p| SpanId([p; 8])),
            name: format!("s{id}").into(),
            service: Text::from("svc"),
            kind: SpanKind::Internal,
            start_unix_nano: 0,
            end_unix_nano: 1,
            status: StatusCode::Unset,
            attributes: Vec::new(),
            links: Vec::new(),
        }
    }

    proptest::proptest! {
        /// One pass reads each GPU key as a scan per key does: the first attribute with the
        /// key, a number or not, non-negative and finite or not.
        #[test]
        fn gpu_values_read_what_a_scan_per_key_reads(
            attrs in proptest::collection::vec((0usize..9, 0u8..4, -2.0f64..500.0), 0..12),
        ) {
            const KEYS: [&str; 9] = [
                sc::gpu::UTILIZATION_MEAN,
                sc::gpu::SM_ACTIVITY_MEAN,
                sc::gpu::POWER_MEAN,
                sc::gpu::ENERGY,
                sc::gpu::ENERGY_ATTRIBUTED,
                sc::gpu::MEMORY_USED_MAX,
                sc::gpu::UTILIZATION_MAX,
                sc::infer::PHASE,
                sc::gen_ai::REQUEST_MODEL,
            ];
            let mut s = span(2, Some(1));
            s.attributes = attrs
                .into_iter()
                .map(|(k, kind, x)| {
                    let v = match kind {
                        0 => crate::trace::AttrValue::Double(x),
                        1 => crate::trace::AttrValue::Int(x as i64),
                        2 => crate::trace::AttrValue::Str(Text::from(x.to_string().as_str())),
                        _ => crate::trace::AttrValue::Double(f64::NAN),
                    };
                    (KEYS[k], v)
                })
                .collect();
            let by_scan: Vec<Option<f64>> = KEYS[..6]
                .iter()
                .map(|k| s.attr_f64(k).filter(|v| v.is_finite() && *v >= 0.0))
                .collect();
            proptest::prop_assert_eq!(gpu_values(&s).to_vec(), by_scan);
        }
    }

    #[test]
    fn extraction_says_whether_the_detector_found_a_request_span() {
        // Nothing recognisable.
        assert_eq!(
            extract_requests_detected(&[span(1, None)]),
            (Vec::new(), false)
        );
        // A server span: detected (generic).
        let mut server = span(1, None);
        server.kind = SpanKind::Server;
        let (records, detected) =
            extract_requests_detected::<Vec<_>>(std::slice::from_ref(&server));
        assert_eq!((records.len(), detected), (1, true));
        // A TGI request known only by its children: a record, but not detected on its own.
        let mut request = span(1, None);
        request.name = "generate".into();
        let mut queued = span(2, Some(1));
        queued.name = sc::span::TGI_QUEUED.into();
        let spans = [request, queued];
        let (records, detected) = extract_requests_detected::<Vec<_>>(&spans);
        assert_eq!((records.len(), detected), (1, false));
        assert_eq!(records, extract_requests(&spans));
    }

    #[test]
    fn ancestors_are_nearest_first_and_cycles_end() {
        for n in [4u8, 40] {
            // A chain 1 ← 2 ← … ← n, with and without the id index.
            let mut spans: Vec<Span> = (1..=n).map(|i| span(i, (i > 1).then(|| i - 1))).collect();
            let view = TraceView::new(&spans);
            assert_eq!(
                view.by_id.is_some(),
                n as usize > TraceView::INDEX_THRESHOLD
            );
            let last = &spans[n as usize - 1];
            let names: Vec<&str> = view.ancestors(last).map(|s| s.name.as_str()).collect();
            assert_eq!(names.len(), n as usize - 1);
            assert_eq!(names[0], format!("s{}", n - 1));
            assert!(view.is_ancestor(&spans[0], last));
            assert!(!view.is_ancestor(last, &spans[0]));
            assert_eq!(view.descendants(&spans[0]).count(), n as usize - 1);
            // Close the loop: 1's parent is n. Walks must still end.
            spans[0].parent_span_id = Some(SpanId([n; 8]));
            let view = TraceView::new(&spans);
            assert!(view.ancestors(&spans[0]).count() <= spans.len());
            assert!(extract_requests(&spans).is_empty());
        }
    }

    #[test]
    fn phase_spans_are_never_requests() {
        let mut s = span(1, None);
        s.kind = SpanKind::Server;
        assert_eq!(detect(&s), Some(Dialect::Generic));
        s.attributes.push((
            sc::infer::PHASE,
            crate::trace::AttrValue::Str("queue".into()),
        ));
        s.attributes.push((
            sc::infer::PHASE_SOURCE,
            crate::trace::AttrValue::Str("engine".into()),
        ));
        assert_eq!(detect(&s), None);
    }
}
