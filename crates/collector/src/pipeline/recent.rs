//! [`RecentTraces`]: the bounded ring of recently completed traces behind
//! `GET /api/traces/{trace_id}`.
//!
//! Bounded two ways: at most `max_traces` traces and at most `max_spans` spans in all; the
//! oldest trace is forgotten first when either bound is passed. Late spans are merged into a
//! stored trace (and its critical paths recomputed) as long as it is still in the ring.
//!
//! **Admission.** Up to `max_traces` completed traces per second (a burst of as many) enter the
//! ring, and as many again of those with a failed, cancelled or rejected request; past either
//! rate the rest are analysed as usual but not kept. At a few hundred requests per second every
//! trace is kept; at 150,000 a plain ring of 1,000 would have held the last 7 ms and churned a
//! trace in and a cold one out for every request, where the sampled ring covers the last second or more and keeps failures first.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use infertrace_analysis::critical_path::{CriticalPath, CriticalPathOptions, critical_path};
use infertrace_analysis::record::RequestRecord;
use infertrace_analysis::trace::{Span, SpanId, TraceId};
use serde::Serialize;

use crate::limiter::span_footprint;

/// One request of a stored trace: its record and critical path.
#[derive(Clone, Debug, Serialize)]
pub struct StoredRequest {
    /// The normalised request.
    pub record: RequestRecord,
    /// Its critical path (`null` when the request span could not be analysed).
    pub critical_path: Option<CriticalPath>,
}

/// A completed trace as `/api/traces/{trace_id}` returns it.
#[derive(Clone, Debug, Serialize)]
pub struct StoredTrace {
    /// The trace id (hex).
    pub trace_id: TraceId,
    /// Every request found in the trace (usually one).
    pub requests: Vec<StoredRequest>,
    /// The spans, in arrival order (reduced to the attributes infertrace keeps).
    pub spans: Vec<Span>,
    /// Spans that arrived after the trace was completed and were merged here.
    pub late_spans: u64,
    /// When the trace's grace period began (its latest request span arrived), for measuring
    /// how late its late spans are.
    #[serde(skip)]
    pub grace_from: Option<Instant>,
}

/// A token bucket refilled at `rate` per second up to `rate` tokens.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last_unix_nano: Option<u64>,
}

impl Bucket {
    fn new(rate: f64) -> Self {
        Self {
            tokens: rate,
            last_unix_nano: None,
        }
    }

