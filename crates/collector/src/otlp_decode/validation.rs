//! The span rules every decoder applies alike: valid ids, a start time set (OTLP: 0 means
//! unset) and an end not before it, attribute values nested at most [`MAX_VALUE_NESTING`]
//! deep, valid links.

use infertrace_analysis::trace::{SpanId, TraceId};

/// Deepest nesting of arrays and key-value lists an attribute value may have (see the
/// [module rules](super)); a span with a deeper one is rejected.
pub const MAX_VALUE_NESTING: u32 = 16;

/// The answer for a span without a start time: one whose start is 0 (unset, in OTLP) would
/// otherwise count as lasting since 1970 in every latency it feeds.
pub(crate) const NO_START: &str = "span has no start time (start_time_unix_nano is 0)";

/// Why a forward target built on prost would refuse a message the collector accepts (see
/// `forwardable.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unforwardable {
    /// A string field is not UTF-8.
    NotUtf8,
    /// Nested past the recursion limit.
    TooDeep,
    /// Not valid protobuf for its type (a known field with another wire type, a broken group).
    Malformed,
}

/// Why a span was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InvalidSpan {
    TraceId {
        len: usize,
    },
    SpanId {
        len: usize,
    },
    ParentSpanId {
        len: usize,
    },
    NoStart,
    EndBeforeStart {
        start: u64,
        end: u64,
    },
    NotUtf8,
    TooDeep,
    /// With forwarding on: a field the collector does not read, as the forward target would
    /// read it.
    Unforwardable(Unforwardable),
}

impl std::fmt::Display for InvalidSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TraceId { len } => write!(
                f,
                "trace id must be 16 bytes and not all zero (got {len} bytes)"
            ),
            Self::SpanId { len } => write!(
                f,
                "span id must be 8 bytes and not all zero (got {len} bytes)"
            ),
            Self::ParentSpanId { len } => write!(
                f,
                "parent span id must be empty or 8 bytes (got {len} bytes)"
            ),
            Self::NoStart => write!(f, "{NO_START}"),
            Self::EndBeforeStart { start, end } => write!(
                f,
                "span ends before it starts (start {start} ns, end {end} ns)"
            ),
            Self::NotUtf8 => write!(
                f,
                "a string the collector reads (the span's name, its service name or one of its \
                 attributes) is not valid UTF-8"
            ),
            Self::TooDeep => write!(
                f,
                "an attribute value (of the span, its events or links, its resource or scope) \
                 nests arrays/key-value lists more than {MAX_VALUE_NESTING} levels deep; \
                 downstream OTLP decoders refuse such data: flatten the attribute"
            ),
            Self::Unforwardable(why) => write!(
                f,
                "forwarding is on and the forward target would refuse this span (and the whole \
                 batch with it): {}",
                match why {
                    Unforwardable::NotUtf8 =>
                        "a string field (an attribute's key or value, trace_state, a status \
                         message, an event's name, its scope's or resource's strings) is not \
                         valid UTF-8",
                    Unforwardable::TooDeep =>
                        "it nests messages or groups past the recursion limit of 100",
                    Unforwardable::Malformed =>
                        "a field has the wrong wire type for its type, or a group is broken",
                }
            ),
        }
    }
}

/// The identity of a valid span.
pub(crate) struct ValidIds {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent_span_id: Option<SpanId>,
}

/// Applies the span validity rules shared by every decoder.
pub(crate) fn validate_span(
    trace_id: &[u8],
    span_id: &[u8],
    parent_span_id: &[u8],
    start: u64,
    end: u64,
) -> Result<ValidIds, InvalidSpan> {
    let trace = TraceId::from_bytes(trace_id).ok_or(InvalidSpan::TraceId {
        len: trace_id.len(),
    })?;
    let span = SpanId::from_bytes(span_id).ok_or(InvalidSpan::SpanId { len: span_id.len() })?;
    let parent = match parent_span_id.len() {
        0 => None,
        8 => SpanId::from_bytes(parent_span_id),
        len => return Err(InvalidSpan::ParentSpanId { len }),
    };
    if start == 0 {
        return Err(InvalidSpan::NoStart);
    }
    if end < start {
        return Err(InvalidSpan::EndBeforeStart { start, end });
    }
    Ok(ValidIds {
        trace_id: trace,
        span_id: span,
        parent_span_id: parent,
    })
}

/// A link's ids when both are valid.
pub(crate) fn valid_link(
    trace_id: &[u8],
    span_id: &[u8],
) -> Option<infertrace_analysis::trace::SpanLink> {
    Some(infertrace_analysis::trace::SpanLink {
        trace_id: TraceId::from_bytes(trace_id)?,
        span_id: SpanId::from_bytes(span_id)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rules() {
        let t = [1u8; 16];
        let s = [2u8; 8];
        assert!(validate_span(&t, &s, &[], 1, 1).is_ok());
        assert_eq!(
            validate_span(&[0; 16], &s, &[], 1, 2).err(),
            Some(InvalidSpan::TraceId { len: 16 })
        );
        assert_eq!(
            validate_span(&t[..15], &s, &[], 1, 2).err(),
            Some(InvalidSpan::TraceId { len: 15 })
        );
        assert_eq!(
            validate_span(&t, &[0; 8], &[], 1, 2).err(),
            Some(InvalidSpan::SpanId { len: 8 })
        );
        assert_eq!(
            validate_span(&t, &s, &[3; 4], 1, 2).err(),
            Some(InvalidSpan::ParentSpanId { len: 4 })
        );
        assert_eq!(
            validate_span(&t, &s, &[], 0, 2).err(),
            Some(InvalidSpan::NoStart)
        );
        assert_eq!(
            validate_span(&t, &s, &[], 3, 2).err(),
            Some(InvalidSpan::EndBeforeStart { start: 3, end: 2 })
        );
        let ids = validate_span(&t, &s, &[0; 8], 1, 2).ok().unwrap();
        assert_eq!(ids.parent_span_id, None);
        let ids = validate_span(&t, &s, &[7; 8], 1, 2).ok().unwrap();
        assert_eq!(ids.parent_span_id, Some(SpanId([7; 8])));
    }
}
