//! What a decode yields: the [`Decoded`] spans with the rejected ones counted and located, or a
//! [`DecodeError`] for a body that is not OTLP at all.

use infertrace_analysis::trace::Span;

use super::validation::InvalidSpan;

/// The result of decoding one export request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decoded {
    /// The valid spans, in request order.
    pub spans: Vec<Span>,
    /// How many spans were invalid and left out (reported as `rejected_spans`).
    pub rejected: u32,
    /// Why the first rejected span was rejected (the partial-success message).
    pub first_error: Option<String>,
    /// From [`decode_protobuf`]: where each of `spans` lies in the body (same order), so that
    /// a span can be decoded again from the body with [`decode_span`]. Empty from the other
    /// decoders, and for a body of 4 GiB or more.
    ///
    /// [`decode_protobuf`]: super::decode_protobuf
    /// [`decode_span`]: super::decode_span
    pub span_ranges: Vec<SpanRange>,
    /// From [`decode_protobuf`]: where the rejected spans lie in the body, in body order, so
    /// that the forwarder can send the body without them ([`without_spans`]). Consecutive
    /// rejected spans with no accepted span between them share one range (from the first's
    /// start to the last's end), so that a body of millions of tiny invalid spans does not
    /// cost a range each. Empty from the other decoders.
    ///
    /// [`decode_protobuf`]: super::decode_protobuf
    /// [`without_spans`]: super::without_spans
    pub rejected_ranges: Vec<SpanRange>,
}

/// Where a span's bytes lie in a buffer (a `Span` message in its request body, or a compact
/// copy).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpanRange {
    /// Offset of the span's first byte.
    pub offset: u32,
    /// Length of the span's encoding.
    pub len: u32,
}

impl SpanRange {
    /// The range's bytes in `buf`; `None` when it lies outside.
    pub fn of<'b>(&self, buf: &'b [u8]) -> Option<&'b [u8]> {
        let at = self.offset as usize;
        buf.get(at..at + self.len as usize)
    }
}

impl Decoded {
    /// Records where a rejected span lies (spans come in body order): extends the last range
    /// to it when no accepted span came since, else adds one. A range is only ever asked
    /// whether a span starts in it ([`without_spans`](super::without_spans)), so whatever
    /// else lies between two rejected spans may be inside it.
    pub(super) fn reject_range(&mut self, range: SpanRange) {
        let accepted_since = |last: &SpanRange| {
            self.span_ranges
                .last()
                .is_some_and(|a| a.offset > last.offset)
        };
        if let Some(last) = self.rejected_ranges.last()
            && !accepted_since(last)
            // In u64: offsets wrap past 4 GiB (such a body's ranges are dropped as a whole).
            && let Some(len) = (u64::from(range.offset) + u64::from(range.len))
                .checked_sub(u64::from(last.offset))
                .and_then(|len| u32::try_from(len).ok())
        {
            if let Some(last) = self.rejected_ranges.last_mut() {
                last.len = len;
            }
            return;
        }
        self.rejected_ranges.push(range);
    }

    pub(super) fn reject(&mut self, why: InvalidSpan) {
        self.rejected = self.rejected.saturating_add(1);
        if self.first_error.is_none() {
            self.first_error = Some(why.to_string());
        }
    }
}

/// A request body that cannot be decoded at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Malformed protobuf, with the byte offset (within the innermost message being read) and
    /// what was wrong.
    #[error("invalid protobuf at byte {offset}: {what}")]
    Protobuf {
        /// Offset inside the message being read.
        offset: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// A kept string field is not UTF-8. The protobuf decoder uses it between its readers
    /// and rejects the span that holds the string (`invalid_span`), so a whole request is not
    /// refused for it.
    #[error("invalid protobuf: a string field is not valid UTF-8")]
    InvalidUtf8,
    /// Malformed OTLP/JSON.
    #[error("invalid OTLP/JSON: {0}")]
    Json(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_error_is_kept_and_rejections_counted() {
        let mut d = Decoded::default();
        d.reject(InvalidSpan::SpanId { len: 3 });
        d.reject(InvalidSpan::TraceId { len: 0 });
        assert_eq!(d.rejected, 2);
        assert_eq!(
            d.first_error.as_deref(),
            Some("span id must be 8 bytes and not all zero (got 3 bytes)")
        );
    }
}
