//! [`Sampling`]: the request span's identity and sampling decision at arrival, made by the
//! layer itself for the sinks that bypass a tracer ([`DirectSink`](super::direct::DirectSink),
//! [`BatchSink`](super::batch::BatchSink)).
//!
//! As the SDK tracer does for a SERVER span: the trace id of the parent context (incoming
//! `traceparent` or the current span) or a new one, a new span id, and one call to the sampler
//! with the arrival attributes. What it does not do: call `SpanProcessor::on_start` (there is
//! no live SDK span to pass; the SDK's batch and simple processors ignore it) or apply span
//! limits (the layer's spans carry at most ≈ 35 attributes, under the default limit of 128).

use std::borrow::Cow;
use std::cell::RefCell;
use std::time::SystemTime;

use opentelemetry::trace::{SpanContext, SpanKind, TraceContextExt, TraceFlags, TraceState};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SamplingDecision, ShouldSample};

use super::span_data::DirectSpan;
use crate::request_facts::{REQUEST_ATTRIBUTE_ROOM, START_ATTRIBUTES, StartAttributes};

/// The sampler and id generator of request spans.
#[derive(Clone, Debug)]
pub(crate) struct Sampling {
    sampler: Box<dyn ShouldSample>,
    /// Whether the sampler may read the request span's attributes: the SDK's own samplers
    /// (from `OTEL_TRACES_SAMPLER`, the default) never do, so they are not listed for them.
    reads_attributes: bool,
    ids: RandomIdGenerator,
}

thread_local! {
    /// The list a sampler sees a request's arrival attributes in, when they are kept as values.
    static SAMPLER_SCRATCH: RefCell<Vec<KeyValue>> = RefCell::new(Vec::with_capacity(START_ATTRIBUTES));
}

impl Sampling {
    /// Samples with `sampler`; `reads_attributes`: it may look at span attributes.
    pub(crate) fn new(sampler: Box<dyn ShouldSample>, reads_attributes: bool) -> Self {
        Self {
            sampler,
            reads_attributes,
            ids: RandomIdGenerator::default(),
        }
    }

    /// The SERVER request span `name`, started at `start` under `parent`: its identity and
    /// sampling decision are final.
    ///
    /// With `keep_values` the arrival attributes stay values until the span is built (a
    /// sampler that may read attributes sees them in a reused per-thread list); otherwise they
    /// become the span's attribute list now.
    pub(crate) fn start(
        &self,
        name: Cow<'static, str>,
        start: SystemTime,
        start_attributes: StartAttributes,
        parent: &Context,
        keep_values: bool,
    ) -> DirectSpan {
        let parent_span = parent.span();
        let psc = parent_span.span_context();
        let (psc_valid, trace_id) = if psc.is_valid() {
            (true, psc.trace_id())
        } else {
            (false, self.ids.new_trace_id())
        };
        let span_id = self.ids.new_span_id();
        let (mut attributes, deferred) = if keep_values {
            (Vec::new(), Some(start_attributes))
        } else {
            (start_attributes.to_vec(REQUEST_ATTRIBUTE_ROOM), None)
        };
        let result = if parent.is_telemetry_suppressed() {
            None
        } else {
            let sample = |attributes: &[KeyValue]| {
                self.sampler.should_sample(
                    Some(parent),
                    trace_id,
                    &name,
                    &SpanKind::Server,
                    attributes,
                    &[],
                )
            };
            Some(match &deferred {
                None => sample(&attributes),
                Some(_) if !self.reads_attributes => sample(&[]),
                Some(start) => SAMPLER_SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
                    Ok(mut list) => {
                        // Cleared first too: a panicking sampler would have left its list.
                        list.clear();
                        start.write(&mut |kv| list.push(kv));
                        let result = sample(&list);
                        list.clear();
                        result
                    }
                    Err(_) => sample(&start.to_vec(0)),
                }),
            })
        };
        let (decision, trace_state) = match result {
            Some(r) => {
                attributes.extend(r.attributes);
                (r.decision, r.trace_state)
            }
            None => (SamplingDecision::Drop, TraceState::NONE),
        };
        let flags = if psc_valid {
            psc.trace_flags()
        } else {
            TraceFlags::default()
        };
        let (recording, flags) = match decision {
            SamplingDecision::RecordAndSample => (true, flags.with_sampled(true)),
            SamplingDecision::RecordOnly => (true, flags.with_sampled(false)),
            SamplingDecision::Drop => (false, TraceFlags::default()),
        };
        DirectSpan {
            context: SpanContext::new(trace_id, span_id, flags, false, trace_state),
            parent_span_id: psc.span_id(),
            parent_span_is_remote: psc_valid && psc.is_remote(),
            name,
            start,
            start_attributes: deferred.filter(|_| recording),
            attributes,
            recording,
        }
    }

    /// The id generator, for the phase spans' ids.
    pub(crate) fn ids(&self) -> &RandomIdGenerator {
        &self.ids
    }
}
