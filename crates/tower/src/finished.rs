//! A finished request as the layer hands it to a span sink: what its request span ends with,
//! and its phase spans. Plain data; the sinks in [`crate::export`] turn it into spans.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::Status;
use opentelemetry::{KeyValue, StringValue};

use infertrace_semconv::{infer, span as span_names};

use crate::end_attributes::EndAttributes;

/// What a request's span gets when the request ends.
#[derive(Debug)]
pub(crate) struct FinishedRequest {
    /// When the request ended (the request span's end time).
    pub(crate) end: SystemTime,
    /// The request model when it became known only after arrival: the span's new name and its
    /// `gen_ai.request.model` value.
    pub(crate) late_model: Option<(Cow<'static, str>, StringValue)>,
    /// The attributes known only at the end; their `error_type` also sets the span's status.
    pub(crate) end_attributes: EndAttributes,
    /// The phase spans (exported only when the request span is sampled).
    pub(crate) phases: PhaseSpans,
}

impl FinishedRequest {
    /// The request span's status: `Error` with the error type, if the request failed.
    pub(crate) fn status(&self) -> Option<Status> {
        self.end_attributes
            .error_type
            .as_ref()
            .map(|kind| Status::error(kind.clone()))
    }
}

/// One phase span of a finished request.
#[derive(Debug)]
pub(crate) struct PhaseSpan {
    pub(crate) name: &'static str,
    pub(crate) start: SystemTime,
    pub(crate) end: SystemTime,
    /// With counters: `infer.phase` and the window statistics. `None`: `infer.phase` alone,
    /// written where the span is built.
    pub(crate) attributes: Option<Vec<KeyValue>>,
}

impl PhaseSpan {
    /// The span's attributes: `infer.phase` first.
    pub(crate) fn into_attributes(self) -> Vec<KeyValue> {
        self.attributes
            .unwrap_or_else(|| vec![KeyValue::new(infer::PHASE, self.name)])
    }
}

/// The phase spans of a request (`queue`, `prefill`, `decode`, `inference`), compact: their
/// intervals, and only with counters their attribute lists.
#[derive(Debug, Default)]
pub(crate) struct PhaseSpans {
    times: [Option<(SystemTime, SystemTime)>; 4],
    attributes: Option<Box<[Option<Vec<KeyValue>>; 4]>>,
}

/// The names of [`PhaseSpans`], in order.
pub(crate) const PHASE_NAMES: [&str; 4] = [
    span_names::QUEUE,
    span_names::PREFILL,
    span_names::DECODE,
    span_names::INFERENCE,
];

impl PhaseSpans {
    /// Adds the phase span [`PHASE_NAMES`]`[i]` over `[start, end]`, with `attributes` when
    /// it has counters (an index past the last phase is ignored).
    pub(crate) fn set(
        &mut self,
        i: usize,
        start: SystemTime,
        end: SystemTime,
        attributes: Option<Vec<KeyValue>>,
    ) {
        let Some(slot) = self.times.get_mut(i) else {
            return;
        };
        *slot = Some((start, end));
        if let Some(attributes) = attributes {
            self.attributes.get_or_insert_with(Box::default)[i] = Some(attributes);
        }
    }

    /// The number of phase spans.
    pub(crate) fn len(&self) -> usize {
        self.times.iter().flatten().count()
    }
}

impl PhaseSpans {
    /// The phase spans in order, borrowed: their names, intervals, and their own attributes
    /// when they have counters (the encoder reads them in place).
    #[cfg(feature = "otlp")]
    pub(crate) fn iter(
        &self,
    ) -> impl Iterator<Item = (&'static str, SystemTime, SystemTime, Option<&[KeyValue]>)> {
        self.times.iter().enumerate().filter_map(move |(i, times)| {
            let (start, end) = (*times)?;
            let attributes = self.attributes.as_ref().and_then(|a| a[i].as_deref());
            Some((PHASE_NAMES[i], start, end, attributes))
        })
    }
}

impl IntoIterator for PhaseSpans {
    type Item = PhaseSpan;
    type IntoIter = PhaseSpansIter;

    fn into_iter(self) -> PhaseSpansIter {
        PhaseSpansIter {
            spans: self,
            next: 0,
        }
    }
}

/// The phase spans of a [`PhaseSpans`], taken out one by one in order (no copy of the whole).
#[derive(Debug)]
pub(crate) struct PhaseSpansIter {
    spans: PhaseSpans,
    next: usize,
}

impl Iterator for PhaseSpansIter {
    type Item = PhaseSpan;

    fn next(&mut self) -> Option<PhaseSpan> {
        while let Some(slot) = self.spans.times.get_mut(self.next) {
            let i = self.next;
            self.next += 1;
            if let Some((start, end)) = slot.take() {
                let attributes = self.spans.attributes.as_mut().and_then(|a| a[i].take());
                return Some(PhaseSpan {
                    name: PHASE_NAMES[i],
                    start,
                    end,
                    attributes,
                });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn phase_spans_keep_their_order_and_their_own_attributes() {
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let mut phases = PhaseSpans::default();
        phases.set(2, at(20), at(90), Some(vec![KeyValue::new("gpu.x", 1_i64)]));
        phases.set(0, at(0), at(10), None);
        phases.set(4, at(0), at(1), None);
        assert_eq!(phases.len(), 2);
        let spans: Vec<PhaseSpan> = phases.into_iter().collect();
        assert_eq!(spans.len(), 2);
        assert_eq!((spans[0].name, spans[0].end), ("queue", at(10)));
        assert!(spans[0].attributes.is_none());
        assert_eq!((spans[1].name, spans[1].start), ("decode", at(20)));
        assert_eq!(
            spans[1].attributes.as_deref(),
            Some(&[KeyValue::new("gpu.x", 1_i64)][..])
        );
    }
}
