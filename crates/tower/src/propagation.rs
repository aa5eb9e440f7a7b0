//! W3C Trace Context (`traceparent`, `tracestate`) and Baggage extraction from HTTP headers,
//! which are also gRPC metadata. A malformed header yields no remote parent: a new trace.

use http::{HeaderMap, HeaderName};
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};

static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
static BAGGAGE: HeaderName = HeaderName::from_static("baggage");

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        // Pre-parsed names for the keys the W3C propagators ask for.
        let value = match key {
            "traceparent" => self.0.get(&TRACEPARENT),
            "tracestate" => self.0.get(&TRACESTATE),
            "baggage" => self.0.get(&BAGGAGE),
            other => self.0.get(other),
        };
        value.and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Which context headers a request carries (found in the layer's one scan of its headers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ContextHeaders {
    /// A `traceparent` header is there (W3C trace context to continue).
    pub(crate) traceparent: bool,
    /// A `baggage` header is there.
    pub(crate) baggage: bool,
}

impl ContextHeaders {
    /// Notes `name` if it is one of the context headers.
    pub(crate) fn note(&mut self, name: &HeaderName) {
        self.traceparent |= name == TRACEPARENT;
        self.baggage |= name == BAGGAGE;
    }
}

/// The parent context of a request: the current context plus whatever W3C trace context and
/// baggage the headers carry (`found`: which of them are there). Without those headers this is
/// just `Context::current()`.
pub(crate) fn extract(headers: &HeaderMap, found: ContextHeaders) -> Context {
    let (has_parent, has_baggage) = (found.traceparent, found.baggage);
    let mut cx = if has_parent {
        // Extract onto an empty context so a malformed header can never silently continue
        // whatever span happens to be current; baggage already current is kept below.
        let current = Context::current();
        let extracted = TraceContextPropagator::new()
            .extract_with_context(&Context::new(), &HeaderExtractor(headers));
        if opentelemetry::trace::TraceContextExt::has_active_span(&extracted) {
            // Keep current entries (baggage), replace the span.
            use opentelemetry::trace::TraceContextExt as _;
            current.with_remote_span_context(extracted.span().span_context().clone())
        } else {
            current
        }
    } else {
        Context::current()
    };
    if has_baggage {
        cx = BaggagePropagator::new().extract_with_context(&cx, &HeaderExtractor(headers));
    }
    cx
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use opentelemetry::baggage::BaggageExt;
    use opentelemetry::trace::TraceContextExt;

    /// The context headers of `h`, as the layer's scan finds them.
    fn found(h: &HeaderMap) -> ContextHeaders {
        let mut found = ContextHeaders::default();
        h.keys().for_each(|name| found.note(name));
        found
    }

    #[test]
    fn valid_traceparent_is_continued() {
        let mut h = HeaderMap::new();
        h.insert(
            "traceparent",
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        h.insert("tracestate", HeaderValue::from_static("vendor=value"));
        h.insert("baggage", HeaderValue::from_static("tenant=acme"));
        let cx = extract(&h, found(&h));
        let sc = cx.span().span_context().clone();
        assert!(sc.is_remote());
        assert_eq!(
            format!("{:032x}", sc.trace_id()),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(format!("{:016x}", sc.span_id()), "00f067aa0ba902b7");
        assert!(sc.is_sampled());
        assert_eq!(sc.trace_state().get("vendor"), Some("value"));
        assert_eq!(
            cx.baggage().get("tenant").map(|v| v.as_str().to_owned()),
            Some("acme".to_owned())
        );
    }

    #[test]
    fn malformed_traceparent_starts_a_new_trace() {
        for bad in [
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            let mut h = HeaderMap::new();
            h.insert("traceparent", HeaderValue::from_static(bad));
            assert!(!extract(&h, found(&h)).has_active_span(), "{bad}");
        }
        let mut h = HeaderMap::new();
        h.insert("traceparent", HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        assert!(!extract(&h, found(&h)).has_active_span());
    }
}
