//! The computation: build the span tree, clip children to their parents, and walk back from the
//! analysed span's end (the rules are in the [module docs](super)).

use foldhash::HashMap;

use serde::Serialize;

use super::path::{Adjustment, CriticalPath, Segment};
use crate::trace::{Span, SpanId, SpanKind};

/// Options that bend the default semantics; both off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CriticalPathOptions {
    /// CRISP's skew tolerance: a sibling may overlap its successor by up to 1% of the parent's
    /// duration and still be taken as its predecessor.
    pub skew_tolerance: bool,
    /// Jaeger's old clock-skew adjuster: centre a child from another service that does not fit
    /// its parent inside the parent (moving its same-service subtree along).
    pub shift_remote_children: bool,
}

/// The skew tolerance as a fraction of the parent's (clipped) duration: 1%.
pub const SKEW_TOLERANCE_DIVISOR: u64 = 100;

/// Computes the critical path of span `root` among `spans` (normally one trace's spans).
///
/// Returns `None` when no span has the id `root`. Spans of other traces, and later spans
/// repeating an id already seen, are ignored. A span whose end precedes its start is taken as
/// zero-length.
///
/// ```
/// use infertrace_analysis::text::Text;
/// use infertrace_analysis::critical_path::{critical_path, CriticalPathOptions};
/// use infertrace_analysis::trace::{Span, SpanId, SpanKind, StatusCode, TraceId};
///
/// let span = |id: u8, parent: Option<u8>, name: &str, start: u64, end: u64| Span {
///     trace_id: TraceId([1; 16]),
///     span_id: SpanId([id; 8]),
///     parent_span_id: parent.map(|p| SpanId([p; 8])),
///     name: name.into(),
///     service: Text::from("llm"),
///     kind: SpanKind::Internal,
///     start_unix_nano: start,
///     end_unix_nano: end,
///     status: StatusCode::Unset,
///     attributes: vec![],
///     links: vec![],
/// };
/// let spans = [
///     span(1, None, "chat m", 0, 100),
///     span(2, Some(1), "queue", 0, 20),
///     span(3, Some(1), "prefill", 20, 50),
///     span(4, Some(1), "decode", 50, 100),
/// ];
/// let path = critical_path(&spans, SpanId([1; 8]), &CriticalPathOptions::default()).unwrap();
/// let names: Vec<_> = path.segments.iter().map(|s| s.name.as_str()).collect();
/// assert_eq!(names, ["queue", "prefill", "decode"]);
/// ```
pub fn critical_path(
    spans: &[Span],
    root: SpanId,
    opts: &CriticalPathOptions,
) -> Option<CriticalPath> {
    // Used in place (moving the scratch out and back cost two copies of it per path).
    // Reentrancy cannot happen here; a fresh scratch keeps it correct if it ever did.
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => critical_path_in(spans, root, opts, &mut scratch),
        Err(_) => critical_path_in(spans, root, opts, &mut Scratch::default()),
    })
}

/// The vectors one computation needs, kept per thread between computations: the collector
/// computes a path per request, and allocating ~8 vectors each time cost more than the walk.
#[derive(Default)]
struct Scratch {
    index: HashMap<SpanId, usize>,
    node: Vec<bool>,
    parent: Vec<usize>,
    offsets: Vec<usize>,
    fill: Vec<usize>,
    children: Vec<usize>,
    pool: Vec<Candidate>,
    stack: Vec<Frame>,
}

/// Traces up to this many spans find parents by a scan rather than an id map.
const SCAN_THRESHOLD: usize = 16;

/// Above this many spans a trace's scratch is not kept (a huge trace must not pin memory).
const KEEP_SCRATCH_MAX_SPANS: usize = 4096;

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

fn critical_path_in(
    spans: &[Span],
    root: SpanId,
    opts: &CriticalPathOptions,
    scratch: &mut Scratch,
) -> Option<CriticalPath> {
    let tree = Tree::build(spans, root, scratch)?;
    let mut walk = Walk::new(spans, &tree, opts, scratch);
    walk.run();
    let Walk {
        mut segments,
        adjustments,
        pool,
        stack,
        ..
    } = walk;
    segments.reverse();
    let path = CriticalPath {
        trace_id: spans[tree.root].trace_id,
        root,
        segments,
        adjustments,
    };
    if spans.len() <= KEEP_SCRATCH_MAX_SPANS {
        scratch.pool = pool;
        scratch.stack = stack;
        scratch.offsets = tree.offsets;
        scratch.children = tree.children;
    } else {
        *scratch = Scratch::default();
    }
    Some(path)
}

/// Parent → children in arrival order, as compressed rows over span indices.
struct Tree {
    /// Index of the analysed span in the input.
    root: usize,
    /// `children[offsets[i]..offsets[i + 1]]` are span `i`'s children, in arrival order.
    offsets: Vec<usize>,
    children: Vec<usize>,
}

