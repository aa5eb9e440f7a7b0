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

/// Lays the pieces of a path read from a record end to end, all owned by its span: each
/// [`lay`](Self::lay) covers from where the last piece ended to `until` (nothing when `until`
/// is not later).
pub(super) struct Tiling {
    span_id: SpanId,
    at: u64,
    segments: Vec<Segment>,
}

impl Tiling {
    /// An empty path of `span_id` from `start`.
    pub(super) fn new(span_id: SpanId, start: u64) -> Self {
        Self {
            span_id,
            at: start,
            segments: Vec::with_capacity(10),
        }
    }

    /// Where the last piece ended.
    pub(super) fn at(&self) -> u64 {
        self.at
    }

    /// Lays a piece up to `until`, named `name` and owned by `service`.
    pub(super) fn lay(&mut self, until: u64, name: &Text, service: &Text) {
        if until > self.at {
            self.segments.push(Segment {
                span_id: self.span_id,
                name: name.clone(),
                service: service.clone(),
                start_unix_nano: self.at,
                end_unix_nano: until,
            });
            self.at = until;
        }
    }

    /// The path of `trace_id` rooted at `root`.
    pub(super) fn into_path(self, trace_id: TraceId, root: SpanId) -> CriticalPath {
        CriticalPath {
            trace_id,
            root,
            segments: self.segments,
            adjustments: Vec::new(),
        }
    }
}
