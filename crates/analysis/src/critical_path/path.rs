//! What a critical path is made of: the [`Segment`]s that tile the analysed span, and the
//! [`Adjustment`]s the options made on the way. [`super::walk`] computes them; the per-request
//! readings ([`super::disaggregated_path`]) and the windows read them.

use serde::Serialize;

use crate::trace::{SpanId, Text, TraceId};

/// One piece of the critical path: the span that owned `[start, end)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Segment {
    /// The owning span.
    pub span_id: SpanId,
    /// Its name.
    pub name: Text,
    /// Its `service.name`.
    pub service: Text,
    /// Start of the piece, Unix nanoseconds.
    pub start_unix_nano: u64,
    /// End of the piece, Unix nanoseconds.
    pub end_unix_nano: u64,
}

impl Segment {
    /// Length in nanoseconds (0 if a hand-built segment ends before it starts).
    pub fn duration_nanos(&self) -> u64 {
        self.end_unix_nano.saturating_sub(self.start_unix_nano)
    }
}

/// A change an option made to the input while computing a path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Adjustment {
    /// Skew tolerance took a child that ended after its successor started; its end was cut.
    SkewTolerated {
        /// The child taken.
        span_id: SpanId,
        /// By how much it overlapped (nanoseconds cut from its end).
        overlap_nanos: u64,
    },
    /// A child from another service was centred in its parent.
    RemoteChildShifted {
        /// The shifted child (its same-service descendants moved with it).
        span_id: SpanId,
        /// The shift, nanoseconds (negative = earlier).
        delta_nanos: i64,
    },
}

/// The critical path of one span (normally a request's root span).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CriticalPath {
    /// The trace.
    pub trace_id: TraceId,
    /// The analysed span.
    pub root: SpanId,
    /// Pieces in time order; they tile the analysed span's `[start, end]` exactly.
    pub segments: Vec<Segment>,
    /// What the options changed (empty with default options).
    pub adjustments: Vec<Adjustment>,
}

impl CriticalPath {
    /// Heap bytes of its pieces (segments and adjustments; spare capacity ignored), for memory
    /// accounting.
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of_val(&self.segments[..]) + std::mem::size_of_val(&self.adjustments[..])
    }

    /// Total nanoseconds covered (the analysed span's duration).
    pub fn total_nanos(&self) -> u64 {
        self.segments.iter().map(Segment::duration_nanos).sum()
    }
}