    fn take(&mut self, now_unix_nano: u64, rate: f64) -> bool {
        if let Some(last) = self.last_unix_nano {
            let secs = now_unix_nano.saturating_sub(last) as f64 / 1e9;
            self.tokens = (self.tokens + secs * rate).min(rate);
        }
        self.last_unix_nano = Some(
            self.last_unix_nano
                .map_or(now_unix_nano, |l| l.max(now_unix_nano)),
        );
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The ring. Not thread-safe by itself: the pipeline keeps it behind its analysis lock.
#[derive(Debug)]
pub struct RecentTraces {
    all: Bucket,
    failed: Bucket,
    max_traces: usize,
    max_spans: usize,
    spans: usize,
    /// What the stored traces hold, estimated as [`footprint`] does.
    bytes: usize,
    traces: HashMap<TraceId, StoredTrace, foldhash::fast::RandomState>,
    order: VecDeque<TraceId>,
}

impl RecentTraces {
    /// A ring of at most `max_traces` traces and `max_spans` spans.
    pub fn new(max_traces: usize, max_spans: usize) -> Self {
        let rate = max_traces.max(1) as f64;
        Self {
            all: Bucket::new(rate),
            failed: Bucket::new(rate),
            max_traces: max_traces.max(1),
            max_spans: max_spans.max(1),
            spans: 0,
            bytes: 0,
            traces: HashMap::default(),
            order: VecDeque::new(),
        }
    }

    /// Traces held.
    pub fn len(&self) -> usize {
        self.traces.len()
    }

    /// Whether the ring is empty.
    pub fn is_empty(&self) -> bool {
        self.traces.is_empty()
    }

    /// The memory the stored traces hold, estimated (their spans as the limiter counts them,
    /// their requests and the ring's entries): the pipeline reserves it in the memory limiter.
    pub fn approx_memory_bytes(&self) -> usize {
        self.bytes
    }

    /// Whether a trace completed at `now_unix_nano` is kept (see the module docs); `failed`:
    /// it has a request that did not end `ok`.
    pub fn admit(&mut self, now_unix_nano: u64, failed: bool) -> bool {
        let rate = self.max_traces as f64;
        (failed && self.failed.take(now_unix_nano, rate)) || self.all.take(now_unix_nano, rate)
    }

    /// Stores a trace (merging with a stored trace of the same id, e.g. one re-opened by a late
    /// request span).
    pub fn insert(&mut self, trace: StoredTrace) {
        self.spans += trace.spans.len();
        self.bytes += contents_footprint(&trace);
        match self.traces.get_mut(&trace.trace_id) {
            Some(existing) => {
                existing.spans.extend(trace.spans);
                existing.requests.extend(trace.requests);
                existing.late_spans += trace.late_spans;
                // A re-opened part's request span arrived later: its late spans wait from it.
                existing.grace_from = existing.grace_from.max(trace.grace_from);
            }
            None => {
                self.bytes += ENTRY_FOOTPRINT;
                self.order.push_back(trace.trace_id);
                self.traces.insert(trace.trace_id, trace);
            }
        }
        self.evict();
    }

    /// Merges late spans, handed out at `now`, into their stored trace and recomputes its
    /// critical paths; returns how many were merged (the rest belong to traces no longer
    /// held, or are held already: an exporter's retry, not a late part). For each merged span
    /// `need` gets the wait from the trace's grace start to now.
    pub fn merge_late(
        &mut self,
        late: Vec<Span>,
        options: &CriticalPathOptions,
        now: Instant,
        need: &mut dyn FnMut(Duration),
    ) -> usize {
        let mut merged = 0;
        let mut touched: Vec<TraceId> = Vec::new();
        // The span ids each touched trace held before, looked up once per trace.
        let mut held: HashMap<TraceId, HashSet<SpanId>> = HashMap::new();
        for span in late {
            if let Some(t) = self.traces.get_mut(&span.trace_id) {
                if !touched.contains(&span.trace_id) {
                    touched.push(span.trace_id);
                }
                let ids = held
                    .entry(span.trace_id)
                    .or_insert_with(|| t.spans.iter().map(|s| s.span_id).collect());
                if !ids.insert(span.span_id) {
                    // Held already: an exporter's retry, not a late part.
                    continue;
                }
                if let Some(from) = t.grace_from {
                    need(now.saturating_duration_since(from));
                }
                self.bytes += span_footprint(&span);
                t.spans.push(span);
                t.late_spans += 1;
                merged += 1;
            }
        }
        for id in touched {
            if let Some(t) = self.traces.get_mut(&id) {
                self.bytes = self.bytes.saturating_sub(requests_footprint(&t.requests));
                for r in &mut t.requests {
                    r.critical_path = critical_path(&t.spans, r.record.span_id, options);
                }
                self.bytes += requests_footprint(&t.requests);
            }
        }
        self.spans += merged;
        self.evict();
        merged
    }

    /// Adds `requests` to the stored trace `id` (counted since it was stored: a late part's).
    pub fn add_requests(&mut self, id: &TraceId, requests: Vec<StoredRequest>) {
        if requests.is_empty() {
            return;
        }
        if let Some(t) = self.traces.get_mut(id) {
            self.bytes = self.bytes.saturating_sub(requests_footprint(&t.requests));
            t.requests.extend(requests);
            self.bytes += requests_footprint(&t.requests);
        }
    }

    /// Every stored trace, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &StoredTrace> {
        self.order.iter().filter_map(|id| self.traces.get(id))
    }

    /// The stored trace.
    pub fn get(&self, id: &TraceId) -> Option<&StoredTrace> {
        self.traces.get(id)
    }

    /// Forgets the oldest traces until the ring holds at most `bytes` (as
    /// [`approx_memory_bytes`](Self::approx_memory_bytes) counts them): the memory limiter's
    /// relief.
    pub fn shrink_to(&mut self, bytes: usize) {
        while self.bytes > bytes {
            let Some(id) = self.order.pop_front() else {
                break;
            };
            if let Some(t) = self.traces.remove(&id) {
                self.spans -= t.spans.len();
                self.bytes = self
                    .bytes
                    .saturating_sub(contents_footprint(&t) + ENTRY_FOOTPRINT);
            }
        }
    }

    fn evict(&mut self) {
        while self.traces.len() > self.max_traces
            || (self.spans > self.max_spans && self.traces.len() > 1)
        {
            let Some(id) = self.order.pop_front() else {
                break;
            };
            if let Some(t) = self.traces.remove(&id) {
                self.spans -= t.spans.len();
                self.bytes = self
                    .bytes
                    .saturating_sub(contents_footprint(&t) + ENTRY_FOOTPRINT);
            }
        }
    }
}

/// A trace's entries in the ring's table and order.
const ENTRY_FOOTPRINT: usize = size_of::<StoredTrace>() + size_of::<TraceId>();

/// A stored trace's contents, estimated: its spans as the limiter counts them and its requests.
/// Additive, so a trace evicted after merges gives back what its parts added (the vectors'
/// spare capacity is ignored).
fn contents_footprint(t: &StoredTrace) -> usize {
    t.spans.iter().map(span_footprint).sum::<usize>() + requests_footprint(&t.requests)
}

/// Requests' records (inline) and their critical paths' pieces.
fn requests_footprint(requests: &[StoredRequest]) -> usize {
    requests
        .iter()
        .map(|r| {
            size_of::<StoredRequest>() + r.critical_path.as_ref().map_or(0, |p| p.heap_bytes())
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use infertrace_analysis::text::Text;
    use infertrace_analysis::trace::{SpanId, SpanKind};

    fn span(trace: u8, id: u8) -> Span {
        Span {
            trace_id: TraceId([trace; 16]),
            span_id: SpanId([id; 8]),
            parent_span_id: None,
            name: "s".into(),
            service: Text::from("svc"),
            kind: SpanKind::Server,
            start_unix_nano: 0,
            end_unix_nano: 10,
            status: Default::default(),
            attributes: Vec::new(),
            links: Vec::new(),
        }
    }

    fn trace(id: u8, n: u8) -> StoredTrace {
        StoredTrace {
            trace_id: TraceId([id; 16]),
            requests: Vec::new(),
            spans: (0..n).map(|i| span(id, i + 1)).collect(),
            late_spans: 0,
            grace_from: None,
        }
    }

    #[test]
    fn bounded_by_count_and_spans() {
        let mut r = RecentTraces::new(3, 10);
        for i in 1..=4 {
            r.insert(trace(i, 2));
        }
        assert_eq!(r.len(), 3);
        assert!(r.get(&TraceId([1; 16])).is_none(), "oldest forgotten first");
        r.insert(trace(5, 6));
        // 2 + 2 + 6 = 10 spans after dropping trace 2 (and 3 by count).
        assert!(r.spans <= 10);
        assert!(r.get(&TraceId([5; 16])).is_some());
        let order: Vec<u8> = r.iter().map(|t| t.trace_id.0[0]).collect();
        assert_eq!(order.last(), Some(&5), "oldest first: {order:?}");
    }

    #[test]
    fn memory_follows_what_is_held_through_merges_and_evictions() {
        let options = CriticalPathOptions::default();
        let mut r = RecentTraces::new(3, 1_000);
        assert_eq!(r.approx_memory_bytes(), 0);
        r.insert(trace(1, 4));
        let one = r.approx_memory_bytes();
        let spans: usize = trace(1, 4).spans.iter().map(span_footprint).sum();
        assert!(one > spans, "{one} B for {spans} B of spans");
        // A late span, a re-opened trace merged in, then evictions by count.
        r.merge_late(vec![span(1, 9)], &options, Instant::now(), &mut |_| {});
        r.insert(trace(1, 2));
        for id in 2..=6 {
            r.insert(trace(id, 3));
        }
        // The ring now holds 4, 5 and 6: the same figure as a ring that only saw those.
        let mut fresh = RecentTraces::new(3, 1_000);
        for id in 4..=6 {
            fresh.insert(trace(id, 3));
        }
        assert_eq!(r.approx_memory_bytes(), fresh.approx_memory_bytes());
        assert_eq!(
            fresh.approx_memory_bytes(),
            3 * trace(4, 3).spans.iter().map(span_footprint).sum::<usize>() + 3 * ENTRY_FOOTPRINT
        );
        // Memory relief forgets the oldest until the ring fits.
        let one_trace = fresh.approx_memory_bytes() / 3;
        fresh.shrink_to(2 * one_trace - 1);
        assert_eq!(fresh.len(), 1);
        assert!(fresh.get(&TraceId([6; 16])).is_some(), "the newest stays");
        assert_eq!(fresh.approx_memory_bytes(), one_trace);
        fresh.shrink_to(0);
        assert!(fresh.is_empty());
        assert_eq!(fresh.approx_memory_bytes(), 0);
    }

    #[test]
    fn admission_keeps_everything_at_low_rates_and_samples_at_high_ones() {
        const SEC: u64 = 1_000_000_000;
        let mut r = RecentTraces::new(100, 100_000);
        let t0 = 1_000 * SEC;
        // 50 traces a second for 10 s: all kept.
        let kept = (0..500u64)
            .filter(|i| r.admit(t0 + i * SEC / 50, false))
            .count();
        assert_eq!(kept, 500);
        // 10,000 a second for 2 s: the burst, then 100 a second.
        let t1 = t0 + 20 * SEC;
        let kept = (0..20_000u64)
            .filter(|i| r.admit(t1 + i * SEC / 10_000, false))
            .count();
        assert!((290..=310).contains(&kept), "{kept}");
        // Failures have their own allowance on top.
        let t2 = t1 + 2 * SEC;
        let failed = (0..1_000u64)
            .filter(|i| r.admit(t2 + i * SEC / 10_000, true))
            .count();
        assert!(failed >= 100, "{failed}");
    }

    #[test]
    fn late_spans_merge_while_held() {
        let mut r = RecentTraces::new(3, 100);
        let t0 = Instant::now();
        r.insert(StoredTrace {
            grace_from: Some(t0),
            ..trace(1, 1)
        });
        let mut needs = Vec::new();
        let n = r.merge_late(
            vec![span(1, 9), span(7, 1)],
            &CriticalPathOptions::default(),
            t0 + Duration::from_secs(4),
            &mut |need| needs.push(need),
        );
        assert_eq!((n, needs), (1, vec![Duration::from_secs(4)]));
        let t = r.get(&TraceId([1; 16])).unwrap();
        assert_eq!(t.spans.len(), 2);
        assert_eq!(t.late_spans, 1);
        // The same span again (a retry) is not merged a second time (the stored trace would
        // show it twice), and says nothing of the wait needed; a re-opened part merged in
        // moves the trace's grace start to its own.
        let mut needs = Vec::new();
        let n = r.merge_late(
            vec![span(1, 9), span(1, 9)],
            &CriticalPathOptions::default(),
            t0 + Duration::from_secs(8),
            &mut |need| needs.push(need),
        );
        assert_eq!((n, needs), (0, vec![]));
        assert_eq!(r.get(&TraceId([1; 16])).unwrap().spans.len(), 2);
        r.insert(StoredTrace {
            grace_from: Some(t0 + Duration::from_secs(9)),
            ..trace(1, 0)
        });
        let mut needs = Vec::new();
        r.merge_late(
            vec![span(1, 10)],
            &CriticalPathOptions::default(),
            t0 + Duration::from_secs(10),
            &mut |need| needs.push(need),
        );
        assert_eq!(needs, vec![Duration::from_secs(1)]);
    }
}