impl Tree {
    fn build(spans: &[Span], root_id: SpanId, scratch: &mut Scratch) -> Option<Self> {
        let root = spans.iter().position(|s| s.span_id == root_id)?;
        let trace_id = spans[root].trace_id;
        let n = spans.len();
        // The first span with each id of the trace; later duplicates and other traces are
        // not nodes.
        let scan = n <= SCAN_THRESHOLD;
        let index = &mut scratch.index;
        index.clear();
        let node = &mut scratch.node;
        node.clear();
        node.resize(n, false);
        for (i, s) in spans.iter().enumerate() {
            if s.trace_id != trace_id {
                continue;
            }
            if scan {
                node[i] = !spans[..i]
                    .iter()
                    .zip(node.iter())
                    .any(|(o, &is_node)| is_node && o.span_id == s.span_id);
            } else if let std::collections::hash_map::Entry::Vacant(v) = index.entry(s.span_id) {
                v.insert(i);
                node[i] = true;
            }
        }
        let node = &*node;
        let index = &*index;
        let find = |id: SpanId| -> Option<usize> {
            if scan {
                spans
                    .iter()
                    .zip(node.iter())
                    .position(|(s, &is_node)| is_node && s.span_id == id)
            } else {
                index.get(&id).copied()
            }
        };
        // The parent of each node (never the analysed span itself: it is the top, so a parent
        // cycle through it cannot be walked into); `usize::MAX` for none.
        let parent = &mut scratch.parent;
        parent.clear();
        parent.resize(n, usize::MAX);
        let mut offsets = std::mem::take(&mut scratch.offsets);
        offsets.clear();
        offsets.resize(n + 1, 0);
        for (i, s) in spans.iter().enumerate() {
            if i == root || !node[i] {
                continue;
            }
            let Some(p) = s.parent_span_id.and_then(find) else {
                continue;
            };
            let blocking = !(s.kind == SpanKind::Consumer && spans[p].kind == SpanKind::Producer);
            if p != i && blocking {
                parent[i] = p;
                offsets[p + 1] += 1;
            }
        }
        for i in 0..n {
            offsets[i + 1] += offsets[i];
        }
        let fill = &mut scratch.fill;
        fill.clear();
        fill.extend_from_slice(&offsets);
        let mut children = std::mem::take(&mut scratch.children);
        children.clear();
        children.resize(offsets[n], 0);
        for (i, &p) in parent.iter().enumerate() {
            if p != usize::MAX {
                children[fill[p]] = i;
                fill[p] += 1;
            }
        }
        Some(Self {
            root,
            offsets,
            children,
        })
    }

    fn children_of(&self, i: usize) -> &[usize] {
        &self.children[self.offsets[i]..self.offsets[i + 1]]
    }
}

/// A child as seen from its parent: shifted, clipped, ready to be taken.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    span: usize,
    /// Times after the remote-child shift, before clipping (what the next shift compares to).
    shifted_start: u64,
    shifted_end: u64,
    /// Clipped window.
    start: u64,
    end: u64,
    /// The shift applied to this span (inherited by same-service children).
    delta: i64,
}

/// One span being walked: its candidates occupy `pool[lo..hi]`, sorted by end descending
/// (ties: child order); `next` is the first not yet passed over.
struct Frame {
    node: Candidate,
    upper: u64,
    lo: usize,
    next: usize,
    hi: usize,
}

struct Walk<'a> {
    spans: &'a [Span],
    tree: &'a Tree,
    opts: CriticalPathOptions,
    pool: Vec<Candidate>,
    stack: Vec<Frame>,
    segments: Vec<Segment>,
    adjustments: Vec<Adjustment>,
}

impl<'a> Walk<'a> {
    fn new(
        spans: &'a [Span],
        tree: &'a Tree,
        opts: &CriticalPathOptions,
        scratch: &mut Scratch,
    ) -> Self {
        let mut pool = std::mem::take(&mut scratch.pool);
        pool.clear();
        let mut stack = std::mem::take(&mut scratch.stack);
        stack.clear();
        Self {
            spans,
            tree,
            opts: *opts,
            pool,
            stack,
            segments: Vec::new(),
            adjustments: Vec::new(),
        }
    }

    fn run(&mut self) {
        let root = &self.spans[self.tree.root];
        let end = root.end_unix_nano.max(root.start_unix_nano);
        let node = Candidate {
            span: self.tree.root,
            shifted_start: root.start_unix_nano,
            shifted_end: end,
            start: root.start_unix_nano,
            end,
            delta: 0,
        };
        self.enter(node, end);
        while let Some(frame) = self.stack.last_mut() {
            let upper = frame.upper;
            let tolerance = if self.opts.skew_tolerance {
                (frame.node.end - frame.node.start) / SKEW_TOLERANCE_DIVISOR
            } else {
                0
            };
            // Pass over children that can no longer be taken: U only decreases, so a child
            // ending after U (+ tolerance), or overlapping U without starting before it, never
            // becomes eligible again.
            let mut taken = None;
            while frame.next < frame.hi {
                let c = self.pool[frame.next];
                frame.next += 1;
                if c.end <= upper || (c.end - upper <= tolerance && c.start < upper) {
                    taken = Some(c);
                    break;
                }
            }
            let node = frame.node;
            match taken {
                Some(child) => {
                    let child_end = child.end.min(upper);
                    if child.end > child_end {
                        self.adjustments.push(Adjustment::SkewTolerated {
                            span_id: self.spans[child.span].span_id,
                            overlap_nanos: child.end - child_end,
                        });
                    }
                    frame.upper = child.start;
                    self.emit(node.span, child_end, upper);
                    self.enter(child, child_end);
                }
                None => {
                    let lo = frame.lo;
                    self.stack.pop();
                    self.pool.truncate(lo);
                    self.emit(node.span, node.start, upper);
                }
            }
        }
    }

    /// Pushes a frame for `node`: its children shifted, clipped and sorted for the walk.
    fn enter(&mut self, node: Candidate, upper: u64) {
        let lo = self.pool.len();
        let parent = &self.spans[node.span];
        for &c in self.tree.children_of(node.span) {
            let s = &self.spans[c];
            let raw_end = s.end_unix_nano.max(s.start_unix_nano);
            let mut delta = if s.service == parent.service {
                node.delta
            } else {
                0
            };
            if self.opts.shift_remote_children && s.service != parent.service {
                delta = remote_shift(
                    node.shifted_start,
                    node.shifted_end,
                    s.start_unix_nano,
                    raw_end,
                );
                if delta != 0 {
                    self.adjustments.push(Adjustment::RemoteChildShifted {
                        span_id: s.span_id,
                        delta_nanos: delta,
                    });
                }
            }
            let shifted_start = s.start_unix_nano.saturating_add_signed(delta);
            let shifted_end = raw_end.saturating_add_signed(delta);
            if let Some((start, end)) = clip(shifted_start, shifted_end, node.start, node.end) {
                self.pool.push(Candidate {
                    span: c,
                    shifted_start,
                    shifted_end,
                    start,
                    end,
                    delta,
                });
            }
        }
        // Walk order: latest end first; ties in child order, i.e. by start (after any shift),
        // then by arrival (the sort is stable and the pool was filled in arrival order).
        self.pool[lo..].sort_by(|a, b| {
            b.end
                .cmp(&a.end)
                .then(a.shifted_start.cmp(&b.shifted_start))
        });
        let hi = self.pool.len();
        self.stack.push(Frame {
            node,
            upper,
            lo,
            next: lo,
            hi,
        });
    }

    /// Records that span `span` owned `[start, end)`; the walk goes backwards, so pieces arrive
    /// latest first and a piece adjoining the previous one of the same span extends it.
    fn emit(&mut self, span: usize, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let s = &self.spans[span];
        if let Some(last) = self.segments.last_mut()
            && last.span_id == s.span_id
            && last.start_unix_nano == end
        {
            last.start_unix_nano = start;
            return;
        }
        self.segments.push(Segment {
            span_id: s.span_id,
            name: s.name.clone(),
            service: s.service.clone(),
            start_unix_nano: start,
            end_unix_nano: end,
        });
    }
}

/// Clips a child `[start, end]` to its parent's window `[ps, pe]`; `None` drops it.
fn clip(start: u64, end: u64, ps: u64, pe: u64) -> Option<(u64, u64)> {
    if start >= ps {
        (start < pe).then(|| (start, end.min(pe)))
    } else {
        (end > ps).then(|| (ps, end.min(pe)))
    }
}

/// Jaeger's clock-skew shift for a remote child that does not fit its parent: centre it.
/// Zero when it fits, or when it is longer than the parent (it cannot fit; clipping handles it).
fn remote_shift(parent_start: u64, parent_end: u64, start: u64, end: u64) -> i64 {
    let parent_dur = parent_end - parent_start;
    let dur = end - start;
    if dur > parent_dur || (start >= parent_start && end <= parent_end) {
        return 0;
    }
    let target = i128::from(parent_start) + i128::from((parent_dur - dur) / 2);
    let delta = target - i128::from(start);
    i64::try_from(delta).unwrap_or(if delta < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_follows_the_four_cases() {
        // Starts inside: end clipped.
        assert_eq!(clip(5, 20, 0, 10), Some((5, 10)));
        // Starts at the parent's end: dropped.
        assert_eq!(clip(10, 20, 0, 10), None);
        // Starts before, ends at the parent's start: dropped.
        assert_eq!(clip(0, 5, 5, 10), None);
        // Starts before, ends inside: start clipped.
        assert_eq!(clip(0, 7, 5, 10), Some((5, 7)));
        // Starts before, ends after: both clipped.
        assert_eq!(clip(0, 70, 5, 10), Some((5, 10)));
        // Zero-length child at the parent's start is kept.
        assert_eq!(clip(5, 5, 5, 10), Some((5, 5)));
    }

    #[test]
    fn remote_shift_centres_a_child_that_does_not_fit() {
        // Parent [100, 200], child [50, 90] (40 long): centred at [130, 170].
        assert_eq!(remote_shift(100, 200, 50, 90), 80);
        assert_eq!(remote_shift(100, 200, 190, 230), 130 - 190);
        // Fits: no shift.
        assert_eq!(remote_shift(100, 200, 100, 200), 0);
        // Longer than the parent: no shift.
        assert_eq!(remote_shift(100, 200, 0, 150), 0);
    }
}
